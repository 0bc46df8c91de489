"""Fibottention ViTs registered in timm."""
import pytest
import timm
import torch

import vitmix
from vitmix.mixers.fibottention import FibottentionAttention
from vitmix.ops.fibonacci import fibonacci_offsets

NAMES = ["vit_tiny_patch16_224_fibottention", "vit_small_patch16_224_fibottention",
         "vit_base_patch16_224_fibottention", "vit_nano_patch4_32_fibottention", "vit_tiny_patch4_32_fibottention"]


def test_models_are_registered_in_timm_and_listed():
    for name in NAMES:
        assert timm.is_model(name) and vitmix.models.is_vitmix_model(name)
        assert name in vitmix.list_models("fibottention")


@pytest.mark.parametrize("name, heads, dim", [("vit_tiny_patch16_224_fibottention", 3, 192),
                                              ("vit_small_patch16_224_fibottention", 6, 384),
                                              ("vit_base_patch16_224_fibottention", 12, 768)])
def test_imagenet_models_use_cls_pooling_and_per_layer_shuffles(name, heads, dim):
    model = timm.create_model(name, depth=2)  # two blocks are enough to check the wiring cheaply
    assert model.global_pool == "token" and model.num_prefix_tokens == 1 and model.embed_dim == dim
    attns = [b.attn for b in model.blocks]
    assert all(isinstance(a, FibottentionAttention) and a.num_heads == heads for a in attns)
    assert [a.layer_idx for a in attns] == [0, 1]
    assert attns[1].head_offsets(196) == fibonacci_offsets(196, heads, layer=1)


def test_nano_trains_end_to_end_and_matches_masked_mode():
    torch.manual_seed(0)
    model = vitmix.create_model("vit_nano_patch4_32_fibottention", depth=3)
    ref = vitmix.create_model("vit_nano_patch4_32_fibottention", depth=3, mixer_options={"mode": "masked"})
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 10)
    torch.testing.assert_close(out, ref(x), rtol=1e-4, atol=1e-5)  # float32 through 3 blocks
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_mixer_options_and_other_resolutions():
    model = vitmix.create_model("vit_tiny_patch16_224_fibottention", img_size=112, depth=1,
                                mixer_options={"mode": "official", "w_min": 3, "shuffle": "official"})
    attn = model.blocks[0].attn
    assert attn.mode == "official" and attn.w_min == 3 and attn.shuffle == "official"
    assert model(torch.randn(1, 3, 112, 112)).shape == (1, 1000)  # 49 patches + CLS
    small = timm.create_model("vit_tiny_patch4_32_fibottention", depth=1, img_size=48)
    assert small(torch.randn(1, 3, 48, 48)).shape == (1, 10)  # 144 patches


def test_other_mixers_and_attn_layer_are_rejected():
    with pytest.raises(ValueError, match="always uses the 'fibottention' mixer"):
        vitmix.create_model("vit_nano_patch4_32_fibottention", mixer="softmax")
    assert vitmix.create_model("vit_nano_patch4_32_fibottention", mixer="fibottention", depth=1) is not None
    with pytest.raises(ValueError, match="no option 'mod'"):
        vitmix.create_model("vit_nano_patch4_32_fibottention", mixer_options={"mod": "masked"})
