"""Nyström attention's whole forward in one C call on CPU (inference; the training forwards of LaplacianFormer's
and SOFT's layers; private).

At batch 1 a SOFT or LaplacianFormer layer's core is ~40 small torch ops (three kernel matrices, the
Newton–Schulz start and loop, the normaliser's products), each costing more in dispatch than in
arithmetic: 197 tokens × 25 landmarks × 32 channels is ~0.16 M multiply-adds per matrix. Here one
work item per (batch, head) slice computes, in cache-resident buffers,

    C_q = k(Q, L_k), C_k = k(K, L_q), W = k(L_q, L_k), M = NS(W + eps·I)     (the NS source is shared
    with :mod:`vitmix.ops.newton.c`: same start rules, same loop)
    out = C_q M C_kᵀ V  |  SOFT-Norm's D^(-1/2) M D^(-1/2)  |  the injective map (module docstring of
    :mod:`vitmix.ops.nystrom`: centred keys D, T = Mᵀ cov(C_q) M, s = (diag(D T Dᵀ) + ε)^(-1/2),
    out = C_q M Dᵀ (s ⊙ V) + mean(V))

with no autograd (LaplacianFormer's and SOFT's layers pair ``laplacian_mix`` and ``soft_mix`` with the C
backwards of :mod:`.c_grad`):
:func:`vitmix.ops.nystrom_attention` uses it only when no input needs a gradient
(``torch.no_grad()``, ``model.eval()`` inference), and falls back to its composition of ops wherever this
does not apply (no compiler, other devices or dtypes, ``inverse="exact"``, the Cholesky-tested
``alpha="safe"`` start on untied landmarks, tracing, unbroadcast leading dims). Its reference is that
composition; the two agree to float32 rounding (the kernels are summed directly, not by the GEMM
expansion, and the Newton–Schulz loop amplifies those roundings by the condition number).
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._cbuild import CKernel
from ..newton.c import _NS_C_MAX_M, _RULES
from .c_backward import PROTOTYPES as BACKWARD_PROTOTYPES

#: the exported functions (``csrc/nystrom.h``), for float32 and float64 (``_f32``/``_f64``); the library also
#: holds the backwards of :mod:`.c_backward` and the Newton–Schulz functions of :mod:`..newton.c`
PROTOTYPES = (
    "int64_t vitmix_nystrom_forward(const TYPE *q, const TYPE *k, const TYPE *v, const TYPE *lq, "
    "const TYPE *lk, TYPE *out, int64_t S, int64_t n, int64_t nk, int64_t m, int64_t d, int64_t dv, "
    "int kind, TYPE scale, int tied, TYPE eps, int64_t iters, int rule, int norm, TYPE norm_eps, "
    "int nthreads)",
    "int64_t vitmix_laplacian_mix(const TYPE *y, const TYPE *conv_w, const TYPE *conv_b, TYPE *out, "
    "int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, "
    "int64_t mw, TYPE scale, TYPE eps, int64_t iters, int rule, TYPE norm_eps, TYPE contrast, "
    "const TYPE *mean_w, int64_t ksize, TYPE *save, int nthreads)",
    "int64_t vitmix_soft_mix(const TYPE *qp, const TYPE *vp, const TYPE *lm_w, const TYPE *ln_w, "
    "const TYPE *ln_b, TYPE ln_eps, const TYPE *conv_w, TYPE *out, int64_t B, int64_t n, int64_t prefix, "
    "int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw, int64_t s, int pool_first, "
    "TYPE scale, TYPE eps, int64_t iters, int rule, int norm, int64_t ksize, TYPE *save, int nthreads)",
)

#: the fused inference forward as a small C library (built on first use, cached; see :mod:`.._cbuild`)
NYSTROM_KERNEL = CKernel("nystrom_forward", "nystrom.c", PROTOTYPES + BACKWARD_PROTOTYPES)

#: the most landmarks the C forwards take (their Newton–Schulz loop's limit); callers check before projecting
MAX_LANDMARKS = _NS_C_MAX_M

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_NORMS = {None: 0, "soft_norm": 1, "injective": 2}
#: from this many multiply-adds per call the slices run on all threads (one fork/join: ~10 µs)
_PARALLEL_WORK = 1 << 17


def slice_threads(slices: int, work: int) -> int:
    """Threads for a C call over ``slices`` independent slices and ``work`` multiply-adds in all."""
    return min(torch.get_num_threads(), slices) if work >= _PARALLEL_WORK else 1


def applies(tensors, dtype: torch.dtype, inverse: str, alpha: str, symmetric: Optional[bool], backend: str) -> bool:
    """Whether :func:`fused_forward` can run: CPU, float32/float64 compute, eager, no gradient needed,
    the Newton–Schulz inverse with a start the C solve has (not the Cholesky-tested ``"safe"`` start of
    untied landmarks), the same leading dims on every input and m <= 256."""
    q, k, v, lq, lk = tensors
    if (q.device.type != "cpu" or dtype not in _SUFFIX or inverse != "newton" or backend == "triton"
            or (alpha == "safe" and symmetric is not True) or lq.shape[-2] > _NS_C_MAX_M):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _get_current_dispatch_mode() is not None:
        return False
    lead = q.shape[:-2]
    return all(t.shape[:-2] == lead and t.device == q.device for t in tensors)


def fused_forward(q, k, v, lq, lk, *, kernel: str, lam: float, tied: bool, eps: float, iters: int,
                  alpha: str, symmetric: Optional[bool], normalization: Optional[str], norm_eps: float):
    """The whole Nyström forward in one C call (inputs already in the compute dtype), or ``None`` when the
    library is unavailable (no compiler, ``VITMIX_DISABLE_C_KERNEL=1``: the caller's composition runs)."""
    lib = NYSTROM_KERNEL.load()
    if lib is None:
        return None
    lead, (n, d), nk, m, dv = q.shape[:-2], q.shape[-2:], k.shape[-2], lq.shape[-2], v.shape[-1]
    q3, v3, lq3 = (t.reshape(-1, *t.shape[-2:]).contiguous() for t in (q, v, lq))
    k3 = q3 if k is q else k.reshape(-1, *k.shape[-2:]).contiguous()        # tied inputs: one copy
    lk3 = lq3 if lk is lq else lk.reshape(-1, *lk.shape[-2:]).contiguous()
    flat = [q3, k3, v3, lq3, lk3]
    s = flat[0].shape[0]
    out = torch.empty(s, n, dv, dtype=q.dtype)
    rule = _RULES["official" if alpha == "official" else symmetric]
    kind, scale = (0, 0.5) if kernel == "gaussian" else (1, 1.0 / lam)
    work = s * (n + nk) * m * (d + m + dv)
    threads = min(torch.get_num_threads(), s) if work >= _PARALLEL_WORK else 1
    with torch.profiler.record_function("vitmix::nystrom_forward (C)"):
        failed = getattr(lib, f"vitmix_nystrom_forward_{_SUFFIX[q.dtype]}")(
            *(ctypes.c_void_p(t.data_ptr()) for t in (*flat, out)), s, n, nk, m, d, dv, kind, scale, int(tied), eps,
            iters, rule, _NORMS[normalization], norm_eps, threads)
    if failed:
        raise MemoryError(f"nystrom_attention: the C forward could not allocate its buffers for {failed} slices")
    return out.reshape(*lead, n, dv)


def laplacian_mix(y: torch.Tensor, conv_weight: Optional[torch.Tensor], conv_bias: Optional[torch.Tensor], *,
                  grid, heads: int, landmarks, lam: float, eps: float, iters: int, alpha: str, norm_eps: float,
                  contrast: float, mean_weight: Optional[torch.Tensor] = None, save: bool = False):
    """LaplacianFormer's token mixing for inference from its fused ``qkv`` output ``y (B, N, 3C)``, in one C
    call: adaptive-pooled landmarks of the grid queries and keys, the untied Laplacian kernels
    (``exp(-|q - k|₁ / lam)``), Newton–Schulz (``alpha``: ``"transpose"`` or ``"official"``), the injective map
    whose whitened part is multiplied by ``contrast`` and whose ``mean(V)`` term by ``mean_weight (heads,)``
    (``None``: 1), and the depthwise conv of the grid values (``conv_weight
    (C, 1, k, k)``, ``conv_bias (C,)``; ``None``: no conv). Returns ``(B, N, C)`` with the heads merged (the input
    of the output projection), or ``None`` when the library is unavailable or m > 256. The caller checks that this
    configuration is its own (:class:`vitmix.mixers.laplacian.LaplacianAttention` compares against its
    composed path in the tests). ``save=True`` (the training forward of :mod:`.c_grad`; library loaded, m checked)
    returns ``(out, saved)`` with each slice's ``C_q``, ``C_k`` and ``M`` for the C backward."""
    lib = NYSTROM_KERNEL.load()
    if lib is None or landmarks[0] * landmarks[1] > MAX_LANDMARKS:
        return None
    prefix, h, w = grid
    b, n, c3 = y.shape
    c, (mh, mw) = c3 // 3, landmarks
    y = y.contiguous()
    out = torch.empty(b, n, c, dtype=y.dtype)
    ksize = 0 if conv_weight is None else conv_weight.shape[-1]
    wt = conv_weight.reshape(c, -1).to(y.dtype).contiguous() if conv_weight is not None else None
    bias = conv_bias.to(y.dtype).contiguous() if conv_bias is not None and conv_weight is not None else None
    mean_w = mean_weight.to(y.dtype).contiguous() if mean_weight is not None else None
    d, m = c // heads, mh * mw
    threads = slice_threads(b * heads, b * heads * 2 * n * m * (2 * d + m))
    saved = torch.empty(b * heads, 2 * n * m + m * m, dtype=y.dtype) if save else None
    with torch.profiler.record_function("vitmix::laplacian_mix (C)"):
        failed = getattr(lib, f"vitmix_laplacian_mix_{_SUFFIX[y.dtype]}")(
            ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(None if wt is None else wt.data_ptr()),
            ctypes.c_void_p(None if bias is None else bias.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            b, n, prefix, h, w, heads, d, mh, mw, 1.0 / lam, eps, iters,
            _RULES["official" if alpha == "official" else None], norm_eps, contrast,
            ctypes.c_void_p(None if mean_w is None else mean_w.data_ptr()), ksize,
            ctypes.c_void_p(None if saved is None else saved.data_ptr()), threads)
    if failed:
        raise MemoryError(f"laplacian attention: the C forward could not allocate its buffers for {failed} slices")
    return (out, saved) if save else out


def soft_mix(qp: torch.Tensor, vp: torch.Tensor, landmark_conv: Optional[torch.Tensor], landmark_norm,
             conv_weight: Optional[torch.Tensor], *, grid, heads: int, landmarks, stride: int, pool_first: bool,
             scale: float, eps: float, iters: int, alpha: str, normalization: Optional[str], save: bool = False):
    """SOFT's token mixing from its projections ``qp = W_q x`` and ``vp = W_v x`` (``(B, N, C)``) in one C call:
    queries ``scale · qp``; landmarks by the strided conv ``landmark_conv (d, d, s, s)``, then LayerNorm(d) with
    ``landmark_norm = (weight, bias, eps)`` and GELU (``landmark_conv=None``: window means), the tied Gaussian
    kernels, Newton–Schulz (``alpha``; the symmetric start), ``normalization`` ``None`` or ``"soft_norm"``, and the
    per-head filter ``conv_weight (heads, 1, k, k)`` on the grid values. Returns ``(B, N, C)`` with the heads
    merged, or ``None`` when the library is unavailable or m > 256. ``save=True`` (the training forward of
    :mod:`.c_grad`; library loaded, m checked) returns ``(out, saved)`` with each slice's ``C_q``, ``M`` and
    landmarks before the LayerNorm for the C backward."""
    lib = NYSTROM_KERNEL.load()
    if lib is None or landmarks[0] * landmarks[1] > MAX_LANDMARKS:
        return None
    prefix, h, w = grid
    b, n, c = qp.shape
    (mh, mw), d = landmarks, c // heads
    dt = qp.dtype
    qp, vp = qp.contiguous(), vp.to(dt).contiguous()
    out = torch.empty(b, n, c, dtype=dt)
    lm_w = None if landmark_conv is None else landmark_conv.to(dt).contiguous()
    ln_w = ln_b = None
    ln_eps = 0.0
    if lm_w is not None:
        ln_w, ln_b, ln_eps = landmark_norm
        ln_w, ln_b = ln_w.to(dt).contiguous(), ln_b.to(dt).contiguous()
    ksize = 0 if conv_weight is None else conv_weight.shape[-1]
    cw = None if conv_weight is None else conv_weight.reshape(heads, -1).to(dt).contiguous()
    m = mh * mw
    threads = slice_threads(b * heads, b * heads * n * m * (2 * d + m))
    saved = torch.empty(b * heads, n * m + m * m + m * d, dtype=dt) if save else None
    ptr = [ctypes.c_void_p(None if t is None else t.data_ptr()) for t in (qp, vp, lm_w, ln_w, ln_b)]
    with torch.profiler.record_function("vitmix::soft_mix (C)"):
        failed = getattr(lib, f"vitmix_soft_mix_{_SUFFIX[dt]}")(
            *ptr, ln_eps, ctypes.c_void_p(None if cw is None else cw.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            b, n, prefix, h, w, heads, d, mh, mw, stride, int(pool_first), scale, eps, iters,
            _RULES["official" if alpha == "official" else True], _NORMS[normalization], ksize,
            ctypes.c_void_p(None if saved is None else saved.data_ptr()), threads)
    if failed:
        raise MemoryError(f"SOFT attention: the C forward could not allocate its buffers for {failed} slices")
    return (out, saved) if save else out
