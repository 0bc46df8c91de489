"""Argument checks and kernel choice shared by :func:`vitmix.ops.nystrom_attention` and its references (private)."""
from __future__ import annotations

import torch

from .._common import check_finite_float
from ..kernel import (
    gaussian_kernel,
    gaussian_kernel_reference,
    laplacian_kernel,
    laplacian_kernel_reference,
)

_KERNELS = ("gaussian", "laplacian")


_NORMS = (None, "soft_norm", "injective")


def _validate(q, k, v, lq, lk, kernel, iters, eps, inverse, normalization, norm_eps, name="nystrom_attention"):
    for nm, t in (("q", q), ("k", k), ("v", v), ("q_landmarks", lq), ("k_landmarks", lk)):
        check_finite_float(f"{name}: {nm}", t)
        if t.dim() < 2:
            raise ValueError(f"{name}: {nm} must have shape (..., tokens, features), got {tuple(t.shape)}")
    if kernel not in _KERNELS:
        raise ValueError(f"{name}: kernel must be one of {_KERNELS}, got {kernel!r}")
    if inverse not in ("newton", "exact"):
        raise ValueError(f"{name}: inverse must be 'newton' (default) or 'exact', got {inverse!r}")
    if normalization not in _NORMS:
        raise ValueError(f"{name}: normalization must be one of {_NORMS}, got {normalization!r}")
    d = q.shape[-1]
    for nm, t in (("k", k), ("q_landmarks", lq), ("k_landmarks", lk)):
        if t.shape[-1] != d:
            raise ValueError(
                f"{name}: head dim mismatch: q has d={d} but {nm} has d={t.shape[-1]}; q, k and both "
                "landmark sets must share the per-head feature size"
            )
    n, nk, m = q.shape[-2], k.shape[-2], lq.shape[-2]
    if v.shape[-2] != nk:
        raise ValueError(f"{name}: v has {v.shape[-2]} tokens but k has {nk}; they must match")
    if lk.shape[-2] != m:
        raise ValueError(
            f"{name}: q_landmarks has m={m} rows but k_landmarks has {lk.shape[-2]}; the landmark kernel "
            "must be square, so use the same number of query and key landmarks"
        )
    if m < 1:
        raise ValueError(f"{name}: need at least one landmark, got m={m}")
    if m > min(n, nk):
        raise ValueError(
            f"{name}: {m} landmarks for {n} queries / {nk} keys; the landmark count must not exceed the "
            f"token count (use m <= {min(n, nk)}, e.g. a larger pooling stride or fewer adaptive-pool cells)"
        )
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], lq.shape[:-2], lk.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            f"{name}: leading (batch, head) dims do not broadcast: q {tuple(q.shape[:-2])}, k {tuple(k.shape[:-2])}, "
            f"v {tuple(v.shape[:-2])}, landmarks {tuple(lq.shape[:-2])} / {tuple(lk.shape[:-2])}"
        ) from err
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"{name}: iters must be an int >= 0 (default 20), got {iters!r}")
    try:
        ok = float(norm_eps) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name}: norm_eps must be a float > 0 (default 1e-6), got {norm_eps!r}")
    try:
        ok = float(eps) >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name}: eps must be a float >= 0 (default 0.01), got {eps!r}")


def _kernel_fn(kernel: str, lam: float, reference: bool, backend: str = "auto"):
    if reference:
        return gaussian_kernel_reference if kernel == "gaussian" else lambda x, y: laplacian_kernel_reference(x, y, lam)
    if kernel == "gaussian":
        return lambda x, y: gaussian_kernel(x, y, backend=backend)
    return lambda x, y: laplacian_kernel(x, y, lam, backend=backend)
