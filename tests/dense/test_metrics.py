"""Confusion-matrix mIoU / pixel accuracy (hand-computed) and COCO AP through pycocotools."""
import math

import pytest
import torch

from vitmix.dense.metrics import ConfusionMatrix


def test_confusion_matrix_matches_a_hand_computed_example_with_an_ignored_pixel():
    target = torch.tensor([[0, 0, 1], [1, 2, 255]])
    prediction = torch.tensor([[0, 1, 1], [1, 2, 0]])
    cm = ConfusionMatrix(3, ignore_index=255)
    cm.update(prediction, target)
    assert cm.matrix.tolist() == [[1, 1, 0], [0, 2, 0], [0, 0, 1]]
    # IoU: class 0 = 1 / (2 + 1 - 1), class 1 = 2 / (2 + 3 - 2), class 2 = 1 / 1
    assert cm.iou().tolist() == pytest.approx([0.5, 2 / 3, 1.0])
    result = cm.compute()
    assert result["mIoU"] == pytest.approx((0.5 + 2 / 3 + 1.0) / 3)
    assert result["pixel_accuracy"] == pytest.approx(4 / 5)


def test_updates_accumulate_and_logits_are_argmaxed():
    cm = ConfusionMatrix(2)
    logits = torch.tensor([[[[2.0, -1.0]], [[0.0, 3.0]]]])      # (1, 2, 1, 2): predicts 0, 1
    cm.update(logits, torch.tensor([[[0, 0]]]))
    cm.update(torch.tensor([1]), torch.tensor([1]))
    assert cm.matrix.tolist() == [[1, 1], [0, 1]]


def test_a_class_absent_from_targets_and_predictions_does_not_count_in_miou():
    cm = ConfusionMatrix(4)
    cm.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert math.isnan(float(cm.iou()[3])) and cm.compute()["mIoU"] == 1.0


def test_a_target_label_outside_the_classes_is_a_one_line_error():
    cm = ConfusionMatrix(3, ignore_index=255)
    with pytest.raises(ValueError, match="target label 7 outside 0..2"):
        cm.update(torch.tensor([0, 1]), torch.tensor([0, 7]))
    with pytest.raises(ValueError, match="shape"):
        cm.update(torch.tensor([0, 1]), torch.tensor([0, 1, 2]))


def _box_mask(box, size=64):
    mask = torch.zeros(size, size, dtype=torch.uint8)
    x1, y1, x2, y2 = box
    mask[y1:y2, x1:x2] = 1
    return mask


def _targets():
    boxes = [[[4, 4, 20, 24], [30, 10, 60, 40]], [[10, 12, 40, 50]], []]
    labels = [[1, 2], [2], []]                         # the third image has no object (valid)
    return [dict(boxes=torch.tensor(b, dtype=torch.float32).reshape(-1, 4), labels=torch.tensor(lab, dtype=torch.int64),
                 masks=torch.stack([_box_mask(x) for x in b]) if b else torch.zeros(0, 64, 64, dtype=torch.uint8))
            for b, lab in zip(boxes, labels)]


def _perfect(targets):
    return [dict(boxes=t["boxes"].clone(), labels=t["labels"].clone(), scores=torch.ones(len(t["labels"])),
                 masks=t["masks"][:, None].float()) for t in targets]


def test_perfect_predictions_score_ap_one_for_boxes_and_masks():
    pytest.importorskip("pycocotools", reason="COCO AP needs pycocotools (pip install 'vitmix[dense]')")
    from vitmix.dense.metrics import coco_ap

    targets = _targets()
    result = coco_ap(_perfect(targets), targets, [(64, 64)] * 3, num_classes=3)
    assert set(result) == {"box_AP", "box_AP50", "box_AP75", "mask_AP", "mask_AP50", "mask_AP75"}
    assert all(v == pytest.approx(1.0) for v in result.values())


def test_a_shifted_box_lowers_box_ap_and_a_wrong_class_scores_zero():
    pytest.importorskip("pycocotools", reason="COCO AP needs pycocotools (pip install 'vitmix[dense]')")
    from vitmix.dense.metrics import coco_ap

    targets = _targets()
    shifted = _perfect(targets)
    shifted[1]["boxes"] = shifted[1]["boxes"] + torch.tensor([8.0, 8.0, 8.0, 8.0])   # IoU ≈ 0.5 with its target
    result = coco_ap(shifted, targets, [(64, 64)] * 3, num_classes=3, iou_types=("bbox",))
    assert result["box_AP"] < 0.9 and result["box_AP75"] < 1.0
    wrong = _perfect(targets)
    for p in wrong:
        p["labels"] = 3 - p["labels"]
    assert coco_ap(wrong, targets, [(64, 64)] * 3, num_classes=3, iou_types=("bbox",))["box_AP"] == 0.0


def test_no_predictions_score_zero_and_no_objects_give_nan():
    pytest.importorskip("pycocotools", reason="COCO AP needs pycocotools (pip install 'vitmix[dense]')")
    from vitmix.dense.metrics import coco_ap

    targets = _targets()
    empty = [dict(boxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.int64), scores=torch.zeros(0),
                  masks=torch.zeros(0, 1, 64, 64)) for _ in targets]
    assert coco_ap(empty, targets, [(64, 64)] * 3, num_classes=3)["box_AP"] == 0.0
    nothing = coco_ap(empty[2:], targets[2:], [(64, 64)], num_classes=3)
    assert math.isnan(nothing["box_AP"]) and math.isnan(nothing["mask_AP"])


class _Oracle(torch.nn.Module):
    """A "model" that returns what the test hands it: logits of known labels, or known detections."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = list(outputs)

    def forward(self, images):
        return self.outputs.pop(0)


def test_evaluate_segmentation_counts_every_batch():
    from vitmix.dense.metrics import evaluate_segmentation

    labels = [torch.tensor([[[0, 1], [1, 1]]]), torch.tensor([[[2, 2], [0, 255]]])]
    logits = [torch.nn.functional.one_hot(torch.tensor([[[0, 1], [1, 0]]]), 3).permute(0, 3, 1, 2).float(),
              torch.nn.functional.one_hot(torch.tensor([[[2, 2], [0, 0]]]), 3).permute(0, 3, 1, 2).float()]
    loader = [(torch.zeros(1, 3, 2, 2), lab) for lab in labels]
    result = evaluate_segmentation(_Oracle(logits), loader, 3)
    assert result["pixel_accuracy"] == pytest.approx(6 / 7)   # one of 7 scored pixels wrong, one ignored


def test_evaluate_detection_with_perfect_outputs_scores_one():
    pytest.importorskip("pycocotools", reason="COCO AP needs pycocotools (pip install 'vitmix[dense]')")
    from vitmix.dense.metrics import evaluate_detection

    targets = _targets()
    loader = [([torch.zeros(3, 64, 64)] * 2, targets[:2]), ([torch.zeros(3, 64, 64)], targets[2:])]
    perfect = _perfect(targets)
    result = evaluate_detection(_Oracle([perfect[:2], perfect[2:]]), loader, num_classes=3)
    assert result["box_AP"] == pytest.approx(1.0) and result["mask_AP"] == pytest.approx(1.0)
