"""Semantic-FPN on every pyramid family's nano model, the simple feature pyramid of isotropic models, and
torchvision Mask R-CNN / Faster R-CNN on vitmix backbones: forward, loss, backward at 128²."""
import pytest
import torch
import torch.nn.functional as F

from vitmix.dense.detection import FPNBackbone, create_detector
from vitmix.dense.heads import DenseBackbone, SimpleFeaturePyramid, create_segmenter
from vitmix.dense.scenes import NUM_SCENE_CLASSES, detection_collate, segmentation_collate


def _grads_everywhere(model) -> bool:
    return all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", ["laplacianformer_nano", "soft_nano", "soft_norm_nano", "weightformer_nano"])
def test_semantic_fpn_trains_on_each_nano_backbone(name, scenes):
    torch.manual_seed(0)
    model = create_segmenter(name, NUM_SCENE_CLASSES, img_size=128)
    images, labels = segmentation_collate([scenes()[0], scenes()[1]])
    logits = model(images)
    assert logits.shape == (2, NUM_SCENE_CLASSES, 128, 128)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    assert torch.isfinite(loss) and _grads_everywhere(model)
    assert model.backbone.strides == (4, 8, 16, 32)


def test_isotropic_vit_with_a_spatial_mixer_gets_a_simple_feature_pyramid():
    model = create_segmenter("vit_nano_patch4_32", 5, img_size=64, mixer="laplacian")
    assert model.backbone.pyramid is not None
    maps = model.backbone(torch.randn(1, 3, 64, 64))
    assert [tuple(m.shape[-2:]) for m in maps.values()] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 5, 64, 64)


def test_pyramid_backbones_use_their_stage_outputs_directly():
    backbone = DenseBackbone("soft_nano", img_size=128)
    assert backbone.pyramid is None and backbone.channels == [16, 32, 80, 128]


@pytest.mark.parametrize("in_stride", [4, 8, 16])
def test_simple_feature_pyramid_gives_strides_4_to_32(in_stride):
    sfp = SimpleFeaturePyramid(24, in_stride, 16)
    maps = sfp(torch.randn(1, 24, 128 // in_stride, 128 // in_stride))
    assert [tuple(m.shape[1:]) for m in maps] == [(16, 32, 32), (16, 16, 16), (16, 8, 8), (16, 4, 4)]


def test_a_stride_that_is_not_a_power_of_two_is_a_one_line_error():
    with pytest.raises(ValueError, match="stride 14 and the level stride 4 are not"):
        SimpleFeaturePyramid(24, 14, 16)


def test_an_input_smaller_than_the_coarsest_stride_is_a_one_line_error():
    model = create_segmenter("soft_nano", 3, img_size=128)
    with pytest.raises(ValueError, match="16x16 is smaller than the backbone's coarsest stride 32") as e:
        model(torch.randn(1, 3, 16, 16))
    assert "\n" not in str(e.value)


def test_mask_rcnn_trains_on_a_vitmix_backbone_with_an_empty_image_in_the_batch(scenes):
    torch.manual_seed(0)
    model = create_detector("laplacianformer_nano", NUM_SCENE_CLASSES, masks=True, img_size=128)
    assert isinstance(model.backbone, FPNBackbone)
    images, targets = detection_collate([scenes()[0], scenes()[1]])
    targets[1] = dict(boxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.int64),
                      masks=torch.zeros(0, 128, 128, dtype=torch.uint8))           # no object: valid
    losses = model(images, targets)
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"}
    total = sum(losses.values())
    total.backward()
    assert torch.isfinite(total)
    assert all(p.grad is not None for p in model.backbone.body.parameters())   # the backbone learns too
    model.eval()
    with torch.no_grad():
        out = model(images)
    assert set(out[0]) == {"boxes", "labels", "scores", "masks"} and out[0]["masks"].shape[-2:] == (128, 128)


def test_faster_rcnn_on_an_isotropic_backbone_keeps_the_input_size(scenes):
    torch.manual_seed(0)
    model = create_detector("weightformer_nano", NUM_SCENE_CLASSES, masks=False, img_size=128)
    images, targets = detection_collate([scenes()[0]])
    for t in targets:
        t.pop("masks")
    sum(model(images, targets).values()).backward()
    features = model.backbone(torch.randn(1, 3, 128, 128))
    assert list(features) == ["0", "1", "2", "3", "pool"]
    assert [m.shape[-1] for m in features.values()] == [32, 16, 8, 4, 2]
    assert model.transform.min_size == (128,) and model.transform.max_size == 128


def test_a_timm_cnn_gives_its_four_levels_at_strides_4_to_32():
    """ResNet-18-FPN, the dense baseline: timm's resnet18 (no img_size argument, a stride-2 stem level
    left out) behind the same FPN and heads."""
    from vitmix.dense import DenseBackbone

    backbone = DenseBackbone("resnet18", img_size=64)
    assert backbone.channels == [64, 128, 256, 512] and tuple(backbone.strides) == (4, 8, 16, 32)
    maps = backbone(torch.randn(1, 3, 64, 64))
    assert [tuple(m.shape[-2:]) for m in maps.values()] == [(16, 16), (8, 8), (4, 4), (2, 2)]
