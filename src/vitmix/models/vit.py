"""Isotropic ViT/DeiT backbones built on timm's ``VisionTransformer`` with any vitmix mixer.

ImageNet-size models are timm's own (``deit_tiny_patch16_224`` ...): ``vitmix.create_model`` swaps
their attention through ``attn_layer``. This file adds small-image configurations for the small
datasets (8×8 digits, 28×28 Fashion-MNIST, 32×32 CIFAR), which timm does not ship.
"""
from __future__ import annotations

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ._builder import mixer_attn_layer, model_cfg

_SMALL = dict(input_size=(3, 32, 32), num_classes=10, crop_pct=1.0, interpolation="bilinear",
              mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

default_cfgs = generate_default_cfgs({
    "vit_nano_patch4_32.untrained": model_cfg(**_SMALL),
    "vit_tiny_patch4_32.untrained": model_cfg(**_SMALL),
    "vit_small_patch4_32.untrained": model_cfg(**_SMALL),
})


def _create_vit(variant: str, pretrained: bool = False, mixer=None, mixer_options=None, **kwargs):
    kwargs.setdefault("attn_layer", mixer_attn_layer(mixer, mixer_options))
    return build_model_with_cfg(
        VisionTransformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs,
    )


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
