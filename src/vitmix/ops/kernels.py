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

* Triton (``backend="auto"`` on CUDA tensors, or ``backend="triton"``; :mod:`vitmix.ops._triton_kernels`):
  one tiled kernel for the forward and one for each gradient, float32/float16/bfloat16 inputs read
  directly and computed in float32; float64 and other unsupported inputs fall back to the paths above
  with a one-time warning (:mod:`vitmix.ops._triton`; ``docs/gpu.md``). The custom ops carry ``backend``
  in their schemas, so compiled code chooses the same way when it runs.

Numerics: half-precision (``float16``/``bfloat16``) inputs are computed in float32 with autocast
disabled, and the result is returned **in float32** (kernel values feed inverses and normalisers
that must stay in float32); float64 stays float64.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _l1
from ._common import (
    check_finite_float, compute_dtype, exporting_to_onnx, no_autocast, single_thread_if_small, traced,
)
from ._triton import check_backend, wants_triton

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


# ------------------------------------------------------------------------------------------- Triton
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _triton_unsupported(x: torch.Tensor, y: torch.Tensor) -> Optional[str]:
    """Why the Triton kernels cannot take ``x``, ``y`` (``None`` when they can)."""
    for t in (x, y):
        if t.dtype not in _TRITON_DTYPES:
            return (f"dtype {t.dtype} (the Triton kernel-matrix kernels take float32, float16 and bfloat16 and "
                    "compute in float32)")
    return None


def _use_triton(name: str, x: torch.Tensor, y: torch.Tensor, backend: str) -> bool:
    """Whether this call runs the Triton kernels. Never under a Python dispatch mode (``FlopCounterMode``,
    ``MemTracker``): those see and count only the PyTorch path, as for the C kernels."""
    if backend != "torch" and _get_current_dispatch_mode() is not None:
        return False
    return wants_triton(name, x, backend, _triton_unsupported(x, y))


def _triton_kernels():
    from . import _triton_kernels

    return _triton_kernels


def _broadcast(x: torch.Tensor, y: torch.Tensor):
    """``x``, ``y`` with common leading dims (views); one dtype (the compute dtype when they differ)."""
    if x.dtype != y.dtype:
        x, y = x.to(compute_dtype(x, y)), y.to(compute_dtype(x, y))
    batch = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    return x.expand(*batch, *x.shape[-2:]), y.expand(*batch, *y.shape[-2:])


