"""``vitmix robot compare``: demonstrations, training and evaluation of every (task, mixer, seed)
with one recipe, resumable at every level, and the results table.

Layout of ``--out``: ``demos/<task>/demos.hdf5`` (seed 0, shared by every mixer), ``runs/<task>-<mixer>-s<seed>/``
(training runs with their ``eval-seed<S>-n<R>/``), and ``results.csv`` / ``results.md``: per task and
mixer the mean ± std of the task's metric (success; PushT's max coverage) over seeds with the per-seed
values, the mean over tasks, and whether the paper's claim (Fibottention ≥ dense and ≥ BigBird on that
mean) holds. Rerunning the same command after an interruption continues: finished demos, runs and
evaluations are kept, a training run resumes.
"""
from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import numpy as np
import torch

from .._util import markdown_table, write_csv
from ..runs.checkpoints import save_text
from .demos import DEMO_FILE, make_demos
from .runner import RobotTrainConfig, eval_dir, evaluate_policy, train_policy
from .sim import SPECS, check_task

__all__ = ["EVAL_SEED", "run_comparison", "results_table"]

#: rollouts use seeds EVAL_SEED + i: placements no demonstration (seeds 0..99999) used
EVAL_SEED = 100_000


def run_comparison(out, tasks: Sequence[str] = ("lift", "can", "pusht"),
                   mixers: Sequence[str] = ("softmax", "fibottention", "bigbird"), seeds: Sequence[int] = (0, 1),
                   episodes: int = 200, steps: int = 1500, rollouts: int = 50, batch_size: int = 64,
                   noise: float = 0.0, sample_steps: int = 10, max_steps=None,
                   log: Callable[[str], None] = print) -> List[dict]:
    """Run (or continue) the grid into ``out``; returns the per-run rows and writes the table."""
    for task in tasks:
        check_task(task)
    if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
        raise ValueError(f"--rollouts must be a positive integer, got {rollouts!r}")
    out = Path(out)
    rows, demo_info = [], {}
    for task in tasks:
        demos = out / "demos" / task
        if not (demos / DEMO_FILE).is_file():
            log(f"== demonstrations: {task}")
            make_demos(task, episodes, demos, noise=noise, seed=0, log=log)
        demo_info[task] = _demo_summary(demos / DEMO_FILE)
    for task in tasks:
        for mixer in mixers:
            for seed in seeds:
                run = out / "runs" / f"{task}-{mixer}-s{seed}"
                log(f"== {task} · {mixer} · seed {seed}")
                cfg = RobotTrainConfig(task=task, demos=str(out / "demos" / task), mixer=mixer, steps=steps,
                                       batch_size=batch_size, seed=seed, out=str(run),
                                       resume=(run / "config.yaml").is_file())
                train_policy(cfg, log=log)
                done = eval_dir(run, EVAL_SEED, rollouts) / "summary.json"
                summary = (json.loads(done.read_text()) if done.is_file() else
                           evaluate_policy(run, rollouts, EVAL_SEED, sample_steps=sample_steps, max_steps=max_steps,
                                           log=log))
                history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
                rows.append({"task": task, "mixer": mixer, "seed": seed, "success_rate": summary["success_rate"],
                             "rollouts": rollouts, "train_steps": summary["train_steps"],
                             "train_seconds": history[-1]["seconds"], "eval_seconds": summary["seconds"]})
    write_csv(out / "results.csv", rows)
    save_text(out / "results.md", results_table(rows, demo_info))
    log(f"{out / 'results.md'} written")
    return rows


def _demo_summary(path: Path) -> Dict[str, object]:
    import h5py

    with h5py.File(path, "r") as f:
        attrs = f["data"].attrs
        return {"kept": len(f["data"]), "episodes": int(attrs["episodes"]), "seed": int(attrs["seed"]),
                "noise": float(attrs["noise"]), "expert_success_rate": float(attrs["expert_success_rate"])}


def results_table(rows: Sequence[dict], demo_info: Dict[str, dict]) -> str:
    """The markdown results: per (task, mixer) mean ± std over seeds, the mean over tasks, the claim."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    mixers = list(dict.fromkeys(r["mixer"] for r in rows))
    cell: Dict[tuple, List[float]] = {}
    for r in rows:
        cell.setdefault((r["task"], r["mixer"]), []).append(r["success_rate"])
    means = {m: float(np.mean([np.mean(cell[(t, m)]) for t in tasks])) for m in mixers}
    body = []
    for m in mixers:
        cells = []
        for t in tasks:
            v = cell[(t, m)]
            cells.append(f"{np.mean(v):.2f} ± {np.std(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})")
        body.append([m, *cells, f"{means[m]:.3f}"])
    table = markdown_table(["mixer", *(f"{t} {SPECS[t].metric} (per seed)" for t in tasks), "mean over tasks"], body)
    claim = "not checked (needs softmax, fibottention and bigbird)"
    if {"softmax", "fibottention", "bigbird"} <= set(means):
        holds = means["fibottention"] >= means["softmax"] and means["fibottention"] >= means["bigbird"]
        claim = (f"**{'holds' if holds else 'fails'}**: fibottention {means['fibottention']:.3f}, softmax "
                 f"{means['softmax']:.3f}, bigbird {means['bigbird']:.3f} (mean over tasks)")
    r0 = rows[0]
    demos = "; ".join(f"{t}: {d['kept']}/{d['episodes']} expert episodes kept ({d['expert_success_rate']:.0%}), "
                      f"seed {d['seed']}, noise {d['noise']}" for t, d in demo_info.items())
    seconds = {m: np.mean([r["train_seconds"] for r in rows if r["mixer"] == m]) for m in mixers}
    return "\n".join([
        "# Robot imitation: success rate by token mixer", "",
        f"{r0['rollouts']} rollouts per run, {r0['train_steps']} training steps, seeds "
        f"{', '.join(str(s) for s in sorted({r['seed'] for r in rows}))}; written by `vitmix robot compare`.", "",
        table, "",
        f"Paper's claim (fibottention ≥ dense and ≥ bigbird on the mean over tasks): {claim}.", "",
        "Mean training time per run: " + ", ".join(f"{m} {s:.0f} s" for m, s in seconds.items()) + ".", "",
        f"Demonstrations: {demos}.", "",
        f"Machine: {platform.machine()} {platform.processor() or ''} · {torch.get_num_threads()} torch threads · "
        f"torch {torch.__version__}.", ""])
