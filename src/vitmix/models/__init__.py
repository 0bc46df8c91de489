"""Backbones registered in timm's model registry (importing this package registers them)."""
from . import vit  # noqa: F401
from . import fibottention  # noqa: F401
from . import weightformer  # noqa: F401
from . import pyramid  # noqa: F401
from . import timesformer  # noqa: F401  (video: timesformer_*)
from . import sequence  # noqa: F401  (1-D id sequences: seq_*)
from .dit import model_task  # noqa: F401  (registers dit_* / weightformer_dit_*: diffusion backbones)
from .factory import create_model, is_vitmix_model, list_models

__all__ = ["create_model", "is_vitmix_model", "list_models"]
