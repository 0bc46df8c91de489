"""Longformer attention (Beltagy et al., "Longformer: The Long-Document Transformer", arXiv 2004.05150,
2020): a sliding window plus global attention, computed sparsely.

Every patch token attends to the patch tokens within ``radius`` positions of it in the flattened
(raster-order) sequence — the paper's 1-D window of size ``w = 2·radius + 1`` — and to the prefix
(CLS/register) tokens; the prefix tokens are the *global* tokens of the paper: they attend to every
token and every token attends to them. ``dilation`` spaces the window (the paper's dilated sliding
window: offsets ``0, δ, 2δ, …``).

Why 1-D: it is the paper's pattern, and it is exactly a set of diagonals, so it runs on
:func:`vitmix.ops.diagonal.sparse_diagonal_attention` in O(N·radius·d) time and memory with no
approximation. A 2-D (image) window is a different method (local/neighbourhood attention); as
diagonals it would wrap across row ends. In raster order a patch sees its ``radius`` horizontal
neighbours on each side, and the rows above/below only as far as the window reaches
(``radius ≥ W`` covers the vertical neighbours of a ``W``-wide grid).

Defaults and where they come from: the paper uses windows of 512 tokens on text (and grows them
with depth for character LM); images have far fewer tokens, so the default ``radius=24`` gives a
49-token window — the per-query budget of the other linear baselines in vitmix (49 Nyström
landmarks, SOFT's 49 at 224²), so comparisons spend the same number of keys per query. The paper
gives the global rows their own projections ``Q_g, K_g, V_g`` (``global_projections=True``); off by
default so that the layer keeps timm ``Attention``'s parameters (softmax checkpoints load, and a
model without prefix tokens has no unused weights).

``mode="masked"`` computes the same function densely (``-inf`` outside the pattern; O(N²), the
reference, and the mode that supports ``attn_drop``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.fibonacci import interaction_counts
from ..ops.diagonal import masked_diagonal_attention, sparse_diagonal_attention
from .base import AttentionProjections, TokenMixer
from ._sparse import (  # noqa: F401  (SPARSE_MODES, PrefixOnlyGrid, prefix_only_grid: public here too)
    SPARSE_MODES, PrefixOnlyGrid, check_sparse_options, diagonal_pattern, prefix_only_grid,
)
from .options import positive_int
from .registry import register_mixer

__all__ = ["LongformerAttention", "PrefixOnlyGrid", "window_offsets", "prefix_only_grid", "SPARSE_MODES"]

def window_offsets(radius: int, dilation: int, num_tokens: int) -> Tuple[int, ...]:
    """The window's offsets ``0, δ, …, radius·δ`` that exist among ``num_tokens`` patch tokens."""
    return tuple(d * dilation for d in range(radius + 1) if d * dilation < num_tokens)


