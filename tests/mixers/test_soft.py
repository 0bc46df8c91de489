"""SOFT / SOFT-Norm mixers: official behaviour, dense reference, landmark modes, numerics, memory."""
import math

import pytest
import torch
import torch.nn.functional as F
from _c_paths import assert_training_falls_back, assert_training_matches_composed, use_composed
from _memory import peak_memory_mib

import vitmix  # noqa: F401
from vitmix import mixers
from vitmix.mixers.soft import SoftAttention, SoftNormAttention
from vitmix.ops.newton import newton_schulz_reference


# ---------------------------------------------------------------------------------------------
# dense O(N²) reference written from the official code, independent of the mixer's code path
# ---------------------------------------------------------------------------------------------
def _gauss(a, b):
    return torch.exp(-torch.cdist(a, b).square() / 2)


def soft_reference(layer, x, prefix, H, W, inverse="newton"):
    """Full N×N SOFT attention of ``layer`` (per-head loops make the weight sharing explicit)."""
    b, n, c = x.shape
    h, d, s = layer.num_heads, layer.head_dim, layer.landmark_stride
    q = F.linear(x, layer.W_q.weight, layer.W_q.bias).reshape(b, n, h, d).transpose(1, 2)
    q = q / math.sqrt(math.sqrt(d))                                # Q <- Q / d^(1/4)
    v = F.linear(x, layer.W_v.weight, layer.W_v.bias).reshape(b, n, h, d).transpose(1, 2)
    grid = q[:, :, prefix:].reshape(b, h, H, W, d)
    lms = []
    for i in range(h):  # one conv shared by every head
        g = grid[:, i].permute(0, 3, 1, 2)
        if layer.landmarks == "conv":
            lm = F.conv2d(g, layer.Qlandmark_op.weight, stride=s)
        else:
            lm = F.avg_pool2d(g, s)
        lms.append(lm.flatten(2).transpose(1, 2))
    lm = torch.stack(lms, dim=1)
    if layer.landmarks == "conv":
        ln = layer.Qnorm_act[0]
        lm = F.gelu(F.layer_norm(lm, (d,), ln.weight, ln.bias, ln.eps))
    k1 = _gauss(q, lm)                       # keys are the queries: K(Q, L), landmarks tied too
    a = _gauss(lm, lm)
    if inverse == "exact":
        inv = torch.linalg.inv(a + 0.01 * torch.eye(a.shape[-1], dtype=a.dtype))
    else:
        inv = newton_schulz_reference(a, iters=layer.newton_iters, eps=layer.newton_eps, symmetric=True)
    if layer.normalization == "soft_norm":
        dm = a.sum(-1).rsqrt()
        inv = dm[..., :, None] * inv * dm[..., None, :]
    out = (k1 @ inv @ k1.transpose(-1, -2)) @ v  # the dense N×N matrix
    if layer.conv_kernel:
        k = layer.conv_kernel
        local = []
        for i in range(h):  # one spatial filter per head, shared by the head's d channels
            vg = v[:, i, prefix:].transpose(1, 2).reshape(b * d, 1, H, W)
            lc = F.conv2d(vg, layer.conv.weight[i:i + 1], padding=k // 2)
            local.append(lc.reshape(b, d, H * W).transpose(1, 2))
        out = out.clone()
        out[:, :, prefix:] += torch.stack(local, dim=1)
    out = out.transpose(1, 2).reshape(b, n, c)
    return F.linear(out, layer.ff.weight, layer.ff.bias)


def _make(name="soft", dim=48, heads=3, **opts):
    opts.setdefault("num_landmarks", None)   # one landmark per stride block, as soft_reference pools
    layer = mixers.create(name, dim, heads, qkv_bias=True, **opts).double()
    with torch.no_grad():  # non-trivial LayerNorm affine so the reference checks it is used
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return layer


def _grads(fn, layer, x):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    out = fn(x)
    out.pow(2).sum().backward()
    return out.detach(), [x.grad] + [p.grad.clone() for p in layer.parameters()]


CASES = [  # (name, batch, prefix, H, W, options)
    ("soft", 1, 0, 6, 10, {}),
    ("soft", 3, 1, 8, 6, {"conv_kernel": 5}),
    ("soft", 2, 0, 9, 12, {"landmark_stride": 3, "landmarks": "avgpool"}),
    ("soft_norm", 2, 1, 6, 10, {}),
    ("soft_norm", 1, 0, 8, 8, {"landmarks": "avgpool", "conv_kernel": 0}),
]


@pytest.mark.parametrize("name,batch,prefix,H,W,opts", CASES)
def test_forward_matches_dense_reference(name, batch, prefix, H, W, opts):
    layer = _make(name, **opts)
    x = torch.randn(batch, prefix + H * W, 48, dtype=torch.float64)
    out = layer(x, hw=(H, W), num_prefix_tokens=prefix)
    ref = soft_reference(layer, x, prefix, H, W)
    # float64: only rounding differs (GEMM-expanded vs cdist distances, association order)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name,batch,prefix,H,W,opts", CASES)
def test_gradients_match_dense_reference(name, batch, prefix, H, W, opts):
    # with the exact inverse both sides differentiate the same function (the Newton path's
    # implicit backward is tested in tests/ops against an exact inverse)
    layer = _make(name, inverse="exact", **opts)
    x = torch.randn(batch, prefix + H * W, 48, dtype=torch.float64)
    out, g = _grads(lambda t: layer(t, hw=(H, W), num_prefix_tokens=prefix), layer, x)
    ref, g_ref = _grads(lambda t: soft_reference(layer, t, prefix, H, W, inverse="exact"), layer, x)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    for a, b in zip(g, g_ref):  # rounding amplified by cond(A + 0.01 I) <= ~1e4
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name,batch,prefix,H,W,opts", CASES)
def test_inference_in_one_c_call_matches_dense_reference(c_calls, name, batch, prefix, H, W, opts):
    """Without gradients the layer's token mixing is one C call (landmark conv, LayerNorm and GELU
    included); it matches the dense reference like the composed path (float64)."""
    layer = _make(name, **opts)
    x = torch.randn(batch, prefix + H * W, 48, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x, hw=(H, W), num_prefix_tokens=prefix)
    assert c_calls["soft"] == 1
    torch.testing.assert_close(out, soft_reference(layer, x, prefix, H, W), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["soft", "soft_norm"])
@pytest.mark.parametrize("opts", [{}, {"landmarks": "avgpool"}, {"conv_kernel": 0}, {"preset": "official"},
                                  {"conv_kernel": 5, "num_landmarks": 9}])
@pytest.mark.parametrize("batch,prefix,hw", [(1, 1, (14, 14)), (3, 4, (7, 9))])
def test_inference_in_one_c_call_matches_the_composed_path(c_calls, monkeypatch, name, opts, batch, prefix, hw):
    """Defaults (adaptive pooling before the landmark conv), average pooling, presets and odd grids with
    registers, against the composed path (the layer's C paths off): float64 to 1e-12 of the scale, float32
    to 2e-5 (kernels summed directly vs the GEMM expansion; measured ≤ 5.7e-6). The official SOFT-Norm uses
    the legacy inverse, which has no C form: composed, counted 0."""
    torch.manual_seed(5)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        layer = mixers.create(name, 64, 2, hw=hw, num_prefix_tokens=prefix, **opts).to(dtype).eval()
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(batch, prefix + hw[0] * hw[1], 64, dtype=dtype)
        with monkeypatch.context() as patch, torch.no_grad():
            use_composed(patch, layer)
            composed = layer(x)
        before = c_calls["soft"]
        with torch.no_grad():
            fused = layer(x)
        legacy = name == "soft_norm" and opts.get("preset") == "official"
        assert c_calls["soft"] == before + (0 if legacy else 1)
        scale = composed.abs().max().item()
        torch.testing.assert_close(fused, composed, rtol=tol, atol=tol * scale)



TRAIN_CASES = [  # (name, batch, prefix, H, W, dim, heads, options): odd grids, head dims on and off the vector width
    ("soft", 2, 1, 8, 8, 64, 2, {}),                                                 # the demo's grid: 16 landmarks
    ("soft", 1, 0, 6, 10, 48, 3, {}),
    ("soft", 3, 2, 7, 5, 36, 3, {"num_landmarks": (3, 2)}),                          # head dim 12: channel tail
    ("soft", 2, 1, 9, 9, 40, 2, {"conv_kernel": 5, "newton_alpha": "official"}),     # head dim 20
    ("soft", 2, 1, 7, 7, 48, 3, {"landmarks": "avgpool", "num_landmarks": 4}),       # adaptive windows
    ("soft", 2, 1, 14, 14, 64, 2, {"preset": "official", "landmark_stride": 4}),     # floored remainder
    ("soft_norm", 2, 1, 8, 8, 64, 2, {}),
    ("soft_norm", 2, 0, 6, 6, 48, 3, {"landmarks": "avgpool", "conv_kernel": 0}),   # stride tiles
    ("soft_norm", 1, 1, 14, 14, 64, 2, {"conv_kernel": 9}),
]



@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,batch,prefix,H,W,dim,heads,opts", TRAIN_CASES)
def test_training_in_one_c_call_each_way_matches_the_composed_path(c_calls, monkeypatch, dtype, name, batch, prefix,
                                                                    H, W, dim, heads, opts):
    """With gradients the layer's token mixing is one C call forward and one backward
    (:func:`vitmix.mixers.fused.autograd.soft_mix_train`); output and every gradient (input, W_q, W_v, landmark
    conv, LayerNorm, local filter, ff) match the composed path. float64: measured ≤ 1.2e-14 of each tensor's
    scale, bound 1e-11. float32: ≤ 3.2e-6, bound 2e-5 (sums in another order, amplified by Newton–Schulz)."""
    torch.manual_seed(5)
    layer = mixers.create(name, dim, heads, **opts).to(dtype)
    with torch.no_grad():               # off the initial values (LayerNorm's affine at 1 and 0, filter at 0)
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(batch, prefix + H * W, dim, dtype=dtype)
    assert_training_matches_composed(c_calls, monkeypatch, layer, x, (H, W), prefix, "soft_train")


@pytest.mark.parametrize("normalization,conv_landmarks,pool_first", [(None, True, True), ("soft_norm", True, False),
                                                                     (None, False, False), ("soft_norm", False, True)])
def test_training_c_function_passes_gradcheck(normalization, conv_landmarks, pool_first):
    """float64 gradcheck of the C forward/backward pair against finite differences, for both landmark modules
    and both grid rules. The backward is the implicit inverse derivative, exact where Newton–Schulz has
    converged: 60 steps here."""
    from vitmix.mixers.fused.autograd import soft_mix_train

    torch.manual_seed(0)
    b, prefix, h, w, heads, d, s = 2, 1, 5, 4, 2, 3, 2
    c = heads * d

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, dtype=torch.float64)).requires_grad_(True)
    qp, vp = rand(b, prefix + h * w, c, scale=0.7), rand(b, prefix + h * w, c)
    lm_w, ln_w, ln_b = rand(d, d, s, s, scale=0.4), rand(d), rand(d, scale=0.2)
    conv_w = rand(heads, 1, 3, 3, scale=0.3)
    inputs = (qp, vp, lm_w, ln_w, ln_b, conv_w) if conv_landmarks else (qp, vp, conv_w)

    def fn(*args):
        if conv_landmarks:
            q, v, lw, nw, nb, cw = args
            lm, norm = lw, (nw, nb, 1e-5)
        else:
            (q, v, cw), lm, norm = args, None, None
        return soft_mix_train(q, v, lm, norm, cw, grid=(prefix, h, w), heads=heads, landmarks=(2, 2), stride=s,
                              pool_first=pool_first, scale=0.8, eps=0.1, iters=60, alpha="safe",
                              normalization=normalization)

    assert fn(*inputs) is not None
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["soft", "soft_norm"])
def test_training_without_the_library_runs_the_composed_path(c_calls, monkeypatch, name):
    """Fallback: where the C library is unavailable training runs the composed path, exactly its numbers."""
    torch.manual_seed(6)
    layer = mixers.create(name, 48, 3).double()
    assert_training_falls_back(c_calls, monkeypatch, layer, torch.randn(2, 1 + 36, 48, dtype=torch.float64), (6, 6),
                               1, "soft_train")