def _pair_kernel(name: str, kind: str, x, y, lam: float, backend: str, eager_fn, op_fn, decomposition):
    """The dispatch both kernel functions share: the custom op while traced (it chooses the back end when
    the compiled code runs), the Triton ``autograd.Function`` on raw (half too) inputs, else ``eager_fn``;
    while an ONNX export traces, the op's export ``decomposition`` (same arguments as ``op_fn``)."""
    with no_autocast(x.device.type):
        if exporting_to_onnx():
            return decomposition(*_prepare(x, y), backend)
        if traced():
            return op_fn(*_prepare(x, y), backend)
        if _use_triton(name, x, y, backend):
            return _triton_kernels().TritonPairKernel.apply(*_broadcast(x, y), kind, lam)
        return eager_fn(*_prepare(x, y))


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
def _gaussian_op(x: torch.Tensor, y: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Gaussian kernel matrix of same-batch ``x (..., N, d)``, ``y (..., M, d)`` (one dtype)."""
    if _use_triton("gaussian_kernel", x, y, backend):
        return _triton_kernels().kernel_forward("gaussian", x, y).to(x.dtype)
    return _gaussian_forward(x, y).contiguous()


@torch.library.custom_op("vitmix::gaussian_kernel_backward", mutates_args=())
def _gaussian_backward_op(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor,
                          backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`_gaussian_op` w.r.t. ``x`` and ``y``."""
    with torch.no_grad():
        if _use_triton("gaussian_kernel", x, y, backend):
            gx, gy = _triton_kernels().kernel_grads("gaussian", g, x, y, out)
        else:
            gx, gy = _gaussian_grads(g, x, y, out)
    return gx.contiguous(), gy.contiguous()


@_gaussian_op.register_fake
def _(x, y, backend="auto"):
    return x.new_empty(*x.shape[:-1], y.shape[-2])


@_gaussian_backward_op.register_fake
def _(g, x, y, out, backend="auto"):
    return x.new_empty(x.shape), y.new_empty(y.shape)


def _gaussian_decomposition(x: torch.Tensor, y: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Export decomposition of ``vitmix::gaussian_kernel``: the forward's GEMM expansion, out of place."""
    sq = torch.matmul(x, y.mT).mul(-2.0).add(x.square().sum(-1, keepdim=True)).add(y.square().sum(-1).unsqueeze(-2))
    return sq.clamp_min(0.0).mul(-0.5).exp()


def _save_pair(ctx, inputs, output):
    """Autograd context of both kernel ops: ``x``, ``y``, the output, the back end (and the Laplacian's ``lam``)."""
    ctx.save_for_backward(inputs[0], inputs[1], output)
    ctx.backend = inputs[-1]
    ctx.lam = inputs[2] if len(inputs) > 3 else None


def _gaussian_op_grad(ctx, g):
    x, y, out = ctx.saved_tensors
    gx, gy = _gaussian_backward_op(g, x, y, out, ctx.backend)
    return gx, gy, None


_gaussian_op.register_autograd(_gaussian_op_grad, setup_context=_save_pair)


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Gaussian kernel matrix ``exp(-||x_i - y_j||^2 / 2)``.

    Args:
        x: ``(..., N, d)``; y: ``(..., M, d)``; leading dims broadcast.
        backend: ``"auto"`` (Triton for CUDA tensors), ``"triton"`` or ``"torch"`` (see ``docs/gpu.md``).
    Returns:
        ``(..., N, M)``, float32 for half inputs (see the module docstring), else the input dtype.

    The PyTorch path takes the squared distance from the GEMM expansion clamped at 0, the Triton
    kernel sums the exact squared differences; both backwards keep only ``x``, ``y`` and the output
    and differentiate the exact distance (``2(x_i - y_j)``).
    """
    _check_pair("gaussian_kernel", x, y)
    check_backend("gaussian_kernel", backend)
    return _pair_kernel("gaussian_kernel", "gaussian", x, y, 1.0, backend, _GaussianKernel.apply, _gaussian_op,
                        _gaussian_decomposition)


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
def _laplacian_op(x: torch.Tensor, y: torch.Tensor, lam: float, backend: str = "auto") -> torch.Tensor:
    """Laplacian kernel matrix of same-batch ``x``, ``y`` (the C kernel on CPU, see :mod:`vitmix.ops._l1`)."""
    if _use_triton("laplacian_kernel", x, y, backend):
        return _triton_kernels().kernel_forward("laplacian", x, y, lam).to(x.dtype)
    return _laplacian_forward(x, y, lam).contiguous()


@torch.library.custom_op("vitmix::laplacian_kernel_backward", mutates_args=())
def _laplacian_backward_op(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor,
                           lam: float, backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`_laplacian_op` w.r.t. ``x`` and ``y`` (``sign(0) = 0``)."""
    if _use_triton("laplacian_kernel", x, y, backend):
        with torch.no_grad():
            gx, gy = _triton_kernels().kernel_grads("laplacian", g, x, y, out, lam)
    else:
        gx, gy = _laplacian_grads(g, x, y, out, lam)
    return gx.contiguous(), gy.contiguous()


@_laplacian_op.register_fake
def _(x, y, lam, backend="auto"):
    return x.new_empty(*x.shape[:-1], y.shape[-2])


@_laplacian_backward_op.register_fake
def _(g, x, y, out, lam, backend="auto"):
    return x.new_empty(x.shape), y.new_empty(y.shape)


def _laplacian_decomposition(x: torch.Tensor, y: torch.Tensor, lam: float, backend: str = "auto") -> torch.Tensor:
    """Export decomposition of ``vitmix::laplacian_kernel``: the broadcast ``(..., N, M, d)`` L1 distance
    of the reference (memory N·M·d, fine for inference; every op is elementwise or a reduction)."""
    return torch.exp(-(x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1) / lam)


def _laplacian_op_grad(ctx, g):
    x, y, out = ctx.saved_tensors
    gx, gy = _laplacian_backward_op(g, x, y, out, ctx.lam, ctx.backend)
    return gx, gy, None, None


_laplacian_op.register_autograd(_laplacian_op_grad, setup_context=_save_pair)


def _check_lam(lam) -> float:
    try:
        lam_f = float(lam)
    except (TypeError, ValueError) as err:
        raise ValueError(f"lam must be a positive number, got {lam!r}") from err
    if not (lam_f > 0 and math.isfinite(lam_f)):
        raise ValueError(f"lam must be a positive finite number (the kernel width, default 4.0), got {lam!r}")
    return lam_f


def laplacian_kernel(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0, backend: str = "auto") -> torch.Tensor:
    """Laplacian kernel matrix ``exp(-||x_i - y_j||_1 / lam)``.

    Args:
        x: ``(..., N, d)``; y: ``(..., M, d)``; leading dims broadcast.
        lam: kernel width λ > 0 (LaplacianFormer uses 4).
        backend: ``"auto"`` (Triton for CUDA tensors), ``"triton"`` or ``"torch"`` (see ``docs/gpu.md``).
    Returns:
        ``(..., N, M)``, float32 for half inputs, else the input dtype.

    The forward and backward never hold an ``N×M×d`` tensor (only ``x``, ``y`` and the output are
    saved); the L1 gradient uses ``sign(0) = 0``. On CPU the loops run in a small C kernel (see
    :mod:`vitmix.ops._l1`; ``VITMIX_DISABLE_C_KERNEL=1`` uses PyTorch's ``cdist`` instead), on CUDA
    in the Triton kernels.
    """
    _check_pair("laplacian_kernel", x, y)
    lam_f = _check_lam(lam)
    check_backend("laplacian_kernel", backend)
    return _pair_kernel("laplacian_kernel", "laplacian", x, y, lam_f, backend,
                        lambda a, b: _LaplacianKernel.apply(a, b, lam_f),
                        lambda a, b, be: _laplacian_op(a, b, lam_f, be),
                        lambda a, b, be: _laplacian_decomposition(a, b, lam_f, be))


def laplacian_kernel_reference(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0) -> torch.Tensor:
    """Reference Laplacian kernel: broadcasts the ``(..., N, M, d)`` difference, autograd through ``abs``."""
    _check_pair("laplacian_kernel_reference", x, y)
    lam_f = _check_lam(lam)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        diff = xs.unsqueeze(-2) - ys.unsqueeze(-3)
        return torch.exp(-diff.abs().sum(-1) / lam_f)
