"""The per-sample depthwise convolution in PyTorch (private): the batch folded into channels for one grouped
convolution, its backward, and the ``k²``-tap export decomposition."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import _check_dw_args


def _fold(t: Tensor) -> Tensor:
    """``(B, C, H, W)`` → ``(1, B·C, H, W)`` with ``(H, W, B, C)`` memory (one copy at most)."""
    B, C, H, W = t.shape
    return t.permute(2, 3, 0, 1).reshape(1, H, W, B * C).permute(0, 3, 1, 2)


def _unfold(t: Tensor, B: int, C: int) -> Tensor:
    """Inverse of :func:`_fold`, as a channels-last ``(B, C, H, W)`` tensor."""
    H, W = t.shape[2:]
    y = t.permute(0, 2, 3, 1).reshape(H, W, B, C).permute(2, 3, 0, 1)
    return y.contiguous(memory_format=torch.channels_last)


def _dw_forward(x: Tensor, kernels: Tensor, bias: Optional[Tensor]) -> Tensor:
    B, C, _, _ = x.shape
    k = kernels.shape[2]
    if bias is not None:
        bias = bias.expand(B, C).reshape(B * C) if bias.dim() == 1 else bias.reshape(B * C)
    y = F.conv2d(_fold(x), kernels.reshape(B * C, 1, k, k), bias, padding=k // 2, groups=B * C)  # (1, BC, H, W)
    return _unfold(y, B, C)  # back to (B, C, H, W) with (B, H, W, C) memory: one copy


def _dw_grads(g: Tensor, x: Tensor, kernels: Tensor, bias: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dx, dkernels, dbias)`` of :func:`_dw_forward`: the grouped convolution's own backward on the
    folded tensors, so the gradients are those eager autograd computes (``dbias`` empty without bias)."""
    B, C, _, _ = x.shape
    k = kernels.shape[2]
    need_bias = bias is not None
    gx, gk, gb = torch.ops.aten.convolution_backward(
        _fold(g), _fold(x), kernels.reshape(B * C, 1, k, k), [B * C] if need_bias else None, [1, 1],
        [k // 2, k // 2], [1, 1], False, [0, 0], B * C, [True, True, need_bias])
    if not need_bias:
        gb = x.new_empty(0)
    elif bias.dim() == 1:
        gb = gb.view(B, C).sum(0)
    return _unfold(gx, B, C), gk.reshape(B, C, k, k).contiguous(), gb.reshape(bias.shape if need_bias else (0,))


def dynamic_depthwise_conv2d_taps(x: Tensor, kernels: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """:func:`dynamic_depthwise_conv2d` as ``k²`` shifted products of the zero-padded input (no grouped
    convolution: every op is elementwise or a slice, whatever the batch size). The export
    decomposition of the custom op; equal to the grouped convolution up to float rounding."""
    B, C, k = _check_dw_args(x, kernels, bias)
    H, W = x.shape[2:]
    r = k // 2
    xp = F.pad(x, (r, r, r, r))
    out = None
    for u in range(k):
        for v in range(k):
            term = kernels[:, :, u, v, None, None] * xp[:, :, u:u + H, v:v + W]
            out = term if out is None else out + term
    if bias is not None:
        out = out + (bias[None, :, None, None] if bias.dim() == 1 else bias[:, :, None, None])
    return out
