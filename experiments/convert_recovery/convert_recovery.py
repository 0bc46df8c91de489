"""How much of a trained softmax ViT each mixer keeps when converted to it.

One softmax teacher per seed is trained with the config's recipe; it is then converted to each mixer
(``vitmix train --init-from TEACHER --mixer NAME``) and measured at four points: right after the
conversion (no training), after the attention-transfer stage, and after 1 and after all fine-tuning
epochs (logit distillation from the teacher). Each mixer is also trained from scratch for the student's
budget (transfer + fine-tuning epochs: the comparison the goals use) and, for information, for the
teacher's whole budget (``--no-teacher-budget`` skips those runs, which cost the most), so the table says
both what the conversion keeps and what it saves.

    python experiments/convert_recovery/convert_recovery.py --config configs/convert-fashion-mnist-full.yaml --seeds 0,1

Runs go to ``runs/convert-recovery-full/seed<S>/`` (``--runs``): ``teacher``, ``convert/<mixer>``,
``scratch-student/<mixer>`` and ``scratch/<mixer>``; finished ones are read back, interrupted ones resumed,
so the command resumes. Each seed's accuracies go to ``seed<S>.json`` in ``--out``
(``experiments/convert_recovery/results/converged-teacher/``); the table of mean ± std over every seed
file there, the goals and a plot go beside them (``recovery.md``, ``recovery.csv``, ``recovery.json``,
``recovery.png``), rewritten after every run. Seeds can therefore be run by separate commands (two
single-thread processes side by side, or on different days) and still land in one table;
``--report-only`` rewrites the table from those files alone. A mixer already in a seed's file (with its
teacher-budget run, unless ``--no-teacher-budget``) is not trained again, its run folders may be gone (another
machine): the committed files carry the grid forward.

Each run is also one command: the teacher and the scratch runs are
``vitmix train --config CONFIG --mixer NAME --seed S``; a converted student is the same plus
``--init-from TEACHER --transfer-epochs 1 --distill --epochs 3 --lr 5e-4 --warmup-epochs 0.2``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path

from vitmix._util import markdown_table
from vitmix.bench.env import environment
from vitmix.compare.runner import Entry, train_entry
from vitmix.runs import save_text
from vitmix.runs.device import parse_device
from vitmix.train.config import TrainConfig, load_yaml

ROOT = Path(__file__).resolve().parent
MIXERS = ("laplacian", "soft", "soft_norm", "fibottention", "nystromformer", "performer", "linear", "linformer")
STAGES = ("converted", "transfer", "ft1", "ft_last")     # the student's accuracy after each stage
GOAL_MIXERS = ("laplacian", "soft")
GOAL_GAP = 1.0                                           # points below the teacher allowed after one epoch
SCRATCH = ("scratch_student", "scratch")                 # from scratch for the student's / the teacher's budget
DISTILL_WEIGHT = TrainConfig.distill_weight              # DeiT's soft distillation: half task loss, half teacher


def recipe(args) -> dict:
    """The students' schedule: what the flags say, recorded with the results."""
    students = {"transfer_epochs": args.transfer_epochs, "transfer_lr": args.transfer_lr, "epochs": args.ft_epochs,
                "lr": args.ft_lr, "warmup_epochs": args.ft_warmup, "distill": not args.no_distill}
    if args.distill_weight != DISTILL_WEIGHT:        # recorded only when changed: older seed files still match
        students["distill_weight"] = args.distill_weight
    return students


def plan(cfg: TrainConfig, mixers, seed: int, root: Path, students: dict) -> dict:
    """The runs of one seed: the teacher, each mixer from scratch (for the teacher's and for the student's
    budget), each converted mixer."""
    base = {**cfg.to_dict(), "seed": seed}
    student_epochs = students["transfer_epochs"] + students["epochs"]

    def entry(label, run_dir, **changes):
        return Entry(label, "mixer", TrainConfig.from_dict({**base, **changes, "out": str(run_dir)}), run_dir)

    teacher = entry("softmax", root / "teacher", mixer="softmax")
    return {"teacher": teacher,
            "scratch": {m: entry(m, root / "scratch" / m, mixer=m) for m in mixers},
            "scratch_student": {m: entry(m, root / "scratch-student" / m, mixer=m, epochs=student_epochs)
                                for m in mixers},
            "convert": {m: entry(m, root / "convert" / m, mixer=m, init_from=str(teacher.run_dir.resolve()),
                                 **students) for m in mixers}}


