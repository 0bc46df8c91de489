"""Lazy package attributes (PEP 562) and import hooks, so that ``vitmix --help`` and ``import vitmix`` stay fast.

torch and timm take seconds to import; a package built with :func:`lazy_attributes` imports the
module behind a name only when the name is first used, and :func:`call_after_import` runs the
registrations that need torch or timm (vitmix's models in timm, its custom ops in torch) only once
that module is there.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
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


def call_after_import(module: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` now if ``module`` is imported, else right after it finishes importing (once).

    A finder at the front of ``sys.meta_path`` wraps the module's loader; the callback runs when the
    module's code has run, before the ``import`` statement that loaded it returns.
    """
    if module in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _CallAfterImport(module, callback))


class _CallAfterImport(importlib.abc.MetaPathFinder):
    """One-shot finder of :func:`call_after_import`: removes itself at the first lookup of its module."""

    def __init__(self, module: str, callback: Callable[[], None]):
        self.module, self.callback = module, callback

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module, callback = spec.loader.exec_module, self.callback

            def exec_then_call(module):
                exec_module(module)
                callback()

            spec.loader.exec_module = exec_then_call
        return spec
