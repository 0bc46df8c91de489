"""The recipes shipped with vitmix (``digits``, ``fashion-mnist``, ``cifar10``, ...), as YAML files
inside the package, so ``--config digits`` works from any folder of an installed vitmix. A clone's
``configs/*.yaml`` are links to these files: ``--config configs/digits.yaml`` names the same file.

>>> from vitmix.configs import resolve_config
>>> resolve_config("digits").name
'digits.yaml'
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import List, Union

from .._util import close_matches


def _packaged() -> dict:
    folder = resources.files(__name__)
    return {entry.name[:-5]: entry for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def list_configs() -> List[str]:
    """Names of the shipped recipes (``--config NAME``)."""
    return sorted(_packaged())


def resolve_config(config: Union[str, Path]) -> Path:
    """The YAML file ``--config`` means: the path itself when it exists; else, for a bare name
    (``digits``, ``digits.yaml``) or a clone's ``configs/NAME.yaml`` given outside the clone, the shipped
    recipe of that name. Anything else is a ``FileNotFoundError`` listing the shipped names."""
    path = Path(config)
    if path.is_file():
        return path
    parts = path.parts
    bare = len(parts) == 1 or (len(parts) == 2 and parts[0] == "configs")
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    packaged = _packaged()
    if bare and name in packaged:
        return Path(str(packaged[name]))
    hint = close_matches(name, packaged) if bare else ""
    raise FileNotFoundError(f"config file {config} does not exist.{hint} Shipped recipes (--config NAME): "
                            f"{', '.join(sorted(packaged))}")


__all__ = ["list_configs", "resolve_config"]
