"""vitmix: efficient token mixers for vision transformers.

``import vitmix`` is light: torch and timm load when a name below is first used. vitmix's models
are registered in timm as soon as both are loaded (``import timm, vitmix`` or ``import vitmix,
timm`` in either order), so ``timm.create_model("vit_nano_patch4_32")`` works;
:func:`vitmix.create_model` additionally swaps the attention with ``mixer=``. ``vitmix.ops`` and
``vitmix.mixers`` need only torch: without timm installed they import and work, and only the
model/training layers are unavailable.
"""
import importlib.abc
import importlib.util
import sys
import warnings

from ._lazy import lazy_attributes

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_attributes(__name__, {
    "create_model": ".models:create_model",
    "load_model": ".train.runner:load_model",
    "list_models": ".models:list_models",
    "create_mixer": ".mixers:create",
    "list_mixers": ".mixers:list_mixers",
    "timm_attn": ".mixers:timm_attn",
    "mixers": ".mixers",
    "ops": ".ops",
    "models": ".models",
})


def _register_models() -> None:
    try:
        importlib.import_module(".models", __name__)
    except ImportError as err:               # e.g. a timm too old for vitmix: ops/mixers still work
        warnings.warn(f"vitmix models are not registered in timm: {err}", stacklevel=3)


class _RegisterWhenTimmLoads(importlib.abc.MetaPathFinder):
    """Registers vitmix's models right after ``timm`` finishes importing (one shot)."""

    def find_spec(self, name, path=None, target=None):
        if name != "timm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_register(module):
                exec_module(module)
                _register_models()

            spec.loader.exec_module = exec_then_register
        return spec


if "timm" in sys.modules:
    _register_models()
elif not any(isinstance(f, _RegisterWhenTimmLoads) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenTimmLoads())

__all__ = ["create_model", "load_model", "create_mixer", "list_mixers", "list_models", "mixers", "timm_attn",
           "__version__"]
