"""The environment header written with every benchmark result."""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from typing import Optional

import torch

from .._util import cpu_model  # noqa: F401  (re-exported: the header and the robot rows name the CPU alike)


def load_average() -> Optional[float]:
    """The 1-minute load average, or ``None`` where the platform has none (tested by making it fail)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def driver_version() -> Optional[str]:
    """The NVIDIA driver version from ``nvidia-smi``, or ``None`` where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi, or it failed: tested by making it fail
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def gpu_info(device) -> dict:
    """Name, compute capability, memory, SM count, driver and library versions of a CUDA device."""
    device = torch.device(device)
    props = torch.cuda.get_device_properties(device)
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # optional (vitmix[gpu]); a broken install is reported the same way
        triton_version = None
    return {
        "gpu": torch.cuda.get_device_name(device),
        "gpu_capability": f"{props.major}.{props.minor}",
        "gpu_memory_gib": round(props.total_memory / 2 ** 30, 1),
        "gpu_sm_count": props.multi_processor_count,
        "gpu_count": torch.cuda.device_count(),
        "driver": driver_version(),
        "cudnn": torch.backends.cudnn.version(),
        "triton": triton_version,
    }


def environment(device="cpu") -> dict:
    """Machine and software facts that a benchmark number depends on."""
    device = torch.device(device)
    import timm  # a dependency of vitmix

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
        "timm": timm.__version__,
        "vitmix": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "timing_method": ("CUDA events" if device.type == "cuda"
                          else f"torch.utils.benchmark, {torch.get_num_threads()} threads"),
    }
    if device.type == "cuda":
        env.update(gpu_info(device))
    env["load_average_1m"] = load_average()
    from .flops import UNIT

    env["flop_unit"] = UNIT
    return env


def _slug(name: str) -> str:
    """``"Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz"`` -> ``"intel-xeon-platinum-8480"``."""
    name = re.sub(r"\((R|TM)\)|@.*$|\b(CPU|Processor|NVIDIA|\d+-Core)\b", " ", name, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def machine_tag(env: Optional[dict] = None) -> str:
    """A file-name-safe name of the machine a timing comes from, e.g. ``cpu-amd-epyc-2c-torch2.14`` or
    ``gpu-h100-80gb-hbm3-torch2.11``.

    Timings depend on the CPU or GPU and the torch release more than on vitmix, so every timing writer puts
    its results under a folder of this name: a run on one machine never replaces another machine's table.
    ``env`` is an :func:`environment` dict (measured now when omitted).
    """
    env = env if env is not None else environment()
    torch_version = ".".join(env["torch"].split("+")[0].split(".")[:2])
    if str(env.get("device", "cpu")).startswith("cuda"):
        return f"gpu-{_slug(env['device_name'])}-torch{torch_version}"
    return f"cpu-{_slug(env['cpu'])}-{env['cpu_count']}c-torch{torch_version}"


__all__ = ["environment", "machine_tag", "cpu_model", "load_average", "gpu_info", "driver_version"]
