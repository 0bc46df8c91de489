"""Dense O(N²) references of multi-diagonal attention: the ``-inf``-masked softmax (the semantics the
sparse op must match) and the official Fibottention code's multiplicative mask."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ..fibonacci import offsets_mask
from .plan import DiagonalPlan, _check_qkv, _compute_dtype, _plan_for, _resolve_scale


def _dense_mask(offsets, q, num_prefix_tokens):
    plan = _plan_for(offsets, q, num_prefix_tokens)
    return offsets_mask(plan.offsets, plan.num_tokens, num_prefix_tokens, device=q.device)


def masked_diagonal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_prefix_tokens: int = 0,
                              scale: Optional[float] = None, attn_drop: float = 0.0,
                              mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference: dense ``softmax(q kᵀ · scale + M) v`` with ``M = -inf`` outside the pattern.

    Same arguments as :func:`sparse_diagonal_attention` (plus training-time ``attn_drop`` on the
    weights; ``mask``: a precomputed ``(H, T, T)`` boolean mask, e.g. cached by a module). O(N²)
    time and memory. Queries without any key output zeros (not NaN).
    """
    _check_qkv(q, k, v, q.shape[1] if q.dim() == 4 else -1, num_prefix_tokens)
    if mask is None:
        mask = _dense_mask(offsets, q, num_prefix_tokens)
    dtype = _compute_dtype(q)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    scores = (qc @ kc.transpose(-1, -2)) * _resolve_scale(scale, q.shape[-1])
    row_ok = mask.any(dim=-1, keepdim=True)
    w = scores.masked_fill(~mask & row_ok, float("-inf")).softmax(dim=-1) * row_ok
    if attn_drop:
        w = F.dropout(w, attn_drop)
    return (w @ vc).to(q.dtype)


def official_diagonal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_prefix_tokens: int = 0,
                                scale: Optional[float] = None, attn_drop: float = 0.0,
                                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The official code's semantics: ``softmax((q · scale) kᵀ ⊙ Ω) v`` with a 0/1 mask ``Ω``.

    Masked logits become 0 rather than ``-inf``, so every masked key still receives weight
    ``1 / Z`` — dense O(N²) work and a uniform-average leak that grows with ``N``. Provided only to
    reproduce results of the official implementation. ``attn_drop`` and ``mask`` as in
    :func:`masked_diagonal_attention`.
    """
    _check_qkv(q, k, v, q.shape[1] if q.dim() == 4 else -1, num_prefix_tokens)
    if mask is None:
        mask = _dense_mask(offsets, q, num_prefix_tokens)
    dtype = _compute_dtype(q)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    scores = ((qc * _resolve_scale(scale, q.shape[-1])) @ kc.transpose(-1, -2)) * mask.to(dtype)
    w = scores.softmax(dim=-1)
    if attn_drop:
        w = F.dropout(w, attn_drop)
    return (w @ vc).to(q.dtype)