def test_official_structure_tied_qk_and_per_head_conv():
    layer = mixers.create("soft", 96, 3, qkv_bias=True, landmark_stride=4, conv_kernel=9)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"W_q.weight", "W_q.bias", "W_v.weight", "W_v.bias", "Qlandmark_op.weight",
                     "Qnorm_act.0.weight", "Qnorm_act.0.bias", "conv.weight", "ff.weight", "ff.bias"}
    assert not any("k" == n.split(".")[0][-1] for n in names)  # no key projection: K = Q
    assert layer.Qlandmark_op.weight.shape == (32, 32, 4, 4)   # d→d, shared by the heads
    assert layer.Qlandmark_op.stride == (4, 4) and layer.Qlandmark_op.bias is None
    assert layer.conv.weight.shape == (3, 1, 9, 9) and layer.conv.groups == 3  # one filter per head
    assert layer.scale == pytest.approx(32 ** -0.25)
    assert isinstance(layer.Qnorm_act[1], torch.nn.GELU)
    assert mixers.create("soft", 96, 3, landmarks="avgpool").state_dict().keys() == {
        "W_q.weight", "W_v.weight", "conv.weight", "ff.weight", "ff.bias"}


def test_kernel_matrix_is_symmetric_with_unit_diagonal_when_landmarks_are_all_tokens():
    # avgpool with stride 1: the landmarks are the tokens, so Ŝ = S·NS(S)·S; with the exact
    # inverse of S + εI this is ≈ S (tied Q = K gives a symmetric S with S_ii = 1)
    layer = mixers.create("soft", 32, 2, landmark_stride=1, landmarks="avgpool", inverse="exact",
                          conv_kernel=0, num_prefix_tokens=0, num_landmarks=None).double()
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    amap = layer.attention_map(x)
    torch.testing.assert_close(amap, amap.transpose(-1, -2), rtol=1e-9, atol=1e-9)
    assert (amap.diagonal(dim1=-2, dim2=-1) > 0.95).all()


