"""Peak memory of one call, on GPU or CPU.

- **CUDA**: ``reset_peak_memory_stats``, baseline ``memory_allocated``, run, synchronise, then
  ``max_memory_allocated − baseline`` (the xformers / fla convention).
- **CPU**: ``torch.distributed._tools.mem_tracker.MemTracker`` (a dispatch mode that follows every
  tensor storage): peak of all tracked storage minus what existed before the call (parameters and
  inputs). It is a private torch API, so it is imported lazily; when it is unavailable the
  measurement is reported as missing (``method="unavailable"``) rather than guessed.

Both numbers count tensor storage only (not allocator caching or the Python heap), so CPU and GPU
figures are comparable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

CUDA_METHOD = "cuda max_memory_allocated delta"
CPU_METHOD = "MemTracker (tensor storage peak minus parameters/inputs)"


@dataclass
class MemoryResult:
    """Peak extra bytes allocated during the call, and how they were measured."""

    peak_bytes: Optional[int]
    method: str


def memory_method(device: torch.device) -> str:
    """The name of the method :func:`peak_memory` uses on ``device``."""
    if torch.device(device).type == "cuda":
        return CUDA_METHOD
    return CPU_METHOD if _mem_tracker() is not None else "unavailable"


def _mem_tracker():
    """torch's ``MemTracker`` class, or ``None`` in torch builds without ``torch.distributed``."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        return None
    return MemTracker


def _total(snapshot) -> int:
    return int(sum(dev.get("Total", 0) for dev in snapshot.values()))


def peak_memory(fn: Callable[[], object], device, track: Iterable[object] = ()) -> MemoryResult:
    """Peak memory allocated by ``fn()`` beyond what was allocated before it ran.

    Args:
        fn: the call to measure (forward, or forward + backward).
        device: where ``fn`` runs.
        track: modules / tensors that exist before the call (CPU only: lets MemTracker attribute
            them to the baseline instead of missing them).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return MemoryResult(int(torch.cuda.max_memory_allocated(device) - base), CUDA_METHOD)
    tracker_cls = _mem_tracker()
    if tracker_cls is None:
        return MemoryResult(None, "unavailable")
    tracker = tracker_cls()
    tracked = [t for t in track if isinstance(t, (torch.nn.Module, torch.Tensor))]
    if tracked:
        tracker.track_external(*tracked)
    base = _total(tracker.get_tracker_snapshot("current"))
    with tracker:
        fn()
    peak = _total(tracker.get_tracker_snapshot("peak"))
    return MemoryResult(max(peak - base, 0), CPU_METHOD)


__all__ = ["MemoryResult", "peak_memory", "memory_method", "CUDA_METHOD", "CPU_METHOD"]
