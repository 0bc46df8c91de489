"""Deprecated alias of :mod:`vitmix.ops.kernel` (the module was split into the ``vitmix/ops/kernel/`` package).

``import vitmix.ops.kernels`` still works and warns once; import from :mod:`vitmix.ops` or
:mod:`vitmix.ops.kernel` instead. Nothing inside vitmix imports this module.
"""
import warnings

from . import kernel as _kernel
from .kernel import *  # noqa: F401,F403  (the public names, re-exported)
from .kernel import __all__  # noqa: F401

warnings.warn("vitmix.ops.kernels is deprecated: import from vitmix.ops or vitmix.ops.kernel instead",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str):
    """Private names of the old module, forwarded to the package (code that reached into it keeps running)."""
    return getattr(_kernel, name)
