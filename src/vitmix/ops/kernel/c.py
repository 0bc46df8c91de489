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
devices, half inputs, tiny problems). ``BODY`` is written once with
``TYPE``/``ITYPE``/``SFX`` placeholders and instantiated for float32 and float64.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional, Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._cbuild import CKernel

_C_MIN_ELEMENTS = 1 << 12          # below this many N·M·d triples the PyTorch path's overhead is smaller
C_PARALLEL_WORK = 1 << 20          # from this many triples a call uses all threads (~0.15 ms of work on one)

HEADER = r"""/* L1 distance between token rows and landmark rows, forward and backward (Laplacian kernel).
 *
 * x (B, N, D) read through strides (XROW), y (B, M, D) and g (B, N, M) contiguous. Work items are
 * (b, block of ROWS rows of x).
 * Forward: each item first copies its landmarks transposed, yt (D, M) in a private buffer (like the
 * official CUDA operator's key layout): for a fixed token i and channel c the M landmarks are then one
 * contiguous row, so the innermost loop runs over landmarks and vectorises without horizontal sums.
 * Backward: x, y and the grad-y partials in their (., D) layout, vectorised over channels.
 *   forward:  out[b,i,j] = sum_c |x[b,i,c] - y[b,j,c]|   (the caller applies exp(-out/lam): torch's
 *                                                                  vectorised exp is ~3x faster than expf here)
 *   backward: gx[b,i,c] =  sum_j g[b,i,j] sign(x[b,i,c] - y[b,j,c])    (sign(0) = 0, as the official CUDA)
 *             part[item, j, c] = -sum_{i in item} g[b,i,j] sign(...)  (grad of y, per item, vectorised
 *                                                                    over channels in (M, D) order;
 *                                                                    summed over the items by the caller:
 *                                                                    no two threads write the same memory)
 * Plain C99 + OpenMP (sequential without it); no torch headers.
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
/* x is read in place through strides xs = {heads H, batch stride, head stride, token stride} (unit
 * channel stride): row i of slice b = (batch b / H, head b % H), e.g. q and k as views of the qkv
 * projection, or broadcast (stride 0) landmarks, without a contiguous copy */
#define XROW(x, xs, b, i) ((x) + ((b) / (xs)[0]) * (xs)[1] + ((b) % (xs)[0]) * (xs)[2] + (i) * (xs)[3])
"""

