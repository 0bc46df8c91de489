"""Writing a sweep to disk: ``results.csv``, ``results.json``, ``results.md`` and log–log PNG plots."""
from __future__ import annotations

import json
import math
import os
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

from .._util import MissingExtra, markdown_table as _markdown, pyplot, write_csv
from .config import BenchConfig, SweepResult

COLUMNS = [
    "kind", "name", "options", "size", "tokens", "batch", "dim", "heads", "dtype", "pass", "device", "status",
    "median_ms", "iqr_ms", "samples", "throughput", "throughput_unit", "peak_mib", "memory_method",
    "gflops", "gflops_analytic", "flops_source", "params", "speedup_vs_softmax", "memory_vs_softmax",
    "flops_vs_softmax", "baseline", "timing_method", "note",
]
#: the columns ``--compile`` adds (before ``note``): the point timed again under ``torch.compile``
COMPILE_COLUMNS = ["compile_status", "compiled_median_ms", "compiled_vs_eager", "compiled_vs_eager_iqr", "compile_s",
                   "graph_breaks"]


def columns(config: BenchConfig) -> List[str]:
    """The CSV columns of a sweep: :data:`COLUMNS`, plus :data:`COMPILE_COLUMNS` with ``--compile``."""
    return COLUMNS[:-1] + COMPILE_COLUMNS + COLUMNS[-1:] if config.compile else list(COLUMNS)


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Least-squares slope of ``log y`` against ``log x`` (``None`` with fewer than 2 points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def _fmt(value, digits: int = 3) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def _x_label(kind: str) -> str:
    return "tokens N" if kind == "mixer" else "image size (pixels per side)"


def environment_lines(result: SweepResult) -> List[str]:
    """The machine / software / method lines of a sweep's header."""
    return env_lines(result.environment, result.elapsed_s, result.stopped_early)


def env_lines(env: dict, elapsed_s: float, stopped_early: bool = False) -> List[str]:
    """The header lines of any benchmark run from its :func:`vitmix.bench.env.environment` record."""
    return [
        f"- machine: {env.get('device_name')} ({env.get('cpu_count')} CPUs visible, "
        f"{env.get('torch_threads')} torch threads), device `{env.get('device')}`",
        *gpu_lines(env),
        f"- software: torch {env.get('torch')}, timm {env.get('timm')}, vitmix {env.get('vitmix')}, "
        f"Python {env.get('python')} on {env.get('platform')}",
        f"- timing: median of repeated calls after warm-up, {env.get('timing_method')}",
        f"- memory: {env.get('memory_method')}",
        f"- FLOPs: {env.get('flop_unit')}",
        f"- load average (1 min) at start / end: {env.get('load_average_1m')} / {env.get('load_average_1m_end')}"
        + (" — the machine was shared, treat times as noisy" if (env.get("load_average_1m") or 0) >
           (env.get("cpu_count") or 1) else ""),
        f"- date: {env.get('date_utc')}; run took {elapsed_s:.0f} s"
        + (" and **stopped early** (budget)" if stopped_early else ""),
    ]


def gpu_lines(env: dict) -> List[str]:
    """The GPU line of a results header (none for a CPU run)."""
    if not env.get("gpu"):
        return []
    return [f"- GPU: {env['gpu']} (compute capability {env.get('gpu_capability')}, {env.get('gpu_memory_gib')} GiB, "
            f"{env.get('gpu_sm_count')} SMs), driver {env.get('driver')}, CUDA {env.get('cuda')}, "
            f"cuDNN {env.get('cudnn')}, Triton {env.get('triton')}"]


def markdown_table(rows: List[dict], kind: str, compiled: bool = False) -> str:
    """A markdown table of the rows, ratios against the softmax baseline included; ``compiled`` adds the
    ``torch.compile`` columns (compiled median, compiled / eager, seconds of the first compiled call)."""
    size_col = "N" if kind == "mixer" else "image"
    header = [size_col, "pass", "name", "median ms", "throughput", "peak MiB", "GFLOPs",
              "speed-up vs softmax", "memory vs softmax", "status / note"]
    if not compiled:
        return _markdown(header, (_table_cells(r) for r in rows))
    header[4:4] = ["compiled ms", "compiled / eager", "compile s"]
    return _markdown(header, (_with_compile_cells(_table_cells(r), r) for r in rows))


def _with_compile_cells(cells: List[str], r: dict) -> List[str]:
    ratio = f"{r['compiled_vs_eager']:.2f}×" if r.get("compiled_vs_eager") else ""
    if ratio and r.get("compiled_vs_eager_iqr") is not None:
        ratio += f" ±{r['compiled_vs_eager_iqr'] / 2:.2f}"
    cells[4:4] = [_fmt(r.get("compiled_median_ms")), ratio, _fmt(r.get("compile_s"))]
    return cells


def compile_summary(rows: List[dict]) -> List[str]:
    """Lines saying in how many rows the compiled layer was not slower than eager, and which were."""
    timed = [r for r in rows if r.get("compiled_vs_eager")]
    failed = [r for r in rows if r.get("compile_status") == "failed"]
    slower = [r for r in timed if r["compiled_vs_eager"] > 1.0]
    beyond = [r for r in slower if r["compiled_vs_eager"] - (r.get("compiled_vs_eager_iqr") or 0.0) / 2 > 1.0]
    lines = [f"- compiled not slower than eager (compiled / eager ≤ 1) in {len(timed) - len(slower)} of "
             f"{len(timed)} compiled rows"]
    if slower:
        lines.append("- slower compiled: " + ", ".join(
            f"{r['name']} {r['size']} {r['pass']} ({r['compiled_vs_eager']:.2f}×)" for r in slower))
        lines.append(f"- slower by more than the run-to-run noise (ratio − half its IQR > 1): {len(beyond)}"
                     + (": " + ", ".join(f"{r['name']} {r['size']} {r['pass']}" for r in beyond) if beyond else ""))
    if failed:
        lines.append("- compile failed: " + ", ".join(f"{r['name']} {r['size']} {r['pass']}" for r in failed))
    return lines


def _table_cells(r: dict) -> List[str]:
    """One row of :func:`markdown_table`'s cells."""
    unit = (r.get("throughput_unit") or "").replace("/s", "")
    thr = f"{_fmt(r.get('throughput'))} {unit}/s" if r.get("throughput") else ""
    speed = f"{r['speedup_vs_softmax']:.2f}×" if r.get("speedup_vs_softmax") else ""
    mem = f"{r['memory_vs_softmax']:.2f}×" if r.get("memory_vs_softmax") else ""
    note = r.get("note") or ""
    status = r["status"] if r["status"] != "ok" else ""
    tail = "; ".join(s for s in (status, note) if s).replace("|", "/")
    name = r["name"] + (" (baseline)" if r.get("baseline") else "")
    gf = _fmt(r.get("gflops"))
    if r.get("flops_source") == "analytic":
        gf += "†"
    elif r.get("flops_source") == "counter (lower bound)":
        gf = "≥" + gf
    return [str(r["size"]), r["pass"], name, _fmt(r.get("median_ms")), thr, _fmt(r.get("peak_mib")), gf,
            speed, mem, tail]


def _series(rows: List[dict], metric: str) -> Dict[Tuple[str, str], List[Tuple[float, float]]]:
    out: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    for r in rows:
        if r["status"] != "ok" or not r.get(metric):
            continue
        out.setdefault((r["pass"], r["name"]), []).append((float(r["size"]), float(r[metric])))
    return out


def slope_table(rows: List[dict], kind: str) -> Dict[Tuple[str, str, str], Optional[float]]:
    """Fitted log–log slopes per (metric, pass, name); against N (mixers) or pixels (models)."""
    slopes = {}
    for metric in ("median_ms", "peak_mib"):
        for (pass_name, name), pts in _series(rows, metric).items():
            xs = [x if kind == "mixer" else x * x for x, _ in pts]
            slopes[(metric, pass_name, name)] = fit_slope(xs, [y for _, y in pts])
    return slopes


#: markers cycled beside the colours (see :func:`line_style`)
_MARKERS = "os^Dvx"


def line_style(index: int) -> dict:
    """Colour and marker of a plot's ``index``-th line. Matplotlib's default cycle has 10 colours, so a sweep of
    every mixer (12 lines) drew two with the same colour and marker; this takes tab20's ten strong shades first,
    then its ten light ones, each with a marker from a cycle of six: the first 60 lines all differ."""
    import matplotlib

    shade = (2 * index) % 20 + (index // 10) % 2
    return {"color": matplotlib.colormaps["tab20"](shade), "marker": _MARKERS[index % len(_MARKERS)]}


def plot(rows: List[dict], kind: str, metric: str, path: str, title: str) -> Optional[str]:
    """One log–log figure, a panel per pass, one line per mixer/model with its fitted slope."""
    plt = pyplot("the benchmark report's plots")

    series = _series(rows, metric)
    if not series:
        return None
    baselines = {r["name"] for r in rows if r.get("baseline")}
    passes = [p for p in ("fwd", "fwd+bwd") if any(k[0] == p for k in series)]
    fig, axes = plt.subplots(1, len(passes), figsize=(6.2 * len(passes), 4.6), squeeze=False)
    ylabel = {"median_ms": "median latency (ms)", "peak_mib": "peak memory (MiB)"}[metric]
    slope_of = "N" if kind == "mixer" else "pixels"
    order = {name: i for i, name in enumerate(sorted({name for _, name in series}))}   # one style per name
    for ax, pass_name in zip(axes[0], passes):
        for (p, name), pts in sorted(series.items()):
            if p != pass_name:
                continue
            pts.sort()
            xs = [x for x, _ in pts]
            ys = [y for _, y in pts]
            s = fit_slope([x if kind == "mixer" else x * x for x in xs], ys)
            label = name + (f" (slope {s:.2f})" if s is not None else "")
            softmax_like = name in baselines or name.startswith("softmax")
            ax.plot(xs, ys, lw=2 if name in baselines else 1.5, ls="--" if softmax_like else "-",
                    label=label + (" — baseline" if name in baselines else ""), **line_style(order[name]))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(_x_label(kind))
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} — {pass_name}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, title=f"log–log slope vs {slope_of}", title_fontsize=8)
        sizes = sorted({x for (pp, _), pts in series.items() if pp == pass_name for x, _ in pts})
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{int(s)}" for s in sizes], rotation=45)
        ax.minorticks_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loglog_panels(rows: List[dict], series: str, names: Sequence[str], x: str, xlabel: str,
                  panels: Sequence[Tuple[str, str, str]], title: str, path) -> None:
    """A figure of log–log panels, one per ``(y key, y label, panel title)`` in ``panels``, with a line per
    name in ``names`` (the rows whose ``series`` value it is) against ``rows[x]``; written to ``path``.

    For one-off studies (``benchmarks/*.py``) whose rows are not a sweep's.
    """
    plt = pyplot("the study's plot")

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for index, name in enumerate(names):
        sel = [r for r in rows if r[series] == name]
        for ax, (y, _, _) in zip(axes[0], panels):
            ax.loglog([r[x] for r in sel], [r[y] for r in sel], "-", label=name, **line_style(index))
    for ax, (_, ylabel, panel_title) in zip(axes[0], panels):
        ax.set(xlabel=xlabel, ylabel=ylabel, title=panel_title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_results(path: str) -> Tuple[SweepResult, Optional[str]]:
    """Read a ``results.json`` back as ``(SweepResult, command)`` (e.g. to redraw its plots)."""

    with open(path) as fh:
        payload = json.load(fh)
    cfg = dict(payload["config"])
    cfg["passes"] = tuple(cfg["passes"])
    config = BenchConfig(**{k: v for k, v in cfg.items() if k in BenchConfig.__dataclass_fields__})
    result = SweepResult(config, payload["rows"], payload["environment"], payload.get("stopped_early", False),
                         payload.get("elapsed_s", 0.0), payload.get("notes", []))
    return result, payload.get("command")


#: The file that marks a folder as ``vitmix bench`` output, which a later bench may refresh.
RESULTS_MARKER = "results.json"


def write_results(result: SweepResult, out_dir: str, command: Optional[str] = None) -> List[str]:
    """Write CSV, JSON, markdown and plots of ``result`` into ``out_dir``; return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    rows = result.rows
    kind = "mixer" if result.config.kind == "mixers" else "model"
    paths = []
    paths.append(write_csv(os.path.join(out_dir, "results.csv"), rows, columns(result.config)))
    json_path = os.path.join(out_dir, RESULTS_MARKER)
    payload = result.to_dict()
    payload["command"] = command
    with open(json_path, "w") as fh:
        json.dump(payload, fh, indent=1, default=str)
    paths.append(json_path)
    plots = []
    what = "one mixer layer" if kind == "mixer" else "whole model"
    try:
        for metric, fname in (("median_ms", "time.png"), ("peak_mib", "memory.png")):
            label = "time" if metric == "median_ms" else "peak memory"
            p = plot(rows, kind, metric, os.path.join(out_dir, fname), f"{label}, {what}")
            if p:
                plots.append(p)
    except MissingExtra as err:        # the measurements are the result; the plots need the `plot` extra
        warnings.warn(f"{err}; the results are written without their plots", UserWarning, stacklevel=2)
    md_path = os.path.join(out_dir, "results.md")
    with open(md_path, "w") as fh:
        fh.write(markdown_report(result, command, [os.path.basename(p) for p in plots]))
    paths.append(md_path)
    return paths + plots


def markdown_report(result: SweepResult, command: Optional[str], plot_names: Sequence[str] = ()) -> str:
    kind = "mixer" if result.config.kind == "mixers" else "model"
    cfg = result.config
    parts = [f"# vitmix bench: {result.config.kind}", ""]
    if command:
        parts += ["Command:", "", "```", command, "```", ""]
    parts += environment_lines(result) + [""]
    if kind == "mixer":
        parts.append(f"One mixer layer, batch {cfg.batch}, dim {cfg.dim}, {cfg.heads} heads, {cfg.dtype}. "
                     "Speed-up = softmax time / time (>1 is faster than the baseline).")
    else:
        parts.append(f"Whole models, batch {cfg.batch}, {cfg.dtype}, baseline `{cfg.baseline_model}`. "
                     "Speed-up = baseline time / time.")
    opts = {}
    for r in result.rows:
        if r.get("options"):
            opts.setdefault(r["name"], r["options"])
    if opts:
        parts.append("Layer options: " + "; ".join(f"`{n}`: {o}" for n, o in opts.items())
                     + " (token sweeps fix the landmark count so the cost per token is constant).")
    parts += ["† = FLOPs from the mixer's analytic formula (the counter saw less).", ""]
    if cfg.compile:
        parts += [f"Compiled: the same point timed again through `torch.compile(backend={cfg.compile_backend!r})`; "
                  "compiled / eager < 1 is faster compiled: the median over 6 rounds that each time eager and "
                  "compiled back to back (alternating order), so both see the same machine load; ± is half the "
                  "ratio's inter-quartile range over the rounds (its run-to-run noise); compile s = the first "
                  "compiled call (tracing and code generation), not in the median. Memory and FLOPs are the eager "
                  "ones.", ""]
        parts += compile_summary(result.rows) + [""]
    for note in result.notes:
        parts += [f"**Note:** {note}", ""]
    parts += [markdown_table(result.rows, kind, cfg.compile), ""]
    slopes = slope_table(result.rows, kind)
    if slopes:
        names = sorted({(k[1], k[2]) for k in slopes}, key=lambda t: (t[1], t[0]))
        cells = [[name, pass_name, _fmt(slopes.get(("median_ms", pass_name, name))),
                  _fmt(slopes.get(("peak_mib", pass_name, name)))] for pass_name, name in names]
        parts += [f"Fitted log–log slopes (against {'N' if kind == 'mixer' else 'pixels'}; 1 = linear, "
                  "2 = quadratic):", "", _markdown(["name", "pass", "time slope", "memory slope"], cells), ""]
    for p in plot_names:
        parts += [f"![{p}]({p})", ""]
    return "\n".join(parts)


def summary_text(result: SweepResult) -> str:
    """The table printed at the end of ``vitmix bench``."""
    kind = "mixer" if result.config.kind == "mixers" else "model"
    compiled = result.config.compile
    lines = environment_lines(result) + ["", markdown_table(result.rows, kind, compiled)]
    return "\n".join(lines + ([""] + compile_summary(result.rows) if compiled else []))


__all__ = ["write_results", "load_results", "markdown_table", "markdown_report", "summary_text", "fit_slope", "plot",
           "slope_table", "loglog_panels", "line_style", "gpu_lines", "env_lines", "COLUMNS", "COMPILE_COLUMNS",
           "columns", "compile_summary"]
