"""Common corruptions of the ImageNet-C family (Hendrycks & Dietterich, "Benchmarking Neural Network
Robustness to Common Corruptions and Perturbations", ICLR 2019), in torch, for small images.

``corrupt(images, name, severity, seed=0)`` corrupts a batch ``(B, C, H, W)`` (or one image
``(C, H, W)``) of floats in ``[0, 1]``, i.e. *before* normalisation, with ``C`` = 1 (grey) or 3
(RGB), on any device. Shape, dtype and device are kept and the result stays in ``[0, 1]``.

**Parameters.** The tables are the authors' own scaling of ImageNet-C (224 px) to 32-px images,
CIFAR-10-C (``make_cifar_c.py`` of the official ``hendrycks/robustness`` repository), which is the
natural size of this project's inputs (digits and Fashion-MNIST are resized to the model's 16-32 px).
Photometric parameters (noise levels, brightness, contrast, JPEG quality) do not depend on the
image size. Parameters in pixels (blur radii and sigmas) are multiplied by ``max(1, side / 32)``:
a 224-px input gets 7× the CIFAR-10-C kernels, of the order of ImageNet-C's own values; smaller inputs
keep the 32-px kernels, because shrinking them would make sub-pixel kernels that degenerate to the
identity. Parameters relative to the image (pixelate, zoom) need no scaling.
``docs/robustness.md`` lists every value.

**Deviations from the official code** (which is numpy/OpenCV/ImageMagick on uint8 PIL images):
one tensor pipeline in float, no uint8 rounding between steps (JPEG excepted); motion blur is
ImageMagick's one-sided Gaussian line kernel built with integer pixel offsets; CIFAR-10-C's
motion-blur severity 4 (radius 8, σ 2) equals severity 3 (radius 6, σ 2) to 1e-8 (the radius only
truncates the kernel beyond 6σ), so severity 4 uses σ 2.25, halfway to severity 5. Left out: glass
blur (a sequential pixel-swapping loop), snow, frost, fog and spatter (texture files, ImageMagick,
plasma fractals), saturate (meaningless for grey images) and elastic transform (CIFAR-10-C's table
trades a shrinking random affine for a growing elastic field, so its severities are not ordered:
severity 1 moves pixels most).

**Randomness.** Each image draws from its own ``torch.Generator`` seeded by
``(seed, corruption, severity, index)``, where ``index`` is the image's position in the dataset
(``indices``, default ``0..B-1``). Draws are made on the CPU, so the noise of an image is the same
whatever the batch size, batch order or device (the filters themselves may round differently on a GPU).
"""
from __future__ import annotations

import hashlib
import io
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from .._util import close_matches

SEVERITIES = (1, 2, 3, 4, 5)
#: The image side (pixels) that the tables of pixel-sized parameters are written for (CIFAR-10-C).
REFERENCE_SIZE = 32

Generators = List[torch.Generator]


# --- random draws: one CPU generator per image -------------------------------------------------------------

def image_generators(seed: int, name: str, severity: int, indices: Sequence[int]) -> Generators:
    """One ``torch.Generator`` per image, seeded from ``(seed, name, severity, index)`` by a hash
    (so neighbouring seeds or indices give unrelated streams)."""
    gens = []
    for index in indices:
        key = hashlib.blake2b(f"{int(seed)}/{name}/{int(severity)}/{int(index)}".encode(), digest_size=8)
        gens.append(torch.Generator().manual_seed(int.from_bytes(key.digest(), "little")))
    return gens


def _draw(kind: Callable, shape, gens: Generators, like: Tensor) -> Tensor:
    """``kind(shape)`` drawn per image from its generator (float32 on the CPU), stacked onto ``like``."""
    return torch.stack([kind(shape, generator=g) for g in gens]).to(like)


# --- noise --------------------------------------------------------------------------------------------------

def gaussian_noise(x: Tensor, std: float, gens: Generators) -> Tensor:
    """Additive white Gaussian noise of standard deviation ``std``."""
    return (x + std * _draw(torch.randn, x.shape[1:], gens, x)).clamp(0, 1)


