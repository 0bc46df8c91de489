"""Analytic FLOP counts shared by the mixers' ``analytic_flops`` methods.

Same unit as :func:`vitmix.bench.count_flops` (1 multiply-accumulate = 2 FLOPs; matmuls,
convolutions, attention and distances only), so the bench can check each formula against the
counter and fall back to it where a kernel is invisible to the counter.
"""
from __future__ import annotations

import torch

from .sequence import is_sequence


def linear_flops(tokens: int, fan_in: int, fan_out: int) -> int:
    """FLOPs of a dense layer applied to ``tokens`` rows."""
    return 2 * tokens * fan_in * fan_out


def linears_flops(mixer, tokens: int) -> int:
    """FLOPs of every ``nn.Linear`` directly owned by ``mixer`` applied to ``tokens`` rows."""
    total = 0
    for module in mixer.modules():
        if isinstance(module, torch.nn.Linear):
            total += linear_flops(tokens, module.in_features, module.out_features)
    return total


def nystrom_flops(n: int, m: int, d: int, iters: int, tied: bool = False, normalization=None,
                  inverse: str = "newton", n_keys: int = None, d_v: int = None, start: str = "safe") -> int:
    """FLOPs of :func:`vitmix.ops.nystrom_attention` for one (batch, head) slice.

    Kernel blocks cost one distance product each (``2·rows·cols·d``; the Gaussian via a GEMM, the
    Laplacian via ``cdist``), Newton–Schulz ``4·m³`` per iteration (two ``m×m`` products), the exact
    inverse ``2m³/3 + 2m³`` (LU, then solves against the identity), and the right-to-left products
    ``2·N·m·d_v`` / ``2·m²·d_v`` each. Untied landmarks with the ``"safe"`` start (``start``, the
    ``newton_alpha`` option) add the start choice (a Cholesky, ``m³/3``) and the ``2·m³`` residual check
    of the identity start (a rare rerun is not counted).
    """
    nk = n if n_keys is None else n_keys
    dv = d if d_v is None else d_v
    total = 2 * n * m * d                         # C_q = k(Q, L_k)
    total += 0 if tied else 2 * nk * m * d        # C_k = k(K, L_q)
    total += 2 * m * m * d                        # W = k(L_q, L_k)
    total += (2 * m ** 3 // 3 + 2 * m ** 3) if inverse == "exact" else 4 * m ** 3 * iters
    if inverse != "exact" and not tied and start == "safe":
        total += m ** 3 // 3 + 2 * m ** 3         # start choice (Cholesky) and the ||I - P V|| check
    if normalization == "injective":
        total += 2 * n * m * m                    # covariance of C_q over queries
        total += 4 * m ** 3                       # T = Mᵀ cov M
        total += 2 * nk * m * m                   # D T (column variances)
        total += 2 * m * nk * dv                  # E = Dᵀ (s ⊙ V)
        total += 2 * m * m * dv + 2 * n * m * dv  # M E, C_q · core
    else:
        total += 2 * m * nk * dv + 2 * m * m * dv + 2 * n * m * dv
    return total


def landmark_total(mixer, n: int) -> int:
    """Landmarks ``m`` of a grid mixer at ``n`` tokens (``landmark_count`` of its resolved grid, or
    ``sequence_landmarks`` on a 1-D sequence)."""
    grid = mixer.token_grid(n)
    if is_sequence(grid):
        return mixer.sequence_landmarks(grid.length)
    mh, mw = mixer.landmark_count(*grid[1:])
    return mh * mw


def segment_flops(mixer, n: int, m: int, pooled: int) -> int:
    """Per (batch, head) slice: ``pooled`` tensors of head dim reduced to ``m`` segment means by the pooling
    matrix on a 1-D sequence (:func:`~vitmix.mixers.sequence.segment_means`); 0 on an image grid."""
    grid = mixer.token_grid(n)
    return pooled * 2 * m * grid.length * mixer.head_dim if is_sequence(grid) else 0


def local_conv_flops(mixer, batch: int, n: int) -> int:
    """The depthwise local convolution on V: one ``k×k`` filter per channel (or per head); on a 1-D
    sequence the same filter over a ``1 × L`` row (its zero-padded rows are multiplied too)."""
    k = getattr(mixer, "conv_kernel", 0) or 0
    grid = mixer.token_grid(n)
    tokens = grid.length if is_sequence(grid) else grid[1] * grid[2]
    return 2 * batch * mixer.dim * tokens * k * k


__all__ = ["linear_flops", "linears_flops", "nystrom_flops", "landmark_total", "local_conv_flops"]
