"""Helpers shared by the sparse mixers (Longformer, BigBird, Fibottention; private): their ``mode`` /
``backend`` checks, the prefix-only grid (patch tokens as one row, so any length works), and the per-layer
cache of their attention patterns (plans of the sparse ops, dense masks of the reference modes)."""
from __future__ import annotations

from typing import Callable, Dict, Hashable, Optional, Tuple, TypeVar

import torch

from ..ops.fibonacci import offsets_mask
from ..ops.diagonal import BACKENDS, diagonal_plan
from .base import TIMM_DEFAULT_PREFIX, TokenMixer, close_matches

#: how a sparse baseline applies its pattern: truly sparse, or dense with -inf outside it
SPARSE_MODES = ("sparse", "masked")


def check_sparse_options(name: str, mode: str, backend: Optional[str], attn_drop: float) -> None:
    """Shared checks of the sparse baselines' ``mode``/``backend``/``attn_drop``."""
    choices = (("mode", mode, SPARSE_MODES),) + ((("backend", backend, BACKENDS),) if backend is not None else ())
    for key, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"{name} {key}={value!r} is not one of {', '.join(allowed)}."
                             + close_matches(str(value), allowed))
    if mode == "sparse" and attn_drop:
        raise ValueError(f"{name} mode='sparse' does not implement attention dropout; use attn_drop=0 or "
                         f"mode='masked'")


def prefix_only_grid(mixer: TokenMixer, n_tokens: int, hw, num_prefix_tokens):
    """``(hw, prefix)`` for a mixer that needs only the prefix count: with a prefix count and no
    grid (per call or on the mixer), the patch tokens are taken as one row, so any length works. Told
    nothing, timm's default of one CLS token is the prefix (never a count guessed from N)."""
    prefix = num_prefix_tokens if num_prefix_tokens is not None else mixer.num_prefix_tokens
    if prefix is None and hw is None and mixer.hw is None:
        prefix = TIMM_DEFAULT_PREFIX
    if hw is None and mixer.hw is None and prefix is not None:
        if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
            raise ValueError(f"num_prefix_tokens must be a non-negative int, got {prefix!r}")
        if prefix >= n_tokens:
            raise ValueError(f"num_prefix_tokens={prefix} must be smaller than the sequence length N={n_tokens} "
                             f"({mixer.mixer_name} needs at least one patch token)")
        hw = (1, n_tokens - prefix)
    return hw, prefix


class PrefixOnlyGrid:
    """Mixin (before ``TokenMixer``) for mixers that need only the prefix count, not the 2-D grid."""

    def _map_grid(self, x: torch.Tensor, hw, num_prefix_tokens):
        """The resolved grid of ``attention_map``'s input (any length when only a prefix count is known)."""
        if self.sequence:
            return self.token_grid(x.shape[1], hw, num_prefix_tokens)
        hw, prefix = prefix_only_grid(self, x.shape[1], hw, num_prefix_tokens)
        return self.token_grid(x.shape[1], hw, prefix)

    def _prefix_qkv(self, x: torch.Tensor, grid):
        """``(prefix, n, q, k, v)``: prefix and patch-token counts, and the projected heads."""
        prefix = grid[0]
        return (prefix, x.shape[1] - prefix, *self._qkv(x))

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False, *,
                hw: Optional[Tuple[int, int]] = None, num_prefix_tokens: Optional[int] = None,
                **options) -> torch.Tensor:
        """``(B, N, C) -> (B, N, C)``; with ``num_prefix_tokens`` and no grid, any length works (a 1-D
        sequence, ``sequence=True``, needs neither)."""
        sequence = options.get("sequence")
        if x.dim() == 3 and not (self.sequence if sequence is None else sequence):
            hw, num_prefix_tokens = prefix_only_grid(self, x.shape[1], hw, num_prefix_tokens)
        return super().forward(x, attn_mask, is_causal, hw=hw, num_prefix_tokens=num_prefix_tokens, **options)


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


__all__ = ["SPARSE_MODES", "PrefixOnlyGrid", "cached_pattern", "check_sparse_options", "diagonal_pattern",
           "prefix_only_grid"]
