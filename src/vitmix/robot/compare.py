"""``vitmix robot compare``: demonstrations, training and evaluation of every (task, mixer, seed)
with one recipe, resumable at every level, and the results table.

Layout of ``--out``: ``demos/<task>/demos.hdf5`` (seed 0, shared by every mixer), ``runs/<task>-<mixer>-s<seed>/``
(training runs with their ``eval-seed<S>-n<R>/``), ``results.json`` (the recipe, the demonstrations' summaries and
one row per finished run), and ``results.csv`` / ``results.md``: per task and
mixer the mean ± std of the task's metric (success; PushT's max coverage) over seeds with the per-seed
values, the mean over tasks, and whether the paper's claim (Fibottention ≥ dense and ≥ BigBird on that
mean) holds. Rerunning the same command after an interruption continues: finished demos, runs and
evaluations are kept, a training run resumes, and a run already in ``results.json`` is skipped even where its
folder is gone (another machine: the results files are small enough to commit, the demos and runs are not).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import numpy as np
import torch

from .._util import cpu_model, markdown_table, write_csv
from ..runs.checkpoints import save_text
from .demos import DEMO_FILE, make_demos
from .runner import RobotTrainConfig, eval_dir, evaluate_policy, train_policy
from .sim import SPECS, check_task

__all__ = ["EVAL_SEED", "RESULTS", "load_results", "run_comparison", "results_table"]

#: rollouts use seeds EVAL_SEED + i: placements no demonstration (seeds 0..99999) used
EVAL_SEED = 100_000
#: the finished rows, the recipe and the demonstrations' summaries: small, committed, read back by a rerun
RESULTS = "results.json"


def run_comparison(out, tasks: Sequence[str] = ("lift", "can", "pusht"),
                   mixers: Sequence[str] = ("softmax", "fibottention", "bigbird"), seeds: Sequence[int] = (0, 1),
                   episodes: int = 200, steps: int = 1500, rollouts: int = 50, batch_size: int = 64,
                   noise: float = 0.0, sample_steps: int = 10, max_steps=None,
                   log: Callable[[str], None] = print) -> List[dict]:
    """Run (or continue) the grid into ``out``; returns every finished row and writes the table after each run."""
    for task in tasks:
        check_task(task)
    if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
        raise ValueError(f"--rollouts must be a positive integer, got {rollouts!r}")
    out = Path(out)
    recipe = {"episodes": episodes, "noise": noise, "steps": steps, "batch_size": batch_size, "rollouts": rollouts,
              "sample_steps": sample_steps, "max_steps": max_steps}
    saved = load_results(out / RESULTS, recipe)
    rows, demo_info = saved["rows"], saved["demos"]
    finished = {(r["task"], r["mixer"], r["seed"]) for r in rows}
    for task in tasks:
        demos = out / "demos" / task
        if all((task, m, s) in finished for m in mixers for s in seeds) and task in demo_info:
            continue                                     # its runs are all in the results: no demos needed
        if not (demos / DEMO_FILE).is_file():
            log(f"== demonstrations: {task}")
            make_demos(task, episodes, demos, noise=noise, seed=0, log=log)
        demo_info[task] = _demo_summary(demos / DEMO_FILE)
    for task in tasks:
        for mixer in mixers:
            for seed in seeds:
                if (task, mixer, seed) in finished:
                    log(f"== {task} · {mixer} · seed {seed}: in {out / RESULTS}")
                    continue
                log(f"== {task} · {mixer} · seed {seed}")
                rows.append(_train_and_evaluate(out, task, mixer, seed, recipe, log))
                _write(out, recipe, rows, demo_info)
    if rows:
        _write(out, recipe, rows, demo_info)
        log(f"{out / 'results.md'} written")
    return rows


def _train_and_evaluate(out: Path, task: str, mixer: str, seed: int, recipe: dict, log) -> dict:
    """One (task, mixer, seed): train (or resume) and roll out (or read the rollouts back); its results row."""
    run = out / "runs" / f"{task}-{mixer}-s{seed}"
    cfg = RobotTrainConfig(task=task, demos=str(out / "demos" / task), mixer=mixer, steps=recipe["steps"],
                           batch_size=recipe["batch_size"], seed=seed, out=str(run),
                           resume=(run / "config.yaml").is_file())
    train_policy(cfg, log=log)
    done = eval_dir(run, EVAL_SEED, recipe["rollouts"]) / "summary.json"
    summary = (json.loads(done.read_text()) if done.is_file() else
               evaluate_policy(run, recipe["rollouts"], EVAL_SEED, sample_steps=recipe["sample_steps"],
                               max_steps=recipe["max_steps"], log=log))
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return {"task": task, "mixer": mixer, "seed": seed, "success_rate": summary["success_rate"],
            "rollouts": recipe["rollouts"], "train_steps": summary["train_steps"],
            "train_seconds": history[-1]["seconds"], "eval_seconds": summary["seconds"], "machine": _machine()}


def _machine() -> str:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return f"{gpu or cpu_model()} · {torch.get_num_threads()} torch threads · torch {torch.__version__}"


def load_results(path: Path, recipe: dict) -> dict:
    """The rows and demonstration summaries an earlier command wrote to ``path`` (none when it is missing); they
    are what a rerun skips, also on a machine without the run folders. Another recipe is a one-line error."""
    if not path.is_file():
        return {"rows": [], "demos": {}}
    saved = json.loads(path.read_text())
    if saved.get("recipe") != recipe:
        raise ValueError(f"{path} holds runs of recipe {saved.get('recipe')}, this command's is {recipe}; "
                         "move it away or rerun with its flags")
    return {"rows": saved["rows"], "demos": saved["demos"]}


def _write(out: Path, recipe: dict, rows: List[dict], demo_info: Dict[str, dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_text(out / RESULTS, json.dumps({"recipe": recipe, "demos": demo_info, "rows": rows}, indent=1))
    write_csv(out / "results.csv", rows)
    tasks = dict.fromkeys(r["task"] for r in rows)
    save_text(out / "results.md", results_table(rows, {t: demo_info[t] for t in tasks}))


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
    # a grid still running has holes: a mixer's mean over tasks (and the claim) waits for all its tasks
    means = {m: float(np.mean([np.mean(cell[(t, m)]) for t in tasks])) for m in mixers
             if all((t, m) in cell for t in tasks)}
    body = []
    for m in mixers:
        cells = []
        for t in tasks:
            v = cell.get((t, m))
            cells.append(f"{np.mean(v):.2f} ± {np.std(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})" if v else "–")
        body.append([m, *cells, f"{means[m]:.3f}" if m in means else "–"])
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
        "Machine: " + "; ".join(dict.fromkeys(r.get("machine", _machine()) for r in rows)) + ".", ""])
