"""Fixtures of the ops tests."""
import pytest


@pytest.fixture
def calls(monkeypatch):
    """Counts of the Triton entry points that ran (a silent fallback would leave them at 0)."""
    from vitmix.ops.kernel import triton as kernel_triton      # only where triton is importable
    from vitmix.ops.newton import triton as newton_triton

    counts = {"forward": 0, "grads": 0, "newton": 0}

    def spy(module, name, key):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    spy(kernel_triton, "pair_forward", "forward")
    spy(kernel_triton, "pair_grads", "grads")
    spy(newton_triton, "iterate", "newton")
    return counts
