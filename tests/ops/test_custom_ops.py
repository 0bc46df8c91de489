"""The ``vitmix::*`` custom ops behind torch.compile / torch.export: opcheck, gradients, the traced
route, export decompositions, and caches that stay real while exporting.

Eager calls run the ops' ``autograd.Function``s (tested in the other files of this folder); these
tests call the registered ops (``torch.ops.vitmix.*``) directly and through traced code.
"""
import pytest
import torch
from torch.library import opcheck

import vitmix.ops  # noqa: F401  (registers the ops)
from vitmix.ops import diagonal as sd
from vitmix.ops import export_decompositions
from vitmix.ops.diagonal import plan as diagonal_plan
from vitmix.ops.kernel import c as kernel_c
from vitmix.ops.dynamic import dynamic_depthwise_conv2d, dynamic_depthwise_conv2d_reference
from vitmix.ops.fibonacci import fibonacci_offsets
from vitmix.ops.kernel import gaussian_kernel_reference, laplacian_kernel_reference
from vitmix.ops.newton import newton_schulz_inverse

OPS = torch.ops.vitmix
D64 = torch.float64
# opcheck's sub-tests: schema (no hidden mutation/aliasing), autograd registration, fake vs real
# output metadata, and AOT autograd tracing with dynamic shapes (fwd + bwd against eager)
CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck(op, args):
    result = opcheck(op, args, test_utils=CHECKS)
    assert result == {name: "SUCCESS" for name in CHECKS}, result


def _randn(*shape, dtype=D64, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)


# ------------------------------------------------------------------------------------ kernels
PAIRS = [((7, 3), (5, 3)), ((1, 1, 13, 8), (1, 1, 5, 8)), ((2, 3, 11, 5), (2, 3, 4, 5))]


# odd sizes, batch 1 and > 1, both dtypes, the C kernel and PyTorch's loops
KERNEL_CASES = [(PAIRS[0], torch.float32, False), (PAIRS[1], D64, True), (PAIRS[2], torch.float32, True),
                (PAIRS[2], D64, False)]


@pytest.mark.parametrize("pair,dtype,c_kernel", KERNEL_CASES)
def test_kernel_ops_opcheck(monkeypatch, pair, dtype, c_kernel):
    xs, ys = pair
    if c_kernel:
        monkeypatch.setattr(kernel_c, "_C_MIN_ELEMENTS", 0)      # every size takes the C kernel when it loads
    else:
        monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    x, y = _randn(*xs, dtype=dtype), _randn(*ys, dtype=dtype, seed=1)
    _opcheck(OPS.gaussian_kernel.default, (x, y))
    _opcheck(OPS.laplacian_kernel.default, (x, y, 3.0))
    g = _randn(*xs[:-1], ys[-2], dtype=dtype, grad=False, seed=2)
    with torch.no_grad():
        out_g, out_l = OPS.gaussian_kernel(x, y), OPS.laplacian_kernel(x, y, 3.0)
    _opcheck(OPS.gaussian_kernel_backward.default, (g, x.detach(), y.detach(), out_g))
    _opcheck(OPS.laplacian_kernel_backward.default, (g, x.detach(), y.detach(), out_l, 3.0))


