"""Long Range Arena-style comparison: every efficient mixer against softmax on the LRA tasks that can be made
offline (ListOps, Pathfinder-32, sequential Fashion-MNIST for Image), beside the published LRA rows.

Each (task, mixer, seed) is one ``vitmix train`` run of ``seq_lra_tiny`` (Nyströmformer's LRA encoder) with the
task's shipped config, the same for every mixer::

    vitmix train --config lra-listops --mixer soft --seed 0 --out runs/lra/listops/seed0/soft

    python experiments/lra/lra.py --seeds 0,1                  # all tasks and mixers (48 runs, days on a CPU)
    python experiments/lra/lra.py --tasks listops --mixers softmax,soft,nystromformer --seeds 0
    python experiments/lra/lra.py --report-only                # the table again from results/lra.json

Runs go to ``runs/lra/<task>/seed<S>/<mixer>``, interrupted ones are resumed. The accuracies go to
``experiments/lra/results/lra.json`` (merged with what earlier or parallel commands wrote there, provided they used
the same budget), and the table, the goals and a plot beside it (``lra.md``, ``lra.csv``, ``lra.png``), rewritten
after every run. A (task, mixer, seed) already in ``lra.json`` is not trained again, so the command resumes, also on
another machine from the committed results. A run's number is its final validation accuracy
(no checkpoint is picked on the data it is scored on).

Budget flags (default: the configs' own, 3 epochs of 16,000 items at batch 32 = 1,500 steps): ``--epochs``,
``--max-steps``, ``--train-size``, ``--val-size``, ``--batch-size``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from pathlib import Path

from vitmix._util import markdown_table
from vitmix.compare.runner import Entry, train_entry
from vitmix.configs import resolve_config
from vitmix.runs import save_text
from vitmix.train.config import TrainConfig, load_yaml

ROOT = Path(__file__).resolve().parent
#: our task → (its shipped config, the LRA column it fills)
TASKS = {"listops": ("lra-listops", "ListOps"), "sfashion-mnist": ("lra-sfashion-mnist", "Image"),
         "pathfinder32": ("lra-pathfinder", "Pathfinder")}
COLUMNS = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder")
NO_DATA = "—, no offline data"
MIXERS = ("softmax", "soft", "soft_norm", "laplacian", "fibottention", "nystromformer", "linformer", "performer")
#: published accuracies (%): Nyströmformer's LRA table (its repository's figure) and the LRA paper's Transformer
ANCHORS = {
    "Standard (Nyströmformer's table)": (37.10, 65.02, 79.35, 38.20, 74.16),
    "Reformer (Nyströmformer's table)": (19.05, 64.88, 78.64, 43.29, 69.36),
    "Linformer (Nyströmformer's table)": (37.25, 55.91, 79.37, 37.84, 67.60),
    "Performer (Nyströmformer's table)": (18.80, 63.81, 78.62, 37.07, 69.87),
    "Nyströmformer (Nyströmformer's table)": (37.15, 65.52, 79.56, 41.58, 70.94),
    "Transformer (LRA paper)": (36.37, 64.27, 57.46, 42.44, 71.40),
}
GOAL_MARGIN = 0.5       # points: soft may trail nystromformer, and laplacian soft, by this much


def budget(args) -> dict:
    """The flags that change every run's schedule (recorded with the results: runs of another budget do not mix)."""
    return {k: getattr(args, k) for k in ("epochs", "max_steps", "train_size", "val_size", "batch_size")
            if getattr(args, k) is not None}


def task_config(task: str, plan_budget: dict) -> TrainConfig:
    """The task's shipped config with the budget flags applied."""
    values = load_yaml(resolve_config(TASKS[task][0]))
    sizes = {k: plan_budget[k] for k in ("train_size", "val_size") if k in plan_budget}
    values["data_options"] = {**values.get("data_options", {}), **sizes}
    values.update({k: v for k, v in plan_budget.items() if k not in sizes})
    return TrainConfig.from_dict(values)


def plan(tasks, mixers, seeds, runs: Path, plan_budget: dict, device=None) -> list:
    """Every run, ``(task, mixer, seed, Entry)``, seeds outermost so that an early stop leaves whole seeds."""
    out = []
    for seed in seeds:
        for task in tasks:
            base = {**task_config(task, plan_budget).to_dict(), "seed": seed, "device": device}
            for mixer in mixers:
                run_dir = runs / task / f"seed{seed}" / mixer
                cfg = TrainConfig.from_dict({**base, "mixer": mixer, "out": str(run_dir)})
                out.append((task, mixer, seed, Entry(mixer, "mixer", cfg, run_dir, seed)))
    return out


