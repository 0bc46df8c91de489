"""vitmix: efficient token mixers for vision transformers.

``import vitmix`` is light: torch and timm load when a name below is first used. vitmix's models
are registered in timm as soon as both are loaded (``import timm, vitmix`` or ``import vitmix,
timm`` in either order), so ``timm.create_model("vit_nano_patch4_32")`` works;
:func:`vitmix.create_model` additionally swaps the attention with ``mixer=``. Likewise its custom
ops (``torch.ops.vitmix.*``) are registered as soon as torch is loaded, so ``torch.export.load``
of a vitmix ``.pt2`` file needs only ``import vitmix``. ``vitmix.ops`` and
``vitmix.mixers`` need only torch: without timm installed they import and work, and only the
model/training layers are unavailable.
"""
import importlib
import warnings

from ._lazy import call_after_import, lazy_attributes

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_attributes(__name__, {
    "create_model": ".models:create_model",
    "convert": ".conversion:convert",
    "load_model": ".runs:load_model",
    "save_pretrained": ".hub:save_pretrained",
    "push_to_hub": ".hub:push_to_hub",
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


def _register_ops() -> None:
    """``torch.ops.vitmix.*``, which ``torch.export.load`` of a vitmix program looks up (0.1-0.2 s of import)."""
    try:
        importlib.import_module(".ops", __name__)
    except Exception as err:      # noqa: BLE001 - runs inside the user's `import torch`: never break it
        warnings.warn(f"vitmix custom ops are not registered in torch: {err}", stacklevel=3)


call_after_import("torch", _register_ops)
call_after_import("timm", _register_models)

__all__ = ["create_model", "load_model", "create_mixer", "list_mixers", "list_models", "mixers", "push_to_hub",
           "save_pretrained", "timm_attn", "__version__"]