def test_kernel_ops_gradcheck_float64(monkeypatch):
    monkeypatch.setattr(kernel_c, "_C_MIN_ELEMENTS", 0)
    x, y = _randn(2, 9, 3), _randn(2, 4, 3, seed=1)
    assert torch.autograd.gradcheck(lambda a, b: OPS.gaussian_kernel(a, b), (x, y), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradcheck(lambda a, b: OPS.laplacian_kernel(a, b, 2.0), (x, y), eps=1e-6, atol=1e-8)


def test_kernel_ops_equal_the_references():
    x, y = _randn(2, 3, 11, 5), _randn(2, 3, 4, 5, seed=1)
    g = _randn(2, 3, 11, 4, grad=False, seed=2)
    for op, ref in ((lambda a, b: OPS.gaussian_kernel(a, b), gaussian_kernel_reference),
                    (lambda a, b: OPS.laplacian_kernel(a, b, 2.5), lambda a, b: laplacian_kernel_reference(a, b, 2.5))):
        got, want = op(x, y), ref(x, y)
        # float64, only the summation order differs (GEMM expansion / C loops vs broadcast)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for a, b in zip(torch.autograd.grad(got, (x, y), g), torch.autograd.grad(want, (x, y), g)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


# ------------------------------------------------------------------------------- Newton–Schulz
def _ns_inputs():
    lm = _randn(2, 3, 11, 4, grad=False)
    sym = torch.exp(-torch.cdist(lm, lm))                       # a symmetric landmark kernel
    nonsym = torch.exp(-torch.cdist(lm, _randn(2, 3, 11, 4, grad=False, seed=5)))
    return sym, nonsym


@pytest.mark.parametrize("symmetric,alpha", [(None, "safe"), (False, "transpose"), (True, "official")])
def test_newton_op_opcheck(symmetric, alpha):
    for A in _ns_inputs():
        _opcheck(OPS.newton_schulz_inverse.default, (A.clone().requires_grad_(), 7, 0.01, symmetric, alpha, "newton"))
    # float32, the models' 20 steps (on the symmetric kernel: the "official" start can diverge elsewhere)
    A_sym, A = _ns_inputs()
    _opcheck(OPS.newton_schulz_inverse.default, (A_sym.float().requires_grad_(), 20, 0.01, symmetric, alpha, "newton"))
    V = OPS.newton_schulz_inverse(A, 7, 0.01, symmetric, alpha, "newton")
    _opcheck(OPS.newton_schulz_inverse_backward.default, (V, _randn(2, 3, 11, 11, grad=False, seed=3)))


def test_newton_op_exact_mode_and_gradcheck():
    A = _ns_inputs()[1][:1, :1]
    _opcheck(OPS.newton_schulz_inverse.default, (A.clone().requires_grad_(), 0, 0.1, None, "safe", "exact"))
    # the implicit backward -Vᵀ G Vᵀ is the exact derivative of the exact inverse
    assert torch.autograd.gradcheck(lambda a: OPS.newton_schulz_inverse(a, 0, 0.1, None, "safe", "exact"),
                                    (A.clone().requires_grad_(),))


def _ns_cases():
    """(A, symmetric, alpha) triples that converge: forcing the symmetric start on the non-symmetric
    kernel, or its "official" start, diverges (NaN), as documented."""
    A_sym, A = _ns_inputs()
    return ([(A_sym, sym, alpha) for sym in (None, True, False) for alpha in ("safe", "transpose", "official")]
            + [(A, sym, alpha) for sym in (None, False) for alpha in ("safe", "transpose")])


def test_newton_op_equals_the_eager_function():
    for A, sym, alpha in _ns_cases():
        got = OPS.newton_schulz_inverse(A, 20, 0.01, sym, alpha, "newton")
        want = newton_schulz_inverse(A, iters=20, eps=0.01, symmetric=sym, alpha=alpha)
        assert torch.isfinite(got).all() and torch.equal(got, want), alpha     # the same function runs behind both


# ---------------------------------------------------------------------------- sparse diagonal
def _diag_args(n, heads, prefix, batch, dtype=D64):
    """Offsets of ``heads`` heads for ``n`` patch tokens and the op's leading arguments."""
    offs = fibonacci_offsets(n, heads, layer=1)
    flat, counts = sd._flatten_offsets(offs)
    q, k, v = (_randn(batch, heads, prefix + n, 4, dtype=dtype, seed=i) for i in range(3))
    return offs, (q, k, v, flat, counts, prefix)


@pytest.mark.parametrize("n,heads,prefix,batch,backend", [(16, 3, 0, 1, "auto"), (23, 4, 1, 2, "torch"),
                                                         (30, 2, 2, 3, "auto")])
def test_sparse_op_opcheck(n, heads, prefix, batch, backend):
    for dtype in (torch.float32, D64):
        _, args = _diag_args(n, heads, prefix, batch, dtype)
        _opcheck(OPS.sparse_diagonal_attention.default, (*args, 0.5, backend))
    _, (q, k, v, flat, counts, p) = _diag_args(n, heads, prefix, batch)
    qkv = torch.randn(batch, prefix + n, 3, heads, 4, dtype=D64)
    q2, k2, v2 = qkv.permute(2, 0, 3, 1, 4).unbind(0)          # strided inputs, read in place by the C kernel
    _opcheck(OPS.sparse_diagonal_attention.default, (q2, k2, v2, flat, counts, p, 0.5, backend))
    with torch.no_grad():
        out, lse, lse_pre = OPS.sparse_diagonal_attention(q, k, v, flat, counts, p, 0.5, backend)
    dout = torch.randn_like(out)
    _opcheck(OPS.sparse_diagonal_attention_backward.default,
             (dout, q.detach(), k.detach(), v.detach(), out, lse, lse_pre, flat, counts, p, 0.5, backend))


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_sparse_op_gradcheck_and_matches_masked_reference(backend, prefix):
    offs, (q, k, v, flat, counts, p) = _diag_args(11, 3, prefix, 2)
    op = lambda a, b, c: OPS.sparse_diagonal_attention(a, b, c, flat, counts, p, 0.5, backend)[0]  # noqa: E731
    assert torch.autograd.gradcheck(op, (q, k, v), fast_mode=True)
    got, want = op(q, k, v), sd.masked_diagonal_attention(q, k, v, offs, p, scale=0.5)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)     # float64: summation order only
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_sparse_op_layout_is_token_major_for_every_backend():
    # one fake layout for every backend: the compiled graph may not depend on which kernel runs
    _, (q, k, v, flat, counts, p) = _diag_args(20, 3, 1, 2)
    for backend in ("auto", "torch"):
        out, lse, lse_pre = OPS.sparse_diagonal_attention(q, k, v, flat, counts, p, 0.5, backend)
        assert out.transpose(1, 2).is_contiguous() and lse.is_contiguous() and lse_pre.shape == (2, 3, 1)
        grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        assert all(gr.transpose(1, 2).is_contiguous() for gr in grads)


