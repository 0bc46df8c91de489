"""Dense prediction with vitmix backbones: data, heads and metrics (see docs/dense.md).

- ``scenes``: ``FashionScenes``, seeded Fashion-MNIST garment scenes (semantic maps, instance masks, boxes);
- ``coco`` / ``maskfolder``: a user's COCO-format folder and image + mask-PNG folder;
- ``heads``: ``DenseBackbone`` (any vitmix model → strides 4–32), ``SemanticFPN``, ``create_segmenter``;
- ``detection``: torchvision Faster/Mask R-CNN on a vitmix backbone behind torchvision's FPN;
- ``metrics``: confusion-matrix mIoU / pixel accuracy, COCO box / mask AP with pycocotools;
- ``config`` / ``runner`` / ``cli``: ``vitmix dense train | eval``.

pycocotools (``pip install 'vitmix[dense]'``) is imported only by the COCO reader and the AP metric.
"""
from .._lazy import lazy_attributes

# names are imported on first use, so `vitmix --help` (which builds the dense parser) starts without torch
_EXPORTS = {
    "FashionScenes": ".scenes:FashionScenes",
    "SCENE_CLASSES": ".scenes:SCENE_CLASSES",
    "NUM_SCENE_CLASSES": ".scenes:NUM_SCENE_CLASSES",
    "detection_collate": ".scenes:detection_collate",
    "segmentation_collate": ".scenes:segmentation_collate",
    "DenseBackbone": ".heads:DenseBackbone",
    "SimpleFeaturePyramid": ".heads:SimpleFeaturePyramid",
    "SemanticFPN": ".heads:SemanticFPN",
    "Segmenter": ".heads:Segmenter",
    "create_segmenter": ".heads:create_segmenter",
    "FPNBackbone": ".detection:FPNBackbone",
    "create_detector": ".detection:create_detector",
    "ConfusionMatrix": ".metrics:ConfusionMatrix",
    "coco_ap": ".metrics:coco_ap",
    "evaluate_segmentation": ".metrics:evaluate_segmentation",
    "evaluate_detection": ".metrics:evaluate_detection",
}
__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
