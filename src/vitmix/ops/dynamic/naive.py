"""Obviously-correct references of the dynamic-weight ops: one sample at a time, explicit weights."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import _check_dw_args, _check_linear_args


def dynamic_linear_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor], p: Tensor, q: Tensor,
                             w1: Tensor, w2: Tensor, *, scale: Optional[float] = None) -> Tensor:
    """Obviously-correct :func:`dynamic_linear`: one sample at a time, explicit ΔW and column norms."""
    B, N, c_in, c_out, *_ = _check_linear_args(x, weight, bias, p, q, w1, w2)
    if scale is None:
        scale = c_in ** -0.5 / N
    outs = []
    for i in range(B):
        a = p[i] @ w1
        bm = q[i] @ w2
        delta = scale * (a.t() @ bm)  # C_in × C_out
        norms = (delta * delta).sum(dim=0).sqrt()  # one per output column
        w = weight + delta / (norms + 1.0)
        y = x[i] @ w
        outs.append(y if bias is None else y + bias)
    return torch.stack(outs)


def dynamic_depthwise_conv2d_reference(x: Tensor, kernels: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """Obviously-correct :func:`dynamic_depthwise_conv2d`: a depthwise ``conv2d`` per sample."""
    B, C, k = _check_dw_args(x, kernels, bias)
    outs = []
    for i in range(B):
        b = None if bias is None else (bias if bias.dim() == 1 else bias[i])
        outs.append(F.conv2d(x[i:i + 1], kernels[i].unsqueeze(1), b, padding=k // 2, groups=C))
    return torch.cat(outs)
