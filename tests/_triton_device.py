"""The device the Triton kernel tests run on, or a module-level skip that says why they cannot run; and the
counters that prove a Triton entry point ran (a silent fallback leaves them at 0)."""
import pytest
import torch

from vitmix.ops import _triton


def triton_test_device() -> str:
    """``"cpu"`` under Triton's interpreter (``TRITON_INTERPRET=1``, set by ``conftest.py``), ``"cuda"`` with a
    GPU and the interpreter off; otherwise the calling test module is skipped with the reason."""
    if not _triton.triton_available():  # not installed, disabled (VITMIX_DISABLE_TRITON=1) or broken
        pytest.skip(f"the Triton kernels cannot run: {_triton._import_error()}", allow_module_level=True)
    if _triton.interpreting():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("no CUDA device and TRITON_INTERPRET is not 1", allow_module_level=True)


def count_calls(monkeypatch, counts, spies) -> None:
    """Wrap each ``(module, name, key)`` of ``spies`` so that a call adds 1 to ``counts[key]``."""
    for module, name, key in spies:
        real = getattr(module, name)

        def counted(*args, _real=real, _key=key, **kwargs):
            counts[_key] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
