"""Newton–Schulz (Newton–Raphson) matrix inverse, batched, with the implicit backward of SOFT.

For ``P = A + eps·I`` the iteration ``V <- 2V - V P V`` converges quadratically to ``P^{-1}`` when
the start ``V0`` makes the eigenvalues of ``V0 P`` lie in ``(0, 2)``. :func:`newton_schulz_inverse`
chooses ``V0`` per matrix:

``alpha="safe"`` (default)
    * symmetric ``A`` (detected per matrix, or forced with ``symmetric=True``): ``V0 = α P`` with
      ``α = 1.8 / ||P||_∞²``, ``||P||_∞`` the largest absolute row sum of the **perturbed** ``P``.
      Since ``|λ(P)| <= ||P||_∞`` the eigenvalues ``α λ²`` of ``V0 P`` lie in ``(0, 1.8]``. Taking the
      norm of ``P`` rather than of ``A`` keeps ``α`` bounded when the kernel values are tiny and the
      ``eps·I`` dominates (the divergence fixed in LaplacianFormer's third-party commit bf89660).
      This is SOFT's start (it shapes SOFT's spectrally filtered inverse), kept for parity.
    * non-symmetric ``A`` (e.g. LaplacianFormer's ``K(L_q, L_k)`` with untied landmarks), chosen per
      matrix by one batched Cholesky of the symmetric part ``(P + Pᵀ)/2`` (``m³/3`` flops, a tenth
      of one iteration):

      - symmetric part positive definite (every eigenvalue of ``P`` then has a positive real part,
        typical for landmarks pooled from correlated tokens): the scaled identity
        ``V0 = I / ||P||_∞``. Its residual ``I - V0 P`` has eigenvalues ``1 - μ/||P||_∞``, so the
        iteration converges in about ``log2(cond(P))`` steps, not ``log2(cond(P)²)`` as from
        ``αPᵀ`` or ``αP`` (both square the spectrum): at cond(P) ≈ 600 the residual after 20 steps
        is ~7e-5 instead of ~1e-2. The result is checked (``||I - P V||_F`` non-finite or
        ``>= 0.5``: rerun from ``αPᵀ``, keep the smaller residual), which costs one ``m×m``
        product and almost never reruns;
      - otherwise (indefinite ``P``, e.g. untrained q/k projections): ``V0 = α Pᵀ`` with
        ``α = 1 / (||P||_1 ||P||_∞)``; ``V0 P = α PᵀP`` has eigenvalues ``α σ² <= 1``: always
        converges, slowly.

``alpha="transpose"``
    The guaranteed but slow ``V0 = α Pᵀ`` start for every non-symmetric matrix (vitmix ≤ 0.1's
    default; symmetric matrices as ``"safe"``).

``alpha="official"``
    Reproduces SOFT's ``newton_inverse_kernel`` and LaplacianFormer's ``NewtonInverse`` CUDA op:
    ``α = 1.8 / (max_i Σ_j A_ij)²`` from the **unperturbed** ``A`` and ``V0 = α P`` whatever the
    symmetry (``symmetric`` is ignored). Use it to match released checkpoints.

The forward runs without autograd (on CPU the loop is a small C kernel that keeps each m×m matrix in
cache, :mod:`vitmix.ops._ns_kernel`; on CUDA, float32, m <= 128 a Triton kernel with one program per
matrix, :mod:`vitmix.ops._triton_newton`, chosen by ``backend`` as in ``docs/gpu.md``; batched BLAS
otherwise); the backward is the analytic
derivative of an inverse evaluated
once at the result, ``dL/dA = -Vᵀ G Vᵀ`` (exact at convergence; with few iterations SOFT's "inverse"
is a spectrally filtered one, and this backward is what the official code uses). Everything runs in
float32 (float64 stays float64) with autocast disabled; half inputs give a float32 result.
``mode="exact"`` replaces the iteration with an LU inverse of ``P`` (pseudo-inverse if singular; same
backward), for analysis.

Eager calls run the ``autograd.Function`` ``_NewtonInverse``; under ``torch.compile`` / ``torch.export``
the same forward and backward run as the custom ops ``vitmix::newton_schulz_inverse`` and
``vitmix::newton_schulz_inverse_backward`` (one graph node each; the C loop runs when the compiled code
does).
"""
from __future__ import annotations

import ctypes
import math
from typing import Optional, Tuple, Union

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._cbuild import CKernel
from ._common import (
    check_finite_float, compute_dtype, cpu_single_thread, exporting_to_onnx, no_autocast, single_thread_if_small,
    traced,
)
from ._triton import check_backend, wants_triton

