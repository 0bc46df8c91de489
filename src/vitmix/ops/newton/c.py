"""The Newton–Schulz loop in C: the OpenMP source and its ctypes binding (private).

CPU, float32/float64, m <= ``_NS_C_MAX_M``, forward iteration only (the backward is two batched GEMMs
in PyTorch). Compiled on first use by :mod:`vitmix.ops._cbuild` and cached; each zero-padded m×m
matrix stays in cache for all iterations. ``BODY`` is instantiated for float32 and float64 with
``TYPE``/``SFX`` placeholders.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

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

/* start rules of vitmix_ns_solve (vitmix.ops.newton.c._RULES) */
enum { START_DETECT = 0, START_SYMMETRIC = 1, START_TRANSPOSE = 2, START_OFFICIAL = 3 };
"""

BODY = r"""
#undef JB
#define JB ((int64_t)(VEC_BYTES / sizeof(TYPE)))
typedef TYPE NSVEC_SFX __attribute__((vector_size(VEC_BYTES)));

/* c = a b for (m, mp) row-major matrices (row stride mp, a multiple of JB; columns beyond m zero): rows go
 * four at a time, each JB-wide block of their rows of c accumulated in vector registers over k (four
 * independent broadcast-FMA chains that share each load of b hide the FMA latency), then stored once. Blocks
 * of four rows rather than of 4·JB columns: at m = 16 a 4·JB-wide row block computed four times the useful
 * columns (float32, AVX-512). */
static void matmul_SFX(const TYPE *a, const TYPE *b, TYPE *c, int64_t m, int64_t mp) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const TYPE *a0 = a + i * mp, *a1 = a0 + mp, *a2 = a1 + mp, *a3 = a2 + mp;
        for (int64_t j0 = 0; j0 < mp; j0 += JB) {
            NSVEC_SFX acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0}, bk;
            for (int64_t k = 0; k < m; ++k) {
                memcpy(&bk, b + k * mp + j0, sizeof bk);
                acc0 += a0[k] * bk;
                acc1 += a1[k] * bk;
                acc2 += a2[k] * bk;
                acc3 += a3[k] * bk;
            }
            TYPE *ci = c + i * mp + j0;
            memcpy(ci, &acc0, sizeof acc0);
            memcpy(ci + mp, &acc1, sizeof acc1);
            memcpy(ci + 2 * mp, &acc2, sizeof acc2);
            memcpy(ci + 3 * mp, &acc3, sizeof acc3);
        }
    }
    for (; i < m; ++i)
        for (int64_t j0 = 0; j0 < mp; j0 += JB) {
            NSVEC_SFX acc = {0}, bk;
            for (int64_t k = 0; k < m; ++k) {
                memcpy(&bk, b + k * mp + j0, sizeof bk);
                acc += a[i * mp + k] * bk;
            }
            memcpy(c + i * mp + j0, &acc, sizeof acc);
        }
}

/* iters steps V <- 2V - V (P V) on padded p, v (scratch t, u), then the m x m result into out */
static void ns_iterate_SFX(const TYPE *p, TYPE *v, TYPE *t, TYPE *u, TYPE *out, int64_t m, int64_t mp, int64_t iters) {
    for (int64_t it = 0; it < iters; ++it) {
        matmul_SFX(p, v, t, m, mp);             /* T = P V */
        matmul_SFX(v, t, u, m, mp);             /* U = V T */
        for (int64_t e = 0; e < m * mp; ++e) v[e] = 2 * v[e] - u[e];
    }
    for (int64_t i = 0; i < m; ++i) memcpy(out + i * m, v + i * mp, sizeof(TYPE) * (size_t)m);
}

/* The start V0 of one padded matrix from its unperturbed copy a (m x m, row stride mp) and P = a + eps I
 * in p, as vitmix.ops.newton.start does it: START_OFFICIAL: alpha = 1.8 / (max row sum of a)^2, V0 = alpha P;
 * otherwise symmetric (forced, or detected: max|a - a^T| <= 1e-5 max|a|) V0 = 1.8 P / ||P||_inf^2, else
 * V0 = P^T / (||P||_1 ||P||_inf). */

static void ns_start_SFX(const TYPE *a, const TYPE *p, TYPE *v, int64_t m, int64_t mp, int rule) {
    if (rule == START_OFFICIAL) {
        TYPE top = 0;
        for (int64_t i = 0; i < m; ++i) {
            TYPE r = 0;
            for (int64_t j = 0; j < m; ++j) r += a[i * mp + j];
            if (i == 0 || r > top || r != r) top = r;          /* NaN sticks: nothing compares > NaN */
        }
        const TYPE alpha = (TYPE)1.8 / (top * top);
        for (int64_t e = 0; e < m * mp; ++e) v[e] = alpha * p[e];
        return;
    }
    TYPE row = 0, col = 0;
    for (int64_t i = 0; i < m; ++i) {
        TYPE r = 0, c = 0;
        for (int64_t j = 0; j < m; ++j) {
            r += p[i * mp + j] < 0 ? -p[i * mp + j] : p[i * mp + j];
            c += p[j * mp + i] < 0 ? -p[j * mp + i] : p[j * mp + i];
        }
        row = (r > row || r != r) ? r : row;
        col = (c > col || c != c) ? c : col;
    }
    int sym = rule == START_SYMMETRIC;
    if (rule == START_DETECT) {
        TYPE asym = 0, scale = 0;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < m; ++j) {
                const TYPE d = a[i * mp + j] - a[j * mp + i], x = a[i * mp + j];
                asym = (d > asym || -d > asym) ? (d < 0 ? -d : d) : asym;
                scale = (x > scale || -x > scale) ? (x < 0 ? -x : x) : scale;
            }
        sym = asym <= (TYPE)1e-5 * scale;
    }
    if (sym) {
        const TYPE alpha = (TYPE)1.8 / (row * row);
        for (int64_t e = 0; e < m * mp; ++e) v[e] = alpha * p[e];
    } else {
        const TYPE alpha = (TYPE)1 / (row * col);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < m; ++j) v[i * mp + j] = alpha * p[j * mp + i];
    }
}

/* Newton-Schulz from A: P = A + eps I, the start by rule (above), iters steps; V (B, m, m) receives the
 * result. NaN in A propagates like the PyTorch path. */
void vitmix_ns_solve_SFX(const TYPE *A, TYPE *V, int64_t B, int64_t m, TYPE eps, int64_t iters, int rule,
                         int nthreads) {
    const int64_t mp = (m + JB - 1) / JB * JB;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t b = 0; b < B; ++b) {
        TYPE *buf = (TYPE *)calloc((size_t)(5 * mp * mp), sizeof(TYPE));
        TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp, *a = buf + 4 * mp * mp;
        for (int64_t i = 0; i < m; ++i) {
            memcpy(a + i * mp, A + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
            memcpy(p + i * mp, a + i * mp, sizeof(TYPE) * (size_t)m);
            p[i * mp + i] += eps;
        }
        ns_start_SFX(a, p, v, m, mp, rule);
        ns_iterate_SFX(p, v, t, u, V + b * m * m, m, mp, iters);
        free(buf);
    }
}

void vitmix_ns_SFX(const TYPE *P, TYPE *V, int64_t B, int64_t m, int64_t iters, int nthreads) {
    const int64_t mp = (m + JB - 1) / JB * JB;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t b = 0; b < B; ++b) {
        /* padded copies (zeros beyond m stay zero through the iteration) */
        TYPE *buf = (TYPE *)calloc((size_t)(4 * mp * mp), sizeof(TYPE));
        TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp;
        for (int64_t i = 0; i < m; ++i) {
            memcpy(p + i * mp, P + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
            memcpy(v + i * mp, V + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
        }
        ns_iterate_SFX(p, v, t, u, V + b * m * m, m, mp, iters);
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
    for sfx, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        fn = getattr(lib, f"vitmix_ns_{sfx}")
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = None
        solve = getattr(lib, f"vitmix_ns_solve_{sfx}")
        solve.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [real, ctypes.c_int64] + [ctypes.c_int] * 2
        solve.restype = None


#: the Newton–Schulz loop as a small C kernel (per-matrix, cache-resident; the source above)
NS_KERNEL = CKernel("ns_kernel", ns_c_source, _ns_declare)


_NS_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


_NS_C_MAX_M = 256          # larger matrices: batched BLAS is the better tool


def _c_library(P: torch.Tensor):
    """The C library when it applies to ``P`` (CPU float32/float64, eager, m <= 256), else ``None``."""
    if (P.device.type != "cpu" or P.dtype not in _NS_SUFFIX or P.shape[-1] > _NS_C_MAX_M
            or torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None):
        return None
    return NS_KERNEL.load()


#: the start rules of ``vitmix_ns_solve`` (the C enum)
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
