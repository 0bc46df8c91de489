"""Nyströmformer (Xiong et al., "Nyströmformer: A Nyström-Based Algorithm for Approximating
Self-Attention", AAAI 2021): softmax attention through landmarks.

With landmark queries/keys ``Q̃, K̃`` (segment means of the token sequence),
``Ŝ = softmax(Q·K̃ᵀ/√d) · pinv(softmax(Q̃·K̃ᵀ/√d)) · softmax(Q̃·Kᵀ/√d)`` is applied to ``V`` right
to left in O(N·m·d); the pseudo-inverse is the paper's iterative one (6 iterations of
``Z ← ¼·Z(13I − AZ(15I − AZ(7I − AZ)))`` from ``Z₀ = Aᵀ/(‖A‖₁‖A‖∞)``), and a depthwise convolution
of ``V`` along the token sequence (per head, kernel 33, no bias) is added, as in the official code.

vitmix choices: the segment means are an adaptive average over the sequence (prefix tokens
included), so any N works (equal to the official segment means when m divides N; the official code
pads instead); the default ``num_landmarks=49`` is the landmark budget of SOFT/LaplacianFormer at
224², so comparisons spend the same m; with fewer tokens than landmarks every token is a landmark.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..ops._common import no_autocast
from .base import AttentionProjections, TokenMixer
from .options import reject_unsupported
from .registry import register_mixer
from .sequence import segment_pooling


def iterative_pinv(a: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """The Nyströmformer pseudo-inverse of ``a (…, m, m)`` (cubic-convergent Newton-type iteration)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    z = a.mT / (a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1))[..., None, None]
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def segment_means(t: torch.Tensor, m: int) -> torch.Tensor:
    """``m`` landmarks of ``t (B, h, N, d)``: means of ``m`` consecutive segments of the tokens."""
    b, h, n, d = t.shape
    return F.adaptive_avg_pool1d(t.reshape(b * h, n, d).transpose(1, 2), m).transpose(1, 2).reshape(b, h, m, d)


def nystromformer_reference(q, k, v, lq, lk, iters: Optional[int] = 6):
    """Dense O(N²) evaluation of the Nyström matrix Ŝ·V (``iters=None``: the exact pseudo-inverse)."""
    s = q.shape[-1] ** -0.5
    f = (q @ lk.mT * s).softmax(-1)
    a = (lq @ lk.mT * s).softmax(-1)
    bt = (lq @ k.mT * s).softmax(-1)
    z = torch.linalg.pinv(a) if iters is None else iterative_pinv(a, iters)
    return (f @ z @ bt) @ v


