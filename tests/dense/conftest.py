"""Fixtures of the dense tests: a small synthetic garment array, so most tests need no Fashion-MNIST."""
import numpy as np
import pytest


def synthetic_garments(n: int = 30, seed: int = 0):
    """``n`` 28×28 uint8 "garments" (bright filled rectangles of varied shape on black) and labels 0–9."""
    rng = np.random.default_rng(seed)
    garments = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        top, left = rng.integers(1, 8, size=2)
        bottom, right = rng.integers(18, 27, size=2)
        garments[i, top:bottom, left:right] = rng.integers(120, 255, size=(bottom - top, right - left))
    return garments, np.arange(n) % 10


@pytest.fixture
def garments():
    return synthetic_garments()


@pytest.fixture
def scenes(garments):
    """A factory: ``scenes(**kwargs)`` → FashionScenes on the synthetic garments (128², 8 scenes)."""
    from vitmix.dense.scenes import FashionScenes

    def make(**kwargs):
        kwargs = dict(dict(size=128, length=8), **kwargs)
        return FashionScenes(*garments, **kwargs)
    return make


@pytest.fixture(autouse=True)
def _small_shapes_one_thread(one_thread):
    """Every dense test works on small tensors, where a second torch thread only waits (tests/conftest.py)."""
    yield


@pytest.fixture
def without_pycocotools(monkeypatch):
    """pycocotools looks uninstalled, as on a machine without the ``dense`` extra."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pycocotools" else real(name, *a))