__all__ = ["newton_schulz_inverse", "newton_schulz_reference"]

_ALPHAS = ("safe", "transpose", "official")
_SYM_RTOL = 1e-5
_FALLBACK_RESIDUAL = 0.5     # ||I - P V||_F at or above this: the identity start did not converge


def _validate(name: str, A, iters, eps, symmetric, alpha, mode=None) -> Tuple[int, float]:
    check_finite_float(f"{name}: A", A)
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name}: A must be a batch of square matrices (..., m, m), got shape {tuple(A.shape)}")
    if A.shape[-1] < 1:
        raise ValueError(f"{name}: A must be at least 1x1, got shape {tuple(A.shape)}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"{name}: iters must be an int >= 0 (default 20), got {iters!r}")
    try:
        eps_f = float(eps)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: eps must be a float >= 0 (default 0.01), got {eps!r}") from err
    if not (eps_f >= 0 and math.isfinite(eps_f)):
        raise ValueError(f"{name}: eps must be a finite float >= 0 (default 0.01), got {eps!r}")
    if symmetric not in (None, True, False):
        raise ValueError(f"{name}: symmetric must be None (detect per matrix), True or False, got {symmetric!r}")
    if alpha not in _ALPHAS:
        raise ValueError(f"{name}: alpha must be one of {', '.join(map(repr, _ALPHAS))} (default 'safe'), "
                         f"got {alpha!r}")
    if mode is not None and mode not in ("newton", "exact"):
        raise ValueError(f"{name}: mode must be 'newton' (default) or 'exact', got {mode!r}")
    return iters, eps_f


def _perturb(A: torch.Tensor, eps: float) -> torch.Tensor:
    if eps == 0.0:
        return A.clone()
    m = A.shape[-1]
    return A + eps * torch.eye(m, dtype=A.dtype, device=A.device)


def _is_symmetric(A: torch.Tensor) -> torch.Tensor:
    """Per-matrix boolean ``(...,)``: ``max|A - Aᵀ| <= 1e-5 · max|A|`` (rounding of kernel GEMMs)."""
    asym = (A - A.mT).abs().amax(dim=(-2, -1))
    scale = A.abs().amax(dim=(-2, -1))
    return asym <= _SYM_RTOL * scale


def _norms(P: torch.Tensor):
    return P.abs().sum(-1).amax(-1), P.abs().sum(-2).amax(-1)      # ||P||_inf, ||P||_1


def _symmetric_mask(A: torch.Tensor, symmetric: Optional[bool]) -> torch.Tensor:
    if symmetric is None:
        return _is_symmetric(A)
    fill = torch.ones if symmetric else torch.zeros    # not torch.full(..., True): torch.jit.trace cannot
    return fill(A.shape[:-2], dtype=torch.bool, device=A.device)


def _start(A: torch.Tensor, P: torch.Tensor, symmetric: Optional[bool], alpha: str):
    """The first iterate ``V0`` per matrix (a constant: no gradient flows through the start) and the
    per-matrix mask of identity starts (only ``"safe"`` uses them)."""
    with torch.no_grad():
        if alpha == "official":
            a = 1.8 / A.sum(-1).amax(-1).square()
            return a[..., None, None] * P, torch.zeros_like(a, dtype=torch.bool)
        row, _ = _norms(P)
        sym = _symmetric_mask(A, symmetric)
        identity = torch.zeros_like(sym)
        if alpha == "safe" and (torch.compiler.is_compiling() or not bool(sym.all())):
            identity = ~sym & _identity_ok(P)
        v_sym = (1.8 / row.square())[..., None, None] * P
        eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
        v0 = torch.where(sym[..., None, None], v_sym, _transposed_start(P))
        return torch.where(identity[..., None, None], (1.0 / row)[..., None, None] * eye, v0), identity


def _identity_ok(P: torch.Tensor) -> torch.Tensor:
    """Per matrix: is the symmetric part of ``P`` positive definite (so the identity start converges)?"""
    return torch.linalg.cholesky_ex(0.5 * (P + P.mT)).info == 0


def _transposed_start(P: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        row, col = _norms(P)
        return (1.0 / (row * col))[..., None, None] * P.mT


def _needs_fallback(P: torch.Tensor, V: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
    """Identity-started matrices whose iteration did not converge (rerun from ``αPᵀ``)."""
    with torch.no_grad():
        if not (torch.compiler.is_compiling() or bool(identity.any())):
            return identity
        res = _residual(P, V)
        return identity & (~torch.isfinite(res) | (res >= _FALLBACK_RESIDUAL))


def _pick(P: torch.Tensor, V: torch.Tensor, V_t: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Per matrix, the transposed-start result where it is needed and has the smaller residual."""
    with torch.no_grad():
        r, r_t = _residual(P, V), _residual(P, V_t)
        use_t = need & (~torch.isfinite(r) | (r_t < r))
    return torch.where(use_t[..., None, None], V_t, V)


def _ns_source() -> str:
    from ._ns_kernel import SOURCE

    return SOURCE


def _ns_declare(lib) -> None:
    for sfx in ("f32", "f64"):
        fn = getattr(lib, f"vitmix_ns_{sfx}")
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = None


#: the Newton–Schulz loop as a small C kernel (per-matrix, cache-resident; see ``_ns_kernel``)
NS_KERNEL = CKernel("ns_kernel", _ns_source, _ns_declare)
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


def _triton_iterate(P3: torch.Tensor, V3: torch.Tensor, iters: int, backend: str):
    """The Triton loop when ``backend`` chooses it for ``P3`` (see :mod:`vitmix.ops._triton`), else ``None``.
    Never under a Python dispatch mode (``FlopCounterMode`` and the like count the PyTorch path)."""
    if iters == 0 or backend == "torch" or _get_current_dispatch_mode() is not None:
        return None
    from . import _triton_newton

    if not wants_triton("newton_schulz_inverse", P3, backend, _triton_newton.unsupported(P3)):
        return None
    return _triton_newton.iterate(P3, V3, iters)


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


def _residual(P: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    return torch.linalg.matrix_norm(eye - P @ V)


def _newton_forward(A: torch.Tensor, iters: int, eps: float, symmetric: Optional[bool], alpha: str,
                    mode: str, backend: str = "auto") -> torch.Tensor:
    """``V ≈ (A + eps·I)^{-1}`` without autograd (the start, the iteration and its checked fallback)."""
    m = A.shape[-1]
    with torch.no_grad(), single_thread_if_small(A, A.numel() * m):
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
    """:func:`_newton_forward` as a fixed sequence of tensor ops (no Python branch on tensor values): the
    export decomposition of ``vitmix::newton_schulz_inverse``, ``iters`` unrolled ``V <- 2V - V P V``
    steps of batched matmuls. Same start, iteration and residual rule as the eager path (the
    ``"safe"`` start of untied landmarks keeps its Cholesky test and runs both starts, picking one
    per matrix); ``mode="exact"`` has no such form and raises ``ValueError``. ``backend`` is ignored."""
    if mode == "exact":
        raise ValueError("newton_schulz_inverse(mode='exact') (an LU solve with a pseudo-inverse fallback for "
                         "singular batches) has no fixed export form; export the model with inverse='newton'")
    P = _perturb(A, eps)
    if alpha == "official":
        V0 = (1.8 / A.sum(-1).amax(-1).square())[..., None, None] * P
        return _iterate(P, V0, iters, allow_c=False)
    row, _ = _norms(P)
    sym = _symmetric_mask(A, symmetric)
    V0 = torch.where(sym[..., None, None], (1.8 / row.square())[..., None, None] * P, _transposed_start(P))
    if alpha != "safe" or symmetric is True:
        return _iterate(P, V0, iters, allow_c=False)
    identity = ~sym & _identity_ok(P)
    eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    V0 = torch.where(identity[..., None, None], (1.0 / row)[..., None, None] * eye, V0)
    V = _iterate(P, V0, iters, allow_c=False)
    res = _residual(P, V)
    need = identity & (~torch.isfinite(res) | (res >= _FALLBACK_RESIDUAL))
    return _pick(P, V, _iterate(P, _transposed_start(P), iters, allow_c=False), need)


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


@torch.library.custom_op("vitmix::newton_schulz_inverse", mutates_args=())
def _newton_op(A: torch.Tensor, iters: int, eps: float, symmetric: Optional[bool], alpha: str,
               mode: str, backend: str = "auto") -> torch.Tensor:
    """:func:`newton_schulz_inverse` of a float32/float64 batch ``A (..., m, m)`` (validated arguments)."""
    return _newton_forward(A, iters, eps, symmetric, alpha, mode, backend).contiguous()


@torch.library.custom_op("vitmix::newton_schulz_inverse_backward", mutates_args=())
def _newton_backward_op(V: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gradient of :func:`_newton_op` w.r.t. ``A`` from its result ``V`` and ``g = dL/dV``."""
    with torch.no_grad():
        return _newton_grad(V, g).contiguous()


@_newton_op.register_fake
def _(A, iters, eps, symmetric, alpha, mode, backend="auto"):
    return A.new_empty(A.shape)


@_newton_backward_op.register_fake
def _(V, g):
    return V.new_empty(V.shape)


def _save_result(ctx, inputs, output):
    ctx.save_for_backward(output)


def _newton_op_grad(ctx, g):
    (V,) = ctx.saved_tensors
    return _newton_backward_op(V, g), None, None, None, None, None, None


_newton_op.register_autograd(_newton_op_grad, setup_context=_save_result)


def _newton_route(symmetric: Optional[bool], alpha: str):
    """The decomposition while an ONNX export traces, the custom op while traced, else the eager function."""
    if exporting_to_onnx():
        if alpha == "safe" and symmetric is not True:
            raise ValueError("newton_alpha='safe' on untied landmarks picks its start with a Cholesky test, which "
                             "ONNX lacks; build the model with newton_alpha='transpose' or 'official' to export it")
        return _newton_decomposition
    return _newton_op if traced() else _NewtonInverse.apply


def newton_schulz_inverse(
    A: torch.Tensor,
    iters: int = 20,
    eps: float = 0.01,
    symmetric: Optional[bool] = None,
    mode: str = "newton",
    alpha: str = "safe",
    return_residual: bool = False,
    backend: str = "auto",
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Approximate ``(A + eps·I)^{-1}`` for a batch ``A: (..., m, m)`` by Newton–Schulz.

    Args:
        A: ``(..., m, m)``, batched over all leading dims (e.g. ``(B, heads, m, m)``).
        iters: number of iterations ``V <- 2V - V P V`` (SOFT/LaplacianFormer: 20).
        eps: diagonal perturbation, ``P = A + eps·I`` (official: 0.01).
        symmetric: ``None`` detects per matrix (``max|A-Aᵀ| <= 1e-5·max|A|``); ``True``/``False`` forces
            the ``αP`` / ``αPᵀ`` start (see the module docstring). Ignored by ``alpha="official"``.
        mode: ``"newton"`` (default) or ``"exact"`` (LU inverse of ``P``, pseudo-inverse if singular; for analysis).
        alpha: ``"safe"`` (default: ``αP`` for symmetric, the checked scaled-identity start for
            non-symmetric matrices), ``"transpose"`` (``αPᵀ`` for non-symmetric ones) or ``"official"``
            (SOFT / LaplacianFormer CUDA: ``α`` from the unperturbed ``A``, ``V0 = αP``).
        return_residual: also return ``||I - P V||_F`` per matrix, shape ``(...,)`` (no gradient).
        backend: who runs the loop: ``"auto"`` (Triton for CUDA float32 batches with m <= 128, the C
            kernel on CPU), ``"triton"`` or ``"torch"`` (see ``docs/gpu.md``); the start and the
            backward are the same for every back end.

    Returns:
        ``V`` of shape ``(..., m, m)`` (float32 for half inputs), and the residual if requested.
        The backward is ``dL/dA = -Vᵀ (dL/dV) Vᵀ``, computed once (no autograd through iterations).
        NaN/Inf in ``A`` propagate to ``V`` (the iteration count is fixed, so nothing can hang).
    """
    iters, eps_f = _validate("newton_schulz_inverse", A, iters, eps, symmetric, alpha, mode)
    check_backend("newton_schulz_inverse", backend)
    with no_autocast(A.device.type):
        Af = A.to(compute_dtype(A))
        V = _newton_route(symmetric, alpha)(Af, iters, eps_f, symmetric, alpha, mode, backend)
        if return_residual:
            with torch.no_grad():
                return V, _residual(_perturb(Af.detach(), eps_f), V.detach())
    return V


def newton_schulz_reference(
    A: torch.Tensor,
    iters: int = 20,
    eps: float = 0.01,
    symmetric: Optional[bool] = None,
    alpha: str = "safe",
) -> torch.Tensor:
    """Reference: the same (constant) start ``V0``, then the plain unrolled iteration
    ``V <- 2V - V P V`` with autograd through every step (memory O(iters·m²), gradients by unrolling).
    For ``alpha="safe"`` both starts of a non-symmetric matrix are always unrolled and the same
    residual rule picks one."""
    iters, eps_f = _validate("newton_schulz_reference", A, iters, eps, symmetric, alpha)
    with no_autocast(A.device.type):
        Af = A.to(compute_dtype(A))
        P = _perturb(Af, eps_f)

        def unrolled(V):
            for _ in range(iters):
                V = 2 * V - V @ P @ V
            return V

        V0, identity = _start(Af.detach(), P.detach(), symmetric, alpha)
        V = unrolled(V0)
        need = _needs_fallback(P.detach(), V.detach(), identity)
        V = _pick(P.detach(), V, unrolled(_transposed_start(P.detach())), need)
    return V
