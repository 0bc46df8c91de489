"""Shared test settings: deterministic, quiet, and light on the 2-core CI machine."""
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
# The Triton kernels are tested on CPU tensors by Triton's interpreter, which must be chosen before triton
# is first imported. A machine with a GPU runs them compiled: set TRITON_INTERPRET=0 there.
os.environ.setdefault("TRITON_INTERPRET", "1")
# importlib import mode (test files share names across folders): make tests/_memory.py importable.
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402

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
