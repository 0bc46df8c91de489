"""Learning curves of every mixer with one recipe: validation accuracy per epoch, side by side.

Trains the config's model once per mixer (same data, schedule and seed; only the mixer changes) and,
with ``--models``, whole models of the same width/depth (e.g. WeightFormer, which has no attention),
then writes a table of validation accuracy by epoch, the gap to softmax at every epoch, and a plot.

    python benchmarks/learning.py --config configs/digits.yaml
    python benchmarks/learning.py --config configs/fashion-mnist-196.yaml \\
        --models weightformer_nano_patch4_32

With ``--seeds 0,1,2`` every entry is trained once per seed (runs in
``runs/learning/<config>-seeds/seed<S>/``, results in ``benchmarks/results/learning/<config>-seeds/``:
a table per seed and a summary with each seed's smallest gap to softmax and the mean curves).

Runs go to ``runs/learning/<config>/<entry>`` (an entry already finished there is read back, not
retrained, so an interrupted sweep resumes); results to ``benchmarks/results/learning/<config>/``
(``results.md``, ``results.json``, ``curves.png``). Each entry is also one command:
``vitmix train --config CONFIG --mixer NAME`` (or ``--model NAME`` with the same ``--model-option``s,
``num_heads`` dropped for attention-free models).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vitmix.bench.env import environment
from vitmix.train.config import TrainConfig, load_yaml
from vitmix.train.runner import train

ROOT = Path(__file__).resolve().parent
MIXERS = ("softmax", "soft", "soft_norm", "laplacian", "fibottention")


def entries(cfg: TrainConfig, mixers, models):
    """``(label, TrainConfig)`` per mixer of the config's model, then per whole model."""
    out = [(m, TrainConfig.from_dict({**cfg.to_dict(), "mixer": m})) for m in mixers]
    for model in models:
        options = {k: v for k, v in cfg.model_options.items() if k != "num_heads"}
        out.append((model, TrainConfig.from_dict({**cfg.to_dict(), "model": model, "mixer": None,
                                                  "model_options": options})))
    return out


