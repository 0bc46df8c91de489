"""TimeSformer-style video models: registration, shapes, the divided block against a loop-over-frames
reference (forward and every gradient), temporal mixing, Fibottention on short frame sequences."""
import pytest
import timm
import torch

import vitmix
from vitmix.mixers import TokenMixer
from vitmix.models import is_vitmix_model
from vitmix.models.timesformer import DividedSpaceTimeBlock, TimeSformer, is_video_model, sincos_table
from vitmix.ops.fibonacci import fibonacci_offsets, fibonacci_sequence, head_offsets, head_windows

pytestmark = pytest.mark.usefixtures("one_thread")

# odd shapes: 5 frames of 24×40 in 8×8 patches (3×5 grid), one channel
SMALL = dict(img_size=(24, 40), num_frames=5, in_chans=1, embed_dim=24, depth=2, num_heads=3, num_classes=7)


def _clips(batch, model, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, model.in_chans, model.num_frames, *model.img_size, generator=g, dtype=dtype)


def test_models_are_registered_and_listed():
    names = vitmix.list_models("timesformer")
    assert {"timesformer_tiny", "timesformer_tiny_fibottention"} <= set(names)
    for name in names:
        assert is_vitmix_model(name) and is_video_model(name) and timm.is_model(name)
    assert not is_video_model("vit_nano_patch4_32") and not is_video_model("no_such_model")


@pytest.mark.parametrize("name", ["timesformer_tiny", "timesformer_tiny_fibottention"])
@pytest.mark.parametrize("batch", [1, 3])
def test_shapes_batch_one_and_more(name, batch):
    model = vitmix.create_model(name, **SMALL).eval()
    x = _clips(batch, model)
    with torch.no_grad():
        assert model(x).shape == (batch, 7)
        assert model.forward_features(x).shape == (batch, 1 + 5 * 15, 24)
        assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (batch, 24)
    assert model.example_inputs(2)[0].shape == (2, 1, 5, 24, 40)


def test_default_configuration():
    model = vitmix.create_model("timesformer_tiny", in_chans=1)
    geometry = (model.num_frames, model.img_size, model.patch_embed.grid_size, model.num_classes)
    assert geometry == (8, (32, 32), (4, 4), 4)
    assert len(model.blocks) == 4 and model.embed_dim == 192


@pytest.mark.parametrize("mixer", vitmix.list_mixers())
def test_every_mixer_works_in_time_and_space(mixer):
    """Each mixer gets its own grid (1×T in time, the patch grid after CLS in space); landmark mixers get
    stride 1 in time (no 2×2 cells on a 1×T grid); Linformer builds its projections for each length."""
    # 8 frames: Fibottention's default (image) variant keeps head 3's Wythoff seed 6, which needs T > 6
    model = vitmix.create_model("timesformer_tiny", **dict(SMALL, depth=1, num_frames=8), mixer=mixer)
    block = model.blocks[0]
    assert (block.temporal_attn.hw, block.temporal_attn.num_prefix_tokens) == ((1, 8), 0)
    assert (block.attn.hw, block.attn.num_prefix_tokens) == ((3, 5), 1)
    if hasattr(block.temporal_attn, "landmark_stride"):
        assert block.temporal_attn.landmark_stride == 1 and block.attn.landmark_stride == 2
    out = model(_clips(2, model))
    out.sum().backward()
    assert out.shape == (2, 7) and all(p.grad is not None for p in model.parameters())


def test_time_embedding_starts_as_the_sincos_table_or_at_zero():
    model = TimeSformer(num_frames=6, embed_dim=10, depth=1, num_heads=2)
    t, i = torch.arange(6.0)[:, None], torch.arange(5.0)[None]
    angles = t / 10000 ** (i / 5)                     # the Transformer's table, written out
    torch.testing.assert_close(model.time_embed[0].detach(), torch.cat([angles.sin(), angles.cos()], dim=1))
    assert sincos_table(3, 7)[:, -1].eq(0).all() and sincos_table(3, 7).shape == (3, 7)
    assert not TimeSformer(num_frames=6, embed_dim=10, depth=1, num_heads=2, time_embed_init="zeros").time_embed.any()
    with pytest.raises(ValueError, match="time_embed_init='normal'"):
        TimeSformer(time_embed_init="normal")
    # TimeSformer's init: temporal_fc of every block after the first starts at 0
    deep = TimeSformer(depth=3, embed_dim=12, num_heads=3)
    assert deep.blocks[0].temporal_fc.weight.any() and not deep.blocks[2].temporal_fc.weight.any()


