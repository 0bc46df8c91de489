"""Dense features of every registered classifier: ``forward_intermediates``, ``feature_info`` and
``features_only=True``, at non-square sizes (in the manner of timm's own
``test_model_forward_intermediates`` / ``test_model_forward_features``).

Each model is built shallow (one block per pyramid stage, 3 blocks for the isotropic models) at a
small non-square size, so the whole file runs in seconds; widths, strides and heads stay as
registered, which is what the shapes depend on.
"""
import pathlib
import re

import pytest
import timm
import torch
from torch import nn

import vitmix
from vitmix.mixers import TokenMixer
from vitmix.models import is_vitmix_model, model_task
from vitmix.models.sequence import is_sequence_model
from vitmix.models.timesformer import is_video_model



# tiny shapes: a second intra-op thread made this file ~10x slower on a busy 2-core machine
pytestmark = pytest.mark.usefixtures("one_thread")


# Video models (timesformer_*) are left out: they take clips (B, C, T, H, W), so image-size feature maps
# do not apply to them; tests/models/test_timesformer.py checks their token outputs. Sequence models (seq_*)
# take ids (B, N) and have no feature maps (tests/models/test_sequence.py).
MODELS = sorted(m for m in timm.list_models() if is_vitmix_model(m) and model_task(m) == "classification"
                and not is_video_model(m) and not is_sequence_model(m))


def _family(name: str) -> str:
    return timm.models.model_entrypoint(name).__module__.rsplit(".", 1)[-1]


def _shallow_args(name: str) -> dict:
    """Shallow, small, non-square build arguments: pyramid grids of 16×24 ... 2×3 (every landmark
    stride 8/4/2/1 divides them), isotropic grids of 2×3 patches, or 6×8 for Fibottention (whose
    head i needs a Wythoff offset ≈ 2.6·i < N: 12 heads need N > 30)."""
    if _family(name) == "pyramid":
        return dict(depths=(1, 1, 1, 1), img_size=(64, 96))
    patch = int(re.search(r"patch(\d+)", name).group(1)) if "patch" in name else 16
    rows, cols = (6, 8) if _family(name) == "fibottention" else (2, 3)
    return dict(depth=3, img_size=(rows * patch, cols * patch))


def _build(name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)  # same weights for the full model and its features_only twin
    return timm.create_model(name, **_shallow_args(name), **kwargs).eval()


def _images(model_or_args, batch: int = 2) -> torch.Tensor:
    h, w = model_or_args["img_size"]
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(1))


