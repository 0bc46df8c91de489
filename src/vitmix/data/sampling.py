"""Randomness that does not depend on the world size: per-sample seeds, the training batch sampler
and the validation shards.

A training step sees one *global batch* (``world_size × batch_size`` images of one seeded
permutation of the epoch). Every random draw about one image is derived from ``(seed, epoch,
sample index)`` alone (:func:`sample_hash`): its augmentation (:class:`SeededSamples`) and its
drop-path decisions (``vitmix.runs.distributed.key_drop_path``). So a run on 2 ranks × 32 images
draws exactly what one process × 64 draws, image by image. :class:`GlobalBatchSampler` gives each
rank its part of the global batch in an order that keeps timm's ``Mixup`` pairs (image ``i`` with
image ``G - 1 - i`` of the global batch) on one rank.
"""
from __future__ import annotations

import random
from typing import Iterator, List, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

_GOLDEN, _MASK64 = 0x9E3779B97F4A7C15, (1 << 64) - 1


def _splitmix(z):
    """The splitmix64 finaliser, a bijection of 64-bit words whose outputs look independent; on a
    Python int or a uint64 array (whose arithmetic wraps modulo 2**64)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_hash(seed: int, epoch: int, stream: int, index):
    """A well-mixed 64-bit word per sample ``index`` (an int → an int; a sequence → a uint64 array),
    a function of ``(seed, epoch, stream, index)`` only. ``stream`` separates the draws about one
    image (0: augmentation; 1, 2, ...: the drop-path calls of a forward pass)."""
    h = seed & _MASK64
    for part in (epoch, stream):
        h = _splitmix(((h ^ (part & _MASK64)) + _GOLDEN) & _MASK64)
    if isinstance(index, (int, np.integer)):
        return _splitmix(((h ^ (int(index) & _MASK64)) + _GOLDEN) & _MASK64)
    keys = np.asarray(index, dtype=np.int64).astype(np.uint64)
    return _splitmix((keys ^ np.uint64(h)) + np.uint64(_GOLDEN))


def sample_uniform(seed: int, epoch: int, stream: int, indices) -> np.ndarray:
    """Uniform floats in ``[0, 1)`` (float64, 53 random bits), one per sample index."""
    return (sample_hash(seed, epoch, stream, indices) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


class SeededSamples(Dataset):
    """A training set whose items are drawn with Python's and torch's global RNGs (those timm's and
    torchvision's transforms draw from) seeded from ``(seed, epoch, index)``: item ``(index, epoch)``
    is ``(*base[index], index)``, so an image's random crop and flip are the same whichever rank,
    worker or batch position loads it.

    In the main process torch's RNG state is restored afterwards, so the training loop's own draws
    (e.g. dropout) do not depend on how many images were loaded; nothing in training draws from
    Python's ``random``, which is left as the last image set it (saving and restoring it per image
    would cost more than the image's own draws), and NumPy's (timm's ``Mixup``) is never touched."""

    def __init__(self, base: Dataset, seed: int):
        self.base, self.seed = base, seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: Tuple[int, int]):
        index, epoch = key
        seed = sample_hash(self.seed, epoch, 0, index)
        if get_worker_info() is not None:          # a worker's RNG states are its own
            return (*self._draw(index, seed), index)
        saved = torch.get_rng_state()
        try:
            return (*self._draw(index, seed), index)
        finally:
            torch.set_rng_state(saved)

    def _draw(self, index: int, seed: int):
        random.seed(seed)
        torch.default_generator.manual_seed(seed)   # CPU only: CUDA streams stay untouched
        return self.base[index]


def rank_positions(batch_size: int, world_size: int, rank: int) -> List[int]:
    """The positions in a global batch of ``world_size × batch_size`` that ``rank`` trains on, in
    its local order. For an even ``batch_size`` rank ``r`` takes the ``r``-th block of ``h =
    batch_size / 2`` positions from each end (``[r·h, (r+1)·h)`` then ``[G-(r+1)·h, G-r·h)``): its
    local ``flip(0)`` then pairs the same images as the global batch's, which is how timm's ``Mixup``
    pairs images. An odd ``batch_size`` (mixup needs an even one) takes the contiguous slice ``r``."""
    g = batch_size * world_size
    if batch_size % 2:
        return list(range(rank * batch_size, (rank + 1) * batch_size))
    h = batch_size // 2
    return list(range(rank * h, (rank + 1) * h)) + list(range(g - (rank + 1) * h, g - rank * h))


class GlobalBatchSampler(Sampler):
    """Batch sampler for training: each epoch, one permutation of ``range(n)`` seeded by ``seed +
    epoch`` (the same on every rank) is cut into global batches of ``world_size × batch_size``;
    ``rank`` gets its :func:`rank_positions` of each, as ``(index, epoch)`` keys for
    :class:`SeededSamples`. The incomplete last global batch is dropped; a set smaller than one
    global batch gives one smaller batch per rank (``n // world_size`` images each)."""

    def __init__(self, n: int, batch_size: int, world_size: int = 1, rank: int = 0, seed: int = 0):
        if n < world_size:
            raise ValueError(f"{n} training images cannot be split over {world_size} processes; "
                             "use more images (--train-subset) or fewer processes")
        self.n, self.world_size, self.rank, self.seed, self.epoch = n, world_size, rank, seed, 0
        self.batch_size = min(batch_size, n // world_size)
        self.positions = rank_positions(self.batch_size, world_size, rank)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[List[Tuple[int, int]]]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        g = self.batch_size * self.world_size
        for step in range(len(self)):
            batch = order[step * g:(step + 1) * g]
            yield [(batch[p], self.epoch) for p in self.positions]


class ShardSampler(Sampler):
    """Validation shard of ``rank``: indices ``rank, rank + world_size, ...`` without padding, so the
    ranks' shards together hold every image exactly once (torch's ``DistributedSampler`` repeats
    images to even the shards out, which a sum over ranks would count twice)."""

    def __init__(self, n: int, world_size: int = 1, rank: int = 0):
        self.indices: Sequence[int] = range(rank, n, world_size)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        return iter(self.indices)
