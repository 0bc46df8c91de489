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
non-aten op it saw without a formula in :attr:`FlopCount.uncounted_ops`, and a mixer can state
its own analytic count (:func:`analytic_flops`) — either as a method ``analytic_flops(batch,
n_tokens)`` on the mixer class or through :func:`register_analytic_flops` — which the bench uses
when the counter sees less than the formula says (a kernel it cannot see ran).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

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
    return nb * n ** 3 // 3


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


# --------------------------------------------------------------------------------------------
# Analytic formulas (forward pass of one mixer layer, same unit and same op classes as above)
# --------------------------------------------------------------------------------------------
_ANALYTIC: Dict[str, Callable[[torch.nn.Module, int, int], int]] = {}


def register_analytic_flops(mixer_name: str):
    """Decorator: register ``fn(mixer, batch, n_tokens) -> FLOPs`` for the mixer named ``mixer_name``.

    A mixer class may instead define ``analytic_flops(self, batch, n_tokens)``, which wins.
    """

    def decorate(fn):
        _ANALYTIC[mixer_name] = fn
        return fn

    return decorate


def analytic_flops(mixer: torch.nn.Module, batch: int, n_tokens: int) -> Optional[int]:
    """The analytic forward FLOPs of ``mixer`` on ``(batch, n_tokens, dim)``, or ``None`` if unknown."""
    method = getattr(type(mixer), "analytic_flops", None)
    if callable(method):
        return int(method(mixer, batch, n_tokens))
    name = getattr(type(mixer), "mixer_name", None)
    if name in _ANALYTIC:
        value = _ANALYTIC[name](mixer, batch, n_tokens)
        return None if value is None else int(value)
    return None


def linear_flops(tokens: int, fan_in: int, fan_out: int) -> int:
    """FLOPs of a dense layer applied to ``tokens`` rows."""
    return 2 * tokens * fan_in * fan_out


def _attr(mixer, names, default=None):
    for name in names:
        value = getattr(mixer, name, None)
        if value is not None:
            return value
    return default


@register_analytic_flops("softmax")
def _softmax_flops(mixer, batch: int, n: int) -> int:
    c = mixer.dim
    qkv = linear_flops(batch * n, c, 3 * c)
    attn = 2 * (2 * batch * mixer.num_heads * n * n * mixer.head_dim)  # q·kᵀ and weights·v
    proj = linear_flops(batch * n, c, c)
    return qkv + attn + proj


def _linears(mixer, tokens: int) -> int:
    """FLOPs of every ``nn.Linear`` directly owned by ``mixer`` applied to ``tokens`` rows."""
    total = 0
    for module in mixer.modules():
        if isinstance(module, torch.nn.Linear):
            total += linear_flops(tokens, module.in_features, module.out_features)
    return total


