"""The benchmark sweep: mixers × token counts, or models × image sizes.

Each point (target, size, pass) is measured once for FLOPs and peak memory and then timed. Points
are visited smallest size first across all targets, so a budget that runs out leaves a complete
picture of the small sizes. Before a point runs, its time and memory are extrapolated from the
same target's previous sizes (log–log slope of the last two points, quadratic when only one is
known): a point predicted not to fit the remaining ``max_seconds`` budget or ``max_memory_gb`` is
skipped with a note; out-of-memory errors and sizes a model or mixer rejects (``ValueError``) are
skipped with the reason. Once the budget is spent the sweep stops and marks the rest as not run.
With ``compile=True`` each measured point is timed a second time through ``torch.compile``
(:func:`_measure_compiled`); a mixer that fails to compile keeps its eager row with a one-line note.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .._util import autocast, close_matches
from .config import (  # noqa: F401  (re-exported: the sweep's public names)
    DEFAULT_BASELINE_MODEL, DEFAULT_IMAGE_SIZES, DEFAULT_TOKENS, LAYER_DEFAULTS, PASSES, BenchConfig, SweepResult,
    Target,
)
from .flops import analytic_flops, count_flops
from .memory import memory_method, peak_memory
from .timing import time_call

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ------------------------------------------------------------------------------------------
# parsing and validation
# ------------------------------------------------------------------------------------------
def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_mixer_spec(spec: str) -> Target:
    """``"softmax:fused=false"`` → ``Target(label, "softmax", {"fused": False})``."""
    parts = [p.strip() for p in spec.strip().split(":") if p.strip()]
    if not parts:
        raise ValueError("empty mixer name in --mixers")
    options = {}
    for part in parts[1:]:
        if "=" not in part:
            raise ValueError(f"mixer option {part!r} in {spec!r} is not key=value (e.g. softmax:fused=false)")
        key, value = part.split("=", 1)
        options[key.strip()] = _parse_value(value.strip())
    return Target(label=":".join(parts), name=parts[0], options=options)


def resolve_targets(config: BenchConfig) -> List[Target]:
    """Validate the names (``ValueError`` with close matches) and add the softmax baseline."""
    from ..mixers import get_mixer_class, list_mixers

    names = [n.strip() for n in config.names if n.strip()]
    if not names:
        raise ValueError(f"no {config.kind} given")
    targets: List[Target] = []
    if config.kind == "mixers":
        if "all" in names:  # "all" expands in place; other specs (e.g. softmax:fused=false) stay
            i = names.index("all")
            names = names[:i] + [m for m in list_mixers() if m not in names] + names[i + 1:]
        for spec in names:
            target = parse_mixer_spec(spec)
            cls = get_mixer_class(target.name)  # ValueError with close matches
            target.name = cls.mixer_name
            valid = cls.option_names()
            for key in target.options:
                if key not in valid:
                    raise ValueError(f"mixer {target.name!r} has no option {key!r}."
                                     + close_matches(key, valid) + f" Options: {', '.join(valid)}")
            targets.append(target)
        if not any(t.name == "softmax" and not t.options for t in targets):
            targets.insert(0, Target("softmax", "softmax", {}, baseline=True))
        else:
            for t in targets:
                t.baseline = t.name == "softmax" and not t.options
    elif config.kind == "models":
        from ..models import list_models

        known = set(list_models())
        import timm

        for name in names + [config.baseline_model]:
            if name not in known and not timm.is_model(name):
                raise ValueError(f"unknown model {name!r}." + close_matches(name, sorted(known), n=5)
                                 + " See `vitmix models` for the list.")
        for name in names:
            targets.append(Target(name, name, {}, baseline=name == config.baseline_model))
        if not any(t.baseline for t in targets):
            targets.insert(0, Target(config.baseline_model, config.baseline_model, {}, baseline=True))
    else:
        raise ValueError(f"kind must be 'mixers' or 'models', got {config.kind!r}")
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate names in {', '.join(labels)}")
    return targets


def validate(config: BenchConfig) -> None:
    """Check every setting up front so a sweep never fails half way through on a typo."""
    if config.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {config.dtype!r}." + close_matches(config.dtype, DTYPES)
                         + f" Choose from {', '.join(DTYPES)}")
    for p in config.passes:
        if p not in PASSES:
            raise ValueError(f"unknown pass {p!r}." + close_matches(p, PASSES) + f" Choose from {', '.join(PASSES)}")
    if not config.passes:
        raise ValueError("give at least one pass (fwd, fwd+bwd)")
    if config.sizes is not None and (not config.sizes or any(int(s) <= 0 for s in config.sizes)):
        raise ValueError(f"sizes must be positive integers, got {config.sizes}")
    for key in ("batch", "dim", "heads"):
        if int(getattr(config, key)) <= 0:
            raise ValueError(f"{key} must be positive, got {getattr(config, key)}")
    if config.kind == "mixers" and config.dim % config.heads:
        raise ValueError(f"dim={config.dim} is not divisible by heads={config.heads}; "
                         f"try dim={config.heads * max(1, round(config.dim / config.heads))}")
    if config.threads is not None and config.threads < 1:
        raise ValueError(f"threads must be >= 1, got {config.threads}")
    if config.max_seconds <= 0:
        raise ValueError(f"max_seconds must be positive, got {config.max_seconds}")
    if config.min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive, got {config.min_run_time}")
    if config.device not in ("auto", "cpu", "cuda") and not config.device.startswith("cuda:"):
        raise ValueError(f"device must be auto, cpu or cuda, got {config.device!r}")
    if config.device.startswith("cuda"):
        check_cuda_device(config.device)
    if config.compile:
        _check_compile_backend(config.compile_backend)


def check_cuda_device(name: str, hint: str = "; use --device cpu") -> torch.device:
    """The CUDA device ``name`` (``"cuda"`` or ``"cuda:i"``); ``ValueError`` (ending with ``hint``) when no
    such device is visible."""
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but no CUDA device is visible "
                         f"(torch.cuda.is_available() is False){hint}")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:i, got {name!r}") from None
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"device {name!r} requested but only {count} CUDA device(s) are visible")
    return device


def _check_compile_backend(name: str) -> None:
    """``ValueError`` with close matches for a backend ``torch.compile`` does not know."""
    from torch._dynamo import list_backends

    backends = list_backends(exclude_tags=())
    if name not in backends:
        raise ValueError(f"unknown torch.compile backend {name!r}." + close_matches(name, backends)
                         + " Common ones: inductor, aot_eager, eager")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


def token_grid(n_tokens: int) -> Tuple[int, int]:
    """The most square ``(H, W)`` with ``H * W == n_tokens`` (``H <= W``)."""
    h = math.isqrt(n_tokens)
    while n_tokens % h:
        h -= 1
    return h, n_tokens // h


# ------------------------------------------------------------------------------------------
# building one point
# ------------------------------------------------------------------------------------------
@dataclass
class _Point:
    module: torch.nn.Module
    inputs: torch.Tensor
    call: Callable[[torch.Tensor], torch.Tensor]
    tokens: int
    work_items: int  # tokens (mixers) or images (models) per call
    unit: str


def layer_options(target: Target) -> Dict[str, object]:
    """The options a mixer layer is built with: its bench defaults overridden by the spec's."""
    from ..mixers import get_mixer_class

    cls = get_mixer_class(target.name)
    defaults = getattr(cls, "bench_options", None)
    if not isinstance(defaults, dict):
        defaults = LAYER_DEFAULTS.get(target.name, {})
    return {**defaults, **target.options}


