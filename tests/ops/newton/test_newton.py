"""Newton–Schulz inverse: convergence, start step α, implicit backward, dtypes, bad input."""
import pytest
import torch

from vitmix.ops import gaussian_kernel, laplacian_kernel, newton_schulz_inverse, newton_schulz_reference

D64 = torch.float64


def _spd(batch, m, seed=0, ridge=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, m, m, generator=g, dtype=D64)
    return x @ x.mT / m + ridge * torch.eye(m, dtype=D64)


def _eye(m):
    return torch.eye(m, dtype=D64)


@pytest.mark.parametrize("batch,m", [((), 5), ((1,), 7), ((2, 3), 9)])
def test_converges_to_inverse_on_spd(batch, m):
    A = _spd(batch, m)
    V, res = newton_schulz_inverse(A, iters=30, eps=0.0, return_residual=True)
    torch.testing.assert_close(V, torch.linalg.inv(A), rtol=1e-10, atol=1e-12)  # quadratic convergence
    assert res.shape == A.shape[:-2] and (res < 1e-10).all()


def test_eps_is_added_to_the_diagonal():
    A = _spd((2,), 6)
    V = newton_schulz_inverse(A, iters=40, eps=0.5)
    torch.testing.assert_close(V, torch.linalg.inv(A + 0.5 * _eye(6)), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(newton_schulz_inverse(A, eps=0.5, mode="exact"), torch.linalg.inv(A + 0.5 * _eye(6)))


@pytest.mark.parametrize("symmetric", [None, True, False])
@pytest.mark.parametrize("alpha", ["safe", "transpose", "official"])
def test_forward_matches_unrolled_reference(symmetric, alpha):
    torch.manual_seed(0)
    lm = torch.randn(2, 3, 11, 4, dtype=D64)
    A = gaussian_kernel(lm, lm)
    for iters in (0, 1, 7, 20):
        fast = newton_schulz_inverse(A, iters=iters, symmetric=symmetric, alpha=alpha)
        ref = newton_schulz_reference(A, iters=iters, symmetric=symmetric, alpha=alpha)
        torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)  # same algorithm, same order


def test_start_step_alpha_values():
    A = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=D64)
    P = A + 0.01 * _eye(2)
    # iters=0 returns V0 itself
    torch.testing.assert_close(newton_schulz_inverse(A, iters=0), 1.8 / 1.51**2 * P)            # safe, symmetric
    torch.testing.assert_close(newton_schulz_inverse(A, iters=0, alpha="official"), 1.8 / 1.5**2 * P)
    B = torch.tensor([[1.0, 0.9], [0.1, 1.0]], dtype=D64)
    PB = B + 0.01 * _eye(2)
    # non-symmetric, "transpose": V0 = Pᵀ / (||P||_1 ||P||_inf) = Pᵀ / (1.91 * 1.91)
    torch.testing.assert_close(newton_schulz_inverse(B, iters=0, alpha="transpose"), PB.mT / (1.91 * 1.91))
    # non-symmetric, "safe": V0 = I / ||P||_inf; its residual ||I - P/1.91||_F ≈ 0.66 >= 0.5, so the
    # transposed start is tried too and kept where its residual is smaller
    safe0 = newton_schulz_inverse(B, iters=0)
    eye_start, t_start = _eye(2) / 1.91, PB.mT / (1.91 * 1.91)
    res = [torch.linalg.matrix_norm(_eye(2) - PB @ v) for v in (eye_start, t_start)]
    torch.testing.assert_close(safe0, eye_start if res[0] <= res[1] else t_start)
    torch.testing.assert_close(newton_schulz_inverse(B, iters=0, alpha="official"), 1.8 / 1.9**2 * PB)


def test_symmetry_detected_per_matrix():
    torch.manual_seed(1)
    x, y = torch.randn(2, 6, 3, dtype=D64), torch.randn(2, 6, 3, dtype=D64)
    A = torch.stack([laplacian_kernel(x[0], x[0]), laplacian_kernel(x[1], y[1])])  # symmetric, non-symmetric
    auto = newton_schulz_inverse(A, iters=3)
    torch.testing.assert_close(auto[0], newton_schulz_inverse(A[0], iters=3, symmetric=True))
    torch.testing.assert_close(auto[1], newton_schulz_inverse(A[1], iters=3, symmetric=False))


