"""One point of a sweep: a mixer layer on ``size`` tokens or a model on ``size``² images, built as the
sweep builds it, the call it times (forward, or forward + backward), and its measurement into a row
(FLOPs, peak memory, median time, and with ``compile=True`` the compiled time, :func:`measure_compiled`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Tuple

import torch

from .._util import autocast
from .config import BenchConfig, Target
from .flops import analytic_flops, count_flops
from .memory import peak_memory
from .paired import paired_ratio
from .targets import DTYPES, model_kwargs, parse_mixer_spec
from .timing import time_call


def token_grid(n_tokens: int) -> Tuple[int, int]:
    """The most square ``(H, W)`` with ``H * W == n_tokens`` (``H <= W``)."""
    h = math.isqrt(n_tokens)
    while n_tokens % h:
        h -= 1
    return h, n_tokens // h


@dataclass
class _Point:
    module: torch.nn.Module
    inputs: torch.Tensor
    call: Callable[[torch.Tensor], torch.Tensor]
    tokens: int
    work_items: int  # tokens (mixers) or images (models) per call
    unit: str


def layer_options(target: Target) -> Dict[str, object]:
    """The options a mixer layer is built with: its class's ``bench_options`` overridden by the spec's."""
    from ..mixers import get_mixer_class

    return {**get_mixer_class(target.name).bench_options, **target.options}


def check_mixer_options(targets: List[Target], config: BenchConfig) -> None:
    """Build each mixer once (no input) so that a bad option value is a ``ValueError`` before anything
    is measured or written, not a skipped point in a results file that replaced the last one."""
    from ..mixers import create

    for target in targets:
        if config.kind == "mixers":
            try:
                create(target.name, config.dim, config.heads, sequence=config.sequence, **layer_options(target))
            except (ValueError, TypeError) as err:
                raise ValueError(f"mixer spec {target.label!r}: {err}") from None


def _build_mixer(target: Target, n: int, config: BenchConfig, device) -> _Point:
    from ..mixers import create

    # a 1-D sequence (hw (1, n) as seq_* models give it: layers sized by N, Linformer, take n), or a token grid
    where = {"sequence": True, "hw": (1, n)} if config.sequence else {"hw": token_grid(n)}
    module = create(target.name, config.dim, config.heads, num_prefix_tokens=0, **where, **layer_options(target))
    module = module.to(device)
    x = torch.randn(config.batch, n, config.dim, device=device)
    return _Point(module, x, module, n, config.batch * n, "tokens/s")


def _model_at(name: str, size: int, **kwargs) -> torch.nn.Module:
    """Model ``name`` (with ``kwargs``, e.g. ``mixer=``) built for ``size``² images; a model without an
    ``img_size`` option (no position table to size, e.g. timm's ``pvt_v2_*``) takes any image size as built."""
    from ..models import create_model

    try:
        return create_model(name, img_size=size, **kwargs)
    except ValueError as err:
        if "unexpected keyword argument 'img_size'" not in str(err):
            raise
    return create_model(name, **kwargs)


def _build_model(target: Target, size: int, config: BenchConfig, device) -> _Point:
    model = _model_at(target.name, size, **model_kwargs(target))
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


def point_builder(kind: str) -> Callable[[Target, int, BenchConfig, torch.device], "_Point"]:
    """The builder of one point of a ``kind`` sweep (``"mixers"`` or ``"models"``)."""
    return _build_mixer if kind == "mixers" else _build_model


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


def measure_point(row: dict, builder, target: Target, size: int, pass_name: str, config: BenchConfig,
                   device) -> None:
    """Build the point and measure it into ``row`` (FLOPs, peak memory, median time, compiled time)."""
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
        measure_compiled(row, point, fn, pass_name, config, device)
    del point, fn


def measure_compiled(row: dict, point: _Point, eager_fn, pass_name: str, config: BenchConfig, device) -> None:
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


__all__ = ["build_point", "check_mixer_options", "layer_options", "measure_compiled", "measure_point", "point_builder",
           "point_call", "token_grid"]