# ------------------------------------------------------------------------- dynamic depthwise conv
@pytest.mark.parametrize("shape,bias_kind", [((1, 3, 5, 7, 3), "shared"), ((3, 4, 6, 5, 3), "per_sample"),
                                             ((2, 5, 9, 4, 5), "none")])
def test_dynamic_conv_op_opcheck_and_gradcheck(shape, bias_kind):
    B, C, H, W, k = shape
    x = _randn(B, H, W, C, grad=False).permute(0, 3, 1, 2).requires_grad_()   # channels-last view of tokens
    kernels = _randn(B, C, k, k, seed=1)
    bias = {"shared": _randn(C, seed=2), "per_sample": _randn(B, C, seed=2), "none": None}[bias_kind]
    _opcheck(OPS.dynamic_depthwise_conv2d.default, (x, kernels, bias))
    inputs = [t for t in (x, kernels, bias) if t is not None]
    op = lambda a, b, *c: OPS.dynamic_depthwise_conv2d(a, b, c[0] if c else None)  # noqa: E731
    assert torch.autograd.gradcheck(op, tuple(inputs), fast_mode=True)
    got, want = op(*inputs), dynamic_depthwise_conv2d_reference(x, kernels, bias)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, inputs, g), torch.autograd.grad(want, inputs, g)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)       # the grouped conv's own backward


# ---------------------------------------------------------------------------- export decompositions
def _decomposition_cases():
    offs, diag = _diag_args(23, 4, 1, 2)
    xs, ks = _randn(2, 4, 6, 5, grad=False), _randn(2, 4, 3, 3, grad=False, seed=1)
    x, y = _randn(2, 3, 11, 5, grad=False), _randn(2, 3, 4, 5, grad=False, seed=1)
    return [
        (OPS.gaussian_kernel.default, (x, y)),
        (OPS.laplacian_kernel.default, (x, y, 2.5)),
        *[(OPS.newton_schulz_inverse.default, (M, 20, 0.01, sym, alpha, "newton")) for M, sym, alpha in _ns_cases()],
        (OPS.sparse_diagonal_attention.default, (*[t.detach() for t in diag[:3]], *diag[3:], 0.5, "auto")),
        (OPS.sparse_diagonal_attention.default,
         (*[t.detach() for t in _diag_args(16, 3, 0, 1)[1][:3]], *_diag_args(16, 3, 0, 1)[1][3:], 0.5, "torch")),
        (OPS.dynamic_depthwise_conv2d.default, (xs, ks, _randn(4, grad=False, seed=2))),
        (OPS.dynamic_depthwise_conv2d.default, (xs, ks, None)),
    ]


def test_every_forward_op_has_a_decomposition():
    forward_ops = {getattr(OPS, name).default for name in dir(OPS)
                   if not name.startswith("_") and not name.endswith("_backward")
                   and isinstance(getattr(OPS, name), torch._ops.OpOverloadPacket)}
    assert forward_ops and forward_ops == set(export_decompositions())


