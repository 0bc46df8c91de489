"""FLOP counting: the formulas vitmix adds to FlopCounterMode, and every mixer's analytic count."""
import pytest
import torch
import torch.nn.functional as F

import vitmix
from vitmix.bench.flops import analytic_flops, count_flops, nystrom_flops
from vitmix.mixers.base import TokenMixer


@pytest.fixture(autouse=True)
def _eager_l1_one_thread(monkeypatch):
    # the eager L1 path (cdist) is the one FlopCounterMode sees; one thread keeps tiny shapes fast on a
    # shared machine
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cpu_sdpa_is_counted_forward_and_backward():
    b, h, n, d = 2, 3, 40, 16
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    fwd = count_flops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert fwd.total == 4 * b * h * n * n * d  # q·kᵀ and weights·v, 2 FLOPs per MAC
    both = count_flops(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    assert both.total > 2 * fwd.total  # backward recomputes scores and forms three more products
    assert both.uncounted_ops == []


def test_cdist_is_counted():
    x, y = torch.randn(2, 30, 8), torch.randn(2, 20, 8)
    c = count_flops(lambda: torch.cdist(x, y, p=1.0))
    assert c.total == 2 * 2 * 30 * 20 * 8
    assert "aten._cdist_forward" in c.by_op


def test_onednn_fused_linear_is_counted():
    x, w, b = torch.randn(2, 7, 16), torch.randn(24, 16), torch.randn(24)
    c = count_flops(lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], "none"))
    assert c.total == 2 * 14 * 16 * 24 and c.uncounted_ops == []


def test_uncounted_heavy_ops_are_reported():
    a = torch.randn(3, 10, 10)
    c = count_flops(lambda: torch.linalg.pinv(a))
    assert any("pinv" in op for op in c.uncounted_ops)
    inv = count_flops(lambda: torch.linalg.inv(a))
    assert inv.total == 3 * 2 * 10 ** 3 and inv.uncounted_ops == []


@pytest.mark.parametrize("fused", [True, False])
def test_softmax_counter_equals_analytic(fused):
    m = vitmix.create_mixer("softmax", 64, 4, fused=fused)
    b, n, c = 2, 50, 64
    with torch.no_grad():
        counted = count_flops(lambda: m(torch.randn(b, n, c))).total
    assert counted == 8 * b * n * c * c + 4 * b * n * n * c
    assert analytic_flops(m, b, n) == counted


# (mixer, options) whose every FLOP-relevant op is visible to the counter: counter == formula
VISIBLE = [
    ("soft", {}), ("soft", {"num_landmarks": 16}), ("soft", {"landmarks": "avgpool", "inverse": "exact"}),
    ("soft_norm", {}), ("laplacian", {}), ("laplacian", {"normalize": False, "num_landmarks": 9}),
    ("laplacian", {"conv_groups": "head", "conv_kernel": 5}), ("laplacian", {"rope": True}),
    # the safe start's identity iteration needs 20 steps here to converge without its checked rerun from αPᵀ,
    # which the formula does not count
    ("laplacian", {"newton_alpha": "safe", "newton_iters": 20}),
    ("laplacian", {"num_landmarks": 25}),   # N < 8m: q and k pooled
    ("laplacian", {"landmarks": "conv"}), ("laplacian", {"landmarks": "conv", "num_landmarks": (5, 4)}),
    ("fibottention", {"mode": "masked"}),
    ("fibottention", {"mode": "official"}),
    ("linear", {}), ("performer", {}), ("performer", {"num_features": 17}),
    ("nystromformer", {}), ("nystromformer", {"num_landmarks": 16, "conv_kernel": 0}),
]


@pytest.mark.parametrize("name,options", VISIBLE, ids=[f"{n}-{o}" for n, o in VISIBLE])
def test_mixer_counter_matches_analytic(name, options):
    m = vitmix.create_mixer(name, 64, 4, hw=(12, 12), num_prefix_tokens=0, **options)
    for lin in m.modules():   # small projections: the untied landmark kernel is εI + a near-constant matrix,
        if isinstance(lin, torch.nn.Linear):   # Newton–Schulz converges from its first start (no rerun)
            torch.nn.init.trunc_normal_(lin.weight, std=1e-4)
    x = torch.randn(2, 144, 64)
    with torch.no_grad():
        counted = count_flops(lambda: m(x))
    assert counted.uncounted_ops == []
    assert counted.total == analytic_flops(m, 2, 144)


def test_every_registered_mixer_has_an_analytic_formula():
    for name in vitmix.list_mixers():
        m = vitmix.create_mixer(name, 64, 4, hw=(8, 8), num_prefix_tokens=0)
        assert analytic_flops(m, 1, 64) > 0, name


def test_sparse_fibottention_counter_misses_the_kernel_and_the_bench_uses_the_formula():
    from vitmix.bench import BenchConfig, run_sweep
    from vitmix.ops.fibonacci import interaction_counts

    m = vitmix.create_mixer("fibottention", 64, 4, hw=(12, 12), num_prefix_tokens=0)
    with torch.no_grad():
        counted = count_flops(lambda: m(torch.randn(1, 144, 64))).total
    linears = 2 * 144 * 64 * 3 * 64 + 2 * 144 * 64 * 64
    assert counted == linears  # the sparse kernel is not a torch op: invisible to the counter
    expected = linears + 4 * 16 * sum(interaction_counts(m.head_offsets(144), 144, 0))
    assert analytic_flops(m, 1, 144) == expected
    res = run_sweep(BenchConfig(kind="mixers", names=["fibottention"], sizes=[144], dim=64, heads=4,
                                passes=("fwd", "fwd+bwd"), min_run_time=0.01, measure_memory=False),
                    progress=False)
    fwd, both = (next(r for r in res.rows if r["name"] == "fibottention" and r["pass"] == p)
                 for p in ("fwd", "fwd+bwd"))
    assert fwd["flops_source"] == "analytic" and fwd["gflops"] == pytest.approx(expected / 1e9)
    assert "counter saw only" in fwd["note"]
    assert both["flops_source"] == "counter (lower bound)" and "lower bound" in both["note"]


def test_nystrom_formula_by_hand():
    # N=10, m=2, d=3, T=1, tied: C_q 120, W 24, NS 32, products 120 + 24 + 120
    assert nystrom_flops(10, 2, 3, 1, tied=True) == 120 + 24 + 32 + 120 + 24 + 120
    # untied: C_k = k(K, L_q), the start choice (Cholesky, m³/3) and the 2·m³ residual check
    assert nystrom_flops(10, 2, 3, 1, tied=False) == nystrom_flops(10, 2, 3, 1, tied=True) + 120 + 2 + 16


def test_the_mixer_class_owns_its_analytic_formula():
    class Plain(TokenMixer):
        def mix(self, x, grid, attn_mask=None, is_causal=False):
            return x

    class Custom(Plain):
        def analytic_flops(self, batch, n_tokens):
            return 7 * batch * n_tokens

    assert analytic_flops(Custom(8, 2), 3, 5) == 105
    # TokenMixer's default and a module that is no mixer: no formula, the counter's total stands
    assert analytic_flops(Plain(8, 2), 3, 5) is None and analytic_flops(torch.nn.Linear(2, 2), 3, 5) is None
