"""When and how a :class:`~vitmix.mixers.laplacian.LaplacianAttention` layer takes its one-call C path (private)."""
from __future__ import annotations

from typing import Optional

import torch

from ..sequence import is_sequence
from . import autograd, library


def supports(layer, x: torch.Tensor, grid) -> bool:
    """Whether the C path computes this forward of ``layer`` exactly as its composed path does: an eager CPU
    float32/float64 forward (the layer's ``_eager_cpu``), the injective map with a fixed contrast scale, no
    learnt temperature or landmarks, RoPE or q/k norm, the Newton–Schulz inverse with a start the C solve has (not the
    Cholesky-tested ``"safe"``), a per-channel local conv, landmark windows that adaptive pooling reproduces,
    and at most :data:`~vitmix.mixers.fused.library.MAX_LANDMARKS` landmarks; an image grid (the C path has no
    1-D form)."""
    if (not layer._eager_cpu(x) or is_sequence(grid) or layer.landmarks != "avgpool" or not layer.normalize
            or layer.norm_scale == "learnt"
            or layer.log_tau is not None or layer.rope or layer.qk_normed
            or layer.inverse != "newton"
            or layer.newton_alpha == "safe" or (layer.conv_kernel and layer.conv_groups != "channel")
            or layer._floors_a_remainder(*grid[1:])):
        return False
    mh, mw = layer.landmark_count(*grid[1:])
    return mh * mw <= library.MAX_LANDMARKS


def mix(layer, x: torch.Tensor, grid) -> Optional[torch.Tensor]:
    """The token mixing before ``proj`` in one C call (with the C backward when autograd records), or ``None``
    when the library is unavailable (the caller's composed path runs). The caller checked :func:`supports`."""
    n, (_, h, w) = x.shape[1], grid
    train = layer._needs_grad(x)
    conv = layer.conv if layer.conv_kernel else None
    run = autograd.laplacian_mix_train if train else library.laplacian_mix
    mean_weight = layer.mean_weight if train or layer.mean_weight is None else layer.mean_weight.detach()
    return run(
        layer._project_qkv(x), None if conv is None else conv.weight, None if conv is None else conv.bias, grid=grid,
        heads=layer.num_heads, landmarks=layer.landmark_count(h, w), lam=layer.lam / layer.qk_scale,
        eps=layer.newton_eps, iters=layer.newton_iters, alpha=layer.newton_alpha, norm_eps=layer.norm_eps,
        contrast=layer._contrast(n), mean_weight=mean_weight)


__all__ = ["supports", "mix"]
