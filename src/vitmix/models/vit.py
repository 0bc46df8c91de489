"""Isotropic ViT/DeiT backbones built on timm's ``VisionTransformer`` with any vitmix mixer.

ImageNet-size models are timm's own (``deit_tiny_patch16_224`` ...): ``vitmix.create_model`` swaps
their attention through ``attn_layer``. This file adds small-image configurations for the small
datasets (8×8 digits, 28×28 Fashion-MNIST, 32×32 CIFAR), which timm does not ship.

Dense features come from timm (``forward_intermediates``, ``features_only=True`` with the last 3
blocks by default, every map at stride ``patch_size``). Spatial mixers need the token grid, which a
flat ``(B, N, C)`` sequence does not carry: :func:`bind_token_grid` gives it to them, fixed for a
fixed ``img_size`` (square or not) and per call for ``dynamic_img_size=True``.
"""
from __future__ import annotations

from functools import partial
from typing import Tuple

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from ..mixers import TokenMixer, set_token_grid
from ._builder import mixer_attn_layer, model_cfg

_SMALL = dict(input_size=(3, 32, 32), num_classes=10, crop_pct=1.0, interpolation="bilinear",
              mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

default_cfgs = generate_default_cfgs({
    "vit_nano_patch4_32.untrained": model_cfg(**_SMALL),
    "vit_tiny_patch4_32.untrained": model_cfg(**_SMALL),
    "vit_small_patch4_32.untrained": model_cfg(**_SMALL),
})


def _set_grid_hook(vit: VisionTransformer, embed: nn.Module, args: Tuple, out: torch.Tensor) -> None:
    """Forward hook of a dynamic-size ViT's patch embedding: its ``(B, H, W, C)`` output gives the grid.

    Bound with ``functools.partial`` (not a closure) so ``copy.deepcopy`` (EMA) rebinds it to the copy."""
    set_token_grid(vit, (out.shape[1], out.shape[2]), vit.num_prefix_tokens)


def bind_token_grid(model: nn.Module) -> nn.Module:
    """Give the vitmix mixers of a timm ``VisionTransformer`` (or of its ``features_only`` wrapper)
    their token grid and prefix count, so spatial mixers see non-square grids correctly.

    Fixed-size models get ``patch_embed.grid_size`` once; ``dynamic_img_size=True`` models get a
    forward hook on the patch embedding that sets the grid of each call (in ``forward`` and
    ``forward_intermediates`` alike). Without this a mixer infers only a square grid after one CLS
    token, and raises for any other layout (8×12 + CLS = 97 tokens).
    Models without a ``patch_embed.grid_size`` are returned unchanged.
    """
    vit = getattr(model, "model", model)  # FeatureGetterNet keeps the wrapped model as .model
    embed = getattr(vit, "patch_embed", None)
    if embed is None or not hasattr(embed, "grid_size"):
        return model
    if getattr(vit, "dynamic_img_size", False):
        if not getattr(embed, "_vitmix_grid_hook", False):
            embed.register_forward_hook(partial(_set_grid_hook, vit))
            embed._vitmix_grid_hook = True
    else:
        _check_bound_grid(vit, tuple(embed.grid_size))
        set_token_grid(vit, tuple(embed.grid_size), getattr(vit, "num_prefix_tokens", None))
    return model


def _check_bound_grid(vit: nn.Module, grid: Tuple[int, int]) -> None:
    """A mixer built with ``hw=`` (``-M hw=[4,4]``) that disagrees with the patch grid is an error
    naming both, rather than silently replaced by the model's grid."""
    for mixer in vit.modules():
        bound = getattr(type(mixer), "bound_options", {}).get("hw") if isinstance(mixer, TokenMixer) else None
        if bound is not None and tuple(int(s) for s in bound) != tuple(grid):
            raise ValueError(f"mixer option hw={list(bound)} disagrees with the model's token grid "
                             f"{list(grid)} (img_size / patch_size); leave hw out: the model sets it")


def _create_vit(variant: str, pretrained: bool = False, mixer=None, mixer_options=None, **kwargs):
    kwargs.setdefault("attn_layer", mixer_attn_layer(mixer, mixer_options))
    model = build_model_with_cfg(
        VisionTransformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs,
    )
    return bind_token_grid(model)


@register_model
def vit_nano_patch4_32(pretrained=False, **kwargs) -> VisionTransformer:
    """ViT-Nano, patch 4 at 32×32 (64 tokens + CLS), dim 128, depth 6, 4 heads: the demo model."""
    args = dict(img_size=32, patch_size=4, embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0,
                num_classes=10)
    return _create_vit("vit_nano_patch4_32", pretrained, **dict(args, **kwargs))


@register_model
def vit_tiny_patch4_32(pretrained=False, **kwargs) -> VisionTransformer:
    """DeiT-Tiny widths (192, 12 blocks, 3 heads) with patch 4 at 32×32 for CIFAR-size data."""
    args = dict(img_size=32, patch_size=4, embed_dim=192, depth=12, num_heads=3, num_classes=10)
    return _create_vit("vit_tiny_patch4_32", pretrained, **dict(args, **kwargs))


@register_model
def vit_small_patch4_32(pretrained=False, **kwargs) -> VisionTransformer:
    """DeiT-Small widths (384, 12 blocks, 6 heads) with patch 4 at 32×32."""
    args = dict(img_size=32, patch_size=4, embed_dim=384, depth=12, num_heads=6, num_classes=10)
    return _create_vit("vit_small_patch4_32", pretrained, **dict(args, **kwargs))