def load_results(path: Path, plan_budget: dict) -> dict:
    """``{task: {mixer: {seed: accuracy}}}`` an earlier command wrote to ``path`` (empty when none); one made with
    another budget is a one-line error (averaging over different schedules would mean nothing)."""
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text())
    if saved.get("budget") != plan_budget:
        raise ValueError(f"{path} holds runs of budget {saved.get('budget')}, this command's is {plan_budget}; move it "
                         "away or rerun with its flags")
    return {t: {m: {int(s): a for s, a in seeds.items()} for m, seeds in ms.items()}
            for t, ms in saved.get("accuracy", {}).items()}


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarise(acc: dict) -> list:
    """One row per mixer: mean, sample std and seeds per task, and the mean over the tasks every mixer ran."""
    mixers = [m for m in MIXERS if any(m in acc.get(t, {}) for t in TASKS)]
    mixers += sorted({m for t in acc.values() for m in t} - set(mixers))
    rows = []
    for mixer in mixers:
        row = {"mixer": mixer}
        for task in TASKS:
            values = list(acc.get(task, {}).get(mixer, {}).values())
            row[f"{task}_mean"] = _mean(values)
            row[f"{task}_std"] = statistics.stdev(values) if len(values) > 1 else None
            row[f"{task}_n"] = len(values)
        rows.append(row)
    shared = [t for t in TASKS if all(r[f"{t}_mean"] is not None for r in rows)] if rows else []
    for row in rows:
        row["mean_over"] = shared
        row["mean"] = _mean(row[f"{t}_mean"] for t in shared) if shared else None
    return rows


def goals(rows) -> list:
    """SOFT's claim on every task and on the mean: soft >= nystromformer - 0.5 and above linformer and performer;
    laplacian >= soft - 0.5. A comparison with a missing mixer is left out."""
    by = {r["mixer"]: r for r in rows}
    checks = (("soft", "nystromformer", -GOAL_MARGIN), ("soft", "linformer", 0.0), ("soft", "performer", 0.0),
              ("laplacian", "soft", -GOAL_MARGIN))
    out = []
    for where, key in [*((t, f"{t}_mean") for t in TASKS), ("mean over tasks", "mean")]:
        for mine, other, margin in checks:
            a, b = by.get(mine, {}).get(key), by.get(other, {}).get(key)
            if a is None or b is None:
                continue
            holds = a - b >= margin if margin else a > b
            text = f"{mine} ≥ {other} − {-margin:g}" if margin else f"{mine} > {other}"
            out.append({"where": where, "goal": text, "margin": a - b - margin, "holds": holds})
    return out


def _pm(row, task) -> str:
    mean, std, n = row[f"{task}_mean"], row[f"{task}_std"], row[f"{task}_n"]
    if mean is None:
        return "–"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "") + f" ({n})"


def report(rows, goal_rows, acc, plan_budget, cmd: str) -> str:
    """``lra.md``: the anchors and our rows in LRA's columns, the goals, the per-seed values."""
    column_of = {col: task for task, (_, col) in TASKS.items()}
    anchor_rows = [[name, *(f"{v:.2f}" for v in values), f"{statistics.fmean(values):.2f}",
                    f"{statistics.fmean(values[COLUMNS.index(c)] for c in column_of):.2f}"]
                   for name, values in ANCHORS.items()]
    ours = [[f"**{r['mixer']}** (ours)", *(_pm(r, column_of[c]) if c in column_of else NO_DATA for c in COLUMNS),
             "–", "–" if r["mean"] is None else f"{r['mean']:.2f}"] for r in rows]
    table = markdown_table(["model", *COLUMNS, "avg (5 tasks)", "avg (ListOps, Image, Pathfinder)"],
                           anchor_rows + ours)
    goal_table = (markdown_table(["where", "goal", "margin (points)", "verdict"],
                                 [[g["where"], g["goal"], f"{g['margin']:+.2f}", "holds" if g["holds"] else "**fails**"]
                                  for g in goal_rows]) if goal_rows else "(no comparison has both mixers yet)")
    seeds = [[task, mixer, ", ".join(f"{s}: {a:.2f}" for s, a in sorted(values.items()))]
             for task in TASKS for mixer, values in acc.get(task, {}).items()]
    cfgs = ", ".join(f"`--config {TASKS[t][0]}`" for t in TASKS)
    return "\n".join([
        "# Long Range Arena-style comparison (offline tasks)", "",
        f"Command{'s' if '`, `' in cmd else ''}: `{cmd}`.", "",
        f"Every run is `vitmix train` of `seq_lra_tiny` (Nyströmformer's LRA encoder: 2 layers, width 64, 2 heads of "
        f"32, FFN 128, mean pooling; lr 1e-4, batch 32) with the task's shipped config ({cfgs}) and only the mixer "
        f"and the seed changed; budget flags: {plan_budget or 'none (the configs: 1,500 steps)'}. Our numbers are "
        "the final validation accuracy (%), mean ± sample std (seeds). The anchors are published test accuracies "
        "after 5k–62k steps on LRA's own data: read orderings and gaps, not absolute values. Image is sequential "
        "Fashion-MNIST here (LRA: sequential CIFAR-10), Pathfinder this project's generator (LRA: the snake "
        "generator); Text (IMDB) and Retrieval (AAN) cannot be downloaded offline.", "",
        table, "",
        f"Our average is over the tasks every mixer ran: {', '.join(rows[0]['mean_over']) if rows else '–'}.", "",
        "Goals (SOFT's claim; margin > 0 means the goal holds):", "", goal_table, "",
        "Per-seed values (seed: accuracy):", "",
        markdown_table(["task", "mixer", "seeds"], seeds) if seeds else "(none yet)", "",
        "![accuracy per task](lra.png)", ""])


