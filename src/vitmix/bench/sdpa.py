"""Which kernel ``F.scaled_dot_product_attention`` ran: flash, memory-efficient, cuDNN or math.

SDPA picks its backend per call (dtype, head dim, device, mask, what the build has), so a benchmark
says which one it timed. :func:`sdpa_backends` runs the call once under a dispatch mode and names
the fused attention ops it saw; SDPA's math path is a composite of plain matmuls and softmax, so a
call that reached SDPA without any fused op is reported as ``"math"``.
"""
from __future__ import annotations

from typing import Callable, List

from torch.utils._python_dispatch import TorchDispatchMode

#: fused aten attention op → backend name (forward ops only: the backward op follows its forward)
FUSED_OPS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
#: ops of SDPA's unfused math path (a softmax between two batched products)
_MATH_OPS = ("_softmax", "_safe_softmax")


class _AttentionOps(TorchDispatchMode):
    """Records the names of the attention-related aten ops dispatched while active."""

    def __init__(self):
        super().__init__()
        self.seen: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if (name in FUSED_OPS or name in _MATH_OPS) and name not in self.seen:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def sdpa_backends(fn: Callable[[], object]) -> List[str]:
    """The SDPA backends one call of ``fn()`` used, in first-use order (``["math"]`` for the unfused
    path, ``[]`` when no attention ran). Runs ``fn`` once."""
    with _AttentionOps() as log:
        fn()
    fused = [FUSED_OPS[name] for name in log.seen if name in FUSED_OPS]
    if fused:
        return fused
    return ["math"] if any(name in _MATH_OPS for name in log.seen) else []


def sdpa_backend(fn: Callable[[], object]) -> str:
    """:func:`sdpa_backends` as one string (``"flash"``, ``"efficient+math"``, ``"none"``)."""
    return "+".join(sdpa_backends(fn)) or "none"


__all__ = ["FUSED_OPS", "sdpa_backend", "sdpa_backends"]