def test_attention_map_reproduces_the_layer_without_local_term():
    layer = _make("soft_norm", conv_kernel=0)
    x = torch.randn(2, 1 + 48, 48, dtype=torch.float64)
    amap = layer.attention_map(x, hw=(6, 8), num_prefix_tokens=1)
    assert amap.shape == (2, 3, 49, 49)
    v = layer.W_v(x).reshape(2, 49, 3, 16).transpose(1, 2)
    out = layer.ff((amap @ v).transpose(1, 2).reshape(2, 49, 48))
    torch.testing.assert_close(out, layer(x, hw=(6, 8), num_prefix_tokens=1), rtol=1e-9, atol=1e-10)


def test_soft_norm_differs_from_soft_only_by_landmark_degrees():
    soft = _make("soft", num_prefix_tokens=0)
    norm = mixers.create("soft_norm", 48, 3, qkv_bias=True, num_prefix_tokens=0, num_landmarks=None).double()
    norm.load_state_dict(soft.state_dict())
    x = torch.randn(1, 64, 48, dtype=torch.float64)
    assert isinstance(norm, SoftNormAttention) and isinstance(norm, SoftAttention)
    assert not torch.allclose(soft(x), norm(x))
    torch.testing.assert_close(norm(x), soft_reference(norm, x, 0, 8, 8), rtol=1e-9, atol=1e-10)


