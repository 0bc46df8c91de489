"""1-D sequences and key-padding masks for the mixers (imports only torch).

A mixer told ``sequence=True`` (at construction, per call, or for a whole model with
:func:`~vitmix.mixers.set_token_grid`) sees ``(B, N, C)`` as ``prefix`` tokens followed by a 1-D sequence,
and its :meth:`~vitmix.mixers.base.TokenMixer.mix` receives a :class:`SequenceGrid` instead of
``(prefix, H, W)``. A key-padding ``mask`` is ``(B, N)`` bool, ``True`` on each sample's real tokens, which
come first (right padding): the layouts whose positions matter (segment means, offsets, local convolutions)
then place a sample's tokens exactly where its unpadded run does.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch

from ..ops.nystrom import avg_pool_landmarks


class SequenceGrid(NamedTuple):
    """The layout of a 1-D sequence: ``prefix`` tokens (CLS/registers), then ``length`` sequence tokens."""

    prefix: int
    length: int


Grid = Union[SequenceGrid, Tuple[int, int, int], None]


def is_sequence(grid: Grid) -> bool:
    """Whether ``grid`` (what ``mix`` receives) is a 1-D sequence rather than ``(prefix, H, W)``."""
    return isinstance(grid, SequenceGrid)


def as_row(grid: Grid) -> Tuple[int, int, int]:
    """``(prefix, H, W)``, a 1-D sequence read as one ``1 × L`` row: where a 2-D local filter or 2-D RoPE
    meets a sequence, its zero-padded ``k × k`` filter acts as the 1-D filter of its middle row, and RoPE's
    column half rotates with the position."""
    return (grid.prefix, 1, grid.length) if is_sequence(grid) else grid


def segment_means(t: torch.Tensor, grid: SequenceGrid, m: int) -> torch.Tensor:
    """``m`` landmarks of per-head tokens ``t (B, heads, P + L, d)``: means of ``m`` consecutive segments of
    the ``L`` sequence tokens (prefix tokens excluded). Segment ``i`` covers ``⌊iL/m⌋ .. ⌈(i+1)L/m⌉`` (adaptive
    average pooling's windows, as Nyströmformer's landmarks): the official equal segments when ``m`` divides
    ``L``, otherwise windows one token longer that share their border token, so any ``L`` works."""
    return avg_pool_landmarks(t, (1, grid.length), (1, m), prefix=grid.prefix)


def segment_pooling(lengths: torch.Tensor, counts: torch.Tensor, m: int, n: int, prefix: int = 0,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(B, m, n)`` rows that average :func:`segment_means`' windows per sample of a padded batch: sample ``b``
    has ``lengths[b]`` real tokens (the first ones), of which the ones after ``prefix`` are cut into
    ``counts[b] <= m`` segments; rows from ``counts[b]`` on are zero (empty landmark slots)."""
    count, length = counts[:, None, None], (lengths - prefix)[:, None, None]
    i = torch.arange(m, device=lengths.device)[None, :, None]
    j = torch.arange(n, device=lengths.device)[None, None, :] - prefix
    start, end = i * length // count, ((i + 1) * length + count - 1) // count
    inside = (j >= start) & (j < end) & (i < count)
    return inside.to(dtype) / (end - start).clamp(min=1).to(dtype)


def check_padding_mask(mask: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    """The valid-token count of each sample ``(B,)`` of a key-padding ``mask`` for ``x (B, N, C)``; a one-line
    ``ValueError`` for a mask of the wrong type, shape or layout, or a sample without any real token."""
    b, n = x.shape[:2]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name}: mask must be a bool tensor (True on real tokens, False on padding), got {got}; "
                         f"build it as lengths[:, None] > torch.arange(N)")
    if tuple(mask.shape) != (b, n):
        raise ValueError(f"{name}: mask must have shape (B, N) = ({b}, {n}) like x's first two dims, got "
                         f"{tuple(mask.shape)}")
    lengths = mask.sum(-1)
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return lengths          # the value checks read the data: eager only
    if b and int(lengths.min()) == 0:
        raise ValueError(f"{name}: sample {int(lengths.argmin())} of the batch is all padding (no True in its mask); "
                         f"drop it from the batch, or check the mask's polarity (True marks real tokens)")
    right = torch.arange(n, device=mask.device) < lengths[:, None]
    if not bool((mask == right).all()):
        raise ValueError(f"{name}: mask must mark each sample's real tokens first and its padding after (right "
                         f"padding), e.g. lengths[:, None] > torch.arange(N); got padding before real tokens")
    return lengths


def key_mask(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``(B, N)`` → ``(B, 1, 1, N)``: the key-padding mask broadcast over heads and queries (``None`` stays)."""
    return None if mask is None else mask[:, None, None, :]


def zero_padding(t: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-head tokens ``t (B, heads, N, ·)`` with the padded tokens zeroed (``mask=None``: ``t``)."""
    return t if mask is None else t * mask[:, None, :, None].to(t.dtype)


__all__ = ["SequenceGrid", "as_row", "check_padding_mask", "is_sequence", "key_mask", "segment_means",
           "segment_pooling", "zero_padding"]
