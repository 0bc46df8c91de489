"""Dense backbones and the Semantic-FPN segmentation head, on any vitmix model.

``DenseBackbone`` turns a model name into a module returning an ``OrderedDict`` of maps at strides
4/8/16/32 (keys "0".."3", as torchvision's FPN and detection heads expect):

- a pyramid (``soft_*``, ``soft_norm_*``, ``laplacianformer_*``): its four stage outputs
  (``features_only=True``);
- an isotropic model (a ViT with any mixer, ``weightformer_*``): the last block's map resampled to the
  four strides by ``SimpleFeaturePyramid`` (ViTDet, Li et al. 2022: transposed convolutions up,
  max-pooling down).

The kind is read from ``feature_info`` (one stride for all outputs → isotropic), not from the name.
``SemanticFPN`` is the semantic branch of Panoptic FPN (Kirillov et al. 2019) over torchvision's
``FeaturePyramidNetwork``: every FPN level is brought to stride 4 by (3×3 conv, GroupNorm, ReLU, 2×
bilinear upsampling) stages, the levels are summed, and a 1×1 convolution gives the class logits,
upsampled to the input.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import FeaturePyramidNetwork

from ..models import create_model

#: the strides every dense backbone outputs
PYRAMID_STRIDES = (4, 8, 16, 32)


def _group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with up to 32 groups that divide ``channels`` (BatchNorm is poor at batch 1–2)."""
    return nn.GroupNorm(math.gcd(32, channels), channels)


