"""The visuomotor diffusion policy of Fibottention's robot experiments (Crossway Diffusion / Diffusion
Policy), with a vitmix ViT as its image encoder.

Each (camera, observation step) image is random-cropped (training) or centre-cropped (evaluation) from
84² to 76² (PushT: 96² to 84²) and encoded on its own by a ViT with patch 8 — 81 patch tokens + CLS
(PushT: 100 + CLS) — whose attention is any vitmix mixer; the encoder's output is the mean of the patch
tokens. The features of every camera and step, concatenated with the scaled proprioception, are the
global condition of a 1-D temporal UNet (FiLM-conditioned residual blocks) that denoises the
``horizon × action_dim`` action chunk, trained as a DDPM with
:class:`vitmix.models.diffusion.GaussianDiffusion` and sampled with DDIM.

The default encoder (width 192, depth 4) and UNet (64/128 channels) are sized for a CPU; it keeps
ViT-B's 12 heads, because Fibottention gives each head its own Wythoff row (12 heads: the official
pattern and its 10.8 % density). ``encoder="vit_b"`` is the paper's ViT-B/8 (width 768, depth 12).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from ..models.diffusion import GaussianDiffusion
from ..models.factory import create_model
from .dataset import HORIZON, N_OBS
from .sim import CAMERAS, SPECS

__all__ = ["ENCODERS", "FIBOTTENTION_FORMS", "mixer_options", "ViTImageEncoder", "ConditionalUnet1D",
           "DiffusionPolicy"]

#: encoder sizes: (width, depth, heads)
ENCODERS = {"small": (192, 4, 12), "vit_b": (768, 12, 12)}
#: Fibottention in the policy: the official robot code's form, or the paper's masked form of it
FIBOTTENTION_FORMS = {"official": dict(preset="robot"), "masked": dict(preset="robot", mode="masked")}
#: Lift/Can's crop side
CROP = SPECS["lift"].crop
PATCH = 8


def mixer_options(mixer: str, fibottention: str = "official") -> Dict[str, object]:
    """Options of ``mixer`` in the policy: Fibottention's robot forms, BigBird as in the robot code."""
    if mixer == "fibottention":
        if fibottention not in FIBOTTENTION_FORMS:
            raise ValueError(f"--fibottention {fibottention!r} is not one of {', '.join(FIBOTTENTION_FORMS)}")
        return dict(FIBOTTENTION_FORMS[fibottention])
    if mixer == "bigbird":
        return {"layout": "band"}
    return {}


class ViTImageEncoder(nn.Module):
    """A vitmix ViT (patch 8, ``crop``² input) whose output is the mean of its patch tokens.

    Neither crop (76, PushT's 84) is a multiple of 8: the official encoder's stride-8 patch convolution
    sees the first 9 · 8 = 72 (10 · 8 = 80) rows and columns — 81 (100) patches — and never the last 4,
    so this encoder is built for that side and given exactly those pixels."""

    def __init__(self, mixer: str = "softmax", size: str = "small", options: Optional[dict] = None,
                 crop: int = CROP):
        super().__init__()
        if size not in ENCODERS:
            raise ValueError(f"--encoder {size!r} is not one of {', '.join(ENCODERS)}")
        width, depth, heads = ENCODERS[size]
        self.seen = crop // PATCH * PATCH
        self.vit = create_model("vit_tiny_patch16_224", mixer=mixer, mixer_options=options or None, img_size=self.seen,
                                patch_size=PATCH, embed_dim=width, depth=depth, num_heads=heads, num_classes=0,
                                global_pool="avg")
        self.out_dim = width

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit(images[..., :self.seen, :self.seen])


def _time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / (half - 1))
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=-1)


class _ConvBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 5, groups: int = 8):
        super().__init__(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), nn.GroupNorm(groups, cout), nn.Mish())