def nystrom_flops(n: int, m: int, d: int, iters: int, tied: bool = False, normalization=None,
                  inverse: str = "newton", n_keys: int = None, d_v: int = None, start: str = "safe") -> int:
    """FLOPs of :func:`vitmix.ops.nystrom_attention` for one (batch, head) slice.

    Kernel blocks cost one distance product each (``2·rows·cols·d``; the Gaussian via a GEMM, the
    Laplacian via ``cdist``), Newton–Schulz ``4·m³`` per iteration (two ``m×m`` products), the exact
    inverse ``2m³/3 + 2m³`` (LU, then solves against the identity), and the right-to-left products
    ``2·N·m·d_v`` / ``2·m²·d_v`` each. Untied landmarks with the ``"safe"`` start (``start``, the
    ``newton_alpha`` option) add the start choice (a Cholesky, ``m³/3``) and the ``2·m³`` residual check
    of the identity start (a rare rerun is not counted).
    """
    nk = n if n_keys is None else n_keys
    dv = d if d_v is None else d_v
    total = 2 * n * m * d                         # C_q = k(Q, L_k)
    total += 0 if tied else 2 * nk * m * d        # C_k = k(K, L_q)
    total += 2 * m * m * d                        # W = k(L_q, L_k)
    total += (2 * m ** 3 // 3 + 2 * m ** 3) if inverse == "exact" else 4 * m ** 3 * iters
    if inverse != "exact" and not tied and start == "safe":
        total += m ** 3 // 3 + 2 * m ** 3         # start choice (Cholesky) and the ||I - P V|| check
    if normalization == "injective":
        total += 2 * n * m * m                    # covariance of C_q over queries
        total += 4 * m ** 3                       # T = Mᵀ cov M
        total += 2 * nk * m * m                   # D T (column variances)
        total += 2 * m * nk * dv                  # E = Dᵀ (s ⊙ V)
        total += 2 * m * m * dv + 2 * n * m * dv  # M E, C_q · core
    else:
        total += 2 * m * nk * dv + 2 * m * m * dv + 2 * n * m * dv
    return total


def _grid(mixer, n: int):
    return mixer.token_grid(n)


def _landmarks(mixer, n: int) -> int:
    _, h, w = _grid(mixer, n)
    mh, mw = mixer.landmark_count(h, w)
    return mh * mw


def _local_conv(mixer, batch: int, n: int) -> int:
    k = getattr(mixer, "conv_kernel", 0) or 0
    _, h, w = _grid(mixer, n)
    return 2 * batch * mixer.dim * h * w * k * k  # depthwise: one k×k filter per channel (or per head)


@register_analytic_flops("soft")
@register_analytic_flops("soft_norm")
def _soft_flops(mixer, batch: int, n: int) -> int:
    d, h = mixer.head_dim, mixer.num_heads
    s = mixer.landmark_stride
    m = _landmarks(mixer, n)
    total = _linears(mixer, batch * n)  # W_q, W_v, ff
    if mixer.landmarks == "conv":
        total += 2 * batch * h * m * d * d * s * s
    total += batch * h * nystrom_flops(n, m, d, mixer.newton_iters, tied=True,
                                       normalization=mixer.normalization, inverse=mixer.inverse)
    return total + _local_conv(mixer, batch, n)


@register_analytic_flops("laplacian")
def _laplacian_flops(mixer, batch: int, n: int) -> int:
    d, h = mixer.head_dim, mixer.num_heads
    m = _landmarks(mixer, n)
    total = _linears(mixer, batch * n)  # qkv, proj
    if not (getattr(mixer, "rope", False) or getattr(mixer, "qk_normed", False)) and n >= 8 * m:
        # landmarks: the pooled input projected by the q/k rows of qkv (pooling commutes with it);
        # the mixer does this only when N >= 8m, otherwise it pools q and k (no FLOPs)
        total += linear_flops(batch * m, mixer.dim, 2 * mixer.dim)
    total += batch * h * nystrom_flops(n, m, d, mixer.newton_iters, tied=False,
                                       normalization="injective" if mixer.normalize else None,
                                       inverse=mixer.inverse, start=mixer.newton_alpha)
    return total + _local_conv(mixer, batch, n)


@register_analytic_flops("fibottention")
def _fibottention_flops(mixer, batch: int, n: int) -> int:
    """Dense modes: the full ``q·kᵀ`` and ``weights·v`` products; ``sparse``: only the pairs of
    each head's pattern (prefix rows/columns included), ``2·d`` FLOPs per pair for the score and
    ``2·d`` for the weighted value."""
    from ..ops.fibonacci import interaction_counts

    prefix, h, w = _grid(mixer, n)
    total = _linears(mixer, batch * n)  # qkv, proj
    d = mixer.head_dim
    if mixer.mode == "sparse":
        counts = interaction_counts(mixer.head_offsets(n - prefix), n - prefix, prefix)
        return total + 4 * batch * d * sum(counts)
    return total + 4 * batch * mixer.num_heads * n * n * d


__all__ = [
    "nystrom_flops",
    "UNIT", "EXTRA_FORMULAS", "FlopCount", "count_flops", "register_analytic_flops", "analytic_flops",
    "linear_flops",
]
