"""Dynamic-weight ops of WeightFormer: a linear layer whose weight is predicted from the input, and a
depthwise convolution whose kernels are predicted per sample.

Pure tensor functions (no parameters, torch only). Each fast path has an obviously-correct reference
(``*_reference``) that the tests compare against, forward and gradients.

Dynamic linear ("bilateral activation", WeightFormer's ``DynLinear``)
---------------------------------------------------------------------
For one sample with tokens ``x`` (N×C_in), pooled branch codes ``p`` (M×R_in) and ``q`` (M×R_out)
(already activated, i.e. ``SiLU`` of the predictor outputs) and expansion matrices ``w1`` (R_in×C_in),
``w2`` (R_out×C_out)::

    A  = p @ w1                    # M × C_in
    Bm = q @ w2                    # M × C_out
    D  = scale * Aᵀ @ Bm           # C_in × C_out, rank ≤ min(M, R_in)
    ΔW = D / (‖D[:, j]‖₂ + 1)      # soft per-output-column normalisation (norm over the input dim)
    y  = x @ (W0 + ΔW) + b         # W0 laid out (in, out)

with ``scale = C_in**-0.5 / N`` and ``N`` the *full* token count (not M). Three algebraically equal
ways to evaluate it are offered (``path=``):

``"dense"``
    The official association: form ``A``, ``Bm`` and ``ΔW`` and apply ``W0 + ΔW`` with one batched
    matmul. Cost per sample ≈ M·(R_in·C_in + R_out·C_out + C_in·C_out) + N·C_in·C_out MACs.
``"core"``
    Re-associates ``Aᵀ Bm = w1ᵀ (pᵀ q) w2`` through the small R_in×R_out core, so the M-sized
    ``A``/``Bm`` are never formed. Cost ≈ M·R_in·R_out + C_in·R_in·R_out + C_in·R_out·C_out + N·C_in·C_out:
    independent of M for the weight, hence much cheaper at high resolution (M ≫ C).
``"lowrank"``
    Never materialises ``ΔW`` (nor any C_in×C_out per-sample matrix):
    ``y = x W0 + b + scale·(x Aᵀ)(Bm ⊘ (n + 1))`` with ``n_j = scale·sqrt(Bm_jᵀ (A Aᵀ) Bm_j)``.
    Cost ≈ M·(R_in·C_in + R_out·C_out) + (M + N)·M·(C_in + C_out) + N·C_in·C_out: cheapest when
    the token grid is small relative to the width (N ≲ 0.6·C), e.g. small images.
``"auto"`` (default)
    Picks the path with the fewest multiply-accumulates (:func:`dynamic_linear_costs`).

The column norms are computed in float32 (also under autocast) so bf16/fp16 inputs cannot overflow
or lose the ``+1`` to rounding; the result is cast back to the input dtype.

Dynamic depthwise convolution ("spatially adaptive prediction", WeightFormer's ``DynCnn``)
------------------------------------------------------------------------------------------
:func:`dynamic_depthwise_conv2d` applies a different k×k depthwise kernel to every (sample, channel)
pair with *one* grouped convolution (``groups = B·C``) over a batch folded into channels;
:func:`normalize_kernels` is the per-(sample, channel) Frobenius ``K / (‖K‖ + 1)``.

Layout: this module holds the public functions, the dynamic-linear paths and the depthwise custom op;
``naive.py`` the references; ``pytorch.py`` the depthwise convolution's folded grouped-convolution back end and
its export decomposition (:func:`dynamic_depthwise_conv2d_taps`); ``checks.py`` the argument checks.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._common import exporting_to_onnx, no_autocast, traced
from .checks import _check_dw_args, _check_linear_args
from .naive import dynamic_depthwise_conv2d_reference, dynamic_linear_reference
from .pytorch import _dw_forward, _dw_grads, dynamic_depthwise_conv2d_taps


__all__ = [
    "DYNAMIC_LINEAR_PATHS",
    "choose_dynamic_linear_path",
    "dynamic_depthwise_conv2d",
    "dynamic_depthwise_conv2d_reference",
    "dynamic_depthwise_conv2d_taps",
    "dynamic_linear",
    "dynamic_linear_costs",
    "dynamic_linear_delta",
    "dynamic_linear_reference",
    "normalize_columns",
    "normalize_kernels",
    "pool_tokens_2x2",
]


DYNAMIC_LINEAR_PATHS = ("auto", "dense", "core", "lowrank")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _no_autocast(t: Tensor):
    """Autocast off for ``t``'s device (entered only when it is on: traced graphs stay free of autocast regions)."""
    return no_autocast(t.device.type)


