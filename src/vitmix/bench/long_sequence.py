r"""The long-sequence cost scan: every mixer against softmax (SDPA) on 1-D sequences of L = 1k … 16k tokens,
forward + backward, at several batch sizes; where each becomes faster than softmax and how its memory grows.

It is the mixer sweep (:mod:`.sweep`) in sequence mode (``BenchConfig(sequence=True)``: the layer of a sequence
model, no token grid), run once per batch size, so the sweep's limits apply: within a batch, sizes go smallest
first and a mixer's next size is skipped once its time or peak memory, extrapolated from its smaller sizes, would
exceed the budget (``max_seconds``, shared equally by the batch sizes) or ``max_memory_gb``, and after an
out-of-memory error. Each batch's sweep is written as a sweep is (``batch-B/results.*``), and the scan adds:

- :func:`crossover`: the shortest measured L from which a mixer is faster than softmax at every longer L where
  both ran (``None``: never, or not measured);
- :func:`growth`: the log–log slopes of time and peak memory in L (1: linear, 2: quadratic);
- ``long_sequence.md`` / ``.json`` (one row per mixer, batch and pass, and the goals' verdicts) and
  ``long_sequence.png`` (time and peak memory against L, a column per batch size).

The command (width 64 with 2 heads of 32: the layer of ``seq_lra_tiny``, Nyströmformer's LRA encoder)::

    vitmix bench --mixers all --sequence --tokens 1024,2048,4096,8192,16384 --batch 1,8 --dim 64 --heads 2 \
        --passes fwd+bwd --out 'benchmarks/results/long_sequence/{machine}'
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from .._util import markdown_table
from .config import BenchConfig, SweepResult
from .report import line_style

DEFAULT_BATCHES = (1, 8)
BASELINE = "softmax"
#: the file that marks a folder as a scan's output, which a later scan may refresh
SCAN_MARKER = "long_sequence.json"
#: the issue's goals: these mixers faster than softmax from this length on, with memory linear in L
GOAL_MIXERS = ("soft", "laplacian")
GOAL_LENGTH = 2048
#: a fitted memory slope up to this counts as linear (fixed costs flatten short ranges, never steepen them)
LINEAR_SLOPE = 1.2


def run_scan(config: BenchConfig, batches: Sequence[int] = DEFAULT_BATCHES, progress: bool = True
             ) -> Dict[int, SweepResult]:
    """``{batch: sweep result}``: ``config`` (a mixer sweep with ``sequence=True``) swept at each batch size, each
    with an equal share of ``config.max_seconds``."""
    from .sweep import run_sweep

    if not batches or any(int(b) < 1 for b in batches):
        raise ValueError(f"batch sizes must be positive integers, got {list(batches)}")
    share = config.max_seconds / len(batches)
    return {int(b): run_sweep(replace(config, batch=int(b), max_seconds=share), progress=progress)
            for b in batches}


def _measured(rows: List[dict], name: str, pass_name: str) -> Dict[int, dict]:
    return {int(r["size"]): r for r in rows
            if r["name"] == name and r["pass"] == pass_name and r["status"] == "ok"}


def crossover(rows: List[dict], name: str, pass_name: str = "fwd+bwd") -> Optional[int]:
    """The shortest L from which ``name`` is faster than softmax at every longer L where both were measured
    (``None`` when it is not faster at the longest such L). Where softmax stopped (time, memory) and the mixer
    ran on, it is counted as faster there."""
    mine, base = _measured(rows, name, pass_name), _measured(rows, BASELINE, pass_name)
    lengths = sorted(mine)
    if not lengths:
        return None
    faster = [n not in base or mine[n]["median_ms"] < base[n]["median_ms"] for n in lengths]
    if not faster[-1]:
        return None
    start = len(faster)
    while start > 0 and faster[start - 1]:
        start -= 1
    return lengths[start]


def growth(rows: List[dict], name: str, pass_name: str = "fwd+bwd") -> Dict[str, Optional[float]]:
    """Log–log slopes in L of ``name``'s time and peak memory (``None`` below two measured lengths)."""
    from .report import fit_slope

    points = sorted(_measured(rows, name, pass_name).items())
    return {"time_slope": fit_slope([n for n, _ in points], [r["median_ms"] for _, r in points]),
            "memory_slope": fit_slope([n for n, _ in points], [r.get("peak_mib") for _, r in points])}


