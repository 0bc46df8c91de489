"""The Newton–Schulz loop in C: the OpenMP source and its ctypes binding (private).

CPU, float32/float64, m <= ``_NS_C_MAX_M``, forward iteration only (the backward is two batched GEMMs
in PyTorch). Compiled on first use by :mod:`vitmix.ops._cbuild` and cached; each zero-padded m×m
matrix stays in cache for all iterations. ``BODY`` is instantiated for float32 and float64 with
``TYPE``/``SFX`` placeholders.
"""
from __future__ import annotations

import ctypes
import functools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._cbuild import CKernel


HEADER = r"""/* Batched Newton–Schulz iteration V <- 2V - V (P V) on small m x m matrices (landmark kernels, m <= ~128).
 *
 * P, V: (B, m, m) contiguous; V holds the start V0 on entry and the result on return. One work item
 * per matrix: zero-padded copies of P and V (to a multiple of 4·JB columns) and two scratch matrices
 * (4 mp^2 values, 64 KiB at m = 49 in float32) stay in L1/L2 for all iterations; each product keeps
 * JB-wide blocks of a row in vector registers. Batched BLAS pays a per-matrix call overhead that
 * dominates at this size. Plain C99 + OpenMP (sequential without it); no torch headers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* JB: lanes of one native vector register of TYPE (64-byte AVX-512, 32-byte AVX/AVX2, else 16 bytes).
 * A wider GCC vector type than the target has is lowered through memory: with JB fixed at 16 floats the
 * AVX2 build ran 12x slower than with 8 (Newton-Schulz loop, m = 49). */
#if defined(__AVX512F__)
#define VEC_BYTES 64
#elif defined(__AVX__)
#define VEC_BYTES 32
#else
#define VEC_BYTES 16
#endif
"""

BODY = r"""
#undef JB
#define JB ((int64_t)(VEC_BYTES / sizeof(TYPE)))
typedef TYPE NSVEC_SFX __attribute__((vector_size(VEC_BYTES)));

/* c = a b for (mp, mp) row-major matrices, mp a multiple of 4·JB: four JB-wide blocks of a row of c
 * are accumulated in vector registers over k (four independent broadcast-FMA chains hide the FMA
 * latency), then stored once. */
static void matmul_SFX(const TYPE *a, const TYPE *b, TYPE *c, int64_t m, int64_t mp) {
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j0 = 0; j0 < mp; j0 += 4 * JB) {
            NSVEC_SFX acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0}, b0, b1, b2, b3;
            for (int64_t k = 0; k < m; ++k) {
                const TYPE aik = a[i * mp + k];
                const TYPE *bk = b + k * mp + j0;
                memcpy(&b0, bk, sizeof b0);
                memcpy(&b1, bk + JB, sizeof b1);
                memcpy(&b2, bk + 2 * JB, sizeof b2);
                memcpy(&b3, bk + 3 * JB, sizeof b3);
                acc0 += aik * b0;
                acc1 += aik * b1;
                acc2 += aik * b2;
                acc3 += aik * b3;
            }
            TYPE *ci = c + i * mp + j0;
            memcpy(ci, &acc0, sizeof acc0);
            memcpy(ci + JB, &acc1, sizeof acc1);
            memcpy(ci + 2 * JB, &acc2, sizeof acc2);
            memcpy(ci + 3 * JB, &acc3, sizeof acc3);
        }
    }
}

void vitmix_ns_SFX(const TYPE *P, TYPE *V, int64_t B, int64_t m, int64_t iters, int nthreads) {
    const int64_t mp = (m + 4 * JB - 1) / (4 * JB) * (4 * JB);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t b = 0; b < B; ++b) {
        /* padded copies (zeros beyond m stay zero through the iteration) */
        TYPE *buf = (TYPE *)calloc((size_t)(4 * mp * mp), sizeof(TYPE));
        TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp;
        for (int64_t i = 0; i < m; ++i) {
            memcpy(p + i * mp, P + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
            memcpy(v + i * mp, V + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
        }
        for (int64_t it = 0; it < iters; ++it) {
            matmul_SFX(p, v, t, m, mp);             /* T = P V */
            matmul_SFX(v, t, u, m, mp);             /* U = V T */
            for (int64_t e = 0; e < m * mp; ++e) v[e] = 2 * v[e] - u[e];
        }
        for (int64_t i = 0; i < m; ++i) memcpy(V + (b * m + i) * m, v + i * mp, sizeof(TYPE) * (size_t)m);
        free(buf);
    }
}
"""


@functools.lru_cache(maxsize=None)
def ns_c_source() -> str:
    """The C source, instantiated for float32 and float64 (built on first use, then cached)."""
    parts = [HEADER]
    for typ, sfx in (("float", "f32"), ("double", "f64")):
        parts.append(BODY.replace("TYPE", typ).replace("SFX", sfx))
    return "".join(parts)


def _ns_declare(lib) -> None:
    for sfx in ("f32", "f64"):
        fn = getattr(lib, f"vitmix_ns_{sfx}")
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = None


#: the Newton–Schulz loop as a small C kernel (per-matrix, cache-resident; the source above)
NS_KERNEL = CKernel("ns_kernel", ns_c_source, _ns_declare)


_NS_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


_NS_C_MAX_M = 256          # larger matrices: batched BLAS is the better tool


def _c_iterate(P3: torch.Tensor, V3: torch.Tensor, iters: int):
    """The C loop when it applies (CPU float32/float64, eager, m <= 256), else ``None``."""
    m = P3.shape[-1]
    if (P3.device.type != "cpu" or P3.dtype not in _NS_SUFFIX or m > _NS_C_MAX_M or iters == 0
            or torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None):
        return None
    lib = NS_KERNEL.load()
    if lib is None:
        return None
    P3, V3 = P3.contiguous(), V3.clone(memory_format=torch.contiguous_format)
    getattr(lib, f"vitmix_ns_{_NS_SUFFIX[P3.dtype]}")(
        ctypes.c_void_p(P3.data_ptr()), ctypes.c_void_p(V3.data_ptr()), P3.shape[0], m, iters,
        torch.get_num_threads())
    return V3