@register_mixer("nystromformer")
class NystromformerAttention(AttentionProjections, TokenMixer):
    """Nyströmformer attention (Xiong et al., 2021); O(N) in tokens for a fixed landmark count.

    Args:
        num_landmarks: landmarks m (default 49; every token when N < m).
        pinv_iters: iterations of the pseudo-inverse (6, the paper's).
        conv_kernel: size of the per-head depthwise conv of V along the token sequence (33, the
            official default; 0/None disables it).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments (``attn_drop`` is not
        supported: no N×N attention matrix is formed).
    """

    complexity = "linear"
    on_sequence = "as on images: landmarks are segment means of the token sequence, the conv runs along it"
    #: landmarks from each sample's real tokens, padded keys out of the softmaxes, zero values before the conv
    padding_mask = "masked"
    additive_terms = ("conv",)   # the depthwise conv of V: zero when converted from softmax (vitmix.convert)

    def __init__(self, dim: int, num_heads: int = 8, *args, num_landmarks: int = 49, pinv_iters: int = 6,
                 conv_kernel: Optional[int] = 33, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        reject_unsupported(type(self).__name__, False, False, attn_drop)
        if not isinstance(num_landmarks, int) or num_landmarks < 1:
            raise ValueError(f"num_landmarks={num_landmarks!r} must be a positive integer (e.g. 49)")
        if not isinstance(pinv_iters, int) or pinv_iters < 1:
            raise ValueError(f"pinv_iters={pinv_iters!r} must be a positive integer (the paper uses 6)")
        if conv_kernel and (int(conv_kernel) < 1 or int(conv_kernel) % 2 == 0):
            raise ValueError(f"conv_kernel={conv_kernel} must be a positive odd size (e.g. 33) or 0 to disable")
        self.num_landmarks, self.pinv_iters, self.conv_kernel = num_landmarks, pinv_iters, int(conv_kernel or 0)
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, 0.0, proj_drop, norm_layer)
        if self.conv_kernel:
            k = self.conv_kernel
            self.conv = nn.Conv2d(num_heads, num_heads, (k, 1), padding=(k // 2, 0), groups=num_heads, bias=False)

    def _attend(self, q, k, v, mask=None):
        m = min(self.num_landmarks, q.shape[-2])
        with no_autocast(q.device.type):
            dt = torch.promote_types(q.dtype, torch.float32)
            q, k, vf = q.to(dt), k.to(dt), v.to(dt)
            if mask is None:
                lq, lk = segment_means(q, m), segment_means(k, m)
                slots = keys = None
            else:       # each sample's own landmarks; a sample with fewer tokens than m leaves slots empty
                lengths = mask.sum(-1)
                pool = segment_pooling(lengths, lengths.clamp(max=m), m, q.shape[-2], dtype=dt)[:, None]
                lq, lk = pool @ q, pool @ k
                slots, keys = pool.sum(-1).gt(0)[..., None, :], mask[:, None, None, :]
            s = q.shape[-1] ** -0.5
            f = _softmax(q @ lk.mT * s, slots)                            # (B, h, N, m)
            # empty slots: zero rows and columns, so the pseudo-inverse keeps them out (block-diagonal)
            a = _softmax(lq @ lk.mT * s, slots)
            z = iterative_pinv(a if slots is None else a * slots.mT, self.pinv_iters)
            bt_v = _softmax(lq @ k.mT * s, keys) @ vf                     # (B, h, m, d)
            return (f @ (z @ bt_v)).to(v.dtype)

    def mix(self, x, grid=None, attn_mask=None, is_causal=False, mask=None):
        q, k, v = self._qkv(x)
        out = self._attend(q, k, v, mask)
        v = v if mask is None else v * mask[:, None, :, None].to(v.dtype)  # the conv sees zeros past the end
        if self.conv_kernel:
            out = out + self.conv(v)                                      # (B, h, N, d): along tokens
        return self._project_out(out)

    def analytic_flops(self, batch: int, n: int) -> int:
        c, h, d = self.dim, self.num_heads, self.head_dim
        m = min(self.num_landmarks, n)
        # Q·K̃ᵀ, Q̃·Kᵀ, B̃·V, F·(..): 2nmd each; Q̃·K̃ᵀ and Z·(B̃V): 2m²d; 4 m×m products per pinv step
        attn = 4 * 2 * n * m * d + 2 * 2 * m * m * d + self.pinv_iters * 4 * 2 * m ** 3
        conv = 2 * n * d * self.conv_kernel if self.conv_kernel else 0
        return 2 * batch * n * c * 4 * c + batch * h * (attn + conv)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, **grid) -> torch.Tensor:
        q, k, _ = self._qkv(x)
        eye = torch.eye(x.shape[1], dtype=q.dtype, device=q.device).expand(q.shape[0], self.num_heads, -1, -1)
        return self._attend(q, k, eye)


def _softmax(scores: torch.Tensor, keep: Optional[torch.Tensor]) -> torch.Tensor:
    """Softmax over the last dim, over the ``keep`` columns only (``None``: all)."""
    return scores.softmax(-1) if keep is None else scores.masked_fill(~keep, float("-inf")).softmax(-1)


__all__ = ["NystromformerAttention", "iterative_pinv", "nystromformer_reference", "segment_means"]
