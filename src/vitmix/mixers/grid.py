"""Token-grid, head-layout and landmark helpers shared by the spatial mixers (imports only torch).

Layouts: per-head tokens are ``(B, heads, P + H*W, d)`` with ``P`` prefix (CLS/register) tokens
followed by the ``H×W`` grid in row-major order; "channels first" grids are ``(B', C', H, W)``.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import torch
from torch import nn

from ..ops._common import exporting_to_onnx
from ..ops.nystrom import avg_pool_landmarks
from .options import check_choice, check_newton, reject_unsupported, stride_option  # noqa: F401  (were here)

#: the landmark grid of the papers (m = 49 in every SOFT stage at 224²): the default cap, so that a
#: mixer created without options costs O(N) at any resolution
DEFAULT_LANDMARK_GRID = (7, 7)

LandmarkCount = Union[int, Sequence[int], str, None]


# ---------------------------------------------------------------------------------- landmarks
def landmark_grid(num_landmarks: LandmarkCount) -> Union[Tuple[int, int], str, None]:
    """Normalise ``num_landmarks``: ``"auto"``, ``None`` (stride only) or a fixed ``(mh, mw)``.

    A fixed int must be a perfect square; a pair gives landmark rows and columns.
    """
    if num_landmarks is None or num_landmarks == "auto":
        return num_landmarks
    if isinstance(num_landmarks, str):
        raise ValueError(f"num_landmarks={num_landmarks!r} must be 'auto', None, a perfect square or (mh, mw)")
    if isinstance(num_landmarks, int):
        side = math.isqrt(max(num_landmarks, 0))
        if num_landmarks <= 0 or side * side != num_landmarks:
            raise ValueError(
                f"num_landmarks={num_landmarks} must be a positive perfect square (e.g. 16, 49, 64), "
                f"a pair (mh, mw) of landmark rows and columns, 'auto' or None"
            )
        return side, side
    mh, mw = (int(v) for v in num_landmarks)
    if mh <= 0 or mw <= 0:
        raise ValueError(f"num_landmarks={tuple(num_landmarks)} must be positive")
    return mh, mw


def landmark_shape(name: str, h: int, w: int, stride: int, spec, remainder: str = "error") -> Tuple[int, int]:
    """The ``(mh, mw)`` landmark grid for an ``h×w`` token grid, or a ``ValueError`` saying what would work.

    * ``spec == "auto"``: one landmark per ``stride×stride`` block, capped at
      :data:`DEFAULT_LANDMARK_GRID` (7×7): ``min(7, h // stride) × min(7, w // stride)``. Equal to
      plain strided pooling up to a ``7·stride`` grid (so the official models are unchanged at their
      nominal size) and a fixed m = 49 beyond, i.e. linear cost at any resolution. Small grids get
      fewer landmarks than tokens/stride², where 49 would cost more than exact attention.
    * ``spec`` a pair: that fixed grid (adaptive pooling).
    * ``spec is None``: ``(h // stride, w // stride)``, m grows with the input (official SOFT);
      ``remainder="error"`` raises when the grid is not divisible by the stride.
    """
    option = "landmark_stride"
    if isinstance(spec, tuple):
        if h < spec[0] or w < spec[1]:
            raise ValueError(
                f"{name}: token grid {h}x{w} (N={h * w}) is smaller than the {spec[0]}x{spec[1]}="
                f"{spec[0] * spec[1]} landmarks; use fewer landmarks (num_landmarks) or a larger input"
            )
        return spec
    if h < stride or w < stride:
        raise ValueError(
            f"{name}: token grid {h}x{w} is smaller than {option}={stride}, which would leave no landmark; "
            f"use {option} <= {min(h, w)} or set num_landmarks"
        )
    if spec == "auto":
        return min(DEFAULT_LANDMARK_GRID[0], h // stride), min(DEFAULT_LANDMARK_GRID[1], w // stride)
    if (h % stride or w % stride) and remainder == "error":
        raise ValueError(
            f"{name}: token grid {h}x{w} is not divisible by {option}={stride}; use a grid that is a "
            f"multiple of {stride} (image size divisible by {stride} x the patch size), a {option} that "
            f"divides both sides, num_landmarks='auto' or (mh, mw) for adaptive pooling, or "
            f"grid_remainder='floor' (official: border tokens are left out of the landmarks)"
        )
    return h // stride, w // stride


def adaptive_pool(g: torch.Tensor, out_hw: Tuple[int, int]) -> torch.Tensor:
    """``F.adaptive_avg_pool2d`` of a channels-first grid ``(B', C', H, W)``; while an ONNX export traces,
    the same windows as one product with the pooling matrix (:func:`vitmix.ops.avg_pool_landmarks`),
    since the TorchScript exporter has no adaptive pooling whose output does not divide the input."""
    if not exporting_to_onnx():
        return torch.nn.functional.adaptive_avg_pool2d(g, out_hw)
    b, c, h, w = g.shape
    pooled = avg_pool_landmarks(g.reshape(b, c, h * w, 1), (h, w), out_hw)    # (B', C', m, 1)
    return pooled.reshape(b, c, out_hw[0], out_hw[1])


# ------------------------------------------------------------------------------------- layouts
def grid_channels_first(t: torch.Tensor, prefix: int, h: int, w: int) -> torch.Tensor:
    """``(B, heads, P + H*W, d)`` → the grid tokens as ``(B*heads, d, H, W)``."""
    b, nh, _, d = t.shape
    return t[:, :, prefix:].reshape(b * nh, h, w, d).permute(0, 3, 1, 2)


def tokens_from_channels_first(t: torch.Tensor, b: int, nh: int) -> torch.Tensor:
    """``(B*heads, d, h, w)`` → ``(B, heads, h*w, d)``."""
    return t.flatten(2).transpose(1, 2).reshape(b, nh, -1, t.shape[1])


def head_conv(conv: nn.Conv2d, v: torch.Tensor, prefix: int, h: int, w: int) -> torch.Tensor:
    """SOFT's per-head local term: ``v (B, heads, N, d)`` → conv over ``(B*d, heads, H, W)``.

    Returns ``(B, heads, H*W, d)`` for the grid tokens.
    """
    b, nh, _, d = v.shape
    g = v[:, :, prefix:].reshape(b, nh, h, w, d).permute(0, 4, 1, 2, 3).reshape(b * d, nh, h, w)
    out = conv(g).reshape(b, d, nh, h * w)
    return out.permute(0, 2, 3, 1)


def add_to_grid(out: torch.Tensor, local: torch.Tensor, prefix: int, token_dim: int = 2) -> torch.Tensor:
    """``out`` plus ``local`` on the grid tokens only (the prefix tokens get no local term)."""
    if prefix == 0:
        return out + local
    head, grid = out.split([prefix, out.shape[token_dim] - prefix], dim=token_dim)
    return torch.cat([head, grid + local], dim=token_dim)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    b, nh, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, nh * d)


def split_heads(t: torch.Tensor, nh: int) -> torch.Tensor:
    b, n, c = t.shape
    return t.reshape(b, n, nh, c // nh).transpose(1, 2)


__all__ = [
    "DEFAULT_LANDMARK_GRID", "LandmarkCount", "add_to_grid", "grid_channels_first", "head_conv", "landmark_grid",
    "landmark_shape", "merge_heads", "split_heads", "tokens_from_channels_first",
]
