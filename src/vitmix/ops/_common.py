"""Small helpers shared by the kernel-attention ops (private)."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the ops compute in: float32 for half inputs, else the promoted input dtype."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if dtype in _HALF or not dtype.is_floating_point:
        return torch.float32
    return dtype


@contextlib.contextmanager
def no_autocast(device_type: str) -> Iterator[None]:
    """Disable autocast for ``device_type`` (kernels, inverses and normalisers run in float32)."""
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type=device_type, enabled=False):
            yield
    else:
        yield


def traced() -> bool:
    """True while ``torch.compile`` / ``torch.export`` trace the code (fake tensors, no data).

    The ops then call their ``torch.library`` custom ops (``torch.ops.vitmix.*``): one node in the graph,
    a fake implementation for the shapes, and the real implementation (C kernels included) when the
    compiled code runs. Eager calls keep the direct ``autograd.Function``s, which run the same forward
    and backward functions: a custom-op call adds dispatch overhead that is a visible share of a small
    layer (``docs/kernel-ops.md``, "Costs behind the dispatch choices"), and Python dispatch modes
    (``FlopCounterMode``, ``MemTracker``) cannot see inside a custom op but do see the functions' own
    PyTorch calls.
    """
    return torch.compiler.is_compiling()


def exporting_to_onnx() -> bool:
    """True while ``torch.onnx.export`` traces the code, with either exporter: the dynamo exporter's
    ``torch.export`` capture or the TorchScript exporter's ``torch.jit`` trace (timm's ``onnx_export``).

    The ops then run their export decompositions (:mod:`vitmix.ops.decompositions`) inline: plain
    PyTorch that both exporters translate to ONNX operators, where a ``vitmix::*`` custom op has no ONNX
    translation and a C kernel cannot be traced at all. Eager calls pay two cheap checks, and nothing
    when ``torch.onnx`` was never imported.
    """
    if not (torch.jit.is_tracing() or torch.compiler.is_compiling()):
        return False
    if "torch.onnx" not in sys.modules:
        return False
    if torch.compiler.is_dynamo_compiling():
        # torch.onnx's fallback capture, torch.export(strict=True): dynamo folds is_in_onnx_export() to
        # False, so read the flag that torch.onnx.export sets (private; absent means "not exporting")
        flags = sys.modules.get("torch.onnx._internal.exporter._flags")
        return bool(getattr(flags, "_is_onnx_exporting", False))
    return sys.modules["torch.onnx"].is_in_onnx_export()


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Tensors created inside are real even while non-strict ``torch.export`` runs the code under its
    fake/proxy dispatch modes, and normal tensors even under ``torch.inference_mode``: for constants that
    a cache keeps (a cached fake tensor would break every later eager call, a cached inference tensor
    every later backward). Under dynamo they are graph constants, as any other."""
    if torch.compiler.is_dynamo_compiling():
        yield
        return
    with torch.inference_mode(False):
        if _get_current_dispatch_mode() is None:
            yield
            return
        with _disable_current_modes():
            yield


def check_finite_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not (t.dtype.is_floating_point):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


_SMALL_WORK = 1 << 22


@contextlib.contextmanager
def single_thread_if_small(t: torch.Tensor, work: int, small: int = _SMALL_WORK) -> Iterator[None]:
    """Run small CPU work (``work`` multiply-adds, e.g. a batch of m×m matmuls) on one intra-op thread
    when ``work <= small``.

    The Newton–Schulz loop is ~40 tiny batched matmuls; with several OpenMP threads each one pays a
    fork/join barrier that costs far more than the arithmetic, and on an oversubscribed machine a
    barrier can wait for a descheduled thread (``docs/kernel-ops.md``, "Costs behind the dispatch
    choices"). The thread count is restored afterwards (it is
    process-global, like every ``torch.set_num_threads`` call).
    """
    if torch.compiler.is_compiling() or work > small:
        # traced: no thread switching in a graph (and no guard on a symbolic work size)
        yield
        return
    with cpu_single_thread(t):
        yield


@contextlib.contextmanager
def cpu_single_thread(t: torch.Tensor) -> Iterator[None]:
    """Run CPU work on ``t`` on one intra-op thread, restoring the thread count afterwards."""
    if torch.compiler.is_compiling() or t.device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
