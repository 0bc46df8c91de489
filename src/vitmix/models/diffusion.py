"""Gaussian diffusion (DDPM) with ε- or v-prediction, DDIM sampling and classifier-free guidance.

Small and self-contained on purpose (``diffusers`` would add a 6 MB package and three more
dependencies for the ~100 lines used here). The maths, with ``ᾱ_t = ∏_{s≤t} (1 − β_s)``:

* forward process (Ho et al. 2020, "Denoising Diffusion Probabilistic Models"): ``q(x_t | x_0) =
  N(√ᾱ_t · x_0, (1 − ᾱ_t) I)``, i.e. ``x_t = √ᾱ_t · x_0 + √(1 − ᾱ_t) · ε``;
* β schedules: ``"linear"`` (DDPM/DiT: 1e-4 → 0.02 over 1000 steps, rescaled for other lengths) and
  ``"cosine"`` (Nichol & Dhariwal 2021, "Improved DDPM": ``ᾱ(t) ∝ cos²((t/T + s)/(1 + s)·π/2)``,
  s = 0.008, β ≤ 0.999) — the default, because for small images the linear schedule's last steps are
  almost pure noise (Nichol & Dhariwal, Sec. 3.2) while the cosine one destroys information evenly;
* training target: the noise ε (``prediction="eps"``, DDPM/DiT) or the velocity
  ``v = √ᾱ_t · ε − √(1 − ᾱ_t) · x_0`` (``"v"``, Salimans & Ho 2022); loss = mean squared error;
* sampling (Song et al. 2021, "Denoising Diffusion Implicit Models") on ``steps`` evenly spaced
  timesteps from T−1 down to 0: ``x̂_0`` and ``ε̂`` from the model, then
  ``x_prev = √ᾱ_prev · x̂_0 + √(1 − ᾱ_prev − σ²) · ε̂ + σ z`` with
  ``σ = η · √((1 − ᾱ_prev)/(1 − ᾱ_t)) · √(1 − ᾱ_t/ᾱ_prev)``: η = 0 is deterministic DDIM, η = 1 on all
  T steps is DDPM's ancestral sampler (σ² = the posterior variance β̃_t); ``x̂_0`` is clipped to the
  data range [−1, 1] and ``ε̂`` recomputed from it;
* classifier-free guidance (Ho & Salimans 2022): ``out = out_∅ + w · (out_y − out_∅)`` with the null
  class ∅, one batched call for both (w = 1: conditional only, no extra call).

Coefficients are kept in float64 and cast to the sample's dtype where they are used.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["GaussianDiffusion", "PREDICTIONS", "SCHEDULES", "cosine_betas", "guided", "linear_betas", "make_betas"]

SCHEDULES = ("cosine", "linear")
PREDICTIONS = ("eps", "v")

#: a denoiser: ``model(x_t, t, y)`` → ε or v, shaped like ``x_t``
Denoiser = Callable[[Tensor, Tensor, Tensor], Tensor]


def linear_betas(timesteps: int, start: float = 1e-4, end: float = 0.02) -> Tensor:
    """DDPM's linear β schedule, rescaled by ``1000 / timesteps`` so any length spans the same ᾱ range."""
    scale = 1000.0 / timesteps
    return torch.linspace(start * scale, end * scale, timesteps, dtype=torch.float64)


def cosine_betas(timesteps: int, s: float = 0.008, max_beta: float = 0.999) -> Tensor:
    """Improved DDPM's cosine schedule: ``β_t = min(1 − ᾱ(t+1)/ᾱ(t), max_beta)``."""
    steps = torch.arange(timesteps + 1, dtype=torch.float64) / timesteps
    alpha_bar = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    return (1 - alpha_bar[1:] / alpha_bar[:-1]).clamp(max=max_beta)


