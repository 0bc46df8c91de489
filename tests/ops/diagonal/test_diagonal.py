"""The sparse multi-diagonal attention op (vitmix.ops.diagonal) against its dense references: C and PyTorch
back ends, forward and gradients, fallbacks, memory."""
import os
import sys

import pytest
import torch

from vitmix.ops import diagonal as sd
from vitmix.ops.diagonal import c as diagonal_c
from vitmix.ops.fibonacci import (
    fibonacci_offsets, offsets_mask,
)

try:
    from _memory import peak_memory_mib
except ImportError:  # run from a directory where tests/ is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from _memory import peak_memory_mib

BACKENDS = ["c", "torch"] if sd.kernel_available() else ["torch"]


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
    monkeypatch.setattr(diagonal_c._DIAGONAL, "_lib", None)     # forget the loaded library (restored afterwards)
    monkeypatch.setattr(diagonal_c._DIAGONAL, "_tried", False)
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
