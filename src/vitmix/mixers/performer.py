"""Performer attention (Choromanski et al., "Rethinking Attention with Performers", ICLR 2021):
FAVOR+, an unbiased positive random-feature estimate of softmax attention.

With ``x = q·d^(-1/4)`` (so that ``exp(q'·k') = exp(q·k/√d)``) and ``m`` random directions ``wᵢ``,
``φ(x) = exp(W·x − ‖x‖²/2) / √m`` gives ``E[φ(q)·φ(k)] = exp(q·k/√d)``; attention is evaluated
right to left, ``φ(Q)·(φ(K)ᵀV) / φ(Q)·Σⱼφ(kⱼ)``, in O(N·m·d). The directions are orthogonal in
blocks of ``d`` (Gaussian rows orthogonalised by QR, rescaled to chi-distributed norms), as the
paper's "+"; they are a buffer (saved in the state dict) and are redrawn every ``redraw_interval``
training forwards (the paper's feature redrawing; ``None`` never redraws). The default
``num_features = ⌈d·ln d⌉`` follows the authors' reference code.

Numerics: the exponent's largest value is subtracted before ``exp`` (per query row for queries, per
head for keys), which cancels in the normalisation; features run in float32 under autocast.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from ..ops._common import no_autocast
from .base import AttentionProjections, TokenMixer
from .options import reject_unsupported
from .registry import register_mixer


def orthogonal_gaussian(m: int, d: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``(m, d)`` random directions: blocks of ``d`` orthonormal rows, each row rescaled to the norm
    of a ``d``-dim standard Gaussian vector (so every row is marginally N(0, I))."""
    blocks = []
    for _ in range(math.ceil(m / d)):
        g = torch.randn(d, d, generator=generator)
        q, _ = torch.linalg.qr(g)
        blocks.append(q.T)
    w = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator).norm(dim=-1, keepdim=True)
    return w * norms


def _fresh_directions(m: int, d: int, like: torch.Tensor) -> torch.Tensor:
    """New directions shaped and typed like ``like`` (a ``torch.cond`` branch of the compiled redraw)."""
    return orthogonal_gaussian(m, d).to(like)


