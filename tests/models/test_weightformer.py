"""WeightFormer models and layers: structure, resolution freedom, globality, numerics, timm API."""
from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

import vitmix
from vitmix.models.weightformer import (
    DynamicDepthwiseConv,
    DynamicLinear,
    WeightFormer,
    WeightFormerBlock,
    checkpoint_filter_fn,
    is_dynamic_block,
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def nano():
    torch.manual_seed(0)
    return vitmix.create_model("weightformer_nano_patch4_32").eval()


def _boost(module, factor=30.0):
    """Scale the ΔW predictors up, as training does: at the official init ΔW is ~1e-6 of W0."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, DynamicLinear):
                m.expand_in.mul_(factor)
                m.expand_out.mul_(factor)
                m.predictor.weight.mul_(factor)
    return module


def _small(**kw):
    """A 5-block, C=32 WeightFormer (blocks 1 and 4 dynamic) for quick float64 checks."""
    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=4, embed_dim=32, depth=5, num_classes=7)
    return WeightFormer(**dict(args, **kw)).double().eval()


# ----------------------------------------------------------------------------------------------
# structure
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,count", [("weightformer_tiny", 7_074_184), ("weightformer_small", 27_492_136),
                                        ("weightformer_base", 27_492_136)])
def test_parameter_counts(name, count):
    with torch.device("meta"):
        model = timm.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == count
    assert [i for i, b in enumerate(model.blocks) if b.dynamic] == [1, 4, 7, 10, 13, 16]
    assert len(model.blocks) == 17


def test_variants_and_registration():
    with torch.device("meta"):
        t, s, b = (timm.create_model(n) for n in ("weightformer_tiny", "weightformer_small", "weightformer_base"))
    assert (t.embed_dim, s.embed_dim, b.embed_dim) == (192, 384, 384)
    assert b.pretrained_cfg["input_size"] == (3, 448, 448) and t.pretrained_cfg["input_size"] == (3, 224, 224)
    assert all(vitmix.models.is_vitmix_model(n) for n in ("weightformer_tiny", "weightformer_nano_patch4_32"))
    assert "weightformer_tiny" in vitmix.list_models("weightformer")
    assert [i for i in range(17) if is_dynamic_block(i)] == [1, 4, 7, 10, 13, 16]


def test_dynamic_and_static_block_structure():
    with torch.device("meta"):
        model = timm.create_model("weightformer_tiny")
    static, dynamic = model.blocks[0], model.blocks[1]
    assert isinstance(static.norm1, nn.Identity) and isinstance(static.dwconv, nn.Conv2d)
    assert static.dwconv.groups == 192 and static.dwconv.bias is not None
    assert isinstance(static.mlp.fc1, nn.Linear) and static.mlp.fc1.out_features == 768
    assert isinstance(dynamic.dwconv, DynamicDepthwiseConv) and isinstance(dynamic.mlp.fc1, DynamicLinear)
    fc1 = dynamic.mlp.fc1
    assert fc1.weight.shape == (192, 768) and fc1.predictor.out_features == 48 + 192
    assert fc1.expand_in.shape == (48, 192) and fc1.expand_out.shape == (192, 768)
    assert dynamic.dwconv.predictor[2].bias is None and dynamic.dwconv.predictor[0].bias is not None


def test_official_init():
    torch.manual_seed(0)
    model = timm.create_model("weightformer_tiny", num_classes=1000)
    head = model.head
    assert 0.015 < head.weight.std().item() < 0.025 and head.bias.abs().max() == 0  # trunc normal, not zero
    fc1 = model.blocks[1].mlp.fc1
    assert fc1.bias.abs().max() > 0 and 0.015 < fc1.bias.std().item() < 0.025  # random bias (official)
    assert fc1.predictor.bias.abs().max() == 0
    assert model.blocks[1].dwconv.weight.std().item() < 0.025  # tiny static kernel of the dynamic DW conv
    assert model.blocks[0].dwconv.weight.std().item() > 0.1  # PyTorch default init for static DW convs
    assert model.norm.weight.eq(1).all() and model.init_norm.bias.eq(0).all()


# ----------------------------------------------------------------------------------------------
# any resolution, any grid
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(32, 32), (20, 28), (12, 44), (4, 4), (4, 12), (36, 8)])
def test_nano_any_grid(nano, size):
    with torch.no_grad():
        x = torch.randn(2, 3, *size)
        feats = nano.forward_features(x)
        out = nano.forward_head(feats)
    assert feats.shape == (2, (size[0] // 4) * (size[1] // 4), 128)
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_same_weights_at_224_and_1248():
    torch.manual_seed(0)
    model = timm.create_model("weightformer_tiny").eval()
    with torch.no_grad():
        small = model(torch.randn(1, 3, 224, 224))
        big = model(torch.randn(1, 3, 1248, 1248))
        wide = model(torch.randn(1, 3, 48, 208))  # 3×13 grid: odd, non-square
    for y in (small, big, wide):
        assert y.shape == (1, 1000) and torch.isfinite(y).all()


def test_odd_pool_modes():
    x = torch.randn(2, 3, 20, 28, dtype=torch.float64)  # 5×7 grid
    ceil, floor = _boost(_small()), _small(odd_pool="floor")
    floor.load_state_dict(ceil.state_dict())
    with torch.no_grad():
        assert not torch.allclose(ceil(x), floor(x))
        x_even = torch.randn(2, 3, 24, 32, dtype=torch.float64)
        torch.testing.assert_close(ceil(x_even), floor(x_even), rtol=0, atol=0)
    # with "ceil" every token reaches ΔW; "floor" (official) ignores the last odd row/column
    lin = _boost(DynamicLinear(8, 16).double())
    tokens = torch.randn(1, 35, 8, dtype=torch.float64)
    other = tokens.clone()
    other[0, -1] += torch.randn(8, dtype=torch.float64)  # bottom-right token of the 5×7 grid
    with torch.no_grad():
        assert not torch.allclose(lin(tokens, (5, 7))[0, 0], lin(other, (5, 7))[0, 0])
        lin.odd_pool = "floor"
        assert torch.equal(lin(tokens, (5, 7))[0, 0], lin(other, (5, 7))[0, 0])


@pytest.mark.parametrize("path", ["dense", "core", "lowrank"])
@pytest.mark.parametrize("hw", [(4, 4), (5, 7), (1, 3)])
def test_dynamic_linear_module_paths_equal(path, hw):
    torch.manual_seed(0)
    ref = DynamicLinear(12, 20, path="dense").double()
    with torch.no_grad():  # larger predictor so the column normalisation is active
        ref.expand_in.mul_(50)
        ref.expand_out.mul_(50)
    mod = DynamicLinear(12, 20, path=path).double()
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(3, hw[0] * hw[1], 12, dtype=torch.float64, requires_grad=True)
    cot = torch.randn(3, hw[0] * hw[1], 20, dtype=torch.float64)
    out_ref, out = ref(x, hw), mod(x, hw)
    # float64, re-associated sums of ≤ 20 terms
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    g_ref = torch.autograd.grad(out_ref, [x, *ref.parameters()], cot)
    g = torch.autograd.grad(out, [x, *mod.parameters()], cot)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_dynamic_linear_module_matches_spec():
    # the official formula written out on a 4×6 grid (even: no pooling choice involved)
    torch.manual_seed(0)
    lin = _boost(DynamicLinear(8, 32).double())
    x = torch.randn(2, 24, 8, dtype=torch.float64)
    pooled = nn.functional.avg_pool2d(x.transpose(1, 2).reshape(2, 8, 4, 6), 2).flatten(2).transpose(1, 2)
    p, q = lin.predictor(pooled).split([2, 8], dim=-1)
    a, bm = nn.functional.silu(p) @ lin.expand_in, nn.functional.silu(q) @ lin.expand_out
    delta = a.transpose(1, 2) @ bm * 8 ** -0.5 / 24  # N = 24 tokens, not M = 6
    delta = delta / (delta.norm(dim=-2, keepdim=True) + 1)
    assert delta.abs().max() > 1e-3  # the update is active in this check
    torch.testing.assert_close(lin(x, (4, 6)), x @ (lin.weight + delta) + lin.bias, rtol=1e-12, atol=1e-13)


def test_dynamic_depthwise_conv_module_matches_spec():
    # pool to 3×3 → 1×1 conv → GELU → 1×1 conv (no bias) → K/(‖K‖_F+1) + W0 → per-sample DW conv
    torch.manual_seed(0)
    conv = DynamicDepthwiseConv(6).double()
    x = torch.randn(3, 6, 7, 5, dtype=torch.float64)
    kd = conv.predictor(nn.functional.adaptive_avg_pool2d(x, 3))
    kernels = kd / (kd.flatten(2).norm(dim=-1)[..., None, None] + 1) + conv.weight.view(1, 6, 3, 3)
    torch.testing.assert_close(conv.predict_kernels(x), kernels, rtol=1e-12, atol=1e-14)
    ref = torch.cat([nn.functional.conv2d(x[i:i + 1], kernels[i][:, None], conv.bias, padding=1, groups=6)
                     for i in range(3)])
    torch.testing.assert_close(conv(x), ref, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------------------------
# globality and batch independence
# ----------------------------------------------------------------------------------------------
def test_globality_dynamic_vs_static_block():
    torch.manual_seed(0)
    hw = (12, 12)
    x = torch.randn(2, 144, 32, dtype=torch.float64)
    far = x.clone()
    # random (not constant: LayerNorm would remove a constant shift) changes of one token
    far[:, -1] += torch.randn(2, 32, dtype=torch.float64)  # token (11, 11), beyond the 3×3 conv's reach of (0, 0)
    near = x.clone()
    near[:, 13] += torch.randn(2, 32, dtype=torch.float64)  # token (1, 1), inside it
    static = WeightFormerBlock(32, dynamic=False).double().eval()
    dynamic = WeightFormerBlock(32, dynamic=True).double().eval()
    with torch.no_grad():
        assert torch.equal(static(x, hw)[:, 0], static(far, hw)[:, 0])
        assert not torch.allclose(static(x, hw)[:, 0], static(near, hw)[:, 0])
        delta = (dynamic(x, hw)[:, 0] - dynamic(far, hw)[:, 0]).abs().max().item()
    assert delta > 1e-6  # global context through the predicted weights

    # both dynamic layers are global on their own
    conv, lin = DynamicDepthwiseConv(32).double(), _boost(DynamicLinear(32, 64).double())
    grid = lambda t: t.view(2, 12, 12, 32).permute(0, 3, 1, 2)  # noqa: E731
    with torch.no_grad():
        assert not torch.allclose(conv(grid(x))[:, :, 0, 0], conv(grid(far))[:, :, 0, 0])
        assert not torch.allclose(lin(x, hw)[:, 0], lin(far, hw)[:, 0])


def test_model_is_global_but_static_only_model_is_not():
    x = torch.randn(1, 3, 48, 48, dtype=torch.float64)  # 12×12 grid
    far = x.clone()
    far[..., 44:, 44:] += 1.0  # bottom-right patch
    with torch.no_grad():
        model = _small(depth=3)  # blocks 0, 2 static, block 1 dynamic
        changed = (model.forward_features(x)[:, 0] - model.forward_features(far)[:, 0]).abs().max()
        static_only = _small(depth=3, dynamic_every=100)  # no dynamic block: reach 3 tokens
        same = (static_only.forward_features(x)[:, 0] - static_only.forward_features(far)[:, 0]).abs().max()
    assert changed > 1e-6 and same == 0


def test_batch_independence(nano):
    torch.manual_seed(1)
    a, b, c = torch.randn(3, 1, 3, 32, 32).unbind(0)
    with torch.no_grad():
        ab = nano(torch.cat([a, b]))
        ac = nano(torch.cat([a, c]))
        alone = nano(a)
    torch.testing.assert_close(ab[0], ac[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ab[:1], alone, rtol=1e-5, atol=1e-5)
    # gradients: sample 0's output must not depend on sample 1's input at all
    model = _small()
    x = torch.randn(3, 3, 20, 28, dtype=torch.float64, requires_grad=True)
    model(x)[0].sum().backward()
    assert x.grad[0].abs().sum() > 0 and x.grad[1:].abs().max() == 0


# ----------------------------------------------------------------------------------------------
# numerics
# ----------------------------------------------------------------------------------------------
def test_bf16_autocast_forward_backward_finite():
    torch.manual_seed(0)
    model = vitmix.create_model("weightformer_nano_patch4_32", drop_path_rate=0.1).train()
    x = torch.randn(4, 3, 32, 32) * 10
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = nn.functional.cross_entropy(out.float(), torch.arange(4))
    loss.backward()
    assert torch.isfinite(out.float()).all() and torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # and pure bf16 weights + inputs
    model_bf16 = vitmix.create_model("weightformer_nano_patch4_32").bfloat16().eval()
    with torch.no_grad():
        assert torch.isfinite(model_bf16(x.bfloat16()).float()).all()


@pytest.mark.parametrize("linear_path", ["auto", "dense", "core"])
@pytest.mark.parametrize("size", [(32, 32), (20, 28), (8, 8)])
def test_fused_inference_path_matches_plain_path(size, linear_path, monkeypatch):
    # float32 CPU inference uses oneDNN linears with fused bias+GELU (dynamic fc1: one primitive per
    # sample, unless the low-rank path is chosen); training, autocast and float64 take the plain path.
    from vitmix.models import _onednn

    calls = []
    real = _onednn.fused_linear
    monkeypatch.setattr(_onednn, "fused_linear", lambda *a: calls.append(a[0].dim()) or real(*a))
    torch.manual_seed(0)
    model = _boost(vitmix.create_model("weightformer_nano_patch4_32", linear_path=linear_path)).eval()
    x = torch.randn(3, 3, *size)
    with torch.no_grad():
        fused = model(x)
        n_fused = len(calls)
        for m in model.modules():
            if hasattr(m, "fused_inference"):
                m.fused_inference = False
        plain = model(x)
    assert len(calls) == n_fused  # the switch really selects the plain path
    static_calls = 2 * 5  # 5 static blocks, fc1 and fc2
    assert n_fused == (static_calls if linear_path == "auto" else static_calls + 2 * 3 * 3)  # 3 dyn blocks × B × 2
    # float32, K ≤ 512 sums in a different GEMM blocking order
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(model.double()(x.double()).float(), plain, rtol=1e-4, atol=1e-5)


def test_norm_residual_switch():
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    official = WeightFormerBlock(32, dynamic=True).double().eval()
    prenorm = WeightFormerBlock(32, dynamic=True, norm_residual=False).double().eval()
    prenorm.load_state_dict(official.state_dict())
    with torch.no_grad():
        y_off, y_pre = official(x, (4, 4)), prenorm(x, (4, 4))
        def conv(t):
            return official.dwconv(t.view(2, 4, 4, 32).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).reshape(2, 16, 32)

        h = official.norm1(x)  # official: the residual stream itself is replaced by LN1(x)
        h = h + conv(h)
        torch.testing.assert_close(y_off, h + official.mlp(official.norm2(h), (4, 4)), rtol=1e-12, atol=1e-12)
        g = x + conv(official.norm1(x))
        torch.testing.assert_close(y_pre, g + official.mlp(official.norm2(g), (4, 4)), rtol=1e-12, atol=1e-12)
    with torch.device("meta"):
        m = timm.create_model("weightformer_tiny", norm_residual=False)
    assert not m.blocks[1].norm_residual


# ----------------------------------------------------------------------------------------------
# timm API
# ----------------------------------------------------------------------------------------------
def test_timm_api(nano):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = nano.forward_features(x)
        assert feats.shape == (2, 64, 128)
        torch.testing.assert_close(nano.forward_head(feats, pre_logits=True), feats.mean(1))
        torch.testing.assert_close(nano.forward_head(feats), nano(x))
    assert nano.get_classifier() is nano.head and nano.num_features == 128
    nwd = nano.no_weight_decay()
    assert "blocks.1.mlp.fc1.bias" in nwd and "blocks.1.dwconv.bias" in nwd and "norm.weight" in nwd
    assert "blocks.1.mlp.fc1.weight" not in nwd and "blocks.1.mlp.fc1.expand_in" not in nwd
    model = vitmix.create_model("weightformer_nano_patch4_32", in_chans=1, num_classes=3, drop_path_rate=0.2)
    assert model(torch.randn(1, 1, 32, 32)).shape == (1, 3)
    assert sum(isinstance(m, timm.layers.DropPath) for m in model.modules()) == 7  # block 0 has rate 0
    model.reset_classifier(5)
    assert model.get_classifier().out_features == 5 and model(torch.randn(1, 1, 32, 32)).shape == (1, 5)
    model.reset_classifier(0, global_pool="")
    assert model(torch.randn(1, 1, 16, 32)).shape == (1, 32, 128)
    model.set_grad_checkpointing(True)
    model.train()
    model(torch.randn(1, 1, 16, 16)).sum().backward()


def test_official_checkpoint_names_load():
    model = _small(depth=3)
    official = {}
    names = {  # official LeapLabTHU/WeightFormer names → ours
        "blocks.0.dwc.weight": "blocks.0.dwconv.weight", "blocks.0.linear1.weight": "blocks.0.mlp.fc1.weight",
        "blocks.1.dwc.w": "blocks.1.dwconv.weight", "blocks.1.dwc.b": "blocks.1.dwconv.bias",
        "blocks.1.dwc.wfm.0.weight": "blocks.1.dwconv.predictor.0.weight",
        "blocks.1.dwc.wfm.2.weight": "blocks.1.dwconv.predictor.2.weight",
        "blocks.1.linear1.w": "blocks.1.mlp.fc1.weight", "blocks.1.linear1.b": "blocks.1.mlp.fc1.bias",
        "blocks.1.linear1.wfm.weight": "blocks.1.mlp.fc1.predictor.weight",
        "blocks.1.linear1.w1": "blocks.1.mlp.fc1.expand_in", "blocks.1.linear1.w2": "blocks.1.mlp.fc1.expand_out",
        "blocks.1.linear2.bias": "blocks.1.mlp.fc2.bias", "blocks.1.norm1.weight": "blocks.1.norm1.weight",
    }
    ours = model.state_dict()
    inverse = {v: k for k, v in names.items()}
    for key, value in ours.items():
        official[inverse.get(key, key)] = value + 1.0
    converted = checkpoint_filter_fn({"model": official}, model)
    for off, mine in names.items():
        assert off in official and mine in converted
    assert set(converted) == set(ours)
    model.load_state_dict(converted)
    assert torch.equal(model.blocks[1].mlp.fc1.expand_in, ours["blocks.1.mlp.fc1.expand_in"])


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------
def test_bad_input(nano):
    with pytest.raises(ValueError, match="multiple of the patch size 4"):
        nano(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="channels-last"):
        nano(torch.randn(1, 32, 32, 3))
    with pytest.raises(ValueError, match="4-D|3-D|batch"):
        nano(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="5-D"):
        nano(torch.randn(1, 1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        nano(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match="no attention"):
        vitmix.create_model("weightformer_nano_patch4_32", mixer="softmax")
    with pytest.raises(ValueError, match="no attention"):
        timm.create_model("weightformer_tiny", mixer="soft", pretrained=False)
    with pytest.raises(ValueError, match="no attention"):
        timm.create_model("weightformer_tiny", mixer_options={"x": 1})
    with pytest.raises(ValueError, match="divisible"):
        vitmix.create_model("weightformer_nano_patch4_32", img_size=30)
    with pytest.raises(ValueError, match="square grid"):
        WeightFormerBlock(8)(torch.randn(1, 12, 8))
    with pytest.raises(ValueError, match="does not match"):
        WeightFormerBlock(8)(torch.randn(1, 12, 8), (3, 5))
    with pytest.raises(ValueError, match="divisible by reduction"):
        DynamicLinear(10, 16)
    with pytest.raises(ValueError, match="path"):
        DynamicLinear(8, 16, path="fast")
    with pytest.raises(ValueError, match="odd"):
        DynamicDepthwiseConv(8, kernel_size=4)
    with pytest.raises(ValueError, match=r"\(B, 8, H, W\)"):
        DynamicDepthwiseConv(8)(torch.randn(1, 4, 5, 5))
    with pytest.raises(ValueError, match="global_pool"):
        WeightFormer(img_size=32, patch_size=4, embed_dim=16, depth=2, global_pool="token")


# ----------------------------------------------------------------------------------------------
# training smoke test through the CLI
# ----------------------------------------------------------------------------------------------
def test_train_smoke_via_cli(tmp_path):
    from vitmix.cli import main

    run = tmp_path / "run"
    code = main(["train", "--model", "weightformer_nano_patch4_32", "--data", "digits", "--epochs", "1",
                 "--max-steps", "5", "--batch-size", "32", "--out", str(run)])
    assert code == 0
    assert (run / "metrics.jsonl").exists()
