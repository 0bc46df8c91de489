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

from vitmix._util import markdown_table
from vitmix.bench.env import environment
from vitmix.compare.runner import Entry, plan_entries, train_entry
from vitmix.train.config import TrainConfig, load_yaml

ROOT = Path(__file__).resolve().parent
MIXERS = ("softmax", "soft", "soft_norm", "laplacian", "fibottention")


def entries(cfg: TrainConfig, mixers, models, run_root: Path):
    """The runs: each mixer in the config's model, then each whole model (``vitmix compare``'s plan)."""
    return plan_entries(cfg, mixers, models, run_root)


def run_entry(entry: Entry) -> dict:
    """Train the entry (or read its finished run back, or resume it) and return its accuracy curve."""
    print(f"{entry.label}: {entry.run_dir}", flush=True)
    summary = train_entry(entry, log=print, on_epoch=None)
    history = [json.loads(line) for line in (entry.run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {"entry": entry.label, "params": summary["params"], "val_acc": [h["val_acc"] for h in history],
            "final": summary["final_val_acc"], "best": summary["best_val_acc"],
            "train_seconds": summary["train_seconds"]}


def write(rows, cfg_path: Path, out: Path, env: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    base = next((r for r in rows if r["entry"] == "softmax"), None)
    for r in rows:
        r["gap_to_softmax"] = [a - b for a, b in zip(r["val_acc"], base["val_acc"])] if base else None
    (out / "results.json").write_text(json.dumps({"config": str(cfg_path), "config_values": load_yaml(cfg_path),
                                                  "environment": env, "rows": rows}, indent=2))
    text = report(rows, base, cfg_path, env, cmd)
    (out / "results.md").write_text(text + "\n")
    print(text)
    plot(rows, cfg_path, out / "curves.png")


def report(rows, base, cfg_path: Path, env: dict, cmd: str) -> str:
    """The markdown of ``results.md``: accuracy by epoch, then the gap to softmax (``base``) at each."""
    epochs = max(len(r["val_acc"]) for r in rows)
    eps = [f"ep {e + 1}" for e in range(epochs)]
    cells = [[r["entry"], f"{r['params'] / 1e3:.0f}k"] + [f"{a:.2f}" for a in r["val_acc"]]
             + [f"{r['final']:.2f}", f"{r['best']:.2f}", f"{r['train_seconds']:.0f}"] for r in rows]
    lines = [f"# Validation accuracy (%) by epoch: `{cfg_path.as_posix()}`", "",
             f"Command: `{cmd}`; one run per entry, same "
             f"recipe and seed. {env['cpu']}, torch {env['torch']}, {env['date_utc']}. 'train s' is wall time "
             "on whatever else the machine ran (not a speed measurement: see benchmarks/projection_floor.py).",
             "", markdown_table(["entry", "params"] + eps + ["final", "best", "train s"], cells)]
    if base:
        gaps = [[r["entry"]] + [f"{g:+.2f}" for g in r["gap_to_softmax"]] for r in rows if r is not base]
        lines += ["", "Gap to softmax (points; negative = below softmax):", "", markdown_table(["entry"] + eps, gaps)]
    return "\n".join(lines)


def plot(rows, cfg_path: Path, path: Path) -> None:
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
    fig.savefig(path, dpi=120)


def write_seed_summary(per_seed, cfg_path: Path, out: Path, env: dict, cmd: str) -> None:
    """Per entry and seed: the smallest gap to softmax (same seed) from epoch 5 on and the final
    accuracy; then the accuracy by epoch averaged over the seeds."""
    seeds = sorted(per_seed)
    labels = [r["entry"] for r in per_seed[seeds[0]]]
    lines = [f"# Several seeds: `{cfg_path.as_posix()}`", "", f"Command: `{cmd}`. {env['cpu']}, torch {env['torch']}, "
             f"{env['date_utc']}. Per-seed tables: " + ", ".join(f"[seed {s}](seed{s}/results.md)" for s in seeds)
             + ".", "", "Smallest gap to softmax (same seed) over epochs 5–last, and final accuracy:", ""]
    cells = []
    for label in labels:
        cells.append([label])
        for s in seeds:
            r = next(x for x in per_seed[s] if x["entry"] == label)
            gaps = (r.get("gap_to_softmax") or [])[4:]
            cells[-1] += [f"{min(gaps):+.2f}" if gaps and label != "softmax" else "—", f"{r['final']:.2f}"]
    header = ["entry"] + [f"seed {s}: {what}" for s in seeds for what in ("min gap ep≥5", "final")]
    lines.append(markdown_table(header, cells))
    epochs = min(len(r["val_acc"]) for s in seeds for r in per_seed[s])
    means = []
    for label in labels:
        runs = [next(x for x in per_seed[s] if x["entry"] == label)["val_acc"] for s in seeds]
        means.append([label] + [f"{sum(r[e] for r in runs) / len(runs):.1f}" for e in range(epochs)])
    lines += ["", f"Mean validation accuracy (%) over seeds {', '.join(map(str, seeds))}:", "",
              markdown_table(["entry"] + [f"ep {e + 1}" for e in range(epochs)], means)]
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
    mixers, models = [m for m in args.mixers.split(",") if m], [m for m in args.models.split(",") if m]
    env = environment()
    cmd = "python benchmarks/learning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = args.out or ROOT / "results" / "learning" / stem
    if not args.seeds:
        write([run_entry(e) for e in entries(cfg, mixers, models, run_root)], args.config, out, env, cmd)
        return
    per_seed = {}
    run_root, out = run_root.with_name(stem + "-seeds"), args.out or out.with_name(stem + "-seeds")
    for seed in (int(x) for x in args.seeds.split(",")):
        seeded = TrainConfig.from_dict({**cfg.to_dict(), "seed": seed})
        per_seed[seed] = [run_entry(e) for e in entries(seeded, mixers, models, run_root / f"seed{seed}")]
        write(per_seed[seed], args.config, out / f"seed{seed}", env, cmd)
    write_seed_summary(per_seed, args.config, out, env, cmd)


if __name__ == "__main__":
    main()