def cached(path: Path, measure) -> float:
    """A measurement kept beside the runs (``measure()`` only when ``path`` is missing)."""
    if path.is_file():
        return json.loads(path.read_text())["val_acc"]
    result = measure()
    save_text(path, json.dumps(result, indent=1))
    return result["val_acc"]


def converted_accuracy(teacher_dir: Path, cfg: TrainConfig) -> dict:
    """The converted model as it starts (no training), on the teacher's validation split."""
    import vitmix
    from vitmix.data.datasets import build_datasets, build_loaders
    from vitmix.runs.distributed import DistInfo
    from vitmix.train.engine import evaluate

    device = parse_device(cfg.device)          # where the runs train (the loaded teacher may sit elsewhere)
    model = vitmix.convert(str(teacher_dir), cfg.mixer, **cfg.mixer_options).to(device)
    _, val_set, _ = build_datasets(cfg.data, cfg.img_size, cfg.data_dir, augment=False)
    _, loader = build_loaders(val_set, val_set, 128)
    return evaluate(model, loader, DistInfo(device=device))


def epoch_acc(run_dir: Path) -> list:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["val_acc"] for line in lines if line]


def finished_accuracy(entry: Entry):
    """The final accuracy of a run that has already finished, else None (nothing is trained)."""
    path = entry.run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    return summary.get("final_val_acc") if summary.get("epochs_run") == entry.config.epochs else None


def run_seed(runs: dict, result: dict, log, done, teacher_budget: bool = True) -> None:
    """Train (or read back) one seed's runs into ``result`` ({"teacher": acc, "mixers": {mixer: {stage:
    acc}}}), calling ``done()`` after each mixer so the table is rewritten as runs finish. Without
    ``teacher_budget`` the from-scratch runs for the teacher's budget are only read back where finished."""
    from vitmix.train.runner import evaluate_checkpoint

    log(f"teacher: {runs['teacher'].run_dir}")
    result["teacher"] = train_entry(runs["teacher"], log=log, on_epoch=None)["final_val_acc"]
    result["mixers"] = {}
    done()                                      # the table shows the teacher before the first student is done
    for mixer, student in runs["convert"].items():
        log(f"{mixer}: converted student {student.run_dir}")
        evals = student.run_dir.parent.parent / "evals" / mixer
        row = {"converted": cached(evals / "converted.json",
                                   partial(converted_accuracy, runs["teacher"].run_dir, student.config))}
        train_entry(student, log=log, on_epoch=None)
        transfer = student.run_dir / "transfer.safetensors"
        row["transfer"] = (cached(evals / "transfer.json", partial(evaluate_checkpoint, transfer))
                           if transfer.is_file() else None)
        curve = epoch_acc(student.run_dir)
        row["ft1"], row["ft_last"] = curve[0], curve[-1]
        log(f"{mixer}: from scratch for the student's budget {runs['scratch_student'][mixer].run_dir}")
        row["scratch_student"] = train_entry(runs["scratch_student"][mixer], log=log, on_epoch=None)["final_val_acc"]
        scratch = runs["scratch"][mixer]
        if teacher_budget:
            log(f"{mixer}: from scratch for the teacher's budget {scratch.run_dir}")
        row["scratch"] = (train_entry(scratch, log=log, on_epoch=None)["final_val_acc"] if teacher_budget
                          else finished_accuracy(scratch))
        row["teacher"] = result["teacher"]       # what this student was converted from
        result["mixers"][mixer] = row
        done()


def _stats(values) -> tuple:
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None, len(values)


