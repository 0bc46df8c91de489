"""torchrun support: process-group set-up from the environment (nccl on CUDA, gloo on CPU), and
drop path keyed to the sample so that it does not depend on the world size."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from timm.layers import DropPath
from torch import nn

from ..data.sampling import sample_uniform
from .device import parse_device


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None) -> DistInfo:
    """Initialise from torchrun's env vars (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``) if present."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = parse_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local if world > 1 else (dev.index or 0))
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world, local, dev)


def all_reduce_sum(values, info: DistInfo):
    """Sum a list of floats over all ranks (identity when not distributed)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.tolist()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


class SampleKeys:
    """Which images the current micro-batch holds (``(seed, epoch, indices)``) and how many drop-path
    calls its forward pass has made: drop-path call ``k`` keeps image ``i`` iff
    ``sample_uniform(seed, epoch, 1 + k, i) < keep_prob``, whatever the rank or batch position.

    ``by_module``: key each call by its module's number instead (the ``k``-th drop-path module in the
    model), for gradient checkpointing, whose backward pass runs a block's forward again and must
    draw the same masks; for a model that calls its drop-path modules once each, in order (timm's ViT),
    both keys are the same."""

    def __init__(self, seed: int, by_module: bool = False):
        self.seed, self.epoch, self.indices, self.calls, self.by_module = seed, 0, None, 0, by_module

    def start(self, epoch: int, indices) -> None:
        """Called before each micro-batch's forward with the sample indices of its rows."""
        self.epoch, self.indices, self.calls = epoch, np.asarray(indices, dtype=np.int64), 0

    @torch.compiler.disable        # host-side NumPy hashing: kept out of torch.compile's graphs
    def keep_mask(self, x: torch.Tensor, keep_prob: float, scale: bool, module: int = 0) -> torch.Tensor:
        if len(self.indices) != x.shape[0]:
            raise RuntimeError(f"drop path got a batch of {x.shape[0]} rows for {len(self.indices)} sample "
                               "indices; a model that folds other axes into the batch axis cannot key drop path")
        self.calls += 1
        call = module if self.by_module else self.calls
        keep = sample_uniform(self.seed, self.epoch, call, self.indices) < keep_prob
        mask = torch.from_numpy(keep).to(device=x.device, dtype=x.dtype)
        if keep_prob > 0.0 and scale:
            mask = mask / keep_prob
        return mask.reshape((x.shape[0],) + (1,) * (x.ndim - 1))


class KeyedDropPath(DropPath):
    """timm's ``DropPath`` with its per-sample decisions taken from :class:`SampleKeys` (timm draws
    them from the global RNG over the local batch, so they depend on the rank and the batch split).
    Without sample indices (a loader that gives none) it draws as timm does; in eval it is the identity."""

    def __init__(self, drop_prob: float, scale_by_keep: bool, keys: SampleKeys, number: int = 0):
        super().__init__(drop_prob, scale_by_keep)
        self.keys, self.number = keys, number     # number: 1 + its place among the model's drop paths

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training or self.keys.indices is None:
            return super().forward(x)
        return x * self.keys.keep_mask(x, 1.0 - self.drop_prob, self.scale_by_keep, self.number)


def key_drop_path(model: nn.Module, seed: int, by_module: bool = False) -> Optional[SampleKeys]:
    """Replace every timm ``DropPath`` in ``model`` by a :class:`KeyedDropPath` sharing one
    :class:`SampleKeys` (returned; ``None`` when the model has no drop path). DropPath holds no
    weights, so state dicts and eval outputs are unchanged. ``by_module``: see :class:`SampleKeys`
    (for gradient checkpointing)."""
    keys = SampleKeys(seed, by_module)
    found = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, DropPath) and not isinstance(child, KeyedDropPath):
                found += 1
                setattr(parent, name, KeyedDropPath(child.drop_prob, child.scale_by_keep, keys, found))
    return keys if found else None