def _reference_block(block: DividedSpaceTimeBlock, x: torch.Tensor) -> torch.Tensor:
    """The divided block written out with loops: each spatial location through time, each frame (with
    a copy of CLS) through space, CLS outputs averaged over frames, then the MLP."""
    t, n = block.num_frames, block.grid[0] * block.grid[1]
    cls, patches = x[:, :1], x[:, 1:]
    temporal = torch.zeros_like(patches)
    for loc in range(n):
        idx = [f * n + loc for f in range(t)]
        out = block.temporal_attn(block.temporal_norm1(patches[:, idx]), hw=(1, t), num_prefix_tokens=0)
        temporal[:, idx] = block.temporal_fc(out)
    patches = patches + temporal
    x = torch.cat([cls, patches], dim=1)
    spatial_cls, spatial_patches = [], []
    for f in range(t):
        frame = torch.cat([cls, patches[:, f * n:(f + 1) * n]], dim=1)
        out = block.attn(block.norm1(frame), hw=block.grid, num_prefix_tokens=1)
        spatial_cls.append(out[:, :1])
        spatial_patches.append(out[:, 1:])
    x = x + torch.cat([torch.stack(spatial_cls).mean(dim=0)] + spatial_patches, dim=1)
    return x + block.mlp(block.norm2(x))


@pytest.mark.parametrize("name, options", [("timesformer_tiny", {}), ("timesformer_tiny_fibottention", {}),
                                           ("timesformer_tiny", {"mixer": "linear", "time_mixer": "softmax"})])
