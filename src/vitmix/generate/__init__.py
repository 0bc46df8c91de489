"""Class-conditional image generation: DDPM/DDIM diffusion, training loop, sample grids and the
FD (classifier features) metric; the ``vitmix generate`` command. See ``docs/generation.md``.

>>> from vitmix.generate import GaussianDiffusion, train_generator, GenerateConfig   # doctest: +SKIP

Names are imported on first use, so ``vitmix --help`` does not load torch through this package.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "GaussianDiffusion": ".diffusion", "guided": ".diffusion", "make_betas": ".diffusion",
    "FeatureNet": ".fd", "frechet_distance": ".fd", "gaussian_stats": ".fd", "train_feature_net": ".fd",
    "GenerateConfig": ".config",
    "train_generator": ".runner", "sample_grid": ".runner", "measure_checkpoint_fd": ".runner",
    "load_generator": ".runner",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
