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
    assert layer.landmark_count(8, 8) == (4, 4) and layer.landmark_count(30, 30) == (7, 7)
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
