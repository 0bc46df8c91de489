"""The per-layer cache of attention patterns (private)."""
from __future__ import annotations

from typing import Callable, Dict, Hashable, TypeVar

import torch

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
