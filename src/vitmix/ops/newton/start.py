"""What every Newton–Schulz path shares (private): argument checks, the start ``V0`` per ``alpha`` mode,
the residual and the checked fallback rule. The fast paths (:mod:`vitmix.ops.newton.pytorch`) and the
reference (:mod:`vitmix.ops.newton.naive`) both call these, so they pick the same start."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .._common import check_finite_float


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


def _sync_free(A: torch.Tensor) -> bool:
    """Whether the start and the checked fallback must be chosen without reading a tensor on the host:
    everywhere but on the CPU, where reading one is free. On a GPU every ``bool()`` waits for the device
    (a sync per call) and makes the op impossible to capture in a CUDA graph."""
    return A.device.type != "cpu"


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


def _residual(P: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    return torch.linalg.matrix_norm(eye - P @ V)
