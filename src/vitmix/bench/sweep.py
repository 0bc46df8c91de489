"""The benchmark sweep: mixers × token counts, or models × image sizes.

Each point (target, size, pass) is measured once for FLOPs and peak memory and then timed. Points
are visited smallest size first across all targets, so a budget that runs out leaves a complete
picture of the small sizes. Before a point runs, its time and memory are extrapolated from the
same target's previous sizes (log–log slope of the last two points, quadratic when only one is
known): a point predicted not to fit the remaining ``max_seconds`` budget or ``max_memory_gb`` is
skipped with a note; out-of-memory errors and sizes a model or mixer rejects (``ValueError``) are
skipped with the reason. Once the budget is spent the sweep stops and marks the rest as not run.
With ``compile=True`` each measured point is timed a second time through ``torch.compile``
(:func:`vitmix.bench.points.measure_compiled`); a mixer that fails to compile keeps its eager row
with a one-line note.

The jobs live in their own modules: :mod:`.targets` (specs and settings checked), :mod:`.points`
(one point built, called and measured), :mod:`.paired` (paired timing ratios); this module is the
loop over the points, the skip predictions and the ratios to the baseline, and keeps re-exporting
the names callers import from ``vitmix.bench.sweep``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from .config import (  # noqa: F401  (re-exported: the sweep's public names)
    DEFAULT_BASELINE_MODEL, DEFAULT_IMAGE_SIZES, DEFAULT_TOKENS, PASSES, BenchConfig, SweepResult, Target,
)
from ..runs.device import parse_device
from .memory import memory_method
from .paired import PairedRatio, paired_ratio  # noqa: F401  (re-exported)
from .points import (  # noqa: F401  (re-exported)
    build_point, check_mixer_options, layer_options, measure_point, point_builder, point_call, token_grid,
)
from .targets import (  # noqa: F401  (re-exported)
    DTYPES, parse_mixer_spec, resolve_targets, validate,
)


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error (CUDA's ``OutOfMemoryError``, or an allocator message)."""
    text = str(err).lower()
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in text or \
        "can't allocate memory" in text or "not enough memory" in text

_is_oom = is_oom  # the earlier private name (tests use it)


def _extrapolate(history: List[Tuple[float, float]], x: float, default_slope: float = 2.0) -> Optional[float]:
    pts = [(a, b) for a, b in history if a > 0 and b and b > 0]
    if not pts:
        return None
    if len(pts) == 1:
        (x0, y0), slope = pts[-1], default_slope
    else:
        (x1, y1), (x0, y0) = pts[-2], pts[-1]
        slope = math.log(y0 / y1) / math.log(x0 / x1) if x0 != x1 else default_slope
        slope = min(max(slope, 0.5), default_slope)  # noise must not predict worse than quadratic
    # one slow outlier must not veto the rest of a target: never predict more than the quadratic
    # extrapolation from any earlier point
    return min([y0 * (x / x0) ** slope] + [b * (x / a) ** default_slope for a, b in pts])


def run_sweep(config: BenchConfig, progress: bool = True) -> SweepResult:
    """Run the sweep described by ``config``; never raises for a point that does not fit."""
    validate(config)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run_sweep(config, progress)
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Sweep:
    """What the sweep carries from one point to the next: the budget, the limits and the history."""

    config: BenchConfig
    device: torch.device
    mem_limit: Optional[int]
    start: float
    stopped: bool = False
    #: (label, pass) → measured (x, seconds) and (x, bytes), x = tokens or pixels
    history: Dict[Tuple[str, str], Dict[str, List[Tuple[float, float]]]] = field(default_factory=dict)
    #: (label, pass) → why every larger size of that target is skipped
    blocked: Dict[Tuple[str, str], str] = field(default_factory=dict)


