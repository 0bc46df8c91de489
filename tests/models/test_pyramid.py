"""Pyramid backbones: SOFT / SOFT-Norm / LaplacianFormer structure, sizes, timm API, features."""
import pytest
import timm
import torch
from torch import nn

import vitmix
from vitmix.mixers.laplacian import LaplacianAttention
from vitmix.mixers.soft import SoftAttention, SoftNormAttention
from vitmix.mixers.softmax import SoftmaxAttention
from vitmix.models.pyramid import (
    PostNormBlock, PreNormBlock, PyramidTransformer, checkpoint_filter_fn, resize_pos_embed,
)

SIZES = ("tiny", "small", "medium", "large", "huge")
# official registrations (fudan-zvg/SOFT); soft_small as registered (depths 1/3/20/4), not the README's 24M
OFFICIAL_PARAMS = {"tiny": 13.07e6, "small": 38.86e6, "medium": 45.8e6, "large": 64.7e6, "huge": 87.1e6}
LAPLACIAN_PARAMS = {"tiny": 13.33e6, "small": 40.86e6, "medium": 48.16e6, "large": 68.74e6, "huge": 81.17e6}


def _n_params(name, **kwargs):
    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("family", ["soft", "soft_norm"])
def test_soft_parameter_counts_match_official(family, size):
    assert _n_params(f"{family}_{size}") == pytest.approx(OFFICIAL_PARAMS[size], rel=0.01)


@pytest.mark.parametrize("size", SIZES)
def test_laplacianformer_parameter_counts(size):
    assert _n_params(f"laplacianformer_{size}") == pytest.approx(LAPLACIAN_PARAMS[size], rel=0.001)


def test_soft_small_readme_24m_matches_depths_1_3_7_4_not_the_registration():
    assert _n_params("soft_small", depths=(1, 3, 7, 4)) == pytest.approx(24.1e6, rel=0.01)


def test_official_structure():
    model = timm.create_model("soft_tiny", drop_path_rate=0.1)
    assert isinstance(model, PyramidTransformer)
    stem = model.stages[0].patch_embed.proj
    assert [m.stride for m in stem if isinstance(m, nn.Conv2d)] == [(2, 2), (1, 1), (2, 2)]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in stem) == 3
    expected = [(8, 9), (4, 5), (2, 3)]
    for i, (sr, k) in enumerate(expected):
        for blk in model.stages[i].blocks:
            assert isinstance(blk, PostNormBlock) and type(blk.attn) is SoftAttention
            assert blk.attn.landmark_stride == sr and blk.attn.conv_kernel == k and blk.attn.head_dim == 32
            assert blk.norm1.eps == 1e-5 and blk.mlp.fc1.out_features == 4 * blk.norm1.normalized_shape[0]
            assert blk.mlp.act.approximate == "tanh"
            assert blk.attn.W_q.bias is not None
    # the block's stochastic-depth rate is used as element-wise dropout (official)
    rates = [blk.drop1.p for s in model.stages[:3] for blk in s.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.1, 8)[:6].tolist())
    for blk in model.stages[3].blocks:
        assert isinstance(blk, PreNormBlock) and type(blk.attn) is SoftmaxAttention
        assert blk.norm1.eps == 1e-6 and blk.attn.qkv.bias is not None
    assert model.stages[3].pos_embed.shape == (1, 50, 512)       # 7x7 + CLS
    assert model.stages[0].pos_embed.shape == (1, 3136, 64)
    assert model.no_weight_decay() == {"cls_token"}
    assert type(timm.create_model("soft_norm_tiny").stages[2].blocks[0].attn) is SoftNormAttention


def test_laplacianformer_structure_and_rope_option():
    model = timm.create_model("laplacianformer_tiny", rope=True)
    ratios = [s.blocks[0].attn.landmark_stride for s in model.stages]
    assert ratios == [8, 4, 2, 1]
    assert all(isinstance(b, PreNormBlock) and isinstance(b.attn, LaplacianAttention) and b.attn.rope
               for s in model.stages for b in s.blocks)
    assert not timm.create_model("laplacianformer_tiny").stages[0].blocks[0].attn.rope


@pytest.mark.parametrize("name", ["soft_tiny", "soft_norm_tiny", "laplacianformer_tiny"])
def test_non_square_forward_backward_and_timm_api(name):
    model = timm.create_model(name, num_classes=7)
    x = torch.randn(2, 3, 64, 96)
    feats = model.forward_features(x)
    assert feats.shape == (2, 1 + 2 * 3, 512)
    logits = model.forward_head(feats)
    assert logits.shape == (2, 7)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 512)
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.reset_classifier(3, "avg")
    assert model(x).shape == (2, 3) and model.global_pool == "avg"
    model.reset_classifier(0)
    assert model(x).shape == (2, 512)


def test_features_only_gives_four_stage_maps():
    model = timm.create_model("soft_tiny", features_only=True)
    assert model.feature_info.channels() == [64, 128, 320, 512]
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    outs = model(torch.randn(1, 3, 64, 128))
    assert [tuple(o.shape) for o in outs] == [(1, 64, 16, 32), (1, 128, 8, 16), (1, 320, 4, 8), (1, 512, 2, 4)]
    some = timm.create_model("laplacianformer_tiny", features_only=True, out_indices=(1, 2))
    assert [o.shape[1] for o in some(torch.randn(1, 3, 64, 64))] == [128, 320]
    assert len(some.model.stages) == 3  # pruned after the last requested stage


