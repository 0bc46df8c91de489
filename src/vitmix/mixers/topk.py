"""Top-k attention (Wang et al., "KVT: k-NN Attention for Boosting Vision Transformers", ECCV 2022;
Gupta et al., "Memory-efficient Transformers via Top-k Attention", 2021).

Each query keeps its ``topk`` largest scores ``q·kᵀ/√d`` and takes the softmax over those only; the
other keys get weight 0. Gradients flow through the kept scores (the selection itself is piecewise
constant). All queries are treated alike, prefix (CLS) tokens included, as in KVT.

Cost — stated plainly: this is computed **densely**, as KVT does: the full ``N × N`` score matrix is
formed, the top-k positions are scattered into a mask, and ``softmax(masked scores)·V`` is a dense
product. Time and memory are O(N²) (``complexity = "quadratic"``); top-k attention sparsifies the
*weights*, not the cost. (Gupta et al.'s memory savings come from processing queries in chunks, which
does not change the O(N²) FLOPs.) :func:`topk_attention_reference` is the gather-based
formulation — softmax over the selected scores, weighted sum of the gathered values — the tests
compare against.

Defaults and where they come from: ``topk=100``, the value of KVT's reference code for DeiT at 224²
(197 tokens). With N ≤ topk every key is kept and the layer is exactly softmax attention.
"""
from __future__ import annotations

from typing import Optional

import torch

from .base import AttentionProjections, TokenMixer
from .registry import register_mixer
from .sequence import key_mask

__all__ = ["TopkAttention", "topk_attention_reference"]


def topk_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, topk: int,
                             scale: Optional[float] = None) -> torch.Tensor:
    """Gather-based reference: softmax over each query's ``topk`` largest scores, then the weighted
    sum of the corresponding values (``(B, H, N, d)`` in, same out; O(N·topk·d) memory for the gather)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    kept, index = scores.topk(min(topk, k.shape[-2]), dim=-1)                    # (B, H, N, k)
    weights = kept.softmax(dim=-1)
    b, h, n, d = v.shape
    gathered = v[:, :, None].expand(b, h, index.shape[2], n, d).gather(3, index[..., None].expand(-1, -1, -1, -1, d))
    return (weights[..., None] * gathered).sum(-2)


@register_mixer("topk")
class TopkAttention(AttentionProjections, TokenMixer):
    """Top-k (k-NN) softmax attention (KVT, Wang et al., 2022); dense O(N²) compute.

    Args:
        topk: keys kept per query (default 100, KVT's; every key when N ≤ topk).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments (``attn_drop`` applies
        to the kept weights, as in KVT).
    """

    complexity = "quadratic"
    padding_mask = "masked"     # padded keys score -inf: never among a query's top k

    def __init__(self, dim: int, num_heads: int = 8, *args, topk: int = 100, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk={topk!r} must be a positive integer (keys kept per query, e.g. 100)")
        self.topk = topk
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)

    def _weights(self, q: torch.Tensor, k: torch.Tensor, mask=None) -> torch.Tensor:
        """``(B, H, N, N)`` softmax weights over each query's top-k scores (exact zeros elsewhere); padded
        keys (``mask``) score -inf, so with fewer real keys than k every real key is kept."""
        scores = (q @ k.transpose(-1, -2)) * self.scale
        if mask is not None:
            scores = scores.masked_fill(~key_mask(mask), float("-inf"))
        # keep the scores >= each row's k-th largest (a selection, ~2x faster than a top-k sort here), by a
        # comparison that fuses into the softmax (a scatter of top-k indices does not fuse); only exact
        # ties at the k-th value keep more than k keys
        n = scores.shape[-1]
        kth = scores.detach().kthvalue(n - min(self.topk, n) + 1, dim=-1, keepdim=True).values
        return scores.masked_fill(scores < kth, float("-inf")).softmax(dim=-1)

    def mix(self, x, grid=None, attn_mask=None, is_causal=False, mask=None):
        q, k, v = self._qkv(x)
        w = self.attn_drop(self._weights(q, k, mask))
        return self._project_out(w.to(v.dtype) @ v)

    def analytic_flops(self, batch: int, n: int) -> int:
        """qkv and proj plus the dense ``q·kᵀ`` and ``weights·v`` (the selection is not a product)."""
        c = self.dim
        return 2 * batch * n * c * 4 * c + 4 * batch * self.num_heads * n * n * self.head_dim

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, **grid) -> torch.Tensor:
        q, k, _ = self._qkv(x)
        return self._weights(q, k)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, topk={self.topk}"
