"""When the Triton kernels run, and the one-time warning when they cannot (private).

Triton is optional (``pip install vitmix[gpu]``). The ops choose it per call:

* ``backend="auto"`` (default): Triton for CUDA tensors when triton imports and the input is supported,
  otherwise the existing PyTorch/C path, silently for CPU tensors and with a one-time warning naming the
  reason for CUDA tensors the kernels do not support (dtype, head dim, ...).
* ``backend="triton"``: always Triton when it can run; when it cannot, a one-time warning names why and
  the PyTorch path runs. CPU tensors can run only under the interpreter (``TRITON_INTERPRET=1`` set
  before triton is imported), which is how the test-suite checks the kernels without a GPU.

A missing or broken triton never breaks ``import vitmix`` or CPU use: the import is attempted lazily,
once, and any failure is remembered as the reason.
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import Optional

import torch

#: values of the ``backend`` argument of the Triton-capable ops
TRITON_BACKENDS = ("auto", "triton", "torch")


@functools.lru_cache(maxsize=None)
def _import_error() -> Optional[str]:
    """``None`` when ``triton`` and ``triton.language`` import, else why not (one line)."""
    if os.environ.get("VITMIX_DISABLE_TRITON", "") not in ("", "0"):
        return "VITMIX_DISABLE_TRITON is set"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as err:  # ImportError, or a broken install raising anything else
        return f"triton is not importable ({type(err).__name__}: {err}); pip install 'vitmix[gpu]'"
    return None


def triton_available() -> bool:
    """Whether the Triton kernels can be imported at all."""
    return _import_error() is None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def check_backend(name: str, backend: str) -> None:
    """``ValueError`` for an unknown backend value."""
    if backend not in TRITON_BACKENDS:
        raise ValueError(f"{name}: unknown backend {backend!r}; choose one of {', '.join(TRITON_BACKENDS)}")


def device_reason(t: torch.Tensor) -> Optional[str]:
    """Why Triton cannot run on ``t``'s device, or ``None`` when it can."""
    if t.device.type == "cuda":
        return None
    if t.device.type == "cpu" and interpreting():
        return None
    return f"tensors on {t.device.type} (Triton runs on CUDA, or on CPU with TRITON_INTERPRET=1)"


def wants_triton(name: str, t: torch.Tensor, backend: str, unsupported: Optional[str] = None) -> bool:
    """Whether op ``name`` should run its Triton kernel on ``t``.

    ``unsupported`` is the op's own reason the input cannot use the kernel (``None`` when it can), e.g.
    ``"head dim 96 (supported: 16..128, a power of two)"``. Falls back with a one-time warning when the
    user asked for Triton, or when a CUDA tensor with ``backend="auto"`` cannot use it.
    """
    check_backend(name, backend)
    if backend == "torch" or torch.compiler.is_compiling():
        return False
    if backend == "auto" and t.device.type != "cuda":
        return False
    reason = _import_error() or device_reason(t) or unsupported
    if reason is None:
        return True
    warn_once(name, reason)
    return False


@functools.lru_cache(maxsize=None)
def warn_once(name: str, reason: str) -> None:
    """One warning per (op, reason) and process: the Triton kernel is skipped, the PyTorch path runs."""
    warnings.warn(f"vitmix: {name} runs the PyTorch path instead of Triton: {reason}", RuntimeWarning,
                  stacklevel=3)
