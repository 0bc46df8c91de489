"""Dense-task metrics: mIoU and pixel accuracy from a confusion matrix; COCO box / mask AP with pycocotools.

``ConfusionMatrix`` counts (target, prediction) pairs with one ``bincount`` per update, so it adds up
over batches (and over ranks: sum ``.matrix``). ``coco_ap`` runs pycocotools' ``COCOeval`` on targets
and predictions in torchvision's detection format, building the ground-truth COCO object in memory.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch


class ConfusionMatrix:
    """``matrix[t, p]``: pixels of target class ``t`` predicted as ``p``; pixels whose target is
    ``ignore_index`` are not counted. mIoU averages the IoU of the classes present in the targets or
    the predictions (a class absent from both has no IoU and does not count)."""

    def __init__(self, num_classes: int, ignore_index: Optional[int] = None):
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes, self.ignore_index = int(num_classes), ignore_index
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, prediction: torch.Tensor, target: torch.Tensor) -> None:
        """Count a batch: ``prediction`` class indices (or logits ``(B, C, H, W)``), ``target`` indices."""
        if prediction.dim() == target.dim() + 1:
            prediction = prediction.argmax(1)
        if prediction.shape != target.shape:
            raise ValueError(f"prediction shape {tuple(prediction.shape)} != target shape {tuple(target.shape)}")
        prediction, target = prediction.flatten().long().cpu(), target.flatten().long().cpu()
        if self.ignore_index is not None:
            keep = target != self.ignore_index
            prediction, target = prediction[keep], target[keep]
        bad = (target < 0) | (target >= self.num_classes)
        if bool(bad.any()):
            raise ValueError(f"target label {int(target[bad][0])} outside 0..{self.num_classes - 1} "
                             f"(and not the ignore index {self.ignore_index})")
        n = self.num_classes
        self.matrix += torch.bincount(target * n + prediction.clamp(0, n - 1), minlength=n * n).view(n, n)

    def iou(self) -> torch.Tensor:
        """Per-class IoU ``TP / (TP + FP + FN)`` (float64; NaN for a class absent from both sides)."""
        m = self.matrix.double()
        tp = m.diag()
        union = m.sum(0) + m.sum(1) - tp
        return torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))

    def compute(self) -> Dict[str, float]:
        """``mIoU`` and ``pixel_accuracy`` (0 when nothing was counted)."""
        total = int(self.matrix.sum())
        iou = self.iou()
        present = ~torch.isnan(iou)
        return {"mIoU": float(iou[present].mean()) if bool(present.any()) else 0.0,
                "pixel_accuracy": float(self.matrix.diag().sum()) / total if total else 0.0}


# --- COCO AP -----------------------------------------------------------------------------------------------
_STATS = {"AP": 0, "AP50": 1, "AP75": 2}


def _rle(mask: np.ndarray) -> dict:
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


def _xywh(box: Sequence[float]) -> List[float]:
    x1, y1, x2, y2 = (float(v) for v in box)
    return [x1, y1, x2 - x1, y2 - y1]


def targets_to_coco(targets: Sequence[dict], image_sizes: Sequence[Sequence[int]], num_classes: int) -> dict:
    """A COCO ground-truth dict from torchvision-format targets (``boxes`` xyxy, ``labels`` 1.., optional
    ``masks``); image ``i`` gets id ``i`` and category ``c`` id ``c``."""
    images, annotations = [], []
    for image_id, (target, (height, width)) in enumerate(zip(targets, image_sizes)):
        images.append(dict(id=image_id, height=int(height), width=int(width)))
        masks = target.get("masks")
        for k, (box, label) in enumerate(zip(target["boxes"].tolist(), target["labels"].tolist())):
            ann = dict(id=len(annotations) + 1, image_id=image_id, category_id=int(label), bbox=_xywh(box),
                       iscrowd=0, area=_xywh(box)[2] * _xywh(box)[3])
            if masks is not None:
                mask = masks[k].cpu().numpy() > 0
                ann.update(segmentation=_rle(mask), area=float(mask.sum()))
            annotations.append(ann)
    categories = [dict(id=c, name=str(c)) for c in range(1, num_classes)]
    return dict(images=images, annotations=annotations, categories=categories)


def predictions_to_coco(predictions: Sequence[dict], mask_threshold: float = 0.5) -> List[dict]:
    """COCO result entries from torchvision-format predictions (``boxes``, ``scores``, ``labels``,
    optional ``masks`` ``(K, 1, H, W)`` probabilities, thresholded at ``mask_threshold``)."""
    results = []
    for image_id, pred in enumerate(predictions):
        masks = pred.get("masks")
        for k, (box, score, label) in enumerate(zip(pred["boxes"].tolist(), pred["scores"].tolist(),
                                                    pred["labels"].tolist())):
            entry = dict(image_id=image_id, category_id=int(label), bbox=_xywh(box), score=float(score))
            if masks is not None:
                mask = masks[k].reshape(masks.shape[-2:]).detach().cpu().numpy() > mask_threshold
                entry["segmentation"] = _rle(mask)
            results.append(entry)
    return results


PIP_HINT = "pip install 'vitmix[dense]' (or: pip install pycocotools)"


def require_pycocotools(what: str) -> None:
    """A one-line ``ValueError`` naming the pip install when pycocotools is missing, so that a detection
    run says so before it trains, not when its first evaluation imports it."""
    if importlib.util.find_spec("pycocotools") is None:
        raise ValueError(f"{what} needs pycocotools, which is not installed: {PIP_HINT}")


def coco_ap(predictions: Sequence[dict], targets: Sequence[dict], image_sizes: Sequence[Sequence[int]],
            num_classes: int, iou_types: Sequence[str] = ("bbox", "segm")) -> Dict[str, float]:
    """COCO AP / AP50 / AP75 (``box_*`` for "bbox", ``mask_*`` for "segm") with pycocotools' COCOeval.

    ``predictions[i]`` and ``targets[i]`` describe image ``i`` of size ``image_sizes[i]`` = (H, W);
    ``num_classes`` counts the background (label 0). No predictions at all → AP 0; no ground-truth
    object at all → NaN (COCO's -1)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not len(predictions) == len(targets) == len(image_sizes):
        raise ValueError(f"{len(predictions)} predictions, {len(targets)} targets, {len(image_sizes)} sizes")
    gt = COCO()
    gt.dataset = targets_to_coco(targets, image_sizes, num_classes)
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    results = predictions_to_coco(predictions)
    out = {}
    for iou_type in iou_types:
        prefix = {"bbox": "box", "segm": "mask"}[iou_type]
        if iou_type == "segm":   # the masks alone (pycocotools then takes area and box from them)
            if any("segmentation" not in a for a in gt.dataset["annotations"]):
                raise ValueError("mask AP needs masks in every target; use iou_types=('bbox',)")
            results_here = [{k: v for k, v in r.items() if k != "bbox"} for r in results if "segmentation" in r]
        else:
            results_here = [{k: v for k, v in r.items() if k != "segmentation"} for r in results]
        stats = _evaluate(gt, results_here, iou_type, COCOeval)
        out.update({f"{prefix}_{name}": stats[i] for name, i in _STATS.items()})
    return out


def _evaluate(gt, results: List[dict], iou_type: str, coco_eval_cls) -> List[float]:
    if not gt.dataset["annotations"]:
        return [float("nan")] * 3
    if not results:
        return [0.0] * 3
    with contextlib.redirect_stdout(io.StringIO()):
        dt = gt.loadRes(results)
        evaluator = coco_eval_cls(gt, dt, iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return [max(float(s), 0.0) if s != -1 else float("nan") for s in evaluator.stats[:3]]


# --- evaluation loops ---------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_segmentation(model: torch.nn.Module, loader, num_classes: int, ignore_index: Optional[int] = 255,
                          device="cpu") -> Dict[str, float]:
    """mIoU and pixel accuracy of ``model`` (images → logits) over ``loader`` of (images, semantic maps)
    batches, as ``segmentation_collate`` makes them."""
    model.eval()
    matrix = ConfusionMatrix(num_classes, ignore_index)
    for images, labels in loader:
        matrix.update(model(images.to(device)), labels)
    return matrix.compute()


@torch.no_grad()
def evaluate_detection(model: torch.nn.Module, loader, num_classes: int, masks: bool = True,
                       device="cpu") -> Dict[str, float]:
    """COCO box (and mask) AP of a torchvision detector over ``loader`` of ``detection_collate`` batches."""
    model.eval()
    predictions, targets, sizes = [], [], []
    for images, batch_targets in loader:
        outputs = model([im.to(device) for im in images])
        predictions += [{k: v.cpu() for k, v in out.items()} for out in outputs]
        targets += list(batch_targets)
        sizes += [tuple(im.shape[-2:]) for im in images]
    return coco_ap(predictions, targets, sizes, num_classes, ("bbox", "segm") if masks else ("bbox",))