def test_fixed_landmark_count_by_adaptive_pooling():
    layer = _make("soft", landmark_stride=2, num_landmarks=16, num_prefix_tokens=0).eval()
    fixed = mixers.create("soft", 48, 3, qkv_bias=True, landmark_stride=2, num_prefix_tokens=0,
                          num_landmarks=None).double().eval()
    fixed.load_state_dict(layer.state_dict())
    x = torch.randn(1, 64, 48, dtype=torch.float64)
    # at the grid the conv was made for (8x8 = 4·2 x 4·2) adaptive pooling is the identity
    torch.testing.assert_close(layer(x), fixed(x), rtol=0, atol=0)
    q, _ = layer._qv(torch.randn(1, 24 * 16, 48, dtype=torch.float64))
    assert layer._landmarks(q, (0, 24, 16)).shape == (1, 3, 16, 16)  # still m = 16
    pooled = mixers.create("soft", 48, 3, landmarks="avgpool", num_landmarks=(3, 5))
    q, _ = pooled._qv(torch.randn(2, 60, 48))
    assert pooled._landmarks(q, (0, 6, 10)).shape == (2, 3, 15, 16)


def test_floor_mode_drops_border_tokens_like_the_official_conv():
    layer = _make("soft", grid_remainder="floor", num_landmarks=None)
    x = torch.randn(2, 7 * 9, 48, dtype=torch.float64)
    out = layer(x, hw=(7, 9))
    torch.testing.assert_close(out, soft_reference(layer, x, 0, 7, 9), rtol=1e-9, atol=1e-10)


