"""Official presets and checkpoints of the models, and the input sizes the official SOFT code accepts.

Checkpoints: state dicts are laid out with the official key names and shapes (written here from the
official module structure of fudan-zvg/SOFT and LeapLabTHU/WeightFormer), saved to a file and loaded
through timm's pretrained path, ``timm.create_model(name, pretrained=True,
pretrained_cfg_overlay=dict(file=path))``, which calls the model's ``checkpoint_filter_fn``.
"""
import pytest
import timm
import torch
from safetensors.torch import save_file

import vitmix
from vitmix.mixers.soft import SoftAttention
from vitmix.models.pyramid import resize_pos_embed, stage_grid
from vitmix.models.weightformer import DynamicLinear


def _create(name, seed=0, **kwargs):
    torch.manual_seed(seed)
    return timm.create_model(name, **kwargs).eval()


def _load(name, path, **kwargs):
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kwargs).eval()


# ---------------------------------------------------------------------------------------------
# presets through the models
# ---------------------------------------------------------------------------------------------
def test_pyramid_preset_kwarg_equals_mixer_options_and_differs_from_default():
    x = torch.randn(1, 3, 72, 72)
    official = _create("soft_tiny", preset="official")
    via_options = vitmix.create_model("soft_tiny", mixer_options={"preset": "official"})
    via_options.load_state_dict(official.state_dict())
    kernel = [b.attn for s in official.stages[:3] for b in s.blocks]
    assert all(type(a) is SoftAttention and a.preset == "official" and a.landmark_hw is None for a in kernel)
    assert [a.landmark_stride for a in kernel] == [8, 4, 4, 2, 2, 2]        # per-stage defaults kept
    with torch.no_grad():
        y = official(x)
        torch.testing.assert_close(via_options.eval()(x), y, rtol=0, atol=0)
        default = _create("soft_tiny")
        default.load_state_dict(official.state_dict())
        # 72²: stage-1 grid 18×18, stride 8 → the official conv floors to 16×16, vitmix pools 18 → 16
        assert (default(x) - y).abs().max() > 1e-4
    per_stage = timm.create_model("soft_norm_tiny", preset="official", mixer_options=[{"num_landmarks": 4}, {}, {}, {}])
    first, second = per_stage.stages[0].blocks[0].attn, per_stage.stages[1].blocks[0].attn
    assert first.landmark_hw == (2, 2) and first.preset == second.preset == "official"
    assert second.inverse == "newton_legacy" and second.newton_eps == 0.0 and second.landmark_hw is None
    with pytest.raises(ValueError, match="mixer 'laplacian' has no presets"):
        timm.create_model("laplacianformer_tiny", preset="official")


def test_weightformer_preset_sets_the_official_odd_grid_pooling():
    official = _create("weightformer_nano_patch4_32", preset="official")
    explicit = _create("weightformer_nano_patch4_32", odd_pool="floor")
    default = _create("weightformer_nano_patch4_32")
    assert {m.odd_pool for m in official.modules() if isinstance(m, DynamicLinear)} == {"floor"}
    assert {m.odd_pool for m in default.modules() if isinstance(m, DynamicLinear)} == {"ceil"}
    overridden = _create("weightformer_nano_patch4_32", preset="official", odd_pool="ceil")
    assert overridden.blocks[1].mlp.fc1.odd_pool == "ceil"                  # an explicit option wins
    for model in (official, explicit, default):
        with torch.no_grad():  # ΔW is ~1e-6 of W0 at init: scale the predictors so pooling shows
            for m in model.modules():
                if isinstance(m, DynamicLinear):
                    m.expand_in.mul_(300.0)
                    m.expand_out.mul_(300.0)
    odd, even = torch.randn(2, 3, 28, 28), torch.randn(2, 3, 32, 32)     # 7×7 and 8×8 token grids
    with torch.no_grad():
        torch.testing.assert_close(official(odd), explicit(odd), rtol=0, atol=0)
        assert (official(odd) - default(odd)).abs().max() > 1e-5
        torch.testing.assert_close(official(even), default(even), rtol=1e-6, atol=1e-6)   # same math, even grid
    with pytest.raises(ValueError, match="unknown preset 'oficial'.*Did you mean: official"):
        timm.create_model("weightformer_nano_patch4_32", preset="oficial")


