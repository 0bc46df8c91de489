"""Optional ``torch.compile`` of small pure-tensor functions on CPU, with a tested eager fallback (private).

:func:`call` runs ``torch.compile(fn)`` on large CPU problems (inductor fuses the elementwise work
around the GEMMs) and ``fn`` itself otherwise. If compiling or running the compiled code fails (no
C++ compiler, a corrupt or racing inductor cache, an inductor bug), compilation is switched off for
the rest of the process with one ``RuntimeWarning`` and the eager ``fn`` is called **with the same,
untouched arguments** — callers must pass inputs they do not modify. ``VITMIX_DISABLE_COMPILE=1``
turns compilation off from the start.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

_compiled = {}
_broken: Optional[str] = None


def enabled_for(t: torch.Tensor, work: int, min_work: int) -> bool:
    """Whether to use the compiled function for ``work`` elementary steps on ``t``'s device and dtype."""
    if _broken is not None or os.environ.get("VITMIX_DISABLE_COMPILE", "") not in ("", "0"):
        return False
    if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64) or work < min_work:
        return False
    # inside an outer torch.compile the eager code is traced anyway; under a dispatch mode
    # (MemTracker, FlopCounterMode, ...) inductor refuses to run
    return not (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None)


def disable(err: BaseException) -> None:
    """Switch compilation off for this process, with one warning saying why."""
    global _broken
    _broken = f"{type(err).__name__}: {err}"
    warnings.warn(f"vitmix: torch.compile failed, using the eager path from now on ({_broken[:300]}). "
                  "Set VITMIX_DISABLE_COMPILE=1 to silence this.", RuntimeWarning, stacklevel=3)


def reset() -> None:
    """Forget compiled functions and earlier failures (tests)."""
    global _broken
    _broken = None
    _compiled.clear()


def call(name: str, fn: Callable, args: tuple, work: int, min_work: int):
    """``fn(*args)``, through ``torch.compile`` when :func:`enabled_for` says so; eager on any failure."""
    if not enabled_for(args[0], work, min_work):
        return fn(*args)
    compiled = _compiled.get(name)
    try:
        if compiled is None:
            compiled = _compiled[name] = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(*args)
    except Exception as err:  # the compiler is machine-dependent: fall back, never crash training
        disable(err)
        return fn(*args)
