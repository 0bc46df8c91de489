"""The device the Triton kernel tests run on, or a module-level skip that says why they cannot run."""
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