def test_forward_intermediates_match_forward_features():
    model = timm.create_model("soft_tiny").eval()
    x = torch.randn(1, 3, 64, 64)
    final, inter = model.forward_intermediates(x)
    torch.testing.assert_close(final, model.forward_features(x))
    assert len(inter) == 4 and inter[3].shape == (1, 512, 2, 2)
    normed = model.forward_intermediates(x, indices=[3], norm=True, intermediates_only=True)[0]
    torch.testing.assert_close(normed.flatten(2).transpose(1, 2), final[:, 1:])


def test_positional_embeddings_resize_bilinearly_and_keep_cls():
    pos = torch.randn(1, 1 + 4 * 6, 8)
    out = resize_pos_embed(pos, (4, 6), (8, 12), prefix=1)
    assert out.shape == (1, 1 + 96, 8) and torch.equal(out[:, 0], pos[:, 0])
    grid = pos[:, 1:].reshape(1, 4, 6, 8).permute(0, 3, 1, 2)
    ref = torch.nn.functional.interpolate(grid, size=(8, 12), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out[:, 1:], ref.permute(0, 2, 3, 1).reshape(1, 96, 8))
    assert resize_pos_embed(pos, (4, 6), (4, 6), prefix=1) is pos


def test_mixer_and_mixer_options_pass_through():
    model = vitmix.create_model("soft_tiny", mixer_options={"landmarks": "avgpool", "conv_kernel": 3})
    attn = model.stages[0].blocks[0].attn
    assert attn.landmarks == "avgpool" and attn.conv_kernel == 3 and attn.landmark_stride == 8
    per_stage = [{"num_landmarks": 4}, {}, {}, {"lam": 2.0}]
    lap = vitmix.create_model("laplacianformer_tiny", mixer_options=per_stage)
    assert lap.stages[0].blocks[0].attn.landmark_hw == (2, 2) and lap.stages[3].blocks[0].attn.lam == 2.0
    assert lap.stages[1].blocks[0].attn.landmark_hw == "auto"
    swapped = vitmix.create_model("soft_tiny", mixer="softmax")
    assert all(type(b.attn) is SoftmaxAttention for s in swapped.stages for b in s.blocks)
    assert swapped(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    with pytest.raises(ValueError, match="no option 'landmark'"):
        vitmix.create_model("soft_tiny", mixer_options={"landmark": "avgpool"})


def test_bad_input_sizes():
    # any size the official code takes is accepted (tests/models/test_official.py); these are not
    model = timm.create_model("soft_tiny")
    with pytest.raises(ValueError, match="expects images"):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match="smaller than landmark_stride=8"):
        model(torch.randn(1, 3, 16, 16))            # stage-1 grid 4×4: no 8×8 landmark block
    with pytest.raises(ValueError, match="img_size"):
        timm.create_model("soft_tiny", img_size=0)


def test_official_checkpoint_keys_convert():
    model = timm.create_model("soft_tiny")
    sd = model.state_dict()
    official = {}
    for key, val in sd.items():  # rename to fudan-zvg/SOFT's layout
        parts = key.split(".")
        if key == "cls_token" or key.startswith(("norm.", "head.")):
            official[key] = val
            continue
        i = int(parts[1]) + 1
        if parts[2] == "patch_embed":
            official[f"patch_embed{i}." + ".".join(parts[3:])] = val
        elif parts[2] == "pos_embed":
            official[f"pos_embed{i}"] = val
        else:
            j, rest = parts[3], ".".join(parts[4:])
            if i < 4:
                rest = (rest.replace("attn.W_", "att.mha.W_").replace("attn.ff", "att.mha.ff")
                        .replace("attn.", "att.mha.attn.").replace("mlp.fc1", "att.ff1")
                        .replace("mlp.fc2", "att.ff2").replace("norm", "att.norm"))
                official[f"block{i}.{j}.{rest}"] = val
            elif rest.startswith("attn.qkv."):
                c = val.shape[0] // 3
                official[f"block4.{j}.attn.q.{parts[-1]}"] = val[:c]
                official[f"block4.{j}.attn.kv.{parts[-1]}"] = val[c:]
            else:
                official[f"block{i}.{j}.{rest}"] = val
    assert "block1.0.att.mha.attn.Qlandmark_op.weight" in official and "block1.0.att.ff1.weight" in official
    converted = checkpoint_filter_fn(official, model)
    assert converted.keys() == sd.keys()
    assert all(torch.equal(converted[k], sd[k]) for k in sd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pos_embed_resize_is_bilinear_keeps_prefix_and_dtype(dtype):
    import torch.nn.functional as F

    from vitmix.models.pyramid import resize_pos_embed

    pos = torch.randn(1, 1 + 7 * 7, 16).to(dtype)
    out = resize_pos_embed(pos, (7, 7), (5, 9), prefix=1)
    grid = F.interpolate(pos[:, 1:].reshape(1, 7, 7, 16).permute(0, 3, 1, 2).float(), size=(5, 9),
                         mode="bilinear", align_corners=False)
    assert out.dtype == dtype and out.shape == (1, 1 + 45, 16)
    torch.testing.assert_close(out[:, 0], pos[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 1:].float(), grid.permute(0, 2, 3, 1).reshape(1, 45, 16).to(dtype).float())