def summary(results: Dict[int, SweepResult]) -> List[dict]:
    """One row per (mixer, batch, pass): crossover length, slopes, the longest L measured and its ratios."""
    out = []
    for batch, result in sorted(results.items()):
        rows = result.rows
        names = list(dict.fromkeys(r["name"] for r in rows))
        for pass_name in result.config.passes:
            for name in names:
                measured = _measured(rows, name, pass_name)
                longest = max(measured, default=None)
                last = measured.get(longest, {})
                out.append({"mixer": name, "batch": batch, "pass": pass_name,
                            "crossover_L": None if name == BASELINE else crossover(rows, name, pass_name),
                            **growth(rows, name, pass_name), "longest_L": longest,
                            "speedup_at_longest": last.get("speedup_vs_softmax"),
                            "memory_vs_softmax_at_longest": last.get("memory_vs_softmax"),
                            "stopped": _stop_note(rows, name, pass_name)})
    return out


def _stop_note(rows: List[dict], name: str, pass_name: str) -> str:
    """Why the mixer has no row at a longer L (skipped for time or memory, out of memory), if so."""
    notes = [r["note"] for r in rows if r["name"] == name and r["pass"] == pass_name and r["status"] != "ok"]
    return notes[0] if notes else ""


def goals(table: List[dict]) -> List[dict]:
    """The issue's goals per batch size: each of :data:`GOAL_MIXERS` faster than softmax from
    :data:`GOAL_LENGTH` on (fwd+bwd) and its peak memory linear in L (slope <= :data:`LINEAR_SLOPE`)."""
    verdicts = []
    for row in table:
        if row["mixer"] not in GOAL_MIXERS or row["pass"] != "fwd+bwd":
            continue
        fast = row["crossover_L"] is not None and row["crossover_L"] <= GOAL_LENGTH
        slope = row["memory_slope"]
        verdicts.append({"goal": f"{row['mixer']} faster than softmax from L = {GOAL_LENGTH}, batch {row['batch']}",
                         "holds": fast, "value": f"crossover L = {row['crossover_L'] or 'none'}"})
        verdicts.append({"goal": f"{row['mixer']} memory linear in L, batch {row['batch']}",
                         "holds": slope is not None and slope <= LINEAR_SLOPE,
                         "value": "n/a" if slope is None else f"slope {slope:.2f}"})
    return verdicts