def check_mixer_options(targets: List[Target], config: BenchConfig) -> None:
    """Build each mixer once (no input) so that a bad option value is a ``ValueError`` before anything
    is measured or written, not a skipped point in a results file that replaced the last one."""
    from ..mixers import create

    for target in targets:
        if config.kind == "mixers":
            try:
                create(target.name, config.dim, config.heads, **layer_options(target))
            except (ValueError, TypeError) as err:
                raise ValueError(f"mixer spec {target.label!r}: {err}") from None


def _build_mixer(target: Target, n: int, config: BenchConfig, device) -> _Point:
    from ..mixers import create

    hw = token_grid(n)
    module = create(target.name, config.dim, config.heads, hw=hw, num_prefix_tokens=0, **layer_options(target))
    module = module.to(device)
    x = torch.randn(config.batch, n, config.dim, device=device)
    return _Point(module, x, module, n, config.batch * n, "tokens/s")


def _build_model(target: Target, size: int, config: BenchConfig, device) -> _Point:
    from ..models import create_model

    model = create_model(target.name, img_size=size)
    embed = getattr(model, "patch_embed", None)
    in_chans = 3
    proj = getattr(embed, "proj", None)
    if isinstance(proj, torch.nn.Conv2d):
        in_chans = proj.in_channels
    tokens = size * size
    grid = getattr(embed, "grid_size", None)
    if grid is not None:
        tokens = int(grid[0]) * int(grid[1]) + int(getattr(model, "num_prefix_tokens", 0) or 0)
    model = model.to(device)
    x = torch.randn(config.batch, in_chans, size, size, device=device)
    return _Point(model, x, model, tokens, config.batch, "images/s")