class _FiLMResBlock(nn.Module):
    """Two conv blocks; the condition scales and shifts the first one's output per channel (FiLM)."""

    def __init__(self, cin: int, cout: int, cond_dim: int):
        super().__init__()
        self.block1, self.block2 = _ConvBlock(cin, cout), _ConvBlock(cout, cout)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * cout))
        self.skip = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(cond)[..., None].chunk(2, dim=1)
        return self.block2(self.block1(x) * (1 + scale) + shift) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    """A 1-D UNet over the action chunk's time axis: ``(B, T, A), t, cond → (B, T, A)`` noise."""

    def __init__(self, action_dim: int, cond_dim: int, channels: Sequence[int] = (64, 128), time_dim: int = 64):
        super().__init__()
        self.time_dim = time_dim
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, 4 * time_dim), nn.Mish(), nn.Linear(4 * time_dim, time_dim))
        c = time_dim + cond_dim
        dims = [action_dim, *channels]
        self.down = nn.ModuleList()
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == len(channels) - 1
            self.down.append(nn.ModuleList([_FiLMResBlock(cin, cout, c), _FiLMResBlock(cout, cout, c),
                                            nn.Identity() if last else nn.Conv1d(cout, cout, 3, 2, 1)]))
        self.mid = nn.ModuleList([_FiLMResBlock(channels[-1], channels[-1], c) for _ in range(2)])
        self.up = nn.ModuleList()
        for cin, cout in zip(reversed(channels[1:]), reversed(channels[:-1])):
            self.up.append(nn.ModuleList([_FiLMResBlock(2 * cin, cout, c), _FiLMResBlock(cout, cout, c),
                                          nn.ConvTranspose1d(cout, cout, 4, 2, 1)]))
        self.final = nn.Sequential(_ConvBlock(channels[0], channels[0]), nn.Conv1d(channels[0], action_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        cond = torch.cat([self.time_mlp(_time_embedding(t, self.time_dim)), cond], dim=-1)
        h, skips = x.transpose(1, 2), []
        for block1, block2, down in self.down:
            h = block2(block1(h, cond), cond)
            skips.append(h)
            h = down(h)
        for block in self.mid:
            h = block(h, cond)
        for block1, block2, up in self.up:
            h = block2(block1(torch.cat([h, skips.pop()], dim=1), cond), cond)
            h = up(h)
        return self.final(h).transpose(1, 2)


class DiffusionPolicy(nn.Module):
    """Images + proprioception → an action chunk, by DDIM sampling of the conditional UNet.

    Args:
        mixer: the encoder's token mixer (any vitmix mixer name).
        fibottention: ``"official"`` (default; the robot code's form) or ``"masked"`` (the paper's).
        encoder: ``"small"`` (default) or ``"vit_b"``.
        proprio_min, proprio_max: per-dimension range of the proprioception (scaled to [-1, 1]).
        crop: side of the image crops the encoder sees (76 for Lift/Can's 84² images, 84 for PushT's 96²).
        timesteps: DDPM noise levels (100, as the official code).
    """

    def __init__(self, mixer: str = "softmax", fibottention: str = "official", encoder: str = "small",
                 action_dim: int = 7, proprio_dim: int = 9, proprio_min=None, proprio_max=None,
                 cameras: Sequence[str] = CAMERAS, n_obs: int = N_OBS, horizon: int = HORIZON,
                 timesteps: int = 100, crop: int = CROP):
        super().__init__()
        self.encoder = ViTImageEncoder(mixer, encoder, mixer_options(mixer, fibottention), crop)
        self.crop = crop
        self.cameras, self.n_obs, self.horizon, self.action_dim = tuple(cameras), n_obs, horizon, action_dim
        low = torch.tensor(proprio_min if proprio_min is not None else [-1.0] * proprio_dim)
        high = torch.tensor(proprio_max if proprio_max is not None else [1.0] * proprio_dim)
        self.register_buffer("proprio_low", low.float())
        self.register_buffer("proprio_span", (high - low).float().clamp_min(1e-6))
        cond_dim = n_obs * (len(self.cameras) * self.encoder.out_dim + proprio_dim)
        self.unet = ConditionalUnet1D(action_dim, cond_dim)
        self.diffusion = GaussianDiffusion(timesteps, schedule="cosine", prediction="eps")

    def condition(self, images: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """``images (B, T, cams, 3, S, S)`` uint8, ``proprio (B, T, P)`` → the UNet's global condition."""
        b, t, cams = images.shape[:3]
        x = images.flatten(0, 2).float() / 127.5 - 1.0
        feats = self.encoder(self._crop(x)).view(b, t, cams * self.encoder.out_dim)
        scaled = 2 * (proprio - self.proprio_low) / self.proprio_span - 1
        return torch.cat([feats, scaled], dim=-1).flatten(1)

    def _crop(self, x: torch.Tensor) -> torch.Tensor:
        """``crop``² crops of ``(M, 3, S, S)`` images: at a random place per image in training (as the
        official CropRandomizer), the centre in evaluation."""
        m, side, crop = x.shape[0], x.shape[-1], self.crop
        if not self.training:
            i = (side - crop) // 2
            return x[..., i:i + crop, i:i + crop]
        top, left = torch.randint(0, side - crop + 1, (2, m, 1), device=x.device)
        span = torch.arange(crop, device=x.device)
        rows, cols = (top + span)[:, :, None], (left + span)[:, None, :]            # (M, crop, 1), (M, 1, crop)
        return x[torch.arange(m, device=x.device)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)

    def loss(self, images, proprio, actions, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """The DDPM training loss of one batch (actions already in [-1, 1])."""
        return self.diffusion.training_loss(self.unet, actions, self.condition(images, proprio), generator)

    @torch.no_grad()
    def predict(self, images, proprio, steps: int = 10, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(B, horizon, action_dim)`` actions by ``steps`` DDIM steps."""
        cond = self.condition(images, proprio)
        return self.diffusion.sample(self.unet, cond, (self.horizon, self.action_dim), steps=steps,
                                     generator=generator, device=cond.device)
