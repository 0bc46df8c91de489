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
cache, :mod:`vitmix.ops.newton.c`; on CUDA, float32, m <= 128 a Triton kernel with one program per
matrix, :mod:`vitmix.ops.newton.triton`, chosen by ``backend`` as in ``docs/gpu.md``; batched BLAS
otherwise). Off the CPU the start and the checked fallback are chosen by tensor ops only (the
``"safe"`` start of landmarks not known to be symmetric then runs both loops and keeps one per
matrix), so a call never waits for the GPU and CUDA graphs can capture it. The backward is the analytic
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

Layout: this module holds the public function and the custom ops; ``naive.py`` the reference,
``start.py`` the start and fallback rule every path shares, ``pytorch.py`` the PyTorch back end (and
the loop's dispatch), ``c.py`` the CPU C loop (source and binding), ``triton.py`` the Triton loop.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .._common import compute_dtype, exporting_to_onnx, no_autocast, traced
from .._triton import check_backend
from .naive import newton_schulz_reference
from .pytorch import _NewtonInverse, _newton_decomposition, _newton_forward, _newton_grad
from .start import _perturb, _residual, _validate


__all__ = ["newton_schulz_inverse", "newton_schulz_reference"]


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
