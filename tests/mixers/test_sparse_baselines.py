"""Sparse and low-rank baselines (linformer, longformer, bigbird, topk) and the index-sparse op:
fast paths against dense references (forward and every gradient, float64, odd N, batch 1 and 3),
the patterns themselves, FLOP formulas against the counter, Linformer's sequence length, BigBird's
seeded pattern, bf16, bench/analysis coverage and one-line errors."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitmix
from vitmix import mixers
from vitmix.bench.flops import analytic_flops, count_flops
from vitmix.mixers.bigbird import bigbird_index
from vitmix.mixers.linformer import linformer_reference
from vitmix.mixers.topk import topk_attention_reference
from vitmix.ops.index_sparse import index_mask, index_pattern, index_sparse_attention, masked_index_attention

DIM, HEADS = 48, 3
NAMES = ["linformer", "longformer", "bigbird", "topk"]
# float64 throughout: the fast paths differ from their references only in summation order
# (~1e-15 relative); 1e-10 leaves room for N-term sums while any real difference is >> 1e-6


def _grads(layer, x, fn):
    x = x.clone().requires_grad_()
    out = fn(x)
    return out, torch.autograd.grad(out.square().sum(), [x, *layer.parameters()])


def _assert_same(a, b, tol=1e-10):
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_a, out_b, rtol=tol, atol=tol)
    assert len(grads_a) == len(grads_b)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, rtol=tol, atol=tol)


def _layer(name, prefix, n, **opts):
    torch.manual_seed(0)
    hw = (1, n - prefix)
    return mixers.create(name, DIM, HEADS, qkv_bias=True, hw=hw, num_prefix_tokens=prefix, **opts).double().eval()


def _through(layer, attend):
    """The whole layer with its attention replaced by ``attend(q, k, v)``."""
    def fn(x):
        q, k, v = layer._qkv(x)
        return layer._project_out(attend(q, k, v))
    return fn


# ------------------------------------------------------------------------------- layer vs reference
@pytest.mark.parametrize("sharing", ["headwise", "kv", "none"])
@pytest.mark.parametrize("batch,n,prefix", [(1, 17, 1), (3, 23, 0)])
def test_linformer_matches_its_explicit_reference(sharing, batch, n, prefix):
    layer = _layer("linformer", prefix, n, k=5, sharing=sharing)
    f = layer.compress_v if layer.compress_v is not None else layer.compress_k
    x = torch.randn(batch, n, DIM, dtype=torch.float64)
    ref = _through(layer, lambda q, k, v: linformer_reference(q, k, v, layer.compress_k, f))
    _assert_same(_grads(layer, x, layer), _grads(layer, x, ref))
    assert layer.compress_k.shape == ((HEADS, 5, n) if sharing == "none" else (5, n))


@pytest.mark.parametrize("batch,n", [(1, 19), (3, 26)])
def test_topk_matches_the_gather_reference(batch, n):
    layer = _layer("topk", 1, n, topk=6)
    x = torch.randn(batch, n, DIM, dtype=torch.float64)
    ref = _through(layer, lambda q, k, v: topk_attention_reference(q, k, v, 6))
    _assert_same(_grads(layer, x, layer), _grads(layer, x, ref))
    weights = layer.attention_map(x)
    assert ((weights > 0).sum(-1) == 6).all()          # exactly k keys per query, prefix row included


def _window_reference(radius, dilation, prefix):
    """Softmax under a mask built from its definition: patch |i - j| a multiple of the dilation, at
    most radius·dilation apart; prefix rows and columns all allowed."""
    def attend(q, k, v):
        t = q.shape[2]
        i = torch.arange(t - prefix)
        gap = (i[:, None] - i[None, :]).abs()
        allowed = torch.ones(t, t, dtype=torch.bool)
        allowed[prefix:, prefix:] = (gap % dilation == 0) & (gap <= radius * dilation)
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    return attend


@pytest.mark.parametrize("backend", ["auto", "torch"])        # auto: the C kernel where a compiler works
@pytest.mark.parametrize("batch,n,prefix,radius,dilation", [(1, 21, 1, 3, 1), (3, 30, 2, 2, 3), (3, 9, 0, 24, 1)])
def test_longformer_is_the_1d_window_with_global_prefix(backend, batch, n, prefix, radius, dilation):
    layer = _layer("longformer", prefix, n, radius=radius, dilation=dilation, backend=backend)
    x = torch.randn(batch, n, DIM, dtype=torch.float64)
    ref = _through(layer, _window_reference(radius, dilation, prefix))
    _assert_same(_grads(layer, x, layer), _grads(layer, x, ref))
    layer.mode = "masked"                               # the module's dense mode: the same function
    _assert_same(_grads(layer, x, layer), _grads(layer, x, ref))


def test_longformer_global_projections_drive_the_prefix_rows():
    n, prefix = 15, 2
    layer = _layer("longformer", prefix, n, radius=2, global_projections=True)
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    window = _window_reference(2, 1, prefix)

    def ref(x):
        q, k, v = layer._qkv(x)
        qg, kg, vg = layer._global_qkv(x, prefix)
        rows = torch.softmax((qg @ kg.transpose(-1, -2)) * layer.scale, -1) @ vg
        return layer._project_out(torch.cat([rows, window(q, k, v)[:, :, prefix:]], dim=2))

    _assert_same(_grads(layer, x, layer), _grads(layer, x, ref))
    layer.mode = "masked"
    _assert_same(_grads(layer, x, layer), _grads(layer, x, ref))


@pytest.mark.parametrize("batch,n,prefix,block", [(1, 29, 1, 4), (3, 40, 0, 5), (3, 13, 2, 3)])
def test_bigbird_sparse_equals_its_pattern_densely(batch, n, prefix, block):
    layer = _layer("bigbird", prefix, n, block_size=block, random_blocks=2, seed=7)
    x = torch.randn(batch, n, DIM, dtype=torch.float64)
    mask = index_mask(layer.pattern(n - prefix), prefix)

    def dense(q, k, v):
        scores = (q @ k.transpose(-1, -2)) * layer.scale
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    sparse = _grads(layer, x, layer)
    _assert_same(sparse, _grads(layer, x, _through(layer, dense)))
    layer.mode = "masked"
    _assert_same(sparse, _grads(layer, x, layer))


# ------------------------------------------------------------------------------------- the patterns
def test_bigbird_pattern_is_window_plus_distinct_random_blocks():
    n, b, heads = 83, 4, 3                                  # 21 blocks, the last one 3 tokens long
    index = bigbird_index(n, heads, block_size=b, window_blocks=3, random_blocks=3, seed=1)
    nb = index.shape[1]
    assert index.shape == (heads, 21, (3 + 3) * b)
    for h in range(heads):
        for i in range(nb):
            keys = index[h, i][index[h, i] >= 0]
            blocks = (keys // b).unique()
            window = {j for j in (i - 1, i, i + 1) if 0 <= j < nb}
            assert window <= set(blocks.tolist())
            randoms = set(blocks.tolist()) - window
            assert len(randoms) == 3                         # 3 random blocks, all outside the window
            expected = sum(min(b, n - j * b) for j in window | randoms)
            assert keys.numel() == expected == keys.unique().numel()   # whole blocks, no repeats
    again = bigbird_index(n, heads, block_size=b, seed=1)
    assert torch.equal(index, again)                         # the seed fixes the pattern
    assert not torch.equal(index, bigbird_index(n, heads, block_size=b, seed=2))
    assert not torch.equal(index[0], index[1])               # heads draw their own random blocks
    # a short sequence: fewer blocks outside the window than requested; the rest stay empty
    short = bigbird_index(9, 1, block_size=3, window_blocks=3, random_blocks=3, seed=0)
    assert short.shape == (1, 3, 18) and ((short >= 0).sum(-1) == torch.tensor([[9, 9, 9]])).all()


def test_bigbird_pattern_is_fixed_per_layer_and_travels_with_the_state():
    torch.manual_seed(0)
    a, b = mixers.create("bigbird", DIM, HEADS, block_size=4), mixers.create("bigbird", DIM, HEADS, block_size=4)
    assert int(a.pattern_seed) != int(b.pattern_seed)        # layers draw their own seed
    first = a.pattern(40).index.clone()
    a.train()
    x = torch.randn(2, 41, DIM)
    for _ in range(2):
        a(x, num_prefix_tokens=1).sum().backward()
    assert torch.equal(a.pattern(40).index, first)          # not resampled between steps
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.pattern(40).index, first)          # restored from the pattern_seed buffer
    a.eval(), b.eval()
    torch.testing.assert_close(a(x, num_prefix_tokens=1), b(x, num_prefix_tokens=1), rtol=0, atol=0)
    fixed = mixers.create("bigbird", DIM, HEADS, block_size=4, seed=3)
    assert torch.equal(fixed.pattern(40).index, bigbird_index(40, HEADS, 4, seed=3))


# ------------------------------------------------------------------------------ the index-sparse op
def _random_pattern(n, heads, keys, block, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = -(-n // block)
    index = torch.stack([torch.stack([torch.randperm(n, generator=g)[:keys] for _ in range(rows)])
                         for _ in range(heads)])
    index[:, :, -1] = -1                                    # an empty slot in every row
    index[0, 1] = -1                                        # and a row without patch keys
    return index_pattern(index, n, block)


@pytest.mark.parametrize("prefix", [0, 2])
@pytest.mark.parametrize("block", [1, 4])
def test_index_sparse_op_matches_masked_reference_and_gradchecks(prefix, block):
    pattern = _random_pattern(13, 2, 5, block)
    q, k, v = (torch.randn(3, 2, prefix + 13, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = index_sparse_attention(q, k, v, pattern, prefix)
    ref = masked_index_attention(q, k, v, pattern, prefix)
    g = torch.randn_like(out)
    _assert_same((out, torch.autograd.grad(out, (q, k, v), g)), (ref, torch.autograd.grad(ref, (q, k, v), g)))
    if prefix == 0:                                          # the keyless row outputs zeros
        assert out[:, 0, block:2 * block].abs().max() == 0
    # float64 gradcheck of the custom autograd function (fast mode: random directions through the
    # full Jacobian, so every input element is exercised at the cost of a few calls)
    small = [t[:1, :, :, :2].detach().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *t: index_sparse_attention(*t, pattern, prefix), small, fast_mode=True)


def test_index_sparse_op_bf16_and_bad_patterns():
    pattern = _random_pattern(11, 2, 4, 1)
    q, k, v = (torch.randn(1, 2, 12, 8).bfloat16() for _ in range(3))
    out = index_sparse_attention(q, k, v, pattern, 1)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="twice"):
        index_pattern(torch.tensor([[[0, 0]]]), 1)
    with pytest.raises(ValueError, match=r"\[-1, 3\)"):
        index_pattern(torch.tensor([[[3], [0], [1]]]), 3)
    with pytest.raises(ValueError, match="need 2"):
        index_pattern(torch.zeros(1, 3, 1, dtype=torch.long), 4, query_block=2)
    with pytest.raises(ValueError, match="built for N=11"):
        index_sparse_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], pattern, 1)


# ----------------------------------------------------------------------------------- FLOP formulas
COUNTED = [("linformer", {}), ("linformer", {"sharing": "none", "k": 9}), ("topk", {"topk": 10}),
           ("longformer", {"mode": "masked"}), ("longformer", {"mode": "masked", "global_projections": True}),
           ("bigbird", {"block_size": 5}), ("bigbird", {"mode": "masked"})]


@pytest.mark.parametrize("name,options", COUNTED, ids=[f"{n}-{o}" for n, o in COUNTED])
def test_counter_equals_analytic_formula(name, options, monkeypatch):
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    layer = mixers.create(name, 64, 4, hw=(6, 7), num_prefix_tokens=1, **options)
    with torch.no_grad():
        counted = count_flops(lambda: layer(torch.randn(2, 43, 64)))
    assert counted.uncounted_ops == []
    assert counted.total == analytic_flops(layer, 2, 43)


def test_sparse_longformer_formula_counts_window_and_prefix_pairs():
    layer = mixers.create("longformer", 64, 4, radius=3, num_prefix_tokens=1)
    n = 20                                                   # 19 patch tokens
    pairs = 19 + 2 * (19 - 1) + 2 * (19 - 2) + 2 * (19 - 3) + (20 * 20 - 19 * 19)
    assert analytic_flops(layer, 2, n) == 2 * 2 * n * 64 * 4 * 64 + 4 * 2 * 16 * 4 * pairs


# ---------------------------------------------------------------------------- Linformer's length N
def test_linformer_gets_its_length_from_construction_or_the_grid_it_is_told():
    assert mixers.create("linformer", DIM, HEADS, seq_len=30).seq_len == 30
    assert mixers.create("linformer", DIM, HEADS, hw=(4, 5), num_prefix_tokens=1).seq_len == 21
    untold = mixers.create("linformer", DIM, HEADS, hw=(4, 5))       # prefix unknown: N unknown
    assert untold.seq_len is None and untold.max_seq_len == 197 and untold.compress_k.shape == (64, 197)
    untold(torch.randn(2, 22, DIM))                                   # the first 22 columns of E/F
    untold(torch.randn(2, 197, DIM))
    with pytest.raises(ValueError, match="N=198 tokens exceed max_seq_len=197.*seq_len=198") as err:
        untold(torch.randn(2, 198, DIM))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="disagrees"):
        mixers.create("linformer", DIM, HEADS, seq_len=30, hw=(4, 5), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="max_seq_len=50 is for a layer told no N"):
        mixers.create("linformer", DIM, HEADS, seq_len=30, max_seq_len=50)
    built = mixers.create("linformer", DIM, HEADS)
    e = built.compress_k
    mixers.set_token_grid(built, (4, 5), 2)
    assert built.seq_len == 22 and built.compress_k is e and e.shape == (64, 22)   # re-shaped in place
    with pytest.raises(ValueError, match="built for N=22"):
        mixers.set_token_grid(built, (5, 5), 1)
    with pytest.raises(ValueError, match="built for N=22 tokens, got N=21"):
        built(torch.randn(1, 21, DIM))


def test_linformer_parameters_exist_before_any_forward_in_stock_timm():
    """Issue 21 item 8: timm summaries, FLOP counters and optimizers see concrete E/F at once."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=DIM, depth=2, num_heads=HEADS, num_classes=3,
                              attn_layer=mixers.timm_attn("linformer", k=8))
    before = sum(p.numel() for p in model.parameters())               # raised "uninitialized parameter"
    attn = model.blocks[0].attn
    assert attn.compress_k.shape == (8, 197) and attn.awaits_grid
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 3, 32, 32)).sum().backward()                 # 65 tokens: E/F's first 65 columns
    assert sum(p.numel() for p in model.parameters()) == before
    assert attn.compress_k.grad[:, 65:].abs().sum() == 0 < attn.compress_k.grad[:, :65].abs().sum()
    optimizer.step()
    trained = attn.compress_k.detach().clone()
    mixers.set_token_grid(model, hw=(8, 8), num_prefix_tokens=1)      # told after training: E/F are kept
    assert torch.equal(attn.compress_k, trained) and not attn.awaits_grid
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


