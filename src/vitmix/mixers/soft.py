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

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .base import TokenMixer
from .grid import (
    LandmarkCount, add_to_grid, check_choice, check_newton, grid_channels_first, head_conv, landmark_grid,
    landmark_shape, merge_heads, reject_unsupported, split_heads, stride_option, tokens_from_channels_first,
)
from .registry import register_mixer

# ---------------------------------------------------------------------------------------------
@register_mixer("soft")
class SoftAttention(TokenMixer):
    """SOFT softmax-free attention: Gaussian kernel, Nyström landmarks, Newton–Schulz (official code).

    The module docstring lists what follows the official code.

    Args:
        dim, num_heads: channels and heads (``d = dim / num_heads``; the released models use d = 32).
        qkv_bias: bias of ``W_q`` and ``W_v`` (the official models use ``True``).
        proj_bias, proj_drop: bias of, and dropout after, the output projection ``ff``.
        landmark_stride: landmark stride ``s`` on the token grid (official ``sr_ratio`` 8 / 4 / 2 for
            stages 1–3, which gives m = 49 at 224²). The default 2 is stage 3's setting.
        sr_ratio: deprecated name of ``landmark_stride`` (warns).
        landmarks: ``"conv"`` (official: ``s×s`` stride-``s`` conv shared by heads, no bias, then
            LayerNorm + GELU) or ``"avgpool"`` (the paper's parameter-free average pooling).
        num_landmarks: ``"auto"`` (default): one landmark per ``s×s`` block, at most 7×7 = 49 (the
            papers' m), so the layer is O(N) at any resolution and equal to the official stride up to
            a ``7s×7s`` grid; a perfect square or ``(mh, mw)``: that fixed count; ``None``: the stride
            alone (official code: m grows with the input, quadratic cost at high resolution). When
            the count is fixed and ``landmarks="conv"``, the grid is first adaptively pooled to
            ``(mh·s, mw·s)`` and the learnt conv applied (identity at the training resolution).
        conv_kernel: size ``k`` of the per-head local filter on ``V`` (official 9 / 5 / 3 for stages
            1–3; default 3); ``0`` or ``None`` disables it.
        newton_iters, newton_eps: Newton–Schulz iterations (20) and diagonal perturbation (0.01).
        newton_alpha: ``"safe"`` (default: ``α = 1.8/‖A + εI‖∞²``) or ``"official"`` (SOFT's CUDA
            kernel: ``α`` from ``A`` before the ``εI`` shift; indistinguishable here since
            ``A_ii = 1``).
        inverse: ``"newton"`` (default, official) or ``"exact"`` (linear solve of ``A + εI``; analysis).
        grid_remainder: with ``num_landmarks=None``, ``"error"`` (default) raises when the grid is not
            divisible by the stride; ``"floor"`` follows the official code (border rows/columns join
            no landmark).
        hw, num_prefix_tokens: the token grid (see :class:`~vitmix.mixers.base.TokenMixer`).

    ``qk_norm``, ``scale_norm`` and ``attn_drop`` are not supported (``ValueError`` when set).
    """

    spatial = True
    rejects_non_finite = True
    complexity = "linear"
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
        landmark_stride: Optional[int] = None,
        landmarks: str = "conv",
        num_landmarks: LandmarkCount = "auto",
        conv_kernel: Optional[int] = 3,
        newton_iters: int = 20,
        newton_eps: float = 0.01,
        newton_alpha: str = "safe",
        inverse: str = "newton",
        grid_remainder: str = "error",
        sr_ratio: Optional[int] = None,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop,
                         norm_layer, **kwargs)
        name = type(self).__name__
        reject_unsupported(name, qk_norm, scale_norm, attn_drop)
        stride = stride_option(name, landmark_stride, {"sr_ratio": sr_ratio}, default=2)
        check_choice("landmarks", landmarks, ("conv", "avgpool"))
        check_choice("inverse", inverse, ("newton", "exact"))
        check_choice("newton_alpha", newton_alpha, ("safe", "official"))
        check_choice("grid_remainder", grid_remainder, ("error", "floor"))
        if conv_kernel and (int(conv_kernel) < 1 or int(conv_kernel) % 2 == 0):
            raise ValueError(f"conv_kernel={conv_kernel} must be a positive odd size (3, 5, 9) or 0 to disable")
        check_newton(name, newton_iters, newton_eps, inverse)
        d, h = self.head_dim, num_heads
        self.landmark_stride = stride
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
            self.Qlandmark_op = nn.Conv2d(d, d, kernel_size=stride, stride=stride, bias=False)
            self.Qnorm_act = nn.Sequential(nn.LayerNorm(d), nn.GELU())
        if self.conv_kernel:
            k = self.conv_kernel
            self.conv = nn.Conv2d(h, h, kernel_size=k, padding=k // 2, groups=h, bias=False)
        self.ff = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    #: SOFT's per-stage local-conv sizes (stages 1–4 of the official pyramids)
    stage_conv_kernels = (9, 5, 3, 3)

    @classmethod
    def stage_options(cls, stage: int, stride: int, newton_iters: int) -> dict:
        """Per-stage options in the pyramid backbones (official stride 8 / 4 / 2, conv 9 / 5 / 3)."""
        return dict(landmark_stride=stride, conv_kernel=cls.stage_conv_kernels[stage], newton_iters=newton_iters)

    def extra_repr(self) -> str:
        m = f"landmark_stride={self.landmark_stride}, num_landmarks={self.landmark_hw!r}"
        return (f"heads={self.num_heads}, head_dim={self.head_dim}, landmarks={self.landmarks!r}, {m}, "
                f"newton_iters={self.newton_iters}, inverse={self.inverse!r}")

    # -- pieces --------------------------------------------------------------------------------
    def landmark_count(self, h: int, w: int) -> Tuple[int, int]:
        """The ``(mh, mw)`` landmark grid used on an ``h×w`` token grid (``ValueError`` if none fits)."""
        return landmark_shape(type(self).__name__, h, w, self.landmark_stride, self.landmark_hw,
                              self.grid_remainder)

    def _landmarks(self, q: torch.Tensor, grid) -> torch.Tensor:
        """Landmarks ``(B, heads, m, d)`` from the (scaled) grid queries."""
        prefix, h, w = grid
        b, nh = q.shape[:2]
        mh, mw = self.landmark_count(h, w)
        g = grid_channels_first(q, prefix, h, w)
        s = self.landmark_stride
        fixed = self.landmark_hw is not None
        if self.landmarks == "conv":
            if fixed and (mh * s, mw * s) != (h, w):
                g = F.adaptive_avg_pool2d(g, (mh * s, mw * s))
            lm = tokens_from_channels_first(self.Qlandmark_op(g), b, nh)
            return self.Qnorm_act(lm)
        if fixed and (mh * s, mw * s) != (h, w):
            g = F.adaptive_avg_pool2d(g, (mh, mw))
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
        grid = self.token_grid(x.shape[1], hw, num_prefix_tokens)
        q, _ = self._qv(x)
        lm = self._landmarks(q, grid)
        eye = torch.eye(x.shape[1], dtype=q.dtype, device=q.device).expand(q.shape[0], self.num_heads, -1, -1)
        return self._attend(q, eye, lm)



@register_mixer("soft_norm")
class SoftNormAttention(SoftAttention):
    """SOFT-Norm (SOFT++): :class:`SoftAttention` with ``D^(-1/2)·NS(A)·D^(-1/2)``.

    ``D`` is the diagonal of row sums of the landmark kernel ``A`` (the official code's landmark
    degrees, not the full-matrix degrees). Same options as :class:`SoftAttention`.
    """

    normalization = "soft_norm"


__all__ = ["SoftAttention", "SoftNormAttention"]
