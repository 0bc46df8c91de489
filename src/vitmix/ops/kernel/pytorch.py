"""The Gaussian and Laplacian kernel matrices in PyTorch (private): the fast paths of
:mod:`vitmix.ops.kernel` on every device, and their export decompositions.

The forwards save only ``x``, ``y`` and the output (``N×M``), never an ``N×M×d`` tensor. Gaussian: the
squared distance comes from the GEMM expansion ``|x|^2 + |y|^2 - 2 x·y``, clamped at ``>= 0`` (rounding
can make it slightly negative); the backward is two GEMMs. Laplacian: the L1 distance and its backward
run in the C kernel (:mod:`vitmix.ops.kernel.c`) on CPU when it applies, else ``torch.cdist(p=1)``
and a backward over row chunks of ``x`` whose ``sign`` tensor stays below ``_CHUNK_ELEMENTS`` elements;
``sign(0) = 0`` like the official CUDA operator.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._common import no_autocast, single_thread_if_small
from . import c
from .checks import _work

_CHUNK_ELEMENTS = 1 << 20          # chunked L1 backward: elements of one sign-chunk (4 MiB in float32)


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


def _gaussian_decomposition(x: torch.Tensor, y: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Export decomposition of ``vitmix::gaussian_kernel``: the forward's GEMM expansion, out of place."""
    sq = torch.matmul(x, y.mT).mul(-2.0).add(x.square().sum(-1, keepdim=True)).add(y.square().sum(-1).unsqueeze(-2))
    return sq.clamp_min(0.0).mul(-0.5).exp()


# ---------------------------------------------------------------------------------------- Laplacian
def _c_threads(x: torch.Tensor, y: torch.Tensor) -> int:
    """Threads of a C kernel call: the caller's, unless the work is below ``c.C_PARALLEL_WORK``. Read
    before ``single_thread_if_small`` drops torch to one thread: that guard is for sequences of tiny
    torch ops (one fork/join each); a C call has a single parallel region."""
    return torch.get_num_threads() if _work(x, y) >= c.C_PARALLEL_WORK else 1


def _laplacian_forward(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    threads = _c_threads(x, y)
    with torch.no_grad(), single_thread_if_small(x, _work(x, y)):
        lib = c.c_library(x, y)
        if lib is not None:
            return c.laplace_forward(lib, x, y, lam, threads)
        return torch.cdist(x, y, p=1.0).mul_(-1.0 / lam).exp_()


def _laplacian_grads(g, x, y, out, lam: float):
    threads = _c_threads(x, y)
    with torch.no_grad(), no_autocast(g.device.type), single_thread_if_small(x, _work(x, y)):
        # d out / d dist = -out / lam
        gd = (g * out).mul_(-1.0 / lam)
        lib = c.c_library(x, y)
        if lib is not None and gd.dtype == x.dtype:
            return c.l1_backward(lib, gd, x, y, threads)
        return _l1_backward_chunked(gd, x, y)


def _flat3(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def _l1_backward_chunked(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """Gradients of ``sum_ij g_ij * ||x_i - y_j||_1`` w.r.t. x and y (sign(0) = 0), memory O(chunk)."""
    batch_shape = x.shape[:-2]
    gf, xf, yf = _flat3(g), _flat3(x), _flat3(y)
    b, n, d = xf.shape
    m = yf.shape[1]
    gx = torch.empty_like(xf)
    gy = torch.zeros_like(yf)
    rows = max(1, _CHUNK_ELEMENTS // max(b * m * d, 1))
    for s in range(0, n, rows):
        xs = xf[:, s:s + rows]
        sgn = torch.sign(xs.unsqueeze(2) - yf.unsqueeze(1))       # (b, rows, m, d)
        sgn.mul_(gf[:, s:s + rows].unsqueeze(-1))
        gx[:, s:s + rows] = sgn.sum(2)
        gy -= sgn.sum(1)
    return gx.reshape(*batch_shape, n, d), gy.reshape(*batch_shape, m, d)


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


def _laplacian_decomposition(x: torch.Tensor, y: torch.Tensor, lam: float, backend: str = "auto") -> torch.Tensor:
    """Export decomposition of ``vitmix::laplacian_kernel``: the broadcast ``(..., N, M, d)`` L1 distance
    of the reference (memory N·M·d, fine for inference; every op is elementwise or a reduction)."""
    return torch.exp(-(x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1) / lam)
