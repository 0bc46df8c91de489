"""Peak-memory probe shared by the test suite (import it as ``from _memory import peak_memory_mib``).

Memory goals in vitmix are stated as *ratios* ("peak memory at N=16384 is at most 5x that at
N=4096"), which a test can assert without depending on the machine. This helper measures the peak
bytes held by tensors while ``fn`` runs, using ``torch.distributed._tools.mem_tracker.MemTracker``:
it tracks every tensor storage created through the dispatcher (forward activations, autograd
saved tensors, gradients, temporaries of custom ``autograd.Function`` code run under ``no_grad``)
on CPU and CUDA alike, so the measurement is exact and independent of the allocator and of other
processes — unlike an RSS probe, it is not disturbed by other jobs on a shared machine.

Tensors that already exist when ``fn`` starts (e.g. inputs created outside) are counted only if
they are touched; create the inputs *inside* ``fn`` to include them, or outside to exclude them.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

__all__ = ["peak_memory_mib", "peak_memory_bytes"]


def peak_memory_bytes(fn: Callable[[], object]) -> Dict[str, int]:
    """Run ``fn()`` once under ``MemTracker`` and return ``{device: peak bytes}`` (e.g. ``{"cpu": 123}``).

    The peak is the tracker's ``Total`` for each device: the largest sum of live tensor storages
    seen at any point while ``fn`` ran (parameters, buffers, gradients, activations, temporaries).
    Anything ``fn`` returns is dropped before returning.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        out = fn()
        del out
    snapshot = tracker.get_tracker_snapshot("peak")
    return {str(dev): int(stats["Total"]) for dev, stats in snapshot.items()}


def peak_memory_mib(fn: Callable[[], object], device: str | torch.device | None = None) -> float:
    """Peak tensor memory, in MiB, held while ``fn()`` runs (see :func:`peak_memory_bytes`).

    ``device`` selects one device (``"cpu"``, ``"cuda:0"``); by default the peaks of all devices
    that were used are summed. A typical use, forward + backward of an op::

        def step():
            q = torch.randn(1, 6, n, 64, requires_grad=True)
            op(q, q, q).sum().backward()

        assert peak_memory_mib(step_16k) <= 5 * peak_memory_mib(step_4k)
    """
    peaks = peak_memory_bytes(fn)
    if device is not None:
        dev = torch.device(device)
        key = str(dev)
        if key not in peaks and dev.type == "cuda" and dev.index is None:
            key = f"cuda:{torch.cuda.current_device()}"
        return peaks.get(key, 0) / 2**20
    return sum(peaks.values()) / 2**20
