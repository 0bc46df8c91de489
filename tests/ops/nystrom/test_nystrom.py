"""Nyström kernel attention: linear-time fast path vs the O(N²) reference, exactness, memory."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _memory import peak_memory_mib  # noqa: E402

from vitmix.ops import kernel_attention_reference, nystrom_attention, nystrom_attention_reference  # noqa: E402
from vitmix.ops.kernel import c as kernel_c  # noqa: E402

D64 = torch.float64
NORMS = [None, "soft_norm", "injective"]


def _inputs(b, h, n, d, m, dv=None, seed=0, tied=False, spread=0.5, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype) * spread
    k = q if tied else torch.randn(b, h, n, d, generator=g, dtype=dtype) * spread
    v = torch.randn(b, h, n, dv or d, generator=g, dtype=dtype)
    lq = torch.randn(b, h, m, d, generator=g, dtype=dtype) * spread
    lk = lq if tied else torch.randn(b, h, m, d, generator=g, dtype=dtype) * spread
    return q, k, v, lq, lk


def _run(fn, tensors, tied, **kw):
    """Output and gradients w.r.t. every distinct input tensor."""
    q, k, v, lq, lk = [t.detach().clone().requires_grad_() for t in tensors]
    if tied:
        k, lk = q, lq
    out = fn(q, k, v, lq, lk, **kw)
    leaves = [q, v, lq] if tied else [q, k, v, lq, lk]
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(99), dtype=D64).to(out.dtype)
    grads = torch.autograd.grad(out, leaves, g)
    return out.detach(), grads


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("b,h,n,d,m,tied", [(1, 1, 37, 8, 5, False), (2, 3, 29, 6, 7, False), (2, 2, 31, 8, 6, True)])
def test_fast_matches_reference_exact_inverse(kernel, normalization, b, h, n, d, m, tied):
    """Forward and all gradients, with the exact inverse (its autograd is exact in the reference too)."""
    t = _inputs(b, h, n, d, m, dv=5, seed=n, tied=tied)
    kw = dict(kernel=kernel, normalization=normalization, inverse="exact", lam=2.0)
    o1, g1 = _run(nystrom_attention, t, tied, **kw)
    o2, g2 = _run(nystrom_attention_reference, t, tied, **kw)
    # float64; different evaluation order (factorised vs explicit N×N): relative 1e-8
    torch.testing.assert_close(o1, o2, rtol=1e-8, atol=1e-9)
    for a, r in zip(g1, g2):
        torch.testing.assert_close(a, r, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
@pytest.mark.parametrize("normalization", NORMS)
def test_fast_matches_reference_newton(kernel, normalization):
    """Newton mode: identical forward; gradients agree once NS has converged (landmarks far apart so
    the landmark kernel is well conditioned; implicit −VᵀGVᵀ == autograd through the unrolled loop)."""
    q, k, v, _, _ = _inputs(2, 2, 23, 6, 4, seed=5)
    g = torch.Generator().manual_seed(6)
    lq = torch.randn(2, 2, 4, 6, generator=g, dtype=D64) * 3
    lk = lq + 0.1 * torch.randn(2, 2, 4, 6, generator=g, dtype=D64)
    kw = dict(kernel=kernel, normalization=normalization, lam=4.0, iters=30)
    o1, g1 = _run(nystrom_attention, (q, k, v, lq, lk), False, **kw)
    o2, g2 = _run(nystrom_attention_reference, (q, k, v, lq, lk), False, **kw)
    torch.testing.assert_close(o1, o2, rtol=1e-8, atol=1e-9)
    for a, r in zip(g1, g2):
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-8)


def test_c_kernel_fast_path_matches_reference(monkeypatch):
    """The C L1 kernel (every size forced onto it) inside the float32 op agrees with the O(N²) float64
    reference, forward and every gradient, for an odd N."""
    monkeypatch.setattr(kernel_c, "_C_MIN_ELEMENTS", 0)
    assert kernel_c.L1_KERNEL.load() is not None, "the C kernel could not be built (install cc/gcc)"
    t = _inputs(2, 3, 45, 8, 6, dv=5, seed=21, dtype=torch.float32)
    kw = dict(kernel="laplacian", normalization="injective", inverse="exact", lam=2.0)
    o1, g1 = _run(nystrom_attention, t, False, **kw)
    o2, g2 = _run(nystrom_attention_reference, [x.double() for x in t], False, **kw)
    # float32 vs float64 through an exact m×m inverse (gradients reach ~1e3): 1e-4 of the largest entry
    torch.testing.assert_close(o1, o2.float(), rtol=1e-4, atol=1e-4 * o2.abs().max().item())
    for a, r in zip(g1, g2):
        torch.testing.assert_close(a, r.float(), rtol=1e-4, atol=1e-4 * r.abs().max().item())


@pytest.mark.parametrize("kernel,normalization",
                         [("laplacian", "injective"), ("gaussian", "soft_norm"), ("gaussian", None)])
def test_gradcheck_float64(kernel, normalization):
    q, k, v, lq, lk = [t.requires_grad_() for t in _inputs(1, 2, 9, 3, 3, dv=2, seed=7)]

    def fn(q, k, v, lq, lk):
        return nystrom_attention(q, k, v, lq, lk, kernel=kernel, normalization=normalization, inverse="exact")

    assert torch.autograd.gradcheck(fn, (q, k, v, lq, lk), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
@pytest.mark.parametrize("tied", [True, False])
def test_all_tokens_as_landmarks_and_exact_inverse_equals_kernel_attention(kernel, tied):
    """With L_k = K, L_q = Q (m = N) and the exact inverse without ε: C_q W⁻¹ C_kᵀ = k(Q, K)."""
    q, k, v, _, _ = _inputs(2, 2, 12, 4, 12, seed=8, tied=tied, spread=1.5)
    out = nystrom_attention(q, k, v, q, k, kernel=kernel, inverse="exact", eps=0.0, lam=1.0)
    ref = kernel_attention_reference(q, k, v, kernel=kernel, lam=1.0)
    torch.testing.assert_close(out, ref, rtol=1e-7, atol=1e-8)  # limited by cond(k(Q, K)) ~ 1e3


def test_approximation_error_falls_as_landmarks_grow():
    torch.manual_seed(9)
    n = 256
    # tokens on a smooth 2-D manifold (like image features): the kernel matrix has a fast-decaying spectrum
    t = torch.rand(1, 1, n, 2, dtype=D64)
    q = torch.cat([torch.sin(3 * t), torch.cos(2 * t), t, t ** 2], -1) * 1.5
    v = torch.randn(1, 1, n, 4, dtype=D64)
    exact = kernel_attention_reference(q, q, v, kernel="gaussian")
    perm = torch.randperm(n)
    errors = []
    for m in (4, 16, 64):
        lm = q[:, :, perm[:m]]  # nested landmark sets
        approx = nystrom_attention(q, q, v, lm, lm, kernel="gaussian", inverse="exact", eps=1e-8)
        errors.append(((approx - exact).norm() / exact.norm()).item())
    assert errors[0] > errors[1] > errors[2], errors
    # measured 0.51 -> 0.13 -> 0.0033; float64 with an exact inverse: any CPU agrees to ~1e-12, and the
    # bound (0.0102) is 3x the measured error
    assert errors[2] < 0.02 * errors[0], errors


@pytest.mark.parametrize("kernel,normalization",
                         [("laplacian", "injective"), ("gaussian", None), ("gaussian", "soft_norm")])
def test_bf16_autocast_finite_outputs_and_grads(kernel, normalization):
    q, k, v, lq, lk = [t.float().requires_grad_() for t in _inputs(2, 2, 64, 16, 16, seed=10)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qb, kb, vb = (t @ torch.eye(16) for t in (q, k, v))  # bf16 activations, as after a Linear
        out = nystrom_attention(qb, kb, vb, lq, lk, kernel=kernel, normalization=normalization)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    out.float().sum().backward()
    for t in (q, k, v, lq, lk):
        assert torch.isfinite(t.grad).all()
    # the inner computation ran in float32: compare with the float32 op on the same bf16 values
    ref = nystrom_attention(qb.detach().float(), kb.detach().float(), vb.detach().float(), lq.detach(), lk.detach(),
                            kernel=kernel, normalization=normalization)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)  # bf16 output rounding only


def test_nan_input_propagates_without_hanging():
    q, k, v, lq, lk = _inputs(1, 2, 16, 4, 4, seed=11, dtype=torch.float32)
    q = q.clone()
    q[0, 0, 3, 1] = float("nan")
    for norm in NORMS:
        out = nystrom_attention(q, k, v, lq, lk, kernel="laplacian", normalization=norm)
        assert torch.isnan(out[0, 0]).any()
        assert torch.isfinite(out[0, 1]).all()  # the other head is unaffected


@pytest.mark.parametrize("kernel,normalization", [("laplacian", "injective"), ("gaussian", None)])
def test_memory_grows_linearly(kernel, normalization):
    """Peak memory of forward+backward at N = 16384 is at most 5× that at N = 4096 (an N×N matrix: 16×)."""

    def step(n):
        def run():
            q, k, v, lq, lk = [t.float().requires_grad_() for t in _inputs(1, 2, n, 16, 16, seed=12)]
            nystrom_attention(q, k, v, lq, lk, kernel=kernel, normalization=normalization).sum().backward()
        return run

    small, large = peak_memory_mib(step(4096)), peak_memory_mib(step(16384))
    assert large <= 5 * small, (small, large)


def test_reference_memory_is_quadratic():
    """Sanity check of the probe: the O(N²) reference does grow ~16× from N = 1024 to 4096."""

    def step(n):
        def run():
            q, k, v, lq, lk = [t.float().requires_grad_() for t in _inputs(1, 1, n, 8, 8, seed=13)]
            nystrom_attention_reference(q, k, v, lq, lk, normalization="injective").sum().backward()
        return run

    assert peak_memory_mib(step(4096)) > 8 * peak_memory_mib(step(1024))


def test_bad_input_raises_value_error():
    q, k, v, lq, lk = _inputs(1, 2, 10, 4, 4, seed=14)
    with pytest.raises(ValueError, match="landmark count must not exceed"):
        big = torch.randn(1, 2, 11, 4, dtype=D64)
        nystrom_attention(q, k, v, big, big)
    with pytest.raises(ValueError, match="head dim mismatch"):
        nystrom_attention(q, torch.randn(1, 2, 10, 5, dtype=D64), v, lq, lk)
    with pytest.raises(ValueError, match="head dim mismatch"):
        nystrom_attention(q, k, v, lq, torch.randn(1, 2, 4, 3, dtype=D64))
    with pytest.raises(ValueError, match="v has 9 tokens"):
        nystrom_attention(q, k, v[:, :, :9], lq, lk)
    with pytest.raises(ValueError, match="same number of query and key landmarks"):
        nystrom_attention(q, k, v, lq, lk[:, :, :3])
    with pytest.raises(ValueError, match="kernel"):
        nystrom_attention(q, k, v, lq, lk, kernel="cosine")
    with pytest.raises(ValueError, match="normalization"):
        nystrom_attention(q, k, v, lq, lk, normalization="softmax")
    with pytest.raises(ValueError, match="inverse"):
        nystrom_attention(q, k, v, lq, lk, inverse="pinv")
    with pytest.raises(ValueError, match="do not broadcast"):
        nystrom_attention(q, k, v, torch.randn(2, 3, 4, 4, dtype=D64), lk)
    with pytest.raises(ValueError, match="need normalization='injective'"):
        nystrom_attention(q, k, v, lq, lk, contrast=0.5)
    with pytest.raises(ValueError, match="contrast=0 must be a finite number > 0"):
        nystrom_attention(q, k, v, lq, lk, normalization="injective", contrast=0)
    with pytest.raises(ValueError, match="mean_weight must be None or a tensor"):
        nystrom_attention(q, k, v, lq, lk, normalization="injective", mean_weight=0.5)


def _weighted_reference(q, k, v, lq, lk, contrast, mean_weight, **kw):
    """The weighted injective map composed outside the O(N²) reference: c·(out − mean V) + w·mean V."""
    out = nystrom_attention_reference(q, k, v, lq, lk, normalization="injective", **kw)
    mean_v = v.mean(-2, keepdim=True)
    return contrast * (out - mean_v) + mean_weight * mean_v


@pytest.mark.parametrize("batch,n,contrast", [(1, 9, 1.0 / 9), (3, 14, 0.37)])
def test_weighted_injective_map_matches_reference_and_gradcheck(batch, n, contrast):
    """contrast and a per-head mean_weight applied inside the injective core: forward and every gradient
    (mean_weight's included, summed over the batch it broadcasts along) against the composition around the
    O(N²) reference, float64 (same tolerances as the unweighted comparison), and gradcheck."""
    q, k, v, lq, lk = _inputs(batch, 2, n, 3, 4, dv=5, seed=31)
    w = torch.tensor([0.3, -1.2], dtype=D64).view(2, 1, 1)
    kw = dict(kernel="laplacian", inverse="exact", lam=2.0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, lq, lk, w)]
    out = nystrom_attention(*leaves[:5], normalization="injective", contrast=contrast, mean_weight=leaves[5], **kw)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, lq, lk, w)]
    ref = _weighted_reference(*ref_leaves[:5], contrast, ref_leaves[5], **kw)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-9)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(32), dtype=D64)
    for a, r in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, ref_leaves, g)):
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-8)

    def fn(*t):
        return nystrom_attention(*t[:5], normalization="injective", contrast=contrast, mean_weight=t[5], **kw)

    assert torch.autograd.gradcheck(fn, tuple(t.detach().requires_grad_() for t in (q, k, v, lq, lk, w)),
                                    eps=1e-6, atol=1e-6)


def test_weighted_injective_map_in_the_c_forward(c_calls):
    """Without gradients the C forward runs and the weights are applied to its output: same numbers as
    the autograd path (float64)."""
    q, k, v, lq, lk = _inputs(2, 2, 20, 4, 4, seed=33)
    w = torch.tensor([0.5, 2.0], dtype=D64).view(2, 1, 1)
    kw = dict(kernel="laplacian", normalization="injective", alpha="transpose", contrast=0.05, mean_weight=w)
    composed = nystrom_attention(q.requires_grad_(), k, v, lq, lk, **kw).detach()
    with torch.no_grad():
        fused = nystrom_attention(q, k, v, lq, lk, **kw)
    assert c_calls["fused"] == 1
    torch.testing.assert_close(fused, composed, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("hw,out",
                         [((8, 8), (4, 4)), ((9, 7), (4, 3)), ((64, 64), (7, 7)), ((5, 6), (5, 6)), ((3, 4), (1, 1))])
def test_avg_pool_landmarks_matches_adaptive_avg_pool2d(hw, out):
    from vitmix.ops import avg_pool_landmarks

    x = torch.randn(2, 3, hw[0] * hw[1], 5, dtype=D64, requires_grad=True)
    got = avg_pool_landmarks(x, hw, out)
    grid = x.reshape(6, hw[0], hw[1], 5).permute(0, 3, 1, 2)
    ref = torch.nn.functional.adaptive_avg_pool2d(grid, out).flatten(2).transpose(1, 2).reshape(2, 3, -1, 5)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(ref, x, g)[0])
    with pytest.raises(ValueError, match="expected"):
        avg_pool_landmarks(x[..., 1:, :], hw, out)
    with pytest.raises(ValueError, match="output grid"):
        avg_pool_landmarks(x, hw, (hw[0] + 1, 1))


@pytest.mark.parametrize("prefix", [1, 3])
def test_avg_pool_landmarks_skips_prefix_tokens(prefix):
    """prefix=P pools the grid after P tokens without slicing: the same landmarks as pooling the slice,
    and the prefix tokens get exactly zero gradient."""
    from vitmix.ops import avg_pool_landmarks

    x = torch.randn(2, 3, prefix + 35, 4, dtype=D64, requires_grad=True)
    got = avg_pool_landmarks(x, (5, 7), (3, 2), prefix=prefix)
    ref = avg_pool_landmarks(x[:, :, prefix:], (5, 7), (3, 2))
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    grad, grad_ref = torch.autograd.grad(got, x, g)[0], torch.autograd.grad(ref, x, g)[0]
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(grad[:, :, :prefix]) == 0
    with pytest.raises(ValueError, match=rf"expected \(\.\.\., {prefix}\+5\*7={prefix + 35}, d\)"):
        avg_pool_landmarks(x[:, :, 1:], (5, 7), (3, 2), prefix=prefix)
    with pytest.raises(ValueError, match="prefix=-1 must be >= 0"):
        avg_pool_landmarks(x, (5, 7), (3, 2), prefix=-1)


# ---------------------------------------------------------------- the fused C forward (inference)
from vitmix.ops.nystrom import c as nystrom_c  # noqa: E402


def _tie(tensors, mode):
    q, k, v, lq, lk = tensors
    if mode == "tied":
        return q, q, v, lq, lq
    return (q, k, v, lq, lq) if mode == "landmarks" else (q, k, v, lq, lk)


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("tie", ["tied", "landmarks", "none"])
@pytest.mark.parametrize("alpha", ["transpose", "official", "safe"])
@pytest.mark.parametrize("b,h,n,d,m,dv", [(1, 2, 65, 32, 9, 32), (2, 3, 37, 7, 5, 11)])
def test_fused_inference_forward_matches_the_composition(c_calls, kernel, normalization, tie, alpha,
                                                          b, h, n, d, m, dv):
    """Without gradients the whole forward is one C call; it gives the numbers of the composition of
    ops that runs when gradients are needed, and of the O(N²) reference. float64: the same formulas
    summed in another order (1e-12 of the output's scale); float32: the kernels are summed directly
    rather than by the GEMM expansion and 20 Newton–Schulz rounds amplify those roundings by the
    landmark matrix's condition number (measured worst 1.1e-5 of the scale, bound 5e-5)."""
    kw = dict(kernel=kernel, normalization=normalization, alpha=alpha, lam=2.0, norm_eps=1e-3)
    for dtype, tol in ((D64, 1e-12), (torch.float32, 5e-5)):
        q, k, v, lq, lk = _tie(_inputs(b, h, n, d, m, dv=dv, seed=31, dtype=dtype), tie)
        if alpha == "official" and tie == "none":     # αP diverges on far from symmetric matrices (documented)
            lk = lq + 0.05 * (lk - lq)
        untied_safe = alpha == "safe" and tie == "none"          # the Cholesky-tested start: not in C
        with torch.no_grad():
            before = c_calls["fused"]
            fused = nystrom_attention(q, k, v, lq, lk, **kw)
            assert c_calls["fused"] == before + (0 if untied_safe else 1)
        composed = nystrom_attention(q, k, v.clone().requires_grad_(), lq, lk, **kw).detach()
        assert c_calls["fused"] == before + (0 if untied_safe else 1)      # gradients: never fused
        assert fused.dtype == dtype and fused.shape == (b, h, n, dv)
        scale = composed.abs().max().item()
        torch.testing.assert_close(fused, composed, rtol=tol, atol=tol * scale)
        if dtype == D64 and alpha != "safe":
            ref = nystrom_attention_reference(q, k, v, lq, lk, **kw)
            torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-10 * scale)


def test_fused_forward_is_deterministic_across_thread_counts(c_calls):
    """Each (batch, head) slice is computed by one thread start to end: the thread count cannot change
    a single bit."""
    t = _inputs(3, 4, 50, 8, 6, seed=32, dtype=torch.float32)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.inference_mode():
                outs.append(nystrom_attention(*t, kernel="laplacian", normalization="injective", alpha="transpose"))
    finally:
        torch.set_num_threads(threads)
    assert c_calls["fused"] == 2 and torch.equal(outs[0], outs[1])


def test_fused_forward_is_skipped_where_it_does_not_apply(c_calls):
    """The composition runs for: gradients needed, the exact inverse, leading dims that only broadcast,
    half results of float32 compute are still fused (computed in float32, returned in the input dtype)."""
    q, k, v, lq, lk = _inputs(2, 2, 20, 4, 4, seed=33, dtype=torch.float32)
    with torch.no_grad():
        nystrom_attention(q, k, v, lq, lk, kernel="laplacian", inverse="exact")
        nystrom_attention(q, k, v[:1], lq, lk, kernel="laplacian", alpha="transpose")   # v broadcast over batch
        assert c_calls["fused"] == 0
        half = nystrom_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), lq.bfloat16(), lk.bfloat16(),
                                 kernel="laplacian", alpha="transpose", normalization="injective")
    assert c_calls["fused"] == 1 and half.dtype == torch.bfloat16 and torch.isfinite(half).all()
    nystrom_attention(q.requires_grad_(), k, v, lq, lk, kernel="laplacian", alpha="transpose")
    assert c_calls["fused"] == 1


def test_fused_forward_falls_back_to_the_composition_without_a_compiler(monkeypatch, tmp_path):
    """Fault injection: a compiler that fails and an empty cache give one warning and exactly the
    composition's numbers (the same ops that run when gradients are needed)."""
    t = _inputs(2, 2, 40, 8, 6, seed=34, dtype=torch.float32)
    kw = dict(kernel="laplacian", normalization="injective", alpha="transpose")
    composed = nystrom_attention(t[0], t[1], t[2].clone().requires_grad_(), t[3], t[4], **kw).detach()
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(nystrom_c.NYSTROM_KERNEL, "_lib", None)
    monkeypatch.setattr(nystrom_c.NYSTROM_KERNEL, "_tried", False)
    with pytest.warns(RuntimeWarning, match="could not compile the nystrom_forward"), torch.no_grad():
        out = nystrom_attention(*t, **kw)
    assert torch.equal(out, composed)