def summarise(per_seed: dict, mixers) -> list:
    """One row per mixer (and the teacher): mean, std and n of each stage over the finished seeds."""
    mean, std, n = _stats(r.get("teacher") for r in per_seed.values())
    rows = [{"entry": "softmax (teacher)", "teacher_mean": mean, "teacher_std": std, "n": n}]
    for m in mixers:
        done = [r["mixers"][m] for r in per_seed.values() if m in r["mixers"]]
        row = {"entry": m, "n": len(done)}
        for key in (*STAGES, *SCRATCH):
            row[f"{key}_mean"], row[f"{key}_std"], _ = _stats(d.get(key) for d in done)
        rows.append(row)
    return rows


def goals(rows) -> list:
    """The goals for laplacian and soft: within GOAL_GAP of the teacher after the transfer stage and one
    fine-tuning epoch, and, after the student's whole schedule, above the same mixer trained from scratch
    for the same number of epochs (the student's budget)."""
    teacher = rows[0]["teacher_mean"]
    out = []
    for r in rows[1:]:
        if r["entry"] not in GOAL_MIXERS or r["ft1_mean"] is None:
            continue
        gap = r["ft1_mean"] - teacher
        out.append({"mixer": r["entry"], "goal": f"after transfer + 1 epoch ≥ teacher − {GOAL_GAP:g}",
                    "margin": gap + GOAL_GAP, "holds": gap >= -GOAL_GAP})
        if r["ft_last_mean"] is not None and r["scratch_student_mean"] is not None:
            margin = r["ft_last_mean"] - r["scratch_student_mean"]
            out.append({"mixer": r["entry"], "goal": "converted student > from scratch, same epochs",
                        "margin": margin, "holds": margin > 0})
    return out


def _pm(row, key) -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if mean is None:
        return "–"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "")


def report(rows, goal_rows, per_seed, students: dict, cfg_path: Path, env: dict, cmd: str) -> str:
    cfg = TrainConfig.from_dict(load_yaml(cfg_path))
    teacher = rows[0]
    student_epochs = students["transfer_epochs"] + students["epochs"]
    weight = students.get("distill_weight", DISTILL_WEIGHT)
    stages = {"converted": "converted", "transfer": "after transfer", "ft1": "fine-tune 1 ep",
              "ft_last": f"fine-tune {students['epochs']} ep", "scratch_student": f"from scratch, {student_epochs} ep",
              "scratch": f"from scratch, {cfg.epochs} ep"}
    if students["epochs"] == 1:                      # one fine-tuning epoch: its first is its last
        del stages["ft_last"]
    table = markdown_table(
        ["mixer", "n", *stages.values(), "1 ep − teacher"],
        [[r["entry"], r["n"], *(_pm(r, key) for key in stages),
          f"{r['ft1_mean'] - teacher['teacher_mean']:+.2f}" if r["ft1_mean"] is not None else "–"]
         for r in rows[1:]], align="lr" + "r" * (len(stages) + 1))
    data = (f"a {cfg.train_subset}-image subset of {cfg.data} (the seed draws it)" if cfg.train_subset
            else f"the full {cfg.data} training set")
    goal_table = markdown_table(["mixer", "goal", "margin (points)", "verdict"],
                                [[g["mixer"], g["goal"], f"{g['margin']:+.2f}", "holds" if g["holds"] else "**fails**"]
                                 for g in goal_rows]) if goal_rows else "(no finished laplacian/soft rows yet)"
    seeds = ", ".join(f"seed {s}: {r['teacher']:.2f}" for s, r in per_seed.items())
    return "\n".join([
        f"# Conversion recovery: `{cfg_path.as_posix()}`", "",
        f"Command{'s' if '`, `' in cmd else ''}: `{cmd}`. {env['cpu']}, torch {env['torch']}, {env['date_utc']}.", "",
        f"Teacher: softmax, {cfg.epochs} epoch(s) on {data}, batch {cfg.batch_size}, lr {cfg.lr:g}: top-1 "
        f"{_pm(teacher, 'teacher')} ({seeds}). Every mixer from scratch: the same recipe, for the student's budget "
        f"({student_epochs} epochs, the goals' comparison) and for the teacher's ({cfg.epochs} epochs, "
        "information). Converted students: `vitmix.convert` of the teacher with the "
        f"mixer's defaults, {students['transfer_epochs']} epoch(s) of attention transfer (lr "
        f"{students['transfer_lr']:g}), then {students['epochs']} epochs of fine-tuning (lr {students['lr']:g}, "
        f"warm-up {students['warmup_epochs']:g} epoch, cosine; "
        + (f"logit distillation from the teacher, DeiT's soft α = {weight:g}, τ = 1" if students["distill"] else
           "task loss only") + ") on the same data. 'fine-tune 1 ep' is epoch 1 of that schedule.", "",
        "Top-1 (%) on the full validation split, mean ± sample std over the finished seeds (n):", "",
        table, "", *_teacher_notes(per_seed),
        "Goals (margin > 0 means the goal holds):", "", goal_table, "",
    ])