def _wide(t: Tensor) -> Tensor:
    """``t`` in at least float32 (float64 stays float64)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def normalize_columns(delta: Tensor) -> Tensor:
    """``delta[..., :, j] / (‖delta[..., :, j]‖₂ + 1)`` — norm over dim -2, computed in float32.

    This is WeightFormer's soft normalisation of the predicted weight update: every output column
    ends with norm < 1 while small updates pass almost unchanged. Returns ``delta``'s dtype.
    """
    with _no_autocast(delta):
        d32 = _wide(delta)
        out = d32 / (torch.linalg.vector_norm(d32, dim=-2, keepdim=True) + 1.0)
    return out.to(delta.dtype)


def normalize_kernels(kernels: Tensor) -> Tensor:
    """``K / (‖K‖_F + 1)`` per kernel over the last two (spatial) dims, computed in float32.

    For predicted depthwise kernels of shape ``(B, C, k, k)`` this is the per-(sample, channel)
    Frobenius normalisation of WeightFormer's dynamic DW conv. Returns the input dtype.
    """
    if kernels.dim() < 2:
        raise ValueError(f"normalize_kernels expects (..., k, k) kernels, got shape {tuple(kernels.shape)}")
    with _no_autocast(kernels):
        k32 = _wide(kernels)
        out = k32 / (torch.linalg.vector_norm(k32, dim=(-2, -1), keepdim=True) + 1.0)
    return out.to(kernels.dtype)


def _safe_sqrt(sq: Tensor) -> Tensor:
    """sqrt with a zero (sub)gradient at 0 instead of inf, matching ``vector_norm``'s backward."""
    pos = sq > 0
    return torch.where(pos, torch.where(pos, sq, torch.ones_like(sq)).sqrt(), torch.zeros_like(sq))


