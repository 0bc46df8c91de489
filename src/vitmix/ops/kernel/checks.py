"""Argument checks and input preparation shared by the kernel-matrix functions and their references (private)."""
from __future__ import annotations

import math

import torch

from .._common import check_finite_float, compute_dtype


def _check_pair(name: str, x: torch.Tensor, y: torch.Tensor) -> None:
    check_finite_float(f"{name}: x", x)
    check_finite_float(f"{name}: y", y)
    if x.dim() < 2 or y.dim() < 2:
        raise ValueError(
            f"{name}: x and y need shape (..., N, d) and (..., M, d); got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"{name}: feature dims differ: x has d={x.shape[-1]}, y has d={y.shape[-1]}; both need the same "
            "last dimension (the per-head feature size)"
        )
    try:
        torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            f"{name}: leading (batch/head) dims of x {tuple(x.shape[:-2])} and y {tuple(y.shape[:-2])} do not "
            "broadcast"
        ) from err


def _work(x: torch.Tensor, y: torch.Tensor) -> int:
    """Multiply-adds of one kernel evaluation: batch·N·M·d."""
    return x.numel() * y.shape[-2]


def _prepare(x: torch.Tensor, y: torch.Tensor):
    dtype = compute_dtype(x, y)
    batch = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    x = x.to(dtype).expand(*batch, *x.shape[-2:])
    y = y.to(dtype).expand(*batch, *y.shape[-2:])
    return x, y


def _broadcast(x: torch.Tensor, y: torch.Tensor):
    """``x``, ``y`` with common leading dims (views); one dtype (the compute dtype when they differ)."""
    if x.dtype != y.dtype:
        x, y = x.to(compute_dtype(x, y)), y.to(compute_dtype(x, y))
    batch = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    return x.expand(*batch, *x.shape[-2:]), y.expand(*batch, *y.shape[-2:])


def _check_lam(lam) -> float:
    try:
        lam_f = float(lam)
    except (TypeError, ValueError) as err:
        raise ValueError(f"lam must be a positive number, got {lam!r}") from err
    if not (lam_f > 0 and math.isfinite(lam_f)):
        raise ValueError(f"lam must be a positive finite number (the kernel width, default 4.0), got {lam!r}")
    return lam_f