def _expected_hw(hw, reduction: int):
    """Map size at ``reduction``: patch stems divide exactly; each stride-2 conv (padding 1) of the
    pyramids rounds up, which composes to a ceiling division."""
    return tuple(-(-s // reduction) for s in hw)


@pytest.mark.parametrize("name", MODELS)
def test_forward_intermediates_shapes_and_final_features(name):
    model, args = _build(name), _shallow_args(name)
    x = _images(args)
    info = model.feature_info
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        features = model.forward_features(x)
        last = model.forward_intermediates(x, indices=[len(info) - 1], norm=True, intermediates_only=True)[0]
    assert len(maps) == len(info) == (4 if _family(name) == "pyramid" else 3)
    for fmap, entry in zip(maps, info):
        assert fmap.shape == (2, entry["num_chs"], *_expected_hw(args["img_size"], entry["reduction"])), entry
    # the pass that collects the maps is the ordinary forward: the final features are bit-identical
    assert torch.equal(final, features)
    # the last map with norm=True is forward_features' grid, laid out as a map
    grid = features[:, getattr(model, "num_prefix_tokens", 0):]
    assert torch.equal(last, grid.reshape(2, *last.shape[2:], -1).permute(0, 3, 1, 2))


@pytest.mark.parametrize("name", MODELS)
def test_features_only_matches_forward_intermediates(name):
    full, args = _build(name), _shallow_args(name)
    last = len(full.feature_info) - 1
    feats = _build(name, features_only=True, out_indices=(0, last))
    x = _images(args, batch=1)
    with torch.no_grad():
        maps = feats(x)
        ref = full.forward_intermediates(x, indices=[0, last], intermediates_only=True)
    assert feats.feature_info.channels() == [full.feature_info[i]["num_chs"] for i in (0, last)]
    assert feats.feature_info.reduction() == [full.feature_info[i]["reduction"] for i in (0, last)]
    assert [m.shape[1] for m in maps] == feats.feature_info.channels()
    for fmap, reduction in zip(maps, feats.feature_info.reduction()):
        assert fmap.shape[2:] == _expected_hw(args["img_size"], reduction)
    # pruning the blocks after the last requested one changes nothing before it
    for got, want in zip(maps, ref):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["soft_tiny", "weightformer_nano_patch4_32"])
def test_other_input_sizes_and_channels_last(name):
    """Pyramids and WeightFormer take any size (here not their build size); NHWC is NCHW permuted."""
    model = _build(name)
    x = torch.randn(1, 3, 40, 56, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        nchw = model.forward_intermediates(x, intermediates_only=True)
        nhwc = model.forward_intermediates(x, output_fmt="NHWC", intermediates_only=True)
    for a, b, entry in zip(nchw, nhwc, model.feature_info):
        assert a.shape[2:] == _expected_hw((40, 56), entry["reduction"])
        assert torch.equal(a, b.permute(0, 3, 1, 2))


def test_stop_early_gives_the_same_maps():
    model = _build("weightformer_nano_patch4_32")
    x = _images(_shallow_args("weightformer_nano_patch4_32"))
    with torch.no_grad():
        early = model.forward_intermediates(x, indices=[0, 1], stop_early=True, intermediates_only=True)
        full = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    assert all(torch.equal(a, b) for a, b in zip(early, full))


def test_weightformer_rejects_unknown_output_format():
    model = _build("weightformer_nano_patch4_32")
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(torch.zeros(1, 3, 8, 12), output_fmt="NCL")


# ---------------------------------------------------------------------------------------------
# isotropic ViTs with a spatial mixer: the mixers must see the real (non-square) grid
# ---------------------------------------------------------------------------------------------
def _mixer_grids(model: nn.Module):
    return {(m.hw, m.num_prefix_tokens) for m in model.modules() if isinstance(m, TokenMixer)}


@pytest.mark.parametrize("name, img_size, grid", [
    ("vit_nano_patch4_32", (32, 48), (8, 12)),      # 96 + CLS = 97 tokens: a square reading is 16 + 9×9
    ("deit_tiny_patch16_224", (64, 96), (4, 6)),    # timm's own ViT: 24 + CLS = 25 tokens = 5×5 read as square
])
def test_features_only_vit_with_spatial_mixer_sees_the_non_square_grid(name, img_size, grid):
    """``vitmix.create_model(..., features_only=True)`` gives the mixers the real grid (the wrapper
    hides ``patch_embed``), so the maps equal the full model's."""
    kwargs = dict(mixer="laplacian", img_size=img_size, depth=2)
    torch.manual_seed(0)
    feats = vitmix.create_model(name, features_only=True, out_indices=(1,), **kwargs).eval()
    torch.manual_seed(0)
    full = vitmix.create_model(name, **kwargs).eval()
    assert _mixer_grids(feats) == _mixer_grids(full) == {(grid, 1)}
    x = torch.randn(2, 3, *img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(feats(x)[0], full.forward_intermediates(x, indices=[1], intermediates_only=True)[0])


def test_dynamic_img_size_vit_sets_the_grid_per_call():
    """A dynamic-size ViT at its build size must equal the fixed-size one (same weights, no position
    embedding resampling); other sizes set the grid of that call."""
    kwargs = dict(mixer="laplacian", img_size=(40, 24), depth=2)
    torch.manual_seed(0)
    fixed = vitmix.create_model("vit_nano_patch4_32", **kwargs).eval()
    torch.manual_seed(0)
    dynamic = vitmix.create_model("vit_nano_patch4_32", dynamic_img_size=True, **kwargs).eval()
    x = torch.randn(2, 3, 40, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(dynamic(x), fixed(x))
        maps = dynamic.forward_intermediates(torch.zeros(1, 3, 24, 56), intermediates_only=True)
    assert _mixer_grids(dynamic) == {((6, 14), 1)}
    assert [m.shape for m in maps] == [(1, 128, 6, 14)] * 2


# ---------------------------------------------------------------------------------------------
# docs/dense-features.md: the FPN + linear-head segmentation example runs as written and learns
# ---------------------------------------------------------------------------------------------
DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "dense-features.md"


def test_the_segmentation_example_trains_end_to_end():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    namespace = {}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    losses, accuracy = namespace["losses"], namespace["foreground_accuracy"]
    # seen: 1.56 -> 0.04 and 0.92 on the held-out set (0.94 with WeightFormer or a ViT); predicting
    # background everywhere scores 0 on foreground pixels, a random classifier ~1/3. Another CPU rounds the
    # float32 training differently, which moves the outcome like another seed would (a few points), far
    # from either bound: a 25x loss drop against 5x, 0.92 against 0.8.
    assert losses[-1] < 0.2 * losses[0]
    assert accuracy > 0.8