def test_linformer_in_a_stock_vit_fits_the_grid_it_is_told_without_new_parameter_objects():
    def stock():
        return VisionTransformer(img_size=32, patch_size=4, embed_dim=DIM, depth=1, num_heads=HEADS, num_classes=3,
                                 attn_layer=mixers.timm_attn("linformer", k=8))

    torch.manual_seed(0)
    model = stock()
    params = [id(p) for p in model.parameters()]
    mixers.set_token_grid(model, hw=(8, 8), num_prefix_tokens=1)
    assert [id(p) for p in model.parameters()] == params
    assert model.blocks[0].attn.compress_k.shape == (8, 65) and model.blocks[0].attn.seq_len == 65
    loaded = stock()
    loaded.load_state_dict(model.state_dict())                         # takes the saved length
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_linformer_in_timm_models_at_another_image_size():
    model = vitmix.create_model("vit_nano_patch4_32", mixer="linformer", img_size=48, depth=2)
    assert all(block.attn.seq_len == 1 + 12 * 12 for block in model.blocks)   # built before any forward
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 10)
    stock = VisionTransformer(img_size=32, patch_size=4, embed_dim=DIM, depth=1, num_heads=HEADS, num_classes=3,
                              attn_layer=mixers.timm_attn("linformer", k=8), dynamic_img_size=True)
    stock(torch.randn(1, 3, 32, 32)).sum().backward()        # told no N: up to 197 tokens, here 65
    assert stock.blocks[0].attn.compress_k.grad.shape == (8, 197)
    assert stock(torch.randn(1, 3, 40, 40)).shape == (1, 3)  # 101 tokens
    with pytest.raises(ValueError, match="N=257 tokens exceed max_seq_len=197"):
        stock(torch.randn(1, 3, 64, 64))


