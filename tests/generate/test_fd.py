"""FD (classifier features): the Fréchet distance against closed forms and scipy's sqrtm, ~0 for two
samples of the same data, and a seeded feature classifier."""
from __future__ import annotations

import pytest
import torch

from vitmix.generate.fd import (
    FeatureNet, fd_between, frechet_distance, frechet_distance_reference, gaussian_stats, train_feature_net,
)


def _random_cov(d, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    return a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)


def test_diagonal_gaussians_closed_form():
    """Commuting covariances: FD = ‖μ1 − μ2‖² + Σ_i (√a_i − √b_i)²."""
    mu1, mu2 = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([1.0, 1.0, 0.5])
    a, b = torch.tensor([1.0, 4.0, 0.25]), torch.tensor([9.0, 1.0, 0.25])
    expected = ((mu1 - mu2) ** 2).sum() + ((a.sqrt() - b.sqrt()) ** 2).sum()     # 7.25 + 4 + 1 + 0
    assert frechet_distance(mu1, torch.diag(a), mu2, torch.diag(b)) == pytest.approx(expected.item(), rel=1e-12)
    assert expected.item() == pytest.approx(12.25)


def test_one_dimensional_case_and_symmetry():
    # N(0, 1) vs N(3, 4): 9 + (1 − 2)² = 10
    assert frechet_distance(torch.zeros(1), torch.ones(1, 1), torch.full((1,), 3.0), torch.full((1, 1), 4.0)) == \
        pytest.approx(10.0, rel=1e-12)
    s1, s2 = _random_cov(6, 0), _random_cov(6, 1)
    m1, m2 = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    assert frechet_distance(m1, s1, m2, s2) == pytest.approx(frechet_distance(m2, s2, m1, s1), rel=1e-10)
    assert abs(frechet_distance(m1, s1, m1, s1)) < 1e-10


@pytest.mark.parametrize("d", [1, 5, 32])
def test_non_commuting_covariances_match_scipy_sqrtm(d):
    s1, s2 = _random_cov(d, 2), _random_cov(d, 3)
    m1, m2 = torch.zeros(d, dtype=torch.float64), torch.linspace(-1, 1, d, dtype=torch.float64)
    ours, ref = frechet_distance(m1, s1, m2, s2), frechet_distance_reference(m1, s1, m2, s2)
    assert ours == pytest.approx(ref, rel=1e-8, abs=1e-10)


def test_rank_deficient_covariances_stay_real_and_non_negative():
    g = torch.Generator().manual_seed(0)
    f1, f2 = torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)   # 5 samples in 16-D: rank 4
    value = frechet_distance(*gaussian_stats(f1), *gaussian_stats(f2))
    assert value >= 0 and value == pytest.approx(frechet_distance_reference(*gaussian_stats(f1),
                                                                            *gaussian_stats(f2)), rel=1e-6)


def test_two_samples_of_the_same_distribution_are_about_zero_apart():
    """Sample statistics of N(μ, Σ) in 8-D: FD ≈ 0 (the finite-sample bias is O(d²/n) ≈ 0.01 here),
    while a mean shift of 0.5 in every coordinate gives ≈ 8 · 0.25 = 2 (± 0.15: the sample means'
    error, ≈ 0.01 per coordinate, enters the mean term as 2 · 0.5 · Σ error, std ≈ 0.04)."""
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(8, 8, generator=g) / 3 + torch.eye(8)
    draw = lambda n: torch.randn(n, 8, generator=g) @ mix.T  # noqa: E731
    same = frechet_distance(*gaussian_stats(draw(20_000)), *gaussian_stats(draw(20_000)))
    shifted = frechet_distance(*gaussian_stats(draw(20_000)), *gaussian_stats(draw(20_000) + 0.5))
    assert 0 <= same < 0.02 and shifted == pytest.approx(2.0, abs=0.15)


def test_feature_classifier_is_seeded_and_separates_real_from_noise():
    from vitmix.generate.runner import load_images

    train_x, train_y, val_x, val_y, info, size = load_images("digits", None)
    assert size == 8 and train_x.min() >= -1 and train_x.max() <= 1 and train_x.shape[1:] == (1, 8, 8)
    net, acc = train_feature_net(train_x, train_y, 10, val=(val_x, val_y), epochs=2)
    once, _ = train_feature_net(train_x[:256], train_y[:256], 10, epochs=1)
    again, _ = train_feature_net(train_x[:256], train_y[:256], 10, epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(once.state_dict().values(), again.state_dict().values()))
    assert acc > 80.0                                   # a useful feature space, not a random one
    half = len(val_x) // 2
    real_real = fd_between(net, val_x[:half], val_x[half:])
    real_noise = fd_between(net, val_x[:half], torch.rand_like(val_x[half:]) * 2 - 1)
    assert real_real < 0.2 * real_noise
    assert isinstance(net, FeatureNet) and net.features(val_x[:3]).shape == (3, 128)
