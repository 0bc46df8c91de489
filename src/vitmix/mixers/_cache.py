"""The per-layer cache of attention patterns (private)."""
from __future__ import annotations

from typing import Callable, Dict, Hashable, TypeVar

import torch

from ..ops.fibonacci import offsets_mask
from ..ops.sparse_diagonal import diagonal_plan

T = TypeVar("T")


def cached_pattern(cache: Dict[Hashable, object], key: Hashable, build: Callable[[], T]) -> T:
    """``build()``, kept in ``cache`` under ``key`` for the next eager call.

    While ``torch.compile`` traces, the pattern is built without touching the cache: the graph holds it as a
    constant anyway, and a new cache entry would change what dynamo guards on (a second compilation at the
    next call).
    """
    if torch.compiler.is_compiling():
        return build()
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = build()
    return hit


def diagonal_pattern(mixer, kind: str, num_tokens: int, prefix: int, device):
    """The pattern of a multi-diagonal mixer (one with ``head_offsets(N)`` and a ``_cache``, e.g. Fibottention,
    Longformer): ``kind="plan"`` gives the sparse op's plan (while traced: the offsets, all the custom op
    needs), ``kind="mask"`` the dense ``(heads, T, T)`` mask of the reference modes."""
    def build():
        offsets = mixer.head_offsets(num_tokens)
        if kind == "mask":
            return offsets_mask(offsets, num_tokens, prefix, device=device)
        return offsets if torch.compiler.is_compiling() else diagonal_plan(offsets, num_tokens, device)
    return cached_pattern(mixer._cache, (kind, num_tokens, prefix, str(device)), build)
