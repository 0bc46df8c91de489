"""Fibottention offsets (vitmix.ops.fibonacci) and the sparse multi-diagonal attention op."""
import math
import os
import random
import sys

import pytest
import torch

from vitmix.ops import sparse_diagonal as sd
from vitmix.ops.fibonacci import (
    fibonacci_mask, fibonacci_offsets, fibonacci_sequence, head_offsets, head_permutation, head_windows,
    interaction_fraction, offsets_mask, wythoff_seeds,
)

try:
    from _memory import peak_memory_mib
except ImportError:  # run from a directory where tests/ is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _memory import peak_memory_mib

BACKENDS = ["c", "torch"] if sd.kernel_available() else ["torch"]

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
# (N, heads, layer, variant, prefix, batch): odd, non-square and square counts, every prefix count
# with both batch sizes on the small N, a selection on the large ones (the dense reference is O(H·N²)).
# N = 16 with 4 heads has rows with no key at all when there is no prefix (offset 9 > N / 2): they
# must give 0, not NaN.
CASES = [(n, h, layer, var, p, b) for (n, h, layer, var) in [(16, 4, 0, "wythoff"), (49, 6, 1, "modified"),
                                                            (196, 12, 2, "wythoff")]
         for p in (0, 1, 2) for b in (1, 3)]
CASES += [(785, 12, 5, "wythoff", 0, 3), (785, 12, 6, "wythoff", 1, 1), (785, 12, 7, "modified", 2, 1)]