def test_fibottention_model_preset_reaches_every_layer():
    official = _create("vit_nano_patch4_32_fibottention", preset="official")
    via_options = _create("vit_nano_patch4_32_fibottention", mixer_options={"preset": "official"})
    layers = [b.attn for b in official.blocks]
    assert all(a.mode == "official" and a.shuffle == "official" and not a.shuffle_per_layer for a in layers)
    assert [a.layer_idx for a in layers] == list(range(len(layers)))
    assert all(a.head_offsets(64) == layers[0].head_offsets(64) for a in layers)     # layer 0's order everywhere
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(via_options(x), official(x), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# official SOFT / SOFT-Norm checkpoints
# ---------------------------------------------------------------------------------------------
# a sample of fudan-zvg/SOFT's soft_tiny state dict: names and shapes of its modules
OFFICIAL_SOFT_TINY = {
    "patch_embed1.proj.0.weight": (32, 3, 3, 3), "patch_embed1.proj.4.running_var": (32,),
    "patch_embed1.proj.6.weight": (64, 32, 3, 3), "patch_embed2.proj.0.weight": (128, 64, 3, 3),
    "patch_embed4.proj.1.num_batches_tracked": (),
    "pos_embed1": (1, 3136, 64), "pos_embed2": (1, 784, 128), "pos_embed3": (1, 196, 320), "pos_embed4": (1, 50, 512),
    "block1.0.att.mha.W_q.weight": (64, 64), "block1.0.att.mha.W_v.bias": (64,),
    "block1.0.att.mha.attn.Qlandmark_op.weight": (32, 32, 8, 8), "block1.0.att.mha.attn.Qnorm_act.0.weight": (32,),
    "block1.0.att.mha.attn.conv.weight": (2, 1, 9, 9), "block1.0.att.mha.ff.weight": (64, 64),
    "block1.0.att.norm1.weight": (64,), "block1.0.att.ff1.weight": (256, 64), "block1.0.att.ff2.bias": (64,),
    "block1.0.att.norm2.bias": (64,), "block2.1.att.mha.attn.conv.weight": (4, 1, 5, 5),
    "block3.2.att.mha.attn.Qlandmark_op.weight": (32, 32, 2, 2), "block3.2.att.mha.attn.conv.weight": (10, 1, 3, 3),
    "block4.1.norm1.weight": (512,), "block4.1.attn.q.weight": (512, 512), "block4.1.attn.kv.weight": (1024, 512),
    "block4.1.attn.kv.bias": (1024,), "block4.1.attn.proj.weight": (512, 512), "block4.1.mlp.fc1.weight": (2048, 512),
    "cls_token": (1, 1, 512), "norm.weight": (512,), "head.weight": (1000, 512),
}


def official_soft_state_dict(model):
    """``model``'s weights under the official SOFT names (the inverse of the documented mapping)."""
    out = {}
    for key, val in model.state_dict().items():
        if not key.startswith("stages."):
            out[key] = val
            continue
        _, i, kind, *rest = key.split(".", 3)
        n = int(i) + 1
        if kind in ("patch_embed", "pos_embed"):
            out[".".join([f"{kind}{n}", *rest])] = val
            continue
        rest = rest[0]
        j, rest = rest.split(".", 1)
        if n == 4 and rest.startswith("attn.qkv."):
            c = val.shape[0] // 3
            out[f"block4.{j}.attn.q.{rest[9:]}"], out[f"block4.{j}.attn.kv.{rest[9:]}"] = val[:c], val[c:]
        elif n == 4:
            out[f"block4.{j}.{rest}"] = val
        else:
            for ours, theirs in (("attn.W_", "att.mha.W_"), ("attn.ff.", "att.mha.ff."), ("attn.", "att.mha.attn."),
                                 ("mlp.fc1.", "att.ff1."), ("mlp.fc2.", "att.ff2."), ("norm", "att.norm")):
                if rest.startswith(ours):
                    rest = theirs + rest[len(ours):]
                    break
            out[f"block{n}.{j}.{rest}"] = val
    return out


def test_official_soft_tiny_layout_is_the_official_one():
    official = official_soft_state_dict(_create("soft_tiny"))
    assert {k: tuple(official[k].shape) for k in OFFICIAL_SOFT_TINY} == OFFICIAL_SOFT_TINY
    assert not any(k.startswith("stages.") or ".attn.qkv." in k for k in official)
    blocks = {k.split(".att.")[0] for k in official if ".att." in k}
    assert blocks == {"block1.0", "block2.0", "block2.1", "block3.0", "block3.1", "block3.2"}


@pytest.mark.parametrize("name, preset", [("soft_tiny", None), ("soft_norm_tiny", "official")])
@pytest.mark.filterwarnings("ignore:.*an official fudan-zvg/SOFT checkpoint")
def test_official_soft_checkpoint_loads_through_timm(tmp_path, name, preset):
    # two blocks in stage 2 (block index mapping), one elsewhere: the official layout at a third of the size
    kwargs = dict(depths=(1, 2, 1, 1)) if preset is None else dict(depths=(1, 2, 1, 1), preset=preset)
    src = _create(name, seed=1, depths=(1, 2, 1, 1), preset="official")   # an official file computes so
    official = official_soft_state_dict(src)
    # the official training checkpoint: EMA weights (which the official evaluation loads) and raw ones
    raw = dict(official, **{"head.weight": official["head.weight"] + 1.0})   # shares the other tensors
    path = tmp_path / "soft.pth"
    torch.save({"epoch": 299, "state_dict": raw, "state_dict_ema": official}, path)
    loaded = _load(name, path, **kwargs)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), src(x))
    # a bare state dict with DDP prefixes, into a model built for 256² (positional embeddings resized)
    torch.save({f"module.{k}": v for k, v in official.items()}, path)
    big = _load(name, path, img_size=256, **kwargs)
    for i, (hw, prefix) in enumerate([((56, 56), 0), ((28, 28), 0), ((14, 14), 0), ((7, 7), 1)]):
        want = resize_pos_embed(src.stages[i].pos_embed, hw, stage_grid((256, 256), i), prefix)
        assert torch.equal(big.stages[i].pos_embed, want)
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        assert torch.equal(big(x), src(x))


