"""WeightFormer's layers, shared by the classifier (:mod:`~vitmix.models.weightformer`) and WeightFormer-DiT
(:mod:`~vitmix.models.dit`) (private): the dynamic linear and depthwise convolution, the MLP with the
oneDNN inference path (:mod:`~vitmix.models._onednn`), and the token ↔ channels-last grid views.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from ..ops.dynamic import (
    DYNAMIC_LINEAR_PATHS,
    choose_dynamic_linear_path,
    dynamic_depthwise_conv2d,
    dynamic_linear,
    dynamic_linear_delta,
    normalize_kernels,
    pool_tokens_2x2,
)
from . import _onednn

def is_dynamic_block(index: int, every: int = 3) -> bool:
    """Whether block ``index`` (0-based) is dynamic: ``(index + 2) % 3 == 0`` in the official model."""
    return (index + 2) % every == 0


def _square_grid(n: int) -> Tuple[int, int]:
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"{n} tokens are not a square grid; pass hw=(H, W) explicitly")
    return side, side


def check_tokens(x: Tensor, hw: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """The ``(H, W)`` grid of tokens ``x (B, N, C)``: ``hw`` checked against N, else a square."""
    if x.dim() != 3:
        raise ValueError(f"expected tokens (B, N, C), got a {x.dim()}-D tensor of shape {tuple(x.shape)}")
    if hw is None:
        return _square_grid(x.shape[1])
    H, W = int(hw[0]), int(hw[1])
    if H * W != x.shape[1]:
        raise ValueError(f"token grid {H}x{W} = {H * W} does not match {x.shape[1]} tokens")
    return H, W


def grid_view(x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """``(B, H·W, C)`` tokens as a channels-last ``(B, C, H, W)`` view (no copy)."""
    B, _, C = x.shape
    return x.view(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def to_tokens(y: Tensor) -> Tensor:
    """``(B, C, H, W)`` back to ``(B, H·W, C)`` tokens (a view when ``y`` is channels-last)."""
    return y.permute(0, 2, 3, 1).reshape(y.shape[0], -1, y.shape[1])


class DynamicLinear(nn.Module):
    """Linear layer with a per-sample weight ``W0 + ΔW(x)`` ("bilateral activation").

    ``ΔW`` is predicted from a 2×2-average-pooled copy of the token grid: one predictor linear gives
    both branch codes ``[P | Q]``, each goes through SiLU and its expansion matrix, and their product
    ``Aᵀ Bm`` (rank ≤ ``in_features / reduction``) is scaled by ``in_features**-0.5 / N`` (N the full
    token count) and normalised per output column, ``ΔW_j / (‖ΔW_j‖ + 1)``.
    See :func:`vitmix.ops.dynamic.dynamic_linear` for the evaluation paths.

    Args:
        in_features, out_features: widths (``out_features`` defaults to ``in_features``).
        reduction: branch width divisor ``r`` (official 4): ``P`` has ``in/r``, ``Q`` ``out/r`` columns.
        odd_pool: ``"ceil"`` (default; odd rows/columns pooled in smaller, area-weighted windows so
            every token contributes) or ``"floor"`` (official ``AvgPool2d(2)``, drops them).
        path: ``"auto"`` | ``"dense"`` | ``"core"`` | ``"lowrank"`` (equal results, different cost).

    Shapes: ``forward(x (B, N, in), hw=(H, W))`` → ``(B, N, out)``; ``hw`` defaults to a square grid.
    Parameters keep the official layouts: ``weight`` is ``(in, out)`` (transpose of ``nn.Linear``).
    """

    def __init__(self, in_features: int, out_features: Optional[int] = None, reduction: int = 4,
                 odd_pool: str = "ceil", path: str = "auto"):
        super().__init__()
        out_features = out_features or in_features
        if in_features % reduction or out_features % reduction:
            raise ValueError(f"in_features={in_features} and out_features={out_features} must be "
                             f"divisible by reduction={reduction}")
        if path not in DYNAMIC_LINEAR_PATHS:
            raise ValueError(f"path must be one of {DYNAMIC_LINEAR_PATHS}, got {path!r}")
        if odd_pool not in ("ceil", "floor"):
            raise ValueError(f"odd_pool must be 'ceil' or 'floor', got {odd_pool!r}")
        self.in_features, self.out_features, self.reduction = in_features, out_features, reduction
        self.odd_pool, self.path = odd_pool, path
        self.r_in, self.r_out = in_features // reduction, out_features // reduction
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.predictor = nn.Linear(in_features, self.r_in + self.r_out)
        self.expand_in = nn.Parameter(torch.empty(self.r_in, in_features))
        self.expand_out = nn.Parameter(torch.empty(self.r_out, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: truncated normal (std 0.02) for the static weight, the bias, the expansion
        matrices and the predictor weight; zero predictor bias."""
        for p in (self.weight, self.bias, self.expand_in, self.expand_out, self.predictor.weight):
            trunc_normal_(p, std=0.02)
        nn.init.zeros_(self.predictor.bias)

    def forward(self, x: Tensor, hw: Optional[Tuple[int, int]] = None) -> Tensor:
        p, q = self.branch_codes(x, hw)
        return dynamic_linear(x, self.weight, self.bias, p, q, self.expand_in, self.expand_out, path=self.path)

    def branch_codes(self, x: Tensor, hw: Optional[Tuple[int, int]] = None) -> Tuple[Tensor, Tensor]:
        """The activated codes ``SiLU(P)`` (rows weighted by window area on odd grids) and ``SiLU(Q)``."""
        hw = check_tokens(x, hw)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected {self.in_features} input features, got {x.shape[-1]}")
        pooled, window_weights = pool_tokens_2x2(x, hw, self.odd_pool)
        p, q = self.predictor(pooled).split([self.r_in, self.r_out], dim=-1)
        p, q = F.silu(p), F.silu(q)
        if window_weights is not None:
            p = p * window_weights.to(p.dtype)[:, None]
        return p, q

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, reduction={self.reduction}, "
                f"odd_pool={self.odd_pool!r}, path={self.path!r}")


