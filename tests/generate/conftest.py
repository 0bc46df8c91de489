"""Shared by the generation tests: small models, one torch thread (tests/conftest.py's one_thread), and
FD classifiers cached in a temporary directory instead of the user's ``~/.cache/vitmix/fd``."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _generation_one_thread(one_thread):
    yield


@pytest.fixture(autouse=True, scope="module")
def fd_cache(tmp_path_factory):
    """The FD classifier cache of this test module (C kernels keep using the real cache)."""
    from vitmix.generate import runner

    cache = tmp_path_factory.mktemp("fd-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "_fd_cache_dir", lambda: cache)
        yield cache
