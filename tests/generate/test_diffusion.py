"""DDPM/DDIM: schedules and the forward marginal against closed forms, samplers against oracle
denoisers (a single image; Gaussian data), determinism, guidance, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from vitmix.models.diffusion import GaussianDiffusion, cosine_betas, guided, linear_betas


def _single_image_oracle(diffusion, image):
    """The optimal denoiser when the data is one image x*: ε = (x_t − √ᾱ x*)/√(1 − ᾱ) (v from it)."""
    ab = diffusion.alphas_cumprod

    def model(x, t, y):
        a = ab[t].view(-1, *[1] * (x.dim() - 1)).to(x.dtype)
        eps = (x - a.sqrt() * image) / (1 - a).sqrt()
        return eps if diffusion.prediction == "eps" else a.sqrt() * eps - (1 - a).sqrt() * image
    return model


def _gaussian_oracle(diffusion, mu, s):
    """The optimal denoiser for data N(mu, s²): E[ε | x_t] = √(1−ᾱ)(x_t − √ᾱ mu)/(ᾱ s² + 1 − ᾱ)."""
    ab = diffusion.alphas_cumprod

    def model(x, t, y):
        a = ab[t].view(-1, 1, 1, 1)
        eps = (1 - a).sqrt() * (x.double() - a.sqrt() * mu) / (a * s * s + 1 - a)
        if diffusion.prediction == "eps":
            return eps.to(x.dtype)
        x0 = (x.double() - (1 - a).sqrt() * eps) / a.sqrt()
        return (a.sqrt() * eps - (1 - a).sqrt() * x0).to(x.dtype)
    return model


# ----------------------------------------------------------------------------------------------
# forward process
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_closed_form_marginal_equals_the_markov_chain(schedule):
    """ᾱ_t used by q(x_t | x_0) is what t one-step kernels x_t = √(1−β_t) x_{t−1} + √β_t ε compose to:
    mean factor m_t = √(1−β_t) m_{t−1}, variance v_t = (1−β_t) v_{t−1} + β_t, in float64."""
    d = GaussianDiffusion(1000, schedule)
    m, v, means, variances = 1.0, 0.0, [], []
    for beta in d.betas.tolist():
        m, v = math.sqrt(1 - beta) * m, (1 - beta) * v + beta
        means.append(m)
        variances.append(v)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(as_tensor(means), d.alphas_cumprod.sqrt(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(as_tensor(variances), 1 - d.alphas_cumprod, rtol=1e-12, atol=1e-14)


def test_schedules_follow_their_definitions():
    T, s = 1000, 0.008
    f = lambda t: math.cos((t / T + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
    ab = torch.cumprod(1 - cosine_betas(T), 0)
    for t in (0, 1, 250, 500, 900):   # before β reaches its 0.999 cap, ᾱ_t = f(t+1)/f(0)
        assert ab[t].item() == pytest.approx(f(t + 1) / f(0), rel=1e-10)
    assert cosine_betas(T).max().item() == pytest.approx(0.999)
    lin = linear_betas(1000)
    assert lin[0].item() == pytest.approx(1e-4) and lin[-1].item() == pytest.approx(0.02)
    assert linear_betas(250)[-1].item() == pytest.approx(0.08)          # rescaled for shorter chains


@pytest.mark.parametrize("t", [0, 300, 999])
def test_q_sample_has_the_closed_form_marginal(t):
    """Monte Carlo over 40 000 noise draws: mean √ᾱ x_0 and variance 1 − ᾱ within 5 standard errors."""
    d = GaussianDiffusion(1000, "cosine")
    gen = torch.Generator().manual_seed(0)
    x0 = torch.full((40_000, 1), 0.7, dtype=torch.float64)
    xt = d.q_sample(x0, torch.full((40_000,), t), torch.randn(40_000, 1, generator=gen, dtype=torch.float64))
    ab = d.alphas_cumprod[t].item()
    n, var = len(xt), 1 - ab
    assert abs(xt.mean().item() - math.sqrt(ab) * 0.7) < 5 * math.sqrt(var / n)
    assert abs(xt.var().item() - var) < 5 * var * math.sqrt(2 / n)


@pytest.mark.parametrize("prediction", ["eps", "v"])
def test_training_loss_is_zero_for_the_oracle(prediction):
    d = GaussianDiffusion(1000, "linear", prediction)
    image = torch.rand(3, 1, 4, 6, dtype=torch.float64) * 2 - 1
    loss = d.training_loss(_single_image_oracle(d, image), image, torch.zeros(3, dtype=torch.long),
                           generator=torch.Generator().manual_seed(0))
    assert loss.item() < 1e-20
    wrong = d.training_loss(_single_image_oracle(d, image * 0.9), image, torch.zeros(3, dtype=torch.long))
    assert wrong.item() > 1e-6


# ----------------------------------------------------------------------------------------------
# samplers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prediction", ["eps", "v"])
@pytest.mark.parametrize("eta,steps", [(0.0, 5), (1.0, 5), (0.5, 1000)])
def test_sampler_with_a_single_image_oracle_recovers_the_image(prediction, eta, steps):
    d = GaussianDiffusion(1000, "cosine", prediction)
    image = torch.rand(2, 1, 4, 6) * 2 - 1                   # the "training set": one image per sample slot
    gen = torch.Generator().manual_seed(3)
    out = d.sample(_single_image_oracle(d, image), torch.zeros(2, dtype=torch.long), (1, 4, 6), steps=steps, eta=eta,
                   generator=gen)
    torch.testing.assert_close(out, image, rtol=0, atol=2e-5)   # float32 rounding through up to 1000 steps


def test_deterministic_sampler_converges_to_gaussian_data():
    """With the exact denoiser for N(0.3, 0.2²), DDIM (η = 0, the probability-flow ODE) reproduces the
    data distribution, the better the more steps (discretisation error: −6% of the std at 50 steps,
    −1.2% at 200); mean and std within 0.01 / 3% at 200 steps (Monte Carlo error ≈ 0.3%)."""
    d = GaussianDiffusion(1000, "cosine")
    labels = torch.zeros(4000, dtype=torch.long)
    errors = []
    for steps in (10, 50, 200):
        x = d.sample(_gaussian_oracle(d, 0.3, 0.2), labels, (1, 1, 1), steps=steps, clip=False,
                     generator=torch.Generator().manual_seed(0)).double()
        errors.append(abs(x.std().item() - 0.2))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.03 * 0.2
    assert abs(x.mean().item() - 0.3) < 0.01


def test_ancestral_steps_use_the_ddpm_posterior_variance():
    d = GaussianDiffusion(1000, "linear")
    ab, betas = d.alphas_cumprod, d.betas
    for t in (1, 10, 500, 999):
        posterior = betas[t] * (1 - ab[t - 1]) / (1 - ab[t])
        assert d.ddim_sigma(t, t - 1, 1.0) ** 2 == pytest.approx(posterior.item(), rel=1e-10)
        assert d.ddim_sigma(t, t - 1, 0.0) == 0.0
    assert d.ddim_sigma(0, -1, 1.0) == 0.0


def test_sampling_is_a_function_of_the_seed():
    d = GaussianDiffusion(100, "cosine")
    model = lambda x, t, y: 0.1 * x + 0.01 * y.view(-1, 1, 1, 1)  # noqa: E731  (any fixed denoiser)
    labels = torch.tensor([0, 1, 2])
    draw = lambda seed, eta: d.sample(model, labels, (1, 4, 4), steps=8, eta=eta,  # noqa: E731
                                      generator=torch.Generator().manual_seed(seed))
    for eta in (0.0, 1.0):
        assert torch.equal(draw(5, eta), draw(5, eta))
        assert not torch.allclose(draw(5, eta), draw(6, eta))
    assert d.sampling_timesteps(8).tolist() == [99, 85, 71, 57, 42, 28, 14, 0]


def test_classifier_free_guidance_combines_one_batched_call():
    calls = []

    def model(x, t, y):
        calls.append(len(y))
        return x + y.view(-1, 1).double()
    x, t, y = torch.zeros(2, 3, dtype=torch.float64), torch.tensor([5, 5]), torch.tensor([1, 4])
    out = guided(model, x, t, y, 3.0, null_class=10)
    torch.testing.assert_close(out, 10 + 3.0 * (y.view(-1, 1).double() - 10).expand(2, 3))  # u + w (c − u)
    assert calls == [4]
    assert torch.equal(guided(model, x, t, y, 1.0, null_class=10), y.view(-1, 1).double().expand(2, 3))
    assert calls == [4, 2]
    with pytest.raises(ValueError, match="null class"):
        guided(model, x, t, y, 2.0, null_class=None)


def test_bad_settings_are_value_errors():
    with pytest.raises(ValueError, match="unknown noise schedule 'cosin'"):
        GaussianDiffusion(1000, "cosin")
    with pytest.raises(ValueError, match="unknown prediction"):
        GaussianDiffusion(1000, prediction="x0")
    d = GaussianDiffusion(100)
    with pytest.raises(ValueError, match="between 1 and 100"):
        d.sampling_timesteps(101)
    with pytest.raises(ValueError, match="integers in 0..99"):
        d.q_sample(torch.zeros(1, 2), torch.tensor([100]), torch.zeros(1, 2))