def _adaptive_avg_pool_by_slices(x: Tensor, k: int) -> Tensor:
    """``F.adaptive_avg_pool2d(x, k)`` as ``k²`` window means (the same windows): for ``torch.jit.trace``,
    whose ONNX exporter pools only to sizes that divide the input."""
    def windows(n: int):
        return [((i * n) // k, -((-(i + 1) * n) // k)) for i in range(k)]   # floor(i·n/k), ceil((i+1)·n/k)
    rows, cols = windows(int(x.shape[-2])), windows(int(x.shape[-1]))
    means = [x[..., a:b, c:d].mean((-2, -1)) for a, b in rows for c, d in cols]
    return torch.stack(means, dim=-1).unflatten(-1, (k, k))


class DynamicDepthwiseConv(nn.Module):
    """Depthwise k×k convolution whose kernels are predicted per sample ("spatially adaptive").

    The input is average-pooled to ``k × k`` (adaptive), a shared channel MLP (1×1 conv → GELU →
    1×1 conv without bias) turns pooled region (u, v) into kernel tap (u, v) for every channel, each
    predicted kernel is normalised ``K / (‖K‖_F + 1)`` and added to the static kernel; the result is
    applied with one grouped convolution over the whole batch (bias shared, 'same' padding).

    Shapes: ``forward(x (B, C, H, W))`` → ``(B, C, H, W)`` (channels-last memory).
    Parameters keep the official shapes: ``weight`` ``(C, 1, k, k)``, ``bias`` ``(C,)``.
    """

    def __init__(self, dim: int, kernel_size: int = 3):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.dim, self.kernel_size = dim, kernel_size
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(dim))
        self.predictor = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=1), nn.GELU(), nn.Conv2d(dim, dim, kernel_size=1, bias=False))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: truncated normal (std 0.02) for the static kernel and bias; the predictor's
        1×1 convs keep PyTorch's default init."""
        trunc_normal_(self.weight, std=0.02)
        trunc_normal_(self.bias, std=0.02)

    def predict_kernels(self, x: Tensor) -> Tensor:
        """The per-sample kernels ``W0 + normalised ΔK`` of shape ``(B, C, k, k)``."""
        k, C = self.kernel_size, self.dim
        pool = _adaptive_avg_pool_by_slices if torch.jit.is_tracing() else F.adaptive_avg_pool2d
        pooled = pool(x, k).flatten(2).transpose(1, 2)  # B, k·k, C
        # the 1×1 convs as linears over the k·k pooled regions: same math, one GEMM each instead
        # of a convolution on a 3×3 image (which is slow on CPU)
        conv1, act, conv2 = self.predictor
        h = act(F.linear(pooled, conv1.weight.view(C, C), conv1.bias))
        delta = F.linear(h, conv2.weight.view(C, C)).transpose(1, 2).reshape(-1, C, k, k)
        return normalize_kernels(delta) + self.weight.view(1, C, k, k)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(f"expected (B, {self.dim}, H, W), got shape {tuple(x.shape)}")
        return dynamic_depthwise_conv2d(x, self.predict_kernels(x), self.bias)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}"


