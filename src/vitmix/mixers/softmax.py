"""Softmax attention: the baseline every other mixer is measured against.

Weight-for-weight identical to ``timm.layers.Attention`` (same parameter names, so state dicts
load either way). ``fused=True`` (default) uses ``F.scaled_dot_product_attention``; ``fused=False``
runs the explicit ``softmax(q kᵀ · scale) v`` path, which :meth:`attention_map` shares.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .base import AttentionProjections, TokenMixer
from .flops import linear_flops
from .registry import register_mixer
from .sequence import key_mask


def _masked_scores(scores: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    if is_causal:
        n_q, n_k = scores.shape[-2:]
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    return scores


def _with_key_padding(attn_mask: Optional[torch.Tensor], mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``attn_mask`` that also leaves out the padded keys of a ``(B, N)`` key-padding ``mask``."""
    keys = key_mask(mask)
    if keys is None or attn_mask is None:
        return keys if attn_mask is None else attn_mask
    if attn_mask.dtype == torch.bool:
        return attn_mask & keys
    return attn_mask.masked_fill(~keys, float("-inf"))


@register_mixer("softmax")
class SoftmaxAttention(AttentionProjections, TokenMixer):
    """Multi-head softmax attention (timm-compatible).

    Args:
        fused: use PyTorch's fused SDPA kernel; ``False`` computes the attention matrix explicitly.
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments.
    """

    supports_attn_mask = True
    padding_mask = "masked"     # the key-padding mask joins attn_mask (SDPA's boolean/additive mask)

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        fused: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        self.fused = fused
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)

    def _weights(self, q, k, attn_mask, is_causal):
        scores = _masked_scores((q * self.scale) @ k.transpose(-2, -1), attn_mask, is_causal)
        return scores.softmax(dim=-1)

    def analytic_flops(self, batch: int, n: int) -> int:
        c = self.dim
        attn = 2 * (2 * batch * self.num_heads * n * n * self.head_dim)   # q·kᵀ and weights·v
        return linear_flops(batch * n, c, 3 * c) + attn + linear_flops(batch * n, c, c)

    def mix(self, x, grid=None, attn_mask=None, is_causal=False, mask=None):
        q, k, v = self._qkv(x)
        attn_mask = _with_key_padding(attn_mask, mask)
        if self.fused:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                dropout_p=self.attn_drop.p if self.training else 0.0,
            )
        else:
            out = self.attn_drop(self._weights(q, k, attn_mask, is_causal)) @ v
        return self._project_out(out)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, attn_mask=None, is_causal=False, **grid) -> torch.Tensor:
        q, k, _ = self._qkv(x)
        return self._weights(q, k, attn_mask, is_causal)
