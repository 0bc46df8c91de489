"""O(N²) references of Nyström kernel attention: the full approximate matrix formed explicitly, and exact
kernel attention."""
from __future__ import annotations

from typing import Optional

import torch

from .._common import compute_dtype, no_autocast
from ..kernel.checks import _check_lam
from ..newton import newton_schulz_reference
from .checks import _KERNELS, _kernel_fn, _validate


def nystrom_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_landmarks: torch.Tensor,
    k_landmarks: torch.Tensor,
    kernel: str = "gaussian",
    lam: float = 4.0,
    iters: int = 20,
    eps: float = 0.01,
    inverse: str = "newton",
    normalization: Optional[str] = None,
    norm_eps: float = 1e-6,
    *,
    alpha: str = "safe",
    symmetric: Optional[bool] = None,
) -> torch.Tensor:
    """O(N²) reference of :func:`nystrom_attention`: forms the full approximate matrix
    ``Ĝ = k(Q, L_k) M k(L_q, K)`` explicitly (reference kernels, unrolled Newton–Schulz with autograd,
    or ``torch.linalg.inv`` for ``inverse="exact"``), normalises it directly and multiplies by ``V``."""
    _validate(q, k, v, q_landmarks, k_landmarks, kernel, iters, eps, inverse, normalization, norm_eps,
              name="nystrom_attention_reference")
    lam_f = _check_lam(lam)
    out_dtype = torch.promote_types(q.dtype, v.dtype)
    kern = _kernel_fn(kernel, lam_f, reference=True)
    with no_autocast(q.device.type):
        dt = compute_dtype(q, k, v, q_landmarks, k_landmarks)
        qf, kf, vf = q.to(dt), k.to(dt), v.to(dt)
        lqf, lkf = q_landmarks.to(dt), k_landmarks.to(dt)
        cq = kern(qf, lkf)
        ck = kern(kf, lqf)
        w = kern(lqf, lkf)
        if inverse == "exact":
            M = torch.linalg.inv(w + eps * torch.eye(w.shape[-1], dtype=dt, device=w.device))
        else:
            sym = True if k_landmarks is q_landmarks else symmetric
            M = newton_schulz_reference(w, iters=iters, eps=eps, symmetric=sym, alpha=alpha)
        if normalization == "soft_norm":
            dinv = torch.diag_embed(w.sum(-1).rsqrt())
            M = dinv @ M @ dinv
        g = cq @ M @ ck.mT                                  # (…, N, N_k), explicitly
        if normalization == "injective":
            r = g - g.mean(-1, keepdim=True)
            var = r.var(dim=-2, correction=0, keepdim=True)
            g = r / torch.sqrt(var + norm_eps) + 1.0 / g.shape[-1]
        out = g @ vf
    return out.to(out_dtype)


def kernel_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str = "gaussian", lam: float = 4.0
) -> torch.Tensor:
    """Exact, unnormalised kernel attention ``k(Q, K) · V`` (forms the ``N×N_k`` kernel matrix)."""
    if kernel not in _KERNELS:
        raise ValueError(f"kernel_attention_reference: kernel must be one of {_KERNELS}, got {kernel!r}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"kernel_attention_reference: v has {v.shape[-2]} tokens but k has {k.shape[-2]}")
    kern = _kernel_fn(kernel, _check_lam(lam), reference=True)
    out_dtype = torch.promote_types(q.dtype, v.dtype)
    with no_autocast(q.device.type):
        dt = compute_dtype(q, k, v)
        g = kern(q.to(dt), k.to(dt))
        return (g @ v.to(dt)).to(out_dtype)