# ------------------------------------------------------------------------------ shared behaviour
@pytest.mark.parametrize("name", NAMES)
def test_bf16_autocast_stays_finite(name):
    layer = mixers.create(name, 64, 4, hw=(8, 8), num_prefix_tokens=1)
    x = (8 * torch.randn(2, 65, 64)).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_attention_map_reproduces_the_forward(name):
    """The analysis map is the layer's real token weights: projecting ``map · V`` gives the output."""
    layer = _layer(name, 1, 30, **({"block_size": 4} if name == "bigbird" else {}))
    x = torch.randn(2, 30, DIM, dtype=torch.float64)
    _, _, v = layer._qkv(x)
    torch.testing.assert_close(layer._project_out(layer.attention_map(x) @ v), layer(x), rtol=1e-10, atol=1e-10)


def test_bench_and_analysis_cover_the_new_mixers():
    from vitmix.analysis.maps import mixers_with_maps
    from vitmix.bench import BenchConfig, run_sweep

    assert set(NAMES) <= set(mixers_with_maps())
    res = run_sweep(BenchConfig(kind="mixers", names=NAMES, sizes=[49], dim=32, heads=2, passes=("fwd+bwd",),
                                min_run_time=0.01, measure_memory=False), progress=False)
    assert {r["name"] for r in res.rows if r["status"] == "ok"} >= set(NAMES)


