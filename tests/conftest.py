"""Shared test settings: deterministic, quiet, and light on the 2-core CI machine."""
import os

os.environ.setdefault("TQDM_DISABLE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
