"""What every sparse-diagonal path shares (private): the :class:`DiagonalPlan` (per-head signed shifts as a
slot table, cached), the argument checks, the output layout helpers and the dense rows of the prefix
queries. The back ends (``pytorch.py``, ``c.py``, ``triton.py``) and the references import
it; it imports none of them."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

import torch

from .._common import real_tensors
from ..fibonacci import check_offsets

#: values accepted by ``sparse_diagonal_attention(backend=...)``
BACKENDS = ("auto", "c", "torch", "triton")


# --------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True, eq=False)
class DiagonalPlan:
    """Per-head signed key shifts for ``num_tokens`` patch tokens, padded to a common slot count.

    Attributes:
        offsets: the validated per-head offset sets (non-negative).
        num_tokens: patch tokens ``N``.
        shifts: ``(H, M)`` int64, slot ``m`` of head ``h`` scores key ``j + shifts[h, m]``
            (``-d`` and ``+d`` for each offset ``d > 0``, ``0`` once for ``d = 0``); padded slots
            hold 0 and lie beyond ``counts[h]``.
        counts: ``(H,)`` int64, the number of real slots of each head.
        has_empty_rows: some patch query has no patch key (matters only without prefix tokens).
    """

    offsets: Tuple[Tuple[int, ...], ...]
    num_tokens: int
    shifts: torch.Tensor
    counts: torch.Tensor
    has_empty_rows: bool

    @property
    def num_heads(self) -> int:
        return len(self.offsets)

    @property
    def max_slots(self) -> int:
        return int(self.shifts.shape[1])

    def to(self, device) -> "DiagonalPlan":
        """This plan with its index tensors on ``device``."""
        return DiagonalPlan(self.offsets, self.num_tokens, self.shifts.to(device), self.counts.to(device),
                            self.has_empty_rows)


def _signed_shifts(offsets: Sequence[Sequence[int]]) -> List[List[int]]:
    """Per head, the sorted signed key shifts of sorted unique offsets: ``-d`` and ``+d`` for ``d > 0``,
    ``0`` once for ``d = 0`` (plain Python, so tracing code can compute it too)."""
    return [[-d for d in reversed(offs) if d > 0] + [0] * (0 in offs) + [d for d in offs if d > 0]
            for offs in offsets]


def _build_plan(offsets: Tuple[Tuple[int, ...], ...], num_tokens: int, device) -> DiagonalPlan:
    signed = _signed_shifts(offsets)
    m = max(len(s) for s in signed)
    with real_tensors():        # cached by _plan_cached: never fake, not even while exporting
        shifts = torch.tensor([s + [0] * (m - len(s)) for s in signed], dtype=torch.int64, device=device)
        counts = torch.tensor([len(s) for s in signed], dtype=torch.int64, device=device)
    # query j has no key iff every offset d has j - d < 0 and j + d >= N (and d != 0): the smallest
    # offset decides, rows j in [N - d_min, d_min) are empty when 2 * d_min > N.
    empty = any(min(offs) > 0 and 2 * min(offs) > num_tokens for offs in offsets)
    return DiagonalPlan(offsets, num_tokens, shifts, counts, empty)


@functools.lru_cache(maxsize=256)
def _plan_cached(offsets: Tuple[Tuple[int, ...], ...], num_tokens: int, device: str) -> DiagonalPlan:
    return _build_plan(offsets, num_tokens, device)


def diagonal_plan(offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_tokens: int,
                  device: Union[str, torch.device, None] = None) -> DiagonalPlan:
    """Validated, cached :class:`DiagonalPlan` of ``offsets`` for ``num_tokens`` patch tokens."""
    if isinstance(offsets, DiagonalPlan):
        if offsets.num_tokens != num_tokens:
            raise ValueError(f"the plan was built for N={offsets.num_tokens} patch tokens, "
                             f"the input has N={num_tokens}")
        return offsets.to(device) if device is not None and offsets.shifts.device != torch.device(device) else offsets
    checked = tuple(check_offsets(offsets, num_tokens))
    return _plan_cached(checked, int(num_tokens), str(torch.device(device or "cpu")))


def _check_qkv(q, k, v, num_heads: int, num_prefix_tokens: int) -> Tuple[int, int]:
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise ValueError(f"q, k, v must be (B, H, T, d); got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] != num_heads:
        raise ValueError(f"q has {q.shape[1]} heads but {num_heads} offset sets were given (one per head)")
    if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    t = q.shape[2]
    if num_prefix_tokens >= t:
        raise ValueError(
            f"num_prefix_tokens={num_prefix_tokens} leaves no patch tokens in a sequence of T={t} tokens; "
            f"the prefix (CLS/register) count must be smaller than the sequence length"
        )
    return t, t - num_prefix_tokens


def _plan_for(offsets, q, num_prefix_tokens) -> DiagonalPlan:
    heads = offsets.num_heads if isinstance(offsets, DiagonalPlan) else len(offsets)
    _, n = _check_qkv_shape_only(q, num_prefix_tokens)
    if heads != q.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads but {heads} offset sets were given (one per head)")
    return diagonal_plan(offsets, n, q.device)


def _check_qkv_shape_only(q, num_prefix_tokens):
    if q.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, T, d); got q of shape {tuple(q.shape)}")
    if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    t = q.shape[2]
    if num_prefix_tokens >= t:
        raise ValueError(
            f"num_prefix_tokens={num_prefix_tokens} leaves no patch tokens in a sequence of T={t} tokens; "
            f"the prefix (CLS/register) count must be smaller than the sequence length"
        )
    return t, t - num_prefix_tokens


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension is contiguous (any other strides are fine), else a copy."""
    return t if t.stride(-1) == 1 and t.shape[-1] > 0 else t.contiguous()


