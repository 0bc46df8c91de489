"""Small helpers shared by the kernel-attention ops (private)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

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


def check_finite_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not (t.dtype.is_floating_point):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


_SMALL_WORK = 1 << 22


@contextlib.contextmanager
def single_thread_if_small(t: torch.Tensor, work: int) -> Iterator[None]:
    """Run small CPU work (``work`` multiply-adds, e.g. a batch of m×m matmuls) on one intra-op thread.

    The Newton–Schulz loop is ~40 tiny batched matmuls; with several OpenMP threads each one pays a
    fork/join barrier that costs far more than the arithmetic, and on an oversubscribed machine a
    barrier can wait for a descheduled thread (measured: 0.9 ms single-threaded vs 300 ms with 2
    threads under load for 20 iterations on 6×49×49). The thread count is restored afterwards (it is
    process-global, like every ``torch.set_num_threads`` call).
    """
    if work > _SMALL_WORK:
        yield
        return
    with cpu_single_thread(t):
        yield


@contextlib.contextmanager
def cpu_single_thread(t: torch.Tensor) -> Iterator[None]:
    """Run CPU work on ``t`` on one intra-op thread, restoring the thread count afterwards."""
    n = torch.get_num_threads()
    if t.device.type != "cpu" or n == 1 or torch.compiler.is_compiling():
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
