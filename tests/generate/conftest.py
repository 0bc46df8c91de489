"""Shared by the generation tests."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small models: OpenMP fan-out only costs time (badly so on a loaded 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
