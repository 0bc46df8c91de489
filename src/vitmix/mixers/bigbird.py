"""BigBird attention (Zaheer et al., "Big Bird: Transformers for Longer Sequences", NeurIPS 2020):
sliding window + global + random attention, block-sparse, computed sparsely.

The patch tokens, in raster order (1-D, as in the paper and in :mod:`~vitmix.mixers.longformer`),
are cut into blocks of ``block_size`` tokens. Every query of block ``i`` attends to all tokens of

- the ``window_blocks`` blocks centred on ``i`` (``i-1, i, i+1`` for the paper's 3; clipped at the
  ends of the sequence, no wrap-around);
- ``random_blocks`` other blocks drawn uniformly without replacement per (head, query block) from the
  blocks outside its window (the paper's ``r``; fewer when there are not that many);
- the global tokens: the prefix (CLS/register) tokens, which attend to every token — BigBird-ETC's
  extra global tokens.

Computed with :func:`vitmix.ops.index_sparse.index_sparse_attention` (each query scores only its
``P + (window_blocks + random_blocks)·block_size`` keys: O(N·block_size·d), nothing N×N).

Faithfulness and what differs: the pattern (window, per-head random blocks, global tokens) is the
paper's block pattern, computed exactly on it; BigBird-ITC's alternative of promoting the first
patch blocks to global tokens is not offered (vitmix's global tokens are the prefix tokens, so a
sequence without prefix tokens has none), and the last block is shorter when ``block_size`` does not
divide N (the paper pads the sequence). The random blocks are fixed per layer, as in the paper's
implementation: drawn from the layer's ``pattern_seed`` (a buffer — saved in checkpoints, restored
by ``load_state_dict``; drawn from torch's global generator at construction unless ``seed=`` is
given) for each token count N, never resampled between steps.

Defaults and where they come from: ``window_blocks=3`` and ``random_blocks=3`` are the paper's
(ITC and ETC alike); its block size 64 is meant for 4096-token text, so vitmix uses ``block_size=8``:
``(3 + 3)·8 = 48`` patch keys per query, about the 49-key budget of the other linear baselines.
``mode="masked"`` computes the same function densely (the reference; supports ``attn_drop``).

``layout="band"`` is the BigBird of Fibottention's official robot-learning code, the baseline its
robot table compares against: each patch token attends to the patch tokens within ``±band`` (4) of
it in raster order, plus ``N`` random (query, key) patch pairs per head, drawn anew at every call (in
evaluation too, as there), plus the prefix (CLS) row and column; dense, −∞ outside the pattern,
O(N²). The block options do not apply to it.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from ..ops._common import real_tensors
from ..ops.index_sparse import IndexPattern, index_mask, index_pattern, index_sparse_attention, masked_index_attention
from .base import AttentionProjections, TokenMixer, close_matches
from ._sparse import PrefixOnlyGrid, cached_pattern, check_sparse_options, prefix_only_grid
from .options import positive_int
from .registry import register_mixer

__all__ = ["BigBirdAttention", "bigbird_index", "band_random_mask", "LAYOUTS"]

#: ``"blocks"``: the paper's block pattern; ``"band"``: the Fibottention robot code's band + random pairs
LAYOUTS = ("blocks", "band")

_RANDOM_ROWS_PER_DRAW = 64  # query blocks per random draw (bounds memory; fixed, so patterns are stable)


def _random_key_blocks(num_blocks: int, num_heads: int, half: int, count: int, generator) -> torch.Tensor:
    """``(H, nb, count)`` random key blocks per query block outside its window (``-1``: none left)."""
    out = []
    cols = torch.arange(num_blocks)
    for lo in range(0, num_blocks, _RANDOM_ROWS_PER_DRAW):
        rows = torch.arange(lo, min(lo + _RANDOM_ROWS_PER_DRAW, num_blocks))
        u = torch.rand(num_heads, len(rows), num_blocks, generator=generator)
        u = u.masked_fill((cols[None, :] - rows[:, None]).abs() <= half, -1.0)   # the window's blocks
        top = u.topk(min(count, num_blocks), dim=-1)              # top of iid uniforms: a uniform subset
        out.append(torch.where(top.values >= 0, top.indices, -1))
    picked = torch.cat(out, dim=1)
    return torch.nn.functional.pad(picked, (0, count - picked.shape[-1]), value=-1)


def bigbird_index(num_tokens: int, num_heads: int, block_size: int = 8, window_blocks: int = 3,
                  random_blocks: int = 3, seed: int = 0) -> torch.Tensor:
    """BigBird's patch keys per (head, query block): ``(H, ⌈N/block_size⌉, (window_blocks +
    random_blocks)·block_size)`` int64 patch positions, ``-1`` for empty slots (window clipped at the
    ends, short last block). Every query of a block shares its block's list."""
    n, b = num_tokens, block_size
    nb = math.ceil(n / b)
    half = window_blocks // 2
    blocks = torch.arange(nb)[:, None] + torch.arange(-half, half + 1)[None, :]          # (nb, window)
    window = torch.where((blocks >= 0) & (blocks < nb), blocks, -1).expand(num_heads, nb, window_blocks)
    generator = torch.Generator().manual_seed(int(seed))
    rand = _random_key_blocks(nb, num_heads, half, random_blocks, generator)
    key_blocks = torch.cat([window, rand], dim=-1)                                         # (H, nb, R)
    tokens = key_blocks[..., None] * b + torch.arange(b)                                   # (H, nb, R, b)
    return torch.where((key_blocks[..., None] >= 0) & (tokens < n), tokens, -1).flatten(2)