def shot_noise(x: Tensor, photons: float, gens: Generators) -> Tensor:
    """Poisson (photon) noise: ``Poisson(x · photons) / photons``; fewer photons, more noise."""
    rates = (x.detach().float().cpu() * photons).clamp(min=0)
    counts = torch.stack([torch.poisson(r, generator=g) for r, g in zip(rates, gens)]).to(x)
    return (counts / photons).clamp(0, 1)


def impulse_noise(x: Tensor, amount: float, gens: Generators) -> Tensor:
    """Salt-and-pepper noise (scikit-image's ``s&p``): a fraction ``amount`` of the values, drawn
    independently per channel, set to 0 or 1 with equal probability."""
    hit = _draw(torch.rand, x.shape[1:], gens, x) < amount
    salt = _draw(torch.rand, x.shape[1:], gens, x) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


def speckle_noise(x: Tensor, std: float, gens: Generators) -> Tensor:
    """Multiplicative Gaussian noise: ``x + x · N(0, std²)``."""
    return (x + x * std * _draw(torch.randn, x.shape[1:], gens, x)).clamp(0, 1)


# --- blur ---------------------------------------------------------------------------------------------------

def _filter2d(x: Tensor, kernel: Tensor) -> Tensor:
    """Correlate every channel with an odd ``(k, k)`` kernel; mirrored borders (OpenCV's default
    BORDER_REFLECT_101), edge replication when the image is too small to mirror."""
    pad = kernel.shape[-1] // 2
    mode = "reflect" if pad < min(x.shape[-2:]) else "replicate"
    channels = x.shape[1]
    weight = kernel.to(x).expand(channels, 1, *kernel.shape)
    return F.conv2d(F.pad(x, (pad,) * 4, mode=mode), weight, groups=channels)


def gaussian_kernel1d(sigma: float, radius: int) -> Tensor:
    """Normalised samples of a Gaussian of ``sigma`` at ``-radius..radius`` (float64)."""
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-offsets ** 2 / (2 * sigma * sigma))
    return kernel / kernel.sum()


def gaussian_blur(x: Tensor, sigma: float, gens: Generators) -> Tensor:
    """Gaussian blur of ``sigma`` pixels as scikit-image's ``gaussian`` in the official code:
    truncated at 4σ, edges replicated (its ``mode='nearest'``); two 1-D passes."""
    kernel = gaussian_kernel1d(sigma, int(4 * sigma + 0.5)).to(x)
    radius, channels = kernel.numel() // 2, x.shape[1]
    x = F.pad(x, (radius,) * 4, mode="replicate")
    x = F.conv2d(x, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)
    return F.conv2d(x, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels).clamp(0, 1)


def disk_kernel(radius: float, alias_sigma: float) -> Tensor:
    """ImageNet-C's defocus kernel: the pixels within ``radius`` of the centre, normalised, then
    smoothed by a 3×3 Gaussian of ``alias_sigma`` (5×5 when ``radius`` > 8) against aliasing; with
    a zero margin, so the smoothing never folds the disk back at the kernel's edge."""
    margin = 2 if radius > 8 else 1
    half = math.ceil(radius) + margin
    offsets = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((offsets[:, None] ** 2 + offsets[None, :] ** 2) <= radius ** 2).double()
    g = gaussian_kernel1d(alias_sigma, margin)
    return F.conv2d((disk / disk.sum())[None, None], torch.outer(g, g)[None, None], padding=margin)[0, 0]


def defocus_blur(x: Tensor, params: Tuple[float, float], gens: Generators) -> Tensor:
    """Defocus: correlation with a disk of ``params = (radius, alias_sigma)``."""
    return _filter2d(x, disk_kernel(*params)).clamp(0, 1)


