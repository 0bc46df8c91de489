"""Every mixer on 1-D sequences (sequence=True) and with key-padding masks (issue 48, deliverables 1-2)."""
import pytest
import torch

import vitmix  # noqa: F401  (registers every mixer)
from vitmix import mixers
from vitmix.mixers import TokenMixer
from vitmix.mixers.sequence import SequenceGrid, segment_means

DIM, HEADS, N = 16, 2, 13
ALL = mixers.list_mixers()
#: options that make a padded run comparable with the unpadded one: Linformer not told its N (a shorter input
#: uses E/F's first columns), small windows and blocks so that 13 tokens leave something sparse
OPTIONS = {"linformer": dict(max_seq_len=N), "longformer": dict(radius=3), "bigbird": dict(block_size=2, seed=3),
           "topk": dict(topk=4), "nystromformer": dict(num_landmarks=5)}
#: the smallest sequence each mixer works on at 2 heads (Fibottention's second head needs N > 4)
SHORTEST = {"fibottention": 5}


def _layer(name, **options):
    torch.manual_seed(0)
    return mixers.create(name, DIM, HEADS, sequence=True, **{**OPTIONS.get(name, {}), **options}).double().eval()


def _mask(lengths, n=N):
    return torch.tensor(lengths)[:, None] > torch.arange(n)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("prefix", [0, 1])
def test_every_mixer_runs_on_a_1d_sequence_of_any_length(name, prefix):
    """N = 37 + prefix: no square, no multiple of a landmark count; forward and backward are finite."""
    layer = mixers.create(name, DIM, HEADS, sequence=True, num_prefix_tokens=prefix,
                          **({"max_seq_len": 64} if name == "linformer" else {}))
    x = torch.randn(3, prefix + 37, DIM, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.pow(2).mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ALL)
def test_every_mixer_says_what_it_does_on_1d(name):
    text = mixers.get_mixer_class(name).sequence_support()
    assert isinstance(text, str) and text.strip()


def _per_sample(layer, x, lengths):
    """Outputs and gradients of each sample run alone, unpadded."""
    outs, x_grads = [], []
    params = [p for p in layer.parameters() if p.requires_grad]
    param_grads = [torch.zeros_like(p) for p in params]
    for i, length in enumerate(lengths):
        xi = x[i:i + 1, :length].detach().clone().requires_grad_()
        out = layer(xi)
        grads = torch.autograd.grad(out.sum(), [xi, *params], allow_unused=True)
        outs.append(out[0].detach())
        x_grads.append(grads[0][0])
        for acc, g in zip(param_grads, grads[1:]):
            if g is not None:
                acc += g
    return outs, x_grads, param_grads


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("lengths", [(13, 7, 5), (13, 1, 6), (9,)], ids=["odd", "length-1", "batch-1"])
def test_padded_batch_equals_each_sample_unpadded(name, lengths):
    """float64: the outputs on real tokens, the input gradients and the parameter gradients of the summed real
    outputs equal those of the samples run alone (<= 1e-10); padded tokens neither leak nor come out non-zero."""
    lengths = tuple(max(n, SHORTEST.get(name, 1)) for n in lengths)       # a mixer's shortest sequence, unpadded too
    _check_padded_equals_alone(_layer(name), lengths)


def _check_padded_equals_alone(layer, lengths):
    mask = _mask(lengths)
    x = torch.randn(len(lengths), N, DIM, dtype=torch.float64, requires_grad=True)
    out = layer(x, mask=mask)
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out[mask].sum(), [x, *params], allow_unused=True)
    outs, x_grads, param_grads = _per_sample(layer, x, lengths)
    for i, length in enumerate(lengths):
        torch.testing.assert_close(out[i, :length], outs[i], rtol=0, atol=1e-10)
        torch.testing.assert_close(grads[0][i, :length], x_grads[i], rtol=0, atol=1e-10)
        assert not out[i, length:].any()        # padded positions come out as zeros
        assert not grads[0][i, length:].any()   # and padded inputs reach no real output
    for p, g, ref in zip(params, grads[1:], param_grads):
        torch.testing.assert_close(torch.zeros_like(p) if g is None else g, ref, rtol=0, atol=1e-10)


