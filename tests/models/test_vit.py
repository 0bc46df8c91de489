"""Isotropic ViT/DeiT backbones with any mixer."""
import pytest
import timm
import torch

import vitmix


@pytest.mark.parametrize("name,count", [
    ("deit_tiny_patch16_224", 5_717_416),
    ("deit_small_patch16_224", 22_050_664),
    ("deit_base_patch16_224", 86_567_656),
])
def test_softmax_parameter_counts_equal_timm(name, count):
    with torch.device("meta"):  # counting only: no memory, no init time
        model = vitmix.create_model(name, mixer="softmax")
    assert sum(p.numel() for p in model.parameters()) == count


def test_small_image_models_are_registered_in_timm_after_import():
    for name in ("vit_nano_patch4_32", "vit_tiny_patch4_32", "vit_small_patch4_32"):
        assert timm.is_model(name)
    model = timm.create_model("vit_nano_patch4_32", num_classes=7)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


@pytest.mark.parametrize("mixer", vitmix.list_mixers())
def test_every_mixer_builds_a_small_vit_with_non_square_input(mixer):
    model = vitmix.create_model("vit_nano_patch4_32", mixer=mixer, img_size=(32, 48), depth=2, in_chans=1)
    out = model(torch.randn(2, 1, 32, 48))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_mixer_options_reach_every_block():
    model = vitmix.create_model("deit_tiny_patch16_224", mixer="softmax", mixer_options={"fused": False}, depth=2)
    assert all(block.attn.fused is False for block in model.blocks)


def test_bad_model_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="Did you mean: vit_nano_patch4_32"):
        vitmix.create_model("vit_nano_patch4_23")
    with pytest.raises(ValueError, match="not divisible by its patch size"):
        vitmix.create_model("vit_nano_patch4_32", img_size=30)
    with pytest.raises(ValueError, match="unknown mixer"):
        vitmix.create_model("vit_nano_patch4_32", mixer="nope")
    with pytest.raises(ValueError, match="no option"):
        vitmix.create_model("deit_tiny_patch16_224", mixer="softmax", mixer_options={"fusd": True})


def test_depth_aware_mixers_get_their_block_index_in_stock_timm_models():
    model = vitmix.create_model("vit_nano_patch4_32", mixer="fibottention", depth=3)
    assert [block.attn.layer_idx for block in model.blocks] == [0, 1, 2]