def _teacher_notes(per_seed: dict) -> list:
    """A line per student converted from a teacher other than its seed's current one (a seed completed by
    a later command that retrained the teacher on another machine or version: the rows stay comparable
    only if the numbers agree, so the table says where they do not)."""
    notes = [f"Note: seed {s}'s {m} student was converted from a teacher at {row['teacher']:.2f} "
             f"(the seed's teacher now: {r['teacher']:.2f})."
             for s, r in per_seed.items() for m, row in r.get("mixers", {}).items()
             if row.get("teacher") is not None and abs(row["teacher"] - r["teacher"]) > 0.005]
    return [*notes, ""] if notes else []


def plot(rows, path: Path, ft_epochs: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for r in rows[1:]:
        stages = [(i, r[f"{k}_mean"]) for i, k in enumerate(STAGES) if r[f"{k}_mean"] is not None]
        if not stages:
            continue
        line, = ax.plot(*zip(*stages), "o-", ms=4, label=r["entry"])
        for x, key in enumerate(SCRATCH, start=len(STAGES)):    # squares at the right: the mixer from scratch
            if r[f"{key}_mean"] is not None:
                ax.plot([x], [r[f"{key}_mean"]], "s", color=line.get_color())
    if rows[0]["teacher_mean"] is not None:
        ax.axhline(rows[0]["teacher_mean"], color="k", ls="--", lw=1, label="teacher (softmax)")
    labels = ["converted", "after transfer", "fine-tune 1 ep", f"fine-tune {ft_epochs} ep",
              "scratch\n(student's ep)", "scratch\n(teacher's ep)"]
    ax.set_xticks(range(len(labels)), labels)
    ax.set(ylabel="validation accuracy (%)", title="Converted from a softmax teacher (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def seed_results(out: Path, running: dict, students: dict) -> dict:
    """Every seed's results: the ``seed<S>.json`` files in ``out`` (earlier or parallel commands) merged
    with this command's (``running``): per seed, the mixers this command measured replace the saved ones
    and the others are kept, so a seed can be completed a few mixers at a time. A file made with another
    student recipe is an error: averaging over different schedules would be meaningless."""
    per_seed = {}
    for path in sorted(out.glob("seed*.json")):
        saved = json.loads(path.read_text())
        if saved["students"] != students:
            raise ValueError(f"{path} was made with student recipe {saved['students']}, this command uses "
                             f"{students}; move it away or rerun with its flags")
        per_seed[int(saved["seed"])] = saved["result"]
    for seed, result in running.items():
        saved = per_seed.get(seed, {})
        per_seed[seed] = {**saved, **result, "mixers": {**saved.get("mixers", {}), **result.get("mixers", {})}}
    return per_seed


def table_mixers(per_seed: dict, mixers) -> list:
    """This command's mixers and every mixer of the seed files, in MIXERS' order (others after)."""
    names = set(mixers) | {m for r in per_seed.values() for m in r.get("mixers", {})}
    order = {m: i for i, m in enumerate(MIXERS)}
    return sorted(names, key=lambda m: (order.get(m, len(order)), m))


def write(running, mixers, students, cfg_path: Path, out: Path, env: dict, cmd: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    per_seed = seed_results(out, running, students)
    for seed in running:
        save_text(out / f"seed{seed}.json", json.dumps({"seed": seed, "students": students, "environment": env,
                                                        "command": cmd, "result": per_seed[seed]}, indent=1))
    mixers = table_mixers(per_seed, mixers)
    rows = summarise(per_seed, mixers)
    goal_rows = goals(rows) if rows[0]["teacher_mean"] is not None else []
    text = report(rows, goal_rows, per_seed, students, cfg_path, env, cmd)
    save_text(out / "recovery.md", text)
    save_text(out / "recovery.json", json.dumps({"environment": env, "command": cmd, "config": cfg_path.as_posix(),
                                                   "students": students, "rows": rows, "goals": goal_rows,
                                                   "per_seed": per_seed}, indent=1))
    with open(out / "recovery.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[1].keys()) if len(rows) > 1 else ["entry"],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows[1:])
    plot(rows, out / "recovery.png", students["epochs"])
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/convert-fashion-mnist-full.yaml"),
                    help="the teacher's recipe (also the from-scratch runs') (default: %(default)s)")
    ap.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated mixers (default: %(default)s)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (default: %(default)s)")
    ap.add_argument("--transfer-epochs", type=int, default=1)
    ap.add_argument("--transfer-lr", type=float, default=1e-4)
    ap.add_argument("--ft-epochs", type=int, default=3, help="fine-tuning epochs (default: %(default)s)")
    ap.add_argument("--ft-lr", type=float, default=5e-4, help="fine-tuning peak lr (default: %(default)s)")
    ap.add_argument("--ft-warmup", type=float, default=0.2, help="fine-tuning warm-up epochs (default: %(default)s)")
    ap.add_argument("--no-distill", action="store_true", help="fine-tune with the task loss only")
    ap.add_argument("--distill-weight", type=float, default=DISTILL_WEIGHT,
                    help="the teacher's share of the fine-tuning loss (default: %(default)s; 1: the teacher alone)")
    ap.add_argument("--no-teacher-budget", action="store_true",
                    help="skip the from-scratch runs for the teacher's budget (read back where finished)")
    ap.add_argument("--runs", type=Path, default=Path("runs/convert-recovery-full"),
                    help="run folder (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "converged-teacher", help="results folder")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: rewrite the table from the seed<S>.json files in --out")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cfg = TrainConfig.from_dict(load_yaml(args.config))
    mixers = [m for m in args.mixers.split(",") if m]
    from vitmix.mixers import get_mixer_class

    for m in mixers:
        get_mixer_class(m)     # an unknown name fails here, with close matches, before any training
    students = recipe(args)
    env, per_seed = environment(parse_device(cfg.device)), {}     # the machine the runs train on
    cmd = "python experiments/convert_recovery/convert_recovery.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.report_only:     # the machine and commands that made the seed files, then this command
        saved = [json.loads(p.read_text()) for p in sorted(args.out.glob("seed*.json"))]
        cmd = "`, `".join([*sorted({s["command"] for s in saved}), cmd])
        env = saved[0]["environment"] if saved else env
        print(write({}, mixers, students, args.config, args.out, env, cmd))
        return
    for seed in (int(s) for s in args.seeds.split(",") if s):
        saved = seed_results(args.out, {}, students).get(seed, {}).get("mixers", {})
        todo = [m for m in mixers if m not in saved      # committed rows outlive the run folders
                or (not args.no_teacher_budget and saved[m].get("scratch") is None)]
        if not todo:
            print(f"seed {seed}: every mixer is in {args.out / f'seed{seed}.json'}, nothing to train")
            continue
        runs = plan(cfg, todo, seed, args.runs / f"seed{seed}", students)
        per_seed[seed] = {}
        run_seed(runs, per_seed[seed], log=print, teacher_budget=not args.no_teacher_budget,
                 done=lambda: write(per_seed, mixers, students, args.config, args.out, env, cmd))
    print(write(per_seed, mixers, students, args.config, args.out, env, cmd))


if __name__ == "__main__":
    main()
