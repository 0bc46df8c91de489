"""``preset=`` of the SOFT / SOFT-Norm / Fibottention mixers: a preset equals its explicit options, and
``preset="official"`` reproduces the official code (checked against references written here from
the official code, independent of vitmix's ops) where it departs from vitmix's defaults."""
import math
import random

import pytest
import torch
import torch.nn.functional as F

from vitmix import mixers
from vitmix.mixers.fibottention import FibottentionAttention
from vitmix.mixers.presets import FROM_PRESET
from vitmix.mixers.soft import SoftAttention, SoftNormAttention, newton_inverse_legacy
from vitmix.ops.fibonacci import fibonacci_offsets


def _pair(name, preset_opts, explicit_opts, dim=64, heads=2, seed=0, **common):
    """Two layers with the same weights: one built from a preset, one from explicit options."""
    torch.manual_seed(seed)
    a = mixers.create(name, dim, heads, **preset_opts, **common).double()
    torch.manual_seed(seed)
    b = mixers.create(name, dim, heads, **explicit_opts, **common).double()
    return a, b


def _spread_landmarks(layer):
    """Shrink the landmark LayerNorm gain: landmarks crowd together, so the landmark kernel A is
    ill-conditioned (as in trained models) and the Newton start matters."""
    with torch.no_grad():
        layer.Qnorm_act[0].weight.mul_(0.1)
    return layer


# ---------------------------------------------------------------------------------------------
# references written from the official fudan-zvg/SOFT code
# ---------------------------------------------------------------------------------------------
def _official_newton(a, iters=20):
    """``newton_inverse_kernel``: α = 1.8 / (max row sum of A)² per matrix, P = A + 0.01·I, V0 = αP."""
    alpha = 0.9 * 2 / a.sum(-1).max(-1)[0] ** 2
    p = a + 0.01 * torch.eye(a.shape[-1], dtype=a.dtype)
    v = alpha[..., None, None] * p
    for _ in range(iters):
        v = 2 * v - v @ p @ v
    return v


def _official_norm_newton(mat, iters=20):
    """``SoftmaxFreeNormAttentionKernel.newton_inv``: one α for the whole batch, halved (at most 10
    times) while the largest column sum of |I - P V| exceeds 1.01; no ε; autograd throughout."""
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype)
    alpha = 2 / (torch.max(torch.sum(mat, dim=-1)) ** 2)
    v = alpha * mat
    pnorm = torch.max(torch.sum(torch.abs(eye - mat @ v), dim=-2))
    tries = 0
    while pnorm > 1.01 and tries < 10:
        alpha = alpha * 0.5
        v = alpha * mat
        pnorm = torch.max(torch.sum(torch.abs(eye - mat @ v), dim=-2))
        tries += 1
    for _ in range(iters):
        v = 2 * v - v @ mat @ v
    return v


def _gaussian(x, y):  # exp(-||x - y||² / 2), the official subtraction kernel followed by exp(-·/2)
    return torch.exp(-((x.unsqueeze(-2) - y.unsqueeze(-3)) ** 2).sum(-1) / 2)


def official_soft(layer, x, H, W, norm=False):
    """``SoftmaxFreeAttention.forward`` (ratio > 1) on an H×W grid without prefix tokens."""
    b, n, c = x.shape
    h, d, s = layer.num_heads, layer.head_dim, layer.landmark_stride
    q = layer.W_q(x).reshape(b, n, h, d).transpose(1, 2) / math.sqrt(math.sqrt(d))
    v = layer.W_v(x).reshape(b, n, h, d).transpose(1, 2)
    lm = F.conv2d(q.reshape(b * h, H, W, d).permute(0, 3, 1, 2), layer.Qlandmark_op.weight, stride=s)
    lm = layer.Qnorm_act(lm.flatten(2).transpose(1, 2).reshape(b, h, -1, d))   # the conv floors odd grids
    k1, a = _gaussian(q, lm), _gaussian(lm, lm)
    if norm:
        dsym = 1 / a.sum(-1, keepdim=True).sqrt()
        inv = dsym * _official_norm_newton(a) * dsym.transpose(-1, -2)
    else:
        inv = _official_newton(a)
    out = (k1 @ inv) @ (k1.transpose(-1, -2) @ v)
    k = layer.conv.weight.shape[-1]
    local = F.conv2d(v.reshape(b, h, H, W, d).permute(0, 4, 1, 2, 3).reshape(b * d, h, H, W), layer.conv.weight,
                     padding=k // 2, groups=h)
    out = out + local.reshape(b, d, h, H, W).flatten(3).permute(0, 2, 3, 1)
    return layer.ff(out.transpose(1, 2).reshape(b, n, c))


# ---------------------------------------------------------------------------------------------
# SOFT / SOFT-Norm
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["soft", "soft_norm"])
def test_soft_preset_equals_its_explicit_options(name):
    cls = mixers.get_mixer_class(name)
    for preset, values in cls.presets.items():
        a, b = _pair(name, dict(preset=preset), dict(values), landmark_stride=4, conv_kernel=3, qkv_bias=True)
        assert {k: getattr(a, k) for k in ("newton_eps", "newton_alpha", "inverse", "grid_remainder")} == \
            {k: getattr(b, k) for k in ("newton_eps", "newton_alpha", "inverse", "grid_remainder")}
        assert a.landmark_hw == b.landmark_hw and a.preset == preset and b.preset == "default"
        x = torch.randn(2, 10 * 10, 64, dtype=torch.float64)     # 10×10: not divisible by the stride
        torch.testing.assert_close(a(x, hw=(10, 10)), b(x, hw=(10, 10)), rtol=0, atol=0)


