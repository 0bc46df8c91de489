"""Sparse multi-diagonal attention in C: the ctypes binding of ``vitmix/ops/csrc/diagonal.c`` (private).

CPU, float32/float64. The C file ships as package data and is compiled on first use with the system C
compiler by :mod:`vitmix.ops._cbuild` (no build step at install); its body is written once in
``diagonal_typed.h`` and instantiated for float32 and float64."""
from __future__ import annotations

import ctypes

import torch

from .._cbuild import CKernel
from .plan import _token_major


#: the exported functions (``csrc/diagonal.h``), for float32 and float64 (``_f32``/``_f64``)
PROTOTYPES = tuple(
    f"void vitmix_diag_{step}(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts, "
    "int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr)"
    for step in ("fwd", "bwd"))


#: the compiled C kernel (``csrc/diagonal.c``), built on first use (see :mod:`vitmix.ops._cbuild`)
_DIAGONAL = CKernel("diagonal_kernel", "diagonal.c", PROTOTYPES)


def _load_kernel():
    return _DIAGONAL.load()


def kernel_available() -> bool:
    """True when the C backend can be used (a C compiler worked, or the library was cached)."""
    return _load_kernel() is not None


_N_VIEWS = 8  # q, k, v, out, dout, dq, dk, dv (then lse, a_buf, ds_buf, wpre, dspre, lse_pre)


def _c_call(fn, views, extras, plan, b, h, n, p, d, scale):
    ptrs = (ctypes.c_void_p * (_N_VIEWS + 6))()
    strides = (ctypes.c_int64 * (3 * _N_VIEWS))()
    for i, t in enumerate(views):
        if t is not None:
            ptrs[i] = t.data_ptr()
            strides[3 * i: 3 * i + 3] = list(t.stride()[:3])
    for i, t in enumerate(extras):
        if t is not None:
            ptrs[_N_VIEWS + i] = t.data_ptr()
    fn(ptrs, strides, plan.shifts.data_ptr(), plan.counts.data_ptr(), b, h, n, p, plan.max_slots, d, float(scale),
       torch.get_num_threads())


def _c_forward(lib, q, k, v, plan, p, scale):
    """Output (a token-major ``(B, H, T, D)`` view) and the log-sum-exp of the patch and prefix rows."""
    b, h, t, d = q.shape
    n = t - p
    out = _token_major(b, h, t, d, q)
    lse = q.new_empty(b, h, n)
    lse_pre = q.new_empty(b, h, p)
    fn = lib.vitmix_diag_fwd_f32 if q.dtype == torch.float32 else lib.vitmix_diag_fwd_f64
    _c_call(fn, (q, k, v, out, None, None, None, None), (lse, None, None, None, None, lse_pre), plan, b, h, n, p, d,
            scale)
    return out, lse, lse_pre


def _c_backward(lib, q, k, v, out, lse, lse_pre, dout, plan, p, scale, like_inputs=True):
    """``dq, dk, dv``, all computed by the kernel. ``like_inputs``: each gradient in the layout of its
    input when that is contiguous (cheap accumulation into ``.grad``), else token-major (inputs that
    are views of a qkv projection); ``False``: all token-major (the custom op's fixed layout)."""
    b, h, t, d = q.shape
    n = t - p
    dq, dk, dv = (torch.empty_like(x) if like_inputs and x.is_contiguous() else _token_major(b, h, t, d, q)
                  for x in (q, k, v))
    a_buf = q.new_empty(b, h, n, p + plan.max_slots)
    ds_buf = q.new_empty(b, h, n, p + plan.max_slots)
    wpre = q.new_empty(b, h, p, t)
    dspre = q.new_empty(b, h, p, t)
    fn = lib.vitmix_diag_bwd_f32 if q.dtype == torch.float32 else lib.vitmix_diag_bwd_f64
    _c_call(fn, (q, k, v, out, dout, dq, dk, dv), (lse, a_buf, ds_buf, wpre, dspre, lse_pre), plan, b, h, n, p, d,
            scale)
    return dq, dk, dv