@pytest.mark.parametrize("case", range(len(_decomposition_cases())))
def test_decompositions_equal_the_ops(case):
    op, args = _decomposition_cases()[case]
    want = op(*args)
    got = export_decompositions()[op](*args)
    want, got = (w if isinstance(w, tuple) else (w,) for w in (want, got))
    for a, b in zip(got, want):
        # float64 on both sides: only summation order differs (the Newton–Schulz loop runs 20 steps)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_exact_inverse_has_no_decomposition():
    with pytest.raises(ValueError, match="inverse='newton'"):
        export_decompositions()[OPS.newton_schulz_inverse.default](_ns_inputs()[0], 0, 0.1, None, "safe", "exact")


def test_decompositions_are_traceable_with_a_dynamic_batch():
    """The decomposed program runs on another batch size, with no vitmix op left in it."""
    class Layer(torch.nn.Module):
        def forward(self, q, lm):
            from vitmix.ops import nystrom_attention, sparse_diagonal_attention

            a = nystrom_attention(q, q, q, lm, lm, kernel="laplacian", normalization="injective")
            b = nystrom_attention(q, q, q, lm, lm, kernel="gaussian")
            return a + b + sparse_diagonal_attention(q, q, q, [(1, 2), (3,)], 1)

    def vitmix_ops(ep):     # in every (sub)graph: grad-mode regions are nested graph modules
        return {n.target for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)
                for n in gm.graph.nodes if "vitmix" in str(n.target)}

    q, lm = torch.randn(2, 2, 17, 4), torch.randn(2, 2, 4, 4)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(Layer(), (q, lm), dynamic_shapes=({0: batch}, {0: batch}))
    assert vitmix_ops(ep) == {OPS.laplacian_kernel.default, OPS.gaussian_kernel.default,
                              OPS.newton_schulz_inverse.default, OPS.sparse_diagonal_attention.default}
    ep = ep.run_decompositions(export_decompositions())
    assert vitmix_ops(ep) == set()
    q3, lm3 = torch.randn(3, 2, 17, 4), torch.randn(3, 2, 4, 4)
    torch.testing.assert_close(ep.module()(q3, lm3), Layer()(q3, lm3), rtol=1e-4, atol=1e-5)  # float32 rounding


# ------------------------------------------------------------------------------ traced routing
def test_traced_code_calls_the_custom_ops_and_eager_code_does_not():
    x, y = torch.randn(2, 9, 4), torch.randn(2, 3, 4)
    fn = lambda a, b: vitmix.ops.laplacian_kernel(a, b) + vitmix.ops.gaussian_kernel(a, b)  # noqa: E731
    graph_ops = []

    def backend(gm, example_inputs):
        graph_ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), fn(x, y), rtol=0, atol=0)   # the same functions run
    assert "vitmix.laplacian_kernel.default" in graph_ops and "vitmix.gaussian_kernel.default" in graph_ops
    out = vitmix.ops.laplacian_kernel(x.requires_grad_(), y)
    assert type(out.grad_fn).__name__ == "_LaplacianKernelBackward"      # eager: the autograd.Function


def test_exporting_does_not_leave_fake_tensors_in_the_plan_cache():
    """Non-strict export runs Python under fake tensors; a plan cached then must still be real."""
    diagonal_plan._plan_cached.cache_clear()

    class Layer(torch.nn.Module):
        def forward(self, q):
            plan = sd.diagonal_plan([(1, 2), (3,)], q.shape[2] - 1, q.device)
            return sd.sparse_diagonal_attention(q, q, q, plan, 1)

    q = torch.randn(2, 2, 12, 4)
    torch.export.export(Layer(), (q,))
    assert diagonal_plan._plan_cached.cache_info().currsize == 1
    torch.testing.assert_close(Layer()(q), sd.masked_diagonal_attention(q, q, q, [(1, 2), (3,)], 1),
                               rtol=1e-5, atol=1e-6)     # eager, with the cached plan (C kernel on CPU)


def test_dynamic_conv_eager_route_is_unchanged():
    x, kernels = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 3, 3)
    assert torch.equal(dynamic_depthwise_conv2d(x, kernels), OPS.dynamic_depthwise_conv2d(x, kernels, None))
