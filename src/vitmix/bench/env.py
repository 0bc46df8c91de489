"""The environment header written with every benchmark result."""
from __future__ import annotations

import datetime
import os
import platform

import torch


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - non-Linux
        pass
    return platform.processor() or platform.machine()


def environment(device="cpu") -> dict:
    """Machine and software facts that a benchmark number depends on."""
    device = torch.device(device)
    try:
        import timm

        timm_version = timm.__version__
    except Exception:  # pragma: no cover
        timm_version = None
    from .. import __version__

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "timm": timm_version,
        "vitmix": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "timing_method": ("CUDA events" if device.type == "cuda"
                          else f"torch.utils.benchmark, {torch.get_num_threads()} threads"),
    }
    try:
        env["load_average_1m"] = round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - platforms without getloadavg
        env["load_average_1m"] = None
    from .flops import UNIT

    env["flop_unit"] = UNIT
    return env


__all__ = ["environment", "cpu_model"]
