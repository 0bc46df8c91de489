"""Issue: a kernel mixer created without options must be O(N) at any resolution (fixed landmark count),
and the pyramid models must keep their nominal-size behaviour but grow ~linearly in pixels."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _memory import peak_memory_mib  # noqa: E402

import vitmix  # noqa: E402
from vitmix import mixers  # noqa: E402
from vitmix.bench.flops import analytic_flops, count_flops  # noqa: E402

LINEAR = [name for name in mixers.list_mixers() if mixers.get_mixer_class(name).complexity == "linear"]
#: the Newton–Schulz kernel mixers (SOFT, SOFT-Norm, LaplacianFormer)
NEWTON = [name for name in LINEAR if "newton_iters" in mixers.get_mixer_class(name).option_names()]


def test_the_kernel_mixers_declare_themselves_linear():
    assert {"soft", "soft_norm", "laplacian"} <= set(NEWTON)
    assert {"linear", "performer", "nystromformer"} <= set(LINEAR)


@pytest.mark.parametrize("name", LINEAR)
def test_default_mixer_flops_and_memory_grow_linearly(name):
    """N -> 4N (a 32×32 grid -> 64×64, CLS included) costs at most 4.2x, in FLOPs and in peak
    fwd+bwd memory; with the old stride-only landmarks (m = N/4) it was ~16x."""
    def layer(side):
        return mixers.create(name, 64, 4, hw=(side, side), num_prefix_tokens=1)

    small, large = 1 + 32 * 32, 1 + 64 * 64
    flop_ratio = analytic_flops(layer(64), 1, large) / analytic_flops(layer(32), 1, small)
    assert flop_ratio <= 4.2, flop_ratio

    def step(side):
        def run():
            m = layer(side)
            x = torch.randn(1, 1 + side * side, 64, requires_grad=True)
            m(x).sum().backward()
        return run

    torch.manual_seed(0)
    mem_ratio = peak_memory_mib(step(64)) / peak_memory_mib(step(32))
    assert mem_ratio <= 4.2, mem_ratio


@pytest.mark.parametrize("name", [n for n in LINEAR if hasattr(mixers.get_mixer_class(n), "landmark_count")])
def test_default_landmark_rule(name):
    """'auto': one landmark per 2×2 block (the default stride), at most 7×7 = 49, and on small grids no
    more than keep the kernel attention's FLOPs at most exact attention's (head dim 16 here), down to
    the mixer's floor (laplacian: 4×4)."""
    layer = mixers.create(name, 64, 4)
    # 9: 16 would cost more than exact attention at N = 64; laplacian keeps its 4×4 floor
    assert layer.landmark_count(8, 8) == ((4, 4) if name == "laplacian" else (3, 3))
    assert layer.landmark_count(28, 28) == (7, 7)     # 49 from N = 784 up
    assert layer.landmark_count(9, 5) == (4, 2)       # odd grids pool adaptively, no error
    assert layer.landmark_count(64, 256) == (7, 7)    # fixed beyond: linear cost
    assert mixers.create(name, 64, 4, num_landmarks=None).landmark_count(14, 14) == (7, 7)   # stride alone
    assert mixers.create(name, 64, 4, num_landmarks=None).landmark_count(64, 64) == (32, 32)  # official


@pytest.mark.parametrize("model", ["laplacianformer_tiny", "soft_tiny"])
def test_pyramid_flops_at_448_are_about_4x_224(model):
    def flops(size):
        net = vitmix.create_model(model, img_size=224).eval()
        x = torch.randn(1, 3, size, size)
        with torch.no_grad():
            return count_flops(lambda: net(x)).total

    ratio = flops(448) / flops(224)
    assert ratio <= 4.3, ratio


def test_deprecated_stride_names_warn_and_map_to_landmark_stride():
    with pytest.warns(DeprecationWarning, match="sr_ratio= is deprecated, use landmark_stride=4"):
        assert mixers.create("soft", 64, 4, sr_ratio=4).landmark_stride == 4
    with pytest.warns(DeprecationWarning, match="pool_ratio= is deprecated"):
        assert mixers.create("laplacian", 64, 4, pool_ratio=4).landmark_stride == 4
    with pytest.raises(ValueError, match="disagree"), pytest.warns(DeprecationWarning):
        mixers.create("laplacian", 64, 4, pool_ratio=4, landmark_stride=2)


@pytest.mark.parametrize("name", NEWTON)
def test_newton_options_are_checked(name):
    default = mixers.create(name, 64, 4).newton_iters
    with pytest.raises(ValueError, match="newton_iters=0 with inverse='newton'") as err:
        mixers.create(name, 64, 4, newton_iters=0)
    assert f"(default {default})" in str(err.value)      # the mixer's own default, not another's
    assert mixers.create(name, 64, 4, newton_iters=0, inverse="exact").newton_iters == 0
    with pytest.raises(ValueError, match="newton_eps"):
        mixers.create(name, 64, 4, newton_eps=-1.0)
