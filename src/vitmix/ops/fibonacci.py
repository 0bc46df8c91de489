"""Fibottention offsets: Wythoff-array rows turned into per-head dilation sets.

Fibottention (Rahimian et al., arXiv 2406.19391) lets head ``i`` of a layer attend only to the
token pairs ``(j, k)`` of the patch block with ``|j - k|`` in a small set ``F_i`` of offsets; prefix
(CLS/register) tokens attend to, and are attended by, everything. This module computes the sets
exactly as the official code does (``fibottention.py`` of Charlotte-CharMLab/Fibottention):

1. seeds of head ``i = 1..H``: row ``i`` of the Wythoff array, ``a_i = ⌊⌊iφ⌋φ⌋``,
   ``b_i = ⌊⌊iφ⌋φ²⌋`` (:func:`wythoff_seeds`; exact integer arithmetic, equal to the official
   float64 evaluation);
2. a window per head, spread linearly from ``w_min = 5`` to ``w_max = N // 3``
   (:func:`head_windows`, float step and ``int`` truncation as in the official code);
3. the generalised Fibonacci rule: start from ``[a, b]``, append the sum of the last two terms
   while the last term is ``<= w``, then drop the last term (:func:`fibonacci_sequence`) — every
   term is ``<= w`` except ``a``, which is always kept;
4. a per-layer permutation of the heads (:func:`head_permutation`).

Variants (``variant=``): ``"wythoff"`` (image models, the default; offsets ``>= 1`` so the main
diagonal is excluded), ``"modified"`` (video/robot code: seeds ``(2a - b, b - a) = (i - 1, ⌊iφ⌋)``,
two more terms to the left, head 1 gains offset 0) and ``"modified_legacy"`` (the robot code and
the July 2024 commits: the same, except head 1 keeps its unmodified row).

Everything here is plain Python/torch on small integer lists; :func:`fibonacci_mask` builds the
dense ``(H, T, T)`` boolean mask for reference and analysis only.
"""
from __future__ import annotations

import math
import operator
import random
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = [
    "PHI", "VARIANTS", "SHUFFLES", "wythoff_seeds", "head_windows", "fibonacci_sequence", "head_offsets",
    "head_permutation", "fibonacci_offsets", "check_offsets", "offsets_mask", "fibonacci_mask",
    "interaction_counts", "interaction_fraction",
]

#: the golden ratio φ = (1 + √5) / 2
PHI = (1.0 + math.sqrt(5.0)) / 2.0
#: offset-set variants understood by :func:`head_offsets`
VARIANTS = ("wythoff", "modified", "modified_legacy")
#: head-shuffle modes understood by :func:`head_permutation`
SHUFFLES = ("stable", "official", "none")

Offsets = List[Tuple[int, ...]]


def _as_int(value, name: str, minimum: int = 0) -> int:
    """``value`` as an int ``>= minimum``; bools, floats and strings raise ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got the bool {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer (token distances are whole numbers), got {value!r}") from None
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def _lower_wythoff(i: int) -> int:
    """``⌊iφ⌋`` computed exactly: ``⌊(i + √(5i²)) / 2⌋ = (i + isqrt(5i²)) // 2``."""
    return (i + math.isqrt(5 * i * i)) // 2


def wythoff_seeds(i: int) -> Tuple[int, int]:
    """First two terms ``(a_i, b_i)`` of row ``i >= 1`` of the Wythoff array.

    ``a_i = ⌊⌊iφ⌋φ⌋ = ⌊iφ⌋ + i - 1`` and ``b_i = ⌊⌊iφ⌋φ²⌋ = a_i + ⌊iφ⌋``. Rows 1-4 start
    (1, 2), (4, 7), (6, 10), (9, 15) (OEIS A035513). Exact for every ``i`` (no float rounding).
    """
    i = _as_int(i, "Wythoff row index", 1)
    low = _lower_wythoff(i)
    a = low + i - 1
    return a, a + low


def head_windows(num_heads: int, num_tokens: int, w_min: int = 5, w_max: Optional[int] = None) -> List[int]:
    """Window ``w_i`` of each head ``i = 1..H``: ``w_min + int((w_max - w_min) / (H - 1) * (i - 1))``.

    ``w_max`` defaults to ``num_tokens // 3`` (the official code's value; it may then fall below
    ``w_min`` for small ``N``, and the windows then shrink across heads exactly as there). An
    explicit ``w_max`` must be ``>= w_min``. A single head (``H = 1``) leaves the spread undefined
    (the official code divides by zero): it is accepted only when ``w_max == w_min``.
    """
    num_heads = _as_int(num_heads, "num_heads", 1)
    num_tokens = _as_int(num_tokens, "num_tokens (patch tokens)", 1)
    w_min = _as_int(w_min, "w_min", 0)
    if w_max is None:
        w_max = num_tokens // 3
    else:
        w_max = _as_int(w_max, "w_max", 0)
        if w_max < w_min:
            raise ValueError(f"w_max={w_max} must be >= w_min={w_min}")
    if num_heads == 1:
        if w_max != w_min:
            raise ValueError(
                f"Fibottention spreads the windows from w_min={w_min} to w_max={w_max} across heads, which "
                "is undefined for num_heads=1; use >= 2 heads, or give one window with w_max == w_min"
            )
        return [w_min]
    step = (w_max - w_min) / (num_heads - 1)
    return [w_min + int(step * (i - 1)) for i in range(1, num_heads + 1)]


