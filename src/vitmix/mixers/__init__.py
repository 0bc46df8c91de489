"""Token mixers: one module per method, one registry, all importing only torch.

>>> from vitmix import mixers
>>> layer = mixers.create("softmax", dim=192, num_heads=3)
>>> mixers.list_mixers()            # doctest: +SKIP
>>> Attn = mixers.timm_attn("softmax", fused=False)   # a class for timm's attn_layer=
"""
from .base import NonFiniteInputError, TokenMixer, infer_grid, number_layers, resolve_grid, set_token_grid
from .registry import create, get_mixer_class, list_mixers, register_mixer, timm_attn
from .sequence import SequenceGrid

# Importing a method's module registers its mixers.
from . import softmax  # noqa: F401,E402
from . import fibottention  # noqa: F401,E402
from . import laplacian, soft  # noqa: F401,E402
from . import linear, nystromformer, performer  # noqa: F401,E402  (baselines)
from . import bigbird, linformer, longformer, topk  # noqa: F401,E402  (sparse and low-rank baselines)

__all__ = [
    "NonFiniteInputError", "SequenceGrid", "TokenMixer", "create", "get_mixer_class", "infer_grid", "list_mixers",
    "number_layers",
    "register_mixer", "resolve_grid", "set_token_grid", "timm_attn",
]