def make_betas(schedule: str, timesteps: int) -> Tensor:
    """The β schedule ``schedule`` (``"cosine"`` or ``"linear"``) of length ``timesteps``, float64."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown noise schedule {schedule!r}; choose {' or '.join(SCHEDULES)}")
    if timesteps < 2:
        raise ValueError(f"timesteps must be at least 2, got {timesteps}")
    return cosine_betas(timesteps) if schedule == "cosine" else linear_betas(timesteps)


def guided(model: Denoiser, x: Tensor, t: Tensor, y: Tensor, scale: float, null_class: Optional[int]) -> Tensor:
    """Classifier-free guidance: ``out_∅ + scale · (out_y − out_∅)``, both from one batched call."""
    if scale == 1.0:
        return model(x, t, y)
    if null_class is None:
        raise ValueError("classifier-free guidance (guidance != 1) needs a model with a null class")
    out = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, null_class)]))
    cond, uncond = out.chunk(2)
    return uncond + scale * (cond - uncond)


class GaussianDiffusion:
    """The DDPM forward process, its training loss and a DDIM/ancestral sampler (module docstring).

    Args:
        timesteps: T, the number of noise levels (1000 as DDPM/DiT).
        schedule: ``"cosine"`` (default) or ``"linear"``.
        prediction: ``"eps"`` (the model predicts the noise) or ``"v"`` (the velocity).
    """

    def __init__(self, timesteps: int = 1000, schedule: str = "cosine", prediction: str = "eps"):
        if prediction not in PREDICTIONS:
            raise ValueError(f"unknown prediction {prediction!r}; choose {' or '.join(PREDICTIONS)}")
        self.timesteps, self.schedule, self.prediction = int(timesteps), schedule, prediction
        self.betas = make_betas(schedule, self.timesteps)
        self.alphas_cumprod = torch.cumprod(1 - self.betas, dim=0)

    def _coef(self, values: Tensor, t: Tensor, like: Tensor) -> Tensor:
        """``values[t]`` as a ``(B, 1, 1, ...)`` tensor in ``like``'s dtype and device."""
        out = values[t.cpu()].to(device=like.device, dtype=like.dtype)
        return out.view(-1, *([1] * (like.dim() - 1)))

    def _check_t(self, t: Tensor) -> Tensor:
        t = torch.as_tensor(t)
        if t.dtype.is_floating_point or bool(((t < 0) | (t >= self.timesteps)).any()):
            raise ValueError(f"timesteps must be integers in 0..{self.timesteps - 1}")
        return t.long()

    # -- forward process and loss ------------------------------------------------------------
    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """``x_t = √ᾱ_t · x_0 + √(1 − ᾱ_t) · ε`` (one ``t`` per sample)."""
        t = self._check_t(t)
        ab = self.alphas_cumprod
        return self._coef(ab.sqrt(), t, x0) * x0 + self._coef((1 - ab).sqrt(), t, x0) * noise

    def target(self, x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        """What the model is trained to output: ε, or ``v = √ᾱ_t ε − √(1 − ᾱ_t) x_0``."""
        if self.prediction == "eps":
            return noise
        ab = self.alphas_cumprod
        return self._coef(ab.sqrt(), t, x0) * noise - self._coef((1 - ab).sqrt(), t, x0) * x0

    def training_loss(self, model: Denoiser, x0: Tensor, y: Tensor, generator: Optional[torch.Generator] = None
                      ) -> Tensor:
        """Mean squared error of ``model(x_t, t, y)`` against :meth:`target`, t uniform in 0..T−1."""
        t = torch.randint(0, self.timesteps, (x0.shape[0],), generator=generator).to(x0.device)
        noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype).to(x0.device)
        return F.mse_loss(model(self.q_sample(x0, t, noise), t, y), self.target(x0, noise, t))

    # -- sampling ----------------------------------------------------------------------------
    def split_prediction(self, out: Tensor, x_t: Tensor, t: Tensor):
        """``(x̂_0, ε̂)`` from a model output (ε or v) at ``x_t``."""
        ab = self.alphas_cumprod
        a, s = self._coef(ab.sqrt(), t, x_t), self._coef((1 - ab).sqrt(), t, x_t)
        if self.prediction == "eps":
            return (x_t - s * out) / a, out
        return a * x_t - s * out, s * x_t + a * out

    def sampling_timesteps(self, steps: int) -> Tensor:
        """``steps`` evenly spaced timesteps from T−1 down to 0 (distinct, descending)."""
        if not 1 <= steps <= self.timesteps:
            raise ValueError(f"sampling steps must be between 1 and {self.timesteps}, got {steps}")
        return torch.linspace(self.timesteps - 1, 0, steps, dtype=torch.float64).round().long()

    def ddim_sigma(self, t: int, t_prev: int, eta: float) -> float:
        """σ of the step ``t → t_prev`` (``t_prev = -1``: to the data, σ = 0)."""
        ab_t = float(self.alphas_cumprod[t])
        ab_prev = float(self.alphas_cumprod[t_prev]) if t_prev >= 0 else 1.0
        return eta * math.sqrt((1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev))

    def ddim_step(self, out: Tensor, x_t: Tensor, t: int, t_prev: int, eta: float = 0.0, clip: bool = True,
                  generator: Optional[torch.Generator] = None) -> Tensor:
        """One DDIM step ``x_t → x_{t_prev}`` from the model output ``out`` at ``x_t``."""
        t_vec = torch.full((x_t.shape[0],), t, dtype=torch.long)
        x0, eps = self.split_prediction(out, x_t, t_vec)
        if clip:
            x0 = x0.clamp(-1, 1)
            ab = self.alphas_cumprod
            eps = (x_t - self._coef(ab.sqrt(), t_vec, x_t) * x0) / self._coef((1 - ab).sqrt(), t_vec, x_t)
        ab_prev = float(self.alphas_cumprod[t_prev]) if t_prev >= 0 else 1.0
        sigma = self.ddim_sigma(t, t_prev, eta)
        x_prev = math.sqrt(ab_prev) * x0 + math.sqrt(max(1 - ab_prev - sigma ** 2, 0.0)) * eps
        if sigma > 0:
            x_prev = x_prev + sigma * torch.randn(x_t.shape, generator=generator, dtype=x_t.dtype).to(x_t.device)
        return x_prev

    @torch.no_grad()
    def sample(self, model: Denoiser, labels: Tensor, shape, steps: int = 50, guidance: float = 1.0,
               eta: float = 0.0, null_class: Optional[int] = None, clip: bool = True,
               generator: Optional[torch.Generator] = None, device=None, progress=None) -> Tensor:
        """Draw ``len(labels)`` samples of ``shape`` (C, H, W) from noise with ``steps`` DDIM steps.

        ``generator`` (a CPU ``torch.Generator``) makes the result a function of its seed; ``progress``
        wraps the step iterator (e.g. ``tqdm``)."""
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        device = device if device is not None else labels.device
        x = torch.randn((len(labels), *shape), generator=generator).to(device)
        labels = labels.to(device)
        times = self.sampling_timesteps(steps).tolist()
        pairs = list(zip(times, times[1:] + [-1]))
        for t, t_prev in (progress(pairs) if progress else pairs):
            t_vec = torch.full((len(labels),), t, dtype=torch.long, device=device)
            out = guided(model, x, t_vec, labels, guidance, null_class)
            x = self.ddim_step(out, x, t, t_prev, eta, clip, generator)
        return x