@pytest.mark.parametrize("alpha", ["safe", "transpose"])
def test_non_symmetric_converges(alpha):
    torch.manual_seed(2)
    A = _eye(8) + 0.4 * torch.rand(3, 8, 8, dtype=D64)  # non-symmetric, non-negative, well conditioned
    V, res = newton_schulz_inverse(A, iters=40, eps=0.0, alpha=alpha, return_residual=True)
    assert (res < 1e-8).all()
    torch.testing.assert_close(V, torch.linalg.inv(A), rtol=1e-8, atol=1e-10)


def _untied_landmark_kernels(spread: float, seed: int = 0, dtype=torch.float32):
    """Laplacian kernels of untied landmarks: 64 matrices 49×49 of pooled, strongly correlated tokens
    (a shared centre plus small offsets; key landmarks = query landmarks + half-size noise), the
    ill-conditioned regime of real LaplacianFormer layers. spread 0.06 gives median cond(A + 0.01 I) ≈ 600."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(64, 1, 32, generator=g, dtype=dtype)
    lq = base + spread * torch.randn(64, 49, 32, generator=g, dtype=dtype)
    lk = lq + 0.5 * spread * torch.randn(64, 49, 32, generator=g, dtype=dtype)
    return laplacian_kernel(lq, lk, 4.0)


def test_safe_start_converges_on_ill_conditioned_untied_landmarks():
    """Issue #9 goal: residual <= 1e-3 after the default 20 iterations at cond ≈ 500, float32 like the
    mixers. The old αPᵀ start ("transpose") squares the condition number and is still far off."""
    A = _untied_landmark_kernels(0.06)
    P = A.double() + 0.01 * _eye(49)
    cond = torch.linalg.cond(P).median()
    assert 400 < cond < 800, cond
    _, res = newton_schulz_inverse(A, iters=20, eps=0.01, return_residual=True)
    _, res_t = newton_schulz_inverse(A, iters=20, eps=0.01, alpha="transpose", return_residual=True)
    norm = 49 ** 0.5                                    # report ||I - PV||_F / sqrt(m), as `analyze newton`
    assert (res / norm).max() <= 1e-3, (res / norm).max()
    assert (res_t / norm).median() > 5e-3               # the old start: not converged after 20 steps


def test_safe_start_choice_and_checked_fallback():
    """Per matrix: a positive-definite symmetric part -> identity start; an indefinite one -> αPᵀ;
    and an identity start that still diverges (PD symmetric part, eigenvalues 1 ± 10i, so
    |1 - μ/||P||| > 1) is caught by the residual check and rerun from αPᵀ."""
    from vitmix.ops.newton import pytorch, start

    good = _eye(4) + 0.1 * torch.ones(4, 4, dtype=D64) + torch.triu(0.05 * torch.ones(4, 4, dtype=D64), 1)
    indefinite = torch.tensor([[0.0, 1.0, 0, 0], [1.0, 0.0, 0, 0], [0, 0, 1.0, 0.3], [0, 0, 0.0, 1.0]], dtype=D64)
    indefinite = indefinite + torch.triu(0.05 * torch.ones(4, 4, dtype=D64), 1)     # eigenvalue ≈ -1
    rotating = torch.block_diag(torch.tensor([[1.0, 10.0], [-10.0, 1.0]], dtype=D64), _eye(2))
    A = torch.stack([good, indefinite, rotating])
    _, identity = start._start(A, A, None, "safe")
    assert identity.tolist() == [True, False, True]
    V0, _ = start._start(A, A, None, "safe")
    diverged = pytorch._iterate(A, V0, 60)
    assert not torch.isfinite(start._residual(A[2], diverged[2]))             # the identity start fails
    assert start._needs_fallback(A, diverged, identity).tolist() == [False, False, True]
    V, res = newton_schulz_inverse(A, iters=60, eps=0.0, return_residual=True)
    assert torch.isfinite(V).all() and (res < 1e-8).all()
    torch.testing.assert_close(V, torch.linalg.inv(A), rtol=1e-8, atol=1e-10)
    # the reference (both starts unrolled, same rule) agrees
    torch.testing.assert_close(newton_schulz_reference(A, iters=60, eps=0.0), V, rtol=1e-8, atol=1e-10)


def test_tiny_kernel_values_do_not_diverge():
    """Laplacian kernels of far-apart landmarks are ~e^-20: the perturbation εI dominates. The safe α
    (from P = A + εI) converges; the official α (from A alone) explodes, as reported in bf89660."""
    torch.manual_seed(3)
    lm = torch.randn(2, 16, 32, dtype=D64) * 3.0
    A = 1e-9 * laplacian_kernel(lm, lm, 4.0)  # tiny kernel values everywhere, the diagonal too
    V, res = newton_schulz_inverse(A, iters=20, eps=0.01, return_residual=True)
    assert torch.isfinite(V).all() and (res < 1e-6).all()
    torch.testing.assert_close(V, torch.linalg.inv(A + 0.01 * _eye(16)), rtol=1e-6, atol=1e-6)
    V_off, res_off = newton_schulz_inverse(A, iters=20, eps=0.01, alpha="official", return_residual=True)
    assert not bool(torch.isfinite(res_off).all() and (res_off < 1).all())


def test_implicit_gradient_matches_exact_inverse_autograd():
    A = _spd((2, 2), 6, seed=4, ridge=2.0)
    g = torch.randn(2, 2, 6, 6, dtype=D64)
    a1 = A.clone().requires_grad_()
    (gn,) = torch.autograd.grad(newton_schulz_inverse(a1, iters=30, eps=0.01), a1, g)
    a2 = A.clone().requires_grad_()
    (ge,) = torch.autograd.grad(torch.linalg.inv(a2 + 0.01 * _eye(6)), a2, g)
    torch.testing.assert_close(gn, ge, rtol=1e-10, atol=1e-12)  # converged: the implicit derivative is exact
    a3 = A.clone().requires_grad_()
    (gr,) = torch.autograd.grad(newton_schulz_reference(a3, iters=30, eps=0.01), a3, g)
    torch.testing.assert_close(gn, gr, rtol=1e-8, atol=1e-10)  # and equals unrolled autograd at convergence


@pytest.mark.parametrize("mode", ["newton", "exact"])
def test_gradcheck_float64(mode):
    A = _spd((2,), 4, seed=5).requires_grad_()
    fn = lambda a: newton_schulz_inverse(a, iters=30, eps=0.01, mode=mode)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (A,), eps=1e-6, atol=1e-7)


def test_autocast_runs_in_float32():
    A = _spd((2,), 8).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        V = newton_schulz_inverse(A)
    assert V.dtype == torch.float32
    torch.testing.assert_close(V, newton_schulz_inverse(A))  # identical: autocast had no effect
    Ab = A.bfloat16().requires_grad_()
    Vb = newton_schulz_inverse(Ab)
    assert Vb.dtype == torch.float32 and torch.isfinite(Vb).all()
    Vb.sum().backward()
    assert Ab.grad.dtype == torch.bfloat16 and torch.isfinite(Ab.grad.float()).all()


@pytest.mark.parametrize("mode", ["newton", "exact"])
def test_nan_propagates(mode):
    A = _spd((2,), 5).float()
    A[0, 1, 2] = float("nan")
    V = newton_schulz_inverse(A, mode=mode)
    assert torch.isnan(V[0]).any() and torch.isfinite(V[1]).all()


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="square"):
        newton_schulz_inverse(torch.randn(3, 4))
    with pytest.raises(ValueError, match="iters"):
        newton_schulz_inverse(torch.eye(3), iters=-1)
    with pytest.raises(ValueError, match="eps"):
        newton_schulz_inverse(torch.eye(3), eps=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        newton_schulz_inverse(torch.eye(3), alpha="paper")
    with pytest.raises(ValueError, match="mode"):
        newton_schulz_inverse(torch.eye(3), mode="pinv")
    with pytest.raises(ValueError, match="symmetric"):
        newton_schulz_inverse(torch.eye(3), symmetric="yes")


def test_c_loop_and_batched_blas_loop_agree(monkeypatch, tmp_path):
    """The Newton–Schulz loop runs in a small C kernel on CPU; forcing its failure (a compiler that
    fails, an empty cache) warns once and gives the batched-BLAS loop's numbers; both agree with the
    unrolled reference (float64 1e-12; float32 to rounding)."""
    from vitmix.ops.newton import c as newton_c

    torch.manual_seed(5)
    lm = torch.randn(3, 2, 49, 8, dtype=D64)
    A = laplacian_kernel(lm, lm + 0.1 * torch.randn_like(lm))     # non-symmetric, m = 49 (padded to 64 in C)
    if newton_c.NS_KERNEL.load() is None:
        pytest.fail("no C compiler: the Newton–Schulz C kernel could not be built (install cc/gcc)")
    c64 = newton_schulz_inverse(A, iters=20, alpha="transpose")
    c32 = newton_schulz_inverse(A.float(), iters=20, alpha="transpose")
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(newton_c.NS_KERNEL, "_lib", None)
    monkeypatch.setattr(newton_c.NS_KERNEL, "_tried", False)
    with pytest.warns(RuntimeWarning, match="could not compile the ns_kernel"):
        blas64 = newton_schulz_inverse(A, iters=20, alpha="transpose")
    blas32 = newton_schulz_inverse(A.float(), iters=20, alpha="transpose")
    torch.testing.assert_close(c64, blas64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c32, blas32, rtol=1e-4, atol=1e-5)      # float32, 20 rounds of m = 49 sums
    torch.testing.assert_close(c64, newton_schulz_reference(A, iters=20, alpha="transpose"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha,symmetric", [("transpose", None), ("transpose", True), ("transpose", False),
                                             ("official", None), ("safe", True)])
def test_c_start_matches_reference_on_mixed_batches(alpha, symmetric, dtype):
    """The C kernel also computes the start when it needs no Cholesky test: per matrix the same rule as
    the reference, for 0 and 20 iterations, and NaN in one matrix stays in that matrix. The
    detected and transposed starts get a batch mixing symmetric and non-symmetric matrices (symmetry
    detected per matrix); the ``αP`` starts (``"official"``, forced symmetric) get symmetric matrices, on which
    they converge (on non-symmetric ones they may diverge, as documented)."""
    from vitmix.ops.newton import c as newton_c

    if newton_c.NS_KERNEL.load() is None:
        pytest.fail("no C compiler: the Newton–Schulz C kernel could not be built (install cc/gcc)")
    torch.manual_seed(6)
    x, y = torch.randn(2, 3, 13, 5, dtype=D64), torch.randn(2, 3, 13, 5, dtype=D64)
    if symmetric is not True and alpha == "transpose":
        A = laplacian_kernel(x, y)
        A[0, 1] = laplacian_kernel(x[0, 1], x[0, 1])          # one symmetric matrix among non-symmetric ones
    else:
        A = laplacian_kernel(x, x)
    A = A.to(dtype)
    for iters in (0, 20):
        fast = newton_schulz_inverse(A, iters=iters, symmetric=symmetric, alpha=alpha)
        ref = newton_schulz_reference(A, iters=iters, symmetric=symmetric, alpha=alpha)
        # float64: the same formulas with sums in another order (1e-12); float32: 20 rounds of 13-term
        # sums, relative to the result's scale
        scale = float(ref.abs().max())
        tol = dict(rtol=1e-12, atol=1e-12) if dtype == D64 else dict(rtol=1e-4, atol=1e-4 * scale)
        torch.testing.assert_close(fast, ref, **tol)
    A[1, 2, 3, 4] = float("nan")
    V = newton_schulz_inverse(A, symmetric=symmetric, alpha=alpha)
    assert torch.isnan(V[1, 2]).any() and torch.isfinite(V[1, :2]).all() and torch.isfinite(V[0]).all()


def test_exact_mode_survives_singular_batches_and_bad_lu_pivots(monkeypatch):
    """`vitmix analyze approx` died in lu_solve ("Pivots given to lu_solve must all be >= 1") after
    batched multi-threaded MKL getrf returned out-of-range pivots; singular batches (ε = 0, duplicate
    landmarks) made inv_ex raise. The exact mode now checks the factorisation and falls back to the
    pseudo-inverse."""
    torch.manual_seed(0)
    A = torch.randn(3, 2, 7, 7, dtype=torch.float64)
    A = A @ A.mT + 7 * _eye(7)
    singular = A.clone()
    singular[1, 0, 3] = singular[1, 0, 2]                  # two equal rows
    out = newton_schulz_inverse(singular, eps=0.0, mode="exact")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.linalg.pinv(singular), rtol=1e-6, atol=1e-8)

    lu_factor_ex = torch.linalg.lu_factor_ex

    def bad_pivots(P):
        lu, pivots, info = lu_factor_ex(P)
        return lu, torch.full_like(pivots, -2116580522), info   # what MKL returned, with info = 0

    monkeypatch.setattr(torch.linalg, "lu_factor_ex", bad_pivots)
    torch.testing.assert_close(newton_schulz_inverse(A, eps=0.0, mode="exact"), torch.linalg.inv(A),
                               rtol=1e-10, atol=1e-12)


def _mixed_batch():
    """Untied Laplacian landmark kernels (identity and αPᵀ starts), one symmetric matrix, and the
    rotating matrix whose identity start diverges (the checked fallback reruns it)."""
    torch.manual_seed(6)
    x, y = torch.randn(2, 3, 13, 5, dtype=D64), torch.randn(2, 3, 13, 5, dtype=D64)
    A = laplacian_kernel(0.3 * x, 0.3 * x + 0.05 * y)
    A[0, 1] = laplacian_kernel(x[0, 1], x[0, 1])
    A[1, 2] = torch.block_diag(torch.tensor([[1.0, 10.0], [-10.0, 1.0]], dtype=D64), torch.eye(11, dtype=D64))
    return A


@pytest.mark.parametrize("alpha,symmetric", [("safe", None), ("safe", False), ("safe", True), ("transpose", None),
                                             ("official", None)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_device_path_decides_the_start_and_fallback_on_the_device(monkeypatch, no_host_reads, alpha, symmetric,
                                                                  dtype):
    """Off the CPU the start and the checked fallback are chosen by tensor ops only (no ``bool()``: no host
    sync, CUDA-graph capturable), with the same result as the CPU path. Simulated on CPU tensors: the
    device rule is forced and every host read of a tensor raises."""
    from vitmix.ops.newton import pytorch, start

    if alpha == "official" or symmetric is True:      # the αP starts converge on symmetric matrices only
        A = laplacian_kernel(*(2 * [torch.randn(2, 3, 13, 5, dtype=D64)]))
    else:
        A = _mixed_batch()
    A = A.to(dtype)
    for forced_fallback in (False, True):
        if forced_fallback:      # every identity start is rerun from αPᵀ
            monkeypatch.setattr(start, "_FALLBACK_RESIDUAL", 0.0)
        want = newton_schulz_inverse(A, iters=30, alpha=alpha, symmetric=symmetric, backend="torch")
        with monkeypatch.context() as mp:
            mp.setattr(start, "_sync_free", lambda t: True)
            mp.setattr(pytorch, "_c_solve", lambda *args: None)     # as on a GPU, where the C solve never runs
            with no_host_reads():
                got = newton_schulz_inverse(A, iters=30, alpha=alpha, symmetric=symmetric, backend="torch")
        tol = dict(rtol=1e-10, atol=1e-10) if dtype == D64 else dict(rtol=1e-4, atol=1e-4 * float(want.abs().max()))
        torch.testing.assert_close(got, want, **tol)


def test_cpu_path_reads_tensors_on_the_host(no_host_reads):
    """The guard above is not vacuous: the CPU path's shortcuts read tensors on the host."""
    with no_host_reads(), pytest.raises(AssertionError, match="read on the host"):
        newton_schulz_inverse(_mixed_batch(), iters=5, alpha="safe", backend="torch")
