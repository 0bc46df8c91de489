"""Helpers shared by vitmix model files: default cfgs and mixer → ``attn_layer`` resolution."""
from __future__ import annotations

from typing import Optional

from ..mixers import timm_attn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def model_cfg(url: str = "", **kwargs) -> dict:
    """A timm ``pretrained_cfg`` dict with vitmix defaults (no hosted weights)."""
    return {
        "url": url, "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.9, "interpolation": "bicubic", "fixed_input_size": False,
        "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "first_conv": "patch_embed.proj",
        "classifier": "head", "license": "apache-2.0", **kwargs,
    }


def mixer_attn_layer(mixer: Optional[str], mixer_options: Optional[dict], default: str = "softmax"):
    """The timm ``attn_layer`` class for ``mixer`` (``default`` when ``None``)."""
    return timm_attn(mixer or default, **(mixer_options or {}))