def _make_fn(point: _Point, pass_name: str, device, dtype: str):
    module, x = point.module, point.inputs
    amp_dtype = DTYPES[dtype]

    if pass_name == "fwd":
        module.eval()

        def fn():
            with torch.no_grad(), autocast(device, amp_dtype):
                return point.call(x)
    else:
        module.train()
        xg = x.detach().requires_grad_(point.inputs.dim() == 3)  # a layer inside a network needs dX

        def fn():
            with autocast(device, amp_dtype):
                out = point.call(xg)
            out.float().sum().backward()
            # release the gradients here, not at the start of the next call: between calls nothing is
            # left behind, so the memory baseline is parameters + input and the peak includes the grads
            module.zero_grad(set_to_none=True)
            xg.grad = None
    return fn


def build_point(config: BenchConfig, spec: str, size: int, device) -> _Point:
    """One point of a ``config.kind`` sweep, built as the sweep builds it: mixer ``spec`` (with its bench
    options) on ``size`` tokens, or model ``spec`` on ``size``² images, with its input on ``device``."""
    if config.kind == "mixers":
        return _build_mixer(parse_mixer_spec(spec), size, config, device)
    return _build_model(Target(spec, spec), size, config, device)


def point_call(point: _Point, pass_name: str, device, dtype: str) -> Callable[[], None]:
    """The call the sweep times for ``pass_name``: forward under ``no_grad``, or forward + backward that
    leaves no gradients behind; ``dtype`` other than fp32 runs under ``torch.autocast``."""
    return _make_fn(point, pass_name, device, dtype)


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error (CUDA's ``OutOfMemoryError``, or an allocator message)."""
    text = str(err).lower()
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in text or \
        "can't allocate memory" in text or "not enough memory" in text


_is_oom = is_oom  # the earlier private name (tests use it)


# ------------------------------------------------------------------------------------------
# prediction from previous points
# ------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------
# the sweep
# ------------------------------------------------------------------------------------------
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
    device = resolve_device(config.device)
    sweep = _Sweep(config, device, _memory_limit(config, device), time.perf_counter())
    env = environment(device)
    env["memory_method"] = memory_method(device) if config.measure_memory else "off"
    env["memory_limit_gib"] = round(sweep.mem_limit / 2 ** 30, 2) if sweep.mem_limit else None
    builder = _build_mixer if config.kind == "mixers" else _build_model
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
        _measure_point(row, builder, target, size, pass_name, sweep.config, sweep.device)
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


def _measure_point(row: dict, builder, target: Target, size: int, pass_name: str, config: BenchConfig,
                   device) -> None:
    torch.manual_seed(config.seed)
    point = builder(target, size, config, device)
    row["tokens"] = point.tokens
    row["params"] = sum(p.numel() for p in point.module.parameters())
    fn = _make_fn(point, pass_name, device, config.dtype)
    if config.measure_flops:
        counted = count_flops(fn)
        row["gflops"] = counted.total / 1e9
        row["flops_source"] = "counter"
        notes = []
        if counted.uncounted_ops:
            notes.append("no FLOP formula for " + ", ".join(counted.uncounted_ops))
        if config.kind == "mixers" and pass_name == "fwd":
            analytic = analytic_flops(point.module, config.batch, size)
            row["gflops_analytic"] = None if analytic is None else analytic / 1e9
            if analytic and counted.total < 0.999 * analytic:
                row["gflops"] = analytic / 1e9
                row["flops_source"] = "analytic"
                notes.append(f"counter saw only {counted.total / 1e9:.3g} GFLOPs; analytic formula used")
        if notes:
            row["note"] = "; ".join(notes)
    if config.measure_memory:
        track = [point.module, point.inputs]
        mem = peak_memory(fn, device, track)
        row["peak_mib"] = None if mem.peak_bytes is None else mem.peak_bytes / 2 ** 20
        row["memory_method"] = mem.method
    timing = time_call(fn, device, min_run_time=config.min_run_time)
    row["median_ms"] = timing.median_s * 1e3
    row["iqr_ms"] = timing.iqr_s * 1e3
    row["samples"] = len(timing.samples)
    row["throughput"] = point.work_items / timing.median_s
    row["throughput_unit"] = point.unit
    row["timing_method"] = timing.method
    if config.compile:
        _measure_compiled(row, point, fn, pass_name, config, device)
    del point, fn


def _measure_compiled(row: dict, point: _Point, eager_fn, pass_name: str, config: BenchConfig, device) -> None:
    """Time the same point again through ``torch.compile(module, backend=config.compile_backend)``.

    The first compiled call (tracing and code generation) is ``compile_s``, kept out of the median, and
    the graph breaks dynamo reported are counted. ``compiled_vs_eager`` comes from :func:`paired_ratio`
    (eager and compiled timed in alternating rounds, so both see the same machine load). Any failure to
    compile or run compiled is a result, not a crash: the row keeps its eager numbers and says in one
    line why compiling failed.
    """
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # a fresh cache per point: no recompile limit, no shapes made dynamic by earlier sizes
    breaks_before = sum(counters["graph_break"].values())
    try:
        compiled = torch.compile(point.module, backend=config.compile_backend)
        fn = _make_fn(replace(point, call=compiled), pass_name, device, config.dtype)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compile_s = time.perf_counter() - start
        graph_breaks = sum(counters["graph_break"].values()) - breaks_before
        paired = paired_ratio(eager_fn, fn, device, config.min_run_time)
    except Exception as err:  # noqa: BLE001  (compilers raise many types; each is one line in the row)
        message = "compile failed: " + _one_line(err)
        row.update(compile_status="failed", note="; ".join(x for x in (row.get("note"), message) if x))
        return
    finally:
        torch._dynamo.reset()  # drop the compiled graphs (and the module they hold)
    row.update(compile_status="ok", compile_s=compile_s, compiled_median_ms=paired.compiled_s * 1e3,
               compiled_vs_eager=paired.ratio, compiled_vs_eager_iqr=paired.ratio_iqr, graph_breaks=graph_breaks)


@dataclass
class PairedRatio:
    """``ratio``: median over rounds of (B time / A time); ``ratio_iqr``: its inter-quartile range over the
    rounds (the run-to-run noise of the ratio); ``compiled_s``: median B time."""

    ratio: float
    ratio_iqr: float
    compiled_s: float


def paired_ratio(a: Callable[[], object], b: Callable[[], object], device, min_run_time: float,
                 rounds: int = 6) -> PairedRatio:
    """How much slower ``b`` is than ``a``, measured fairly on a shared machine: ``rounds`` rounds, each
    timing both (in alternating order, A B then B A), one ratio per round. Timing one after the other
    minutes apart would compare two different machine loads."""
    ratios, b_times = [], []
    budget = max(min_run_time / (2 * rounds), 0.02)
    for r in range(rounds):
        order = (a, b) if r % 2 == 0 else (b, a)
        t = {id(f): time_call(f, device, min_run_time=budget).median_s for f in order}
        ratios.append(t[id(b)] / t[id(a)])
        b_times.append(t[id(b)])
    q = statistics.quantiles(ratios, n=4)
    return PairedRatio(statistics.median(ratios), q[2] - q[0], statistics.median(b_times))


def _one_line(err: BaseException) -> str:
    """``Type: first line`` of an error, naming the original error a compiler wrapped (e.g. dynamo's
    ``BackendCompilerFailed: backend='inductor' raised:`` says nothing by itself)."""
    root, seen = err, {id(err)}
    while True:  # dynamo keeps the backend's error as ``inner_exception``, others chain it as the cause
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if not isinstance(inner, BaseException) or id(inner) in seen:
            break
        root = inner
        seen.add(id(inner))
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    text = f"{type(root).__name__}: {lines[0][:200] if lines else ''}"
    return text if root is err else f"{type(err).__name__} ({text})"


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


__all__ = ["BenchConfig", "SweepResult", "Target", "run_sweep", "resolve_targets", "validate", "check_cuda_device",
           "build_point", "point_call", "is_oom",
           "parse_mixer_spec", "token_grid", "DEFAULT_TOKENS", "DEFAULT_IMAGE_SIZES", "PASSES", "DTYPES"]
