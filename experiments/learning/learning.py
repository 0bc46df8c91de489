"""Learning curves of every mixer with one recipe: validation accuracy per epoch, side by side.

Trains the config's model once per mixer (same data, schedule and seed; only the mixer changes) and,
with ``--models``, whole models of the same width/depth (e.g. WeightFormer, which has no attention),
then writes a table of validation accuracy by epoch, the gap to softmax at every epoch, and a plot.

    python experiments/learning/learning.py --config configs/digits.yaml
    python experiments/learning/learning.py --config configs/fashion-mnist-196.yaml \\
        --models weightformer_nano_patch4_32

With ``--seeds 0,1,2`` every entry is trained once per seed (runs in
``runs/learning/<config>-seeds/seed<S>/``, results in ``experiments/learning/results/<config>-seeds/``:
a table per seed and a summary with each seed's smallest gap to softmax and the mean curves).

With ``--grid configs/grid`` (a folder holding ``grid.yaml``, or the spec file itself) every point
of a learning grid is trained: each config the spec names (one YAML per model shape × budget) with
each of its mixers/models and seeds; runs in ``runs/learning/grid/<config>/seed<S>/<entry>``
(finished ones read back, interrupted ones resumed), the table of mean ± std per shape × budget ×
entry and the goals per shape in ``experiments/learning/results/grid/`` (``results.md``,
``results.json``, ``grid.png``), rewritten after every run. ``--points``, ``--entries`` and
``--seeds`` restrict what is trained; ``--report-only`` trains nothing and tabulates finished runs.

    python experiments/learning/learning.py --grid configs/grid

Runs go to ``runs/learning/<config>/<entry>`` (an entry already finished there is read back, not
retrained, so an interrupted sweep resumes); results to ``experiments/learning/results/<config>/``
(``results.md``, ``results.json``, ``curves.png``). Each entry is also one command:
``vitmix train --config CONFIG --mixer NAME`` (or ``--model NAME`` with the same ``--model-option``s,
``num_heads`` dropped for attention-free models).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
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
             "on whatever else the machine ran (not a speed measurement: see benchmarks/specs/projection_floor.yaml).",
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


# -- the learning grid (--grid) --------------------------------------------------------------------
#: the goals checked at every shape × budget: (entry, reference, allowed shortfall in points)
GRID_GOALS = (("laplacian", "soft", 0.5), ("laplacian", "softmax", 0.0))


def load_grid(path: Path) -> tuple:
    """The grid spec (``grid.yaml`` in a folder, or the file itself) and its points: for each, the
    config path, its TrainConfig and ``{entry: number of seeds}`` for its mixers and models."""
    spec_path = path / "grid.yaml" if path.is_dir() else path
    spec = load_yaml(spec_path)
    if not isinstance(spec.get("points"), list) or not spec["points"]:
        raise ValueError(f"{spec_path} must list the grid's configs under 'points:' (see configs/grid/grid.yaml)")
    points = []
    for item in spec["points"]:
        if not isinstance(item, dict) or "config" not in item:
            raise ValueError(f"{spec_path}: every point needs 'config: FILE.yaml' and 'mixers:'/'models:' "
                             f"mappings of name to seed count, got {item!r}")
        config = spec_path.parent / item["config"]
        seeds = {**(item.get("mixers") or {}), **(item.get("models") or {})}
        bad = {k: v for k, v in seeds.items() if not isinstance(v, int) or v < 1}
        if bad or not seeds:
            raise ValueError(f"{spec_path}: point {item['config']} needs seed counts >= 1 per entry, got {seeds}")
        points.append({"config": config, "cfg": TrainConfig.from_dict(load_yaml(config)),
                       "mixers": list(item.get("mixers") or {}), "models": list(item.get("models") or {}),
                       "seeds": seeds})
    return spec_path, points


def images_seen(cfg: TrainConfig) -> int:
    return cfg.epochs * (cfg.train_subset or 10**9)


def grid_runs(points, run_root: Path):
    """Every (point, seed, Entry) of the grid: cheapest budget first and, within a budget, seed-major
    (every point's seed 0, then seed 1...), so that an interrupted grid has the widest coverage."""
    top = max(n for p in points for n in p["seeds"].values())
    budgets = sorted({images_seen(p["cfg"]) for p in points})
    for budget, seed in ((b, s) for b in budgets for s in range(top)):
        for p in (p for p in points if images_seen(p["cfg"]) == budget):
            mixers = [m for m in p["mixers"] if p["seeds"][m] > seed]
            models = [m for m in p["models"] if p["seeds"][m] > seed]
            if not mixers and not models:
                continue
            seeded = TrainConfig.from_dict({**p["cfg"].to_dict(), "seed": seed})
            for entry in plan_entries(seeded, mixers, models, run_root / p["config"].stem / f"seed{seed}"):
                yield p, seed, entry


def finished_final(entry: Entry):
    """The final validation accuracy of a finished run, or None (not started, or interrupted)."""
    path = entry.run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary["final_val_acc"] if summary.get("epochs_run") == entry.config.epochs else None


def shape_label(cfg: TrainConfig) -> str:
    o = cfg.model_options
    width, heads = o.get("embed_dim"), o.get("num_heads")
    if not (width and heads):
        return cfg.model
    extra = "".join(f", {name} {o[key]}" for key, name in (("depth", "depth"), ("mlp_ratio", "MLP")) if key in o)
    return f"{width}×{heads} (d {width // heads}){extra}"


def budget_label(cfg: TrainConfig) -> str:
    """Epochs × images, and the recipe's batch and learning rate (the grid has a recipe axis)."""
    return f"{cfg.epochs} ep × {cfg.train_subset or 'all'} img, batch {cfg.batch_size}, lr {cfg.lr:g}"


def committed_finals(out: Path, forget=()) -> dict:
    """``{(config, entry, seed): final}`` of the committed ``results.json`` in ``out`` (run folders are not
    in git, so a fresh checkout reads the grid's numbers back from there), leaving out the entries in
    ``forget`` (those whose defaults changed since: they are retrained)."""
    path = out / "results.json"
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text()).get("rows", [])
    return {(r["config"], r["entry"], int(seed)): final for r in rows if r["entry"] not in forget
            for seed, final in r["finals"].items()}


