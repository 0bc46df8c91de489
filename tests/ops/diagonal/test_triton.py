"""Triton sparse Fibottention kernels (vitmix.ops.diagonal.triton) against the dense masked reference.

Without a GPU the kernels run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, set by
tests/conftest.py); with ``TRITON_INTERPRET=0`` on a CUDA machine the same tests run the compiled kernels.
The interpreter is slow: shapes stay small.
"""
import warnings

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need triton (pip install 'vitmix[gpu]')")

from vitmix import mixers  # noqa: E402
from vitmix.ops import _triton  # noqa: E402
from vitmix.ops import diagonal as sd  # noqa: E402
from vitmix.ops.fibonacci import fibonacci_offsets  # noqa: E402
from _triton_device import triton_test_device  # noqa: E402

DEVICE = triton_test_device()

OPS = torch.ops.vitmix
# (patch tokens N, heads, prefix P, batch, head dim): odd N, P = 0/1/2, batch 1 and 3, head dims 32/48/64;
# the last two span several row blocks (64 rows at d = 48/64), with keys and the prefix shares across blocks
CASES = [(23, 3, 0, 1, 32), (37, 4, 1, 3, 48), (29, 2, 1, 1, 64), (19, 3, 0, 3, 64), (21, 2, 2, 3, 48),
         (99, 2, 1, 3, 48), (135, 3, 0, 1, 64)]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _triton.warn_once.cache_clear()     # every test sees its own one-time warnings
    yield
    _triton.warn_once.cache_clear()


def _inputs(n, heads, prefix, batch, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + n + 7 * d + batch)
    q, k, v, dout = (torch.randn(batch, heads, prefix + n, d, generator=g).to(DEVICE, dtype) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], dout


def _run(fn, inputs, dout):
    out = fn(*inputs)
    return (out, *torch.autograd.grad(out, inputs, dout))


def _reference(offs, prefix, inputs, dout):
    """Masked dense attention in float64 on the same (rounded) inputs: out, dq, dk, dv."""
    ref_in = [t.detach().double().requires_grad_() for t in inputs]
    return _run(lambda q, k, v: sd.masked_diagonal_attention(q, k, v, offs, prefix), ref_in, dout.double())


def _triton_run(offs, prefix, inputs, dout):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a silent fallback to another backend would fail here
        return _run(lambda q, k, v: sd.sparse_diagonal_attention(q, k, v, offs, prefix, backend="triton"), inputs,
                    dout)


def _assert_all_close(got, want, tol, what):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), f"{what}: {name} not finite"
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol, msg=f"{what}: {name} differs")


@pytest.mark.parametrize("n, heads, prefix, batch, d", CASES)
def test_float32_forward_and_gradients_match_masked_and_torch(n, heads, prefix, batch, d):
    offs = fibonacci_offsets(n, heads, layer=2)
    inputs, dout = _inputs(n, heads, prefix, batch, d)
    got = _triton_run(offs, prefix, inputs, dout)
    assert got[0].dtype == torch.float32 and got[0].transpose(1, 2).is_contiguous()  # token-major output
    # float32 sums of ≤ P + 2|F| ≈ 10 weighted rows and d ≤ 64 products: ~1e-6 off; any wrong key is O(1)
    _assert_all_close(got, _reference(offs, prefix, inputs, dout), 2e-5, "masked")
    torch_backend = _run(lambda q, k, v: sd.sparse_diagonal_attention(q, k, v, offs, prefix, backend="torch"),
                         inputs, dout)
    _assert_all_close(got, torch_backend, 2e-5, "torch backend")


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
@pytest.mark.parametrize("n, heads, prefix, batch, d", [CASES[1], CASES[3]])
def test_half_inputs_compute_in_float32_and_round_once(n, heads, prefix, batch, d, dtype, tol):
    offs = fibonacci_offsets(n, heads, layer=1)
    inputs, dout = _inputs(n, heads, prefix, batch, d, dtype)
    got = _triton_run(offs, prefix, inputs, dout)
    assert [t.dtype for t in got] == [dtype] * 4
    # float32 inside, one rounding of each result to 8 (bf16) / 11 (fp16) significant bits — the interpreter
    # truncates (< 2^-7 / 2^-10 relative; GPUs round to nearest) — and dq/dk/dv use the rounded output in
    # delta = dout·out as FlashAttention does, which the cancellation in dout·v − delta amplifies. Over
    # seeds the worst error is ~0.5 tol for bf16 and ~0.3 tol for fp16 with tol = 5e-2 / 5e-3 (rtol and atol).
    _assert_all_close(got, _reference(offs, prefix, inputs, dout), tol, str(dtype))


