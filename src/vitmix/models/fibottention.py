"""Fibottention ViTs: timm ``VisionTransformer`` with the ``fibottention`` mixer in every block.

As in the paper's image setup (MAE fine-tune code with ``--cls_token``), the models pool the CLS
token. Each block's mixer gets its layer index, so heads are shuffled per layer (the official image
code loses that through a module-global cache; see ``docs/fibottention.md``).

``mixer_options`` override the mixer's options (``mode``, ``w_min``, ``w_max``, ``variant``,
``shuffle``, ``include_diagonal``, ``backend``), e.g.
``timm.create_model("vit_small_patch16_224_fibottention", mixer_options={"mode": "official"})``;
``preset="official"`` (a model kwarg, the same as ``mixer_options={"preset": "official"}``) gives the
official image code's behaviour (multiplicative mask, Python-random head order shared by all layers;
see ``docs/presets.md``).
The mixer itself is fixed: ``mixer=`` other than ``"fibottention"`` raises ``ValueError`` (use the
plain ViT names such as ``deit_small_patch16_224`` with ``vitmix.create_model(..., mixer=...)``).
"""
from __future__ import annotations

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ..mixers import timm_attn
from ..mixers.fibottention import assign_layer_indices
from ._builder import model_cfg
from .vit import bind_token_grid

__all__ = []  # models are reached through timm.create_model / vitmix.create_model

_SMALL = dict(input_size=(3, 32, 32), num_classes=10, crop_pct=1.0, interpolation="bilinear",
              mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

default_cfgs = generate_default_cfgs({
    "vit_tiny_patch16_224_fibottention.untrained": model_cfg(),
    "vit_small_patch16_224_fibottention.untrained": model_cfg(),
    "vit_base_patch16_224_fibottention.untrained": model_cfg(),
    "vit_nano_patch4_32_fibottention.untrained": model_cfg(**_SMALL),
    "vit_tiny_patch4_32_fibottention.untrained": model_cfg(**_SMALL),
})


def _create_fibottention_vit(variant: str, pretrained: bool = False, mixer=None, mixer_options=None,
                             preset=None, **kwargs):
    if mixer not in (None, "fibottention"):
        raise ValueError(
            f"{variant} always uses the 'fibottention' mixer (got mixer={mixer!r}); pass mixer_options to "
            f"change its options, or build a plain ViT (e.g. deit_tiny_patch16_224) with mixer={mixer!r}"
        )
    if "attn_layer" in kwargs:
        raise ValueError(f"{variant} sets attn_layer itself; use mixer_options to configure Fibottention")
    if preset is not None:
        mixer_options = dict(mixer_options or {}, preset=preset)
    kwargs["attn_layer"] = timm_attn("fibottention", **(mixer_options or {}))
    kwargs.setdefault("global_pool", "token")
    model = build_model_with_cfg(
        VisionTransformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs,
    )
    return bind_token_grid(assign_layer_indices(model))


@register_model
def vit_tiny_patch16_224_fibottention(pretrained=False, **kwargs) -> VisionTransformer:
    """ViT-Ti/16 (192 dim, 12 blocks, 3 heads) at 224² with Fibottention, CLS pooling."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return _create_fibottention_vit("vit_tiny_patch16_224_fibottention", pretrained, **dict(args, **kwargs))


@register_model
def vit_small_patch16_224_fibottention(pretrained=False, **kwargs) -> VisionTransformer:
    """ViT-S/16 (384 dim, 12 blocks, 6 heads) at 224² with Fibottention, CLS pooling."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _create_fibottention_vit("vit_small_patch16_224_fibottention", pretrained, **dict(args, **kwargs))


@register_model
def vit_base_patch16_224_fibottention(pretrained=False, **kwargs) -> VisionTransformer:
    """ViT-B/16 (768 dim, 12 blocks, 12 heads) at 224² with Fibottention, CLS pooling (the paper's model)."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return _create_fibottention_vit("vit_base_patch16_224_fibottention", pretrained, **dict(args, **kwargs))


@register_model
def vit_nano_patch4_32_fibottention(pretrained=False, **kwargs) -> VisionTransformer:
    """ViT-Nano, patch 4 at 32×32 (64 tokens + CLS), dim 128, depth 6, 4 heads, with Fibottention."""
    args = dict(img_size=32, patch_size=4, embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0, num_classes=10)
    return _create_fibottention_vit("vit_nano_patch4_32_fibottention", pretrained, **dict(args, **kwargs))


@register_model
def vit_tiny_patch4_32_fibottention(pretrained=False, **kwargs) -> VisionTransformer:
    """DeiT-Tiny widths (192, 12 blocks, 3 heads), patch 4 at 32×32 (CIFAR-size data), with Fibottention."""
    args = dict(img_size=32, patch_size=4, embed_dim=192, depth=12, num_heads=3, num_classes=10)
    return _create_fibottention_vit("vit_tiny_patch4_32_fibottention", pretrained, **dict(args, **kwargs))