def pool_tokens_2x2(x: Tensor, hw: Tuple[int, int], odd: str = "ceil") -> Tuple[Tensor, Optional[Tensor]]:
    """2×2 average pooling of a token grid: ``(B, H·W, C)`` → ``(B, M, C)`` plus window weights.

    ``odd`` decides what happens to an odd row/column count:

    * ``"ceil"`` (vitmix default): the last row/column forms 2×1, 1×2 or 1×1 windows averaged over
      the tokens they hold, so every token contributes; the returned ``(M,)`` weights
      ``|window| / 4`` make each window count in proportion to its area, so the sum of weights is
      ``N / 4`` and the ``1/N`` normalisation of the update keeps its meaning (a token-weighted mean).
      On even grids the weights are all 1 and ``None`` is returned.
    * ``"floor"`` (the official code's ``AvgPool2d(2)``): the last odd row/column is dropped.
      Weights are ``None``.
    """
    if odd not in ("ceil", "floor"):
        raise ValueError(f"odd must be 'ceil' or 'floor', got {odd!r}")
    B, N, C = x.shape
    H, W = hw
    if H * W != N:
        raise ValueError(f"token grid {H}x{W} does not match {N} tokens")
    if odd == "floor" and (H < 2 or W < 2):
        raise ValueError(f"odd='floor' needs a grid of at least 2x2 tokens, got {H}x{W}; use odd='ceil'")
    grid = x.view(B, H, W, C).permute(0, 3, 1, 2)  # channels-last view, no copy
    pooled = F.avg_pool2d(grid, 2, ceil_mode=(odd == "ceil"), count_include_pad=False)
    weights = None
    if odd == "ceil" and (H % 2 or W % 2):
        rows = torch.full(((H + 1) // 2,), 2.0, device=x.device)
        cols = torch.full(((W + 1) // 2,), 2.0, device=x.device)
        if H % 2:
            rows[-1] = 1.0
        if W % 2:
            cols[-1] = 1.0
        weights = (rows[:, None] * cols[None, :]).flatten() / 4.0
    return pooled.flatten(2).transpose(1, 2), weights


def dynamic_linear_costs(n: int, m: int, c_in: int, c_out: int, r_in: int, r_out: int) -> Dict[str, int]:
    """Multiply-accumulates per sample of each :func:`dynamic_linear` path (matmuls only).

    ``n`` tokens, ``m`` pooled tokens, widths ``c_in → c_out``, branch ranks ``r_in``, ``r_out``.
    """
    apply = n * c_in * c_out
    branches = m * (r_in * c_in + r_out * c_out)
    return {
        "dense": branches + m * c_in * c_out + apply,
        "core": m * r_in * r_out + c_in * r_in * r_out + c_in * r_out * c_out + apply,
        "lowrank": branches + (m + n) * m * (c_in + c_out) + apply,
    }


def choose_dynamic_linear_path(n: int, m: int, c_in: int, c_out: int, r_in: int, r_out: int) -> str:
    """The cheapest :func:`dynamic_linear` path by :func:`dynamic_linear_costs` (ties → ``"dense"``)."""
    costs = dynamic_linear_costs(n, m, c_in, c_out, r_in, r_out)
    return min(("dense", "core", "lowrank"), key=lambda k: costs[k])


def dynamic_linear_delta(p: Tensor, q: Tensor, w1: Tensor, w2: Tensor, scale: float,
                         association: str = "dense") -> Tensor:
    """The normalised per-sample update ``ΔW`` of shape ``(B, C_in, C_out)``.

    ``association="dense"`` forms ``(p w1)ᵀ (q w2)`` as the official code does; ``"core"`` forms
    ``w1ᵀ (pᵀ q) w2`` through the R_in×R_out core (cheaper when M is large). Both then scale by
    ``scale`` and apply :func:`normalize_columns`.
    """
    if association == "dense":
        a = torch.matmul(p, w1)  # B, M, C_in
        bm = torch.matmul(q, w2)  # B, M, C_out
        delta = torch.bmm(a.transpose(1, 2), bm)
    elif association == "core":
        core = torch.bmm(p.transpose(1, 2), q)  # B, R_in, R_out
        delta = torch.matmul(torch.matmul(w1.t(), core), w2)
    else:
        raise ValueError(f"association must be 'dense' or 'core', got {association!r}")
    return normalize_columns(delta * scale)


def dynamic_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], p: Tensor, q: Tensor,
                   w1: Tensor, w2: Tensor, *, scale: Optional[float] = None, path: str = "auto") -> Tensor:
    """WeightFormer's dynamic linear layer ``y = x (W0 + ΔW(p, q)) + b`` (see the module docstring).

    Args:
        x: tokens ``(B, N, C_in)``.
        weight: static weight ``W0`` in (in, out) layout ``(C_in, C_out)``.
        bias: ``(C_out,)`` or ``None``.
        p, q: activated branch codes ``(B, M, R_in)`` and ``(B, M, R_out)`` from the pooled tokens
            (rows may be pre-multiplied by window weights, see :func:`pool_tokens_2x2`).
        w1, w2: expansion matrices ``(R_in, C_in)`` and ``(R_out, C_out)``.
        scale: multiplies ``Aᵀ Bm`` before the column normalisation; default ``C_in**-0.5 / N``
            with ``N = x.shape[1]`` the full token count (the official choice).
        path: ``"auto"`` | ``"dense"`` | ``"core"`` | ``"lowrank"`` — all give the same result up to
            rounding; ``"auto"`` picks the cheapest.

    Returns:
        ``(B, N, C_out)`` in ``x``'s dtype (or the autocast dtype).
    """
    if path not in DYNAMIC_LINEAR_PATHS:
        raise ValueError(f"path must be one of {DYNAMIC_LINEAR_PATHS}, got {path!r}")
    B, N, c_in, c_out, M, r_in, r_out = _check_linear_args(x, weight, bias, p, q, w1, w2)
    if scale is None:
        scale = c_in ** -0.5 / N
    if path == "auto":
        path = choose_dynamic_linear_path(N, M, c_in, c_out, r_in, r_out)

    if path in ("dense", "core"):
        w = dynamic_linear_delta(p, q, w1, w2, scale, association=path) + weight
        return torch.bmm(x, w) if bias is None else torch.baddbmm(bias, x, w)

    # lowrank: never form a C_in × C_out per-sample matrix.
    a = torch.matmul(p, w1)  # B, M, C_in
    bm = torch.matmul(q, w2)  # B, M, C_out
    with _no_autocast(x):
        a32, bm32 = _wide(a), _wide(bm)
        gram = torch.bmm(a32, a32.transpose(1, 2))  # B, M, M
        sq = (torch.bmm(gram, bm32) * bm32).sum(dim=1, keepdim=True)  # B, 1, C_out: ‖Aᵀ Bm_j‖²
        coef = scale / (scale * _safe_sqrt(sq) + 1.0)  # B, 1, C_out
    bm_scaled = (bm32 * coef).to(bm.dtype)
    y = F.linear(x, weight.t(), bias)
    return y + torch.bmm(torch.bmm(x, a.transpose(1, 2)), bm_scaled)


def dynamic_depthwise_conv2d(x: Tensor, kernels: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """Per-sample depthwise convolution with 'same' zero padding, as one grouped convolution.

    Args:
        x: ``(B, C, H, W)`` — any memory format; a channels-last view of a ``(B, H, W, C)`` token
            tensor is handled without a detour through NCHW.
        kernels: ``(B, C, k, k)``, one kernel per (sample, channel), ``k`` odd.
        bias: ``(C,)`` shared by all samples, ``(B, C)`` per sample, or ``None``.

    Returns:
        ``(B, C, H, W)``. The batch is folded into the channels, ``(1, B·C, H, W)``, and one conv
        with ``groups = B·C`` runs over it; the folded tensor is laid out channels-last
        (``H, W, B, C`` in memory), which PyTorch's CPU depthwise kernels process several times
        faster than NCHW. The result is returned as a channels-last ``(B, C, H, W)`` view (call
        ``.flatten(2).transpose(1, 2)`` for ``(B, H·W, C)`` tokens).

    Under ``torch.compile`` / ``torch.export`` this runs as the custom op
    ``vitmix::dynamic_depthwise_conv2d`` (the same grouped convolution and its gradients); the
    export decomposition is a sum of ``k²`` shifted products, since ONNX's ``Conv`` needs a
    ``group`` count that does not depend on the (dynamic) batch size.
    """
    _check_dw_args(x, kernels, bias)
    if exporting_to_onnx():             # ONNX's Conv cannot take a batch-sized group count
        return dynamic_depthwise_conv2d_taps(x, kernels, bias)
    return _dw_op(x, kernels, bias) if traced() else _dw_forward(x, kernels, bias)


@torch.library.custom_op("vitmix::dynamic_depthwise_conv2d", mutates_args=())
def _dw_op(x: Tensor, kernels: Tensor, bias: Optional[Tensor]) -> Tensor:
    """:func:`dynamic_depthwise_conv2d` on checked arguments (a channels-last result)."""
    return _dw_forward(x, kernels, bias)


@torch.library.custom_op("vitmix::dynamic_depthwise_conv2d_backward", mutates_args=())
def _dw_backward_op(g: Tensor, x: Tensor, kernels: Tensor, bias: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`_dw_op` w.r.t. ``x`` (channels-last), ``kernels`` and ``bias`` (empty if ``None``)."""
    return _dw_grads(g, x, kernels, bias)


def _channels_last_like(x: Tensor) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)


@_dw_op.register_fake
def _(x, kernels, bias):
    return _channels_last_like(x)


@_dw_backward_op.register_fake
def _(g, x, kernels, bias):
    gb = x.new_empty(bias.shape if bias is not None else (0,))
    return _channels_last_like(x), kernels.new_empty(kernels.shape), gb


def _dw_setup(ctx, inputs, output):
    x, kernels, bias = inputs
    ctx.save_for_backward(x, kernels, bias)


def _dw_op_grad(ctx, g):
    x, kernels, bias = ctx.saved_tensors
    gx, gk, gb = _dw_backward_op(g, x, kernels, bias)
    return gx, gk, (gb if bias is not None else None)


_dw_op.register_autograd(_dw_op_grad, setup_context=_dw_setup)
