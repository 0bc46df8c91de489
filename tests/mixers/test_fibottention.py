"""The ``fibottention`` mixer: modes, offsets per N and layer, timm integration, bad input."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitmix  # noqa: F401  (registers the mixers)
from vitmix import mixers
from vitmix.mixers.fibottention import FibottentionAttention, assign_layer_indices
from vitmix.ops import diagonal as sd
from vitmix.ops.fibonacci import fibonacci_offsets, offsets_mask

DIM, HEADS = 48, 6


def _pair(mode_a, mode_b, **kw):
    a = mixers.create("fibottention", DIM, HEADS, mode=mode_a, **kw)
    b = mixers.create("fibottention", DIM, HEADS, mode=mode_b, **kw)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("prefix, hw, batch", [(1, (7, 7), 1), (0, (5, 9), 3), (2, (6, 6), 3)])
def test_sparse_mode_equals_masked_mode_with_all_gradients(prefix, hw, batch):
    a, b = _pair("sparse", "masked", qkv_bias=True, layer_idx=3)
    a, b = a.double(), b.double()
    x = torch.randn(batch, prefix + hw[0] * hw[1], DIM, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = a(xa, hw=hw, num_prefix_tokens=prefix)
    yb = b(xb, hw=hw, num_prefix_tokens=prefix)
    torch.testing.assert_close(ya, yb, rtol=1e-10, atol=1e-10)  # float64, only summation order differs
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_official_mode_uses_the_multiplicative_mask():
    layer = mixers.create("fibottention", DIM, HEADS, mode="official").double()
    x = torch.randn(2, 50, DIM, dtype=torch.float64)
    q, k, v = layer._qkv(x)
    mask = offsets_mask(layer.head_offsets(49), 49, 1).double()
    attn = ((q * layer.scale) @ k.transpose(-1, -2) * mask).softmax(-1)
    expected = layer.proj((attn @ v).transpose(1, 2).reshape(2, 50, DIM))
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    sparse = mixers.create("fibottention", DIM, HEADS).double()
    sparse.load_state_dict(layer.state_dict())
    assert (sparse(x) - layer(x)).abs().max() > 1e-3  # masked keys keep weight in the official mode


def test_attention_map_matches_the_pattern_and_the_forward():
    layer = mixers.create("fibottention", DIM, HEADS, layer_idx=2).double()
    x = torch.randn(2, 65, DIM, dtype=torch.float64)
    amap = layer.attention_map(x)
    assert amap.shape == (2, HEADS, 65, 65)
    torch.testing.assert_close(amap.sum(-1), torch.ones(2, HEADS, 65, dtype=torch.float64))
    mask = offsets_mask(layer.head_offsets(64), 64, 1)
    assert (amap[:, ~mask] == 0).all() and (amap[:, mask] > 0).all()
    assert not amap[:, :, 1:, 1:].diagonal(dim1=-2, dim2=-1).any()  # main diagonal excluded
    _, _, v = layer._qkv(x)
    out = layer.proj((amap @ v).transpose(1, 2).reshape(2, 65, DIM))
    torch.testing.assert_close(out, layer(x), rtol=1e-10, atol=1e-10)
    official = mixers.create("fibottention", DIM, HEADS, mode="official").double()
    official.load_state_dict(layer.state_dict())
    assert (official.attention_map(x) > 0).all()


def test_offsets_follow_n_and_are_cached_per_shape():
    layer = mixers.create("fibottention", DIM, HEADS)
    for n in (49, 64, 100, 49):
        assert layer(torch.randn(1, 1 + n, DIM)).shape == (1, 1 + n, DIM)
    assert layer.head_offsets(100) == fibonacci_offsets(100, HEADS)
    assert {key[1] for key in layer._cache} == {49, 64, 100}
    # any sequence length when only the prefix count is known (not a square)
    assert layer(torch.randn(2, 1 + 55, DIM), num_prefix_tokens=1).shape == (2, 56, DIM)


def test_layer_index_drives_the_shuffle_and_assign_layer_indices():
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=DIM, depth=3, num_heads=HEADS, num_classes=3,
                              attn_layer=mixers.timm_attn("fibottention", shuffle="official"))
    assert [b.attn.layer_idx for b in model.blocks] == [None] * 3
    assert model.blocks[0].attn.head_offsets(64) == model.blocks[2].attn.head_offsets(64)
    assign_layer_indices(model)
    assert [b.attn.layer_idx for b in model.blocks] == [0, 1, 2]
    for i, block in enumerate(model.blocks):
        assert block.attn.head_offsets(64) == fibonacci_offsets(64, HEADS, layer=i, shuffle="official")
    assert model.blocks[0].attn.head_offsets(64) != model.blocks[1].attn.head_offsets(64)
    layer = FibottentionAttention(768, 12, shuffle="official", layer_idx=0)
    assert layer.head_offsets(196)[0] == (4, 7)  # Python random.seed(0) order of the official code


@pytest.mark.parametrize("mode", ["sparse", "masked", "official"])
def test_stock_timm_vit_at_two_resolutions(mode):
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=DIM, depth=2, num_heads=HEADS, num_classes=4,
                              dynamic_img_size=True, attn_layer=mixers.timm_attn("fibottention", mode=mode))
    assign_layer_indices(model)
    for size in ((32, 32), (40, 24)):  # 64 and 60 patches (non-square)
        logits = model(torch.randn(2, 3, *size))
        assert logits.shape == (2, 4) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_modified_variant_and_diagonal_options():
    layer = mixers.create("fibottention", DIM, HEADS, variant="modified", shuffle="none")
    assert layer.head_offsets(196)[0] == (0, 1, 2, 3, 5)
    layer = mixers.create("fibottention", DIM, HEADS, include_diagonal=True)
    assert all(0 in o for o in layer.head_offsets(64))
    x = torch.randn(1, 65, DIM)
    a, b = _pair("sparse", "masked", include_diagonal=True, w_min=3, w_max=20)
    torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-6)


def test_backends_agree_and_state_dict_matches_timm_attention():
    from timm.layers import Attention

    a, b = _pair("sparse", "sparse", backend="torch")
    if sd.kernel_available():
        b = mixers.create("fibottention", DIM, HEADS, backend="c")
        b.load_state_dict(a.state_dict())
    x = torch.randn(2, 50, DIM)
    torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-6)  # float32; polynomial exp in C
    assert set(a.state_dict()) == set(Attention(DIM, HEADS).state_dict())


def test_bfloat16_autocast_is_finite():
    layer = mixers.create("fibottention", DIM, HEADS)
    x = torch.randn(2, 197, DIM) * 20
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert torch.isfinite(y).all()
    y.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_bad_input_raises_value_errors():
    with pytest.raises(ValueError, match="mode='dense' is not one of"):
        mixers.create("fibottention", DIM, HEADS, mode="dense")
    with pytest.raises(ValueError, match="num_heads=1"):
        mixers.create("fibottention", DIM, 1)
    assert mixers.create("fibottention", DIM, 1, w_min=8, w_max=8).head_offsets(64) == [(1, 2, 3, 5, 8)]
    with pytest.raises(ValueError, match="integer"):
        mixers.create("fibottention", DIM, HEADS, w_max=20.5)
    with pytest.raises(ValueError, match="integer"):
        mixers.create("fibottention", DIM, HEADS, w_min=True)
    with pytest.raises(ValueError, match="attention dropout"):
        mixers.create("fibottention", DIM, HEADS, attn_drop=0.1)
    assert mixers.create("fibottention", DIM, HEADS, attn_drop=0.1, mode="masked").attn_drop.p == 0.1
    layer = mixers.create("fibottention", DIM, HEADS)
    with pytest.raises(ValueError, match="num_prefix_tokens=9 must be smaller"):
        layer(torch.randn(1, 9, DIM), num_prefix_tokens=9)
    big = mixers.create("fibottention", 96, 12)
    with pytest.raises(ValueError, match="only N=16 patch tokens"):
        big(torch.randn(1, 17, 96))  # 12 heads need offsets up to 30
    with pytest.raises(ValueError, match="does not support attn_mask"):
        layer(torch.randn(1, 17, DIM), attn_mask=torch.ones(17, 17, dtype=torch.bool))


def test_number_layers_counts_depth_aware_mixers_and_keeps_given_indices():
    fib = [mixers.create("fibottention", DIM, HEADS, layer_idx=idx) for idx in (None, 5, None)]
    model = torch.nn.Sequential(mixers.create("softmax", DIM, HEADS), *fib)
    assert mixers.number_layers(model) is model
    assert [m.layer_idx for m in fib] == [0, 5, 2]          # softmax has no index and is not counted
    assert [m.layer_idx for m in assign_layer_indices(model, start=3)[1:]] == [3, 4, 5]   # overwrites
    mixers.number_layers(model, overwrite=True)
    assert [m.layer_idx for m in fib] == [0, 1, 2]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="start must be an integer >= 0"):
            mixers.number_layers(model, start=bad)