def positive_features(x: torch.Tensor, w: torch.Tensor, per_row: bool,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """FAVOR+ features of ``x (…, N, d)`` (already scaled by d^(-1/4)) for directions ``w (m, d)``,
    up to a factor exp(−max) that cancels in the normalised attention. Tokens outside ``mask``
    (``(B, N)``, keys of a padded batch) get zero features and no say in the shift."""
    proj = x @ w.T - 0.5 * x.pow(2).sum(-1, keepdim=True)              # (…, N, m)
    if mask is not None:
        proj = proj.masked_fill(~mask[:, None, :, None], float("-inf"))
    shift = proj.amax(-1, keepdim=True) if per_row else proj.amax((-2, -1), keepdim=True)
    return torch.exp(proj - shift.detach()) / math.sqrt(w.shape[0])


def performer_reference(q, k, v, w, eps: float = 1e-6):
    """Dense O(N²) evaluation of the same estimate: (φ(q)·φ(k)ᵀ) rows normalised, times v."""
    d = q.shape[-1]
    fq = positive_features(q * d ** -0.25, w, per_row=True)
    fk = positive_features(k * d ** -0.25, w, per_row=False)
    a = fq @ fk.transpose(-2, -1)
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


@register_mixer("performer")
class PerformerAttention(AttentionProjections, TokenMixer):
    """Performer FAVOR+ attention (Choromanski et al., 2021); O(N) in tokens.

    Args:
        num_features: random features m (default ``⌈d·ln d⌉`` for head dim d).
        redraw_interval: redraw the directions every this many training forwards (default 1000,
            the authors' code; ``None`` keeps them fixed).
        eps: added to the normaliser.
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments (``attn_drop`` is not
        supported: there is no attention matrix).
    """

    complexity = "linear"
    padding_mask = "masked"     # padded keys get zero features (the fixed directions make it exact)

    def __init__(self, dim: int, num_heads: int = 8, *args, num_features: Optional[int] = None,
                 redraw_interval: Optional[int] = 1000, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        reject_unsupported(type(self).__name__, False, False, attn_drop)
        d = self.head_dim
        m = num_features if num_features is not None else max(1, math.ceil(d * math.log(max(d, 2))))
        if int(m) < 1:
            raise ValueError(f"num_features={num_features} must be a positive integer")
        if redraw_interval is not None and int(redraw_interval) < 1:
            raise ValueError(f"redraw_interval={redraw_interval} must be >= 1 or None (never redraw)")
        self.num_features, self.redraw_interval, self.eps = int(m), redraw_interval, float(eps)
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, 0.0, proj_drop, norm_layer)
        self.register_buffer("directions", orthogonal_gaussian(self.num_features, d))
        # the counter is a buffer (checkpoints, exact resume) read once into a Python int, so a
        # training forward never waits on the device to decide whether to redraw
        self.register_buffer("forwards_since_draw", torch.zeros((), dtype=torch.long))
        self._since_draw: Optional[int] = None
        self.register_load_state_dict_post_hook(lambda module, keys: setattr(module, "_since_draw", None))

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Draw new random directions (from torch's global generator)."""
        self.directions.copy_(orthogonal_gaussian(self.num_features, self.head_dim).to(self.directions))
        self.forwards_since_draw.zero_()
        self._since_draw = 0

    def _count_forward(self) -> None:
        """Count a training forward; redraw the directions when ``redraw_interval`` forwards have passed."""
        if torch.compiler.is_compiling():
            self._count_forward_traced()
            return
        if self._since_draw is None:
            self._since_draw = int(self.forwards_since_draw)
        if self._since_draw >= self.redraw_interval:
            self.redraw_features()
        self._since_draw += 1
        self.forwards_since_draw.fill_(self._since_draw)

    def _count_forward_traced(self) -> None:
        """The same count for ``torch.compile``: in the buffer, with ``torch.cond`` choosing a redraw. A
        Python counter would be a constant of the compiled graph (one recompilation per forward)."""
        count = self.forwards_since_draw
        redraw = count >= self.redraw_interval
        fresh = functools.partial(_fresh_directions, self.num_features, self.head_dim)
        self.directions.copy_(torch.cond(redraw, fresh, torch.clone, (self.directions,)))
        count.copy_(torch.where(redraw, torch.ones_like(count), count + 1))
        self._since_draw = None  # an eager forward after compiled ones re-reads the buffer

    def mix(self, x, grid=None, attn_mask=None, is_causal=False, mask=None):
        if self.training and self.redraw_interval is not None:
            self._count_forward()
        q, k, v = self._qkv(x)
        with no_autocast(q.device.type):
            dt = torch.promote_types(q.dtype, torch.float32)
            w, scale = self.directions.to(dt), self.head_dim ** -0.25
            fq = positive_features(q.to(dt) * scale, w, per_row=True)
            fk = positive_features(k.to(dt) * scale, w, per_row=False, mask=mask)
            kv = fk.transpose(-2, -1) @ v.to(dt)                          # (B, h, m, d)
            norm = fq @ fk.sum(-2, keepdim=True).transpose(-2, -1)        # (B, h, N, 1)
            out = (fq @ kv) / (norm + self.eps)
        return self._project_out(out.to(v.dtype))

    def analytic_flops(self, batch: int, n: int) -> int:
        c, h, d, m = self.dim, self.num_heads, self.head_dim, self.num_features
        features = 2 * (2 * n * d * m)                                   # x·Wᵀ for q and k
        return 2 * batch * n * c * 4 * c + batch * h * (features + 4 * n * m * d + 2 * n * m)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, **grid) -> torch.Tensor:
        q, k, _ = self._qkv(x)
        eye = torch.eye(x.shape[1], dtype=q.dtype, device=q.device).expand(q.shape[0], self.num_heads, -1, -1)
        return performer_reference(q, k, eye, self.directions.to(q.dtype), self.eps)


__all__ = ["PerformerAttention", "orthogonal_gaussian", "performer_reference", "positive_features"]