def band_random_mask(num_tokens: int, num_heads: int, prefix: int, band: int = 4,
                     generator: Optional[torch.Generator] = None, device=None) -> torch.Tensor:
    """``(H, P+N, P+N)`` bool mask of ``layout="band"``: ``|i − j| <= band`` on the patch block, ``N``
    random patch pairs per head (duplicates and band hits allowed, as drawn), prefix rows/columns all
    true. A fresh draw from ``generator`` (torch's global one when ``None``) at each call."""
    n, t = num_tokens, prefix + num_tokens
    pos = torch.arange(n, device=device)
    mask = torch.zeros(num_heads, t, t, dtype=torch.bool, device=device)
    mask[:, prefix:, prefix:] = (pos[:, None] - pos[None, :]).abs() <= band
    flat = torch.randint(0, n * n, (num_heads, n), generator=generator).to(device)
    heads = torch.arange(num_heads, device=device)[:, None].expand(-1, n)
    mask[heads, prefix + flat // n, prefix + flat % n] = True
    mask[:, :prefix, :] = True
    mask[:, :, :prefix] = True
    return mask


@torch.compiler.assume_constant_result
def _constant_index(num_tokens: int, num_heads: int, block_size: int, window_blocks: int, random_blocks: int,
                    seed: int, device: str) -> torch.Tensor:
    """:func:`bigbird_index`, checked. Under ``torch.compile`` a constant of the graph: dynamo runs it once
    while tracing (it cannot trace the ``torch.Generator`` the random blocks are drawn with). Real tensors
    made outside ``inference_mode``: a cached pattern must serve a later backward and a later eager call."""
    with torch.inference_mode(False), real_tensors():
        index = bigbird_index(num_tokens, num_heads, block_size, window_blocks, random_blocks, seed)
        return index_pattern(index, num_tokens, block_size).index.to(device)


@register_mixer("bigbird")
class BigBirdAttention(PrefixOnlyGrid, AttentionProjections, TokenMixer):
    """BigBird window + global + random block attention (Zaheer et al., 2020), sparse, O(N·block).

    Args:
        block_size: tokens per block (default 8; the paper's 64 is for 4096-token text).
        window_blocks: odd number of blocks in the sliding window (default 3, the paper's).
        random_blocks: random key blocks per query block and head (default 3, the paper's).
        seed: seed of the random blocks; ``None`` (default) draws one from torch's global generator
            at construction. Stored in the ``pattern_seed`` buffer (checkpoints restore it).
        mode: ``"sparse"`` (default) or ``"masked"`` (dense reference; supports ``attn_drop``).
        layout: ``"blocks"`` (default, the paper's pattern) or ``"band"`` (Fibottention's robot code:
            ``±band`` raster band + N random pairs redrawn per call + prefix row/column; module docstring).
        band: half-width of ``layout="band"``'s band (default 4, the official robot code's).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments. Only the prefix count
        of the grid is used: with ``num_prefix_tokens`` given and no ``hw``, any length works.
    """

    complexity = "linear"
    spatial = True
    on_sequence = "its window, random and global blocks along the sequence (the raster order it uses on images)"
    #: the random blocks are drawn per N: each valid length runs with its own pattern, as when unpadded
    padding_mask = "by_length"

    def __init__(self, dim: int, num_heads: int = 8, *args, block_size: int = 8, window_blocks: int = 3,
                 random_blocks: int = 3, seed: Optional[int] = None, mode: str = "sparse", layout: str = "blocks",
                 band: int = 4, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        check_sparse_options("bigbird", mode, None, attn_drop)
        if layout not in LAYOUTS:
            raise ValueError(f"bigbird layout={layout!r} is not one of {', '.join(LAYOUTS)}."
                             + close_matches(str(layout), LAYOUTS))
        self.layout = layout
        self.band = positive_int(band, "band", 0)
        self.block_size = positive_int(block_size, "block_size", 1)
        self.window_blocks = positive_int(window_blocks, "window_blocks", 1)
        if self.window_blocks % 2 == 0:
            raise ValueError(f"window_blocks={window_blocks} must be odd (the window is centred on the query block)")
        self.random_blocks = positive_int(random_blocks, "random_blocks", 0)
        if seed is None:
            seed = int(torch.randint(0, 2 ** 62, ()))
        self.mode = mode
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)
        seed = positive_int(seed, "seed", 0)
        self.register_buffer("pattern_seed", torch.tensor(seed, dtype=torch.int64))
        # the buffer's value as an int (no device sync per forward; torch.export cannot read a buffer)
        self._seed: Optional[int] = seed
        self._cache: Dict[Tuple, object] = {}
        self.register_load_state_dict_post_hook(lambda module, keys: module._forget_pattern())

    def _forget_pattern(self) -> None:
        self._seed = None if self.pattern_seed.is_meta else int(self.pattern_seed)   # read now, outside tracing
        self._cache.clear()

    def pattern(self, num_tokens: int, device=None) -> IndexPattern:
        """The layer's key lists for ``num_tokens`` patch tokens (cached per N and device)."""
        if self._seed is None:
            self._seed = int(self.pattern_seed)
        return cached_pattern(self._cache, ("pattern", num_tokens, str(device), self._seed), lambda: IndexPattern(
            _constant_index(num_tokens, self.num_heads, self.block_size, self.window_blocks, self.random_blocks,
                            self._seed, str(device or "cpu")), num_tokens, self.block_size))

    def _mask(self, num_tokens: int, prefix: int, device) -> torch.Tensor:
        pattern = self.pattern(num_tokens, device)

        def build():
            with torch.inference_mode(False), real_tensors():
                return index_mask(pattern, prefix, device)
        return cached_pattern(self._cache, ("mask", num_tokens, prefix, str(device), self._seed), build)

    def mix(self, x, grid, attn_mask=None, is_causal=False):
        prefix, n, q, k, v = self._prefix_qkv(x, grid)
        if self.layout == "band":
            drop = self.attn_drop.p if self.training else 0.0
            mask = band_random_mask(n, self.num_heads, prefix, self.band, device=x.device)
            out = masked_index_attention(q, k, v, None, prefix, scale=self.scale, attn_drop=drop, mask=mask)
        elif self.mode == "sparse":
            out = index_sparse_attention(q, k, v, self.pattern(n, x.device), prefix, scale=self.scale)
        else:
            drop = self.attn_drop.p if self.training else 0.0
            out = masked_index_attention(q, k, v, None, prefix, scale=self.scale, attn_drop=drop,
                                         mask=self._mask(n, prefix, x.device))
        return self._project_out(out)

    def analytic_flops(self, batch: int, n: int) -> int:
        """qkv and proj, plus ``4·d`` per computed (query, key) pair: the prefix rows' ``P·T``, and
        for each patch query (the last block padded to ``block_size``) its ``P`` prefix keys and all
        ``M`` slots of its block's key list, empty ones included (``sparse``: what the kernel
        computes), or all ``T²`` (``masked``)."""
        c, d, h = self.dim, self.head_dim, self.num_heads
        prefix = self.token_grid(n, *prefix_only_grid(self, n, None, None))[0]
        total = 2 * batch * n * c * 4 * c
        if self.mode == "masked" or self.layout == "band":
            return total + 4 * batch * h * n * n * d
        slots = (self.window_blocks + self.random_blocks) * self.block_size
        padded = math.ceil((n - prefix) / self.block_size) * self.block_size
        return total + 4 * batch * h * d * (prefix * n + padded * (prefix + slots))

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
                      num_prefix_tokens: Optional[int] = None, **_) -> torch.Tensor:
        """Effective ``(B, heads, N, N)`` weights (dense, O(N²); zero outside the pattern)."""
        prefix, n, q, k, _ = self._prefix_qkv(x, self._map_grid(x, hw, num_prefix_tokens))
        mask = (band_random_mask(n, self.num_heads, prefix, self.band, device=x.device) if self.layout == "band"
                else self._mask(n, prefix, x.device))
        scores = ((q @ k.transpose(-1, -2)) * self.scale).masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, block_size={self.block_size}, "
                f"window_blocks={self.window_blocks}, random_blocks={self.random_blocks}, mode={self.mode!r}, "
                f"layout={self.layout!r}, band={self.band}")