@pytest.mark.parametrize("batch", [1, 2])
def test_block_matches_the_loop_reference_forward_and_all_gradients(name, options, batch):
    model = vitmix.create_model(name, **SMALL, **options).double()
    for block in model.blocks:             # make the zero-initialised temporal_fc count
        torch.nn.init.normal_(block.temporal_fc.weight, std=0.1)
    block = model.blocks[1]
    x = torch.randn(batch, 1 + 5 * 15, 24, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(batch, 1 + 5 * 15, 24, dtype=torch.float64)

    def run(fn):
        block.zero_grad(set_to_none=True)
        x.grad = None
        out = fn(x)
        (out * weights).sum().backward()
        return out.detach(), x.grad.clone(), {k: p.grad.clone() for k, p in block.named_parameters()}

    out, gx, grads = run(block)
    ref, gx_ref, grads_ref = run(lambda v: _reference_block(block, v))
    # float64, the same modules on the same numbers in another order: rounding only (~1e-15)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-10, atol=1e-10)
    assert grads.keys() == grads_ref.keys() and all(g is not None for g in grads.values())
    for key in grads:
        torch.testing.assert_close(grads[key], grads_ref[key], rtol=1e-10, atol=1e-10, msg=key)


@pytest.mark.parametrize("name", ["timesformer_tiny", "timesformer_tiny_fibottention"])
def test_tokens_of_a_frame_change_when_only_other_frames_change(name):
    """Temporal mixing, in a one-block model (where CLS, the other path between frames, is still the same
    learned vector for every clip): frame 0's output tokens move when only frame 3 changes, and stay
    bit-identical once the temporal branch is switched off (temporal_fc = 0)."""
    model = vitmix.create_model(name, **dict(SMALL, depth=1)).eval()
    x = _clips(2, model)
    y = x.clone()
    y[:, :, 3] = torch.randn_like(y[:, :, 3])
    frame0, frame3 = slice(1, 1 + 15), slice(1 + 3 * 15, 1 + 4 * 15)
    with torch.no_grad():
        torch.nn.init.normal_(model.blocks[0].temporal_fc.weight, std=0.1)   # a trained-size temporal branch
        a, b = model.forward_features(x), model.forward_features(y)
        assert (a[:, frame0] - b[:, frame0]).abs().max() > 1e-3
        assert (a[:, frame3] - b[:, frame3]).abs().max() > 1e-3
        assert not torch.allclose(model(x), model(y))
        model.blocks[0].temporal_fc.weight.zero_()
        model.blocks[0].temporal_fc.bias.zero_()
        a, b = model.forward_features(x), model.forward_features(y)
    torch.testing.assert_close(a[:, frame0], b[:, frame0], rtol=0, atol=0)
    assert (a[:, frame3] - b[:, frame3]).abs().max() > 1e-3


def test_the_fibottention_model_uses_modified_wythoff_in_time_and_space():
    model = vitmix.create_model("timesformer_tiny_fibottention", **SMALL)
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    assert len(mixers) == 4 and {m.variant for m in mixers} == {"modified"}
    assert [m.layer_idx for m in mixers] == [0, 1, 2, 3]         # block 0 time, block 0 space, ...
    t_offsets = model.blocks[0].temporal_attn.head_offsets(5)
    assert t_offsets == fibonacci_offsets(5, 3, layer=0, variant="modified")
    assert all(max(o) < 5 for o in t_offsets) and any(0 in o for o in t_offsets)
    with pytest.raises(ValueError, match="always uses the 'fibottention' mixer"):
        vitmix.create_model("timesformer_tiny_fibottention", mixer="softmax")
    other = vitmix.create_model("timesformer_tiny_fibottention", **SMALL, mixer_options={"variant": "wythoff"})
    assert {m.variant for m in other.modules() if isinstance(m, TokenMixer)} == {"wythoff"}


@pytest.mark.parametrize("frames", range(3, 17))
def test_short_sequences_keep_exactly_the_window_terms_below_t(frames):
    """The clipped windows give the unclipped sequence without its terms >= T (the seed a always kept)."""
    windows = head_windows(3, frames)
    for i, (offsets, window) in enumerate(zip(head_offsets(3, frames, variant="modified"), windows), start=1):
        a, b = i - 1, (i + int((5 * i * i) ** 0.5)) // 2            # modified seeds (i - 1, floor(i * phi))
        full = fibonacci_sequence(a, b, window)
        assert offsets == tuple(sorted({d for d in full if d < frames} | {a}))


@pytest.mark.parametrize("frames", [4, 5, 8, 16])
def test_fibottention_on_short_frame_sequences_sparse_equals_masked(frames):
    """Windows are clipped to T (w_min = 5 >= T for T <= 5): every offset exists, and the sparse kernel
    equals the dense masked reference, forward and gradients (float64: rounding only)."""
    sparse = vitmix.mixers.create("fibottention", 24, 3, variant="modified", mode="sparse").double()
    masked = vitmix.mixers.create("fibottention", 24, 3, variant="modified", mode="masked").double()
    masked.load_state_dict(sparse.state_dict())
    assert all(max(o) < frames for o in sparse.head_offsets(frames))
    x = torch.randn(6, frames, 24, dtype=torch.float64, requires_grad=True)
    outs = []
    for layer in (sparse, masked):
        x.grad = None
        out = layer(x, hw=(1, frames), num_prefix_tokens=0)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outs.append((out.detach(), x.grad.clone(), [p.grad.clone() for p in layer.parameters()]))
        layer.zero_grad()
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-10, atol=1e-10)
    for a, b in zip(outs[0][2], outs[1][2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_bad_inputs_raise_one_line_value_errors():
    model = vitmix.create_model("timesformer_tiny", **SMALL)
    with pytest.raises(ValueError, match=r"expects clips \(B, C, T, H, W\) = \(B, 1, 5, 24, 40\)"):
        model(torch.zeros(2, 1, 24, 40))
    with pytest.raises(ValueError, match="got \\(2, 1, 4, 24, 40\\)"):
        model(torch.zeros(2, 1, 4, 24, 40))
    with pytest.raises(ValueError, match="global_pool"):
        TimeSformer(global_pool="max")
    with pytest.raises(ValueError, match="num_frames=0"):
        TimeSformer(num_frames=0)
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("timesformer_tiny", pretrained=True)
    with pytest.raises(ValueError, match="not divisible by its patch size"):
        vitmix.create_model("timesformer_tiny", img_size=30)


def test_avg_pool_and_reset_classifier():
    model = vitmix.create_model("timesformer_tiny", **SMALL, global_pool="avg").eval()
    x = _clips(2, model)
    with torch.no_grad():
        feats = model.forward_features(x)
        torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats[:, 1:].mean(dim=1))
    model.reset_classifier(3)
    assert model(x).shape == (2, 3) and model.get_classifier().out_features == 3


def test_depth_aware_mixers_are_numbered_among_themselves():
    # softmax in time, Fibottention in space: the spatial layers are 0, 1 (not their position among all
    # mixers), as the TimeSformer builder always numbered them; both Fibottention: time 0, space 1, ...
    mixed = vitmix.create_model("timesformer_tiny", **SMALL, mixer="fibottention", time_mixer="softmax")
    assert [b.attn.layer_idx for b in mixed.blocks] == [0, 1]
    both = vitmix.create_model("timesformer_tiny_fibottention", **SMALL)
    assert [(b.temporal_attn.layer_idx, b.attn.layer_idx) for b in both.blocks] == [(0, 1), (2, 3)]