def _fmt(value, digits: int = 3) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown(results: Dict[int, SweepResult], table: List[dict], verdicts: List[dict], command: Optional[str],
             plot_name: Optional[str]) -> str:
    """The scan's report: setting, the crossover / growth table, the goals, and where the full sweeps are."""
    from .report import environment_lines

    first = next(iter(results.values()))
    cfg = first.config
    lines = ["# Long-sequence cost: every mixer against softmax (SDPA) on 1-D sequences", "",
             f"One mixer layer (width {cfg.dim}, {cfg.heads} heads) on 1-D sequences of L tokens "
             f"({', '.join(map(str, cfg.sizes or []))}), batch {', '.join(map(str, results))}, {cfg.dtype}; "
             f"{' and '.join(cfg.passes)}. A mixer's longer lengths are skipped once its time or memory, "
             "extrapolated from its shorter ones, would not fit the budget or the memory limit.", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += environment_lines(first) + [""]
    lines += ["| mixer | batch | pass | faster than softmax from L | time slope | memory slope | longest L | "
              "speed-up there | memory vs softmax there | stopped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['mixer']} | {r['batch']} | {r['pass']} | "
                     f"{'(baseline)' if r['mixer'] == BASELINE else _fmt(r['crossover_L'])} | "
                     f"{_fmt(r['time_slope'])} | {_fmt(r['memory_slope'])} | {_fmt(r['longest_L'])} | "
                     f"{_fmt(r['speedup_at_longest'])} | {_fmt(r['memory_vs_softmax_at_longest'])} | "
                     f"{r['stopped'] or ''} |")
    lines += ["", "Slopes are least-squares log–log fits over the measured lengths (1 = linear in L, 2 = quadratic). "
              "The crossover is the shortest measured L from which the mixer is faster at every longer L.", ""]
    if verdicts:
        lines += ["## Goals", "", markdown_table(["goal", "holds", "value"],
                                                 [[v["goal"], "holds" if v["holds"] else "fails", v["value"]]
                                                  for v in verdicts]), ""]
    if plot_name:
        lines += [f"![time and memory against L]({plot_name})", ""]
    lines += ["Every point, with FLOPs and notes: " + ", ".join(f"[batch {b}](batch-{b}/results.md)" for b in results),
              ""]
    return "\n".join(lines)


def plot(results: Dict[int, SweepResult], path: str) -> Optional[str]:
    """Time and peak memory against L, log–log, a column per batch size, softmax dashed."""
    from .._util import pyplot

    plt = pyplot("the long-sequence scan's plot")
    batches = sorted(results)
    fig, axes = plt.subplots(2, len(batches), figsize=(6 * len(batches), 8.4), squeeze=False)
    names = [n for n in dict.fromkeys(r["name"] for b in batches for r in results[b].rows) if n != BASELINE]
    drew = False
    for col, batch in enumerate(batches):
        result = results[batch]
        rows = result.rows
        pass_name = "fwd+bwd" if "fwd+bwd" in result.config.passes else result.config.passes[0]
        for name in dict.fromkeys(r["name"] for r in rows):
            points = sorted(_measured(rows, name, pass_name).items())
            if not points:
                continue
            drew = True
            style = (dict(ls="--", lw=2.2, color="black", marker="o") if name == BASELINE
                     else dict(lw=1.4, **line_style(names.index(name))))      # the same style in every column
            xs = [n for n, _ in points]
            axes[0][col].plot(xs, [r["median_ms"] for _, r in points], label=name, **style)
            mem = [(n, r["peak_mib"]) for n, r in points if r.get("peak_mib")]
            if mem:
                axes[1][col].plot([n for n, _ in mem], [m for _, m in mem], label=name, **style)
        for row, ylabel in ((0, "median time (ms)"), (1, "peak memory (MiB)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set(xlabel="sequence length L", ylabel=ylabel, title=f"batch {batch}, {pass_name}")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xticks(list(result.config.sizes or []))
            ax.set_xticklabels([str(n) for n in result.config.sizes or []])
            ax.xaxis.set_minor_locator(plt.NullLocator())
            if ax.lines:
                ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    if drew:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return path if drew else None


def summary_lines(results: Dict[int, SweepResult]) -> List[str]:
    """What the CLI prints: per batch and pass, each mixer's crossover length and memory slope."""
    lines = []
    for row in summary(results):
        if row["mixer"] == BASELINE:
            continue
        speed = (f"faster than softmax from L = {row['crossover_L']}" if row["crossover_L"] is not None
                 else "not faster than softmax at the longest L both ran")
        lines.append(f"batch {row['batch']} {row['pass']} {row['mixer']}: {speed}, memory slope "
                     f"{_fmt(row['memory_slope'])}"
                     + (f" ({row['stopped']})" if row["stopped"] else ""))
    return lines


def write_report(results: Dict[int, SweepResult], out_dir: str, command: Optional[str] = None) -> List[str]:
    """Each batch's sweep under ``out_dir/batch-B/``, then ``long_sequence.md``/``.json``/``.png``; the paths."""
    import warnings

    from .._util import MissingExtra
    from .report import write_results

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for batch, result in sorted(results.items()):
        paths += write_results(result, os.path.join(out_dir, f"batch-{batch}"), command=command)
    table = summary(results)
    verdicts = goals(table)
    try:
        png = plot(results, os.path.join(out_dir, "long_sequence.png"))
    except MissingExtra as err:
        warnings.warn(f"{err}; the scan is written without its plot", UserWarning, stacklevel=2)
        png = None
    with open(os.path.join(out_dir, SCAN_MARKER), "w") as fh:
        json.dump({"command": command, "summary": table, "goals": verdicts}, fh, indent=1)
    with open(os.path.join(out_dir, "long_sequence.md"), "w") as fh:
        fh.write(markdown(results, table, verdicts, command, os.path.basename(png) if png else None))
    return paths + [os.path.join(out_dir, f"long_sequence.{ext}") for ext in ("md", "json")] + ([png] if png else [])


__all__ = ["BASELINE", "DEFAULT_BATCHES", "GOAL_LENGTH", "GOAL_MIXERS", "SCAN_MARKER", "crossover", "goals", "growth",
           "markdown", "plot", "run_scan", "summary", "summary_lines", "write_report"]
