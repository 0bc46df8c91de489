"""The mixer contract (module docstring of vitmix.mixers.base), checked for every registered mixer."""
import contextlib

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
@pytest.mark.parametrize("prefix", [0, 1])
def test_an_empty_batch_runs_forward_and_backward(name, prefix):
    """B = 0 (an empty last shard, a filtered batch) is a valid input: an empty output and zero
    gradients, not a reshape error (BigBird's index-sparse op and SOFT's C backward raised one)."""
    hw = (6, 10)
    layer = mixers.create(name, DIM, HEADS, hw=hw, num_prefix_tokens=prefix)
    x = torch.randn(0, prefix + hw[0] * hw[1], DIM, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    grads = [p.grad for p in layer.parameters() if p.grad is not None]
    assert all(not g.any() for g in grads)
    with torch.no_grad():
        assert layer.eval()(x).shape == x.shape


def _clear_module_caches():
    """Empty vitmix's module-level caches of constants (pooling matrices, sparse plans), so that the next
    call builds them wherever it runs."""
    from vitmix.ops import nystrom
    from vitmix.ops.diagonal import plan
    for cached in (nystrom._pool_matrix, nystrom._pool_matrix_as, plan._plan_cached, plan._flat_plan):
        cached.cache_clear()


@pytest.mark.parametrize("counted", [False, True], ids=["plain", "flop-counter"])
@pytest.mark.parametrize("name", ALL)
def test_constants_first_built_under_inference_mode_serve_a_later_training_step(name, counted):
    """Evaluation, FLOP counting or a benchmark may build a mixer's cached constants (pooling matrix, sparse
    pattern) under torch.inference_mode; a training step reusing them must still backpropagate (an
    inference tensor cannot be saved for backward). Seen in `vitmix compare`: its budget counts FLOPs under
    inference_mode before training. The FLOP counter (a dispatch mode) also keeps the one-call C inference
    paths out, so the composed path builds the constants."""
    from torch.utils.flop_counter import FlopCounterMode

    _clear_module_caches()
    hw = (5, 7)           # a small grid: laplacian pools by the cached matrix here (N < 8 m)
    layer = mixers.create(name, DIM, HEADS)     # the grid told per call: lazily built parameters too
    x = torch.randn(2, 1 + hw[0] * hw[1], DIM)
    with torch.inference_mode(), (FlopCounterMode(display=False) if counted else contextlib.nullcontext()):
        layer.eval()(x, hw=hw, num_prefix_tokens=1)
    x.requires_grad_()
    out = layer.train()(x, hw=hw, num_prefix_tokens=1)
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
    assert mixers.infer_grid(201, num_prefix_tokens=5) == (5, 14, 14)  # CLS + 4 register tokens, when told
    assert mixers.resolve_grid(61, (6, 10)) == (1, 6, 10)
    assert mixers.resolve_grid(60, (6, 10)) == (0, 6, 10)
    with pytest.raises(ValueError, match="hw=\\(H, W\\)"):
        mixers.infer_grid(50, num_prefix_tokens=0)
    with pytest.raises(ValueError, match="expected N=62"):
        mixers.resolve_grid(61, (6, 10), num_prefix_tokens=2)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        mixers.create("softmax", 65, 4)


# ------------------------------------------------------- the grid is never guessed wrong (issue 21 item 2)
def test_square_grid_is_inferred_only_after_the_told_or_default_prefix():
    with pytest.raises(ValueError, match=r"N=201 tokens with 1 prefix token \(timm's default") as err:
        mixers.infer_grid(201)             # CLS + 4 registers + 14x14: 5 prefix tokens cannot be guessed
    assert "\n" not in str(err.value) and "set_token_grid(model, hw=(H, W), num_prefix_tokens=P)" in str(err.value)
    with pytest.raises(ValueError, match="N=64 tokens with 1 prefix token"):
        mixers.infer_grid(64)              # no CLS token: must be told (num_prefix_tokens=0)
    assert mixers.infer_grid(64, num_prefix_tokens=0) == (0, 8, 8)


def test_explicit_grid_cannot_turn_most_tokens_into_prefix():
    layer = mixers.create("laplacian", DIM, HEADS)
    x = torch.randn(1, 50, DIM)
    with pytest.raises(ValueError, match=r"hw=\(3, 3\) would leave 41 prefix tokens") as err:
        layer(x, hw=(3, 3))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="expected N=10"):
        layer(x, hw=(3, 3), num_prefix_tokens=1)
    assert layer(x, hw=(7, 7)).shape == x.shape                        # CLS + 7x7


def _stock_vit(**kwargs):
    return VisionTransformer(patch_size=16, embed_dim=DIM, depth=1, num_heads=HEADS, num_classes=3,
                             attn_layer=mixers.timm_attn("laplacian"), **kwargs)


def test_non_square_grid_in_stock_timm_fails_loudly_until_it_is_set():
    torch.manual_seed(0)
    model = _stock_vit(img_size=(96, 160)).eval()                      # CLS + 6x10 = 61 tokens
    x = torch.randn(1, 3, 96, 160)
    with pytest.raises(ValueError, match="N=61 tokens with 1 prefix token") as err:
        model(x)                                                        # was: 12 prefix tokens + a 7x7 grid
    assert "\n" not in str(err.value) and "set_token_grid" in str(err.value)
    mixers.set_token_grid(model, hw=(6, 10), num_prefix_tokens=1)
    attn = model.blocks[0].attn
    seen = []
    attn.register_forward_pre_hook(lambda m, args, kwargs: seen.append(m.token_grid(args[0].shape[1])),
                                   with_kwargs=True)
    assert model(x).shape == (1, 3) and seen == [(1, 6, 10)]


def test_square_grid_in_stock_timm_still_works_and_registers_need_telling():
    torch.manual_seed(0)
    assert _stock_vit(img_size=64)(torch.randn(2, 3, 64, 64)).shape == (2, 3)    # CLS + 4x4, inferred
    with_registers = _stock_vit(img_size=64, reg_tokens=4)                         # 5 prefix tokens + 4x4
    with pytest.raises(ValueError, match="N=21 tokens with 1 prefix token"):
        with_registers(torch.randn(1, 3, 64, 64))
    mixers.set_token_grid(with_registers, hw=(4, 4), num_prefix_tokens=with_registers.num_prefix_tokens)
    assert with_registers(torch.randn(1, 3, 64, 64)).shape == (1, 3)
