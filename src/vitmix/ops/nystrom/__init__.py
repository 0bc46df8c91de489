"""Nyström kernel attention (SOFT, SOFT-Norm, LaplacianFormer) in linear time.

With a kernel ``k`` (Gaussian or Laplacian), queries ``Q (N×d)``, keys ``K (N_k×d)``, values
``V (N_k×d_v)`` and caller-supplied landmarks ``L_q, L_k (m×d)`` (per batch element and head):

    C_q = k(Q, L_k)   (N×m)        C_k = k(K, L_q)   (N_k×m)        W = k(L_q, L_k)   (m×m)
    M   = NS(W) ≈ (W + eps·I)^{-1}                                   (Newton–Schulz, m³·iters)

    normalization=None          out = C_q · (M · (C_kᵀ · V))                      (SOFT)
    normalization="soft_norm"   out = C_q · (D^{-1/2} M D^{-1/2}) · (C_kᵀ · V),   D = diag(W·1)
    normalization="injective"   out = Z · V with the LaplacianFormer injective feature map below

all evaluated right to left in ``O(N·m·d + m³·iters)`` time and ``O(N·m)`` memory: no ``N×N``
matrix is ever formed. For SOFT the caller ties ``k is q`` and ``k_landmarks is q_landmarks``; the
op then computes ``C_q`` once and uses ``M`` on a symmetric ``W``.

Injective normalisation (LaplacianFormer). With the implicit approximation
``Ĝ = C_q M C_kᵀ (N×N_k)``, per sample and per head:

    μ_i  = mean_j Ĝ_ij                         (each query's row mean, over keys)
    R    = Ĝ - μ 1ᵀ                            (rows centred)
    σ²_j = mean_i (R_ij - mean_i' R_i'j)²      (per-key column variance over queries, population)
    Z    = R · diag(1/sqrt(σ² + norm_eps)) + 1/N_k

Linear-time evaluation: ``μ_i = C_q,i · w`` with ``U = C_k Mᵀ`` (row ``j``: ``u_j = M c_k,j``) and
``w = mean_j u_j``, so ``R = C_q Ũᵀ`` with ``Ũ = U - 1wᵀ``; with ``S = cov(C_q)`` (m×m, over
queries) ``σ²_j = ũ_jᵀ S ũ_j``; finally ``out = C_q (Ũᵀ (s ⊙ V)) + mean_j v_j`` with
``s = (σ² + norm_eps)^{-1/2}``. The ``+1/N_k`` term contributes the mean of the values.
Optionally the two terms are weighted, ``out = c · C_q (Ũᵀ (s ⊙ V)) + w · mean_j v_j``
(``contrast=c``, a per-head ``mean_weight=w``), inside the same autograd function: LaplacianFormer's
map divides the whitened part by N and learns the weight of the mean (``vitmix.mixers.laplacian``),
and doing it here saves the four full-size elementwise passes it would cost outside.

Numerics: kernels, the inverse and the normaliser run in float32 (float64 stays float64) with
autocast disabled; the result is cast back to the dtype of ``v`` (promoted with ``q``).

Layout: this module holds the public function (a composition of :mod:`vitmix.ops.kernel` and
:mod:`vitmix.ops.newton`) and the landmark pooling; ``c.py`` the same forward as one C call, used for
inference on CPU (no gradients needed); ``naive.py`` the O(N²) references; ``checks.py`` the argument
checks both share.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from .._common import compute_dtype, no_autocast, real_tensors, single_thread_if_small
from .._triton import check_backend
from ..kernel.checks import _check_lam
from ..newton import newton_schulz_inverse
from . import c
from .checks import _kernel_fn, _validate
from .naive import kernel_attention_reference, nystrom_attention_reference


__all__ = ["nystrom_attention", "nystrom_attention_reference", "kernel_attention_reference", "avg_pool_landmarks"]


@functools.lru_cache(maxsize=64)
def _pool_matrix(h: int, w: int, oh: int, ow: int) -> torch.Tensor:
    """(oh·ow, h·w) float64 matrix of adaptive average pooling (the windows of F.adaptive_avg_pool2d)."""
    with real_tensors():
        return _pool_matrix_real(h, w, oh, ow)


def _pool_matrix_real(h: int, w: int, oh: int, ow: int) -> torch.Tensor:
    # Built in plain Python and handed to torch once: no torch op here can end up in a traced graph
    # (the TorchScript ONNX exporter traces whatever runs on a cold cache, and has no aten::kron).
    def windows(n: int, o: int):
        for i in range(o):
            start, end = (i * n) // o, -((-(i + 1) * n) // o)   # floor(i·n/o), ceil((i+1)·n/o)
            yield range(start, end), 1.0 / (end - start)
    rows = []
    for rows_y, wy in windows(h, oh):
        for cols_x, wx in windows(w, ow):
            row = [0.0] * (h * w)
            for y in rows_y:
                for x in cols_x:
                    row[y * w + x] = wy * wx
            rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def _pool_matrix_as(h: int, w: int, oh: int, ow: int, dtype: torch.dtype, device: torch.device,
                    prefix: int = 0) -> torch.Tensor:
    with real_tensors():        # cached: never a fake tensor, not even while exporting
        pool = _pool_matrix(h, w, oh, ow)
        if prefix:              # zero columns for the prefix tokens: they take no part in the pooling
            pool = torch.cat([pool.new_zeros(pool.shape[0], prefix), pool], dim=1)
        return pool.to(device=device, dtype=dtype)


def avg_pool_landmarks(x: torch.Tensor, hw, out_hw, prefix: int = 0) -> torch.Tensor:
    """Landmarks by adaptive average pooling of grid tokens, as one matrix product.

    Args:
        x: ``(..., P + H·W, d)``: ``P = prefix`` tokens (CLS, registers; not pooled), then the tokens of
            an ``H×W`` grid in row-major order.
        hw: ``(H, W)``; out_hw: ``(h_out, w_out)`` with ``1 <= h_out <= H``, ``1 <= w_out <= W``.
        prefix: ``P`` (default 0). The pooling matrix has ``P`` zero columns, so a caller need not
            slice the grid out of ``x`` (no copy forward, no zero-filled gradient backward).
    Returns:
        ``(..., h_out·w_out, d)``, identical to ``F.adaptive_avg_pool2d`` on the grid (same windows,
        overlapping when the sizes do not divide), but as ``P @ x`` with a cached ``(m, N)`` pooling
        matrix: ``O(N·m·d)`` like the rest of the Nyström op, and faster on CPU than the pooling
        kernels for channel-last token layouts. Pooling with kernel = stride = ``r`` is the special case
        ``out_hw = (H // r, W // r)`` when ``r`` divides ``H`` and ``W``.
    """
    h, w = (int(a) for a in hw)
    oh, ow = (int(a) for a in out_hw)
    prefix = int(prefix)
    if prefix < 0:
        raise ValueError(f"avg_pool_landmarks: prefix={prefix} must be >= 0 (the tokens before the grid)")
    if x.dim() < 2 or x.shape[-2] != prefix + h * w:
        lead = f"{prefix}+" if prefix else ""
        raise ValueError(f"avg_pool_landmarks: x has shape {tuple(x.shape)}, expected (..., {lead}{h}*{w}="
                         f"{prefix + h * w}, d) tokens")
    if not (1 <= oh <= h and 1 <= ow <= w):
        raise ValueError(f"avg_pool_landmarks: output grid {oh}x{ow} must be between 1x1 and the input grid {h}x{w}")
    pool = _pool_matrix_as(h, w, oh, ow, compute_dtype(x), x.device, prefix)
    return torch.matmul(pool, x.to(pool.dtype)).to(x.dtype)


def nystrom_attention(
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
    backend: str = "auto",
    contrast: float = 1.0,
    mean_weight: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Linear-time Nyström kernel attention ``k(Q, L_k) · NS(k(L_q, L_k)) · k(L_q, K) · V``.

    Args:
        q: ``(B, h, N, d)`` queries (any leading dims that broadcast).
        k: ``(B, h, N_k, d)`` keys; pass ``k=q`` (the same object) for SOFT's tied ``Q = K``.
        v: ``(B, h, N_k, d_v)`` values.
        q_landmarks, k_landmarks: ``(B, h, m, d)``, supplied by the caller (pooling, conv, sampling);
            ``m <= min(N, N_k)``. Pass the same object twice for tied landmarks.
        kernel: ``"gaussian"`` (``exp(-||x-y||²/2)``, SOFT) or ``"laplacian"`` (``exp(-||x-y||_1/lam)``).
        lam: Laplacian width λ (default 4, LaplacianFormer).
        iters, eps: Newton–Schulz iterations and diagonal perturbation (SOFT/LaplacianFormer: 20, 0.01).
        inverse: ``"newton"`` (default) or ``"exact"`` (``inv(W + eps·I)``, for analysis).
        normalization: ``None`` (SOFT), ``"soft_norm"`` (``D^{-1/2} M D^{-1/2}``, D = landmark-kernel row
            sums, SOFT-Norm as in the official code) or ``"injective"`` (LaplacianFormer; see module docstring).
        norm_eps: ε added to the column variances of the injective normalisation.
        alpha, symmetric: Newton–Schulz start (see :func:`vitmix.ops.newton_schulz_inverse`);
            ``alpha="official"`` reproduces the SOFT/LaplacianFormer CUDA kernels.
        backend: who computes the kernel matrices and the Newton–Schulz loop: ``"auto"`` (Triton for
            CUDA tensors), ``"triton"`` or ``"torch"`` (see ``docs/gpu.md``).
        contrast, mean_weight: with ``normalization="injective"`` only: ``out = contrast · (whitened
            part) + mean_weight · mean(V)``; ``mean_weight`` is ``None`` (weight 1) or a tensor that
            broadcasts to ``(..., 1, 1)`` against the batch dims (e.g. ``(h, 1, 1)``), differentiable.

    Returns ``(B, h, N, d_v)`` in the dtype of ``v`` (promoted with ``q``).
    """
    _validate(q, k, v, q_landmarks, k_landmarks, kernel, iters, eps, inverse, normalization, norm_eps)
    _check_weights(normalization, contrast, mean_weight)
    check_backend("nystrom_attention", backend)
    lam_f = _check_lam(lam)
    out_dtype = torch.promote_types(q.dtype, v.dtype)
    kern = _kernel_fn(kernel, lam_f, reference=False, backend=backend)
    tied = k is q and k_landmarks is q_landmarks
    tied_landmarks = k_landmarks is q_landmarks
    with no_autocast(q.device.type):
        dt = compute_dtype(q, k, v, q_landmarks, k_landmarks)
        vf = v.to(dt)
        sym = True if tied_landmarks else symmetric
        if c.applies((q, k, v, q_landmarks, k_landmarks), dt, inverse, alpha, sym, backend):
            qf, lqf = q.to(dt), q_landmarks.to(dt)
            kf = qf if k is q else k.to(dt)
            lkf = lqf if tied_landmarks else k_landmarks.to(dt)
            out = c.fused_forward(qf, kf, vf, lqf, lkf, kernel=kernel, lam=lam_f, tied=tied, eps=float(eps),
                                  iters=iters, alpha=alpha, symmetric=sym, normalization=normalization,
                                  norm_eps=float(norm_eps))
            if out is not None:
                return _weigh_terms(out, vf, contrast, mean_weight).to(out_dtype)
        # the kernels compute half inputs in float32 themselves (Triton reads them in place: no upcast copy)
        qk, lqk = _kernel_input(q, dt), _kernel_input(q_landmarks, dt)
        kk = qk if k is q else _kernel_input(k, dt)
        lkk = lqk if tied_landmarks else _kernel_input(k_landmarks, dt)
        cq = kern(qk, lkk)                                  # (…, N, m)
        ck = cq if tied else kern(kk, lqk)                  # (…, N_k, m)
        w = kern(lqk, lkk)                                  # (…, m, m)
        M = newton_schulz_inverse(w, iters=iters, eps=eps, symmetric=sym, mode=inverse, alpha=alpha,
                                  backend=backend)
        weight = None if mean_weight is None else mean_weight.to(dt)
        out = _combine(cq, ck, w, M, vf, normalization, float(norm_eps), contrast, weight)
    return out.to(out_dtype)


def _kernel_input(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a kernel-matrix input: as it is when the kernels compute it in ``dtype`` anyway (half
    inputs in float32), else cast (e.g. half ``q`` next to a float64 ``v``)."""
    return t if compute_dtype(t) == dtype else t.to(dtype)


def _check_weights(normalization, contrast, mean_weight) -> None:
    if normalization != "injective" and (contrast != 1.0 or mean_weight is not None):
        raise ValueError("nystrom_attention: contrast and mean_weight weigh the terms of the injective map; "
                         f"they need normalization='injective', got {normalization!r}")
    if not (isinstance(contrast, (int, float)) and math.isfinite(contrast) and contrast > 0):
        raise ValueError(f"nystrom_attention: contrast={contrast!r} must be a finite number > 0")
    if mean_weight is not None and not isinstance(mean_weight, torch.Tensor):
        raise ValueError(f"nystrom_attention: mean_weight must be None or a tensor, got {type(mean_weight).__name__}")


def _weigh_terms(out, v, contrast: float, mean_weight) -> torch.Tensor:
    """``contrast · (out - mean(V)) + mean_weight · mean(V)`` of an unweighted injective output (the C
    forward's, which has no gradients to keep)."""
    if contrast == 1.0 and mean_weight is None:
        return out
    mean_v = v.mean(-2, keepdim=True)
    weight = 1.0 if mean_weight is None else mean_weight.to(out.dtype)
    return (out - mean_v).mul_(contrast).add_(weight * mean_v)


def _combine(cq, ck, w, M, v, normalization: Optional[str], norm_eps: float, contrast: float = 1.0,
             mean_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``cq · M · ckᵀ · v`` right to left (never N×N), with the SOFT-Norm or injective normalisation."""
    if normalization == "soft_norm":
        dinv = w.sum(-1).rsqrt()
        M = dinv.unsqueeze(-1) * M * dinv.unsqueeze(-2)
    if normalization == "injective":
        return _injective(cq, ck, M, v, norm_eps, contrast, mean_weight)
    return torch.matmul(cq, torch.matmul(M, torch.matmul(ck.mT, v)))


def _injective_fwd(cq, ck, M, v, norm_eps: float, contrast: float = 1.0, mean_weight=None):
    n = cq.shape[-2]
    cc = cq - cq.mean(-2, keepdim=True)
    cov = torch.matmul(cc.mT, cc).div_(n)              # (…, m, m) population covariance over queries
    D = ck - ck.mean(-2, keepdim=True)                 # (…, N_k, m) centred keys
    T = torch.matmul(M.mT, torch.matmul(cov, M))
    T = 0.5 * (T + T.mT)                               # exactly symmetric (the backward relies on it)
    DT = torch.matmul(D, T)
    var = (DT * D).sum(-1)
    s = torch.rsqrt(var.clamp_min(0) + norm_eps)
    E = torch.matmul(D.mT, (s * contrast).unsqueeze(-1) * v)   # (…, m, d_v); the contrast scales s
    core = torch.matmul(M, E)
    mean_v = v.mean(-2, keepdim=True)
    out = torch.matmul(cq, core).add_(mean_v if mean_weight is None else mean_weight * mean_v)
    return out, D, DT, s, var, cov, E, core


def _injective_bwd(g, cq, D, DT, M, v, s, var, cov, E, core, contrast: float = 1.0, mean_weight=None):
    n, nk = cq.shape[-2], D.shape[-2]
    dcore = torch.matmul(cq.mT, g)                     # (…, m, d_v)
    dcq = torch.matmul(g, core.mT)
    dM = torch.matmul(dcore, E.mT)
    dE = torch.matmul(M.mT, dcore)
    sc = (s * contrast).unsqueeze(-1)
    y = sc * v
    dy = torch.matmul(D, dE)                           # (…, N_k, d_v)
    g_mean = g.sum(-2, keepdim=True)                   # (…, 1, d_v): the gradient of mean(V)'s row
    dv = sc * dy + (g_mean if mean_weight is None else mean_weight * g_mean) / nk
    dweight = None if mean_weight is None else (g_mean * v.mean(-2, keepdim=True)).sum(-1, keepdim=True)
    ds = (dy * v).sum(-1) * contrast
    dvar = ds * (-0.5) * s * s * s * (var >= 0)        # clamp_min(0): no gradient where clamped
    # d(d_j T d_jᵀ)/d d_j = 2 d_j T (T symmetric)
    dD = torch.matmul(y, dE.mT) + 2.0 * dvar.unsqueeze(-1) * DT
    dT = torch.matmul(D.mT, dvar.unsqueeze(-1) * D)    # symmetric
    dM = dM + 2.0 * torch.matmul(cov, torch.matmul(M, dT))
    dcov = torch.matmul(M, torch.matmul(dT, M.mT))     # symmetric
    cc = cq - cq.mean(-2, keepdim=True)
    dcc = torch.matmul(cc, dcov) * (2.0 / n)
    dcq = dcq + dcc - dcc.mean(-2, keepdim=True)
    dck = dD - dD.mean(-2, keepdim=True)
    return dcq, dck, dM, dv, dweight


# one thread below this many multiply-adds: the normaliser's ~20 ops are N×m/N×d_v products, each far
# larger than the m×m matmuls the general threshold is for (demo shape, 128 slices of 65×9: 5.2 ms
# single-threaded, 4.1 ms on 2 threads)
_INJECTIVE_SMALL_WORK = 1 << 20


class _InjectiveCore(torch.autograd.Function):
    """``Z V`` of the injective normalised map from ``C_q, C_k, M, V`` with a hand-written backward.

    Forward ``2·N·m² + 2·N·m·d_v`` MACs, backward ``2·N·m² + 4·N·m·d_v``; saves only ``N×m`` /
    ``N×d_v`` tensors (``C_q``, the centred ``C_k`` and ``C_k T``, ``V``) and ``m×m`` / ``m×d_v`` ones.
    With ``D = C_k - mean_j C_k`` (centred keys), ``T = Mᵀ cov(C_q) M`` (symmetric m×m):
    ``σ²_j = d_j T d_jᵀ``, ``s = (σ² + ε)^{-1/2}``, ``E = Dᵀ (c·s ⊙ V)`` and ``out = C_q (M E) + w·mean(V)``
    (contrast ``c``, a constant; mean weight ``w``, a tensor with a gradient, or ``None`` for 1).
    Plain eager PyTorch (no ``torch.compile``: no first-call stall, nothing to fall back from).
    """

    @staticmethod
    def forward(ctx, cq, ck, M, v, norm_eps, contrast=1.0, mean_weight=None):
        work = cq.numel() * (cq.shape[-1] + v.shape[-1])
        with torch.no_grad(), single_thread_if_small(cq, work, _INJECTIVE_SMALL_WORK):
            res = _injective_fwd(cq, ck, M, v, norm_eps, contrast, mean_weight)
        out, D, DT, s, var, cov, E, core = res
        ctx.save_for_backward(cq, D, DT, M, v, s, var, cov, E, core, mean_weight)
        ctx.work, ctx.contrast = work, contrast
        ctx.weight_shape = None if mean_weight is None else mean_weight.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        saved = ctx.saved_tensors
        with torch.no_grad(), no_autocast(g.device.type), single_thread_if_small(g, ctx.work, _INJECTIVE_SMALL_WORK):
            g = g.contiguous()
            *saved, mean_weight = saved
            dcq, dck, dM, dv, dweight = _injective_bwd(g, *saved, contrast=ctx.contrast, mean_weight=mean_weight)
        if dweight is not None:    # summed over the batch dims the weight was broadcast along
            dweight = dweight.sum_to_size(ctx.weight_shape)
        return dcq, dck, dM, dv, None, None, dweight


def _injective(cq: torch.Tensor, ck: torch.Tensor, M: torch.Tensor, v: torch.Tensor, norm_eps: float,
               contrast: float = 1.0, mean_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``Z V`` for the injective normalised map, in O(N·m² + N·m·d_v) (see the module docstring)."""
    batch = torch.broadcast_shapes(cq.shape[:-2], ck.shape[:-2], M.shape[:-2], v.shape[:-2])
    cq, ck, M, v = (t.expand(*batch, *t.shape[-2:]) for t in (cq, ck, M, v))
    return _InjectiveCore.apply(cq, ck, M, v, norm_eps, contrast, mean_weight)
