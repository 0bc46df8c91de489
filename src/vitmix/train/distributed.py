"""torchrun support: process-group set-up from the environment (nccl on CUDA, gloo on CPU)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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


def parse_device(device: str | None) -> torch.device:
    """``None`` → CUDA when available, else CPU; a device that does not exist here is a one-line error."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a device name; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU is usable here (torch.cuda.is_available() is False); "
                         "use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: vitmix trains on cpu or cuda")
    return dev


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