def motion_taps(radius: float, sigma: float, angle_deg: float) -> List[Tuple[int, int, float]]:
    """ImageMagick's motion-blur kernel as ``(dy, dx, weight)`` taps: ``2·ceil(radius) + 1`` points
    ``i = 0, 1, …`` along the direction ``angle_deg`` (integer pixel offsets), weighted
    ``exp(-i² / 2σ²)`` and normalised: each pixel becomes a weighted mean of the pixels ahead of it
    along that direction (a one-sided blur)."""
    theta = math.radians(angle_deg)
    weights = [math.exp(-(i * i) / (2 * sigma * sigma)) for i in range(2 * math.ceil(radius) + 1)]
    total = sum(weights)
    return [(math.floor(i * math.sin(theta) + 0.5), math.floor(i * math.cos(theta) + 0.5), w / total)
            for i, w in enumerate(weights)]


def motion_blur(x: Tensor, params: Tuple[float, float], gens: Generators) -> Tensor:
    """Motion blur of ``params = (radius, sigma)`` in a direction drawn uniformly in ±45° per image;
    borders replicate the edge. Each tap is a gather of the whole batch at per-image offsets."""
    batch, channels, height, width = x.shape
    angles = [45.0 * (2 * float(torch.rand((), generator=g)) - 1) for g in gens]
    taps = [motion_taps(*params, a) for a in angles]
    rows, cols = torch.arange(height, device=x.device), torch.arange(width, device=x.device)
    out = torch.zeros_like(x)
    for i in range(len(taps[0])):
        dy = torch.tensor([t[i][0] for t in taps], device=x.device)
        dx = torch.tensor([t[i][1] for t in taps], device=x.device)
        w = torch.tensor([t[i][2] for t in taps], dtype=x.dtype, device=x.device)
        r = (rows[None] + dy[:, None]).clamp(0, height - 1)                          # (B, H)
        c = (cols[None] + dx[:, None]).clamp(0, width - 1)                           # (B, W)
        flat = (r[:, :, None] * width + c[:, None, :]).reshape(batch, 1, -1).expand(-1, channels, -1)
        out += w[:, None, None, None] * x.reshape(batch, channels, -1).gather(2, flat).view_as(x)
    return out.clamp(0, 1)


def zoom_blur(x: Tensor, zooms: int, gens: Generators) -> Tensor:
    """Zoom blur: the mean of the image and its zooms about the centre by ``1, 1.01, …`` (``zooms``
    factors; bilinear, as scipy's order-1 zoom of the official code)."""
    batch = x.shape[0]
    out = x.clone()
    for k in range(zooms):
        theta = torch.zeros(batch, 2, 3, dtype=x.dtype, device=x.device)
        theta[:, 0, 0] = theta[:, 1, 1] = 1 / (1 + 0.01 * k)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        out += F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return (out / (zooms + 1)).clamp(0, 1)


# --- photometric and digital --------------------------------------------------------------------------------

def brightness(x: Tensor, shift: float, gens: Generators) -> Tensor:
    """Add ``shift`` to the HSV value (clipped at 1) at fixed hue and saturation. RGB is linear in
    V at fixed H and S, so this is ``x · V'/V`` with ``V = max_c x``; black (V = 0, S = 0) becomes
    grey ``V'``; for one channel it is ``min(x + shift, 1)``."""
    value = x.amax(dim=1, keepdim=True)
    new_value = (value + shift).clamp(max=1)
    return torch.where(value > 0, x * (new_value / value.clamp(min=1e-12)), new_value).clamp(0, 1)


def contrast(x: Tensor, factor: float, gens: Generators) -> Tensor:
    """Shrink each channel towards its mean by ``factor``."""
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return ((x - mean) * factor + mean).clamp(0, 1)


def jpeg_compression(x: Tensor, quality: int, gens: Generators) -> Tensor:
    """JPEG round trip at ``quality`` through PIL, as the official code (the image is rounded to
    8 bits first; PIL's default 4:2:0 chroma subsampling for RGB)."""
    as_uint8 = (x.detach().float().cpu() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    decoded = []
    for image in as_uint8:
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, "JPEG", quality=int(quality))
        decoded.append(torch.from_numpy(np.asarray(Image.open(buffer)).copy()).reshape(image.shape))
    return (torch.stack(decoded).permute(0, 3, 1, 2).to(torch.float32) / 255).to(x)