def grid_table(points, run_root: Path, committed=None) -> list:
    """One row per point × entry: the finished seeds' final accuracies (a finished run, else the committed
    value, whose seeds ``committed_seeds`` lists), planned seed count."""
    rows, committed = {}, committed or {}
    for p, seed, entry in grid_runs(points, run_root):
        row = rows.setdefault((p["config"].stem, entry.label), {
            "config": p["config"].as_posix(), "shape": shape_label(p["cfg"]), "budget": budget_label(p["cfg"]),
            "entry": entry.label, "planned": p["seeds"][entry.label], "finals": {}, "committed_seeds": []})
        final = finished_final(entry)
        if final is None and (row["config"], entry.label, seed) in committed:
            final = committed[(row["config"], entry.label, seed)]
            row["committed_seeds"].append(seed)
        if final is not None:
            row["finals"][seed] = final
    for row in rows.values():
        values = list(row["finals"].values())
        row["n"] = len(values)
        row["mean"] = statistics.fmean(values) if values else None
        row["std"] = statistics.stdev(values) if len(values) > 1 else None
    return list(rows.values())


def difference_se(a: dict, b: dict):
    """Standard error of the difference of two rows' means, ``√(s_a²/n_a + s_b²/n_b)`` (the seeds of the two
    entries as independent samples); ``None`` unless both have two or more seeds."""
    if a["n"] < 2 or b["n"] < 2:
        return None
    return math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])


