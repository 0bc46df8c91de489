"""The device a job runs on, parsed once for every command (``--device``: train, generate, eval, bench)."""
from __future__ import annotations

from typing import Optional

import torch


def default_device() -> torch.device:
    """CUDA when a GPU is usable here, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(device: Optional[str], hint: str = "; use --device cpu") -> torch.device:
    """``None`` or ``"auto"`` → :func:`default_device`; a device that does not exist here is a one-line
    ``ValueError`` (the missing-GPU message ends with ``hint``)."""
    if device is None or device == "auto":
        return default_device()
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a device name; use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: vitmix runs on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is visible (torch.cuda.is_available() is False){hint}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return dev
