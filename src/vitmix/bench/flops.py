"""FLOP counting: one counter, one unit.

**Unit.** Everything here is in FLOPs, where one multiply–accumulate (MAC) counts as 2 FLOPs — the
convention of ``torch.utils.flop_counter.FlopCounterMode``. Papers in this field often print MACs
as "FLOPs"; divide our numbers by 2 to compare with them.

**What is counted.** Matrix products (mm, bmm, addmm, baddbmm), convolutions, attention kernels
and pairwise-distance kernels (``cdist``), forward and — when a backward runs inside the counter —
backward. Elementwise work (exp, softmax, norms, activations) is *not* counted, for every mixer
alike; it is O(N·m) or O(N²) scalar work next to the O(N·m·d) / O(N²·d) products.

**What FlopCounterMode misses and we add** (:data:`EXTRA_FORMULAS`): the CPU fused SDPA kernel
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward count 0 in torch),
``_cdist_forward`` / ``_cdist_backward`` (2 FLOPs per coordinate per pair, like a dot product),
dense inverses / solves (``linalg_inv_ex``, ``_linalg_solve_ex``: the textbook LU counts) and
oneDNN's fused ``mkldnn._linear_pointwise`` (linear + activation on CPU).

**What no dispatch-level counter can see**: Triton/CUDA kernels launched directly and
``torch.library`` custom ops without a registered formula. :func:`count_flops` lists every
non-aten op it saw without a formula in :attr:`FlopCount.uncounted_ops`, and a mixer states its
own analytic count as a method ``analytic_flops(batch, n_tokens)`` on its class (formulas in
:mod:`vitmix.mixers.flops`), which the bench uses (:func:`analytic_flops`) when the counter sees
less than the formula says (a kernel it cannot see ran).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..mixers.flops import linear_flops, nystrom_flops  # noqa: F401  (public here too)

aten = torch.ops.aten

UNIT = "FLOPs (1 multiply-accumulate = 2 FLOPs; matmul/conv/attention/cdist only)"


def _sdpa_cpu(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _pairs(x1, x2):
    *batch, p, m = x1
    r = x2[-2]
    nb = 1
    for b in batch:
        nb *= b
    return nb, p, r, m


def _cdist_forward(x1, x2, *args, out_shape=None, **kwargs) -> int:
    nb, p, r, m = _pairs(x1, x2)
    return 2 * nb * p * r * m


def _cdist_backward(grad, x1, x2, *args, out_shape=None, **kwargs) -> int:
    # recompute the coordinate differences, then a weighted reduction over the pairs
    nb, p, r, m = _pairs(x1, x2)
    return 4 * nb * p * r * m


def _batch_and_n(shape):
    n = shape[-1]
    nb = 1
    for b in shape[:-2]:
        nb *= b
    return nb, n


def _inv(a, *args, out_shape=None, **kwargs) -> int:
    nb, n = _batch_and_n(a)
    return 2 * nb * n ** 3


def _solve(a, b, *args, out_shape=None, **kwargs) -> int:
    nb, n = _batch_and_n(a)
    k = 1 if len(b) == len(a) - 1 else b[-1]
    return nb * (2 * n ** 3 // 3 + 2 * n * n * k)


def _lu_factor(a, *args, out_shape=None, **kwargs) -> int:
    nb, n = _batch_and_n(a)
    return nb * 2 * n ** 3 // 3


def _lu_solve(lu, pivots, b, *args, out_shape=None, **kwargs) -> int:
    nb, n = _batch_and_n(lu)
    return nb * 2 * n * n * b[-1]          # two triangular solves with b[-1] right-hand sides


def _cholesky(a, *args, out_shape=None, **kwargs) -> int:
    nb, n = _batch_and_n(a)
    return nb * (n ** 3 // 3)              # per matrix, as the analytic formulas count it


def _linear_pointwise(x, w, *args, out_shape=None, **kwargs) -> int:
    # oneDNN's fused linear (+ activation): W is (out, in)
    rows = 1
    for dim in x[:-1]:
        rows *= dim
    return 2 * rows * w[0] * w[1]


#: formulas handed to ``FlopCounterMode(custom_mapping=...)`` (no global torch state is changed)
EXTRA_FORMULAS: Dict[object, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
    aten._cdist_forward: _cdist_forward,
    aten._cdist_backward: _cdist_backward,
    aten.linalg_inv_ex: _inv,
    aten._linalg_solve_ex: _solve,
    aten.linalg_cholesky_ex: _cholesky,
    aten.linalg_lu_factor_ex: _lu_factor,
    aten.linalg_lu_solve: _lu_solve,
}
if hasattr(torch.ops, "mkldnn") and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
    EXTRA_FORMULAS[torch.ops.mkldnn._linear_pointwise] = _linear_pointwise

# aten ops that do O(n^3) or O(N·M·d) work but that neither torch nor we have a formula for
_HEAVY_ATEN = ("linalg_", "cholesky", "triangular_solve", "lu_", "svd", "eig", "pinv", "qr", "geqrf",
               "lstsq", "inverse", "solve")


def _is_heavy(op: str) -> bool:
    base = op.lstrip("_")
    return base.startswith(_HEAVY_ATEN) and "norm" not in base and "check_errors" not in base


class _OpLog(TorchDispatchMode):
    """Records the op packets dispatched while active."""

    def __init__(self):
        super().__init__()
        self.packets = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.packets.add(func._overloadpacket)
        return func(*args, **(kwargs or {}))


@dataclass
class FlopCount:
    """Result of :func:`count_flops`: total FLOPs, per-op totals and ops that counted nothing."""

    total: int
    by_op: Dict[str, int] = field(default_factory=dict)
    uncounted_ops: List[str] = field(default_factory=list)


def count_flops(fn: Callable[[], object]) -> FlopCount:
    """Run ``fn()`` once under ``FlopCounterMode`` (plus :data:`EXTRA_FORMULAS`) and count FLOPs.

    Backward passes executed inside ``fn`` are counted too. ``uncounted_ops`` names custom
    (non-aten) ops and heavy linear-algebra ops that ran without any formula, i.e. work the total
    may be missing.
    """
    counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
    log = _OpLog()
    with counter, log:
        fn()
    by_op = {str(k): int(v) for k, v in counter.get_flop_counts().get("Global", {}).items()}
    known = set(counter.flop_registry)
    uncounted = []
    for packet in log.packets:
        if packet in known:
            continue
        name = str(packet)
        namespace = name.split(".")[0]
        op = name.split(".", 1)[-1]
        if namespace not in ("aten", "prim", "prims", "profiler") or _is_heavy(op):
            uncounted.append(name)
    return FlopCount(int(counter.get_total_flops()), by_op, sorted(uncounted))


def analytic_flops(mixer: torch.nn.Module, batch: int, n_tokens: int) -> Optional[int]:
    """The forward FLOPs of ``mixer`` on ``(batch, n_tokens, dim)`` by its ``analytic_flops`` formula, or
    ``None`` for a module without one (``TokenMixer``'s default)."""
    method = getattr(mixer, "analytic_flops", None)
    value = method(batch, n_tokens) if callable(method) else None
    return None if value is None else int(value)


__all__ = [
    "nystrom_flops",
    "UNIT", "EXTRA_FORMULAS", "FlopCount", "count_flops", "analytic_flops",
    "linear_flops",
]
