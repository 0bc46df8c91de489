"""Helpers shared by vitmix model files: default cfgs and mixer → ``attn_layer`` resolution."""
from __future__ import annotations

from typing import Dict, Optional

from timm.layers import trunc_normal_
from timm.models import clean_state_dict
from torch import nn

from ..mixers import timm_attn
from ..mixers.base import TokenMixer

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


#: checkpoint keys that hold the weights, in the order timm's ``load_state_dict`` prefers them (EMA first)
_WEIGHT_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")


def unwrap_checkpoint(checkpoint: Dict) -> Dict:
    """The weights of a training checkpoint (EMA first, as timm loads them, and as the official SOFT
    evaluation does) without DDP / ``torch.compile`` prefixes; a bare state dict passes unchanged."""
    for key in _WEIGHT_KEYS:
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    return clean_state_dict(checkpoint)


def init_linear_and_norm(model: nn.Module) -> None:
    """The ViT-style initialisation the official pyramid and WeightFormer code share: every
    ``nn.Linear`` truncated normal (std 0.02) with zero bias, LayerNorms ones/zeros, in
    ``model.modules()`` order (so the random stream, and the weights, match the official code)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in model.modules():       # mixers that rescale their fresh linears (timm's ViT init calls this too)
        if isinstance(m, TokenMixer) and hasattr(m, "init_weights"):
            m.init_weights()
