"""Dense prediction with vitmix backbones: data, heads and metrics (see docs/dense.md).

- ``scenes``: ``FashionScenes``, seeded Fashion-MNIST garment scenes (semantic maps, instance masks, boxes);
- ``coco`` / ``maskfolder``: a user's COCO-format folder and image + mask-PNG folder;
- ``heads``: ``DenseBackbone`` (any vitmix model → strides 4–32), ``SemanticFPN``, ``create_segmenter``;
- ``detection``: torchvision Faster/Mask R-CNN on a vitmix backbone behind torchvision's FPN;
- ``metrics``: confusion-matrix mIoU / pixel accuracy, COCO box / mask AP with pycocotools.

pycocotools (``pip install 'vitmix[dense]'``) is imported only by the COCO reader and the AP metric.
"""
from .detection import FPNBackbone, create_detector
from .heads import DenseBackbone, SemanticFPN, Segmenter, SimpleFeaturePyramid, create_segmenter
from .metrics import ConfusionMatrix, coco_ap, evaluate_detection, evaluate_segmentation
from .scenes import NUM_SCENE_CLASSES, SCENE_CLASSES, FashionScenes, detection_collate, segmentation_collate

__all__ = ["FashionScenes", "SCENE_CLASSES", "NUM_SCENE_CLASSES", "detection_collate", "segmentation_collate",
           "DenseBackbone", "SimpleFeaturePyramid", "SemanticFPN", "Segmenter", "create_segmenter",
           "FPNBackbone", "create_detector", "ConfusionMatrix", "coco_ap", "evaluate_segmentation",
           "evaluate_detection"]