def fibonacci_sequence(a: int, b: int, window: int) -> List[int]:
    """The generalised Fibonacci sequence seeded by ``(a, b)`` and cut at ``window``.

    Official rule: start from ``[a, b]``, append the sum of the last two terms while the last term
    is ``<= window``, then drop the last term. Every returned term is ``<= window`` except ``a``,
    which is always kept (``b`` is kept only when ``b <= window``).
    """
    seq = [int(a), int(b)]
    while seq[-1] <= window:
        seq.append(seq[-1] + seq[-2])
    return seq[:-1]


def head_offsets(num_heads: int, num_tokens: int, *, w_min: int = 5, w_max: Optional[int] = None,
                 variant: str = "wythoff") -> Offsets:
    """Sorted, de-duplicated offset set of each head ``1..H`` in Wythoff-row order (no shuffle).

    Terms beyond ``num_tokens - 1`` are dropped (the window is clipped to the sequence), so short
    1-D sequences such as ``T = 8`` video frames keep the offsets that exist there.

    >>> head_offsets(12, 196)[:3]
    [(1, 2, 3, 5), (4, 7), (6, 10)]
    >>> head_offsets(3, 4, variant="modified")
    [(0, 1, 2, 3), (1, 3), (2,)]
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown Fibottention variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    windows = head_windows(num_heads, num_tokens, w_min, w_max)
    out = []
    for i, w in enumerate(windows, start=1):
        a, b = wythoff_seeds(i)
        if variant == "modified" or (variant == "modified_legacy" and i > 1):
            a, b = 2 * a - b, b - a  # = (i - 1, ⌊iφ⌋): the row extended two terms to the left
        # windows clipped to N - 1: on short sequences (video frames, T = 4..16 < w_min) an offset >= N
        # would pair no tokens; the seed a is still always kept (check_offsets names a head whose a >= N)
        out.append(tuple(sorted(set(fibonacci_sequence(a, b, min(w, num_tokens - 1))))))
    return out


def _splitmix64(state: int) -> Tuple[int, int]:
    mask = (1 << 64) - 1
    state = (state + 0x9E3779B97F4A7C15) & mask
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return state, z ^ (z >> 31)


def head_permutation(num_heads: int, layer: int = 0, shuffle: str = "stable") -> List[int]:
    """Which Wythoff row each head of layer ``layer`` uses: head ``h`` takes row ``perm[h]``.

    - ``"stable"`` (default): a Fisher-Yates shuffle driven by SplitMix64 seeded with the layer
      index; deterministic and identical on every Python/torch version and platform.
    - ``"official"``: the official code's order, ``random.seed(layer); random.shuffle(heads)``
      (Python's ``random``; e.g. 12 heads, layer 0 → ``[1, 9, 8, 5, 10, 2, 3, 7, 4, 0, 11, 6]``).
      Python does not promise this sequence across versions, hence not the default.
    - ``"none"``: identity (every layer uses the same head order).
    """
    num_heads = _as_int(num_heads, "num_heads", 1)
    layer = _as_int(layer, "layer index", 0)
    perm = list(range(num_heads))
    if shuffle == "none" or shuffle is None or shuffle is False:
        return perm
    if shuffle == "official":
        random.Random(layer).shuffle(perm)
        return perm
    if shuffle == "stable":
        state = 0x5EED_F1B0 ^ (layer * 0x2545F4914F6CDD1D)
        for i in range(num_heads - 1, 0, -1):
            state, r = _splitmix64(state)
            j = r % (i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        return perm
    raise ValueError(f"unknown head shuffle {shuffle!r}; choose one of {', '.join(SHUFFLES)}")


def check_offsets(offsets: Sequence[Sequence[int]], num_tokens: int) -> Offsets:
    """Validate per-head offsets for ``num_tokens`` patch tokens; return them as sorted tuples.

    Every offset must be an integer in ``[0, num_tokens)``: a pair ``(j, j ± d)`` exists only for
    ``d < N``, so a larger offset would silently contribute nothing (the official code then leaves a
    head with an all-zero patch mask).
    """
    num_tokens = _as_int(num_tokens, "num_tokens (patch tokens)", 1)
    if len(offsets) == 0:
        raise ValueError("offsets must hold one offset set per head, got none")
    out = []
    for h, offs in enumerate(offsets):
        vals = sorted({_as_int(d, f"offset of head {h}", 0) for d in offs})
        if not vals:
            raise ValueError(f"head {h} has no offsets; every head needs at least one")
        out.append(tuple(vals))
    too_far = [h for h, vals in enumerate(out) if vals[-1] >= num_tokens]
    if too_far:
        h = max(too_far, key=lambda i: out[i][-1])
        raise ValueError(
            f"head {h} has offset {out[h][-1]} but there are only N={num_tokens} patch tokens (offsets must be "
            f"< N; {len(too_far)} head(s) affected). Fibottention needs more tokens for this many heads (head i "
            f"always keeps its Wythoff seed a_i ≈ 2.6·i): use fewer heads, a larger image or smaller patch "
            f"(N > {out[h][-1]}), or explicit offsets"
        )
    return out


def fibonacci_offsets(num_tokens: int, num_heads: int, *, layer: int = 0, w_min: int = 5,
                      w_max: Optional[int] = None, variant: str = "wythoff", shuffle: str = "stable",
                      include_diagonal: Optional[bool] = None) -> Offsets:
    """Per-head offset sets of one Fibottention layer for ``num_tokens`` patch tokens (no prefix).

    Args:
        num_tokens: patch tokens ``N`` (CLS/register tokens excluded; they are handled by the ops).
        num_heads: heads ``H``.
        layer: 0-based block index, seeds the head shuffle.
        w_min, w_max: window range (integers; ``w_max`` defaults to ``N // 3``).
        variant: ``"wythoff"`` | ``"modified"`` | ``"modified_legacy"`` (see the module docstring).
        shuffle: ``"stable"`` | ``"official"`` | ``"none"`` (see :func:`head_permutation`).
        include_diagonal: ``None`` keeps what the variant gives (the default variant excludes the
            main diagonal; the modified one has offset 0 in head 1); ``True`` adds offset 0 to
            every head; ``False`` removes it everywhere.

    Returns:
        ``H`` sorted tuples of non-negative offsets (head ``h`` attends to ``j ± d`` for ``d`` in its
        tuple). ``ValueError`` when an offset is ``>= N`` (too many heads for so few tokens).
    """
    rows = head_offsets(num_heads, num_tokens, w_min=w_min, w_max=w_max, variant=variant)
    perm = head_permutation(num_heads, layer, shuffle)
    out = [rows[p] for p in perm]
    if include_diagonal is True:
        out = [tuple(sorted(set(o) | {0})) for o in out]
    elif include_diagonal is False:
        out = [tuple(d for d in o if d != 0) for o in out]
    elif include_diagonal is not None:
        raise ValueError(f"include_diagonal must be None, True or False, got {include_diagonal!r}")
    return check_offsets(out, num_tokens)


def offsets_mask(offsets: Sequence[Sequence[int]], num_tokens: int, num_prefix_tokens: int = 0,
                 device=None) -> torch.Tensor:
    """Dense boolean ``(H, T, T)`` mask, ``T = P + N``: True where a query may attend to a key.

    Patch block: ``|j - k|`` in the head's offsets. Prefix rows and columns (CLS/registers) are all
    True. O(H·T²) memory — for reference, tests and plots only, never in the sparse path.
    """
    offsets = check_offsets(offsets, num_tokens)
    p = _as_int(num_prefix_tokens, "num_prefix_tokens", 0)
    n = num_tokens
    idx = torch.arange(n, device=device)
    dist = (idx[:, None] - idx[None, :]).abs()
    mask = torch.ones(len(offsets), p + n, p + n, dtype=torch.bool, device=device)
    for h, offs in enumerate(offsets):
        allowed = torch.zeros(n, dtype=torch.bool, device=device)
        allowed[list(offs)] = True
        mask[h, p:, p:] = allowed[dist]
    return mask


def fibonacci_mask(num_tokens: int, num_heads: int, num_prefix_tokens: int = 0, device=None,
                   **offset_options) -> torch.Tensor:
    """Dense ``(H, P + N, P + N)`` boolean mask of :func:`fibonacci_offsets` (reference only)."""
    return offsets_mask(fibonacci_offsets(num_tokens, num_heads, **offset_options), num_tokens,
                        num_prefix_tokens, device=device)


def interaction_counts(offsets: Sequence[Sequence[int]], num_tokens: int, num_prefix_tokens: int = 0) -> List[int]:
    """Number of True entries of each head's ``(T, T)`` mask, in closed form (no mask built).

    An offset ``d > 0`` gives ``2(N - d)`` pairs, ``d = 0`` gives ``N``; prefix rows/columns add
    ``T² - N²``.
    """
    offsets = check_offsets(offsets, num_tokens)
    n, p = num_tokens, _as_int(num_prefix_tokens, "num_prefix_tokens", 0)
    extra = (n + p) ** 2 - n * n
    return [sum(n if d == 0 else 2 * (n - d) for d in offs) + extra for offs in offsets]


def interaction_fraction(offsets: Sequence[Sequence[int]], num_tokens: int, num_prefix_tokens: int = 0) -> List[float]:
    """Fraction of the ``T × T`` pairs each head computes (``num_prefix_tokens=0``: patch block only).

    ViT-B/16 at 224 (N = 196, H = 12): mean 1.994 % over the patch block, 2.99 % with the CLS row
    and column.
    """
    t = num_tokens + _as_int(num_prefix_tokens, "num_prefix_tokens", 0)
    return [c / (t * t) for c in interaction_counts(offsets, num_tokens, num_prefix_tokens)]