@register_mixer("longformer")
class LongformerAttention(PrefixOnlyGrid, AttentionProjections, TokenMixer):
    """Longformer sliding-window + global attention (Beltagy et al., 2020), sparse, O(N·radius).

    Args:
        radius: window radius in tokens of the flattened sequence (default 24: a 49-token window).
        dilation: gap between window positions (default 1, no dilation).
        global_projections: separate ``Q_g, K_g, V_g`` for the global (prefix) rows, as in the
            paper (default False; see the module docstring).
        mode: ``"sparse"`` (default) or ``"masked"`` (dense reference; supports ``attn_drop``).
        backend: sparse kernel, ``"auto"`` | ``"c"`` | ``"torch"`` | ``"triton"`` (see
            :func:`~vitmix.ops.diagonal.sparse_diagonal_attention`).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments. Only the prefix count
        of the grid is used: with ``num_prefix_tokens`` given and no ``hw``, any length works.
    """

    complexity = "linear"
    spatial = True
    on_sequence = "its sliding window along the sequence (the raster order it uses on images)"
    #: the sparse diagonal kernels take no key mask: each valid length runs unpadded
    padding_mask = "by_length"

    def __init__(self, dim: int, num_heads: int = 8, *args, radius: int = 24, dilation: int = 1,
                 global_projections: bool = False, mode: str = "sparse", backend: str = "auto", **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        check_sparse_options("longformer", mode, backend, attn_drop)
        self.radius = positive_int(radius, "radius", 0)
        self.dilation = positive_int(dilation, "dilation", 1)
        self.mode, self.backend, self.global_projections = mode, backend, bool(global_projections)
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)
        self.qkv_global = nn.Linear(dim, 3 * dim, bias=qkv_bias) if self.global_projections else None
        self._cache: Dict[Tuple, object] = {}

    def head_offsets(self, num_tokens: int) -> List[Tuple[int, ...]]:
        """Offset set of each head (all heads share the window) for ``num_tokens`` patch tokens."""
        return [window_offsets(self.radius, self.dilation, num_tokens)] * self.num_heads

    def _pattern(self, kind: str, num_tokens: int, prefix: int, device: torch.device):
        """The sparse plan or the dense mask (:func:`~vitmix.mixers._sparse.diagonal_pattern`)."""
        return diagonal_pattern(self, kind, num_tokens, prefix, device)

    def mix(self, x, grid, attn_mask=None, is_causal=False):
        prefix, n, q, k, v = self._prefix_qkv(x, grid)
        if self.mode == "sparse":
            plan = self._pattern("plan", n, prefix, x.device)
            out = sparse_diagonal_attention(q, k, v, plan, prefix, scale=self.scale, backend=self.backend)
        else:
            drop = self.attn_drop.p if self.training else 0.0
            out = masked_diagonal_attention(q, k, v, None, prefix, scale=self.scale, attn_drop=drop,
                                            mask=self._pattern("mask", n, prefix, x.device))
        if self.global_projections and prefix:
            out = torch.cat([self._global_rows(x, prefix), out[:, :, prefix:]], dim=2)
        return self._project_out(out)

    def _global_qkv(self, x: torch.Tensor, prefix: int):
        """``Q_g`` of the prefix tokens and ``K_g, V_g`` of all tokens, ``(B, heads, ·, d)``."""
        b, t, c = x.shape
        w, bias = self.qkv_global.weight, self.qkv_global.bias
        qg = F.linear(x[:, :prefix], w[:c], None if bias is None else bias[:c])
        kv = F.linear(x, w[c:], None if bias is None else bias[c:]).view(b, t, 2, self.num_heads, self.head_dim)
        kg, vg = kv.permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_norm(qg.view(b, prefix, self.num_heads, self.head_dim).transpose(1, 2)), self.k_norm(kg), vg

    def _global_rows(self, x: torch.Tensor, prefix: int) -> torch.Tensor:
        """The prefix rows through the global projections: ``softmax(Q_g K_gᵀ) V_g`` over all tokens."""
        qg, kg, vg = self._global_qkv(x, prefix)
        drop = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(qg, kg, vg, dropout_p=drop, scale=self.scale)

    def _prefix(self, n: int) -> int:
        return self.token_grid(n, *prefix_only_grid(self, n, None, None))[0]

    def analytic_flops(self, batch: int, n: int) -> int:
        """qkv and proj, plus ``4·d`` per computed (query, key) pair: the window and prefix pairs
        (``sparse``) or all ``N²`` (``masked``); the global projections add their linears and rows."""
        c, d, h = self.dim, self.head_dim, self.num_heads
        prefix = self._prefix(n)
        total = 2 * batch * n * c * 4 * c
        if self.mode == "sparse":
            total += 4 * batch * d * sum(interaction_counts(self.head_offsets(n - prefix), n - prefix, prefix))
        else:
            total += 4 * batch * h * n * n * d
        if self.global_projections and prefix:
            total += 2 * batch * (prefix * c * c + n * c * 2 * c) + 4 * batch * h * prefix * n * d
        return total

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: Optional[int] = None, **_) -> torch.Tensor:
        """Effective ``(B, heads, N, N)`` weights (dense, O(N²); zero outside the window and prefix)."""
        prefix, n, q, k, _ = self._prefix_qkv(x, self._map_grid(x, hw, num_prefix_tokens))
        mask = self._pattern("mask", n, prefix, x.device)
        w = torch.softmax(((q @ k.transpose(-1, -2)) * self.scale).masked_fill(~mask, float("-inf")), dim=-1)
        if self.global_projections and prefix:
            qg, kg, _ = self._global_qkv(x, prefix)
            w[:, :, :prefix] = torch.softmax((qg @ kg.transpose(-1, -2)) * self.scale, dim=-1)
        return w

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, radius={self.radius}, dilation={self.dilation}, "
                f"global_projections={self.global_projections}, mode={self.mode!r}")