BODY = r"""
#undef JB
#define JB ((int64_t)(VEC_BYTES / sizeof(TYPE)))
typedef TYPE VEC_SFX __attribute__((vector_size(VEC_BYTES)));
typedef ITYPE IVEC_SFX __attribute__((vector_size(VEC_BYTES)));
#define ABSMASK_SFX ((IVEC_SFX){0} + (ITYPE)(~((UTYPE)1 << (8 * sizeof(TYPE) - 1))))
#define VABS_SFX(v) ((VEC_SFX)((IVEC_SFX)(v) & ABSMASK_SFX))             /* |v|: clear the sign bit */

/* out[i, j0 : j0 + JB] for one row (tail rows) */
static void l1_row_SFX(const TYPE *xi, const TYPE *yb, TYPE *o, int64_t M, int64_t Mp, int64_t D) {
    for (int64_t j0 = 0; j0 < Mp; j0 += JB) {
        VEC_SFX acc = {0}, yv;
        for (int64_t c = 0; c < D; ++c) {
            memcpy(&yv, yb + c * Mp + j0, sizeof yv);
            acc += VABS_SFX(xi[c] - yv);
        }
        TYPE sums[JB];
        memcpy(sums, &acc, sizeof sums);
        const int64_t nj = M - j0 < JB ? M - j0 : JB;
        for (int64_t jj = 0; jj < nj; ++jj) o[j0 + jj] = sums[jj];
    }
}

/* the same for four rows at once: four independent accumulator chains share each landmark load */
static void l1_rows4_SFX(const TYPE *x0, const TYPE *x1, const TYPE *x2, const TYPE *x3, const TYPE *yb,
                         TYPE *o, int64_t M, int64_t Mp, int64_t D) {
    for (int64_t j0 = 0; j0 < Mp; j0 += JB) {
        VEC_SFX a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv;
        for (int64_t c = 0; c < D; ++c) {
            memcpy(&yv, yb + c * Mp + j0, sizeof yv);
            a0 += VABS_SFX(x0[c] - yv);
            a1 += VABS_SFX(x1[c] - yv);
            a2 += VABS_SFX(x2[c] - yv);
            a3 += VABS_SFX(x3[c] - yv);
        }
        TYPE sums[4][JB];
        memcpy(sums[0], &a0, sizeof a0);
        memcpy(sums[1], &a1, sizeof a1);
        memcpy(sums[2], &a2, sizeof a2);
        memcpy(sums[3], &a3, sizeof a3);
        const int64_t nj = M - j0 < JB ? M - j0 : JB;
        for (int64_t r = 0; r < 4; ++r)
            for (int64_t jj = 0; jj < nj; ++jj) o[r * M + j0 + jj] = sums[r][jj];
    }
}

void vitmix_l1_fwd_SFX(const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *out, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads) {
    /* Landmarks in blocks of JB (transposed, zero-padded to Mp): the partial sums of a token stay in
     * registers over all D channels; rows go four at a time so that the additions of one channel are
     * independent (one chain per row hides the add latency). */
    const int64_t nblk = (N + rows - 1) / rows;
    const int64_t Mp = (M + JB - 1) / JB * JB;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        TYPE *yb = (TYPE *)calloc((size_t)(D * Mp), sizeof(TYPE));     /* (D, Mp), zero padding */
        const TYPE *ysrc = y + b * M * D;
        for (int64_t j = 0; j < M; ++j)
            for (int64_t c = 0; c < D; ++c) yb[c * Mp + j] = ysrc[j * D + c];
        int64_t i = i0;
        for (; i + 4 <= i1; i += 4)
            l1_rows4_SFX(XROW(x, xs, b, i), XROW(x, xs, b, i + 1), XROW(x, xs, b, i + 2), XROW(x, xs, b, i + 3),
                         yb, out + (b * N + i) * M, M, Mp, D);
        for (; i < i1; ++i) l1_row_SFX(XROW(x, xs, b, i), yb, out + (b * N + i) * M, M, Mp, D);
        free(yb);
    }
}

/* g·sign(x - y) lane-wise: g with its sign bit flipped where x < y, zero where x == y (or unordered) */
static inline VEC_SFX signed_g_SFX(VEC_SFX xv, VEC_SFX yv, VEC_SFX gv) {
    const VEC_SFX t = xv - yv;
    const IVEC_SFX nonzero = (IVEC_SFX)((t > (VEC_SFX){0}) | (t < (VEC_SFX){0}));
    return (VEC_SFX)((((IVEC_SFX)gv) ^ ((IVEC_SFX)t & ~ABSMASK_SFX)) & nonzero);
}

void vitmix_l1_bwd_SFX(const TYPE *g, const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *gx, TYPE *part,
                       int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads) {
    /* Vectorised over channels in blocks of JB, in the natural (M, D) layout: for a token i and a
     * landmark j, w = g_ij·sign(x_i - y_j) is added to gx_i (kept in registers over all landmarks) and
     * subtracted from this item's grad-y partial row j (in L1). No horizontal sums, no transposes; the
     * channel blocks of a row are independent chains. Channels past the last full block: scalar. */
    const int64_t nblk = (N + rows - 1) / rows;
    const int64_t Dv = D / JB * JB;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        const TYPE *yb = y + b * M * D;
        TYPE *py = part + item * M * D;
        memset(py, 0, sizeof(TYPE) * (size_t)(M * D));
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = XROW(x, xs, b, i), *gi = g + (b * N + i) * M;
            TYPE *gxi = gx + (b * N + i) * D;
            int64_t c0 = 0;
            for (; c0 + 4 * JB <= Dv; c0 += 4 * JB) {          /* four channel blocks: four chains */
                VEC_SFX x0, x1, x2, x3, a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv, pv, w;
                memcpy(&x0, xi + c0, sizeof x0);
                memcpy(&x1, xi + c0 + JB, sizeof x1);
                memcpy(&x2, xi + c0 + 2 * JB, sizeof x2);
                memcpy(&x3, xi + c0 + 3 * JB, sizeof x3);
                for (int64_t j = 0; j < M; ++j) {
                    const VEC_SFX gv = (VEC_SFX){0} + gi[j];
                    const TYPE *yj = yb + j * D + c0;
                    TYPE *pj = py + j * D + c0;
#define VITMIX_L1_STEP(K, XV, ACC) \
                    memcpy(&yv, yj + (K) * JB, sizeof yv); memcpy(&pv, pj + (K) * JB, sizeof pv); \
                    w = signed_g_SFX(XV, yv, gv); ACC += w; pv -= w; memcpy(pj + (K) * JB, &pv, sizeof pv);
                    VITMIX_L1_STEP(0, x0, a0)
                    VITMIX_L1_STEP(1, x1, a1)
                    VITMIX_L1_STEP(2, x2, a2)
                    VITMIX_L1_STEP(3, x3, a3)
#undef VITMIX_L1_STEP
                }
                memcpy(gxi + c0, &a0, sizeof a0);
                memcpy(gxi + c0 + JB, &a1, sizeof a1);
                memcpy(gxi + c0 + 2 * JB, &a2, sizeof a2);
                memcpy(gxi + c0 + 3 * JB, &a3, sizeof a3);
            }
            for (; c0 < Dv; c0 += JB) {                        /* remaining full blocks, one at a time */
                VEC_SFX xv, a = {0}, yv, pv, w;
                memcpy(&xv, xi + c0, sizeof xv);
                for (int64_t j = 0; j < M; ++j) {
                    memcpy(&yv, yb + j * D + c0, sizeof yv);
                    memcpy(&pv, py + j * D + c0, sizeof pv);
                    w = signed_g_SFX(xv, yv, (VEC_SFX){0} + gi[j]);
                    a += w;
                    pv -= w;
                    memcpy(py + j * D + c0, &pv, sizeof pv);
                }
                memcpy(gxi + c0, &a, sizeof a);
            }
            for (int64_t c = Dv; c < D; ++c) {                 /* channel tail */
                TYPE a = 0;
                for (int64_t j = 0; j < M; ++j) {
                    const TYPE t = xi[c] - yb[j * D + c];
                    const TYPE w = t > 0 ? gi[j] : (t < 0 ? -gi[j] : (TYPE)0);
                    a += w;
                    py[j * D + c] -= w;
                }
                gxi[c] = a;
            }
        }
    }
}
"""


@functools.lru_cache(maxsize=None)
def l1_c_source() -> str:
    """The C source, ``BODY`` instantiated for float32 and float64 (built on first use)."""
    parts = [HEADER]
    for typ, ityp, sfx in (("float", "int32_t", "f32"), ("double", "int64_t", "f64")):
        body = BODY.replace("UTYPE", "u" + ityp).replace("ITYPE", ityp).replace("TYPE", typ)
        parts.append(body.replace("SFX", sfx))
    return "".join(parts)


def _declare(lib) -> None:
    p, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for sfx in ("f32", "f64"):
        fwd = getattr(lib, f"vitmix_l1_fwd_{sfx}")
        fwd.argtypes = [p] * 4 + [i64] * 5 + [cint]
        fwd.restype = None
        bwd = getattr(lib, f"vitmix_l1_bwd_{sfx}")
        bwd.argtypes = [p] * 6 + [i64] * 5 + [cint]
        bwd.restype = None


#: the compiled C kernel, built on first use
L1_KERNEL = CKernel("l1_kernel", l1_c_source, _declare)

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
