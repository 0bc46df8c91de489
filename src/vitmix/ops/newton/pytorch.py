"""The Newton–Schulz inverse in PyTorch (private): the batched-BLAS loop and the dispatch of the loop to
the Triton (:mod:`vitmix.ops.newton.triton`) or C (:mod:`vitmix.ops.newton.c`) kernel, the exact (LU)
mode, the forward with its checked fallback, the implicit backward, the eager ``autograd.Function`` and
the export decomposition."""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._common import cpu_single_thread, no_autocast, single_thread_if_small
from .._triton import wants_triton
from . import start
from .c import _c_iterate, _c_solve
from .start import _identity_ok, _needs_fallback, _norms, _perturb, _pick, _residual, _start, _symmetric_mask
from .start import _transposed_start


def _triton_iterate(P3: torch.Tensor, V3: torch.Tensor, iters: int, backend: str):
    """The Triton loop when ``backend`` chooses it for ``P3`` (see :mod:`vitmix.ops._triton`), else ``None``.
    Never under a Python dispatch mode (``FlopCounterMode`` and the like count the PyTorch path)."""
    if iters == 0 or backend == "torch" or _get_current_dispatch_mode() is not None:
        return None
    from . import triton as newton_triton      # imports triton: only when a Triton path may run

    if not wants_triton("newton_schulz_inverse", P3, backend, newton_triton.unsupported(P3)):
        return None
    return newton_triton.iterate(P3, V3, iters)


def _iterate(P: torch.Tensor, V: torch.Tensor, iters: int, allow_c: bool = True, backend: str = "auto") -> torch.Tensor:
    """``iters`` steps ``V <- 2V - V P V``; ``allow_c=False`` (export decompositions) keeps to batched
    matmuls, otherwise the Triton kernel (as ``backend`` says) or the CPU C kernel runs when it applies."""
    shape = P.shape
    P3 = P.reshape(-1, shape[-2], shape[-1])
    V3 = V.reshape(-1, shape[-2], shape[-1]).contiguous()
    out = None
    if allow_c:
        out = _triton_iterate(P3, V3, iters, backend)
        if out is None:
            out = _c_iterate(P3, V3, iters)
    if out is not None:
        return out.reshape(shape)
    for _ in range(iters):
        # V <- 2V - V (P V)
        V3 = torch.baddbmm(V3, V3, torch.bmm(P3, V3), beta=2.0, alpha=-1.0)
    return V3.reshape(shape)


def _exact_inverse(P: torch.Tensor) -> torch.Tensor:
    """LU inverse; the pseudo-inverse when some matrix of the batch is singular to working precision
    (e.g. ε = 0 and duplicate landmarks) or the factorisation is unusable. ``inv_ex`` is not used:
    on such a batch MKL prints errors and raises instead of reporting it."""
    m = P.shape[-1]
    # one thread: batched multi-threaded MKL getrf (torch 2.14 CPU) has returned out-of-range pivots
    # with info = 0 and printed "Parameter 6 was incorrect on entry to DLASWP" (m = 196, float64,
    # 2 threads, mid-analysis); the pivots are still checked before they are used
    with cpu_single_thread(P):
        lu, pivots, info = torch.linalg.lu_factor_ex(P)
    eye = torch.eye(m, dtype=P.dtype, device=P.device).expand_as(P)
    finite = torch.isfinite(P).flatten(-2).all(-1)[..., None, None]     # NaN/Inf inputs stay NaN
    if bool((info == 0).all()) and bool(((pivots >= 1) & (pivots <= m)).all()):
        V = torch.linalg.lu_solve(lu, pivots, eye)
        if bool((torch.isfinite(V) | ~finite).all()):
            return V
    V = torch.linalg.pinv(torch.where(finite, P, eye))
    return torch.where(finite, V, torch.full_like(V, float("nan")))