def run_entry(label: str, cfg: TrainConfig, run_root: Path) -> dict:
    run_dir = run_root / label
    if (run_dir / "summary.json").is_file():
        print(f"{label}: finished earlier, reading {run_dir}", flush=True)
    else:
        cfg.out, cfg.resume = str(run_dir), (run_dir / "state.pt").is_file()
        print(f"{label}: training into {run_dir}", flush=True)
        train(cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {"entry": label, "params": summary["params"], "val_acc": [h["val_acc"] for h in history],
            "final": summary["final_val_acc"], "best": summary["best_val_acc"],
            "train_seconds": summary["train_seconds"]}


def write(rows, cfg_path: Path, out: Path, env: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    base = next((r for r in rows if r["entry"] == "softmax"), None)
    for r in rows:
        r["gap_to_softmax"] = [a - b for a, b in zip(r["val_acc"], base["val_acc"])] if base else None
    (out / "results.json").write_text(json.dumps({"config": str(cfg_path), "config_values": load_yaml(cfg_path),
                                                  "environment": env, "rows": rows}, indent=2))
    epochs = max(len(r["val_acc"]) for r in rows)
    head = "| entry | params | " + " | ".join(f"ep {e + 1}" for e in range(epochs)) + " | final | best | train s |"
    lines = [f"# Validation accuracy (%) by epoch: `{cfg_path.as_posix()}`", "",
             f"Command: `{cmd}`; one run per entry, same "
             f"recipe and seed. {env['cpu']}, torch {env['torch']}, {env['date_utc']}. 'train s' is wall time "
             "on whatever else the machine ran (not a speed measurement: see benchmarks/projection_floor.py).",
             "", head, "|---" * (epochs + 5) + "|"]
    for r in rows:
        accs = " | ".join(f"{a:.2f}" for a in r["val_acc"])
        lines.append(f"| {r['entry']} | {r['params'] / 1e3:.0f}k | {accs} | {r['final']:.2f} | {r['best']:.2f} | "
                     f"{r['train_seconds']:.0f} |")
    if base:
        lines += ["", "Gap to softmax (points; negative = below softmax):", "",
                  "| entry | " + " | ".join(f"ep {e + 1}" for e in range(epochs)) + " |", "|---" * (epochs + 1) + "|"]
        for r in rows:
            if r is not base:
                lines.append(f"| {r['entry']} | " + " | ".join(f"{g:+.2f}" for g in r["gap_to_softmax"]) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.plot(range(1, len(r["val_acc"]) + 1), r["val_acc"], "o-", ms=3, label=r["entry"])
    ax.set(xlabel="epoch", ylabel="validation accuracy (%)", title=cfg_path.stem)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)


def write_seed_summary(per_seed, cfg_path: Path, out: Path, env: dict, cmd: str) -> None:
    """Per entry and seed: the smallest gap to softmax (same seed) from epoch 5 on and the final
    accuracy; then the accuracy by epoch averaged over the seeds."""
    seeds = sorted(per_seed)
    labels = [r["entry"] for r in per_seed[seeds[0]]]
    lines = [f"# Several seeds: `{cfg_path.as_posix()}`", "", f"Command: `{cmd}`. {env['cpu']}, torch {env['torch']}, "
             f"{env['date_utc']}. Per-seed tables: " + ", ".join(f"[seed {s}](seed{s}/results.md)" for s in seeds)
             + ".", "", "Smallest gap to softmax (same seed) over epochs 5–last, and final accuracy:", "",
             "| entry | " + " | ".join(f"seed {s}: min gap ep≥5 | seed {s}: final" for s in seeds) + " |",
             "|---" * (1 + 2 * len(seeds)) + "|"]
    for label in labels:
        cells = []
        for s in seeds:
            r = next(x for x in per_seed[s] if x["entry"] == label)
            gaps = (r.get("gap_to_softmax") or [])[4:]
            cells += [f"{min(gaps):+.2f}" if gaps and label != "softmax" else "—", f"{r['final']:.2f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    epochs = min(len(r["val_acc"]) for s in seeds for r in per_seed[s])
    lines += ["", f"Mean validation accuracy (%) over seeds {', '.join(map(str, seeds))}:", "",
              "| entry | " + " | ".join(f"ep {e + 1}" for e in range(epochs)) + " |", "|---" * (epochs + 1) + "|"]
    for label in labels:
        runs = [next(x for x in per_seed[s] if x["entry"] == label)["val_acc"] for s in seeds]
        lines.append(f"| {label} | " + " | ".join(f"{sum(r[e] for r in runs) / len(runs):.1f}"
                                                  for e in range(epochs)) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True, help="a YAML recipe under configs/")
    ap.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated mixers (default: %(default)s)")
    ap.add_argument("--models", default="", help="comma-separated whole models trained with the same recipe")
    ap.add_argument("--out", type=Path, help="results folder (default benchmarks/results/learning/<config>)")
    ap.add_argument("--seeds", default="", help="comma-separated seeds: one run per entry and seed, a table per "
                    "seed and a summary (default: the config's seed)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cfg = TrainConfig.from_dict(load_yaml(args.config))
    stem = args.config.stem
    run_root = Path("runs") / "learning" / stem
    todo = entries(cfg, [m for m in args.mixers.split(",") if m], [m for m in args.models.split(",") if m])
    env = environment()
    cmd = "python benchmarks/learning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = args.out or ROOT / "results" / "learning" / stem
    if not args.seeds:
        write([run_entry(label, c, run_root) for label, c in todo], args.config, out, env, cmd)
        return
    per_seed = {}
    run_root, out = run_root.with_name(stem + "-seeds"), args.out or out.with_name(stem + "-seeds")
    for seed in (int(x) for x in args.seeds.split(",")):
        per_seed[seed] = [run_entry(label, TrainConfig.from_dict({**c.to_dict(), "seed": seed}),
                                    run_root / f"seed{seed}") for label, c in todo]
        write(per_seed[seed], args.config, out / f"seed{seed}", env, cmd)
    write_seed_summary(per_seed, args.config, out, env, cmd)


if __name__ == "__main__":
    main()
