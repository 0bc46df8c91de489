"""Pairwise kernel matrices: Gaussian (SOFT) and Laplacian (LaplacianFormer).

``gaussian_kernel(x, y)[..., i, j] = exp(-||x_i - y_j||_2^2 / 2)`` and
``laplacian_kernel(x, y, lam)[..., i, j] = exp(-||x_i - y_j||_1 / lam)`` for ``x: (..., N, d)``,
``y: (..., M, d)`` (leading dimensions broadcast). Each has an obviously-correct ``*_reference``
that broadcasts the ``(..., N, M, d)`` difference tensor, and a fast path:

* the fast paths save only ``x``, ``y`` and the output (``N×M``), never an ``N×M×d`` tensor: eager calls
  run custom ``autograd.Function``s; under ``torch.compile`` / ``torch.export`` the same forward and
  backward functions run as the custom ops ``vitmix::gaussian_kernel`` / ``vitmix::laplacian_kernel``
  and their ``*_backward`` ops (:func:`vitmix.ops._common.traced`; fake implementations give the shapes);
* Gaussian: the squared distance comes from the GEMM expansion ``|x|^2 + |y|^2 - 2 x·y``, clamped at
  ``>= 0`` (rounding can make it slightly negative); the backward is two GEMMs;
* Laplacian: the L1 distance and its backward run in :mod:`vitmix.ops._l1` (an OpenMP C kernel on
  CPU, built on first use in about a second and cached; ``cdist`` / a chunked loop elsewhere); gradient of ``|t|`` uses
  ``sign(0) = 0`` like the official CUDA operator.

Numerics: half-precision (``float16``/``bfloat16``) inputs are computed in float32 with autocast
disabled, and the result is returned **in float32** (kernel values feed inverses and normalisers
that must stay in float32); float64 stays float64.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
from torch.autograd.function import once_differentiable

from . import _l1
from ._common import check_finite_float, compute_dtype, no_autocast, single_thread_if_small, traced

__all__ = ["gaussian_kernel", "gaussian_kernel_reference", "laplacian_kernel", "laplacian_kernel_reference"]


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


# ----------------------------------------------------------------------------------------- Gaussian
def _gaussian_forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``exp(-||x_i - y_j||² / 2)`` from the GEMM expansion, without autograd."""
    with torch.no_grad(), single_thread_if_small(x, _work(x, y)):
        sq = torch.matmul(x, y.mT).mul_(-2.0)
        sq.add_(x.square().sum(-1, keepdim=True)).add_(y.square().sum(-1).unsqueeze(-2))
        return sq.clamp_min_(0.0).mul_(-0.5).exp_()


def _gaussian_grads(g, x, y, out, need_x: bool = True, need_y: bool = True):
    """``(dL/dx, dL/dy)`` from ``g = dL/dout`` (differentiable: the eager path supports double backward)."""
    with no_autocast(g.device.type), single_thread_if_small(x, _work(x, y)):
        # d out_ij / d x_i = -out_ij (x_i - y_j); W = g * out
        w = g * out
        gx = gy = None
        if need_x:
            gx = torch.matmul(w, y) - w.sum(-1, keepdim=True) * x
        if need_y:
            gy = torch.matmul(w.mT, x) - w.sum(-2).unsqueeze(-1) * y
    return gx, gy