class SimpleFeaturePyramid(nn.Module):
    """One map at stride ``in_stride`` → one map per stride in ``strides`` (ViTDet's simple pyramid).

    Upsampling by ``2^k`` is ``k`` stride-2 transposed convolutions (GroupNorm + GELU between them),
    downsampling by ``2^k`` a ``2^k`` max-pool; each level ends with a 1×1 and a 3×3 convolution (with
    GroupNorm) to ``out_channels``."""

    def __init__(self, in_channels: int, in_stride: int, out_channels: int,
                 strides: Sequence[int] = PYRAMID_STRIDES):
        super().__init__()
        self.strides = tuple(strides)
        for s in self.strides:
            ratio = max(s, in_stride) / min(s, in_stride)
            if ratio != 2 ** round(math.log2(ratio)):
                raise ValueError(f"a simple feature pyramid needs strides that are powers of 2 apart; the "
                                 f"backbone's stride {in_stride} and the level stride {s} are not "
                                 "(use a patch size of 4, 8, 16 or 32)")
        self.levels = nn.ModuleList(self._level(in_channels, in_stride, s, out_channels) for s in self.strides)

    @staticmethod
    def _level(in_channels: int, in_stride: int, stride: int, out_channels: int) -> nn.Sequential:
        layers: List[nn.Module] = []
        channels = in_channels
        if stride < in_stride:
            steps = int(round(math.log2(in_stride / stride)))
            for i in range(steps):
                nxt = max(channels // 2, out_channels // 2, 8)
                layers.append(nn.ConvTranspose2d(channels, nxt, kernel_size=2, stride=2))
                if i < steps - 1:
                    layers += [_group_norm(nxt), nn.GELU()]
                channels = nxt
        elif stride > in_stride:
            factor = stride // in_stride
            layers.append(nn.MaxPool2d(kernel_size=factor, stride=factor, ceil_mode=True))
        layers += [nn.Conv2d(channels, out_channels, 1, bias=False), _group_norm(out_channels),
                   nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), _group_norm(out_channels)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [level(x) for level in self.levels]


class DenseBackbone(nn.Module):
    """A vitmix (or timm) model as a four-level feature extractor: ``forward(images)`` → ``OrderedDict``
    "0".."3" of maps at strides 4/8/16/32, with ``channels`` and ``strides`` describing them.

    Args:
        name: a model name (``laplacianformer_nano``, ``weightformer_nano``, ``vit_tiny_patch16_224``...).
        img_size: the input size; ViTs are built for it (``dynamic_img_size`` is passed through kwargs).
        mixer, mixer_options, model_kwargs: as for ``vitmix.create_model``.
        pyramid_channels: width of the simple feature pyramid of an isotropic model.
    """

    def __init__(self, name: str, img_size=None, mixer: Optional[str] = None, pyramid_channels: int = 64,
                 **model_kwargs):
        super().__init__()
        if img_size is not None and _takes_img_size(name, mixer, model_kwargs):   # CNNs (timm's resnet18) do not
            model_kwargs["img_size"] = img_size
        strides = _feature_strides(name, mixer, model_kwargs)
        isotropic = len(set(strides)) == 1
        if mixer is not None:
            model_kwargs["mixer"] = mixer
        if isotropic:   # the last block only (ViTDet): the pyramid is built from it
            model_kwargs["out_indices"] = (-1,)
        elif len(strides) > 4:   # e.g. a ResNet's stride-2 stem level: the four levels at strides 4-32
            model_kwargs["out_indices"] = tuple(i for i, s in enumerate(strides) if s >= 4)[-4:]
        self.body = create_model(name, features_only=True, pretrained=False, **model_kwargs)
        info = self.body.feature_info
        if isotropic:
            self.pyramid = SimpleFeaturePyramid(info.channels()[-1], info.reduction()[-1], pyramid_channels)
            self.channels, self.strides = [pyramid_channels] * 4, PYRAMID_STRIDES
        else:
            self.pyramid = None
            self.channels, self.strides = list(info.channels()), tuple(info.reduction())
        self.max_stride = max(max(self.strides), max(info.reduction()))

    def forward(self, images: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        check_input_size(images.shape[-2:], self.max_stride)
        maps = self.body(images)
        if self.pyramid is not None:
            maps = self.pyramid(maps[-1])
        return OrderedDict((str(i), m) for i, m in enumerate(maps))


def _probe(name: str, mixer, model_kwargs: dict):
    """``name`` built on the meta device (costs nothing): its ``feature_info`` without weights."""
    kwargs = {k: v for k, v in model_kwargs.items() if k not in ("out_indices", "pretrained")}
    if mixer is not None:
        kwargs["mixer"] = mixer
    with torch.device("meta"):
        return create_model(name, pretrained=False, **kwargs)


def _feature_strides(name: str, mixer, model_kwargs: dict) -> List[int]:
    """The stride of each of ``name``'s feature maps (one value for all of an isotropic model's)."""
    return [int(f["reduction"]) for f in _probe(name, mixer, model_kwargs).feature_info]


def _takes_img_size(name: str, mixer, model_kwargs: dict) -> bool:
    """Whether ``name``'s constructor takes ``img_size`` (ViTs and vitmix's pyramids do, timm's CNNs not)."""
    try:
        _probe(name, mixer, dict(model_kwargs, img_size=224))
    except (TypeError, ValueError) as err:
        if "img_size" in str(err):
            return False
        raise
    return True


def check_input_size(hw: Sequence[int], max_stride: int) -> None:
    """One-line error for an input smaller than the backbone's coarsest stride."""
    height, width = (int(s) for s in hw)
    if min(height, width) < max_stride:
        raise ValueError(f"input {height}x{width} is smaller than the backbone's coarsest stride {max_stride}; "
                         f"use images (scenes) of at least {max_stride}x{max_stride}")


class SemanticFPN(nn.Module):
    """Panoptic FPN's semantic branch over torchvision's ``FeaturePyramidNetwork``.

    ``forward(maps, size)`` with ``maps`` the backbone's ``OrderedDict`` (strides ``strides``, the
    first 4) → logits ``(B, num_classes, *size)``."""

    def __init__(self, in_channels: Sequence[int], strides: Sequence[int], num_classes: int,
                 fpn_channels: int = 64, head_channels: int = 32):
        super().__init__()
        self.strides = tuple(strides)
        self.fpn = FeaturePyramidNetwork(list(in_channels), fpn_channels)
        finest = self.strides[0]
        self.branches = nn.ModuleList(self._branch(fpn_channels, head_channels, int(round(math.log2(s / finest))))
                                      for s in self.strides)
        self.classifier = nn.Conv2d(head_channels, num_classes, 1)

    @staticmethod
    def _branch(in_channels: int, channels: int, upsamplings: int) -> nn.ModuleList:
        """``max(1, upsamplings)`` (conv, GN, ReLU) stages; each but a stride-4 level's ends in a 2× upsample."""
        stages = []
        for i in range(max(1, upsamplings)):
            stages.append(nn.Sequential(nn.Conv2d(in_channels if i == 0 else channels, channels, 3, padding=1,
                                                  bias=False), _group_norm(channels), nn.ReLU(inplace=True)))
        return nn.ModuleList(stages)

    def forward(self, maps: Dict[str, torch.Tensor], size: Tuple[int, int]) -> torch.Tensor:
        levels = list(self.fpn(maps).values())
        target = levels[0].shape[-2:]
        total = 0
        for level, branch, stride in zip(levels, self.branches, self.strides):
            x = level
            for stage in branch:
                x = stage(x)
                if stride > self.strides[0]:   # up one octave; the last step lands on the finest grid exactly
                    x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
            total = total + (x if x.shape[-2:] == target else
                             F.interpolate(x, size=target, mode="bilinear", align_corners=False))
        return F.interpolate(self.classifier(total), size=tuple(size), mode="bilinear", align_corners=False)


class Segmenter(nn.Module):
    """``DenseBackbone`` + ``SemanticFPN``: images ``(B, 3, H, W)`` → logits ``(B, num_classes, H, W)``."""

    def __init__(self, backbone: DenseBackbone, num_classes: int, fpn_channels: int = 64, head_channels: int = 32):
        super().__init__()
        self.backbone = backbone
        self.head = SemanticFPN(backbone.channels, backbone.strides, num_classes, fpn_channels, head_channels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images), images.shape[-2:])


def create_segmenter(name: str, num_classes: int, img_size=None, mixer: Optional[str] = None,
                     fpn_channels: int = 64, head_channels: int = 32, **model_kwargs) -> Segmenter:
    """A Semantic-FPN segmenter on vitmix model ``name`` (pyramid or isotropic, any ``mixer``)."""
    backbone = DenseBackbone(name, img_size=img_size, mixer=mixer, pyramid_channels=fpn_channels, **model_kwargs)
    return Segmenter(backbone, num_classes, fpn_channels, head_channels)
