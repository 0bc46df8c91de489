"""LaplacianFormer mixer: dense reference, normalisation, landmarks, RoPE, numerics, memory, timm use."""
import math

import pytest
import torch
import torch.nn.functional as F
from _c_paths import assert_training_falls_back, assert_training_matches_composed, use_composed
from _memory import peak_memory_mib
from timm.models.vision_transformer import VisionTransformer

import vitmix
from vitmix import mixers
from vitmix.mixers.laplacian import LaplacianAttention, rope_2d
from vitmix.ops.newton import newton_schulz_reference


# ---------------------------------------------------------------------------------------------
# dense O(N²) reference (explicit N×N matrix, injective map applied to it directly)
# ---------------------------------------------------------------------------------------------
def _lap(a, b, lam):
    return torch.exp(-torch.cdist(a, b, p=1) / lam)


def laplacian_reference(layer, x, prefix, H, W, inverse="newton"):
    b, n, c = x.shape
    h, d = layer.num_heads, layer.head_dim
    g = layer.value_gain            # the value rows of qkv and proj's weight are used as g·W
    gain = torch.cat([torch.ones(2 * c), torch.full((c,), g)]).to(x.dtype)
    bias = None if layer.qkv.bias is None else layer.qkv.bias * gain
    q, k, v = F.linear(x, layer.qkv.weight * gain[:, None], bias).reshape(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    if layer.rope:
        q, k = rope_2d(q, prefix, H, W, layer.rope_base), rope_2d(k, prefix, H, W, layer.rope_base)

    def pool(t, learnt):
        g = t[:, :, prefix:].reshape(b * h, H, W, d).permute(0, 3, 1, 2)
        (mh, mw), s = layer.landmark_count(H, W), layer.landmark_stride
        if layer._floors_a_remainder(H, W):             # official floor mode: the border remainder left out
            g = g[..., : mh * s, : mw * s]
        if layer.landmarks == "avgpool":
            g = F.adaptive_avg_pool2d(g, (mh, mw))
        else:   # SOFT's module on (mh·s, mw·s) windows: s×s stride-s conv, then LayerNorm and GELU
            g = F.conv2d(F.adaptive_avg_pool2d(g, (mh * s, mw * s)), learnt.conv.weight, stride=s)
        t = g.flatten(2).transpose(1, 2).reshape(b, h, -1, d)
        if layer.landmarks == "conv":
            t = F.gelu(F.layer_norm(t, (d,), learnt.norm.weight, learnt.norm.bias))
        return t * layer.qk_scale

    learnt = layer.landmarks == "conv"
    qt, kt = pool(q, learnt and layer.q_landmarks), pool(k, learnt and layer.k_landmarks)
    q, k = q * layer.qk_scale, k * layer.qk_scale
    wm = _lap(qt, kt, layer.lam)
    if inverse == "exact":
        M = torch.linalg.inv(wm + layer.newton_eps * torch.eye(wm.shape[-1], dtype=wm.dtype))
    else:
        M = newton_schulz_reference(wm, iters=layer.newton_iters, eps=layer.newton_eps, symmetric=False,
                                    alpha=layer.newton_alpha)
    G = _lap(q, kt, layer.lam) @ M @ _lap(qt, k, layer.lam)          # N×N
    if layer.normalize:
        R = G - G.mean(-1, keepdim=True)                              # centre each query row
        sd = (R.var(-2, unbiased=False, keepdim=True) + layer.norm_eps).sqrt()  # per-key column
        mean_weight = 1.0 if layer.mean_weight is None else layer.mean_weight.view(1, -1, 1, 1)
        G = R / sd / (n if layer.norm_scale == "tokens" else 1) + mean_weight / n  # default: whitened part / N
    out = G @ v
    if layer.conv_kernel:
        vg = v[:, :, prefix:].permute(0, 1, 3, 2).reshape(b, h * d, H, W)
        weight = layer.conv.weight
        if layer.conv_groups == "head":     # one filter per head = the same filter on each of its d channels
            weight = weight.repeat_interleave(d, dim=0)
        local = F.conv2d(vg, weight, layer.conv.bias, padding=layer.conv_kernel // 2, groups=c)
        out = out.clone()
        out[:, :, prefix:] += local.reshape(b, h, d, H * W).transpose(-1, -2)
    out = out.transpose(1, 2).reshape(b, n, c)
    return F.linear(out, layer.proj.weight * g, layer.proj.bias)


def _make(dim=48, heads=3, **opts):
    layer = mixers.create("laplacian", dim, heads, qkv_bias=True, **opts).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return layer


def _grads(fn, layer, x):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    out = fn(x)
    out.pow(2).sum().backward()
    return out.detach(), [x.grad] + [p.grad.clone() for p in layer.parameters()]


CASES = [  # (batch, prefix, H, W, options)
    (1, 0, 6, 10, {}),
    (2, 1, 6, 4, {"norm_scale": "none"}),
    (2, 1, 8, 8, {"landmark_stride": 4}),  # N >= 8m: landmarks from the pooled input, then projected
    (3, 1, 8, 6, {"normalize": False}),
    (2, 1, 9, 6, {"landmark_stride": 3, "rope": True}),
    (2, 0, 7, 5, {"num_landmarks": (3, 2), "lam": 2.0, "qk_scale": 0.5}),
    (1, 1, 4, 4, {"landmark_stride": 1, "conv_kernel": 5}),
    (2, 1, 5, 7, {"mean_weight": None}),    # the fixed map (default: a learnt weight per head, perturbed by _make)
    (2, 1, 6, 5, {"value_gain": 3.0}),      # the value path's parametrisation gain
    (2, 1, 6, 8, {"landmarks": "conv"}),    # SOFT's learnt landmark module on q and on k
    (1, 0, 7, 5, {"landmarks": "conv", "num_landmarks": (3, 2), "landmark_stride": 2}),   # windows pooled to 6×4
    (2, 1, 8, 8, {"landmarks": "conv", "landmark_stride": 4, "value_gain": 2.0}),       # N >= 8m: q, k convolved
]


@pytest.mark.parametrize("batch,prefix,H,W,opts", CASES)
def test_forward_matches_dense_reference(batch, prefix, H, W, opts):
    layer = _make(**opts)
    x = torch.randn(batch, prefix + H * W, 48, dtype=torch.float64)
    out = layer(x, hw=(H, W), num_prefix_tokens=prefix)
    # float64; the linear-time normaliser re-associates sums (variance via covariance), so allow
    # a few orders above machine epsilon
    torch.testing.assert_close(out, laplacian_reference(layer, x, prefix, H, W), rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("batch,prefix,H,W,opts", CASES)
def test_gradients_match_dense_reference(batch, prefix, H, W, opts):
    layer = _make(inverse="exact", **opts)
    x = torch.randn(batch, prefix + H * W, 48, dtype=torch.float64)
    out, g = _grads(lambda t: layer(t, hw=(H, W), num_prefix_tokens=prefix), layer, x)
    ref, g_ref = _grads(lambda t: laplacian_reference(layer, t, prefix, H, W, inverse="exact"), layer, x)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-9)
    for a, b in zip(g, g_ref):  # float64, rounding amplified by cond(W + εI)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("batch,prefix,H,W,opts", CASES)
def test_inference_in_one_c_call_matches_dense_reference(c_calls, batch, prefix, H, W, opts):
    """Without gradients the layer's token mixing is one C call wherever it covers the options (not the
    un-normalised ablation, not RoPE); it matches the dense O(N²) reference like the composed path
    (float64, sums re-associated: same tolerance as the forward test above)."""
    layer = _make(**opts)
    x = torch.randn(batch, prefix + H * W, 48, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x, hw=(H, W), num_prefix_tokens=prefix)
    covered = opts.get("normalize", True) and not opts.get("rope", False) and opts.get("landmarks") != "conv"
    assert c_calls["layer"] == int(covered)
    torch.testing.assert_close(out, laplacian_reference(layer, x, prefix, H, W), rtol=1e-8, atol=1e-9)



@pytest.mark.parametrize("opts", [{}, {"norm_scale": "sqrt"}, {"conv_kernel": 0}, {"num_landmarks": 9},
                                  {"mean_weight": None}, {"value_gain": 4.0}])
@pytest.mark.parametrize("batch,prefix,hw", [(1, 1, (14, 14)), (3, 4, (7, 9))])
def test_inference_in_one_c_call_matches_the_composed_path_float32(c_calls, monkeypatch, opts, batch, prefix, hw):
    """float32 at the leaderboard's shape and an odd one: the C call against the composed path (kernels
    summed directly vs by the C L1 kernel, then 10 Newton–Schulz rounds: measured ≤ 1.3e-5 of the output's
    scale, bound 5e-5)."""
    torch.manual_seed(3)
    layer = mixers.create("laplacian", 64, 2, hw=hw, num_prefix_tokens=prefix, **opts).eval()
    x = torch.randn(batch, prefix + hw[0] * hw[1], 64)
    with torch.no_grad():
        fused = layer(x)
    assert c_calls["layer"] == 1
    use_composed(monkeypatch, layer)
    with torch.no_grad():
        composed = layer(x)
    assert c_calls["layer"] == 1
    scale = composed.abs().max().item()
    torch.testing.assert_close(fused, composed, rtol=5e-5, atol=5e-5 * scale)


TRAIN_CASES = [  # (batch, prefix, H, W, dim, heads, options): odd grids, head dims on and off the vector width
    (1, 0, 6, 10, 48, 3, {}),
    (2, 1, 8, 8, 64, 2, {}),                                                   # the demo's grid: 16 landmarks
    (3, 2, 7, 5, 36, 3, {"num_landmarks": (3, 2)}),                            # head dim 12: channel tail
    (2, 1, 9, 9, 40, 2, {"conv_kernel": 5, "newton_alpha": "official"}),       # head dim 20
    (2, 1, 5, 7, 48, 3, {"mean_weight": None}),
    (2, 1, 6, 6, 48, 3, {"conv_kernel": 0, "norm_scale": "none"}),
    (1, 1, 14, 14, 64, 2, {"norm_scale": "sqrt", "landmark_stride": 4}),
    (2, 1, 6, 6, 48, 3, {"value_gain": 4.0}),
]



@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch,prefix,H,W,dim,heads,opts", TRAIN_CASES)
def test_training_in_one_c_call_each_way_matches_the_composed_path(c_calls, monkeypatch, dtype, batch, prefix, H, W,
                                                                    dim, heads, opts):
    """With gradients the layer's token mixing is one C call forward and one backward
    (:mod:`vitmix.mixers.fused.autograd`); output and every gradient (input, qkv, conv, mean weight, proj) match
    the composed path. float64: measured ≤ 2e-15 of each tensor's scale, bound 1e-11. float32: ≤ 1.2e-6,
    bound 2e-5 (sums in another order, amplified by the Newton–Schulz loop)."""
    torch.manual_seed(5)
    layer = _make(dim, heads, **opts).to(dtype)
    x = torch.randn(batch, prefix + H * W, dim, dtype=dtype)
    assert_training_matches_composed(c_calls, monkeypatch, layer, x, (H, W), prefix, "train")


def test_training_c_function_passes_gradcheck():
    """float64 gradcheck of the C forward/backward pair against finite differences. The backward is the
    implicit inverse derivative, exact where Newton–Schulz has converged: 60 steps here."""
    from vitmix.mixers.fused.autograd import laplacian_mix_train

    torch.manual_seed(0)
    b, prefix, h, w, heads, d = 2, 1, 4, 3, 2, 3
    c = heads * d
    y = (0.5 * torch.randn(b, prefix + h * w, 3 * c, dtype=torch.float64)).requires_grad_(True)
    conv_w = (0.3 * torch.randn(c, 1, 3, 3, dtype=torch.float64)).requires_grad_(True)
    conv_b = torch.randn(c, dtype=torch.float64, requires_grad=True)
    mean_w = torch.randn(heads, dtype=torch.float64, requires_grad=True)

    def fn(y, conv_w, conv_b, mean_w):
        return laplacian_mix_train(y, conv_w, conv_b, grid=(prefix, h, w), heads=heads, landmarks=(2, 2), lam=2.0,
                                   eps=0.1, iters=60, alpha="transpose", norm_eps=1e-3, contrast=0.5,
                                   mean_weight=mean_w)

    assert fn(y, conv_w, conv_b, mean_w) is not None
    assert torch.autograd.gradcheck(fn, (y, conv_w, conv_b, mean_w), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_training_without_the_library_runs_the_composed_path(c_calls, monkeypatch):
    """Fallback: where the C library is unavailable training runs the composed path, exactly its numbers."""
    torch.manual_seed(6)
    assert_training_falls_back(c_calls, monkeypatch, _make(48, 3), torch.randn(2, 1 + 36, 48, dtype=torch.float64),
                               (6, 6), 1, "train")


def test_structure_and_defaults():
    layer = mixers.create("laplacian", 128, 4)
    assert layer.qkv.weight.shape == (384, 128)            # separate Q, K, V projections
    assert layer.lam == 4.0 and layer.normalize and layer.landmark_stride == 2 and layer.norm_scale == "tokens"
    assert layer.norm_eps == 1e-3 and layer.newton_alpha == "transpose"   # the defaults that learned best
    assert layer.qk_scale == pytest.approx(32 ** -0.5)      # documented default input scaling
    assert layer.conv.weight.shape == (128, 1, 3, 3) and layer.conv.bias is not None  # per channel
    head = mixers.create("laplacian", 128, 4, conv_groups="head", conv_kernel=5)
    assert head.conv.weight.shape == (4, 1, 5, 5) and head.conv.bias is None
    assert not hasattr(mixers.create("laplacian", 128, 4, conv_kernel=0), "conv")
    normed = mixers.create("laplacian", 128, 4, qk_norm=True)
    assert isinstance(normed.q_norm, torch.nn.LayerNorm) and normed.q_norm.normalized_shape == (32,)
    assert layer.landmarks == "avgpool" and not hasattr(layer, "q_landmarks")   # pooled landmarks by default
    learnt = mixers.create("laplacian", 128, 4, landmarks="conv", landmark_stride=4)
    for module in (learnt.q_landmarks, learnt.k_landmarks):     # SOFT's module, one for q and one for k
        assert module.conv.weight.shape == (32, 32, 4, 4) and module.conv.bias is None
        assert module.norm.normalized_shape == (32,)


def test_learnt_landmarks_start_as_pooling_when_converted_from_softmax():
    """``vitmix.convert`` starts the landmark convs as r×r average pooling: the landmarks are then LayerNorm and
    GELU of the pooled q and k (the two have no neutral setting), whatever the conv's random initialisation was."""
    from timm.models.vision_transformer import Attention

    layer = mixers.create("laplacian", 48, 3, qkv_bias=True, landmarks="conv").double()
    layer.load_attention(Attention(48, 3, qkv_bias=True).double().state_dict())
    t = torch.randn(2, 3, 1 + 36, 16, dtype=torch.float64)
    pooled = F.avg_pool2d(t[:, :, 1:].reshape(6, 6, 6, 16).permute(0, 3, 1, 2), 2).flatten(2).transpose(1, 2)
    want = F.gelu(F.layer_norm(pooled.reshape(2, 3, 9, 16), (16,)))
    for module in (layer.q_landmarks, layer.k_landmarks):
        torch.testing.assert_close(module(t, (1, 6, 6), (3, 3)), want, rtol=1e-12, atol=1e-12)


def test_qk_norm_matches_reference_with_normed_inputs():
    layer = _make(qk_norm=True, norm_scale="none", mean_weight=None, num_prefix_tokens=0,
                  num_landmarks=None).eval()  # 2×2 pooling
    x = torch.randn(2, 64, 48, dtype=torch.float64)
    out = layer(x)
    b, n, h, d = 2, 64, 3, 16
    q, k, v = layer.qkv(x).reshape(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    q, k = layer.q_norm(q) * layer.qk_scale, layer.k_norm(k) * layer.qk_scale
    def pool(t):
        g = F.avg_pool2d(t.reshape(b * h, 8, 8, d).permute(0, 3, 1, 2), 2)
        return g.flatten(2).transpose(1, 2).reshape(b, h, -1, d)

    att = vitmix.ops.nystrom_attention_reference(q, k, v, pool(q), pool(k), kernel="laplacian",
                                                 normalization="injective", symmetric=False,
                                                 norm_eps=layer.norm_eps, alpha=layer.newton_alpha,
                                                 iters=layer.newton_iters)
    weight = layer.conv.weight
    if layer.conv_groups == "head":                 # the per-head filter on each of its channels
        weight = weight.repeat_interleave(d, dim=0)
    local = F.conv2d(v.permute(0, 1, 3, 2).reshape(b, h * d, 8, 8), weight, layer.conv.bias, padding=1,
                     groups=h * d)
    att = att + local.reshape(b, h, d, n).transpose(-1, -2)
    ref = layer.proj(att.transpose(1, 2).reshape(b, n, h * d))
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-9)


def test_attention_map_is_the_normalised_map_and_reproduces_the_layer():
    layer = _make(conv_kernel=0, norm_eps=1e-14)
    x = torch.randn(2, 1 + 36, 48, dtype=torch.float64)
    amap = layer.attention_map(x, hw=(6, 6), num_prefix_tokens=1)
    assert amap.shape == (2, 3, 37, 37)
    # injective map: R = Z - 1/N has rows centred before the per-key scaling, so every column of
    # R has unit (population) variance over the queries up to eps
    r = (amap - 1.0 / 37) * 37  # default norm_scale="tokens" divides the whitened part by N
    torch.testing.assert_close(r.var(-2, unbiased=False), torch.ones(2, 3, 37, dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)
    v = layer.qkv(x).reshape(2, 37, 3, 3, 16)[:, :, 2].transpose(1, 2)
    out = layer.proj((amap @ v).transpose(1, 2).reshape(2, 37, 48))
    torch.testing.assert_close(out, layer(x, hw=(6, 6), num_prefix_tokens=1), rtol=1e-8, atol=1e-9)


def test_all_tokens_as_landmarks_and_exact_inverse_give_exact_kernel_attention():
    layer = _make(landmark_stride=1, normalize=False, inverse="exact", newton_eps=0.0, conv_kernel=0,
                  num_prefix_tokens=0, num_landmarks=None)
    x = torch.randn(1, 25, 48, dtype=torch.float64)
    amap = layer.attention_map(x)
    q, k, _, _, _, _ = layer._project(x, (0, 5, 5))
    s = layer.qk_scale
    torch.testing.assert_close(amap, _lap(s * q, s * k, 4.0), rtol=1e-7, atol=1e-8)


def test_rope_encodes_relative_position():
    torch.manual_seed(0)
    d, H, W = 16, 5, 7
    q, k = torch.randn(1, 1, 1, d, dtype=torch.float64), torch.randn(1, 1, 1, d, dtype=torch.float64)
    grid_q, grid_k = q.expand(1, 1, H * W, d), k.expand(1, 1, H * W, d)
    rq, rk = rope_2d(grid_q, 0, H, W), rope_2d(grid_k, 0, H, W)
    dots = (rq[0, 0][:, None] * rk[0, 0][None]).sum(-1).reshape(H, W, H, W)
    # same offset (1, 2) from two different positions gives the same score
    torch.testing.assert_close(dots[0, 0, 1, 2], dots[3, 4, 4, 6])
    assert not torch.allclose(dots[0, 0, 1, 2], dots[0, 0, 2, 1])
    torch.testing.assert_close(rq.norm(dim=-1), grid_q.norm(dim=-1))  # a rotation
    cls = torch.randn(1, 1, 1 + H * W, d)
    assert torch.equal(rope_2d(cls, 1, H, W)[:, :, :1], cls[:, :, :1])  # prefix untouched


def test_rope_of_float64_tokens_rotates_by_float64_angles():
    """float32 angles would be off by ~1e-7 and limit a float64 model to float32 accuracy (the float64
    fingerprints of tests/models/test_fingerprints.py must agree across CPUs to 1e-9)."""
    d, H, W = 8, 3, 5
    out = rope_2d(torch.ones(1, 1, H * W, d, dtype=torch.float64), 0, H, W)[0, 0]
    quarter = d // 4
    for i in range(H * W):
        angles = [(i // W if j < quarter else i % W) * 100.0 ** (-(j % quarter) / quarter) for j in range(d // 2)]
        want = [math.cos(a) - math.sin(a) for a in angles] + [math.sin(a) + math.cos(a) for a in angles]
        assert out[i].tolist() == pytest.approx(want, rel=0, abs=1e-15)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="landmarks"):
        mixers.create("laplacian", 48, 3, landmarks="learnt")
    layer = mixers.create("laplacian", 48, 3, num_landmarks=None)   # stride-only landmarks
    with pytest.raises(ValueError, match="not divisible by landmark_stride=2"):
        layer(torch.randn(1, 1 + 7 * 8, 48), hw=(7, 8))
    assert mixers.create("laplacian", 48, 3)(torch.randn(1, 1 + 7 * 8, 48), hw=(7, 8)).shape == (1, 57, 48)
    with pytest.raises(ValueError, match="smaller than the 8x8=64 landmarks"):
        mixers.create("laplacian", 48, 3, num_landmarks=64)(torch.randn(1, 1 + 49, 48))
    with pytest.raises(ValueError, match="smaller than landmark_stride=8"):
        mixers.create("laplacian", 48, 3, landmark_stride=8)(torch.randn(1, 1 + 16, 48))
    with pytest.raises(ValueError, match="rope=True needs head_dim divisible by 4"):
        mixers.create("laplacian", 60, 6, rope=True)
    with pytest.raises(ValueError, match="lam"):
        mixers.create("laplacian", 48, 3, lam=0)
    with pytest.raises(ValueError, match="conv_groups"):
        mixers.create("laplacian", 48, 3, conv_groups="depthwise")
    with pytest.raises(ValueError, match="newton_alpha"):
        mixers.create("laplacian", 48, 3, newton_alpha="fast")
    with pytest.raises(ValueError, match="scale_norm"):
        mixers.create("laplacian", 48, 3, scale_norm=True)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        mixers.create("laplacian", 48, 5)
    with pytest.raises(ValueError, match="mean_weight=nan must be a finite number"):
        mixers.create("laplacian", 48, 3, mean_weight=float("nan"))
    for bad in (0, -2.0, float("inf"), "4"):
        with pytest.raises(ValueError, match="value_gain=.* must be a finite number > 0"):
            mixers.create("laplacian", 48, 3, value_gain=bad)


@pytest.mark.parametrize("landmarks", ["avgpool", "conv"])
def test_floor_mode_matches_reference_on_the_trimmed_landmarks(landmarks):
    layer = _make(grid_remainder="floor", num_landmarks=None, landmarks=landmarks)
    x = torch.randn(1, 7 * 5, 48, dtype=torch.float64)
    out = layer(x, hw=(7, 5))
    assert layer.landmark_count(7, 5) == (3, 2)
    torch.testing.assert_close(out, laplacian_reference(layer, x, 0, 7, 5), rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_is_a_clear_error(bad):
    layer = mixers.create("laplacian", 48, 3)
    x = torch.randn(1, 65, 48)
    x[0, 7, 0] = bad
    with pytest.raises(ValueError, match="contains NaN or Inf"):
        layer(x)


@pytest.mark.parametrize("opts", [{}, {"normalize": False, "rope": True}, {"num_landmarks": 9}])
def test_bf16_autocast_is_finite_forward_and_backward(opts):
    layer = mixers.create("laplacian", 64, 2, qkv_bias=True, **opts)
    x = (3 * torch.randn(2, 1 + 144, 64)).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    out.float().pow(2).mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_large_feature_values_do_not_diverge():
    # unscaled features give tiny kernel values (the case that broke the official α): stays finite
    layer = mixers.create("laplacian", 64, 2, qk_scale=1.0, num_prefix_tokens=0)
    out = layer(50 * torch.randn(1, 64, 64))
    assert torch.isfinite(out).all()


def test_whole_layer_memory_grows_linearly():
    layer = mixers.create("laplacian", 64, 2, num_landmarks=49, num_prefix_tokens=0)

    def step(side):
        def run():
            x = torch.randn(1, side * side, 64, requires_grad=True)
            layer(x).sum().backward()
        return run

    small = peak_memory_mib(step(64))    # N = 4096
    large = peak_memory_mib(step(128))   # N = 16384
    assert large <= 5 * small, (small, large)


def test_demo_model_with_laplacian_mixer():
    # the project's demo: vit_nano_patch4_32 (CLS + 8x8 grid, dim 128, 4 heads) inside stock timm
    model = vitmix.create_model("vit_nano_patch4_32", mixer="laplacian")
    assert isinstance(model, VisionTransformer)
    layer = model.blocks[0].attn
    # 16 landmarks on the 8x8 grid (one per 2x2 block): laplacian's 4x4 floor, although 9 would be within
    # exact attention's FLOPs at N = 64 (with 9 the demo learned 10-20 points slower mid-run)
    assert layer.landmark_count(8, 8) == (4, 4)
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10)
    logits.logsumexp(-1).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert math.isfinite(float(logits.detach().sum()))


def test_learnt_norm_scale_interpolates_the_fixed_scales():
    """norm_scale="learnt": a per-head exponent θ scales the whitened part by N^(θ-1), so θ = 0, ½, 1
    give exactly "tokens", "sqrt" and "none", and θ receives a gradient."""
    torch.manual_seed(0)
    x = torch.randn(2, 65, 48, dtype=torch.float64)
    learnt = _make(norm_scale="learnt").eval()
    for theta, fixed in ((0.0, "tokens"), (0.5, "sqrt"), (1.0, "none")):
        other = mixers.create("laplacian", 48, 3, qkv_bias=True, norm_scale=fixed).double().eval()
        other.load_state_dict({k: v for k, v in learnt.state_dict().items() if k != "scale_exponent"})
        with torch.no_grad():
            learnt.scale_exponent.fill_(theta)
        torch.testing.assert_close(learnt(x), other(x), rtol=1e-10, atol=1e-12)
    learnt(x).square().sum().backward()
    assert learnt.scale_exponent.grad is not None and learnt.scale_exponent.grad.abs().min() > 0


def test_fixed_map_checkpoint_loads_as_weight_one_and_learns():
    """A state dict of the fixed map (``mean_weight=None``, the default before 0.0) loads strictly into the
    default layer as a weight of 1 per head: the same outputs, and the weight receives a gradient."""
    torch.manual_seed(0)
    x = torch.randn(2, 65, 48, dtype=torch.float64)
    fixed = _make(mean_weight=None).eval()
    assert "mean_weight" not in fixed.state_dict()
    learnt = mixers.create("laplacian", 48, 3, qkv_bias=True).double().eval()
    learnt.load_state_dict(fixed.state_dict())
    assert torch.equal(learnt.mean_weight.detach(), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(learnt(x), fixed(x), rtol=1e-12, atol=1e-12)
    learnt(x).square().sum().backward()
    assert learnt.mean_weight.grad is not None and learnt.mean_weight.grad.abs().min() > 0


# ---------------------------------------------------------------------------------------------
# value_gain: the value path stored at 1/g of its effective weights (a training parametrisation)
# ---------------------------------------------------------------------------------------------
def test_value_gain_state_dicts_move_between_gains():
    """Weights saved at one gain load at any other (and from gain-1 layers, which is what ``vitmix.convert``'s
    teachers and old checkpoints hold) with the same outputs; ``stored_gain`` is saved only when g ≠ 1, and
    loading never changes the caller's tensors."""
    torch.manual_seed(0)
    x = torch.randn(2, 1 + 36, 48, dtype=torch.float64)
    plain = _make().eval()
    ref = plain(x, hw=(6, 6))
    assert not any("gain" in key for key in plain.state_dict())
    state, layers = plain.state_dict(), {}
    before = {key: value.clone() for key, value in state.items()}
    for g in (4.0, 0.5, 2.0):
        layers[g] = mixers.create("laplacian", 48, 3, qkv_bias=True, value_gain=g).double().eval()
        layers[g].load_state_dict(state)
        torch.testing.assert_close(layers[g](x, hw=(6, 6)), ref, rtol=1e-12, atol=1e-12)
        assert float(layers[g].stored_gain) == g
        assert torch.allclose(layers[g].proj.weight, plain.proj.weight / g)
        state = layers[g].state_dict()         # the next gain loads this one's
    assert all(torch.equal(before[key], value) for key, value in plain.state_dict().items())
    back = mixers.create("laplacian", 48, 3, qkv_bias=True).double().eval()
    back.load_state_dict(layers[2.0].state_dict())     # strict: the saved gain is dropped, the weights rescaled
    torch.testing.assert_close(back(x, hw=(6, 6)), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model,kwargs", [
    ("vit_nano_patch4_32", dict(mixer="laplacian", img_size=16, in_chans=1, num_classes=10, patch_size=2,
                                embed_dim=32, depth=2, num_heads=2)),           # timm's ViT init calls init_weights
    ("laplacianformer_nano", dict(img_size=32, num_classes=10)),                # vitmix's pyramid init
])
def test_value_gain_starts_from_the_same_function(model, kwargs):
    """The gain changes how Adam moves the value path, not the model at initialisation: the same seed gives
    the same logits at g = 1 and g = 4, with the value weights stored at 1/4."""
    x = torch.randn(2, kwargs.get("in_chans", 3), kwargs["img_size"], kwargs["img_size"])
    out = {}
    for g in (1.0, 4.0):
        torch.manual_seed(0)
        net = vitmix.create_model(model, mixer_options={"value_gain": g}, **kwargs).eval()
        with torch.no_grad():
            out[g] = net(x)
        layer = next(m for m in net.modules() if isinstance(m, LaplacianAttention))
        out[g, "proj"] = layer.proj.weight.detach().clone()
    torch.testing.assert_close(out[4.0], out[1.0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[4.0, "proj"] * 4, out[1.0, "proj"])


def test_value_gain_model_ema_follows_the_weights():
    """timm's ModelEmaV3 averages ``state_dict()`` tensors in place: they must be the layer's own parameters
    (the gain is stored in the parameters, not applied in a state-dict hook)."""
    from timm.utils import ModelEmaV3

    torch.manual_seed(0)
    layer = mixers.create("laplacian", 48, 3, value_gain=4.0)
    ema = ModelEmaV3(layer, decay=0.5)
    with torch.no_grad():
        layer.proj.weight.add_(1.0)
    ema.update(layer, step=100)
    torch.testing.assert_close(ema.module.proj.weight, layer.proj.weight - 0.5)