class _GaussianKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        out = _gaussian_forward(x, y)
        ctx.save_for_backward(x, y, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y, out = ctx.saved_tensors
        return _gaussian_grads(g, x, y, out, *ctx.needs_input_grad[:2])


@torch.library.custom_op("vitmix::gaussian_kernel", mutates_args=())
def _gaussian_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gaussian kernel matrix of same-batch ``x (..., N, d)``, ``y (..., M, d)`` (one dtype)."""
    return _gaussian_forward(x, y).contiguous()


@torch.library.custom_op("vitmix::gaussian_kernel_backward", mutates_args=())
def _gaussian_backward_op(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                          out: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`_gaussian_op` w.r.t. ``x`` and ``y``."""
    with torch.no_grad():
        gx, gy = _gaussian_grads(g, x, y, out)
    return gx.contiguous(), gy.contiguous()


@_gaussian_op.register_fake
def _(x, y):
    return x.new_empty(*x.shape[:-1], y.shape[-2])


@_gaussian_backward_op.register_fake
def _(g, x, y, out):
    return x.new_empty(x.shape), y.new_empty(y.shape)


def _gaussian_decomposition(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Export decomposition of ``vitmix::gaussian_kernel``: the forward's GEMM expansion, out of place."""
    sq = torch.matmul(x, y.mT).mul(-2.0).add(x.square().sum(-1, keepdim=True)).add(y.square().sum(-1).unsqueeze(-2))
    return sq.clamp_min(0.0).mul(-0.5).exp()


def _save_pair(ctx, inputs, output):
    """Autograd context of both kernel ops: ``x``, ``y``, the output (and ``lam`` of the Laplacian)."""
    ctx.save_for_backward(inputs[0], inputs[1], output)
    ctx.lam = inputs[2] if len(inputs) > 2 else None


def _gaussian_op_grad(ctx, g):
    x, y, out = ctx.saved_tensors
    return _gaussian_backward_op(g, x, y, out)


_gaussian_op.register_autograd(_gaussian_op_grad, setup_context=_save_pair)


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gaussian kernel matrix ``exp(-||x_i - y_j||^2 / 2)``.

    Args:
        x: ``(..., N, d)``; y: ``(..., M, d)``; leading dims broadcast.
    Returns:
        ``(..., N, M)``, float32 for half inputs (see the module docstring), else the input dtype.

    The squared distance uses the GEMM expansion clamped at 0; the custom backward keeps only
    ``x``, ``y`` and the output and differentiates the exact distance (``2(x_i - y_j)``).
    """
    _check_pair("gaussian_kernel", x, y)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        return _gaussian_op(xs, ys) if traced() else _GaussianKernel.apply(xs, ys)


def gaussian_kernel_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Reference Gaussian kernel: broadcasts the ``(..., N, M, d)`` difference (O(N·M·d) memory)."""
    _check_pair("gaussian_kernel_reference", x, y)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        diff = xs.unsqueeze(-2) - ys.unsqueeze(-3)
        return torch.exp(-0.5 * diff.square().sum(-1))


# ---------------------------------------------------------------------------------------- Laplacian
def _laplacian_forward(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    with torch.no_grad(), single_thread_if_small(x, _work(x, y)):
        return _l1.laplace_forward(x, y, lam)


def _laplacian_grads(g, x, y, out, lam: float):
    with torch.no_grad(), no_autocast(g.device.type), single_thread_if_small(x, _work(x, y)):
        # d out / d dist = -out / lam
        gd = (g * out).mul_(-1.0 / lam)
        return _l1.l1_backward(gd, x, y)


class _LaplacianKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, lam):
        out = _laplacian_forward(x, y, lam)
        ctx.save_for_backward(x, y, out)
        ctx.lam = lam
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, y, out = ctx.saved_tensors
        gx, gy = _laplacian_grads(g, x, y, out, ctx.lam)
        return (gx if ctx.needs_input_grad[0] else None), (gy if ctx.needs_input_grad[1] else None), None


@torch.library.custom_op("vitmix::laplacian_kernel", mutates_args=())
def _laplacian_op(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Laplacian kernel matrix of same-batch ``x``, ``y`` (the C kernel on CPU, see :mod:`vitmix.ops._l1`)."""
    return _laplacian_forward(x, y, lam).contiguous()


@torch.library.custom_op("vitmix::laplacian_kernel_backward", mutates_args=())
def _laplacian_backward_op(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor,
                           lam: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`_laplacian_op` w.r.t. ``x`` and ``y`` (``sign(0) = 0``)."""
    gx, gy = _laplacian_grads(g, x, y, out, lam)
    return gx.contiguous(), gy.contiguous()


@_laplacian_op.register_fake
def _(x, y, lam):
    return x.new_empty(*x.shape[:-1], y.shape[-2])


@_laplacian_backward_op.register_fake
def _(g, x, y, out, lam):
    return x.new_empty(x.shape), y.new_empty(y.shape)


def _laplacian_decomposition(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Export decomposition of ``vitmix::laplacian_kernel``: the broadcast ``(..., N, M, d)`` L1 distance
    of the reference (memory N·M·d, fine for inference; every op is elementwise or a reduction)."""
    return torch.exp(-(x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1) / lam)


def _laplacian_op_grad(ctx, g):
    x, y, out = ctx.saved_tensors
    gx, gy = _laplacian_backward_op(g, x, y, out, ctx.lam)
    return gx, gy, None


_laplacian_op.register_autograd(_laplacian_op_grad, setup_context=_save_pair)


def _check_lam(lam) -> float:
    try:
        lam_f = float(lam)
    except (TypeError, ValueError) as err:
        raise ValueError(f"lam must be a positive number, got {lam!r}") from err
    if not (lam_f > 0 and math.isfinite(lam_f)):
        raise ValueError(f"lam must be a positive finite number (the kernel width, default 4.0), got {lam!r}")
    return lam_f


def laplacian_kernel(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0) -> torch.Tensor:
    """Laplacian kernel matrix ``exp(-||x_i - y_j||_1 / lam)``.

    Args:
        x: ``(..., N, d)``; y: ``(..., M, d)``; leading dims broadcast.
        lam: kernel width λ > 0 (LaplacianFormer uses 4).
    Returns:
        ``(..., N, M)``, float32 for half inputs, else the input dtype.

    The forward and backward never hold an ``N×M×d`` tensor (only ``x``, ``y`` and the output are
    saved); the L1 gradient uses ``sign(0) = 0``. On CPU the loops run in a small C kernel (see
    :mod:`vitmix.ops._l1`; ``VITMIX_DISABLE_C_KERNEL=1`` uses PyTorch's ``cdist`` instead).
    """
    _check_pair("laplacian_kernel", x, y)
    lam_f = _check_lam(lam)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        return _laplacian_op(xs, ys, lam_f) if traced() else _LaplacianKernel.apply(xs, ys, lam_f)


def laplacian_kernel_reference(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0) -> torch.Tensor:
    """Reference Laplacian kernel: broadcasts the ``(..., N, M, d)`` difference, autograd through ``abs``."""
    _check_pair("laplacian_kernel_reference", x, y)
    lam_f = _check_lam(lam)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        diff = xs.unsqueeze(-2) - ys.unsqueeze(-3)
        return torch.exp(-diff.abs().sum(-1) / lam_f)