def _compare(n, heads, prefix, batch, backend, dtype=torch.float64, d=8, **offset_kw):
    offs = fibonacci_offsets(n, heads, **offset_kw)
    g = torch.Generator().manual_seed(n + 10 * prefix + batch)
    q, k, v = (torch.randn(batch, heads, prefix + n, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(batch, heads, prefix + n, d, generator=g, dtype=dtype)
    ref = sd.masked_diagonal_attention(q, k, v, offs, prefix)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    out = sd.sparse_diagonal_attention(q, k, v, offs, prefix, backend=backend)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    return (out, *grads), (ref, *ref_grads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, heads, layer, variant, prefix, batch", CASES)
def test_sparse_matches_masked_forward_and_gradients(n, heads, layer, variant, prefix, batch, backend):
    got, want = _compare(n, heads, prefix, batch, backend, d=4 if n > 500 else 8, layer=layer, variant=variant)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        # float64 on both sides: only summation order differs, so 1e-10 is loose by ~4 digits
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"{name} differs")
        assert torch.isfinite(a).all()


@pytest.mark.parametrize("prefix", [0, 1])
def test_sparse_matches_masked_at_4096_tokens(prefix):
    # the dense reference costs H·N² here, so 3 heads of dim 4 in float32 (~0.2 GB), computed once
    offs = fibonacci_offsets(4096, 3, layer=3)
    q, k, v = (torch.randn(1, 3, prefix + 4096, 4).requires_grad_() for _ in range(3))
    grad = torch.randn(1, 3, prefix + 4096, 4)
    ref = sd.masked_diagonal_attention(q, k, v, offs, prefix)
    want = (ref, *torch.autograd.grad(ref, (q, k, v), grad))
    del ref
    for backend in BACKENDS:
        out = sd.sparse_diagonal_attention(q, k, v, offs, prefix, backend=backend)
        got = (out, *torch.autograd.grad(out, (q, k, v), grad))
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            # float32, and the C backend uses a polynomial exp (2e-7 relative): 2e-5 covers both
            torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=f"{backend}: {name} differs")


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_sparse_close_to_float64_reference(backend):
    offs = fibonacci_offsets(196, 12, layer=1)
    q, k, v = (torch.randn(2, 12, 197, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ref = sd.masked_diagonal_attention(q, k, v, offs, 1)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = sd.sparse_diagonal_attention(q32, k32, v32, offs, 1, backend=backend)
    grads = torch.autograd.grad(out, (q32, k32, v32), g.float())
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)  # float32 rounding only


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_gradcheck_custom_autograd(backend, prefix):
    offsets = [(1, 3), (2,), (0, 4)]  # includes the diagonal and a head with empty rows when prefix=0 (N=7)
    q, k, v = (torch.randn(2, 3, prefix + 7, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(
        lambda a, b, c: sd.sparse_diagonal_attention(a, b, c, offsets, prefix, backend=backend), (q, k, v),
        fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_rows_give_zero_output_not_nan(backend):
    q = torch.randn(1, 1, 5, 4)
    out = sd.sparse_diagonal_attention(q, q, q, [(3,)], backend=backend)  # token 2 has no key at distance 3
    ref = sd.masked_diagonal_attention(q, q, q, [(3,)])
    assert torch.equal(out[0, 0, 2], torch.zeros(4)) and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_inputs_stay_finite(backend):
    offs = fibonacci_offsets(196, 12)
    q, k, v = (torch.randn(1, 12, 197, 16).mul(30).bfloat16().requires_grad_() for _ in range(3))
    out = sd.sparse_diagonal_attention(q, k, v, offs, 1, backend=backend)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    ref = sd.masked_diagonal_attention(q.float(), k.float(), v.float(), offs, 1)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)  # bf16 output rounding (8 bits)


def test_official_mode_is_the_multiplicative_mask():
    offs = fibonacci_offsets(49, 6)
    q, k, v = (torch.randn(2, 6, 50, 8, dtype=torch.float64) for _ in range(3))
    mask = offsets_mask(offs, 49, 1).double()
    expected = (((q * 8 ** -0.5) @ k.transpose(-1, -2)) * mask).softmax(-1) @ v
    torch.testing.assert_close(sd.official_diagonal_attention(q, k, v, offs, 1), expected, rtol=1e-12, atol=1e-12)
    # masked keys keep weight: the official output differs from the -inf semantics
    gap = sd.official_diagonal_attention(q, k, v, offs, 1) - sd.masked_diagonal_attention(q, k, v, offs, 1)
    assert gap.abs().max() > 0.1


def test_torch_backend_runs_without_the_c_kernel(monkeypatch):
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    assert not sd.kernel_available()
    q = torch.randn(1, 2, 17, 4)
    out = sd.sparse_diagonal_attention(q, q, q, [(1, 2), (3,)], 1)  # auto falls back to torch
    torch.testing.assert_close(out, sd.masked_diagonal_attention(q, q, q, [(1, 2), (3,)], 1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="C compiler"):
        sd.sparse_diagonal_attention(q, q, q, [(1, 2), (3,)], 1, backend="c")


def test_failed_compile_falls_back_to_torch_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))  # nothing cached there
    monkeypatch.setattr(sd._DIAGONAL, "_lib", None)     # forget the loaded library (restored afterwards)
    monkeypatch.setattr(sd._DIAGONAL, "_tried", False)
    with pytest.warns(RuntimeWarning, match="could not compile"):
        assert not sd.kernel_available()
    q = torch.randn(1, 2, 9, 4)
    torch.testing.assert_close(sd.sparse_diagonal_attention(q, q, q, [(1,), (2,)]),
                               sd.masked_diagonal_attention(q, q, q, [(1,), (2,)]), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_backward_memory_grows_linearly(backend):
    def step(n):
        def run():
            offs = fibonacci_offsets(n, 2, layer=1)
            q, k, v = (torch.randn(1, 2, n + 1, 16, requires_grad=True) for _ in range(3))
            sd.sparse_diagonal_attention(q, k, v, offs, 1, backend=backend).sum().backward()
        return run

    small, large = peak_memory_mib(step(4096)), peak_memory_mib(step(16384))
    assert large <= 5 * small, f"peak {large:.1f} MiB at N=16384 vs {small:.1f} MiB at N=4096"
    # and nowhere near an N×N score matrix (2 heads × 16385² × 4 bytes = 2 GiB)
    assert large < 64
