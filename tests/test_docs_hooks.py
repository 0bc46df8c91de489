"""The hooks the guides name exist on ``TokenMixer`` (each with its default), and the hooks list of
docs/adding-a-mixer.md covers every overridable hook the base class defines."""
import pathlib
import re

import pytest

from vitmix.mixers import TokenMixer

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def _guide_hooks() -> list:
    """The first backquoted name of each bullet under "## Optional hooks" in adding-a-mixer.md, plus the
    other backquoted names on a bullet's first line (``load_attention(state)`` and ``additive_terms``)."""
    text = (DOCS / "adding-a-mixer.md").read_text()
    section = text.split("## Optional hooks", 1)[1].split("\n## ", 1)[0]
    names = []
    for bullet in re.findall(r"^\* (.*)$", section, flags=re.M):
        head = bullet.split(":", 1)[0]
        names += [re.match(r"[A-Za-z_]\w*", code).group(0) for code in re.findall(r"`([^`]+)`", head)]
    return names


def _architecture_hooks() -> list:
    """The hooks listed in docs/architecture.md's row for what a model/bench/analysis needs to know."""
    row = next(line for line in (DOCS / "architecture.md").read_text().splitlines()
               if line.startswith("| something a model/bench/analysis needs to know about a mixer"))
    listed = re.sub(r"\([^)]*\)", "", row.split("|")[3].split(";")[0])   # asides in brackets name no default
    return re.findall(r"`([A-Za-z_]\w*)`", listed)


def test_the_guides_list_hooks():
    assert len(_guide_hooks()) >= 10 and len(_architecture_hooks()) >= 6
    # defined only by the mixers that pool landmarks (analyses tell them apart by it), so not in the list
    assert "landmark_count" not in _guide_hooks() and not hasattr(TokenMixer, "landmark_count")


@pytest.mark.parametrize("name", sorted(set(_guide_hooks() + _architecture_hooks())))
def test_every_hook_the_guides_name_exists_on_token_mixer(name):
    assert hasattr(TokenMixer, name), f"the guides name the hook {name!r}, which TokenMixer does not define"


def test_the_guide_lists_every_hook_of_the_base_class():
    # the class-level attributes and the overridable methods a mixer may change (not forward/mix/set_grid...)
    hooks = {"complexity", "spatial", "supports_attn_mask", "rejects_non_finite", "stage_options",
             "bench_options", "attention_map", "analytic_flops", "load_attention", "additive_terms"}
    assert hooks <= set(dir(TokenMixer))
    assert hooks <= set(_guide_hooks()), sorted(hooks - set(_guide_hooks()))
