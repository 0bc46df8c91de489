"""DiT and WeightFormer-DiT: closed-form parameter counts, zero init, blocks against hand-written
references (float64, forward and gradients), any mixer, any grid, conditioning, registry handling."""
from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import build_sincos2d_pos_embed

import vitmix
from vitmix.cli import main
from vitmix.models.dit import DiT, DiTBlock, TimestepEmbedder, WeightFormerDiT, WeightFormerDiTBlock, model_task
from vitmix.models.weightformer import DynamicDepthwiseConv, DynamicLinear
from vitmix.ops.dynamic import dynamic_depthwise_conv2d_reference, dynamic_linear_reference

GENERATIVE = ["dit_nano_patch2", "dit_tiny_patch2", "weightformer_dit_nano_patch2", "weightformer_dit_tiny_patch2"]


def _unzero(model, std=0.3):
    """Give the adaLN-Zero layers (and the output layer) random weights, as training would."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN_modulation" in name or "final_layer.linear" in name:
                p.normal_(0, std)
    return model


# ----------------------------------------------------------------------------------------------
# parameter counts
# ----------------------------------------------------------------------------------------------
def _closed_form(D, depth, p=2, C=3, K=10, weightformer=False, dynamic_every=3):
    # patch embedding, timestep MLP, label table (+ null class), final adaLN and linear
    shared = (p * p * C * D + D) + (256 * D + D + D * D + D) + (K + 1) * D + (2 * D * D + 2 * D) + (D + 1) * p * p * C
    if not weightformer:
        return shared + depth * (18 * D * D + 15 * D)     # attention 4D²+4D, MLP 8D²+5D, adaLN 6D²+6D
    dynamic = sum((i + 2) % dynamic_every == 0 for i in range(depth))
    static_block = 10 * D + (8 * D * D + 5 * D) + (6 * D * D + 6 * D)
    # DynDWConv 9D+D + (D²+D) + D²; DynamicLinear(D→4D): 4D² + 4D + (D·5D/4 + 5D/4) + D²/4 + 4D²; fc2; adaLN
    dynamic_block = (2 * D * D + 11 * D) + (9.5 * D * D + 5.25 * D) + (4 * D * D + D) + (6 * D * D + 6 * D)
    return int(shared + (depth - dynamic) * static_block + dynamic * dynamic_block)


@pytest.mark.parametrize("name,count", [("dit_nano_patch2", 1_868_044), ("weightformer_dit_nano_patch2", 1_725_772),
                                        ("dit_tiny_patch2", 8_164_620), ("weightformer_dit_tiny_patch2", 7_516_620)])
def test_parameter_counts_match_the_closed_form_and_the_docstring(name, count):
    with torch.device("meta"):
        model = timm.create_model(name)
    n = sum(p.numel() for p in model.parameters())
    assert n == count == _closed_form(model.embed_dim, len(model.blocks), weightformer="weightformer" in name)
    # the same width/depth: WeightFormer-DiT is smaller (no q/k/v/proj; predictors only every third block)
    with torch.device("meta"):
        other = timm.create_model(name.replace("weightformer_", "") if "weightformer" in name else
                                  "weightformer_" + name)
    assert (sum(p.numel() for p in other.parameters()) > n) == ("weightformer" in name)


def test_closed_form_on_other_shapes():
    for kw in (dict(embed_dim=64, depth=4, patch_size=4, in_chans=1, num_classes=7),
               dict(embed_dim=32, depth=7, patch_size=1, in_chans=2, num_classes=3)):
        p, C, K = kw["patch_size"], kw["in_chans"], kw["num_classes"]
        for cls in (DiT, WeightFormerDiT):
            with torch.device("meta"):
                model = cls(img_size=8, num_heads=4, **kw)
            expected = _closed_form(kw["embed_dim"], kw["depth"], p, C, K, weightformer=cls is WeightFormerDiT)
            assert sum(q.numel() for q in model.parameters()) == expected


# ----------------------------------------------------------------------------------------------
# initialisation and structure
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [DiT, WeightFormerDiT])
def test_adaln_zero_init_outputs_exactly_zero(cls):
    torch.manual_seed(0)
    model = cls(img_size=8, in_chans=1, embed_dim=32, depth=4, num_heads=2)
    out = model(torch.randn(3, 1, 8, 8), torch.tensor([0, 500, 999]), torch.tensor([1, 2, 10]))
    assert out.shape == (3, 1, 8, 8) and torch.equal(out, torch.zeros_like(out))
    assert model.final_layer.linear.weight.abs().max() == 0
    assert all(b.adaLN_modulation[-1].weight.abs().max() == 0 for b in model.blocks)
    assert 0.015 < model.y_embedder.embedding_table.weight.std() < 0.025


def test_blocks_start_as_identity_except_the_official_weightformer_residual_norm():
    torch.manual_seed(0)
    x, c = torch.randn(2, 12, 16, dtype=torch.float64), torch.randn(2, 16, dtype=torch.float64)
    attention = DiT(img_size=(6, 8), in_chans=1, embed_dim=16, depth=1, num_heads=2).double().blocks[0]
    pre_norm = WeightFormerDiT(img_size=(6, 8), in_chans=1, embed_dim=16, depth=2,
                               norm_residual=False).double().blocks[1]
    official = WeightFormerDiT(img_size=(6, 8), in_chans=1, embed_dim=16, depth=2).double().blocks[1]
    assert pre_norm.dynamic and official.dynamic and official.norm_residual
    torch.testing.assert_close(attention(x, c, (3, 4)), x, rtol=0, atol=0)
    torch.testing.assert_close(pre_norm(x, c, (3, 4)), x, rtol=0, atol=0)
    torch.testing.assert_close(official(x, c, (3, 4)), F.layer_norm(x, (16,), eps=1e-6), rtol=0, atol=0)


def test_weightformer_dit_reuses_weightformer_layers_every_third_block():
    with torch.device("meta"):
        model = timm.create_model("weightformer_dit_tiny_patch2")
    assert [i for i, b in enumerate(model.blocks) if b.dynamic] == [1, 4, 7, 10]
    assert isinstance(model.blocks[1].dwconv, DynamicDepthwiseConv)
    assert isinstance(model.blocks[1].mlp.fc1, DynamicLinear) and model.blocks[1].mlp.fc1.out_features == 4 * 192
    assert isinstance(model.blocks[0].dwconv, torch.nn.Conv2d) and model.blocks[0].dwconv.groups == 192
    assert model.blocks[0].mlp.act.approximate == "tanh"
    assert not any(isinstance(m, vitmix.mixers.TokenMixer) for m in model.modules())


# ----------------------------------------------------------------------------------------------
# blocks against references
# ----------------------------------------------------------------------------------------------
def _modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


def _reference_attention_block(block, x, c):
    """DiT's block written out: explicit softmax attention with the mixer's own weights."""
    s1, a1, g1, s2, a2, g2 = (F.linear(F.silu(c), block.adaLN_modulation[1].weight,
                                       block.adaLN_modulation[1].bias)).chunk(6, dim=1)
    h = _modulate(F.layer_norm(x, x.shape[-1:], eps=1e-6), s1, a1)
    B, N, D = h.shape
    heads = block.attn.num_heads
    q, k, v = F.linear(h, block.attn.qkv.weight, block.attn.qkv.bias).view(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // heads), dim=-1) @ v
    x = x + g1[:, None] * F.linear(att.transpose(1, 2).reshape(B, N, D), block.attn.proj.weight, block.attn.proj.bias)
    h = _modulate(F.layer_norm(x, x.shape[-1:], eps=1e-6), s2, a2)
    mlp = F.linear(F.gelu(F.linear(h, block.mlp.fc1.weight, block.mlp.fc1.bias), approximate="tanh"),
                   block.mlp.fc2.weight, block.mlp.fc2.bias)
    return x + g2[:, None] * mlp


def _reference_weightformer_block(block, x, c, hw):
    """The official wfm_dit.py block with WeightFormer's reference ops (one sample at a time)."""
    s1, a1, g1, s2, a2, g2 = F.linear(F.silu(c), block.adaLN_modulation[1].weight,
                                      block.adaLN_modulation[1].bias).chunk(6, dim=1)
    B, N, D = x.shape
    normed = F.layer_norm(x, (D,), eps=1e-6)
    h = _modulate(normed, s1, a1)
    if block.norm_residual:
        x = normed
    grid = h.transpose(1, 2).reshape(B, D, *hw)
    kernels = block.dwconv.predict_kernels(grid)
    conv = dynamic_depthwise_conv2d_reference(grid, kernels, block.dwconv.bias).flatten(2).transpose(1, 2)
    x = x + g1[:, None] * conv
    h = _modulate(F.layer_norm(x, (D,), eps=1e-6), s2, a2)
    fc1 = block.mlp.fc1
    p, q = fc1.branch_codes(h, hw)
    hidden = dynamic_linear_reference(h, fc1.weight, fc1.bias, p, q, fc1.expand_in, fc1.expand_out)
    mlp = F.linear(F.gelu(hidden, approximate="tanh"), block.mlp.fc2.weight, block.mlp.fc2.bias)
    return x + g2[:, None] * mlp


