"""Nyström attention's whole forward in one C call on CPU (inference; private): the binding of
``vitmix/ops/csrc/nystrom.c``.

At batch 1 a SOFT or LaplacianFormer layer's core is ~40 small torch ops (three kernel matrices, the
Newton–Schulz start and loop, the normaliser's products), each costing more in dispatch than in
arithmetic: 197 tokens × 25 landmarks × 32 channels is ~0.16 M multiply-adds per matrix. Here one
work item per (batch, head) slice computes, in cache-resident buffers,

    C_q = k(Q, L_k), C_k = k(K, L_q), W = k(L_q, L_k), M = NS(W + eps·I)     (the NS source is shared
    with :mod:`vitmix.ops.newton.c`: same start rules, same loop)
    out = C_q M C_kᵀ V  |  SOFT-Norm's D^(-1/2) M D^(-1/2)  |  the injective map (module docstring of
    :mod:`vitmix.ops.nystrom`: centred keys D, T = Mᵀ cov(C_q) M, s = (diag(D T Dᵀ) + ε)^(-1/2),
    out = C_q M Dᵀ (s ⊙ V) + mean(V))

with no autograd: :func:`vitmix.ops.nystrom_attention` uses it only when no input needs a gradient
(``torch.no_grad()``, ``model.eval()`` inference), and falls back to its composition of ops wherever this
does not apply (no compiler, other devices or dtypes, ``inverse="exact"``, the Cholesky-tested
``alpha="safe"`` start on untied landmarks, tracing, unbroadcast leading dims). Its reference is that
composition; the two agree to float32 rounding (the kernels are summed directly, not by the GEMM
expansion, and the Newton–Schulz loop amplifies those roundings by the condition number). The same C
core (``csrc/nystrom_core_typed.h``) is the middle of LaplacianFormer's and SOFT's whole-layer C paths,
which live with the layers (:mod:`vitmix.mixers.fused`).
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._cbuild import CKernel
from ..newton.c import _NS_C_MAX_M, _RULES

#: the exported functions (``csrc/nystrom.h``), for float32 and float64 (``_f32``/``_f64``); the library also
#: holds the Newton–Schulz functions of :mod:`..newton.c`
PROTOTYPES = (
    "int64_t vitmix_nystrom_forward(const TYPE *q, const TYPE *k, const TYPE *v, const TYPE *lq, "
    "const TYPE *lk, TYPE *out, int64_t S, int64_t n, int64_t nk, int64_t m, int64_t d, int64_t dv, "
    "int kind, TYPE scale, int tied, TYPE eps, int64_t iters, int rule, int norm, TYPE norm_eps, "
    "int nthreads)",
)

#: the fused inference forward as a small C library (built on first use, cached; see :mod:`.._cbuild`)
NYSTROM_KERNEL = CKernel("nystrom_forward", "nystrom.c", PROTOTYPES)

#: the most landmarks the C forwards take (their Newton–Schulz loop's limit; also the landmark layers' C path's)
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