def _token_major(b, h, t, d, like):
    """An uninitialised ``(B, H, T, D)`` view of a token-major ``(B, T, H, D)`` buffer."""
    return like.new_empty(b, t, h, d).permute(0, 2, 1, 3)


def _prefix_forward(q, k, v, p, scale):
    """Dense rows of the ``p`` prefix queries: output ``(B, H, P, D)`` and log-sum-exp ``(B, H, P)``."""
    s = (q[:, :, :p] @ k.transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _prefix_backward(q, k, v, out, dout, lse_pre, p, scale):
    """Softmax weights and score gradients ``(B, H, P, T)`` of the prefix queries."""
    s = (q[:, :, :p] @ k.transpose(-1, -2)) * scale
    w = torch.exp(s - lse_pre[..., None])
    delta = torch.linalg.vecdot(dout[:, :, :p], out[:, :, :p])[..., None]
    return w.contiguous(), (w * (dout[:, :, :p] @ v.transpose(-1, -2) - delta)).contiguous()


# ------------------------------------------------------------------------------------ custom op
# Under torch.compile / torch.export the same forward and backward run as custom ops. The per-head
# offsets travel as Python ints (``offsets`` flattened, ``offset_counts`` per head), so the graph
# holds no index tensors and export decompositions can rebuild the pattern; the backend is chosen
# when the op runs. Outputs have one layout whatever the backend: token-major ``out``/``dq``/``dk``/
# ``dv`` (a free head merge, and the layout of a qkv projection's gradient), contiguous log-sum-exps.
def _flatten_offsets(offsets: Sequence[Sequence[int]]) -> Tuple[List[int], List[int]]:
    return [d for offs in offsets for d in offs], [len(offs) for offs in offsets]


def _unflatten_offsets(flat: Sequence[int], counts: Sequence[int]) -> Tuple[Tuple[int, ...], ...]:
    starts = [sum(counts[:h]) for h in range(len(counts))]
    return tuple(tuple(int(d) for d in flat[s:s + c]) for s, c in zip(starts, counts))


@functools.lru_cache(maxsize=256)
def _flat_plan(offsets: Tuple[int, ...], offset_counts: Tuple[int, ...], num_tokens: int, device: str) -> DiagonalPlan:
    """:func:`_plan_cached` keyed by the op's flat arguments, so that a compiled call does not regroup
    them per head every time (a visible share of a small layer's sparse product)."""
    return _plan_cached(_unflatten_offsets(offsets, offset_counts), num_tokens, device)


def _resolve_scale(scale, d):
    return d ** -0.5 if scale is None else float(scale)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


def _traced_offsets(offsets, q, p) -> Tuple[Tuple[int, ...], ...]:
    """The validated per-head offsets, from Python values only (no plan tensors while tracing)."""
    _, n = _check_qkv_shape_only(q, p)
    heads = offsets.num_heads if isinstance(offsets, DiagonalPlan) else len(offsets)
    if heads != q.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads but {heads} offset sets were given (one per head)")
    if isinstance(offsets, DiagonalPlan):
        if offsets.num_tokens != n:
            raise ValueError(f"the plan was built for N={offsets.num_tokens} patch tokens, the input has N={n}")
        return offsets.offsets
    return tuple(check_offsets(offsets, n))
