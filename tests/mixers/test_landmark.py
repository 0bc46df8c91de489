"""The landmark mixers share one base (``mixers.landmark.LandmarkMixer``): its checks and facts hold
for each of them, and its ``attention_map`` reproduces the layer's kernel attention."""
import pytest
import torch

from vitmix import mixers
from vitmix.mixers.landmark import LandmarkMixer

LANDMARK = ("soft", "soft_norm", "laplacian")


def test_the_landmark_mixers_and_only_they_derive_from_the_base():
    derived = {name for name in mixers.list_mixers() if issubclass(mixers.get_mixer_class(name), LandmarkMixer)}
    assert derived == set(LANDMARK)


@pytest.mark.parametrize("name", LANDMARK)
@pytest.mark.parametrize("conv_kernel", [2, -3])
def test_an_even_or_negative_local_conv_is_one_line(name, conv_kernel):
    with pytest.raises(ValueError, match=f"conv_kernel={conv_kernel} must be a positive odd size"):
        mixers.create(name, dim=32, num_heads=2, conv_kernel=conv_kernel)


@pytest.mark.parametrize("name", LANDMARK)
def test_shared_facts_and_landmark_count(name):
    layer = mixers.create(name, dim=32, num_heads=2, conv_kernel=0)
    assert layer.conv_kernel == 0 and layer.complexity == "linear" and layer.spatial
    assert layer.landmark_count(30, 30) == (7, 7)
    assert mixers.create(name, dim=32, num_heads=2, num_landmarks=None).landmark_count(8, 8) == (4, 4)
    assert f"num_landmarks={layer.landmark_hw!r}" in repr(layer)


@pytest.mark.parametrize("name", LANDMARK)
def test_attention_map_times_values_is_the_kernel_part_of_the_layer(name):
    torch.manual_seed(0)
    layer = mixers.create(name, dim=32, num_heads=2, conv_kernel=0).double().eval()
    x = torch.randn(2, 1 + 36, 32, dtype=torch.float64)
    weights = layer.attention_map(x, hw=(6, 6), num_prefix_tokens=1)          # (B, heads, N, N)
    assert weights.shape == (2, 2, 37, 37)
    grid = layer.token_grid(37, (6, 6), 1)
    values = torch.randn(2, 2, 37, 5, dtype=torch.float64)
    torch.testing.assert_close(weights @ values, layer._kernel_weights(x, grid, values), rtol=1e-10, atol=1e-10)


def test_the_base_alone_has_no_kernel():
    layer = LandmarkMixer(8, 2)
    with pytest.raises(NotImplementedError):
        layer._kernel_weights(torch.zeros(1, 4, 8), (0, 2, 2), torch.zeros(1, 2, 4, 4))
    with pytest.raises(NotImplementedError, match="must define landmark_flops"):   # nor a cost for "auto"
        layer.landmark_flops(64, 16)


@pytest.mark.parametrize("name", LANDMARK)
@pytest.mark.parametrize("dim,heads", [(64, 2), (96, 3), (128, 2), (128, 4), (384, 6)])
def test_auto_landmarks_never_cost_more_than_exact_attention(name, dim, heads):
    """'auto' shrinks the stride grid (at most 7×7) to the largest square whose kernel attention costs
    at most exact attention's 4·N²·d FLOPs per head, and never below the mixer's floor (2×2; 4×4 for
    laplacian) where the stride grid is that large."""
    layer = mixers.create(name, dim=dim, num_heads=heads)
    floor = 4 if name == "laplacian" else 2
    assert layer.min_landmark_side == floor
    for side in (4, 6, 8, 14, 28, 56):
        n = side * side
        mh, mw = layer.landmark_count(side, side)
        stride_grid = min(7, side // 2)
        assert mh == mw <= stride_grid
        assert mh >= min(floor, stride_grid)
        assert mh == min(floor, stride_grid) or layer.landmark_flops(n, mh * mw) <= 4 * n * n * layer.head_dim
        if mh < stride_grid:     # one more landmark row and column would cost more than exact attention
            assert layer.landmark_flops(n, (mh + 1) ** 2) > 4 * n * n * layer.head_dim
    assert layer.landmark_count(56, 56) == (7, 7)         # large grids keep the papers' 49 (linear cost)


def test_auto_landmarks_at_the_learning_grid_shapes():
    """The counts docs/soft-laplacianformer.md quotes: 196 tokens give 25 landmarks at head dim 32 and
    36 at 64 (49 would cost 3.0x / 1.8x exact attention with 20 Newton–Schulz steps, 2.0x with laplacian's
    10); the demo's 8×8 grid 9 instead of 16 for soft / soft_norm, and laplacian's floor keeps 16 there
    (and on the pyramids' 7×7 stage 4)."""
    def count(name, dim, heads, side):
        return mixers.create(name, dim=dim, num_heads=heads).landmark_count(side, side)
    for name in LANDMARK:
        assert count(name, 64, 2, 14) == count(name, 96, 3, 14) == (5, 5)
        assert count(name, 128, 2, 14) == (6, 6)
        assert count(name, 128, 4, 8) == ((4, 4) if name == "laplacian" else (3, 3))
    stage4 = mixers.create("laplacian", dim=512, num_heads=16, landmark_stride=1)   # the pyramids' last stage
    assert stage4.landmark_count(7, 7) == (4, 4)
    assert count("laplacian", 64, 4, 4) == (2, 2)         # the CI learning guard's 4×4 grid: unchanged
    assert count("soft", 64, 4, 4) == (2, 2)              # floor: 1×1 would be a rank-1 map
    lap = mixers.create("laplacian", dim=64, num_heads=2)             # 10 Newton–Schulz steps (default)
    assert round(lap.landmark_flops(196, 49) / (4 * 196 ** 2 * 32), 1) == 2.0
    lap20 = mixers.create("laplacian", dim=64, num_heads=2, newton_iters=20)
    assert round(lap20.landmark_flops(196, 49) / (4 * 196 ** 2 * 32), 1) == 3.0
    assert lap20.landmark_count(14, 14) == lap.landmark_count(14, 14) == (5, 5)   # the same count either way


@pytest.mark.parametrize("name", ["laplacian", "soft", "soft_norm"])
def test_inference_without_a_compiler_runs_the_composed_path(monkeypatch, tmp_path, name):
    """Fault injection for the one-call C inference: a failing compiler and an empty cache give one
    warning and exactly the composed path's numbers (the ops that run when gradients are needed)."""
    from vitmix.mixers.fused import library
    from vitmix.ops.nystrom import c as nystrom_c

    torch.manual_seed(4)
    layer = mixers.create(name, 64, 2, hw=(8, 8), num_prefix_tokens=1).eval()
    x = torch.randn(2, 65, 64)
    with monkeypatch.context() as patch:    # the reference: with gradients (no C forward of the op) and the
        patch.setattr(layer, "_fused", lambda *args: None)
        composed = layer(x).detach()       # layer's C paths off
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    for kernel in (nystrom_c.NYSTROM_KERNEL, library.LAYERS_KERNEL):   # the layer's C path, then the op's
        monkeypatch.setattr(kernel, "_lib", None)
        monkeypatch.setattr(kernel, "_tried", False)
    with pytest.warns(RuntimeWarning) as caught, torch.no_grad():
        out = layer(x)
    assert {"vitmix: could not compile the landmark_layers", "vitmix: could not compile the nystrom_forward"} <= {
        str(w.message).split(" with ")[0] for w in caught}
    assert torch.equal(out, composed)