def test_soft_presets_name_the_official_departures():
    assert SoftAttention.presets["official"] == dict(num_landmarks=None, newton_eps=0.01, newton_alpha="official",
                                                     inverse="newton", grid_remainder="floor")
    assert SoftNormAttention.presets["official"] == dict(num_landmarks=None, newton_eps=0.0, newton_alpha="official",
                                                         inverse="newton_legacy", grid_remainder="floor")
    for cls in (SoftAttention, SoftNormAttention):
        layer = cls(64, 2)
        assert (layer.landmark_hw, layer.newton_alpha, layer.inverse, layer.newton_eps) == ("auto", "safe", "newton",
                                                                                             0.01)


@pytest.mark.parametrize("hw", [(8, 8), (9, 11)])
def test_official_soft_matches_the_official_code(hw):
    """Forward in float64 against the official formula (α from A, floored landmarks); the backward is
    the implicit inverse derivative in both (tested in tests/ops)."""
    torch.manual_seed(1)
    layer = _spread_landmarks(mixers.create("soft", 64, 2, qkv_bias=True, landmark_stride=2, conv_kernel=3,
                                            preset="official").double())
    x = torch.randn(2, hw[0] * hw[1], 64, dtype=torch.float64)
    # float64 rounding only, through 20 Newton steps (self-correcting on converged directions)
    torch.testing.assert_close(layer(x, hw=hw), official_soft(layer, x, *hw), rtol=1e-9, atol=1e-11)


def test_official_soft_differs_from_default_where_the_spec_says():
    torch.manual_seed(2)
    default = _spread_landmarks(mixers.create("soft", 64, 2, qkv_bias=True, landmark_stride=2,
                                              num_landmarks=None).double())
    official = mixers.create("soft", 64, 2, qkv_bias=True, landmark_stride=2, preset="official").double()
    official.load_state_dict(default.state_dict())
    # Newton start: same landmarks (8×8 grid, stride 2 → 4×4 either way), different α → outputs move
    # by ~1e-6, far above float64 rounding (1e-15)
    x = torch.randn(2, 64, 64, dtype=torch.float64)
    assert default.landmark_count(8, 8) == official.landmark_count(8, 8) == (4, 4)
    assert (default(x, hw=(8, 8)) - official(x, hw=(8, 8))).abs().max() > 1e-9
    # landmark count: capped at 7×7 by default (and by exact attention's cost on small grids: 3×3 on
    # 8×8 at head dim 32), growing with the grid officially
    auto = mixers.create("soft", 64, 2, landmark_stride=2)
    assert auto.landmark_count(20, 20) == (7, 7) and official.landmark_count(20, 20) == (10, 10)
    assert auto.landmark_count(8, 8) == (3, 3)
    # odd grids with stride-only landmarks: a ValueError by default, floored officially
    assert official.landmark_count(9, 9) == (4, 4)
    with pytest.raises(ValueError, match="grid_remainder='floor'"):
        SoftAttention(64, 2, landmark_stride=2, num_landmarks=None).landmark_count(9, 9)


def test_official_soft_norm_matches_the_official_code_forward_and_gradients():
    """SOFT-Norm's official kernel: D^(-1/2)·NS(A)·D^(-1/2) with the original batch-global,
    backtracking, ε-free iteration; autograd through it in both, so every gradient must agree."""
    torch.manual_seed(3)
    layer = _spread_landmarks(mixers.create("soft_norm", 64, 2, qkv_bias=True, landmark_stride=2, conv_kernel=3,
                                            preset="official").double())
    x = torch.randn(3, 9 * 11, 64, dtype=torch.float64)
    cot = torch.randn(3, 9 * 11, 64, dtype=torch.float64)
    grads = []
    for fn in (lambda t: layer(t, hw=(9, 11)), lambda t: official_soft(layer, t, 9, 11, norm=True)):
        xi = x.clone().requires_grad_(True)
        layer.zero_grad()
        out = fn(xi)
        (out * cot).sum().backward()
        grads.append([out.detach(), xi.grad] + [p.grad.clone() for p in layer.parameters()])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_official_soft_norm_is_batch_coupled_like_the_official_code():
    """One α for the whole batch: a sample's output depends on the other samples (the default preset's
    per-matrix start does not)."""
    torch.manual_seed(4)
    x = torch.randn(2, 64, 64, dtype=torch.float64)
    x[1] = x[1, :1] + 0.05 * x[1]                    # near-identical tokens: crowded landmarks, larger row sums
    for preset, coupled in (("official", True), ("default", False)):
        torch.manual_seed(5)
        layer = _spread_landmarks(mixers.create("soft_norm", 64, 2, landmark_stride=2, preset=preset).double())
        alone, batched = layer(x[:1], hw=(8, 8)), layer(x, hw=(8, 8))[:1]
        assert ((alone - batched).abs().max() > 1e-9) == coupled