def box_matrix(size: int, new_size: int) -> Tensor:
    """PIL's BOX resampling of a side of ``size`` pixels to ``new_size``, as a ``(new_size, size)``
    matrix computed with PIL's own double arithmetic (``precompute_coeffs`` in ``Resample.c``, ties
    included): output ``i`` averages the inputs ``j`` whose centres fall in its footprint when
    shrinking, and takes the nearest input when enlarging."""
    scale = size / new_size
    filter_scale = max(scale, 1.0)
    support = 0.5 * filter_scale
    centres = ((torch.arange(new_size, dtype=torch.float64) + 0.5) * scale)[:, None]
    first = torch.trunc(centres - support + 0.5).clamp(min=0)
    stop = torch.trunc(centres + support + 0.5).clamp(max=size)
    j = torch.arange(size, dtype=torch.float64)[None, :]
    offset = (j - centres + 0.5) * (1.0 / filter_scale)
    inside = ((j >= first) & (j < stop) & (offset > -0.5) & (offset <= 0.5)).double()
    return inside / inside.sum(1, keepdim=True)


def pixelate(x: Tensor, factor: float, gens: Generators) -> Tensor:
    """Resize each side to ``int(side · factor)`` and back, both with PIL's BOX filter as in the
    official code: blocks of constant value."""
    height, width = x.shape[-2:]
    small_h, small_w = max(1, int(height * factor)), max(1, int(width * factor))
    down = box_matrix(height, small_h).to(x) @ x @ box_matrix(width, small_w).to(x).T
    return box_matrix(small_h, height).to(x) @ down @ box_matrix(small_w, width).to(x).T


# --- the registry -------------------------------------------------------------------------------------------

def _pixels(param, size: int):
    """Scale a pixel-sized parameter (or a tuple of them) from 32 px to an image side of ``size``."""
    factor = max(1.0, size / REFERENCE_SIZE)
    return tuple(p * factor for p in param) if isinstance(param, tuple) else param * factor


@dataclass(frozen=True)
class Corruption:
    """One corruption: the function, its five CIFAR-10-C-sized parameters, and how they scale."""

    name: str
    apply: Callable[[Tensor, Any, Generators], Tensor]
    table: Tuple[Any, ...]                              # severities 1..5, for 32-px images
    scale: Optional[Callable[[Any, int], Any]] = None   # (parameter, image side) -> parameter
    random: bool = True

    def parameters(self, severity: int, size: int = REFERENCE_SIZE):
        """The parameter used at ``severity`` for images whose shorter side is ``size`` pixels."""
        value = self.table[check_severity(severity) - 1]
        return self.scale(value, size) if self.scale else value


def _defocus_scale(param, size):
    return (_pixels(param[0], size), param[1])          # the anti-aliasing blur is per pixel, as in ImageNet-C


_ALL = (
    Corruption("gaussian_noise", gaussian_noise, (0.04, 0.06, 0.08, 0.09, 0.10)),
    Corruption("shot_noise", shot_noise, (500, 250, 100, 75, 50)),
    Corruption("impulse_noise", impulse_noise, (0.01, 0.02, 0.03, 0.05, 0.07)),
    Corruption("speckle_noise", speckle_noise, (0.06, 0.10, 0.12, 0.16, 0.20)),
    Corruption("gaussian_blur", gaussian_blur, (0.4, 0.6, 0.7, 0.8, 1.0), _pixels, random=False),
    Corruption("defocus_blur", defocus_blur, ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
               _defocus_scale, random=False),
    Corruption("motion_blur", motion_blur, ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.25), (9, 2.5)), _pixels),
    Corruption("zoom_blur", zoom_blur, (6, 11, 16, 21, 26), random=False),     # how many factors 1, 1.01, …
    Corruption("brightness", brightness, (0.05, 0.10, 0.15, 0.20, 0.30), random=False),
    Corruption("contrast", contrast, (0.75, 0.50, 0.40, 0.30, 0.15), random=False),
    Corruption("pixelate", pixelate, (0.95, 0.90, 0.85, 0.75, 0.65), random=False),
    Corruption("jpeg_compression", jpeg_compression, (80, 65, 58, 50, 40), random=False),
)
CORRUPTIONS = {c.name: c for c in _ALL}


