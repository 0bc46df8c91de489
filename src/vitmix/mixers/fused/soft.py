"""When and how a :class:`~vitmix.mixers.soft.SoftAttention` layer takes its one-call C path (private)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..sequence import is_sequence
from . import autograd, library


def supports(layer, x: torch.Tensor, grid) -> bool:
    """Whether the C path computes this forward of ``layer`` exactly as its composed path does: an eager CPU
    float32/float64 forward (the layer's ``_eager_cpu``), the Newton–Schulz inverse (not the legacy one), the
    official landmark module (strided conv, LayerNorm with affine, exact GELU) or average pooling, and at most
    :data:`~vitmix.mixers.fused.library.MAX_LANDMARKS` landmarks, on an image grid (the C path has no 1-D form)."""
    if layer.inverse != "newton" or not layer._eager_cpu(x) or is_sequence(grid):
        return False
    if layer.landmarks == "conv":     # replaced norm or activation modules: composed
        norm, act = layer.Qnorm_act
        if not (isinstance(norm, nn.LayerNorm) and norm.weight is not None and norm.bias is not None
                and isinstance(act, nn.GELU) and act.approximate == "none"):
            return False
    mh, mw = layer.landmark_count(*grid[1:])
    return mh * mw <= library.MAX_LANDMARKS


def mix(layer, x: torch.Tensor, grid) -> Optional[torch.Tensor]:
    """The token mixing before ``ff`` in one C call (with the C backward when autograd records), or ``None``
    when the library is unavailable (the caller's composed path runs). The caller checked :func:`supports`."""
    prefix, h, w = grid
    mh, mw = layer.landmark_count(h, w)
    s = layer.landmark_stride
    conv_lm = layer.landmarks == "conv"
    norm = layer.Qnorm_act[0] if conv_lm else None
    run = autograd.soft_mix_train if layer._needs_grad(x) else library.soft_mix
    return run(
        layer.W_q(x), layer.W_v(x), layer.Qlandmark_op.weight if conv_lm else None,
        (norm.weight, norm.bias, norm.eps) if conv_lm else None, layer.conv.weight if layer.conv_kernel else None,
        grid=grid, heads=layer.num_heads, landmarks=(mh, mw), stride=s,
        pool_first=layer.landmark_hw is not None and (mh * s, mw * s) != (h, w), scale=layer.scale,
        eps=layer.newton_eps, iters=layer.newton_iters, alpha=layer.newton_alpha, normalization=layer.normalization)


__all__ = ["supports", "mix"]
