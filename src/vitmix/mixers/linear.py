"""Linear attention (Katharopoulos et al., "Transformers are RNNs", ICML 2020): the simplest kernel
baseline.

softmax(q·kᵀ) is replaced by the feature map φ(x) = elu(x) + 1 and the product is evaluated right
to left, ``φ(Q)·(φ(K)ᵀV) / φ(Q)·Σⱼφ(kⱼ)``: O(N·d²) time and no N×N matrix. The paper has no scale
or other hyper-parameter besides ``eps`` in the normaliser.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from .base import AttentionProjections, TokenMixer
from .options import reject_unsupported
from .registry import register_mixer
from .sequence import zero_padding


def linear_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6):
    """Dense O(N²) reference: rows of φ(q)·φ(k)ᵀ normalised to sum 1, times ``v``."""
    a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


@register_mixer("linear")
class LinearAttention(AttentionProjections, TokenMixer):
    """Linear attention with φ = elu + 1 (Katharopoulos et al., 2020); O(N) in tokens.

    Args:
        eps: added to the normaliser φ(q)·Σφ(k) (it is ≥ 0; eps keeps it away from 0).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments (``qk_norm`` and
        ``scale_norm`` as in timm; ``attn_drop`` is not supported: there is no attention matrix).
    """

    complexity = "linear"
    padding_mask = "masked"     # padded keys get zero features: out of φ(K)ᵀV and the normaliser

    def __init__(self, dim: int, num_heads: int = 8, *args, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        reject_unsupported(type(self).__name__, False, False, attn_drop)
        if not eps > 0:
            raise ValueError(f"eps={eps} must be > 0")
        self.eps = float(eps)
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, 0.0, proj_drop, norm_layer)

    def mix(self, x, grid=None, attn_mask=None, is_causal=False, mask=None):
        q, k, v = self._qkv(x)
        q, k = F.elu(q) + 1, zero_padding(F.elu(k) + 1, mask)
        kv = k.transpose(-2, -1) @ v                                     # (B, h, d, d)
        norm = q @ k.sum(-2, keepdim=True).transpose(-2, -1)             # (B, h, N, 1)
        return self._project_out((q @ kv) / (norm + self.eps))

    def analytic_flops(self, batch: int, n: int) -> int:
        c, h, d = self.dim, self.num_heads, self.head_dim
        # qkv + proj, then φ(K)ᵀV, φ(Q)·(φ(K)ᵀV) and the normaliser φ(Q)·Σφ(k)
        return 2 * batch * n * c * 4 * c + batch * h * (4 * n * d * d + 2 * n * d)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, **grid) -> torch.Tensor:
        q, k, _ = self._qkv(x)
        a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
        return a / (a.sum(-1, keepdim=True) + self.eps)


__all__ = ["LinearAttention", "linear_attention_reference"]
