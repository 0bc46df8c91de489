"""The device a job runs on, parsed once for every command (``--device``)."""
from __future__ import annotations

from typing import Optional

import torch


def default_device() -> torch.device:
    """CUDA when a GPU is usable here, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(device: Optional[str]) -> torch.device:
    """``None`` → :func:`default_device`; a device that does not exist here is a one-line ``ValueError``."""
    if device is None:
        return default_device()
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