def test_rows_without_keys_output_zero_and_strided_inputs_work():
    # N = 7, P = 0: head 1 (offset 4) leaves query 3 without a key (3 ± 4 lies outside [0, 7)); q, k, v are views of one
    # (B, T, 3, H, d) projection (the mixer's layout), so nothing is contiguous.
    offs = [(1, 3), (4,)]
    qkv = torch.randn(3, 7, 3, 2, 32).to(DEVICE).requires_grad_()
    inputs = list(qkv.permute(2, 0, 3, 1, 4).unbind(0))
    dout = torch.randn(3, 2, 7, 32).to(DEVICE)
    got = _triton_run(offs, 0, inputs, dout)
    assert torch.equal(got[0][:, 1, 3], torch.zeros_like(got[0][:, 1, 3]))
    _assert_all_close(got, _reference(offs, 0, inputs, dout), 2e-5, "empty rows")  # float32, as above


@pytest.mark.parametrize("prefix", [0, 1])
def test_custom_op_runs_triton_and_matches_torch(prefix):
    # the op that torch.compile/export calls dispatches at run time too: same results as its torch backend
    offs = fibonacci_offsets(17, 3, layer=1)
    flat, counts = sd._flatten_offsets(offs)
    inputs, dout = _inputs(17, 3, prefix, 2, 32)
    results = {}
    for backend in ("triton", "torch"):
        out, lse, lse_pre = OPS.sparse_diagonal_attention(*inputs, flat, counts, prefix, 0.25, backend)
        grads = OPS.sparse_diagonal_attention_backward(dout, *(t.detach() for t in inputs), out, lse, lse_pre, flat,
                                                       counts, prefix, 0.25, backend)
        results[backend] = (out, lse, lse_pre, *grads)
        assert out.transpose(1, 2).is_contiguous() and all(g.transpose(1, 2).is_contiguous() for g in grads)
    for a, b in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)  # float32, as above


def test_custom_op_opcheck_with_triton():
    # schema, autograd registration, fake vs real output metadata and AOT dispatch (what torch.compile runs)
    from torch.library import opcheck

    checks = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    flat, counts = sd._flatten_offsets(fibonacci_offsets(11, 2, layer=1))
    inputs, _ = _inputs(11, 2, 1, 2, 16)
    result = opcheck(OPS.sparse_diagonal_attention.default, (*inputs, flat, counts, 1, 0.25, "triton"),
                     test_utils=checks)
    assert result == {name: "SUCCESS" for name in checks}, result


# ---------------------------------------------------------------------------------- fallbacks
def _fallback(match, q):
    offs = fibonacci_offsets(q.shape[2] - 1, q.shape[1], layer=1)
    with pytest.warns(RuntimeWarning, match=match):
        out = sd.sparse_diagonal_attention(q, q, q, offs, 1, backend="triton")
    torch.testing.assert_close(out, sd.masked_diagonal_attention(q, q, q, offs, 1), rtol=1e-5, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason and process
        sd.sparse_diagonal_attention(q, q, q, offs, 1, backend="triton")


def test_unsupported_dtype_falls_back_with_one_warning(monkeypatch):
    from vitmix.ops.diagonal import triton as diagonal_triton

    monkeypatch.setattr(diagonal_triton, "diagonal_forward", None)  # the kernel must not be called
    _fallback("dtype torch.float64", torch.randn(1, 2, 12, 8, dtype=torch.float64).to(DEVICE))


def test_unsupported_head_dim_falls_back_with_one_warning():
    _fallback("head dim 320", torch.randn(1, 2, 10, 320).to(DEVICE))


def test_missing_triton_falls_back_and_auto_stays_silent_on_cpu(monkeypatch):
    monkeypatch.setattr(_triton, "_import_error", lambda: "triton is not importable (test)")
    _fallback("triton is not importable", torch.randn(2, 2, 12, 8).to(DEVICE))
    if DEVICE == "cpu":  # auto on CPU tensors runs C/torch without a word, also when triton is present
        monkeypatch.undo()
        q = torch.randn(1, 2, 12, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sd._engine(q, q, q, "auto") in ("c", "torch")


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors without the interpreter")
def test_cpu_without_interpreter_falls_back(monkeypatch):
    monkeypatch.setattr(_triton, "interpreting", lambda: False)
    _fallback("tensors on cpu", torch.randn(1, 2, 12, 8))


# -------------------------------------------------------------------------------------- mixer
def test_fibottention_mixer_triton_equals_torch():
    dim, heads = 96, 3                                     # head dim 32
    a = mixers.create("fibottention", dim, heads, backend="torch", qkv_bias=True, layer_idx=2).to(DEVICE)
    b = mixers.create("fibottention", dim, heads, backend="triton", qkv_bias=True, layer_idx=2).to(DEVICE)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 1 + 25, dim).to(DEVICE)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa, hw=(5, 5), num_prefix_tokens=1), b(xb, hw=(5, 5), num_prefix_tokens=1)
    torch.testing.assert_close(yb, ya, rtol=2e-5, atol=2e-5)   # float32, as above
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=2e-5, atol=2e-5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=2e-5, atol=2e-5, msg=name)
