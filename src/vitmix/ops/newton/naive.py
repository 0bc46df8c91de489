"""The obviously-correct Newton–Schulz reference: the plain unrolled iteration with autograd through
every step (memory O(iters·m²))."""
from __future__ import annotations

from typing import Optional

import torch

from .._common import compute_dtype, no_autocast
from .start import _needs_fallback, _perturb, _pick, _start, _transposed_start, _validate

__all__ = ["newton_schulz_reference"]


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
