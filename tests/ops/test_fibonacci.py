"""Fibottention offsets (vitmix.ops.fibonacci); the sparse op itself: tests/ops/diagonal/test_diagonal.py."""
import math
import random

import pytest
import torch

from vitmix.ops import diagonal as sd
from vitmix.ops.fibonacci import (
    fibonacci_mask, fibonacci_offsets, fibonacci_sequence, head_offsets, head_permutation, head_windows,
    interaction_fraction, offsets_mask, wythoff_seeds,
)

# The table of the spec (N = 196, H = 12, default variant, before shuffling).
TABLE_196 = [(1, 2, 3, 5), (4, 7), (6, 10), (9, 15), (12, 20), (14, 23), (17, 28), (19, 31), (22, 36),
             (25, 41), (27, 44), (30, 49)]


# ------------------------------------------------------------------------------------ offsets
def test_wythoff_seeds_match_the_official_float_formula_and_oeis_rows():
    phi = (1 + math.sqrt(5)) / 2
    for i in range(1, 1000):
        low = math.floor(i * phi)
        assert wythoff_seeds(i) == (int(math.floor(low * phi)), int(math.floor(low * phi * phi)))
    assert [wythoff_seeds(i) for i in range(1, 5)] == [(1, 2), (4, 7), (6, 10), (9, 15)]  # OEIS A035513


def test_offset_table_for_vit_b_at_224_before_shuffling():
    assert head_offsets(12, 196) == TABLE_196
    assert fibonacci_offsets(196, 12, shuffle="none") == TABLE_196
    windows = head_windows(12, 196)
    assert windows[0] == 5 and windows[-1] == 64  # int() truncation: 64, not 65


def test_generalised_fibonacci_rule_keeps_the_seed_above_the_window():
    assert fibonacci_sequence(1, 2, 5) == [1, 2, 3, 5]
    assert fibonacci_sequence(30, 49, 64) == [30, 49]
    assert fibonacci_sequence(30, 49, 40) == [30]  # b > w dropped, a always kept
    assert fibonacci_sequence(30, 49, 10) == [30]


@pytest.mark.parametrize("n, heads, prefix, expected", [
    (196, 12, 0, 0.01994), (196, 12, 1, 0.0299), (784, 12, 0, 0.0115), (64, 12, 0, 0.0311), (196, 6, 0, 0.0354),
])
def test_interaction_densities(n, heads, prefix, expected):
    fractions = interaction_fraction(head_offsets(heads, n), n, prefix)
    mean = sum(fractions) / len(fractions)
    assert mean == pytest.approx(expected, abs=5e-5)  # the spec's figures are rounded to 4 digits
    # the closed form equals the density of the dense reference mask
    mask = offsets_mask(head_offsets(heads, n), n, prefix)
    assert mask.float().mean().item() == pytest.approx(mean, rel=1e-6)


def test_modified_variants():
    mod = head_offsets(12, 196, variant="modified")
    assert mod[0] == (0, 1, 2, 3, 5) and mod[1] == (1, 3, 4, 7) and mod[-1] == (11, 19, 30, 49)
    legacy = head_offsets(12, 196, variant="modified_legacy")
    assert legacy[0] == TABLE_196[0] and legacy[1:] == mod[1:]
    dens = sum(interaction_fraction(mod, 196)) / 12
    assert dens == pytest.approx(0.0383, abs=5e-5)


def test_main_diagonal_excluded_by_default_and_controllable():
    mask = fibonacci_mask(49, 6, num_prefix_tokens=1, layer=2)
    patch = mask[:, 1:, 1:]
    assert not patch.diagonal(dim1=1, dim2=2).any()
    assert mask[:, 0, :].all() and mask[:, :, 0].all()  # CLS row and column
    assert all(0 in o for o in fibonacci_offsets(49, 6, include_diagonal=True))
    mod = fibonacci_offsets(49, 6, variant="modified", shuffle="none")
    assert 0 in mod[0] and not any(0 in o for o in mod[1:])
    assert not any(0 in o for o in fibonacci_offsets(49, 6, variant="modified", include_diagonal=False))


def test_official_shuffle_reproduces_python_random_seed_order():
    assert head_permutation(12, 0, "official") == [1, 9, 8, 5, 10, 2, 3, 7, 4, 0, 11, 6]
    for layer in range(4):
        order = list(range(12))
        random.seed(layer)
        random.shuffle(order)
        assert head_permutation(12, layer, "official") == order
    offs = fibonacci_offsets(196, 12, layer=0, shuffle="official")
    assert offs[0] == (4, 7) and offs[9] == TABLE_196[0]  # head 0 uses Wythoff row 2


def test_stable_shuffle_is_deterministic_per_layer():
    perms = [head_permutation(12, layer) for layer in range(12)]
    assert perms == [head_permutation(12, layer) for layer in range(12)]
    assert all(sorted(p) == list(range(12)) for p in perms)
    assert len({tuple(p) for p in perms}) == 12  # the layers differ
    # pinned: the algorithm (SplitMix64 Fisher-Yates) must not drift between releases
    assert perms[0] == [9, 1, 3, 7, 11, 2, 8, 6, 0, 10, 4, 5]
    assert head_permutation(12, 5, "none") == list(range(12))
    assert sorted(fibonacci_offsets(196, 12, layer=7)) == sorted(TABLE_196)


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="head 11 has offset 30 but there are only N=16"):
        fibonacci_offsets(16, 12, shuffle="none")
    with pytest.raises(ValueError, match="num_heads=1"):
        fibonacci_offsets(196, 1)
    assert fibonacci_offsets(196, 1, w_min=8, w_max=8) == [(1, 2, 3, 5, 8)]
    for bad in ({"w_max": 5.5}, {"w_min": "5"}, {"w_min": True}, {"w_min": 2.0}):
        with pytest.raises(ValueError, match="integer"):
            fibonacci_offsets(196, 12, **bad)
    with pytest.raises(ValueError, match="w_max=4 must be >= w_min=5"):
        fibonacci_offsets(196, 12, w_max=4)
    with pytest.raises(ValueError, match="variant"):
        fibonacci_offsets(196, 12, variant="wythof")
    with pytest.raises(ValueError, match="shuffle"):
        fibonacci_offsets(196, 12, shuffle="random")
    with pytest.raises(ValueError, match="offsets must be < N"):
        offsets_mask([(3,), (9,)], 9)
    q = torch.randn(1, 2, 10, 4)
    with pytest.raises(ValueError, match="prefix"):
        sd.sparse_diagonal_attention(q, q, q, [(1,), (2,)], num_prefix_tokens=10)
    with pytest.raises(ValueError, match="prefix"):
        sd.masked_diagonal_attention(q, q, q, [(1,), (2,)], num_prefix_tokens=11)
    with pytest.raises(ValueError, match="3 offset sets"):
        sd.sparse_diagonal_attention(q, q, q, [(1,), (2,), (3,)])
    with pytest.raises(ValueError, match="offset 9 but there are only N=8"):
        sd.sparse_diagonal_attention(q, q, q, [(1,), (9,)], num_prefix_tokens=2)
    with pytest.raises(ValueError, match="backend"):
        sd.sparse_diagonal_attention(q, q, q, [(1,), (2,)], backend="cuda")


# -------------------------------------------------------------------------- sparse == masked
