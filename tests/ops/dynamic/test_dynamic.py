"""vitmix.ops.dynamic: every fast path against its reference, forward and all gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from _memory import peak_memory_bytes
from vitmix.ops.dynamic import (
    choose_dynamic_linear_path,
    dynamic_depthwise_conv2d,
    dynamic_depthwise_conv2d_reference,
    dynamic_linear,
    dynamic_linear_costs,
    dynamic_linear_delta,
    dynamic_linear_reference,
    normalize_columns,
    normalize_kernels,
    pool_tokens_2x2,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# In float64 the paths differ only by re-association of sums of ~100 products: 1e-10 relative is
# ~6 orders of magnitude above the rounding error and far below any algebraic mistake.
RTOL64 = 1e-10
ATOL64 = 1e-12


def _linear_inputs(B, N, M, c_in, c_out, r=4, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * s).requires_grad_()

    x = rnd(B, N, c_in)
    weight = rnd(c_in, c_out, s=0.1)
    bias = rnd(c_out, s=0.1)
    # the module feeds SiLU outputs; any real values are valid for the op.
    p = rnd(B, M, c_in // r, s=scale)
    q = rnd(B, M, c_out // r, s=scale)
    w1 = rnd(c_in // r, c_in, s=0.5)
    w2 = rnd(c_out // r, c_out, s=0.5)
    return [x, weight, bias, p, q, w1, w2]


def _grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    cot = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad(out, inputs, cot)


SHAPES = [  # B, N, M, c_in, c_out
    (1, 1, 1, 4, 8),
    (1, 7, 2, 8, 12),
    (3, 15, 4, 12, 20),
    (2, 35, 12, 16, 64),
    (2, 64, 16, 32, 128),
]


@pytest.mark.parametrize("path", ["dense", "core", "lowrank", "auto"])
@pytest.mark.parametrize("shape", SHAPES)
def test_dynamic_linear_matches_reference(path, shape):
    inputs = _linear_inputs(*shape)
    # large p/q so the column norms are far from 0 and the +1 matters: both regimes are covered
    for scale in (1.0, 40.0):
        inputs = _linear_inputs(*shape, scale=scale, seed=int(scale))
        ref = dynamic_linear_reference(*inputs)
        out = dynamic_linear(*inputs, path=path)
        torch.testing.assert_close(out, ref, rtol=RTOL64, atol=ATOL64)
        for g, gr in zip(_grads(out, inputs), _grads(ref, inputs)):
            torch.testing.assert_close(g, gr, rtol=RTOL64, atol=ATOL64)


@pytest.mark.parametrize("path", ["dense", "core", "lowrank"])
def test_dynamic_linear_no_bias_and_custom_scale(path):
    x, weight, _, p, q, w1, w2 = _linear_inputs(2, 9, 3, 8, 16)
    ref = dynamic_linear_reference(x, weight, None, p, q, w1, w2, scale=0.37)
    out = dynamic_linear(x, weight, None, p, q, w1, w2, scale=0.37, path=path)
    torch.testing.assert_close(out, ref, rtol=RTOL64, atol=ATOL64)


@pytest.mark.parametrize("path", ["dense", "core", "lowrank"])
def test_dynamic_linear_gradcheck(path):
    inputs = _linear_inputs(2, 5, 2, 4, 8, scale=3.0)
    assert torch.autograd.gradcheck(lambda *a: dynamic_linear(*a, path=path), inputs)


@pytest.mark.parametrize("path", ["dense", "core", "lowrank"])
def test_dynamic_linear_zero_update_has_finite_grads(path):
    # p = 0 gives ΔW = 0: the column norms are exactly 0, where sqrt' is infinite. The paths must
    # use the zero subgradient (as vector_norm does), not produce NaN.
    x, weight, bias, p, q, w1, w2 = _linear_inputs(2, 6, 3, 8, 16)
    with torch.no_grad():
        p.zero_()
    out = dynamic_linear(x, weight, bias, p, q, w1, w2, path=path)
    torch.testing.assert_close(out, x @ weight + bias, rtol=RTOL64, atol=ATOL64)
    grads = _grads(out, [x, weight, bias, p, q, w1, w2])
    ref_grads = _grads(dynamic_linear(x, weight, bias, p, q, w1, w2, path="dense"), [x, weight, bias, p, q, w1, w2])
    for g, gr in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, gr, rtol=RTOL64, atol=ATOL64)


def test_delta_associations_agree_and_columns_are_soft_normalised():
    _, _, _, p, q, w1, w2 = _linear_inputs(3, 4, 5, 8, 24, scale=30.0)
    d_dense = dynamic_linear_delta(p, q, w1, w2, 0.1, "dense")
    d_core = dynamic_linear_delta(p, q, w1, w2, 0.1, "core")
    torch.testing.assert_close(d_core, d_dense, rtol=RTOL64, atol=ATOL64)
    raw = 0.1 * (p @ w1).transpose(1, 2) @ (q @ w2)
    norms = raw.norm(dim=1, keepdim=True)
    torch.testing.assert_close(d_dense, raw / (norms + 1), rtol=RTOL64, atol=ATOL64)
    assert (d_dense.norm(dim=1) < 1).all()
    with pytest.raises(ValueError, match="association"):
        dynamic_linear_delta(p, q, w1, w2, 0.1, "bogus")


def test_auto_path_choice_follows_costs():
    # WeightFormer-T widths: C=192 → 768, ranks 48 / 192.
    dims = dict(c_in=192, c_out=768, r_in=48, r_out=192)
    assert choose_dynamic_linear_path(n=196, m=49, **dims) == "dense"  # 224²
    assert choose_dynamic_linear_path(n=6084, m=1521, **dims) == "core"  # 1248²
    assert choose_dynamic_linear_path(n=16, m=4, **dims) == "lowrank"  # 64² image: tiny grid
    # nano on 32² digits (8×8 grid, C=128)
    assert choose_dynamic_linear_path(n=64, m=16, c_in=128, c_out=512, r_in=32, r_out=128) == "lowrank"
    costs = dynamic_linear_costs(n=6084, m=1521, **dims)
    assert costs["core"] < costs["dense"] < costs["lowrank"]


def test_lowrank_never_materialises_delta_w():
    # Wide layer, few tokens: one ΔW batch (B·C_in·C_out floats) is much larger than everything
    # the low-rank path needs besides the static weight.
    B, N, M, c_in, c_out = 2, 16, 4, 256, 1024
    inputs = [t.detach().float() for t in _linear_inputs(B, N, M, c_in, c_out)]
    delta_bytes = B * c_in * c_out * 4
    input_bytes = sum(t.numel() * 4 for t in inputs)  # static weight, w2, ... (~1 ΔW batch)

    def run(path):
        def fn():
            with torch.no_grad():
                return dynamic_linear(*inputs, path=path)
        return peak_memory_bytes(fn)["cpu"]

    low, dense = run("lowrank"), run("dense")
    # at most the inputs plus small (M- and N-sized) temporaries; ΔW alone would add delta_bytes
    assert low < input_bytes + delta_bytes / 4, (low, input_bytes, delta_bytes)
    assert dense - low > delta_bytes  # the dense path does hold ΔW and W0 + ΔW (sanity of the probe)


def test_dynamic_linear_bf16_autocast_finite_and_close():
    inputs = [t.detach().float() for t in _linear_inputs(2, 64, 16, 32, 128, scale=50.0)]
    inputs[0] = inputs[0] * 100  # large activations
    ref = dynamic_linear(*inputs, path="dense")
    for path in ("dense", "core", "lowrank"):
        xs = [t.clone().requires_grad_() for t in inputs]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = dynamic_linear(*xs, path=path)
        out.float().square().mean().backward()
        assert torch.isfinite(out).all()
        assert all(torch.isfinite(t.grad).all() for t in xs)
        # bf16 has an 8-bit mantissa: ~1% relative error per product of a K=32..128 sum
        torch.testing.assert_close(out.float(), ref, rtol=5e-2, atol=5e-2 * ref.abs().max().item())


def test_dynamic_linear_bad_input():
    x, weight, bias, p, q, w1, w2 = [t.detach() for t in _linear_inputs(2, 6, 3, 8, 16)]
    with pytest.raises(ValueError, match=r"\(B, N, C_in\)"):
        dynamic_linear(x[0], weight, bias, p, q, w1, w2)
    with pytest.raises(ValueError, match="weight.T"):
        dynamic_linear(x, weight.t(), bias, p, q, w1, w2)
    with pytest.raises(ValueError, match="bias"):
        dynamic_linear(x, weight, bias[:-1], p, q, w1, w2)
    with pytest.raises(ValueError, match="same B and M"):
        dynamic_linear(x, weight, bias, p[:, :2], q, w1, w2)
    with pytest.raises(ValueError, match="w1"):
        dynamic_linear(x, weight, bias, p, q, w1.t(), w2)
    with pytest.raises(ValueError, match="w2"):
        dynamic_linear(x, weight, bias, p, q, w1, w2[:, :-1])
    with pytest.raises(ValueError, match="path"):
        dynamic_linear(x, weight, bias, p, q, w1, w2, path="fast")


# ----------------------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------------------
def test_pool_even_grid_is_plain_2x2_mean():
    x = torch.randn(2, 6 * 8, 5, dtype=torch.float64)
    for odd in ("ceil", "floor"):
        pooled, w = pool_tokens_2x2(x, (6, 8), odd)
        assert w is None
        ref = x.view(2, 3, 2, 4, 2, 5).mean(dim=(2, 4)).reshape(2, 12, 5)
        torch.testing.assert_close(pooled, ref, rtol=1e-14, atol=1e-14)


def test_pool_odd_grid_ceil_weights_every_token_by_area():
    H, W, C = 5, 7, 3
    x = torch.randn(2, H * W, C, dtype=torch.float64)
    pooled, w = pool_tokens_2x2(x, (H, W), "ceil")
    assert pooled.shape == (2, 3 * 4, C)
    grid = x.view(2, H, W, C)
    # window (i, j) averages the tokens it covers; its weight is (#tokens) / 4
    for i in range(3):
        for j in range(4):
            block = grid[:, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
            torch.testing.assert_close(pooled[:, i * 4 + j], block.mean(dim=(1, 2)), rtol=1e-14, atol=1e-14)
            assert w[i * 4 + j].item() == block.shape[1] * block.shape[2] / 4
    # weighted sum of window means == sum over all tokens / 4: the 1/N normalisation stays a mean
    torch.testing.assert_close((pooled * w[:, None]).sum(1), grid.sum(dim=(1, 2)) / 4, rtol=1e-13, atol=1e-13)
    floor, wf = pool_tokens_2x2(x, (H, W), "floor")
    assert wf is None and floor.shape == (2, 2 * 3, C)
    torch.testing.assert_close(floor, F.avg_pool2d(grid.permute(0, 3, 1, 2), 2).flatten(2).transpose(1, 2))


def test_pool_bad_input():
    x = torch.randn(1, 12, 4)
    with pytest.raises(ValueError, match="does not match"):
        pool_tokens_2x2(x, (3, 5))
    with pytest.raises(ValueError, match="odd must be"):
        pool_tokens_2x2(x, (3, 4), "round")
    with pytest.raises(ValueError, match="odd='ceil'"):
        pool_tokens_2x2(torch.randn(1, 3, 4), (1, 3), "floor")


# ----------------------------------------------------------------------------------------------
# dynamic depthwise convolution
# ----------------------------------------------------------------------------------------------
DW_SHAPES = [(1, 1, 1, 1, 3), (1, 3, 5, 7, 3), (3, 4, 6, 5, 3), (2, 5, 9, 4, 5), (4, 8, 2, 11, 1)]


@pytest.mark.parametrize("bias_kind", ["shared", "per_sample", "none"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", DW_SHAPES)
def test_dynamic_depthwise_conv_matches_reference(shape, channels_last, bias_kind):
    B, C, H, W, k = shape
    g = torch.Generator().manual_seed(B * 100 + C)
    x = torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    if channels_last:  # the model passes a channels-last view of (B, H, W, C) tokens
        x = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    x.requires_grad_()
    kernels = torch.randn(B, C, k, k, generator=g, dtype=torch.float64, requires_grad=True)
    bias = {"shared": torch.randn(C, generator=g, dtype=torch.float64, requires_grad=True),
            "per_sample": torch.randn(B, C, generator=g, dtype=torch.float64, requires_grad=True),
            "none": None}[bias_kind]
    inputs = [t for t in (x, kernels, bias) if t is not None]
    out = dynamic_depthwise_conv2d(x, kernels, bias)
    ref = dynamic_depthwise_conv2d_reference(x, kernels, bias)
    assert out.shape == (B, C, H, W)
    # a single conv per output element, same summation order up to the kernel's blocking
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(_grads(out, inputs), _grads(ref, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_dynamic_depthwise_conv_reference_is_a_per_sample_conv():
    # the reference itself against a hand-written 3×3 'same' correlation
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    k = torch.randn(2, 3, 3, 3, dtype=torch.float64)
    xp = F.pad(x, (1, 1, 1, 1))
    manual = sum(xp[:, :, u:u + 4, v:v + 5] * k[:, :, u, v, None, None] for u in range(3) for v in range(3))
    torch.testing.assert_close(dynamic_depthwise_conv2d_reference(x, k), manual, rtol=1e-13, atol=1e-13)


def test_dynamic_depthwise_conv_gradcheck():
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(dynamic_depthwise_conv2d, (x, k, b))


def test_dynamic_depthwise_conv_bf16_finite():
    x = (torch.randn(2, 8, 6, 6) * 100).bfloat16().requires_grad_()
    k = torch.randn(2, 8, 3, 3).bfloat16().requires_grad_()
    out = dynamic_depthwise_conv2d(x, k, torch.zeros(8, dtype=torch.bfloat16))
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all() and torch.isfinite(k.grad).all()


def test_dynamic_depthwise_conv_bad_input():
    x = torch.randn(2, 3, 5, 5)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        dynamic_depthwise_conv2d(x[0], torch.randn(2, 3, 3, 3))
    with pytest.raises(ValueError, match="kernels must be"):
        dynamic_depthwise_conv2d(x, torch.randn(3, 3, 3))
    with pytest.raises(ValueError, match="kernels must be"):
        dynamic_depthwise_conv2d(x, torch.randn(1, 3, 3, 3))
    with pytest.raises(ValueError, match="odd"):
        dynamic_depthwise_conv2d(x, torch.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match="bias"):
        dynamic_depthwise_conv2d(x, torch.randn(2, 3, 3, 3), torch.randn(4))


def test_normalisations():
    k = torch.randn(2, 3, 3, 3, dtype=torch.float64) * 10
    nk = normalize_kernels(k)
    manual = k / (k.pow(2).sum(dim=(-2, -1), keepdim=True).sqrt() + 1)
    torch.testing.assert_close(nk, manual, rtol=1e-14, atol=1e-14)
    assert (nk.flatten(2).norm(dim=-1) < 1).all()
    d = torch.randn(2, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(normalize_columns(d), d / (d.norm(dim=-2, keepdim=True) + 1), rtol=1e-14, atol=1e-14)
    # bf16 values whose squares overflow bf16's... (they do not: same exponent range as fp32) but
    # whose sum of squares loses the +1 in bf16: the float32 computation keeps it.
    tiny = torch.full((1, 4, 1), 1e-3, dtype=torch.bfloat16)
    assert normalize_columns(tiny).dtype == torch.bfloat16
    torch.testing.assert_close(normalize_columns(tiny).float(), tiny.float() / (2e-3 + 1), rtol=1e-2, atol=0)
    with pytest.raises(ValueError):
        normalize_kernels(torch.randn(3))
