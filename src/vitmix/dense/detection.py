"""torchvision's Faster R-CNN / Mask R-CNN on a vitmix backbone behind torchvision's FPN.

``FPNBackbone`` plays the role of torchvision's ``BackboneWithFPN`` (whose body must be an
``IntermediateLayerGetter`` over named children, which a timm feature model is not): a
``DenseBackbone`` (four maps at strides 4–32) → ``FeaturePyramidNetwork`` with the ``LastLevelMaxPool``
extra level, so the heads see levels "0".."3" and "pool" (strides 4–64) and ``out_channels``, exactly
as with torchvision's ResNet-FPN. The detector itself is torchvision's, unchanged; ``create_detector``
only picks sizes that suit 128²–256² scenes (anchors 16–256 px, no resizing of the input, lighter box
and mask heads than the 800-px COCO defaults).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.ops import FeaturePyramidNetwork
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from .heads import DenseBackbone

#: one anchor size per FPN level (strides 4, 8, 16, 32, 64), three aspect ratios each
SCENE_ANCHOR_SIZES = ((16,), (32,), (64,), (128,), (256,))
ASPECT_RATIOS = (0.5, 1.0, 2.0)


class FPNBackbone(nn.Module):
    """``DenseBackbone`` + torchvision ``FeaturePyramidNetwork`` (+ max-pool level): what torchvision's
    detection models take as ``backbone`` (a module with ``out_channels`` returning an ``OrderedDict``)."""

    def __init__(self, body: DenseBackbone, out_channels: int = 64):
        super().__init__()
        self.body = body
        self.fpn = FeaturePyramidNetwork(list(body.channels), out_channels, extra_blocks=LastLevelMaxPool())
        self.out_channels = out_channels

    def forward(self, images: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        return self.fpn(self.body(images))


def create_detector(name: str, num_classes: int, masks: bool = True, img_size: int = 256,
                    mixer: Optional[str] = None, fpn_channels: int = 64, representation_size: int = 256,
                    mask_channels: int = 64, anchor_sizes=SCENE_ANCHOR_SIZES, backbone_kwargs: Optional[dict] = None,
                    **detector_kwargs) -> nn.Module:
    """torchvision ``MaskRCNN`` (``masks=True``) or ``FasterRCNN`` on vitmix model ``name``.

    ``num_classes`` counts the background (fashion-scenes: 11). Images are not resized
    (``min_size = max_size = img_size``); normalisation uses the backbone's ``pretrained_cfg`` mean/std.
    ``detector_kwargs`` go to torchvision's constructor unchanged (``rpn_post_nms_top_n_train``,
    ``box_detections_per_img``...)."""
    body = DenseBackbone(name, img_size=img_size, mixer=mixer, pyramid_channels=fpn_channels,
                         **(backbone_kwargs or {}))
    backbone = FPNBackbone(body, fpn_channels)
    cfg = getattr(body.body, "pretrained_cfg", None) or {}
    args = dict(min_size=img_size, max_size=img_size,
                image_mean=list(cfg.get("mean", (0.485, 0.456, 0.406))),
                image_std=list(cfg.get("std", (0.229, 0.224, 0.225))),
                rpn_anchor_generator=AnchorGenerator(anchor_sizes, (ASPECT_RATIOS,) * len(anchor_sizes)),
                box_head=TwoMLPHead(fpn_channels * 7 * 7, representation_size),
                box_predictor=FastRCNNPredictor(representation_size, num_classes))
    if masks:
        args.update(mask_head=MaskRCNNHeads(fpn_channels, (mask_channels,) * 4, dilation=1),
                    mask_predictor=MaskRCNNPredictor(mask_channels, mask_channels, num_classes))
    args.update(detector_kwargs)
    return (MaskRCNN if masks else FasterRCNN)(backbone, num_classes=None, **args)
