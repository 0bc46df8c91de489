"""The nano dense backbones: registered, their parameter counts (docs/models.md) and map shapes at 128²/256²."""
import pytest
import timm
import torch

import vitmix


# laplacianformer_nano: 21 of its parameters are the learnt mean(V) weights (one per head and block)
@pytest.mark.parametrize("name, params", [("laplacianformer_nano", 607_791), ("soft_nano", 612_999),
                                          ("soft_norm_nano", 612_999), ("weightformer_nano", 160_402)])
def test_nano_models_are_registered_with_their_parameter_counts(name, params):
    model = timm.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.pretrained_cfg["input_size"] == (3, 128, 128) and model.num_classes == 10
    assert model(torch.randn(1, 3, 128, 128)).shape == (1, 10)


@pytest.mark.parametrize("size", [128, 256])
def test_nano_pyramid_maps_have_a_quarter_of_tinys_widths(size):
    features = vitmix.create_model("laplacianformer_nano", features_only=True)
    tiny = timm.create_model("laplacianformer_tiny", pretrained=False, features_only=True, num_classes=0)
    assert [4 * c for c in features.feature_info.channels()] == tiny.feature_info.channels()
    maps = features(torch.randn(1, 3, size, size))
    assert [tuple(m.shape[1:]) for m in maps] == [(16, size // 4, size // 4), (32, size // 8, size // 8),
                                                  (80, size // 16, size // 16), (128, size // 32, size // 32)]


def test_weightformer_nano_is_patch_8_at_a_quarter_of_tinys_width():
    features = vitmix.create_model("weightformer_nano", features_only=True)
    assert features.feature_info.channels() == [48, 48, 48] and features.feature_info.reduction() == [8, 8, 8]
    assert features(torch.randn(1, 3, 256, 256))[-1].shape == (1, 48, 32, 32)
