"""The mixer contract (module docstring of vitmix.mixers.base), checked for every registered mixer."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitmix  # noqa: F401  (registers every mixer)
from vitmix import mixers
from vitmix.mixers import TokenMixer

DIM, HEADS = 64, 4
ALL = mixers.list_mixers()


def _check_finite_backward(layer, out):
    out.float().pow(2).mean().backward()
    grads = [p.grad for p in layer.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads), "some parameters received no gradient"
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("prefix", [0, 1])
def test_shape_and_gradients_with_explicit_non_square_grid(name, batch, prefix):
    hw = (6, 10)  # non-square, so nothing can silently assume a square grid
    layer = mixers.create(name, DIM, HEADS, hw=hw, num_prefix_tokens=prefix)
    x = torch.randn(batch, prefix + hw[0] * hw[1], DIM, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape
    assert torch.isfinite(out).all()
    _check_finite_backward(layer, out)
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_grid_passed_per_call_matches_grid_bound_at_construction(name):
    torch.manual_seed(1)
    bound = mixers.create(name, DIM, HEADS, hw=(8, 6), num_prefix_tokens=1).eval()
    free = mixers.create(name, DIM, HEADS).eval()
    free.load_state_dict(bound.state_dict())
    x = torch.randn(2, 1 + 48, DIM)
    torch.testing.assert_close(free(x, hw=(8, 6), num_prefix_tokens=1), bound(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ALL)
def test_drops_into_stock_timm_vision_transformer(name):
    attn = mixers.timm_attn(name)
    assert isinstance(attn, type) and issubclass(attn, TokenMixer)
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=DIM, depth=2, num_heads=HEADS,
                              num_classes=5, attn_layer=attn)
    assert all(isinstance(b.attn, attn) for b in model.blocks)
    x = torch.randn(2, 3, 32, 32)
    logits = model(x)  # CLS + 8x8 grid: the mixers must infer the square grid after one prefix token
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ALL)
def test_rejects_wrong_input_shape_and_unknown_option(name):
    layer = mixers.create(name, DIM, HEADS)
    with pytest.raises(ValueError, match=r"\(B, N, 64\)"):
        layer(torch.randn(2, 49, DIM + 1))
    with pytest.raises(ValueError, match=r"\(B, N, 64\)"):
        layer(torch.randn(49, DIM))
    with pytest.raises(ValueError, match="no option 'qkv_bais'.*qkv_bias"):
        mixers.create(name, DIM, HEADS, qkv_bais=True)


def test_unknown_mixer_suggests_close_names():
    with pytest.raises(ValueError, match="Did you mean: softmax"):
        mixers.create("sofmax", DIM, HEADS)
    with pytest.raises(ValueError, match="Did you mean: softmax"):
        mixers.timm_attn("softmaxx")


def test_timm_attn_binds_options_and_is_a_class():
    attn = mixers.timm_attn("softmax", fused=False)
    layer = attn(DIM, num_heads=HEADS, qkv_bias=True)
    assert layer.fused is False and layer.qkv.bias is not None
    assert attn.bound_options == {"fused": False}


def test_grid_inference_and_errors():
    assert mixers.infer_grid(197) == (1, 14, 14)
    assert mixers.infer_grid(201) == (5, 14, 14)  # CLS + 4 register tokens
    assert mixers.resolve_grid(61, (6, 10)) == (1, 6, 10)
    with pytest.raises(ValueError, match="hw=\\(H, W\\)"):
        mixers.infer_grid(50, num_prefix_tokens=0)
    with pytest.raises(ValueError, match="expected N=62"):
        mixers.resolve_grid(61, (6, 10), num_prefix_tokens=2)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        mixers.create("softmax", 65, 4)
