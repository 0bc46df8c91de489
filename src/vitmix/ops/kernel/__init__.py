"""Pairwise similarity-kernel matrices: Gaussian (SOFT) and Laplacian (LaplacianFormer).

Layout: this module holds the public functions, the dispatch and the custom ops; ``naive.py`` the
references, ``pytorch.py`` the PyTorch back end, ``c.py`` the CPU C kernel (source and binding),
``triton.py`` the Triton kernels, ``checks.py`` the argument checks.

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
* Laplacian: the L1 distance and its backward run in :mod:`vitmix.ops.kernel.c` (an OpenMP C kernel on
  CPU, built on first use in about a second and cached; ``cdist`` / a chunked loop elsewhere,
  :mod:`vitmix.ops.kernel.pytorch`); gradient of ``|t|`` uses ``sign(0) = 0`` like the official CUDA operator.

* Triton (``backend="auto"`` on CUDA tensors, or ``backend="triton"``; :mod:`vitmix.ops.kernel.triton`):
  one tiled kernel for the forward and one for each gradient, float32/float16/bfloat16 inputs read
  directly and computed in float32; float64 and other unsupported inputs fall back to the paths above
  with a one-time warning (:mod:`vitmix.ops._triton`; ``docs/gpu.md``). The custom ops carry ``backend``
  in their schemas, so compiled code chooses the same way when it runs.

Numerics: half-precision (``float16``/``bfloat16``) inputs are computed in float32 with autocast
disabled, and the result is returned **in float32** (kernel values feed inverses and normalisers
that must stay in float32); float64 stays float64.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._common import exporting_to_onnx, no_autocast, traced
from .._triton import check_backend, wants_triton
from .checks import _broadcast, _check_lam, _check_pair, _prepare
from .naive import gaussian_kernel_reference, laplacian_kernel_reference
from .pytorch import (
    _gaussian_decomposition, _gaussian_forward, _gaussian_grads, _GaussianKernel,
    _laplacian_decomposition, _laplacian_forward, _laplacian_grads, _LaplacianKernel,
)


__all__ = ["gaussian_kernel", "gaussian_kernel_reference", "laplacian_kernel", "laplacian_kernel_reference"]


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
    from . import triton as kernel_triton      # imports triton: only when a Triton path runs

    return kernel_triton


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


@torch.library.custom_op("vitmix::laplacian_kernel", mutates_args=())
def _laplacian_op(x: torch.Tensor, y: torch.Tensor, lam: float, backend: str = "auto") -> torch.Tensor:
    """Laplacian kernel matrix of same-batch ``x``, ``y`` (the C kernel on CPU, see :mod:`vitmix.ops.kernel.c`)."""
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


def _laplacian_op_grad(ctx, g):
    x, y, out = ctx.saved_tensors
    gx, gy = _laplacian_backward_op(g, x, y, out, ctx.lam, ctx.backend)
    return gx, gy, None, None


_laplacian_op.register_autograd(_laplacian_op_grad, setup_context=_save_pair)


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
    :mod:`vitmix.ops.kernel.c`; ``VITMIX_DISABLE_C_KERNEL=1`` uses PyTorch's ``cdist`` instead), on CUDA
    in the Triton kernels.
    """
    _check_pair("laplacian_kernel", x, y)
    lam_f = _check_lam(lam)
    check_backend("laplacian_kernel", backend)
    return _pair_kernel("laplacian_kernel", "laplacian", x, y, lam_f, backend,
                        lambda a, b: _LaplacianKernel.apply(a, b, lam_f),
                        lambda a, b, be: _laplacian_op(a, b, lam_f, be),
                        lambda a, b, be: _laplacian_decomposition(a, b, lam_f, be))