#: landmark-mixer options with their own masked arithmetic, and those that fall back to one run per length
LANDMARK_VARIANTS = [
    ("soft", dict(landmarks="avgpool", num_landmarks=4), "masked"),
    ("soft", dict(inverse="exact", conv_kernel=0), "masked"), ("soft", dict(preset="official"), "masked"),
    ("soft_norm", dict(newton_alpha="official"), "masked"),
    ("soft_norm", dict(preset="official"), "by_length"),             # the legacy inverse's batch-global α
    ("laplacian", dict(rope=True, conv_groups="head", num_landmarks=4), "masked"),
    ("laplacian", dict(normalize=False), "masked"),
    ("laplacian", dict(landmarks="conv", num_landmarks=4), "masked"),     # learnt landmarks of segment means
    ("laplacian", dict(norm_scale="learnt", temperature="head", mean_weight=None), "masked"),
    ("laplacian", dict(norm_scale="sqrt", newton_alpha="official", qk_norm=True), "masked"),
    ("laplacian", dict(newton_alpha="safe"), "by_length"),          # residual-checked starts
    ("laplacian", dict(inverse="exact", newton_eps=0.0), "by_length"),     # a singular empty block
]


@pytest.mark.parametrize("name,options,how", LANDMARK_VARIANTS, ids=[f"{n}-{o}" for n, o, _ in LANDMARK_VARIANTS])
def test_landmark_variants_with_a_prefix_token_mask_exactly(name, options, how):
    layer = _layer(name, num_prefix_tokens=1, **options)
    assert layer.padding_mask == how
    _check_padded_equals_alone(layer, (13, 8, 2))


@pytest.mark.parametrize("name", ALL)
def test_a_mask_without_padding_changes_nothing(name):
    layer = _layer(name)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    torch.testing.assert_close(layer(x, mask=torch.ones(2, N, dtype=torch.bool)), layer(x), rtol=0, atol=1e-12)


