"""vitmix: efficient token mixers for vision transformers.

``import vitmix`` registers every vitmix model in timm, so ``timm.create_model("vit_nano_patch4_32")``
works; :func:`vitmix.create_model` additionally swaps the attention with ``mixer=``.
``vitmix.ops`` and ``vitmix.mixers`` need only torch: without timm installed they still import
and work, and only the model/training layers are unavailable.
"""
__version__ = "0.1.0"

from . import mixers  # noqa: E402
from .mixers import create as create_mixer, list_mixers, timm_attn  # noqa: E402

try:
    import timm  # noqa: F401
except ImportError:  # embedded use: ops and mixers only
    pass
else:
    from .models import create_model, list_models  # noqa: F401  (registers the models in timm)

__all__ = ["create_model", "create_mixer", "list_mixers", "list_models", "mixers", "timm_attn", "__version__"]
