"""docs/adding-a-mixer.md: its code blocks run as written, and the mixer they define passes the
same contract tests as vitmix's own mixers."""
import importlib.util
import pathlib
import re

import pytest

from vitmix import mixers
from vitmix.mixers import registry

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "adding-a-mixer.md"


@pytest.fixture(scope="module")
def linear_elu():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 2
    namespace = {}
    if "linear_elu" not in mixers.list_mixers():
        exec(compile(blocks[0], str(DOC), "exec"), namespace)
    exec(compile(blocks[1], str(DOC), "exec"), namespace)
    yield namespace
    registry._MIXERS.pop("linear_elu", None)     # other tests count the registered mixers


def test_the_worked_example_runs(linear_elu):
    assert linear_elu["y"].shape == (2, 65, 64)
    assert linear_elu["logits"].shape == (2, 10)
    assert mixers.get_mixer_class("linear_elu").complexity == "linear"


@pytest.mark.parametrize("check", ["test_shape_and_gradients_with_explicit_non_square_grid",
                                   "test_grid_passed_per_call_matches_grid_bound_at_construction",
                                   "test_drops_into_stock_timm_vision_transformer",
                                   "test_rejects_wrong_input_shape_and_unknown_option"])
def test_the_example_passes_the_mixer_contract(linear_elu, check):
    spec = importlib.util.spec_from_file_location("contract_checks", DOC.parents[1] / "tests" / "mixers" /
                                                  "test_contract.py")
    contract = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(contract)
    fn = getattr(contract, check)
    kwargs = {"name": "linear_elu"}
    if check == "test_shape_and_gradients_with_explicit_non_square_grid":
        for batch in (1, 3):
            for prefix in (0, 1):
                fn(batch=batch, prefix=prefix, **kwargs)
    else:
        fn(**kwargs)


def test_the_example_is_benchmarked(linear_elu):
    from vitmix.bench import BenchConfig, run_sweep

    result = run_sweep(BenchConfig(kind="mixers", names=["linear_elu"], sizes=[64], dim=64, heads=4,
                                   passes=("fwd",), min_run_time=0.01, measure_memory=False))
    assert {r["name"] for r in result.rows if r["status"] == "ok"} >= {"linear_elu", "softmax"}


def test_mixers_from_entry_points_are_loaded_once_and_broken_ones_warn(tmp_path, monkeypatch):
    """A third-party package's `vitmix.mixers` entry point is imported on first lookup."""
    import importlib.metadata
    import sys

    (tmp_path / "third_party_mixer.py").write_text(
        "from vitmix.mixers import register_mixer\n"
        "from vitmix.mixers.softmax import SoftmaxAttention\n"
        "@register_mixer('third_party')\n"
        "class ThirdParty(SoftmaxAttention):\n"
        "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [importlib.metadata.EntryPoint("third_party", "third_party_mixer", registry.ENTRY_POINT_GROUP),
              importlib.metadata.EntryPoint("broken", "no_such_module_xyz", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [p for p in points if p.group == group])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        with pytest.warns(RuntimeWarning, match="'broken'.*failed to load"):
            layer = mixers.create("third_party", 32, 2)
        assert type(layer).__name__ == "ThirdParty" and "third_party" in mixers.list_mixers()
    finally:
        registry._MIXERS.pop("third_party", None)
        sys.modules.pop("third_party_mixer", None)