def test_an_official_soft_checkpoint_without_a_preset_gets_the_official_one(tmp_path):
    """Regression: loaded with vitmix's default preset, an official checkpoint silently computed something
    else than the official model (the default landmarks changed)."""
    small = dict(depths=(1, 1, 1, 1))
    official = _create("soft_tiny", seed=2, preset="official", **small)
    path = tmp_path / "soft.pth"
    torch.save({"state_dict_ema": official_soft_state_dict(official)}, path)
    with pytest.warns(UserWarning, match=r"soft_tiny: an official fudan-zvg/SOFT checkpoint, so the soft mixers use "
                                         r"preset='official' .*pass preset='default' for vitmix's defaults") as seen:
        loaded = _load("soft_tiny", path, **small)
    assert len([w for w in seen if "fudan-zvg" in str(w.message)]) == 1
    kernel = [b.attn for s in loaded.stages[:3] for b in s.blocks]
    assert {a.preset for a in kernel} == {"official"}
    x = torch.randn(1, 3, 72, 72)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), official(x), rtol=0, atol=0)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")           # an asked-for preset is kept, without a word
            default = _load("soft_tiny", path, preset="default", **small)
            options = _load("soft_tiny", path, mixer_options={"preset": "default"}, **small)
        assert {b.attn.preset for s in default.stages[:3] for b in s.blocks} == {"default"}
        assert options.stages[0].blocks[0].attn.preset == "default"
        assert (default(x) - official(x)).abs().max() > 1e-4
        # a state dict already in vitmix's names is not an official file: built as asked
        torch.save(official.state_dict(), path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _load("soft_tiny", path, **small).stages[0].blocks[0].attn.preset == "default"


# ---------------------------------------------------------------------------------------------
# official WeightFormer checkpoints
# ---------------------------------------------------------------------------------------------
# LeapLabTHU/WeightFormer model/wfm.py, C = 192: static block 0, dynamic block 1
OFFICIAL_WF_TINY = {
    "patch_embed.proj.weight": (192, 3, 16, 16), "init_norm.weight": (192,),
    "blocks.0.dwc.weight": (192, 1, 3, 3), "blocks.0.dwc.bias": (192,), "blocks.0.norm2.weight": (192,),
    "blocks.0.linear1.weight": (768, 192), "blocks.0.linear2.weight": (192, 768),
    "blocks.1.norm1.weight": (192,), "blocks.1.dwc.w": (192, 1, 3, 3), "blocks.1.dwc.b": (192,),
    "blocks.1.dwc.wfm.0.weight": (192, 192, 1, 1), "blocks.1.dwc.wfm.0.bias": (192,),
    "blocks.1.dwc.wfm.2.weight": (192, 192, 1, 1), "blocks.1.linear1.w": (192, 768), "blocks.1.linear1.b": (768,),
    "blocks.1.linear1.w1": (48, 192), "blocks.1.linear1.w2": (192, 768), "blocks.1.linear1.wfm.weight": (240, 192),
    "blocks.1.linear1.wfm.bias": (240,), "blocks.1.linear2.bias": (192,), "norm.weight": (192,),
    "head.weight": (1000, 192),
}
_WF_NAMES = (  # vitmix suffix → official suffix; the raw parameters of the dynamic layers are w / b
    ("dwconv.predictor.", "dwc.wfm."), ("mlp.fc1.predictor.", "linear1.wfm."), ("mlp.fc1.expand_in", "linear1.w1"),
    ("mlp.fc1.expand_out", "linear1.w2"), ("mlp.fc2.", "linear2."),
)


def official_weightformer_state_dict(model):
    out = {}
    for key, val in model.state_dict().items():
        for ours, theirs in _WF_NAMES:
            key = key.replace(ours, theirs)
        if key.startswith("blocks."):
            dynamic = model.blocks[int(key.split(".")[1])].dynamic
            for ours, static, dyn in (("dwconv.weight", "dwc.weight", "dwc.w"), ("dwconv.bias", "dwc.bias", "dwc.b"),
                                      ("mlp.fc1.weight", "linear1.weight", "linear1.w"),
                                      ("mlp.fc1.bias", "linear1.bias", "linear1.b")):
                key = key.replace(ours, dyn if dynamic else static)
        out[key] = val.contiguous().clone()
    return out


def test_official_weightformer_checkpoint_loads_through_timm(tmp_path):
    src = _create("weightformer_tiny", seed=2, depth=5)                     # dynamic blocks 1 and 4
    official = official_weightformer_state_dict(src)
    assert {k: tuple(official[k].shape) for k in OFFICIAL_WF_TINY} == OFFICIAL_WF_TINY
    assert "blocks.1.dwc.wfm.2.bias" not in official and "blocks.0.norm1.weight" not in official
    assert not any(part in k for k in official for part in ("dwconv", "mlp.", "expand_"))
    with torch.no_grad():
        for m in src.modules():  # visible dynamic weights, so the dynamic parameters must land right
            if isinstance(m, DynamicLinear):
                m.expand_in.mul_(300.0)
                m.expand_out.mul_(300.0)
    official = official_weightformer_state_dict(src)
    pth, hub = tmp_path / "wfm.pth", tmp_path / "model.safetensors"
    torch.save({"model": official, "epoch": 299, "max_accuracy": 76.3}, pth)   # official training checkpoint
    save_file(official, str(hub))                                           # Hugging Face hub file
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = src(x)
        for path in (pth, hub):
            assert torch.equal(_load("weightformer_tiny", path, depth=5)(x), want)


# ---------------------------------------------------------------------------------------------
# input sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["soft_tiny", "laplacianformer_tiny"])
def test_pyramids_take_sizes_that_are_not_multiples_of_32(name):
    """240² and a non-square size (each 3×3 stride-2 conv maps n to ⌈n/2⌉, as in the official code)."""
    model = _create(name, num_classes=5)
    for hw, grids in [((240, 240), [(60, 60), (30, 30), (15, 15), (8, 8)]),
                      ((200, 264), [(50, 66), (25, 33), (13, 17), (7, 9)])]:
        assert [stage_grid(hw, i) for i in range(4)] == grids
        with torch.no_grad():
            final, maps = model.forward_intermediates(torch.randn(1, 3, *hw))
            logits = model.forward_head(final)
        assert [tuple(m.shape[1:]) for m in maps] == [(c, *g) for c, g in zip((64, 128, 320, 512), grids)]
        assert final.shape == (1, 1 + grids[3][0] * grids[3][1], 512) and logits.shape == (1, 5)
        assert torch.isfinite(logits).all()
