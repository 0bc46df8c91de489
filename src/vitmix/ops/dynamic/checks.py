"""Argument checks of the dynamic-weight ops and their references (private)."""
from __future__ import annotations

from typing import Optional

from torch import Tensor


def _check_linear_args(x, weight, bias, p, q, w1, w2):
    def shape(t):
        return tuple(t.shape)
    if x.dim() != 3:
        raise ValueError(f"x must be (B, N, C_in) tokens, got shape {shape(x)}")
    B, N, c_in = x.shape
    if weight.dim() != 2 or weight.shape[0] != c_in:
        raise ValueError(f"weight must be (C_in={c_in}, C_out) in (in, out) layout, got {shape(weight)}"
                         " (an nn.Linear weight is (out, in): pass weight.T)")
    c_out = weight.shape[1]
    if bias is not None and shape(bias) != (c_out,):
        raise ValueError(f"bias must be ({c_out},), got {shape(bias)}")
    if p.dim() != 3 or q.dim() != 3 or p.shape[:2] != q.shape[:2] or p.shape[0] != B:
        raise ValueError(f"p and q must be (B={B}, M, R) with the same B and M, got {shape(p)} and {shape(q)}")
    if w1.dim() != 2 or w1.shape != (p.shape[2], c_in):
        raise ValueError(f"w1 must be (R_in={p.shape[2]}, C_in={c_in}), got {shape(w1)}")
    if w2.dim() != 2 or w2.shape != (q.shape[2], c_out):
        raise ValueError(f"w2 must be (R_out={q.shape[2]}, C_out={c_out}), got {shape(w2)}")
    return B, N, c_in, c_out, p.shape[1], p.shape[2], q.shape[2]


def _check_dw_args(x: Tensor, kernels: Tensor, bias: Optional[Tensor]):
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W), got shape {tuple(x.shape)}")
    B, C = x.shape[:2]
    if kernels.dim() != 4 or kernels.shape[:2] != (B, C) or kernels.shape[2] != kernels.shape[3]:
        raise ValueError(f"kernels must be (B={B}, C={C}, k, k) with k odd, got {tuple(kernels.shape)}")
    if kernels.shape[2] % 2 == 0:
        raise ValueError(f"kernel size must be odd for 'same' padding, got {kernels.shape[2]}")
    if bias is not None and tuple(bias.shape) not in ((C,), (B, C)):
        raise ValueError(f"bias must be (C={C},) or (B={B}, C={C}), got {tuple(bias.shape)}")
    return B, C, kernels.shape[2]