def test_newton_inverse_legacy_value_gradient_and_halving():
    torch.manual_seed(6)
    pts = torch.randn(2, 3, 9, 4, dtype=torch.float64) * 0.3             # crowded points: A near all-ones
    a = _gaussian(pts, pts).requires_grad_(True)
    cot = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    ours = newton_inverse_legacy(a, 20)
    want = _official_norm_newton(a, 20)
    g_ours, = torch.autograd.grad((ours * cot).sum(), a)
    g_want, = torch.autograd.grad((want * cot).sum(), a)
    torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_ours, g_want, rtol=1e-8, atol=1e-10)
    # the backtracking must have halved α here: the plain α = 2/‖A‖∞² start gives another result
    p = a.detach()
    v = 2 / p.sum(-1).max() ** 2 * p
    for _ in range(20):
        v = 2 * v - v @ p @ v
    assert (v - ours.detach()).abs().max() > 1e-6
    # ε shifts the matrix being inverted (P = A + εI)
    shifted = newton_inverse_legacy(p, 20, eps=0.5)
    torch.testing.assert_close(shifted, newton_inverse_legacy(p + 0.5 * torch.eye(9, dtype=p.dtype), 20))


def test_explicit_options_override_the_preset_and_bad_presets_are_named():
    layer = SoftAttention(64, 2, preset="official", newton_alpha="safe", num_landmarks="auto")
    assert layer.newton_alpha == "safe" and layer.landmark_hw == "auto" and layer.grid_remainder == "floor"
    assert repr(FROM_PRESET) == "<preset>"
    with pytest.raises(ValueError, match="unknown preset 'oficial'.*Did you mean: official"):
        SoftAttention(64, 2, preset="oficial")
    with pytest.raises(ValueError, match="inverse='newtn'"):
        SoftAttention(64, 2, inverse="newtn")
    with pytest.raises(ValueError, match="newton_iters"):
        SoftNormAttention(64, 2, preset="official", newton_iters=0)


# ---------------------------------------------------------------------------------------------
# Fibottention
# ---------------------------------------------------------------------------------------------
def test_fibottention_preset_equals_its_explicit_options_and_differs_from_default():
    x = torch.randn(2, 1 + 64, 64, dtype=torch.float64)
    outs = {}
    for preset, values in FibottentionAttention.presets.items():
        a, b = _pair("fibottention", dict(preset=preset), dict(values), heads=4, layer_idx=3, qkv_bias=True)
        assert (a.mode, a.shuffle, a.shuffle_per_layer) == (b.mode, b.shuffle, b.shuffle_per_layer)
        assert a.head_offsets(64) == b.head_offsets(64)
        outs[preset] = a(x, num_prefix_tokens=1)
        torch.testing.assert_close(outs[preset], b(x, num_prefix_tokens=1), rtol=0, atol=0)
    # multiplicative official mask (and another head order) vs true sparse attention
    assert (outs["official"] - outs["default"]).abs().max() > 1e-3


def test_fibottention_official_head_order_is_layer_zeros_python_shuffle_in_every_layer():
    """The official image code builds its mask once, in layer 0, and reuses it in all layers."""
    n, heads = 196, 12
    rows = fibonacci_offsets(n, heads, shuffle="none")
    order = list(range(heads))
    random.seed(0)
    random.shuffle(order)
    expected = [rows[i] for i in order]
    for layer_idx in (0, 5, 11):
        layer = FibottentionAttention(96, heads, preset="official", layer_idx=layer_idx)
        assert layer.head_offsets(n) == expected
    # the individual switches: Python's order per layer, and vitmix's stable per-layer default
    per_layer = FibottentionAttention(96, heads, shuffle="official", layer_idx=5)
    order5 = list(range(heads))
    random.seed(5)
    random.shuffle(order5)
    assert per_layer.head_offsets(n) == [rows[i] for i in order5] != expected
    assert FibottentionAttention(96, heads, layer_idx=5).head_offsets(n) != per_layer.head_offsets(n)
    with pytest.raises(ValueError, match="shuffle_per_layer must be True or False"):
        FibottentionAttention(96, heads, shuffle_per_layer="no")