def _run_sweep(config: BenchConfig, progress: bool) -> SweepResult:
    from .env import environment, load_average

    targets = resolve_targets(config)
    check_mixer_options(targets, config)
    device = parse_device(config.device)
    sweep = _Sweep(config, device, _memory_limit(config, device), time.perf_counter())
    env = environment(device)
    env["memory_method"] = memory_method(device) if config.measure_memory else "off"
    env["memory_limit_gib"] = round(sweep.mem_limit / 2 ** 30, 2) if sweep.mem_limit else None
    builder = point_builder(config.kind)
    jobs = _jobs(config, targets)
    rows: List[dict] = []
    bar = _progress_bar(config, len(jobs)) if progress else None
    try:
        for size, target, pass_name in jobs:
            if bar is not None:
                bar.set_postfix_str(f"{target.label} {size} {pass_name}")
            rows.append(_run_point(sweep, builder, size, target, pass_name))
            if bar is not None:
                bar.update(1)
    except KeyboardInterrupt:
        sweep.stopped = True
        rows += [_interrupted_row(config, device, *job) for job in jobs[len(rows):]]
    finally:
        if bar is not None:
            bar.close()
    _add_ratios(rows)
    env["load_average_1m_end"] = load_average()
    result = SweepResult(config, rows, env, stopped_early=sweep.stopped, elapsed_s=time.perf_counter() - sweep.start)
    if sweep.stopped:
        result.notes.append(f"the sweep stopped early (budget {config.max_seconds:g} s); rows marked "
                            f"'not run' were not measured")
    return result


def _memory_limit(config: BenchConfig, device: torch.device) -> Optional[int]:
    """``--max-memory-gb`` in bytes, else half of what the device has free now (``None``: unknown)."""
    if config.max_memory_gb:
        return int(config.max_memory_gb * 2 ** 30)
    available = _available_bytes(device)
    return available // 2 if available else None


def _available_bytes(device: torch.device) -> Optional[int]:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # non-Linux (no /proc): the memory-fit check is skipped; tested by making it fail
        pass
    return None


def _jobs(config: BenchConfig, targets: List[Target]) -> List[Tuple[int, Target, str]]:
    """``(size, target, pass)`` smallest size first; the baseline first within each size, so a budget
    that runs out still leaves ratios for what ran."""
    default = DEFAULT_TOKENS if config.kind == "mixers" else DEFAULT_IMAGE_SIZES
    sizes = sorted({int(s) for s in (config.sizes or default)})
    ordered = sorted(targets, key=lambda t: not t.baseline)
    return [(size, t, p) for size in sizes for t in ordered for p in config.passes]


def _progress_bar(config: BenchConfig, total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"vitmix bench {config.kind}", unit="pt", leave=False)


def _new_row(config: BenchConfig, device: torch.device, size: int, target: Target, pass_name: str) -> dict:
    mixers = config.kind == "mixers"
    return {"kind": config.kind[:-1], "name": target.label, "baseline": target.baseline,
            "options": ",".join(f"{k}={v}" for k, v in layer_options(target).items()) if mixers else "",
            "size": size, "tokens": size if mixers else None, "batch": config.batch,
            "dim": config.dim if mixers else None, "heads": config.heads if mixers else None,
            "dtype": config.dtype, "pass": pass_name, "device": str(device), "status": "ok", "note": ""}


def _interrupted_row(config: BenchConfig, device: torch.device, size: int, target: Target, pass_name: str) -> dict:
    return {"kind": config.kind[:-1], "name": target.label, "baseline": target.baseline, "size": size,
            "dtype": config.dtype, "pass": pass_name, "device": str(device), "status": "not run",
            "note": "interrupted"}


def _run_point(sweep: _Sweep, builder, size: int, target: Target, pass_name: str) -> dict:
    """One row: measured, or skipped/not run with the reason (budget, prediction, earlier failure)."""
    config = sweep.config
    row = _new_row(config, sweep.device, size, target, pass_name)
    key = (target.label, pass_name)
    remaining = config.max_seconds - (time.perf_counter() - sweep.start)
    if sweep.stopped or remaining <= 0:
        sweep.stopped = True
        row.update(status="not run", note=f"budget of {config.max_seconds:g} s exhausted")
        return row
    if key in sweep.blocked:
        row.update(status="skipped", note=sweep.blocked[key])
        return row
    hist = sweep.history.setdefault(key, {"time": [], "mem": [], "compile_s": 0.0})
    x_scale = size if config.kind == "mixers" else size * size
    skip = _predicted_skip(sweep, hist, x_scale, remaining)
    if skip is not None:
        row.update(status="skipped", note=skip[0])
        sweep.blocked[key] = skip[1]
        return row
    _measure_or_note(row, sweep, builder, target, size, pass_name)
    if row["status"] == "ok":
        hist["time"].append((x_scale, row["median_ms"] / 1e3))
        if row.get("peak_mib"):
            hist["mem"].append((x_scale, row["peak_mib"] * 2 ** 20))
        hist["compile_s"] = row.get("compile_s") or hist["compile_s"]
    return row


