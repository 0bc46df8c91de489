"""Fixtures of the ops tests."""
import pytest
from _triton_device import count_calls


@pytest.fixture
def calls(monkeypatch):
    """Counts of the Triton entry points that ran (a silent fallback would leave them at 0)."""
    from vitmix.ops.kernel import triton as kernel_triton      # only where triton is importable
    from vitmix.ops.newton import triton as newton_triton

    counts = {"forward": 0, "grads": 0, "newton": 0}
    count_calls(monkeypatch, counts, [(kernel_triton, "pair_forward", "forward"),
                                      (kernel_triton, "pair_grads", "grads"), (newton_triton, "iterate", "newton")])
    return counts


#: what reads a tensor's value on the host (on a GPU each of these waits for the device)
_HOST_READS = ("__bool__", "item", "__int__", "__float__", "__index__", "tolist")


@pytest.fixture
def no_host_reads():
    """A context manager under which reading any tensor's value on the host raises ``AssertionError``."""
    import contextlib

    import torch

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read on the host: a sync on a GPU, and CUDA graphs cannot capture it")

    @contextlib.contextmanager
    def guard():
        with pytest.MonkeyPatch.context() as mp:
            for name in _HOST_READS:
                mp.setattr(torch.Tensor, name, refuse)
            yield
    return guard
