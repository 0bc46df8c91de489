"""SOFT: softmax-free attention with a Gaussian kernel, Nyström landmarks and a Newton–Schulz inverse.

Faithful to the official SOFT code (``fudan-zvg/SOFT``, ``SoftmaxFreeAttention``), see
``docs/soft-laplacianformer.md``:

* one query projection ``W_q`` and a value projection ``W_v``; **keys are the queries** (``K = Q``,
  there is no ``W_k``), so the kernel matrix is symmetric;
* ``Q`` is scaled by ``d^(-1/4)`` and compared with the Gaussian kernel ``exp(-‖x - y‖² / 2)``, i.e.
  ``S_ij = exp(-‖q_i - q_j‖² / (2√d))`` — unnormalised (no softmax, no row sums);
* landmarks (bottleneck tokens) from the scaled queries on the token grid: a ``s×s`` stride-``s``
  convolution shared by all heads, then ``LayerNorm(d)`` and GELU (official, ``landmarks="conv"``)
  or parameter-free average pooling (the paper's, ``landmarks="avgpool"``); the landmark keys are
  the landmark queries;
* ``Y = K(Q, L) · NS(K(L, L)) · (K(L, Q) · V)`` evaluated right to left (never N×N), plus a local
  term: one ``k×k`` spatial filter per head, shared by the head's ``d`` channels, applied to ``V``;
* merged heads go through the output projection ``ff``.

``soft_norm`` (SOFT++ / SOFT-Norm) normalises the landmark inverse symmetrically,
``D^(-1/2) · NS(A) · D^(-1/2)`` with ``D`` the row sums of the landmark kernel ``A``. The official
class cannot be built (a ``NameError``); this one works.

Parameter names follow the official modules (``W_q``, ``W_v``, ``Qlandmark_op``, ``Qnorm_act``,
``conv``, ``ff``) so official state dicts map one to one.

Prefix tokens (CLS/registers, e.g. inside a stock timm ``VisionTransformer``) take part as ordinary
queries and keys of the kernel attention; the landmarks and the local convolution use the ``H×W``
grid tokens only (prefix tokens get no local term).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .base import TokenMixer
from .registry import register_mixer

LandmarkCount = Union[int, Sequence[int], None]


# ---------------------------------------------------------------------------------------------
# helpers shared with the Laplacian mixer
# ---------------------------------------------------------------------------------------------
def landmark_grid(num_landmarks: LandmarkCount) -> Optional[Tuple[int, int]]:
    """``(mh, mw)`` for a fixed landmark count: an int must be a perfect square, or give two ints."""
    if num_landmarks is None:
        return None
    if isinstance(num_landmarks, int):
        side = math.isqrt(num_landmarks)
        if num_landmarks <= 0 or side * side != num_landmarks:
            raise ValueError(
                f"num_landmarks={num_landmarks} must be a positive perfect square (e.g. 16, 49, 64) "
                f"or a pair (mh, mw) of landmark rows and columns"
            )
        return side, side
    mh, mw = (int(v) for v in num_landmarks)
    if mh <= 0 or mw <= 0:
        raise ValueError(f"num_landmarks={tuple(num_landmarks)} must be positive")
    return mh, mw


def check_grid(name: str, h: int, w: int, ratio: int, fixed: Optional[Tuple[int, int]], remainder: str,
               option: str) -> None:
    """Raise a ``ValueError`` when an ``h×w`` grid cannot give the requested landmarks."""
    if fixed is not None:
        if h < fixed[0] or w < fixed[1]:
            raise ValueError(
                f"{name}: token grid {h}x{w} (N={h * w}) is smaller than the {fixed[0]}x{fixed[1]}="
                f"{fixed[0] * fixed[1]} landmarks; use fewer landmarks (num_landmarks) or a larger input"
            )
        return
    if h < ratio or w < ratio:
        raise ValueError(
            f"{name}: token grid {h}x{w} is smaller than {option}={ratio}, which would leave no landmark; "
            f"use {option} <= {min(h, w)} or set num_landmarks"
        )
    if (h % ratio or w % ratio) and remainder == "error":
        raise ValueError(
            f"{name}: token grid {h}x{w} is not divisible by {option}={ratio}; use a grid that is a "
            f"multiple of {ratio} (image size divisible by {ratio} x the patch size), a {option} that "
            f"divides both sides, num_landmarks=(mh, mw) for adaptive pooling, or "
            f"grid_remainder='floor' (official: border tokens are left out of the landmarks)"
        )


def grid_channels_first(t: torch.Tensor, prefix: int, h: int, w: int) -> torch.Tensor:
    """``(B, heads, P + H*W, d)`` → the grid tokens as ``(B*heads, d, H, W)``."""
    b, nh, _, d = t.shape
    return t[:, :, prefix:].reshape(b * nh, h, w, d).permute(0, 3, 1, 2)


def tokens_from_channels_first(t: torch.Tensor, b: int, nh: int) -> torch.Tensor:
    """``(B*heads, d, h, w)`` → ``(B, heads, h*w, d)``."""
    return t.flatten(2).transpose(1, 2).reshape(b, nh, -1, t.shape[1])


def head_conv(conv: nn.Conv2d, v: torch.Tensor, prefix: int, h: int, w: int) -> torch.Tensor:
    """The official per-head local term: ``v (B, heads, N, d)`` → conv over ``(B*d, heads, H, W)``.

    Returns ``(B, heads, H*W, d)`` for the grid tokens.
    """
    b, nh, _, d = v.shape
    g = v[:, :, prefix:].reshape(b, nh, h, w, d).permute(0, 4, 1, 2, 3).reshape(b * d, nh, h, w)
    out = conv(g).reshape(b, d, nh, h * w)
    return out.permute(0, 2, 3, 1)


def add_to_grid(out: torch.Tensor, local: torch.Tensor, prefix: int) -> torch.Tensor:
    """``out (B, heads, P + HW, d) + local (B, heads, HW, d)`` on the grid tokens only."""
    if prefix == 0:
        return out + local
    return torch.cat([out[:, :, :prefix], out[:, :, prefix:] + local], dim=2)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    b, nh, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, nh * d)


def split_heads(t: torch.Tensor, nh: int) -> torch.Tensor:
    b, n, c = t.shape
    return t.reshape(b, n, nh, c // nh).transpose(1, 2)


def reject_unsupported(name: str, qk_norm: bool = False, scale_norm: bool = False,
                       attn_drop: float = 0.0) -> None:
    """Raise for timm options a kernel mixer cannot honour (accepted only at their defaults)."""
    if scale_norm:
        raise ValueError(f"{name} does not support scale_norm=True; leave it False")
    if qk_norm:
        raise ValueError(f"{name} does not support qk_norm=True; leave it False")
    if attn_drop:
        raise ValueError(
            f"{name} never forms an attention matrix, so attn_drop={attn_drop} cannot apply; use "
            f"proj_drop or drop_path instead"
        )


# ---------------------------------------------------------------------------------------------
@register_mixer("soft")
class SoftAttention(TokenMixer):
    """SOFT softmax-free attention (official code's behaviour; see the module docstring).

    Args:
        dim, num_heads: channels and heads (``d = dim / num_heads``; the released models use d = 32).
        qkv_bias: bias of ``W_q`` and ``W_v`` (the official models use ``True``).
        proj_bias, proj_drop: bias of, and dropout after, the output projection ``ff``.
        sr_ratio: landmark stride ``s`` on the token grid (official 8 / 4 / 2 for stages 1–3, which
            gives m = 49 at 224²). The default 2 is stage 3's setting.
        landmarks: ``"conv"`` (official: ``s×s`` stride-``s`` conv shared by heads, no bias, then
            LayerNorm + GELU) or ``"avgpool"`` (the paper's parameter-free average pooling).
        num_landmarks: fixed landmark count (a perfect square or ``(mh, mw)``) by adaptive average
            pooling, so m stays constant at any resolution. With ``landmarks="conv"`` the grid is
            first adaptively pooled to ``(mh·s, mw·s)`` and the learnt conv applied (identity at the
            training resolution). ``None`` (default) uses the fixed stride (official).
        conv_kernel: size ``k`` of the per-head local filter on ``V`` (official 9 / 5 / 3 for stages
            1–3; default 3); ``0`` or ``None`` disables it.
        newton_iters, newton_eps: Newton–Schulz iterations (20) and diagonal perturbation (0.01).
        newton_alpha: ``"safe"`` (default: ``α = 1.8/‖A + εI‖∞²``) or ``"official"`` (SOFT's CUDA
            kernel: ``α`` from ``A`` before the ``εI`` shift; indistinguishable here since
            ``A_ii = 1``).
        inverse: ``"newton"`` (default, official) or ``"exact"`` (linear solve of ``A + εI``; analysis).
        grid_remainder: ``"error"`` (default) raises when the grid is not divisible by ``sr_ratio``;
            ``"floor"`` follows the official code (border rows/columns join no landmark).
        hw, num_prefix_tokens: the token grid (see :class:`~vitmix.mixers.base.TokenMixer`).

    ``qk_norm``, ``scale_norm`` and ``attn_drop`` are not supported (``ValueError`` when set).
    """

    spatial = True
    normalization: Optional[str] = None

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Optional[type] = None,
        *,
        sr_ratio: int = 2,
        landmarks: str = "conv",
        num_landmarks: LandmarkCount = None,
        conv_kernel: Optional[int] = 3,
        newton_iters: int = 20,
        newton_eps: float = 0.01,
        newton_alpha: str = "safe",
        inverse: str = "newton",
        grid_remainder: str = "error",
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop,
                         norm_layer, **kwargs)
        name = type(self).__name__
        reject_unsupported(name, qk_norm, scale_norm, attn_drop)
        check_choice("landmarks", landmarks, ("conv", "avgpool"))
        check_choice("inverse", inverse, ("newton", "exact"))
        check_choice("newton_alpha", newton_alpha, ("safe", "official"))
        check_choice("grid_remainder", grid_remainder, ("error", "floor"))
        if int(sr_ratio) < 1:
            raise ValueError(f"sr_ratio={sr_ratio} must be >= 1")
        if conv_kernel and (int(conv_kernel) < 1 or int(conv_kernel) % 2 == 0):
            raise ValueError(f"conv_kernel={conv_kernel} must be a positive odd size (3, 5, 9) or 0 to disable")
        if int(newton_iters) < 0 or float(newton_eps) < 0:
            raise ValueError(f"newton_iters={newton_iters} and newton_eps={newton_eps} must be >= 0")
        d, h = self.head_dim, num_heads
        self.sr_ratio = int(sr_ratio)
        self.landmarks = landmarks
        self.landmark_hw = landmark_grid(num_landmarks)
        self.newton_iters = int(newton_iters)
        self.newton_eps = float(newton_eps)
        self.newton_alpha = newton_alpha
        self.inverse = inverse
        self.grid_remainder = grid_remainder
        self.conv_kernel = int(conv_kernel or 0)
        self.scale = d ** -0.25

        self.W_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.W_v = nn.Linear(dim, dim, bias=qkv_bias)
        if landmarks == "conv":
            self.Qlandmark_op = nn.Conv2d(d, d, kernel_size=self.sr_ratio, stride=self.sr_ratio, bias=False)
            self.Qnorm_act = nn.Sequential(nn.LayerNorm(d), nn.GELU())
        if self.conv_kernel:
            k = self.conv_kernel
            self.conv = nn.Conv2d(h, h, kernel_size=k, padding=k // 2, groups=h, bias=False)
        self.ff = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        m = f"num_landmarks={self.landmark_hw}" if self.landmark_hw else f"sr_ratio={self.sr_ratio}"
        return (f"heads={self.num_heads}, head_dim={self.head_dim}, landmarks={self.landmarks!r}, {m}, "
                f"newton_iters={self.newton_iters}, inverse={self.inverse!r}")

    # -- pieces --------------------------------------------------------------------------------
    def _landmarks(self, q: torch.Tensor, grid) -> torch.Tensor:
        """Landmarks ``(B, heads, m, d)`` from the (scaled) grid queries."""
        prefix, h, w = grid
        b, nh = q.shape[:2]
        check_grid(type(self).__name__, h, w, self.sr_ratio, self.landmark_hw, self.grid_remainder, "sr_ratio")
        g = grid_channels_first(q, prefix, h, w)
        s = self.sr_ratio
        if self.landmarks == "conv":
            if self.landmark_hw is not None:
                g = F.adaptive_avg_pool2d(g, (self.landmark_hw[0] * s, self.landmark_hw[1] * s))
            lm = tokens_from_channels_first(self.Qlandmark_op(g), b, nh)
            return self.Qnorm_act(lm)
        if self.landmark_hw is not None:
            g = F.adaptive_avg_pool2d(g, self.landmark_hw)
        else:
            g = F.avg_pool2d(g, s, s)
        return tokens_from_channels_first(g, b, nh)

    def _qv(self, x: torch.Tensor):
        q = split_heads(self.W_q(x), self.num_heads) * self.scale
        v = split_heads(self.W_v(x), self.num_heads)
        return q, v

    def _attend(self, q, v, lm):
        return ops.nystrom_attention(
            q, q, v, lm, lm, kernel="gaussian", iters=self.newton_iters, eps=self.newton_eps,
            alpha=self.newton_alpha, inverse=self.inverse, normalization=self.normalization,
        )

    def mix(self, x, grid, attn_mask=None, is_causal=False):
        prefix, h, w = grid
        q, v = self._qv(x)
        lm = self._landmarks(q, grid)
        out = self._attend(q, v, lm)
        if self.conv_kernel:
            out = add_to_grid(out, head_conv(self.conv, v, prefix, h, w).to(out.dtype), prefix)
        return self.proj_drop(self.ff(merge_heads(out)))

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, hw=None, num_prefix_tokens=None, **_) -> torch.Tensor:
        """Effective ``(B, heads, N, N)`` weights of the kernel attention (O(N²), analysis only).

        Row ``i`` holds the Nyström weights ``K(q_i, L) · NS(A) · K(L, Q)``; the local convolution
        on ``V`` is not included.
        """
        grid = self._grid_for(x, hw, num_prefix_tokens)
        q, _ = self._qv(x)
        lm = self._landmarks(q, grid)
        eye = torch.eye(x.shape[1], dtype=q.dtype, device=q.device).expand(q.shape[0], self.num_heads, -1, -1)
        return self._attend(q, eye, lm)

    def _grid_for(self, x, hw, num_prefix_tokens):
        from .base import resolve_grid

        hw = hw if hw is not None else self.hw
        prefix = num_prefix_tokens if num_prefix_tokens is not None else self.num_prefix_tokens
        return resolve_grid(x.shape[1], hw, prefix)


@register_mixer("soft_norm")
class SoftNormAttention(SoftAttention):
    """SOFT-Norm (SOFT++): :class:`SoftAttention` with ``D^(-1/2)·NS(A)·D^(-1/2)``.

    ``D`` is the diagonal of row sums of the landmark kernel ``A`` (the official code's landmark
    degrees, not the full-matrix degrees). Same options as :class:`SoftAttention`.
    """

    normalization = "soft_norm"


__all__ = ["SoftAttention", "SoftNormAttention"]
