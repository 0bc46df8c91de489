"""Deprecated alias of :mod:`vitmix.ops.diagonal` (the module was split into the ``vitmix/ops/diagonal/``
package).

``import vitmix.ops.sparse_diagonal`` still works and warns once; import from :mod:`vitmix.ops` or
:mod:`vitmix.ops.diagonal` instead. Nothing inside vitmix imports this module.
"""
import warnings

from . import diagonal as _diagonal
from .diagonal import *  # noqa: F401,F403  (the public names, re-exported)
from .diagonal import __all__  # noqa: F401

warnings.warn("vitmix.ops.sparse_diagonal is deprecated: import from vitmix.ops or vitmix.ops.diagonal instead",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str):
    """Private names of the old module, forwarded to the package (code that reached into it keeps running)."""
    return getattr(_diagonal, name)