def _newton_forward(A: torch.Tensor, iters: int, eps: float, symmetric: Optional[bool], alpha: str,
                    mode: str, backend: str = "auto") -> torch.Tensor:
    """``V ≈ (A + eps·I)^{-1}`` without autograd (the start, the iteration and its checked fallback).

    On the CPU the start and the fallback are skipped where the tensors say they are not needed (reading
    them costs nothing there); elsewhere (CUDA) :func:`_newton_fixed` decides on the device, so a call
    never waits for the GPU and CUDA graphs can capture it."""
    m = A.shape[-1]
    if mode == "newton" and backend != "triton":
        # one C call (one parallel region on the caller's threads) where the start needs no Cholesky test
        V = _c_solve(A.detach(), eps, iters, symmetric, alpha)
        if V is not None:
            return V
    with torch.no_grad(), single_thread_if_small(A, A.numel() * m):
        if mode == "newton" and start._sync_free(A):
            return _newton_fixed(A, iters, eps, symmetric, alpha, backend)
        P = _perturb(A, eps)
        if mode == "exact":
            return _exact_inverse(P)
        V0, identity = _start(A, P, symmetric, alpha)
        V = _iterate(P, V0, iters, backend=backend)
        need = _needs_fallback(P, V, identity)
        if bool(need.any()):        # never traced: compilers see the custom op (or the decomposition below)
            V = _pick(P, V, _iterate(P, _transposed_start(P), iters, backend=backend), need)
        return V


def _newton_decomposition(A: torch.Tensor, iters: int, eps: float, symmetric: Optional[bool], alpha: str,
                          mode: str, backend: str = "auto") -> torch.Tensor:
    """:func:`_newton_fixed` of batched matmuls only: the export decomposition of
    ``vitmix::newton_schulz_inverse``; ``mode="exact"`` has no such form and raises ``ValueError``.
    ``backend`` is ignored."""
    if mode == "exact":
        raise ValueError("newton_schulz_inverse(mode='exact') (an LU solve with a pseudo-inverse fallback for "
                         "singular batches) has no fixed export form; export the model with inverse='newton'")
    return _newton_fixed(A, iters, eps, symmetric, alpha, kernels=False)


def _newton_fixed(A: torch.Tensor, iters: int, eps: float, symmetric: Optional[bool], alpha: str,
                  backend: str = "auto", kernels: bool = True) -> torch.Tensor:
    """:func:`_newton_forward` as a fixed sequence of tensor ops (no Python branch on tensor values, so
    no host sync): same start, iteration and residual rule as the CPU path, but the ``"safe"`` start of
    landmarks not known to be symmetric always runs its Cholesky test and both loops (the identity
    start and the ``αPᵀ`` one), picking one per matrix. ``kernels=False`` keeps the loop to batched
    matmuls (export decompositions); otherwise the Triton or C loop runs as ``backend`` says."""
    def loop(P, V0):
        return _iterate(P, V0, iters, allow_c=kernels, backend=backend)

    P = _perturb(A, eps)
    if alpha == "official":
        return loop(P, (1.8 / A.sum(-1).amax(-1).square())[..., None, None] * P)
    row, _ = _norms(P)
    sym = _symmetric_mask(A, symmetric)
    V0 = torch.where(sym[..., None, None], (1.8 / row.square())[..., None, None] * P, _transposed_start(P))
    if alpha != "safe" or symmetric is True:
        return loop(P, V0)
    identity = ~sym & _identity_ok(P)
    eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    V = loop(P, torch.where(identity[..., None, None], (1.0 / row)[..., None, None] * eye, V0))
    res = _residual(P, V)
    need = identity & (~torch.isfinite(res) | (res >= start._FALLBACK_RESIDUAL))
    return _pick(P, V, loop(P, _transposed_start(P)), need)


def _newton_grad(V: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``dL/dA = -Vᵀ (dL/dV) Vᵀ``: the derivative of an inverse, evaluated once at the result."""
    with no_autocast(g.device.type), single_thread_if_small(V, V.numel() * V.shape[-1]):
        Vt = V.mT
        return -(Vt @ g @ Vt)


class _NewtonInverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, iters, eps, symmetric, alpha, mode, backend):
        V = _newton_forward(A, iters, eps, symmetric, alpha, mode, backend)
        ctx.save_for_backward(V)
        return V

    @staticmethod
    def backward(ctx, g):
        (V,) = ctx.saved_tensors
        return _newton_grad(V, g), None, None, None, None, None, None