def _predicted_skip(sweep: _Sweep, hist: dict, x_scale: float, remaining: float) -> Optional[Tuple[str, str]]:
    """``(note, reason for the larger sizes)`` when the extrapolated time or memory does not fit."""
    config = sweep.config
    t_pred = _extrapolate(hist["time"], x_scale)
    m_pred = _extrapolate(hist["mem"], x_scale)
    # warm-up + at least 3 timed calls, + one FLOP-counting and one memory-tracking call
    calls = 4 + int(config.measure_flops) + int(config.measure_memory)
    need = None if t_pred is None else t_pred * calls + config.min_run_time
    if need is not None and config.compile:  # the last compilation again, then warm-up + 3 compiled calls
        need += hist["compile_s"] + t_pred * 4 + config.min_run_time
    if need is not None and need > remaining:
        return (f"predicted ~{need:.0f} s for this point exceeds the "
                f"remaining budget of {remaining:.0f} s",
                "a smaller size was already predicted to exceed the time budget")
    if m_pred is not None and sweep.mem_limit and m_pred > sweep.mem_limit:
        return (f"predicted peak memory {m_pred / 2 ** 30:.1f} GiB exceeds the limit "
                f"{sweep.mem_limit / 2 ** 30:.1f} GiB",
                "a smaller size was already predicted to exceed the memory limit")
    return None


def _measure_or_note(row: dict, sweep: _Sweep, builder, target: Target, size: int, pass_name: str) -> None:
    """Measure the point into ``row``; a rejected size, out-of-memory or other error becomes its note."""
    try:
        measure_point(row, builder, target, size, pass_name, sweep.config, sweep.device)
    except ValueError as err:
        row.update(status="skipped", note=f"invalid size: {err}")
    except (RuntimeError, MemoryError) as err:
        if is_oom(err):
            row.update(status="skipped", note="out of memory")
            sweep.blocked[(target.label, pass_name)] = "a smaller size ran out of memory"
        else:
            row.update(status="error", note=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
    finally:
        if sweep.device.type == "cuda":
            torch.cuda.empty_cache()


def _add_ratios(rows: List[dict]) -> None:
    """Speed-up (baseline time / time), memory and FLOP ratios against the softmax baseline row.

    Also marks forward+backward FLOPs of targets whose forward needed the analytic formula as a lower
    bound: the backward of a kernel the counter cannot see is missing from them too.
    """
    analytic_fwd = {(r["name"], r["size"]): r["gflops"] for r in rows
                    if r["pass"] == "fwd" and r.get("flops_source") == "analytic"}
    for r in rows:
        fwd = analytic_fwd.get((r["name"], r["size"]))
        if r["pass"] == "fwd+bwd" and r["status"] == "ok" and fwd is not None and r.get("gflops") is not None:
            r["flops_source"] = "counter (lower bound)"
            extra = (f"FLOPs are a lower bound: the backward of a kernel the counter cannot see is missing "
                     f"(forward alone is {fwd:.3g} GFLOPs by formula)")
            r["note"] = "; ".join(x for x in (r.get("note"), extra) if x)
    base = {(r["size"], r["pass"], r["dtype"]): r for r in rows if r.get("baseline") and r["status"] == "ok"}
    for r in rows:
        b = base.get((r["size"], r["pass"], r["dtype"]))
        ok = r["status"] == "ok" and b is not None
        r["speedup_vs_softmax"] = b["median_ms"] / r["median_ms"] if ok else None
        r["memory_vs_softmax"] = (r["peak_mib"] / b["peak_mib"]
                                  if ok and r.get("peak_mib") and b.get("peak_mib") else None)
        r["flops_vs_softmax"] = (r["gflops"] / b["gflops"]
                                 if ok and r.get("gflops") and b.get("gflops") else None)


__all__ = ["BenchConfig", "SweepResult", "Target", "run_sweep", "resolve_targets", "validate",
           "build_point", "point_call", "is_oom",
           "parse_mixer_spec", "token_grid", "DEFAULT_TOKENS", "DEFAULT_IMAGE_SIZES", "PASSES", "DTYPES"]
