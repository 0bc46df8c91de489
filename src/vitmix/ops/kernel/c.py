"""The Laplacian kernel's L1 distance in C: the OpenMP source and its ctypes binding (private).

CPU, float32/float64: compiled on first use in about a second and cached on disk
(:mod:`vitmix.ops._cbuild`), so there is no compile-on-first-forward stall. The forward makes one pass
over the (token, landmark, channel) triples with the landmarks transposed to ``(d, M)`` in a per-item
buffer, so the inner loop vectorises over landmarks, four tokens at a time (``exp(-d/λ)`` is then one
vectorised torch call); the backward vectorises over channels and writes ``grad_x`` and per-block
partial sums of ``grad_y`` (no atomics, no horizontal sums, no ``N×M×d`` tensor). Gradients use
``sign(0) = 0`` (the subgradient the official CUDA operator uses).

:func:`c_library` says whether the kernel applies to given inputs; the PyTorch path
(:mod:`vitmix.ops.kernel.pytorch`) runs otherwise (no compiler, ``VITMIX_DISABLE_C_KERNEL=1``, other
devices, half inputs, tiny problems). The source is ``vitmix/ops/csrc/l1_kernel.c`` (written once in
``l1_kernel_typed.h``, instantiated for float32 and float64; the forward's distance loop is
``distance_typed.h``'s, the same code as the Nyström kernel matrices').
"""
from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._cbuild import CKernel

_C_MIN_ELEMENTS = 1 << 12          # below this many N·M·d triples the PyTorch path's overhead is smaller
C_PARALLEL_WORK = 1 << 20          # from this many triples a call uses all threads (~0.15 ms of work on one)

#: the exported functions (``csrc/l1_kernel.h``), for float32 and float64 (``_f32``/``_f64``)
PROTOTYPES = (
    "void vitmix_l1_fwd(const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *out, int64_t B, int64_t N, "
    "int64_t M, int64_t D, int64_t rows, int nthreads)",
    "void vitmix_l1_bwd(const TYPE *g, const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *gx, TYPE *part, "
    "int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads)",
)

#: the compiled C kernel (``csrc/l1_kernel.c``), built on first use
L1_KERNEL = CKernel("l1_kernel", "l1_kernel.c", PROTOTYPES)

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def c_library(x: torch.Tensor, y: torch.Tensor):
    """The C library when it applies to these inputs, else ``None``."""
    if x.device.type != "cpu" or x.dtype not in _SUFFIX or y.dtype != x.dtype:
        return None
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        # traced (fake tensors have no data) or observed (FlopCounterMode, MemTracker): the eager
        # path is what those see and count
        return None
    batch = x.numel() // max(x.shape[-1] * x.shape[-2], 1)
    if batch * x.shape[-2] * y.shape[-2] * x.shape[-1] < _C_MIN_ELEMENTS:
        return None
    return L1_KERNEL.load()


def _flat3(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def _strided_rows(t: torch.Tensor):
    """``t (..., N, d)`` as the C kernel reads it in place: ``(t', strides)`` with ``strides`` =
    ``(heads, batch stride, head stride, token stride)`` for up to two leading dims and a unit
    channel stride (q/k views of a fused qkv output need no copy); otherwise a contiguous copy."""
    if t.stride(-1) == 1 and t.dim() in (3, 4):
        b, h = (t.shape[0], t.shape[1]) if t.dim() == 4 else (t.shape[0], 1)
        sb, sh = (t.stride(0), t.stride(1)) if t.dim() == 4 else (t.stride(0), 0)
        return t, (ctypes.c_int64 * 4)(h, sb, sh, t.stride(-2)), b * h
    flat = _flat3(t)
    return flat, (ctypes.c_int64 * 4)(1, flat.stride(0), 0, flat.stride(1)), flat.shape[0]


def _row_block(b: int, n: int, threads: int) -> int:
    """Rows per work item: enough items to balance the threads, few enough ``grad_y`` partials."""
    per_sample = max(1, -(-4 * threads // max(b, 1)))         # items wanted per (batch·head) slice
    return int(min(512, max(32, -(-n // per_sample))))


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


def laplace_forward(lib, x: torch.Tensor, y: torch.Tensor, lam: float, threads: Optional[int] = None) -> torch.Tensor:
    """exp(-||x_i - y_j||_1 / lam) in C (``lib`` from :func:`c_library`); x (..., N, d), y (..., M, d);
    ``threads``: OpenMP threads (default: torch's intra-op count)."""
    xv, xs, b = _strided_rows(x)
    yf = _flat3(y)
    n, d = x.shape[-2:]
    m = yf.shape[1]
    out = torch.empty(b, n, m, dtype=x.dtype)
    threads = threads or torch.get_num_threads()
    getattr(lib, f"vitmix_l1_fwd_{_SUFFIX[x.dtype]}")(
        _ptr(xv), xs, _ptr(yf), _ptr(out), b, n, m, d, _row_block(b, n, threads), threads)
    return out.mul_(-1.0 / lam).exp_().view(*x.shape[:-1], m)


def l1_backward(lib, g: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                threads: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``sum_ij g_ij * ||x_i - y_j||_1`` w.r.t. x and y (sign(0) = 0) in C; ``g`` in x's dtype;
    ``threads`` as in :func:`laplace_forward`."""
    batch_shape = x.shape[:-2]
    n, d = x.shape[-2:]
    m = y.shape[-2]
    gf, yf = _flat3(g), _flat3(y)
    xv, xs, b = _strided_rows(x)
    threads = threads or torch.get_num_threads()
    rows = _row_block(b, n, threads)
    blocks = -(-n // rows)
    gx = torch.empty(b, n, d, dtype=x.dtype)
    part = torch.empty(b, blocks, m, d, dtype=x.dtype)
    getattr(lib, f"vitmix_l1_bwd_{_SUFFIX[x.dtype]}")(
        _ptr(gf), _ptr(xv), xs, _ptr(yf), _ptr(gx), _ptr(part), b, n, m, d, rows, threads)
    gy = part.sum(1) if blocks > 1 else part[:, 0]
    return gx.reshape(*batch_shape, n, d), gy.reshape(*batch_shape, m, d)
