"""Shared by the generation tests: small models, one torch thread (tests/conftest.py's one_thread)."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _generation_one_thread(one_thread):
    yield
