"""Median latency of a call.

CPU: ``torch.utils.benchmark.Timer`` with ``num_threads=torch.get_num_threads()`` (its default is
one thread, which would under-report CPU throughput), ``blocked_autorange`` for fast calls and
single-call repeats for slow ones. GPU: CUDA events around each call, read after a synchronisation,
after at least two synchronised warm-up calls (the first one compiles Triton kernels and picks cuDNN
algorithms).
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch


class _DropNoCudaNotice(logging.Filter):
    """torch.utils.benchmark imports torch.utils.cpp_extension, which logs "No CUDA runtime is
    found, using CUDA_HOME=..." on every CPU-only machine: noise, not a problem. Drop that record
    only; every other message of that logger still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_DropNoCudaNotice())
import torch.utils.benchmark as tbench  # noqa: E402  (after the filter)


@dataclass
class TimeResult:
    """Median seconds per call, the individual samples, the method used and the warm-up call's seconds."""

    median_s: float
    samples: List[float]
    method: str
    warmup_s: float = 0.0

    @property
    def iqr_s(self) -> float:
        """Inter-quartile range of the per-call samples (0 with fewer than 4 samples)."""
        if len(self.samples) < 4:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device="cpu", min_run_time: float = 0.2, min_samples: int = 3,
              warmup: int = 1, max_seconds: Optional[float] = None,
              long_call_s: Optional[float] = None) -> TimeResult:
    """Median latency of ``fn()`` after ``warmup`` calls (at least one: it picks the method).

    Calls slower than ``min_run_time / min_samples`` are timed one at a time ``min_samples``
    times (``min_run_time=0``: always); faster ones with ``blocked_autorange(min_run_time)`` (CPU)
    or an event loop (CUDA). For calls of many seconds: ``max_seconds`` stops the one-at-a-time
    samples once they took that long (at least one is taken), and a warm-up call of at least
    ``long_call_s`` seconds is itself the only sample.

    CUDA: at least two warm-up calls (the first one also compiles Triton kernels, picks cuDNN
    algorithms and grows the caching allocator), each followed by ``torch.cuda.synchronize``; the
    last one picks the method. Every sample is the time between two CUDA events recorded on the
    current stream around one call, read after a synchronisation.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return _time_cuda(fn, device, min_run_time, min_samples, max(warmup, 2), max_seconds, long_call_s)
    first = _warm_up(fn, device, warmup)
    if long_call_s is not None and first >= long_call_s:
        return TimeResult(first, [first], "the warm-up call alone (too slow to repeat)", first)
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    method = f"torch.utils.benchmark ({torch.get_num_threads()} threads)"
    if first * min_samples >= min_run_time:
        samples = _single_calls(timer, min_samples, max_seconds)
    else:
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
        samples = list(measurement.times)
        if len(samples) < min_samples:
            samples += [timer.timeit(1).median for _ in range(min_samples - len(samples))]
    return TimeResult(statistics.median(samples), samples, method, first)


def _time_cuda(fn: Callable[[], object], device: torch.device, min_run_time: float, min_samples: int,
               warmup: int, max_seconds: Optional[float], long_call_s: Optional[float]) -> TimeResult:
    """:func:`time_call` on a CUDA device: synchronised warm-up, then one CUDA-event pair per call."""
    last = 0.0
    for _ in range(warmup):  # the last warm-up call, not the compiling first one, predicts the rest
        last = _warm_up(fn, device, 1)
    if long_call_s is not None and last >= long_call_s:
        return TimeResult(last, [last], "the last warm-up call alone (too slow to repeat)", last)
    wanted = max(min_samples, min(200, int(min_run_time / max(last, 1e-6))))
    samples = _cuda_samples(fn, device, wanted, max_seconds)
    return TimeResult(statistics.median(samples), samples, "CUDA events", last)


def _warm_up(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Run ``fn`` ``calls`` times (at least once); the mean seconds per call."""
    calls = max(calls, 1)
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        _sync(device)
    return (time.perf_counter() - start) / calls


def _cuda_samples(fn: Callable[[], object], device: torch.device, n: int,
                  max_seconds: Optional[float] = None) -> List[float]:
    """Seconds of ``n`` calls, each between two CUDA events; fewer (at least one) once the samples
    add up to ``max_seconds``."""
    samples: List[float] = []
    while len(samples) < n and (not samples or max_seconds is None or sum(samples) < max_seconds):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        samples.append(begin.elapsed_time(end) / 1e3)  # elapsed_time is in milliseconds
    return samples


def _single_calls(timer, n: int, max_seconds: Optional[float]) -> List[float]:
    """``n`` one-call timings, fewer (at least one) once ``max_seconds`` went into them."""
    samples: List[float] = []
    start = time.perf_counter()
    while len(samples) < n and (not samples or max_seconds is None or time.perf_counter() - start < max_seconds):
        samples.append(timer.timeit(1).median)
    return samples


__all__ = ["TimeResult", "time_call"]