def _compare(block, reference, batch, hw, dim):
    torch.manual_seed(2)
    x = torch.randn(batch, hw[0] * hw[1], dim, dtype=torch.float64, requires_grad=True)
    c = torch.randn(batch, dim, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(batch, hw[0] * hw[1], dim, dtype=torch.float64)
    grads = []
    for fn in (lambda: block(x, c, hw), lambda: reference(block, x, c, hw)):
        block.zero_grad()
        out = fn()
        params = [p for p in block.parameters() if p.requires_grad]
        grads.append((out, torch.autograd.grad((out * probe).sum(), [x, c, *params], allow_unused=True)))
    (out, g), (ref, g_ref) = grads
    # float64 throughout: the paths differ only in summation order (~1e-15 relative)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(g, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("batch", [1, 3])
def test_dit_block_matches_explicit_softmax_reference(batch):
    torch.manual_seed(0)
    block = DiTBlock(16, 2, mixer="softmax", mixer_options={"fused": True}, hw=(3, 5)).double()
    _unzero(block)
    _compare(block, lambda b, x, c, hw: _reference_attention_block(b, x, c), batch, (3, 5), 16)


@pytest.mark.parametrize("norm_residual", [True, False])
@pytest.mark.parametrize("batch,hw", [(1, (3, 5)), (3, (4, 4))])
def test_dynamic_weightformer_dit_block_matches_reference(norm_residual, batch, hw):
    torch.manual_seed(0)
    block = WeightFormerDiTBlock(16, dynamic=True, norm_residual=norm_residual).double()
    _unzero(block)
    with torch.no_grad():  # training-sized dynamic updates (at init ΔW is ~1e-6 of W0)
        for t in (block.mlp.fc1.expand_in, block.mlp.fc1.expand_out, block.mlp.fc1.predictor.weight):
            t.mul_(30)
    _compare(block, _reference_weightformer_block, batch, hw, 16)


# ----------------------------------------------------------------------------------------------
# inputs, conditioning, any mixer
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mixer", vitmix.list_mixers())
def test_every_mixer_drives_a_dit_on_a_non_square_grid(mixer):
    torch.manual_seed(0)
    model = _unzero(vitmix.create_model("dit_nano_patch2", mixer=mixer, img_size=(8, 12), in_chans=1, embed_dim=32,
                                        depth=2, num_heads=2))
    out = model(torch.randn(2, 1, 8, 12), torch.tensor([3, 900]), torch.tensor([0, 10]))
    out.square().mean().backward()
    assert out.shape == (2, 1, 8, 12) and torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.blocks[0].attn.hw == (4, 6) and model.blocks[0].attn.num_prefix_tokens == 0


def test_other_image_sizes_rebuild_the_position_embedding():
    torch.manual_seed(0)
    model = _unzero(WeightFormerDiT(img_size=8, in_chans=1, embed_dim=32, depth=2)).eval()
    assert torch.equal(model.pos_embed[0], build_sincos2d_pos_embed([4, 4], 32))
    t, y = torch.tensor([10, 20]), torch.tensor([1, 2])
    out = model(torch.randn(2, 1, 6, 10), t, y)               # 3×5 grid: odd, non-square
    assert out.shape == (2, 1, 6, 10) and torch.isfinite(out).all()
    x = torch.randn(1, 1, 8, 8)
    torch.testing.assert_close(model(x, torch.tensor(10), y[:1]), model(x, t[:1], y[:1]))   # scalar t broadcasts


def test_timestep_embedding_closed_form():
    t = torch.tensor([0.0, 1.0, 37.5, 999.0])
    for dim in (6, 7):
        code = TimestepEmbedder.sinusoid(t, dim)
        half = dim // 2
        for i, ti in enumerate(t.tolist()):
            for k in range(half):
                f = 10000 ** (-k / half)
                assert code[i, k].item() == pytest.approx(math.cos(ti * f), abs=1e-5)
                assert code[i, half + k].item() == pytest.approx(math.sin(ti * f), abs=1e-5)
        if dim % 2:
            assert torch.equal(code[:, -1], torch.zeros(4))


def test_label_dropout_replaces_labels_by_the_null_class_only_in_training():
    model = DiT(img_size=8, in_chans=1, embed_dim=16, depth=1, num_heads=2, class_dropout_prob=1.0)
    labels = torch.tensor([0, 3, 9])
    table = model.y_embedder.embedding_table.weight
    model.train()
    assert torch.equal(model.y_embedder(labels), table[[10, 10, 10]])
    model.eval()
    assert torch.equal(model.y_embedder(labels), table[[0, 3, 9]])
    assert model.null_class == 10


def test_bad_inputs_are_one_line_value_errors():
    model = DiT(img_size=8, in_chans=1, embed_dim=16, depth=1, num_heads=2)
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(ValueError, match="not a classifier.*vitmix generate train"):
        model(x)
    with pytest.raises(ValueError, match="labels must be integers in 0..10"):
        model(x, torch.tensor([1, 2]), torch.tensor([1, 11]))
    with pytest.raises(ValueError, match="multiple of the patch size 2"):
        model(torch.randn(2, 1, 7, 8), torch.tensor([1, 2]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"must be \(2,\)"):
        model(x, torch.tensor([1, 2, 3]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="no attention layer"):
        vitmix.create_model("weightformer_dit_nano_patch2", mixer="softmax")
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("dit_nano_patch2", pretrained=True)


# ----------------------------------------------------------------------------------------------
# registry: generative models are told apart from classifiers by an explicit task
# ----------------------------------------------------------------------------------------------
def test_task_tells_diffusion_backbones_from_classifiers():
    for name in GENERATIVE:
        assert vitmix.models.is_vitmix_model(name) and model_task(name) == "generation"
        assert timm.get_pretrained_cfg(name).description.startswith("class-conditional diffusion")
    assert model_task("vit_nano_patch4_32") == "classification" == model_task("weightformer_tiny")
    assert model_task(DiT(img_size=8, embed_dim=16, depth=1, num_heads=2)) == "generation"
    assert model_task(torch.nn.Linear(2, 2)) == "classification"
    with pytest.raises(ValueError, match="unknown model"):
        model_task("dit_nano_patch3")


def test_model_table_counts_one_denoising_step(capsys):
    assert main(["models", "--table", "dit_nano"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| `")]
    assert rows[0].startswith("| `dit_nano_patch2` | 32×32 | softmax | 1.87M |")
    assert rows[1].startswith("| `weightformer_dit_nano_patch2` | 32×32 | none (dynamic MLP/conv) | 1.73M |")
