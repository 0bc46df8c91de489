"""What an installed vitmix carries: the shipped recipes (``--config digits`` from any folder) and one
version number."""
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import vitmix
from vitmix.configs import list_configs, resolve_config
from vitmix.train.cli import add_parser, config_from_args

ROOT = Path(__file__).parents[1]


def _train_args(*argv):
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    return sub.choices["train"].parse_args(list(argv))


@pytest.mark.parametrize("given", ["digits", "digits.yaml", "configs/digits.yaml"])
def test_config_is_found_by_name_and_by_the_clone_path_from_any_folder(tmp_path, monkeypatch, given):
    """Regression: `--config configs/digits.yaml` worked only inside a clone."""
    monkeypatch.chdir(tmp_path)
    cfg = config_from_args(_train_args("--config", given, "--epochs", "3"))
    assert (cfg.model, cfg.data, cfg.batch_size, cfg.epochs) == ("vit_nano_patch4_32", "digits", 32, 3)


def test_an_existing_path_wins_and_an_unknown_config_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits.yaml").write_text("epochs: 7\n")
    assert resolve_config("digits.yaml") == Path("digits.yaml")
    with pytest.raises(FileNotFoundError, match="Did you mean: fashion-mnist.*Shipped recipes"):
        resolve_config("fashion-mnis")
    with pytest.raises(FileNotFoundError, match="elsewhere/digits.yaml does not exist"):
        resolve_config("elsewhere/digits.yaml")      # a path outside configs/ never falls back to a recipe


def test_a_clones_configs_are_the_shipped_files():
    """One copy: every recipe in configs/ is a link to the file in the package."""
    linked = {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    assert linked == set(list_configs())
    for name in linked:
        assert (ROOT / "configs" / f"{name}.yaml").resolve() == resolve_config(name).resolve(), name


def test_the_version_is_written_once():
    """Regression: pyproject.toml, vitmix.__version__ and CITATION.cff each held it."""
    tomllib = pytest.importorskip("tomllib")      # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vitmix.__version__"}
    cff = re.search(r"^version: (\S+)$", (ROOT / "CITATION.cff").read_text(), re.M).group(1)
    assert cff == vitmix.__version__ == importlib.metadata.version("vitmix")


def test_the_wheel_ships_the_recipes_and_the_version(tmp_path):
    pytest.importorskip("setuptools")       # built offline with the installed setuptools
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "vitmix", src / "src" / "vitmix", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    wheel, = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(f"vitmix-{vitmix.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"vitmix/configs/{n}.yaml" for n in list_configs()} <= names
    for package in ("ops", "mixers/fused"):         # the C sources, compiled on first use
        csrc = ROOT / "src" / "vitmix" / package / "csrc"
        assert {f"vitmix/{package}/csrc/{p.name}" for p in csrc.iterdir() if p.suffix in (".c", ".h")} <= names


def test_the_project_metadata_describes_the_package():
    """Classifiers say what the package is; none names the license, which `license` (SPDX) already does."""
    tomllib = pytest.importorskip("tomllib")      # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    assert "Typing :: Typed" in classifiers and (ROOT / "src/vitmix/py.typed").is_file()
    assert "Topic :: Scientific/Engineering :: Image Recognition" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers) and project["license"] == "Apache-2.0"
