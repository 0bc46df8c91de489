"""Sample quality: the Fréchet distance in the feature space of a small classifier ("FD (classifier
features)").

FID (Heusel et al. 2017) is the Fréchet distance between Gaussians fitted to Inception-v3 pool
features of real and generated images. Inception weights cannot be downloaded here, and ImageNet
features mean little for 28×28 grey images anyway, so vitmix fits the Gaussians to the penultimate
features (128-d) of :class:`FeatureNet`, a tiny CNN trained on the *same* dataset (seeded, so every run
on the same data, image size and training subset trains the same network; the runner caches it). The
numbers are therefore comparable only between runs that use the same classifier, sample count and
real reference set — never with published FIDs.

    FD = ‖μ_r − μ_g‖² + tr(Σ_r) + tr(Σ_g) − 2 tr((Σ_r^{1/2} Σ_g Σ_r^{1/2})^{1/2})

The trace term equals ``tr((Σ_r Σ_g)^{1/2})`` (the matrices are similar); it is computed from two
symmetric eigendecompositions in float64, which stays real and stable for the rank-deficient
covariances of small samples (:func:`frechet_distance_reference` is the scipy ``sqrtm`` form used by
pytorch-fid, for the tests). FD has a positive bias that shrinks with the sample count, so compare runs
at the same count; ``vitmix.generate.runner.measure_fd`` reports it as ``fd_real_floor`` (real validation
vs real training images).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FD_LABEL", "FeatureNet", "fd_between", "features", "frechet_distance", "frechet_distance_reference",
           "gaussian_stats", "train_feature_net"]

FD_LABEL = "FD (classifier features)"


def gaussian_stats(feats: Tensor) -> Tuple[Tensor, Tensor]:
    """Mean ``(D,)`` and unbiased covariance ``(D, D)`` of ``(N, D)`` features, in float64."""
    if feats.dim() != 2 or feats.shape[0] < 2:
        raise ValueError(f"need (N >= 2, D) features, got shape {tuple(feats.shape)}")
    f = feats.double()
    return f.mean(0), torch.cov(f.T).reshape(f.shape[1], f.shape[1])


def _psd_sqrt(m: Tensor) -> Tensor:
    """Symmetric square root of a symmetric PSD matrix (negative rounding eigenvalues set to 0)."""
    vals, vecs = torch.linalg.eigh((m + m.T) / 2)
    return (vecs * vals.clamp(min=0).sqrt()) @ vecs.T


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """Fréchet (2-Wasserstein) distance² between ``N(mu1, sigma1)`` and ``N(mu2, sigma2)``."""
    mu1, mu2, sigma1, sigma2 = (torch.as_tensor(a, dtype=torch.float64) for a in (mu1, mu2, sigma1, sigma2))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (mu1.numel(), mu1.numel()):
        raise ValueError(f"mismatched Gaussian statistics: means {tuple(mu1.shape)}/{tuple(mu2.shape)}, "
                         f"covariances {tuple(sigma1.shape)}/{tuple(sigma2.shape)}")
    root1 = _psd_sqrt(sigma1)
    cross = torch.linalg.eigvalsh(root1 @ sigma2 @ root1).clamp(min=0).sqrt().sum()
    diff = mu1 - mu2
    return float(diff @ diff + sigma1.trace() + sigma2.trace() - 2 * cross)


def frechet_distance_reference(mu1, sigma1, mu2, sigma2) -> float:
    """The same distance with ``scipy.linalg.sqrtm(Σ1 Σ2)`` (pytorch-fid's formula), for tests."""
    from scipy import linalg

    mu1, mu2, sigma1, sigma2 = (np.asarray(a, dtype=np.float64) for a in (mu1, mu2, sigma1, sigma2))
    covmean = linalg.sqrtm(sigma1 @ sigma2)
    covmean = covmean.real if np.iscomplexobj(covmean) else covmean
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


class FeatureNet(nn.Module):
    """The FD feature extractor: two conv stages (32, 64 channels, 3×3, GELU, 2×2 max-pool), a 4×4
    adaptive average pool, a 128-d GELU layer (the features) and a linear classifier. Inputs are images
    in [−1, 1] of any size ≥ 4."""

    def __init__(self, in_chans: int, num_classes: int, feature_dim: int = 128):
        super().__init__()
        self.in_chans, self.num_classes, self.feature_dim = in_chans, num_classes, feature_dim
        self.convs = nn.Sequential(
            nn.Conv2d(in_chans, 32, 3, padding=1), nn.GELU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.GELU(), nn.MaxPool2d(2, ceil_mode=True),
            nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.embed = nn.Sequential(nn.Linear(64 * 16, feature_dim), nn.GELU())
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.embed(self.convs(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


@torch.no_grad()
def features(net: FeatureNet, images: Tensor, batch_size: int = 500) -> Tensor:
    """``(N, feature_dim)`` features of images in [−1, 1], in eval mode and batches."""
    net.eval()
    device = next(net.parameters()).device
    return torch.cat([net.features(images[i:i + batch_size].to(device)).cpu()
                      for i in range(0, len(images), batch_size)])


def _accuracy(net: FeatureNet, images: Tensor, labels: Tensor) -> float:
    net.eval()
    device = next(net.parameters()).device
    with torch.no_grad():
        hits = sum(int((net(images[i:i + 500].to(device)).argmax(1).cpu() == labels[i:i + 500]).sum())
                   for i in range(0, len(images), 500))
    return 100.0 * hits / len(images)


def train_feature_net(images: Tensor, labels: Tensor, num_classes: int, val: Optional[Tuple[Tensor, Tensor]] = None,
                      epochs: int = 2, batch_size: int = 128, lr: float = 2e-3, seed: int = 0,
                      progress=None) -> Tuple[FeatureNet, Optional[float]]:
    """Train :class:`FeatureNet` (Adam, cross-entropy, fixed seed) on images in [−1, 1]; returns the
    net (eval mode) and its validation accuracy in % (``None`` without ``val``)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = FeatureNet(images.shape[1], num_classes)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    batches = [(e, i) for e in range(epochs) for i in range(0, len(images), batch_size)]
    order = None
    net.train()
    for _epoch, start in (progress(batches) if progress else batches):
        if start == 0:
            order = torch.randperm(len(images), generator=gen)
        idx = order[start:start + batch_size]
        loss = F.cross_entropy(net(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    return net, (_accuracy(net, *val) if val is not None else None)


def fd_between(net: FeatureNet, real: Tensor, generated: Tensor) -> float:
    """FD (classifier features) between two image sets (any sizes ≥ 2 each)."""
    return frechet_distance(*gaussian_stats(features(net, real)), *gaussian_stats(features(net, generated)))