def test_bad_input_errors():
    layer = mixers.create("soft", 48, 3, num_landmarks=None)   # the official stride-only landmarks
    with pytest.raises(ValueError, match="not divisible by landmark_stride=2.*grid_remainder='floor'"):
        layer(torch.randn(1, 7 * 8, 48), hw=(7, 8))
    assert mixers.create("soft", 48, 3)(torch.randn(1, 7 * 8, 48), hw=(7, 8)).shape == (1, 56, 48)  # 'auto' pools
    with pytest.raises(ValueError, match="smaller than landmark_stride=4"):
        mixers.create("soft", 48, 3, landmark_stride=4)(torch.randn(1, 9, 48), num_prefix_tokens=0)
    with pytest.raises(ValueError, match="smaller than the 7x7=49 landmarks"):
        mixers.create("soft", 48, 3, num_landmarks=49)(torch.randn(1, 36, 48), num_prefix_tokens=0)
    with pytest.raises(ValueError, match="perfect square"):
        mixers.create("soft", 48, 3, num_landmarks=50)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        mixers.create("soft", 50, 3)
    with pytest.raises(ValueError, match="landmarks='pool'"):
        mixers.create("soft", 48, 3, landmarks="pool")
    with pytest.raises(ValueError, match="conv_kernel=4"):
        mixers.create("soft", 48, 3, conv_kernel=4)
    with pytest.raises(ValueError, match="qk_norm"):
        mixers.create("soft", 48, 3, qk_norm=True)
    with pytest.raises(ValueError, match="attn_drop"):
        mixers.create("soft_norm", 48, 3, attn_drop=0.1)
    with pytest.raises(ValueError, match="cannot infer a square token grid"):
        layer(torch.randn(1, 98, 48))  # 97 tokens after the default CLS token: not a square


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_is_a_clear_error(bad):
    layer = mixers.create("soft", 48, 3)
    x = torch.randn(1, 64, 48)
    x[0, 5, 3] = bad
    with pytest.raises(ValueError, match="contains NaN or Inf"):
        layer(x)


@pytest.mark.parametrize("name", ["soft", "soft_norm"])
def test_bf16_autocast_is_finite_forward_and_backward(name):
    layer = mixers.create(name, 64, 2, qkv_bias=True)
    x = (3 * torch.randn(2, 1 + 256, 64)).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert torch.isfinite(out.float()).all()
    out.float().pow(2).mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_whole_layer_memory_grows_linearly():
    # fixed m (adaptive pooling): with a fixed stride m grows with N and the cost is quadratic
    layer = mixers.create("soft", 64, 2, num_landmarks=49, num_prefix_tokens=0)

    def step(side):
        def run():
            x = torch.randn(1, side * side, 64, requires_grad=True)
            layer(x).sum().backward()
        return run

    layer.zero_grad(set_to_none=True)
    small = peak_memory_mib(step(64))    # N = 4096
    large = peak_memory_mib(step(128))   # N = 16384
    assert large <= 5 * small, (small, large)