def grid_goals(rows) -> list:
    """Per point and goal: both means, the margin, and whether it holds (None: not measured yet)."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        at = {r["entry"]: r for r in rows if r["config"] == config}
        for entry, ref, slack in GRID_GOALS:
            a, b = at.get(entry), at.get(ref)
            if a is None or b is None:
                continue
            measured = a["mean"] is not None and b["mean"] is not None
            margin = a["mean"] - b["mean"] if measured else None
            out.append({"config": config, "shape": a["shape"], "budget": a["budget"],
                        "goal": f"{entry} ≥ {ref}" + (f" − {slack}" if slack else ""), "margin": margin,
                        "se": difference_se(a, b),
                        "holds": (margin >= -slack) if measured else None,
                        "complete": a["n"] == a["planned"] and b["n"] == b["planned"]})
    return out


def grid_report(rows, goals, spec_path: Path, env: dict, cmd: str) -> str:
    def pm(r):
        if r["mean"] is None:
            return "not measured"
        return f"{r['mean']:.2f} ± {r['std']:.2f} ({r['n']})" if r["std"] is not None else f"{r['mean']:.2f} (1)"

    def seed_value(r, s):
        return f"{r['finals'][s]:.2f}" + ("†" if s in r.get("committed_seeds", ()) else "")

    cells = [[r["shape"], r["budget"], r["entry"], pm(r), f"{r['n']}/{r['planned']}",
              ", ".join(seed_value(r, s) for s in sorted(r["finals"])) or "–"] for r in rows]
    verdict = {True: "holds", False: "**fails**", None: "not measured"}
    def margin(g):
        if g["margin"] is None:
            return "–"
        return f"{g['margin']:+.2f}" + (f" ± {g['se']:.2f}" if g.get("se") is not None else "")

    goal_cells = [[g["shape"], g["budget"], g["goal"], margin(g),
                   verdict[g["holds"]] + ("" if g["complete"] or g["holds"] is None else " (partial seeds)")]
                  for g in goals]
    return "\n".join([
        f"# Learning grid: `{spec_path.as_posix()}`", "",
        f"Command: `{cmd}` (trains what is missing, reads finished runs back). {env['cpu']}, "
        f"torch {env['torch']}, {env['date_utc']}. Final top-1 (%) on the full validation split "
        "(Fashion-MNIST: the 10k test set); mean ± sample std (n finished seeds); seed S also draws "
        "the training subset. A run made before a default changed is read back as it is: delete its "
        "folder under runs/learning/grid/ to retrain it. † a value read back from the committed "
        "results.json (its run folder is not on this machine); `--forget ENTRY` drops those of an entry "
        "whose defaults changed, so that it is retrained.", "",
        markdown_table(["shape (width×heads, depth)", "budget", "entry", "final mean ± std (n)", "seeds done",
                        "per seed"], cells),
        "", "Goals (margin = difference of the means, points, ± the standard error of that difference, "
        "√(s₁²/n₁ + s₂²/n₂), where both entries have two or more seeds: a margin within about two standard errors "
        "of the goal's bound is not decided by these seeds):", "",
        markdown_table(["shape", "budget", "goal", "margin", "verdict"], goal_cells)])


def grid_plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(dict.fromkeys((r["shape"], r["budget"]) for r in rows))
    entries = list(dict.fromkeys(r["entry"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(points)), 4.5))
    for i, label in enumerate(entries):
        xs, ys, es = [], [], []
        for j, point in enumerate(points):
            r = next((r for r in rows if (r["shape"], r["budget"]) == point and r["entry"] == label), None)
            if r is not None and r["mean"] is not None:
                xs.append(j + (i - len(entries) / 2) * 0.08)
                ys.append(r["mean"])
                es.append(r["std"] or 0.0)
        ax.errorbar(xs, ys, yerr=es, fmt="o", capsize=3, label=label)
    ticks = ["\n".join([shape, *budget.split(", ", 1)]) for shape, budget in points]   # budget, then its recipe
    ax.set_xticks(range(len(points)), ticks, fontsize=8)
    ax.set(ylabel="final validation accuracy (%)", title="learning grid (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_grid(points, spec_path: Path, run_root: Path, out: Path, env: dict, cmd: str, committed=None) -> str:
    rows = grid_table(points, run_root, committed)
    goals = grid_goals(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"grid": spec_path.as_posix(), "command": cmd, "environment": env,
                                                  "rows": rows, "goals": goals}, indent=2, default=str))
    text = grid_report(rows, goals, spec_path, env, cmd)
    (out / "results.md").write_text(text + "\n")
    if any(r["mean"] is not None for r in rows):
        grid_plot(rows, out / "grid.png")
    return text


def run_grid(args, env: dict, cmd: str) -> None:
    """Train the grid's missing runs (restricted by --points/--entries/--seeds), rewriting the table
    after each run."""
    spec_path, points = load_grid(args.grid)
    run_root = Path("runs") / "learning" / spec_path.parent.name
    out = args.out or ROOT / "results" / spec_path.parent.name
    want = {name: {x for x in (getattr(args, name) or "").split(",") if x} for name in ("points", "entries", "seeds")}
    committed = committed_finals(out, forget={x for x in args.forget.split(",") if x})
    if not args.report_only:
        for p, seed, entry in grid_runs(points, run_root):
            if ((want["points"] and p["config"].stem not in want["points"])
                    or (want["entries"] and entry.label not in want["entries"])
                    or (want["seeds"] and str(seed) not in want["seeds"]) or finished_final(entry) is not None
                    or (p["config"].as_posix(), entry.label, seed) in committed):
                continue
            run_entry(entry)
            write_grid(points, spec_path, run_root, out, env, cmd, committed)
    print(write_grid(points, spec_path, run_root, out, env, cmd, committed))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", type=Path, help="a YAML recipe under configs/")
    what.add_argument("--grid", type=Path, help="a grid spec (configs/grid/grid.yaml, or its folder): every "
                      "config it names × its mixers/models × seeds")
    ap.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated mixers (default: %(default)s)")
    ap.add_argument("--models", default="", help="comma-separated whole models trained with the same recipe")
    ap.add_argument("--out", type=Path, help="results folder (default experiments/learning/results/<config>)")
    ap.add_argument("--seeds", default="", help="comma-separated seeds: one run per entry and seed, a table per "
                    "seed and a summary (default: the config's seed); with --grid: train only these seeds")
    ap.add_argument("--points", default="", help="--grid: train only these configs (file stems, comma-separated)")
    ap.add_argument("--entries", default="", help="--grid: train only these mixers/models (comma-separated)")
    ap.add_argument("--report-only", action="store_true", help="--grid: train nothing, tabulate finished runs")
    ap.add_argument("--forget", default="", help="--grid: entries whose committed values are dropped (their "
                    "defaults changed) and retrained, comma-separated")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.grid:
        run_grid(args, environment(), f"python experiments/learning/learning.py --grid {args.grid.as_posix()}")
        return
    cfg = TrainConfig.from_dict(load_yaml(args.config))
    stem = args.config.stem
    run_root = Path("runs") / "learning" / stem
    mixers, models = [m for m in args.mixers.split(",") if m], [m for m in args.models.split(",") if m]
    env = environment()
    cmd = "python experiments/learning/learning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = args.out or ROOT / "results" / stem
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