def list_corruptions() -> List[str]:
    """Corruption names in ImageNet-C's order (noise, blur, weather, digital)."""
    return list(CORRUPTIONS)


def get_corruption(name: str) -> Corruption:
    """The corruption called ``name`` (``ValueError`` with close matches otherwise)."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}." + close_matches(str(name), CORRUPTIONS)
                         + f" Available: {', '.join(CORRUPTIONS)}")
    return CORRUPTIONS[name]


def parse_corruptions(spec: Union[None, str, Sequence[str]] = None) -> List[str]:
    """``None``/``"all"`` → every corruption; ``"a,b"`` or ``["a", "b"]`` → those, checked, in order given."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return list_corruptions()
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names:
        raise ValueError("no corruption given: pass 'all' or names such as gaussian_noise,contrast")
    for name in names:
        get_corruption(name)
    return names


def check_severity(severity) -> int:
    """``severity`` as an int, or a ``ValueError`` unless it is an integer from 1 to 5."""
    if isinstance(severity, bool) or not isinstance(severity, numbers.Real) or severity not in SEVERITIES:
        raise ValueError(f"severity {severity!r} must be an integer from 1 to 5")
    return int(severity)


def parse_severities(spec: Union[str, Sequence[int]] = SEVERITIES) -> Tuple[int, ...]:
    """``"1,3,5"`` or ``(1, 3, 5)`` → sorted unique severities, each checked to be 1..5."""
    if isinstance(spec, str):
        try:
            values = [int(s) for s in spec.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"severities {spec!r} must be integers from 1 to 5, e.g. 1,3,5") from None
    else:
        values = list(spec)
    if not values:
        raise ValueError("no severity given: pass integers from 1 to 5, e.g. 1,3,5")
    return tuple(sorted({check_severity(v) for v in values}))


def corrupt(images: Tensor, name: str, severity: int, *, seed: int = 0,
            indices: Optional[Sequence[int]] = None) -> Tensor:
    """Apply corruption ``name`` at ``severity`` (1..5) to ``images`` in ``[0, 1]``, ``(B, C, H, W)``
    or ``(C, H, W)``, grey or RGB. ``indices`` are the images' positions in their dataset (they key
    the random streams; default ``0..B-1``). Computes in float32 (float64 for float64 input)."""
    corruption, severity = get_corruption(name), check_severity(severity)
    batch = _check_images(images)
    if indices is None:
        indices = range(batch.shape[0])
    elif len(indices) != batch.shape[0]:
        raise ValueError(f"{len(indices)} indices for {batch.shape[0]} images")
    work = batch if batch.dtype == torch.float64 else batch.float()
    gens = image_generators(seed, name, severity, indices) if corruption.random else []
    out = corruption.apply(work, corruption.parameters(severity, min(batch.shape[-2:])), gens)
    return out.to(images.dtype).reshape(images.shape)


def _check_images(images) -> Tensor:
    """``images`` as a 4-D batch, checked: floating point, 1 or 3 channels, values in [0, 1]."""
    if not isinstance(images, Tensor) or not images.is_floating_point() or images.dim() not in (3, 4):
        raise ValueError("images must be a float tensor (B, C, H, W) or (C, H, W) in [0, 1]")
    batch = images if images.dim() == 4 else images[None]
    if batch.shape[1] not in (1, 3):
        raise ValueError(f"images must have 1 (grey) or 3 (RGB) channels, got {batch.shape[1]} (shape "
                         f"{tuple(images.shape)}; channels come first)")
    if batch.numel() and (batch.min() < 0 or batch.max() > 1):
        raise ValueError(f"images must be in [0, 1] (corrupt before normalising), got values in "
                         f"[{batch.min().item():.3g}, {batch.max().item():.3g}]")
    return batch
