"""Lazy package attributes (PEP 562), so that ``vitmix --help`` and ``import vitmix`` stay fast.

torch and timm take seconds to import; a package built with :func:`lazy_attributes` imports the
module behind a name only when the name is first used.
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable, Dict, List, Tuple


def lazy_attributes(package: str, exports: Dict[str, str]) -> Tuple[Callable[[str], object], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for ``package``; ``exports`` maps a name to ``".module:attr"``
    (or ``".module"`` for the module itself), relative to ``package``."""

    def __getattr__(name: str):
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attr = target.partition(":")
        try:
            value = importlib.import_module(module_name, package)
        except ImportError as err:        # a missing optional dependency (timm): hasattr() is False
            raise AttributeError(f"{package}.{name} is unavailable: {err}") from err
        if attr:
            value = getattr(value, attr)
        setattr(sys.modules[package], name, value)        # resolved once
        return value

    def __dir__() -> List[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