def plot(rows, path: Path, acc: dict) -> None:
    """Grouped bars per task (mean over seeds), each seed a dot."""
    from vitmix._util import pyplot

    plt = pyplot("the LRA comparison's plot")
    tasks = [t for t in TASKS if any(r[f"{t}_mean"] is not None for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 2.6 * len(tasks) + 2), 4.6))
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(tasks))]
        means = [row[f"{t}_mean"] or 0.0 for t in tasks]
        ax.bar(xs, means, width * 0.9, label=row["mixer"], alpha=0.85)
        for x, t in zip(xs, tasks):
            values = list(acc.get(t, {}).get(row["mixer"], {}).values())
            ax.plot([x] * len(values), values, "k.", ms=3)
    ax.set_xticks(range(len(tasks)), [f"{t}\n({TASKS[t][1]} column)" for t in tasks])
    ax.set(ylabel="validation accuracy (%)", title="seq_lra_tiny, same recipe and budget per task")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(acc: dict, plan_budget: dict, out: Path, cmd: str) -> str:
    """Rewrite ``lra.json``/``.md``/``.csv``/``.png`` in ``out`` from ``acc``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    rows = summarise(acc)
    goal_rows = goals(rows)
    text = report(rows, goal_rows, acc, plan_budget, cmd)
    save_text(out / "lra.json", json.dumps({"command": cmd, "budget": plan_budget, "accuracy": acc, "rows": rows,
                                            "goals": goal_rows, "anchors": ANCHORS}, indent=1))
    save_text(out / "lra.md", text)
    with open(out / "lra.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["mixer"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    if rows:
        plot(rows, out / "lra.png", acc)
    return text


def _names(text: str, known, what: str) -> list:
    from vitmix._util import close_matches

    names = [n for n in text.split(",") if n]
    for name in names:
        if name not in known:
            raise ValueError(f"unknown {what} {name!r}." + close_matches(name, known) + f" Known: {', '.join(known)}")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated tasks (default: %(default)s)")
    ap.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated mixers (default: %(default)s)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (default: %(default)s)")
    ap.add_argument("--epochs", type=int, help="epochs per run (default: the config's, 3)")
    ap.add_argument("--max-steps", type=int, help="stop every run after this many steps")
    ap.add_argument("--train-size", type=int, help="training items per task (default: the config's, 16,000)")
    ap.add_argument("--val-size", type=int, help="validation items per task (default: the config's, 2,000)")
    ap.add_argument("--batch-size", type=int, help="batch size (default: the config's, 32)")
    ap.add_argument("--device", help="where the runs train (default: auto)")
    ap.add_argument("--runs", type=Path, default=Path("runs/lra"), help="run folder (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="results folder (default: %(default)s)")
    ap.add_argument("--report-only", action="store_true", help="train nothing: rewrite the table from lra.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    tasks, mixers = _names(args.tasks, TASKS, "task"), _names(args.mixers, MIXERS, "mixer")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    plan_budget = budget(args)
    acc = load_results(args.out / "lra.json", plan_budget)
    cmd = "python experiments/lra/lra.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        for task, mixer, seed, entry in plan(tasks, mixers, seeds, args.runs, plan_budget, args.device):
            if seed in acc.get(task, {}).get(mixer, {}):     # committed results outlive the run folders
                print(f"{task} / {mixer} / seed {seed}: in {args.out / 'lra.json'}, not retrained")
                continue
            print(f"{task} / {mixer} / seed {seed}: {entry.run_dir}")
            summary = train_entry(entry, log=print, on_epoch=None)
            acc.setdefault(task, {}).setdefault(mixer, {})[seed] = summary["final_val_acc"]
            write(acc, plan_budget, args.out, cmd)
    print(write(acc, plan_budget, args.out, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
