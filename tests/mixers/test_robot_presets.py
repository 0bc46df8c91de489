"""The robot-learning forms of Fibottention (``preset="robot"``) and BigBird (``layout="band"``),
checked against tables written out by hand from the official robot code's rules."""
import random

import pytest
import torch

from vitmix.mixers.bigbird import BigBirdAttention, band_random_mask
from vitmix.mixers.fibottention import FibottentionAttention

# Wythoff rows i = 1..12 with the window N = 81 for every head; rows i > 1 start with (i - 1, ⌊iφ⌋)
ROBOT_ROWS_81 = [
    (1, 2, 3, 5, 8, 13, 21, 34, 55),
    (1, 3, 4, 7, 11, 18, 29, 47, 76),
    (2, 4, 6, 10, 16, 26, 42, 68),
    (3, 6, 9, 15, 24, 39, 63),
    (4, 8, 12, 20, 32, 52),
    (5, 9, 14, 23, 37, 60),
    (6, 11, 17, 28, 45, 73),
    (7, 12, 19, 31, 50),
    (8, 14, 22, 36, 58),
    (9, 16, 25, 41, 66),
    (10, 17, 27, 44, 71),
    (11, 19, 30, 49, 79),
]


def _hand_mask(rows, n):
    mask = torch.zeros(len(rows), n, n, dtype=torch.bool)
    for h, offsets in enumerate(rows):
        for d in offsets:
            i = torch.arange(n - d)
            mask[h, i, i + d] = mask[h, i + d, i] = True
    return mask


@pytest.mark.parametrize("layer", [0, 3])
def test_robot_preset_offsets_are_the_hand_table_in_pythons_per_layer_order(layer):
    attn = FibottentionAttention(96, 12, preset="robot", layer_idx=layer)
    order = list(range(12))
    random.seed(layer)
    random.shuffle(order)
    assert attn.head_offsets(81) == [ROBOT_ROWS_81[i] for i in order]
    assert (attn.mode, attn.variant, attn.windows) == ("official", "modified_legacy", "full")


def test_robot_preset_density_and_multiplicative_mask():
    n = 81
    assert _hand_mask(ROBOT_ROWS_81, n).float().mean().item() == pytest.approx(0.1082, abs=5e-4)
    attn = FibottentionAttention(48, 12, preset="robot", layer_idx=1).double()
    x = torch.randn(2, 1 + n, 48, dtype=torch.float64)
    mask = torch.ones(12, n + 1, n + 1, dtype=torch.float64)
    mask[:, 1:, 1:] = _hand_mask(attn.head_offsets(n), n)
    q, k, v = attn._qkv(x)
    weights = ((q @ k.transpose(-1, -2)) * attn.scale * mask).softmax(-1)   # the logits times the 0/1 mask
    expected = attn.proj((weights @ v).transpose(1, 2).reshape(2, n + 1, 48))
    torch.testing.assert_close(attn(x, num_prefix_tokens=1), expected)
    masked = FibottentionAttention(48, 12, preset="robot", mode="masked", layer_idx=1).double()
    masked.load_state_dict(attn.state_dict())
    assert (masked(x, num_prefix_tokens=1) - expected).abs().max() > 1e-3     # -inf outside: another function


def test_fibottention_windows_option_is_checked():
    with pytest.raises(ValueError, match="windows='ful' is not one of spread, full.*full"):
        FibottentionAttention(96, 12, windows="ful")


def test_bigbird_band_layout_mask_and_redraw():
    n, heads, band = 81, 4, 4
    g = torch.Generator().manual_seed(0)
    mask = band_random_mask(n, heads, 1, band, generator=g)
    assert mask.shape == (heads, n + 1, n + 1)
    assert mask[:, 0, :].all() and mask[:, :, 0].all()
    patch = mask[:, 1:, 1:]
    pos = torch.arange(n)
    in_band = (pos[:, None] - pos[None, :]).abs() <= band
    assert patch[:, in_band].all()
    extra = (patch & ~in_band).sum(dim=(1, 2))
    assert (extra > 0).all() and (extra <= n).all()                   # at most N random pairs per head
    again = band_random_mask(n, heads, 1, band, generator=g)
    assert not torch.equal(again, mask)                                # redrawn at every call


def test_bigbird_band_layout_attends_only_inside_the_mask():
    torch.manual_seed(0)
    attn = BigBirdAttention(32, 4, layout="band").eval()
    x = torch.randn(1, 1 + 81, 32)
    weights = attn.attention_map(x, num_prefix_tokens=1)
    assert weights.shape == (1, 4, 82, 82)
    row = weights[0, :, 40]                                            # patch token 39: band 35..43 + CLS
    assert (row > 0).sum(-1).min() >= 1 + 9
    with pytest.raises(ValueError, match="layout='bands' is not one of blocks, band"):
        BigBirdAttention(32, 4, layout="bands")
