"""Shared test settings: deterministic, quiet, and light on the 2-core CI machine; the real
Fashion-MNIST only for tests marked ``needs_fashion_mnist``."""
import functools
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402  (importing torch does not import triton)

# Without a GPU the Triton kernels are tested on CPU tensors by Triton's interpreter; with one they run
# compiled on CUDA tensors (tests/_triton_device.py). The choice must be made before triton is first
# imported; TRITON_INTERPRET set by hand wins.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
# importlib import mode (test files share names across folders): make tests/_memory.py importable.
sys.path.insert(0, os.path.dirname(__file__))

# Under pytest-xdist each worker gets one thread, so two workers don't oversubscribe two cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of small-shape tests (OpenMP fan-out only costs time there,
    badly so on a loaded 2-core machine); the previous setting comes back afterwards. Use it with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- Fashion-MNIST: `make test` must pass on a machine without Debian's dataset-fashion-mnist ----------------
#: what vitmix reads Fashion-MNIST from without --data-dir (vitmix.data.datasets.FASHION_MNIST_ENV, not
#: imported here: that would load timm before any test asks for it)
FASHION_MNIST_ENV = "VITMIX_FASHION_MNIST_DIR"
#: set to 1 (CI's normal pass does) to fail, not skip, the marked tests when the data is missing
REQUIRE_FASHION_MNIST_ENV = "VITMIX_TESTS_REQUIRE_FASHION_MNIST"
_USER_FASHION_MNIST_DIR = os.environ.get(FASHION_MNIST_ENV)   # read before any test changes it


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_fashion_mnist: reads the real Fashion-MNIST from its default location "
                                       "(skipped, with the reason, where it is not installed)")


@functools.lru_cache(maxsize=None)
def fashion_mnist_missing():
    """``None`` when the four Fashion-MNIST idx files are where vitmix looks without ``--data-dir``,
    else the reason a test that needs them skips."""
    from vitmix.data.datasets import _FASHION_FILES, fashion_mnist_dir
    from vitmix.data.idx import find_idx

    with pytest.MonkeyPatch.context() as mp:
        _reveal_fashion_mnist(mp)
        root = fashion_mnist_dir()
    absent = [stem for pair in _FASHION_FILES.values() for stem in pair if find_idx(root, stem) is None]
    if not absent:
        return None
    return (f"needs Fashion-MNIST in {root} ({absent[0]}[.gz] is missing): apt-get install dataset-fashion-mnist "
            f"or set {FASHION_MNIST_ENV}")


def _reveal_fashion_mnist(mp):
    if _USER_FASHION_MNIST_DIR is None:
        mp.delenv(FASHION_MNIST_ENV, raising=False)
    else:
        mp.setenv(FASHION_MNIST_ENV, _USER_FASHION_MNIST_DIR)


@pytest.fixture(scope="session", autouse=True)
def _hide_fashion_mnist(tmp_path_factory):
    """Every test runs as on a machine without Fashion-MNIST (an empty folder stands in for its
    location, also for the subprocesses a test starts), except those marked ``needs_fashion_mnist``: a
    test that reads the real data without the marker fails everywhere, not only on a fresh machine."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FASHION_MNIST_ENV, str(tmp_path_factory.mktemp("no-fashion-mnist")))
        yield


@pytest.fixture(autouse=True)
def _needs_fashion_mnist(request, monkeypatch):
    """For a test marked ``needs_fashion_mnist``: the real location back, or a skip saying what is missing.
    Per test: a module- or session-scoped fixture that reads the data would still see the empty folder."""
    if request.node.get_closest_marker("needs_fashion_mnist") is None:
        return
    why = fashion_mnist_missing()
    if why is not None:
        if os.environ.get(REQUIRE_FASHION_MNIST_ENV) == "1":
            pytest.fail(f"{REQUIRE_FASHION_MNIST_ENV}=1 but the test {why}")
        pytest.skip(why)
    _reveal_fashion_mnist(monkeypatch)


@pytest.fixture
def c_calls(monkeypatch):
    """Counts the one-call C forwards that produced an output: Nyström attention's (``"fused"``), the
    LaplacianFormer layer's (``"layer"``: inference, and the forward of training), its training path with
    the C backward (``"train"``) and the SOFT layer's (``"soft"``); a silent fallback leaves them at 0.
    Fails where the library cannot be built (no C compiler)."""
    from vitmix.mixers.fused import autograd, library
    from vitmix.ops.nystrom import c as nystrom_c

    if nystrom_c.NYSTROM_KERNEL.load() is None or library.LAYERS_KERNEL.load() is None:
        pytest.fail("no C compiler: the fused Nyström C libraries could not be built (install cc/gcc)")
    counts = {"fused": 0, "layer": 0, "train": 0, "soft": 0, "soft_train": 0}

    def spy(name: str, key: str, module=nystrom_c) -> None:
        real = getattr(module, name)

        def counted(*args, **kwargs):
            out = real(*args, **kwargs)
            counts[key] += out is not None
            return out
        monkeypatch.setattr(module, name, counted)
    spy("fused_forward", "fused")
    spy("laplacian_mix", "layer", library)
    spy("laplacian_mix_train", "train", autograd)
    spy("soft_mix", "soft", library)
    spy("soft_mix_train", "soft_train", autograd)
    return counts