def test_softmax_mask_joins_an_attention_mask():
    """A causal mask and a key-padding mask together: the real tokens of a sample equal its causal run alone."""
    layer = _layer("softmax")
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    out = layer(x, mask=_mask((N, 6)), is_causal=False, attn_mask=torch.ones(N, N, dtype=torch.bool).tril())
    alone = layer(x[1:, :6], attn_mask=torch.ones(6, 6, dtype=torch.bool).tril())
    torch.testing.assert_close(out[1, :6], alone[0], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- landmarks on 1-D
def test_segment_means_cover_any_length():
    t = torch.arange(2 * 11, dtype=torch.float64).reshape(1, 1, 11, 2)
    lm = segment_means(t, SequenceGrid(1, 10), 4)      # prefix token 0 left out; windows of 10 tokens into 4
    expected = torch.stack([t[0, 0, 1 + a:1 + b].mean(0) for a, b in ((0, 3), (2, 5), (5, 8), (7, 10))])
    torch.testing.assert_close(lm[0, 0], expected)


@pytest.mark.parametrize("name", ["soft", "soft_norm", "laplacian"])
def test_landmark_count_on_1d(name):
    layer = mixers.create(name, 64, 2, sequence=True)             # head dim 32, stride 2: one per 4 tokens
    assert layer.sequence_landmarks(4000) == 49                   # capped at the papers' 49
    assert layer.sequence_landmarks(1) == 1
    fixed = mixers.create(name, 64, 2, sequence=True, num_landmarks=16)
    assert fixed.sequence_landmarks(100) == 16 and fixed.sequence_landmarks(9) == 9
    assert mixers.create(name, 64, 2, sequence=True, num_landmarks=None).sequence_landmarks(401) == 100


def test_soft_avgpool_landmarks_on_1d_are_segment_means():
    layer = mixers.create("soft", DIM, HEADS, sequence=True, landmarks="avgpool", num_landmarks=4)
    q = torch.randn(2, HEADS, 21, DIM // HEADS)
    torch.testing.assert_close(layer._landmarks(q, SequenceGrid(0, 21)), segment_means(q, SequenceGrid(0, 21), 4))


def test_soft_conv_landmarks_on_1d_start_as_segment_means_after_conversion():
    """load_attention sets the landmark conv to s×s average pooling: on 1-D its block of the segment mean
    gives the segment mean, then LayerNorm + GELU."""
    layer = mixers.create("soft", DIM, HEADS, sequence=True, num_landmarks=4)
    teacher = mixers.create("softmax", DIM, HEADS)
    layer.load_attention(teacher.state_dict())
    q = torch.randn(2, HEADS, 21, DIM // HEADS)
    grid = SequenceGrid(0, 21)
    torch.testing.assert_close(layer._landmarks(q, grid), layer.Qnorm_act(segment_means(q, grid, 4)))


@pytest.mark.parametrize("name", ["soft", "laplacian"])
def test_local_conv_on_1d_is_the_middle_row_of_the_2d_filter(name):
    """The local term of a 1-D sequence equals the 2-D layer's on a 1 × L grid (zero padding above/below)."""
    torch.manual_seed(0)
    seq = mixers.create(name, DIM, HEADS, sequence=True, num_landmarks=4).double()
    x = torch.randn(2, 30, DIM, dtype=torch.float64)
    v = torch.randn(2, HEADS, 30, DIM // HEADS, dtype=torch.float64)
    if name == "soft":
        from vitmix.mixers.grid import head_conv
        local = head_conv(seq.conv, v, 0, 1, 30)
        w = seq.conv.weight[:, :, seq.conv_kernel // 2:seq.conv_kernel // 2 + 1]          # the middle row
        row = torch.nn.functional.conv2d(v.permute(0, 3, 1, 2).reshape(-1, HEADS, 1, 30), w,
                                         padding=(0, seq.conv_kernel // 2), groups=HEADS)
        torch.testing.assert_close(local, row.reshape(2, -1, HEADS, 30).permute(0, 2, 3, 1))
    assert seq(x).shape == x.shape


# ------------------------------------------------------------------------------- layouts and errors
def test_set_token_grid_sequence_makes_every_mixer_1d():
    model = torch.nn.Sequential(mixers.create("soft", DIM, HEADS), mixers.create("softmax", DIM, HEADS))
    mixers.set_token_grid(model, None, 0, sequence=True)
    assert all(m.sequence for m in model)
    x = torch.randn(2, 23, DIM)                    # 23 tokens: no square grid, yet it runs
    assert model(x).shape == x.shape
    with pytest.raises(ValueError, match="cannot infer a square"):
        mixers.set_token_grid(model, None, 0)(x)   # back to an image grid


def test_sequence_per_call_overrides_the_mixer():
    layer = mixers.create("laplacian", DIM, HEADS)
    x = torch.randn(1, 23, DIM)
    assert layer(x, sequence=True).shape == x.shape
    with pytest.raises(ValueError, match="square"):
        layer(x)


@pytest.mark.parametrize("mask, match", [
    (torch.ones(2, N, dtype=torch.int64), "bool tensor"),
    (torch.ones(2, N + 1, dtype=torch.bool), r"shape \(B, N\) = \(2, 13\)"),
    (_mask((N, 0)), "sample 1 of the batch is all padding"),
    (~_mask((N - 3, N - 3)), "real tokens first"),
], ids=["dtype", "shape", "all-padding", "left-padding"])
@pytest.mark.parametrize("name", ["softmax", "laplacian", "fibottention"])
def test_bad_masks_are_one_line_errors(name, mask, match):
    with pytest.raises(ValueError, match=match) as err:
        _layer(name)(torch.randn(2, N, DIM, dtype=torch.float64), mask=mask)
    assert "\n" not in str(err.value)


def test_a_mask_on_an_image_grid_asks_for_a_sequence():
    layer = mixers.create("soft", DIM, HEADS, hw=(3, 4), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="needs a 1-D sequence .*pass sequence=True"):
        layer(torch.randn(2, N, DIM), mask=_mask((N, 5)))


def test_a_mask_must_leave_a_token_after_the_prefix():
    layer = mixers.create("soft", DIM, HEADS, sequence=True, num_prefix_tokens=1)
    with pytest.raises(ValueError, match="real token after its 1 prefix"):
        layer(torch.randn(2, N, DIM), mask=_mask((N, 1)))


class _NoMask(TokenMixer):
    """A non-spatial mixer that cannot mask (the default)."""

    def mix(self, x, grid, attn_mask=None, is_causal=False):
        return x


class _ImageOnly(_NoMask):
    spatial = True


def test_a_mixer_that_cannot_mask_says_so():
    with pytest.raises(ValueError, match="_NoMask cannot take a key-padding mask"):
        _NoMask(DIM, HEADS)(torch.randn(1, 5, DIM), mask=torch.ones(1, 5, dtype=torch.bool))


def test_an_image_only_mixer_refuses_a_sequence_in_one_line():
    with pytest.raises(ValueError, match="works on image token grids only") as err:
        _ImageOnly(DIM, HEADS, sequence=True)
    assert "\n" not in str(err.value)
    model = torch.nn.Sequential(_ImageOnly(DIM, HEADS, hw=(2, 2)))
    with pytest.raises(ValueError, match="image token grids only"):
        mixers.set_token_grid(model, None, 0, sequence=True)
    assert model[0].hw == (2, 2) and not model[0].sequence          # refused before anything changed


def test_vitmix_mixers_shows_the_1d_behaviour_and_the_masking(capsys):
    from vitmix.cli import main
    from vitmix.listing import sequence_line

    assert main(["mixers"]) == 0
    out = capsys.readouterr().out
    for name in ALL:
        assert f"1-D: {sequence_line(mixers.get_mixer_class(name))}" in out
    assert "key-padding mask within the batch" in sequence_line(mixers.get_mixer_class("softmax"))
    assert "one run per valid length" in sequence_line(mixers.get_mixer_class("bigbird"))
    assert sequence_line(_ImageOnly) == "no (needs an image token grid)"
    assert sequence_line(_NoMask).endswith("no key-padding mask")


@pytest.mark.parametrize("name", ALL)
def test_attention_maps_of_a_1d_sequence(name):
    """``vitmix analyze maps`` reads attention_map: it resolves the 1-D layout as forward does."""
    layer = _layer(name, **({"max_seq_len": 23} if name == "linformer" else {}))
    x = torch.randn(2, 23, DIM, dtype=torch.float64)
    try:
        maps = layer.attention_map(x)
    except NotImplementedError:
        pytest.skip(f"{name} exposes no attention map")
    assert maps.shape == (2, HEADS, 23, 23) and torch.isfinite(maps).all()


SEQUENCE_FLOPS = [("soft", {}), ("soft", {"landmarks": "avgpool"}), ("soft_norm", {"num_landmarks": 16}),
                  ("laplacian", {}), ("laplacian", {"rope": True, "conv_groups": "head"}),
                  ("laplacian", {"landmarks": "conv"})]


@pytest.mark.parametrize("name,options", SEQUENCE_FLOPS, ids=[f"{n}-{o}" for n, o in SEQUENCE_FLOPS])
def test_analytic_flops_on_a_1d_sequence_match_the_counter(name, options, monkeypatch):
    """``vitmix bench``'s formula counts the 1-D landmarks (segment means, SOFT's one-block conv) and the
    1-D local conv as the FLOP counter sees them."""
    from vitmix.bench.flops import analytic_flops, count_flops

    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")       # the eager L1 path (cdist), which the counter sees
    layer = mixers.create(name, 64, 4, sequence=True, **options)
    for lin in layer.modules():          # small projections: Newton–Schulz converges from its first start
        if isinstance(lin, torch.nn.Linear):
            torch.nn.init.trunc_normal_(lin.weight, std=1e-4)
    with torch.no_grad():
        counted = count_flops(lambda: layer(torch.randn(2, 301, 64)))
    assert counted.uncounted_ops == []
    assert counted.total == analytic_flops(layer, 2, 301)