class WeightFormerMlp(nn.Module):
    """fc1 (static or :class:`DynamicLinear`) → GELU → dropout → fc2 → dropout.

    Inference fast path (float32 CPU, no grad, no autocast, exact or tanh GELU, inactive dropout):
    each linear is one oneDNN primitive with the bias and the GELU fused into it, so the
    ``(B, N, 4C)`` hidden is written once and never re-read for the bias or the activation; the
    dynamic layer forms its per-sample ``W0 + ΔW`` and runs fc1 → GELU → fc2 one sample at a time
    (measured gains: ``docs/weightformer.md``).
    Same results up to float32 rounding (tested); training and other dtypes take the plain path.
    """

    def __init__(self, dim: int, hidden: int, dynamic: bool, act_layer: Callable, drop: float,
                 odd_pool: str, linear_path: str):
        super().__init__()
        self.dynamic = dynamic
        if dynamic:
            self.fc1 = DynamicLinear(dim, hidden, odd_pool=odd_pool, path=linear_path)
        else:
            self.fc1 = nn.Linear(dim, hidden)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)
        self.fused_inference = True

    def _fast_ok(self, x: Tensor) -> bool:
        return (self.fused_inference and isinstance(self.act, nn.GELU) and self.act.approximate in ("none", "tanh")
                and (not self.training or (self.drop1.p == 0 and self.drop2.p == 0)) and _onednn.applies(x))

    def _dynamic_weight(self, x: Tensor, hw: Tuple[int, int]) -> Optional[Tensor]:
        """Per-sample ``(B, out, in)`` weight of the dynamic fc1, or ``None`` on the low-rank path."""
        fc1 = self.fc1
        p, q = fc1.branch_codes(x, hw)
        N, M = x.shape[1], p.shape[1]
        path = fc1.path
        if path == "auto":
            path = choose_dynamic_linear_path(N, M, fc1.in_features, fc1.out_features, fc1.r_in, fc1.r_out)
        if path == "lowrank":
            return None
        delta = dynamic_linear_delta(p, q, fc1.expand_in, fc1.expand_out, fc1.in_features ** -0.5 / N, path)
        return (delta + fc1.weight).transpose(1, 2)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        if self._fast_ok(x):
            gelu = self.act.approximate
            if not self.dynamic:
                h = _onednn.fused_linear(x, self.fc1.weight, self.fc1.bias, gelu)
                return _onednn.fused_linear(h, self.fc2.weight, self.fc2.bias)
            w = self._dynamic_weight(x, hw)
            if w is not None:  # one sample at a time: only one sample's (N, 4C) hidden is alive
                fc2 = self.fc2
                return torch.stack([
                    _onednn.fused_linear(_onednn.fused_linear(x[i], w[i], self.fc1.bias, gelu), fc2.weight, fc2.bias)
                    for i in range(x.shape[0])])
        x = self.fc1(x, hw) if self.dynamic else self.fc1(x)
        if isinstance(self.act, nn.GELU) and not (torch.is_grad_enabled() and x.requires_grad):
            # inference: GELU in place, so the (B, N, 4C) hidden exists once, not twice
            x = torch.ops.aten.gelu_(x, approximate=self.act.approximate)
        else:
            x = self.act(x)
        x = self.fc2(self.drop1(x))  # one name for the hidden, so fc1's output is freed early
        return self.drop2(x)


__all__ = ["DynamicDepthwiseConv", "DynamicLinear", "WeightFormerMlp", "check_tokens", "grid_view",
           "is_dynamic_block", "to_tokens"]
