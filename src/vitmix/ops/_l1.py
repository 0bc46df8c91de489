"""L1 (Manhattan) distance and its backward, the hot loops of the Laplacian kernel (private).

Two back ends compute the same numbers:

* ``c`` (CPU, float32/float64): a small OpenMP C kernel (:mod:`vitmix.ops._l1_kernel`), compiled on
  first use in about a second and cached on disk (:mod:`vitmix.ops._cbuild`), so there is no
  compile-on-first-forward stall. One pass over the (token, landmark, channel) triples with the
  landmarks transposed to ``(d, M)`` in a per-item buffer so the inner loop vectorises over
  landmarks, the ``exp(-d/λ)`` fused into the forward; backward writes ``grad_x`` and per-block
  partial sums of ``grad_y`` (no atomics, no ``N×M×d`` tensor).
* ``eager``: ``torch.cdist(p=1)`` forward (a loop over pairs, no N×M×d tensor) and a backward that
  walks over row chunks of ``x`` so that the ``sign`` tensor of one chunk stays below
  ``_CHUNK_ELEMENTS`` elements. Every device and dtype; used when the C kernel is unavailable (no
  compiler, ``VITMIX_DISABLE_C_KERNEL=1``), on other devices, for half inputs, and for tiny problems.

Gradients use ``sign(0) = 0`` (the subgradient the official CUDA operator uses).
"""
from __future__ import annotations

import ctypes
from typing import Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._cbuild import CKernel

_CHUNK_ELEMENTS = 1 << 20          # eager backward: elements of one sign-chunk (4 MiB in float32)
_C_MIN_ELEMENTS = 1 << 12          # below this many N·M·d triples the eager path's overhead is smaller


def _source() -> str:
    from ._l1_kernel import SOURCE

    return SOURCE


def _declare(lib) -> None:
    p, i64, dbl, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    for sfx in ("f32", "f64"):
        fwd = getattr(lib, f"vitmix_l1_fwd_{sfx}")
        fwd.argtypes = [p] * 4 + [i64] * 5 + [dbl, cint, cint]
        fwd.restype = None
        bwd = getattr(lib, f"vitmix_l1_bwd_{sfx}")
        bwd.argtypes = [p] * 6 + [i64] * 5 + [cint]
        bwd.restype = None


#: the compiled C kernel, built on first use
L1_KERNEL = CKernel("l1_kernel", _source, _declare)

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _c_lib(x: torch.Tensor, y: torch.Tensor):
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


def laplace_forward(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """exp(-||x_i - y_j||_1 / lam) without autograd; x (..., N, d), y (..., M, d) same batch shape."""
    lib = _c_lib(x, y)
    if lib is not None:
        xv, xs, b = _strided_rows(x)
        yf = _flat3(y)
        n, d = x.shape[-2:]
        m = yf.shape[1]
        out = torch.empty(b, n, m, dtype=x.dtype)
        threads = torch.get_num_threads()
        getattr(lib, f"vitmix_l1_fwd_{_SUFFIX[x.dtype]}")(
            _ptr(xv), xs, _ptr(yf), _ptr(out), b, n, m, d, _row_block(b, n, threads), -1.0 / lam, 1, threads)
        return out.view(*x.shape[:-1], m)
    d = torch.cdist(x, y, p=1.0)
    return d.mul_(-1.0 / lam).exp_()


def l1_backward(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``sum_ij g_ij * ||x_i - y_j||_1`` w.r.t. x and y (sign(0) = 0), memory O(chunk)."""
    batch_shape = x.shape[:-2]
    n, d = x.shape[-2:]
    m = y.shape[-2]
    lib = _c_lib(x, y)
    if lib is not None and g.dtype == x.dtype:
        gf, yf = _flat3(g), _flat3(y)
        xv, xs, b = _strided_rows(x)
        threads = torch.get_num_threads()
        rows = _row_block(b, n, threads)
        blocks = -(-n // rows)
        gx = torch.empty(b, n, d, dtype=x.dtype)
        part = torch.empty(b, blocks, m, d, dtype=x.dtype)
        getattr(lib, f"vitmix_l1_bwd_{_SUFFIX[x.dtype]}")(
            _ptr(gf), _ptr(xv), xs, _ptr(yf), _ptr(gx), _ptr(part), b, n, m, d, rows, threads)
        gy = part.sum(1) if blocks > 1 else part[:, 0]
        return gx.reshape(*batch_shape, n, d), gy.reshape(*batch_shape, m, d)
    return _eager_backward(_flat3(g), _flat3(x), _flat3(y), batch_shape)


def _eager_backward(gf, xf, yf, batch_shape):
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
