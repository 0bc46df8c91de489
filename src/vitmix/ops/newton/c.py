"""The Newton–Schulz loop in C: the OpenMP source and its ctypes binding (private).

CPU, float32/float64, m <= ``_NS_C_MAX_M``, forward iteration only (the backward is two batched GEMMs
in PyTorch). The source is ``vitmix/ops/csrc/newton.c`` (the loop written once in ``newton_typed.h``,
instantiated for float32 and float64), compiled on first use by :mod:`vitmix.ops._cbuild` and cached;
each zero-padded m×m matrix stays in cache for all iterations.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._cbuild import CKernel


#: the exported functions (``csrc/newton.h``), for float32 and float64 (``_f32``/``_f64``)
PROTOTYPES = (
    "void vitmix_ns(const TYPE *P, TYPE *V, int64_t B, int64_t m, int64_t iters, int nthreads)",
    "void vitmix_ns_solve(const TYPE *A, TYPE *V, int64_t B, int64_t m, TYPE eps, int64_t iters, int rule, "
    "int nthreads)",
)

#: the Newton–Schulz loop as a small C kernel (per-matrix, cache-resident; ``csrc/newton.c``)
NS_KERNEL = CKernel("ns_kernel", "newton.c", PROTOTYPES)


_NS_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


_NS_C_MAX_M = 256          # larger matrices: batched BLAS is the better tool


def _c_library(P: torch.Tensor):
    """The C library when it applies to ``P`` (CPU float32/float64, eager, m <= 256), else ``None``."""
    if (P.device.type != "cpu" or P.dtype not in _NS_SUFFIX or P.shape[-1] > _NS_C_MAX_M
            or torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None):
        return None
    return NS_KERNEL.load()


#: the start rules of ``vitmix_ns_solve`` (the C enum of ``csrc/newton.h``)
_RULES = {None: 0, True: 1, False: 2, "official": 3}


def _c_solve(A: torch.Tensor, eps: float, iters: int, symmetric: Optional[bool], alpha: str):
    """Start and loop in one C call, for the starts that need no Cholesky test (``alpha="official"``,
    ``"transpose"``, and ``"safe"`` on matrices known to be symmetric); ``None`` where it does not apply.
    Saves the ~30 small torch ops of the start, whose dispatch outweighs their arithmetic on small matrices."""
    if alpha == "safe" and symmetric is not True:
        return None
    lib = _c_library(A)
    if lib is None:
        return None
    rule = _RULES["official" if alpha == "official" else symmetric]
    shape, m = A.shape, A.shape[-1]
    A3 = A.reshape(-1, m, m).contiguous()
    V = torch.empty_like(A3)
    getattr(lib, f"vitmix_ns_solve_{_NS_SUFFIX[A.dtype]}")(
        ctypes.c_void_p(A3.data_ptr()), ctypes.c_void_p(V.data_ptr()), A3.shape[0], m, eps, iters, rule,
        torch.get_num_threads())
    return V.reshape(shape)


def _c_iterate(P3: torch.Tensor, V3: torch.Tensor, iters: int):
    """The C loop when it applies (CPU float32/float64, eager, m <= 256), else ``None``."""
    if iters == 0:
        return None
    lib = _c_library(P3)
    if lib is None:
        return None
    m = P3.shape[-1]
    P3, V3 = P3.contiguous(), V3.clone(memory_format=torch.contiguous_format)
    getattr(lib, f"vitmix_ns_{_NS_SUFFIX[P3.dtype]}")(
        ctypes.c_void_p(P3.data_ptr()), ctypes.c_void_p(V3.data_ptr()), P3.shape[0], m, iters,
        torch.get_num_threads())
    return V3
