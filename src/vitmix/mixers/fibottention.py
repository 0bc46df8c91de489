"""Fibottention: per-head Wythoff/Fibonacci dilated attention (Rahimian et al., arXiv 2406.19391).

Head ``h`` of layer ``l`` lets each patch token attend to the patch tokens at raster distances
``± d`` for ``d`` in a small offset set ``F_h`` (a generalised Fibonacci sequence seeded by a row
of the Wythoff array, cut at a per-head window ``w_min..w_max``; heads shuffled per layer) and to
the prefix (CLS) tokens, which in turn attend to everything. About 2 % of the patch pairs at
ViT-B/16 224² (N = 196, 12 heads). See :mod:`vitmix.ops.fibonacci` for the offsets.

``mode=`` chooses how the pattern is applied:

- ``"sparse"`` (default): true sparse computation, O(N·|F|·d) time and memory in forward and
  backward (:func:`vitmix.ops.diagonal.sparse_diagonal_attention`);
- ``"masked"``: dense scores with ``-inf`` outside the pattern — the same function as
  ``"sparse"``, O(N²), the reference;
- ``"official"``: the official code's multiplicative 0/1 mask on the logits (masked keys keep
  weight ``e⁰/Z``), O(N²), for reproducing the official numbers.

``preset="official"`` gives the official image code's behaviour where vitmix departs from it: the
multiplicative mask (``mode="official"``), Python's ``random`` head order (``shuffle="official"``)
and one head order for every layer (``shuffle_per_layer=False``: the official module-global mask
cache is built by layer 0 and reused by all layers); see ``docs/presets.md``.

``preset="robot"`` is the official *robot-learning* code's form (its ViT image encoder of a diffusion
policy): the modified Wythoff rows (``variant="modified_legacy"``), a window of ``N`` for every head
(``windows="full"``), the multiplicative mask and Python's head order drawn anew in every layer — a
density of 10.8 % of the patch pairs at N = 81 with 12 heads. ``preset="robot", mode="masked"`` is the
same pattern applied as the paper describes it (−∞ outside the pattern); see ``docs/robot.md``.

Layer index: timm's ``Block`` does not tell its attention module where it sits, but the head
shuffle depends on it. vitmix's Fibottention models set it; for a stock timm model call
:func:`assign_layer_indices` after building it (``layer_idx=None`` behaves as layer 0).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..ops.fibonacci import SHUFFLES, VARIANTS, _as_int, fibonacci_offsets, interaction_counts
from ..ops.diagonal import (
    BACKENDS, masked_diagonal_attention, official_diagonal_attention, sparse_diagonal_attention,
)
from .base import TIMM_DEFAULT_PREFIX, AttentionProjections, TokenMixer, close_matches, number_layers
from .presets import DEFAULT_PRESET, FROM_PRESET, resolve_preset
from .flops import linears_flops
from ._sparse import diagonal_pattern
from .registry import register_mixer

__all__ = ["FibottentionAttention", "assign_layer_indices", "MODES", "WINDOWS"]

#: application modes of the Fibottention pattern
MODES = ("sparse", "masked", "official")
#: how the per-head windows are chosen: spread from w_min to w_max, or N for every head (robot code)
WINDOWS = ("spread", "full")


@register_mixer("fibottention")
class FibottentionAttention(AttentionProjections, TokenMixer):
    """Fibottention multi-head attention, timm-compatible (parameter names of ``timm`` Attention).

    Args:
        preset: ``"default"`` or ``"official"`` (the official image code; values in :attr:`presets`).
            The options marked *(preset)* default to the preset's value; passing one explicitly
            overrides the preset for that option only (ablation / reproduction switches).
        mode *(preset)*: ``"sparse"`` (default) | ``"masked"`` | ``"official"`` (see the module docstring).
        w_min: smallest per-head window (official: 5).
        w_max: largest per-head window; ``None`` (default) uses ``N // 3`` of the current input's
            patch-token count ``N``, as the official code does.
        windows *(preset)*: ``"spread"`` (default): head windows spread linearly from ``w_min`` to
            ``w_max``; ``"full"`` (robot code): every head's window is the patch-token count ``N``.
        variant *(preset)*: ``"wythoff"`` (image models, default) | ``"modified"`` (video/robot code, adds two
            smaller offsets per head, including 0 in head 1) | ``"modified_legacy"``.
        shuffle *(preset)*: per-layer head permutation: ``"stable"`` (default, version-independent),
            ``"official"`` (Python ``random.seed(layer)`` order of the official code) or ``"none"``.
        shuffle_per_layer *(preset)*: ``True`` (default): layer ``l`` uses the permutation seeded by
            ``l``; ``False`` (official image code): every layer uses layer 0's permutation.
        layer_idx: 0-based block index seeding the shuffle; ``None`` acts as 0 until set (see
            :func:`assign_layer_indices`).
        include_diagonal: ``None`` (default) keeps the variant's choice — the default variant
            excludes the main diagonal (a patch token does not attend to itself); ``True`` adds it
            to every head, ``False`` removes it from every head.
        backend: sparse-mode kernel, ``"auto"`` | ``"c"`` | ``"torch"`` | ``"triton"``
            (see :func:`~vitmix.ops.diagonal.sparse_diagonal_attention`).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared timm arguments. ``attn_drop``
        is supported in ``masked``/``official`` modes only. The token grid is used only for its
        prefix count; any patch count works (offsets are recomputed per ``N`` and cached per
        ``(N, P, device)``); pass ``num_prefix_tokens`` alone for sequences that are not a square.
    """

    complexity = "n log n"
    spatial = True
    on_sequence = "its Wythoff/Fibonacci offsets along the sequence (the raster order it uses on images)"
    #: the offsets are a function of N (w_max = N // 3): each valid length runs with its own
    padding_mask = "by_length"
    #: option values of each ``preset`` (every preset names the same options)
    presets = {
        "default": dict(mode="sparse", shuffle="stable", shuffle_per_layer=True, variant="wythoff",
                        windows="spread"),
        "official": dict(mode="official", shuffle="official", shuffle_per_layer=False, variant="wythoff",
                         windows="spread"),
        "robot": dict(mode="official", shuffle="official", shuffle_per_layer=True, variant="modified_legacy",
                      windows="full"),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        preset: str = DEFAULT_PRESET,
        mode: str = FROM_PRESET,
        w_min: int = 5,
        w_max: Optional[int] = None,
        variant: str = FROM_PRESET,
        windows: str = FROM_PRESET,
        shuffle: str = FROM_PRESET,
        shuffle_per_layer: bool = FROM_PRESET,
        layer_idx: Optional[int] = None,
        include_diagonal: Optional[bool] = None,
        backend: str = "auto",
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        opts = resolve_preset(type(self).__name__, self.presets, preset, mode=mode, shuffle=shuffle,
                              shuffle_per_layer=shuffle_per_layer, variant=variant, windows=windows)
        mode, shuffle, variant, windows = opts["mode"], opts["shuffle"], opts["variant"], opts["windows"]
        _check_choices(mode=mode, variant=variant, shuffle=shuffle, backend=backend, windows=windows)
        if opts["shuffle_per_layer"] not in (True, False):
            raise ValueError(f"shuffle_per_layer must be True or False, got {opts['shuffle_per_layer']!r}")
        if include_diagonal not in (None, True, False):
            raise ValueError(f"include_diagonal must be None, True or False, got {include_diagonal!r}")
        self.w_min = _as_int(w_min, "w_min", 0)
        self.w_max = None if w_max is None else _as_int(w_max, "w_max", 0)
        if self.w_max is not None and self.w_max < self.w_min:
            raise ValueError(f"w_max={self.w_max} must be >= w_min={self.w_min}")
        if num_heads == 1 and windows == "spread" and (self.w_max is None or self.w_max != self.w_min):
            raise ValueError(
                "fibottention spreads windows from w_min to w_max across heads, which is undefined for "
                "num_heads=1; use >= 2 heads, or pass w_max equal to w_min for a single window"
            )
        if mode == "sparse" and attn_drop:
            raise ValueError("fibottention mode='sparse' does not implement attention dropout; use attn_drop=0 "
                             "or mode='masked'")
        self.preset, self.mode, self.variant, self.shuffle, self.backend = preset, mode, variant, shuffle, backend
        self.windows = windows
        self.shuffle_per_layer = bool(opts["shuffle_per_layer"])
        self.include_diagonal = include_diagonal
        self._layer_idx = None if layer_idx is None else _as_int(layer_idx, "layer_idx", 0)
        self._cache: Dict[Tuple, object] = {}

        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)

    # ------------------------------------------------------------------------------- offsets
    @property
    def layer_idx(self) -> Optional[int]:
        """0-based block index that seeds the head shuffle (``None``: not assigned, acts as 0)."""
        return self._layer_idx

    @layer_idx.setter
    def layer_idx(self, value: Optional[int]) -> None:
        self._layer_idx = None if value is None else _as_int(value, "layer_idx", 0)
        self._cache.clear()

    def head_offsets(self, num_tokens: int) -> List[Tuple[int, ...]]:
        """Offset set of each head for ``num_tokens`` patch tokens (prefix tokens excluded)."""
        layer = (self._layer_idx or 0) if self.shuffle_per_layer else 0
        w_min, w_max = (num_tokens, num_tokens) if self.windows == "full" else (self.w_min, self.w_max)
        return fibonacci_offsets(num_tokens, self.num_heads, layer=layer, w_min=w_min,
                                 w_max=w_max, variant=self.variant, shuffle=self.shuffle,
                                 include_diagonal=self.include_diagonal)

    def _pattern(self, kind: str, num_tokens: int, prefix: int, device: torch.device):
        """The sparse plan or the dense mask (:func:`~vitmix.mixers._sparse.diagonal_pattern`)."""
        return diagonal_pattern(self, kind, num_tokens, prefix, device)

    # ------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False, *,
                hw: Optional[Tuple[int, int]] = None, num_prefix_tokens: Optional[int] = None,
                **options) -> torch.Tensor:
        """``(B, N, C) -> (B, N, C)``. Only the prefix count matters: with ``num_prefix_tokens`` given
        (here or at construction) and no grid, any sequence length works (``sequence=True``: a 1-D
        sequence, prefix 0 unless told)."""
        sequence = options.get("sequence")
        if self.sequence if sequence is None else sequence:
            return super().forward(x, attn_mask, is_causal, hw=hw, num_prefix_tokens=num_prefix_tokens, **options)
        prefix = num_prefix_tokens if num_prefix_tokens is not None else self.num_prefix_tokens
        if prefix is None and hw is None and self.hw is None:
            prefix = TIMM_DEFAULT_PREFIX                # told nothing: timm's one CLS token, never a guess from N
        if hw is None and self.hw is None and prefix is not None and x.dim() == 3:
            if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
                raise ValueError(f"num_prefix_tokens must be a non-negative int, got {prefix!r}")
            if prefix >= x.shape[1]:
                raise ValueError(f"num_prefix_tokens={prefix} must be smaller than the sequence length "
                                 f"N={x.shape[1]} (fibottention needs at least one patch token)")
            hw = (1, x.shape[1] - prefix)
        return super().forward(x, attn_mask, is_causal, hw=hw, num_prefix_tokens=prefix, **options)

    def analytic_flops(self, batch: int, n: int) -> int:
        """Dense modes: the full ``q·kᵀ`` and ``weights·v``; ``sparse``: only each head's pattern
        (prefix rows/columns included), ``2·d`` FLOPs per pair for the score and ``2·d`` for the value."""
        prefix = self.token_grid(n)[0]
        total = linears_flops(self, batch * n)  # qkv, proj
        if self.mode == "sparse":
            counts = interaction_counts(self.head_offsets(n - prefix), n - prefix, prefix)
            return total + 4 * batch * self.head_dim * sum(counts)
        return total + 4 * batch * self.num_heads * n * n * self.head_dim

    def mix(self, x, grid, attn_mask=None, is_causal=False):
        n = x.shape[1]
        prefix = grid[0]
        num_tokens = n - prefix
        q, k, v = self._qkv(x)
        drop = self.attn_drop.p if self.training else 0.0
        if self.mode == "sparse":
            plan = self._pattern("plan", num_tokens, prefix, x.device)
            out = sparse_diagonal_attention(q, k, v, plan, prefix, scale=self.scale, backend=self.backend)
        else:
            mask = self._pattern("mask", num_tokens, prefix, x.device)
            fn = masked_diagonal_attention if self.mode == "masked" else official_diagonal_attention
            out = fn(q, k, v, None, prefix, scale=self.scale, attn_drop=drop, mask=mask)
        return self._project_out(out)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: Optional[int] = None, **_) -> torch.Tensor:
        """Effective ``(B, heads, N, N)`` attention weights (dense, O(N²); for analysis only).

        ``sparse`` and ``masked`` modes give the same map (zero outside the pattern); ``official``
        gives the multiplicative-mask weights, non-zero everywhere.
        """
        n = x.shape[1]
        prefix = num_prefix_tokens if num_prefix_tokens is not None else self.num_prefix_tokens
        if self.sequence:
            prefix = self.token_grid(n, hw, prefix).prefix
        elif hw is not None or self.hw is not None or prefix is None:
            from .base import resolve_grid

            prefix = resolve_grid(n, hw if hw is not None else self.hw, prefix)[0]
        q, k, _ = self._qkv(x)
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k = q.to(dtype), k.to(dtype)
        mask = self._pattern("mask", n - prefix, prefix, x.device)
        scores = (q * self.scale) @ k.transpose(-1, -2)
        if self.mode == "official":
            return (scores * mask).softmax(dim=-1)
        row_ok = mask.any(dim=-1, keepdim=True)
        return scores.masked_fill(~mask & row_ok, float("-inf")).softmax(dim=-1) * row_ok

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, preset={self.preset!r}, mode={self.mode!r}, "
                f"variant={self.variant!r}, windows={self.windows!r}, w_min={self.w_min}, w_max={self.w_max}, "
                f"shuffle={self.shuffle!r}, "
                f"shuffle_per_layer={self.shuffle_per_layer}, layer_idx={self._layer_idx}")


def _check_choices(**choices) -> None:
    allowed_values = {"mode": MODES, "variant": VARIANTS, "shuffle": SHUFFLES, "backend": BACKENDS,
                      "windows": WINDOWS}
    for name, value in choices.items():
        allowed = allowed_values[name]
        if value not in allowed:
            raise ValueError(f"fibottention {name}={value!r} is not one of {', '.join(allowed)}."
                             + close_matches(str(value), allowed))


def assign_layer_indices(model: nn.Module, start: int = 0) -> nn.Module:
    """Number the Fibottention mixers of ``model`` ``start, start+1, ...`` in module order.

    timm's ``Block`` does not pass its depth to the attention layer, so a stock timm model built
    with ``attn_layer=timm_attn("fibottention")`` has every layer at index 0 (identical head order
    in all layers). Call this once after building it; vitmix's Fibottention models already do.
    Returns ``model``. (:func:`vitmix.mixers.number_layers` with ``overwrite=True``.)
    """
    return number_layers(model, start, overwrite=True)