@pytest.mark.parametrize("name,bad,match", [
    ("linformer", {"k": 0}, "k=0"), ("linformer", {"sharing": "headwsie"}, "Did you mean: headwise"),
    ("linformer", {"seq_len": 0}, "seq_len"), ("linformer", {"max_seq_len": True}, "max_seq_len"),
    ("topk", {"topk": 0}, "topk=0"),
    ("longformer", {"radius": -1}, "radius"), ("longformer", {"mode": "sparce"}, "Did you mean: sparse"),
    ("longformer", {"attn_drop": 0.1}, "mode='masked'"), ("bigbird", {"window_blocks": 2}, "odd"),
    ("bigbird", {"block_size": 0}, "block_size"), ("bigbird", {"attn_drop": 0.1}, "mode='masked'"),
])
def test_bad_options_are_one_line_errors(name, bad, match):
    with pytest.raises(ValueError, match=match) as err:
        mixers.create(name, 64, 4, **bad)
    assert "\n" not in str(err.value)


def test_linformer_in_a_pyramid_is_materialized_by_create_model():
    """Pyramid stages pass their grid only in a forward; create_model runs one at the model's input
    size so E/F have their final length before anyone counts, saves or optimises the parameters."""
    model = vitmix.create_model("soft_tiny", mixer="linformer", img_size=64, num_classes=3)
    assert not any(getattr(m, "awaits_grid", False) for m in model.modules())
    assert model.training
    lengths = {m.compress_k.shape[-1] for m in model.modules() if isinstance(m, mixers.get_mixer_class("linformer"))}
    assert lengths == {16 * 16, 8 * 8, 4 * 4}        # stages 1-3 at 64² (strides 4, 8, 16); stage 4 is softmax
    model(torch.randn(2, 3, 64, 64)).sum().backward()
