"""Triton kernels of the Gaussian/Laplacian kernel matrices against the references; the backend dispatch,
its fallbacks and one-time warnings; the mixers' ``backend`` option (the Newton–Schulz loop:
``tests/ops/newton/test_triton.py``; the ``calls`` fixture: ``tests/ops/conftest.py``).

Without a GPU the kernels run on CPU tensors in Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before triton is imported); with ``TRITON_INTERPRET=0`` and a GPU they run
compiled on CUDA tensors. The interpreter is slow: the shapes are small but odd (masked tile edges).
"""
import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install 'vitmix[gpu]'): no Triton kernels to test")

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from vitmix import mixers  # noqa: E402
from vitmix.ops import _triton  # noqa: E402
from vitmix.ops.kernel import triton as kernel_triton  # noqa: E402
from vitmix.ops.kernel import (  # noqa: E402
    gaussian_kernel, gaussian_kernel_reference, laplacian_kernel, laplacian_kernel_reference,
)
from vitmix.ops.newton import newton_schulz_inverse  # noqa: E402
from _triton_device import triton_test_device  # noqa: E402

DEVICE = triton_test_device()

pytestmark = pytest.mark.usefixtures("one_thread")
OPS = torch.ops.vitmix
LAM = 4.0


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _triton.warn_once.cache_clear()      # each test sees its own one-time warnings
    yield


def _kernel(kind):
    if kind == "gaussian":
        return gaussian_kernel, gaussian_kernel_reference
    return (lambda x, y, backend="auto": laplacian_kernel(x, y, LAM, backend=backend),
            lambda x, y: laplacian_kernel_reference(x, y, LAM))


def _pair(lead, n, m, d, dtype, seed=0):
    """Tokens and landmarks at a scale where the kernel values are O(0.1..1), with exact ties
    (landmark 0 equals token 0; channel 0 of landmark 1 equals that of token 1) for sign(0) = 0."""
    g = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.randn(*lead, n, d, generator=g)
    y = 0.1 * torch.randn(*lead, m, d, generator=g)
    y[..., 0, :] = x[..., 0, :]
    if m > 1:
        y[..., 1, 0] = x[..., 1, 0]
    return (x.to(dtype=dtype, device=DEVICE).requires_grad_(), y.to(dtype=dtype, device=DEVICE).requires_grad_())


def _compare(kind, x, y, out_tol, grad_tol):
    fast, ref = _kernel(kind)
    out = fast(x, y, backend="triton")
    xr, yr = (t.detach().double().requires_grad_() for t in (x, y))
    want = ref(xr, yr)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, **out_tol)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, (x, y), g.float())
    for got, exp, inp in zip(grads, torch.autograd.grad(want, (xr, yr), g), (x, y)):
        assert got.dtype == inp.dtype
        torch.testing.assert_close(got.double(), exp, **grad_tol)


# float32 arithmetic against a float64 reference on the same input values: the exponent sums d terms
# (relative error ~ d·2⁻²⁴ ≈ 4e-6 at d = 64) and each gradient sums N or M such products
F32_OUT = dict(rtol=2e-5, atol=1e-6)
F32_GRAD = dict(rtol=1e-4, atol=2e-5)
# bfloat16 inputs are read as they are and computed in float32 (same output tolerance); the gradients
# are returned in bfloat16 (8 mantissa bits: relative 2⁻⁸ ≈ 4e-3 per element)
BF16_GRAD = dict(rtol=1e-2, atol=2e-3)
SHAPES = [((1,), 13, 5, 32), ((3, 1), 37, 9, 48), ((3,), 11, 7, 64), ((1, 2), 9, 3, 48)]


@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
@pytest.mark.parametrize("lead,n,m,d", SHAPES)
def test_kernels_match_the_reference_fp32(calls, kind, lead, n, m, d):
    x, y = _pair(lead, n, m, d, torch.float32)
    _compare(kind, x, y, F32_OUT, F32_GRAD)
    assert calls["forward"] == 1 and calls["grads"] == 1


@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
@pytest.mark.parametrize("lead,n,m,d", [SHAPES[0], SHAPES[2]])
def test_kernels_match_the_reference_bf16(calls, kind, lead, n, m, d):
    x, y = _pair(lead, n, m, d, torch.bfloat16)
    _compare(kind, x, y, F32_OUT, BF16_GRAD)
    assert calls["forward"] == 1 and calls["grads"] == 1


@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
def test_several_tiles_and_split_partner_sums(monkeypatch, calls, kind):
    # 256-value tiles: N = 70 spans five 16-token tiles of the forward and of the token gradient;
    # 32-token chunks split the landmark gradient's sum
    monkeypatch.setattr(kernel_triton, "_FWD_TILE", 256)
    monkeypatch.setattr(kernel_triton, "_TOKEN_GRAD_TILE", 256)
    assert kernel_triton._forward_blocks(70, 37)["BLOCK_N"] == kernel_triton._token_grad_blocks(70, 5)["BLOCK_N"] == 16
    monkeypatch.setattr(kernel_triton, "_SPLIT_ROWS", 32)
    x, y = _pair((1,), 70, 37, 5, torch.float32)
    _compare(kind, x, y, F32_OUT, F32_GRAD)


@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
@pytest.mark.parametrize("n,m,d", [(19, 1, 7), (60, 49, 33), (130, 128, 5), (9, 3, 130)])
def test_tiles_fitted_to_m_and_d(monkeypatch, calls, kind, n, m, d):
    # m = 1 and 49 fill one landmark tile, m = 128 two of 64; d = 130 spans two gradient channel tiles
    monkeypatch.setattr(kernel_triton, "_SPLIT_ROWS", 32)
    x, y = _pair((2,), n, m, d, torch.float32)
    _compare(kind, x, y, F32_OUT, F32_GRAD)


def test_block_sizes_follow_m_and_d():
    # m = 49 landmarks: one 64-wide tile (x read once), not two 32-wide ones; a program's accumulator
    # holds 16384 float32 values (128 per thread)
    assert kernel_triton._forward_blocks(16384, 49) == dict(BLOCK_N=256, BLOCK_M=64)
    assert kernel_triton._forward_blocks(16384, 7) == dict(BLOCK_N=1024, BLOCK_M=16)
    assert kernel_triton._forward_blocks(10, 128) == dict(BLOCK_N=16, BLOCK_M=64)
    # a landmark-gradient program covers the whole head dim up to 128 channels (g and out read once);
    # a token-gradient program 32 channels (twice at d = 64, not 8 times as with 8-channel tiles)
    for d in (1, 33, 64, 128):
        assert kernel_triton._grad_blocks(49, d)["BLOCK_D"] >= d
    assert kernel_triton._grad_blocks(49, 64) == dict(BLOCK_A=64, BLOCK_D=64)
    assert kernel_triton._grad_blocks(49, 256) == dict(BLOCK_A=32, BLOCK_D=128)
    assert kernel_triton._token_grad_blocks(16384, 64) == dict(BLOCK_N=256, BLOCK_D=32)
    assert kernel_triton._token_grad_blocks(10, 7) == dict(BLOCK_N=16, BLOCK_D=16)


@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
def test_strided_broadcast_and_other_ranks(calls, kind):
    fast, ref = _kernel(kind)
    qkv = 0.1 * torch.randn(2, 11, 3, 2, 32, device=DEVICE)
    q = qkv.permute(2, 0, 3, 1, 4)[0]                    # (2, 2, 11, 32) view of a fused qkv output
    lm = 0.1 * torch.randn(1, 2, 5, 32, device=DEVICE)   # broadcast over the batch
    cases = [(q, lm), (q[0, 0], lm[0, 0]), (q[0], lm[0]), (q.reshape(2, 1, 2, 11, 32), lm[None])]
    for x, y in cases:
        x, y = x.detach().requires_grad_(), y.detach().requires_grad_()
        out = fast(x, y, backend="triton")
        want = ref(x, y)
        torch.testing.assert_close(out, want, **F32_OUT)
        g = torch.randn_like(want)
        for a, b in zip(torch.autograd.grad(out, (x, y), g), torch.autograd.grad(want, (x, y), g)):
            torch.testing.assert_close(a, b, **F32_GRAD)
    assert calls["forward"] == len(cases)


def test_custom_ops_run_triton_when_asked(calls):
    x, y = _pair((2,), 9, 5, 32, torch.float32)
    for op, ref, args in ((OPS.gaussian_kernel, gaussian_kernel_reference, ()),
                          (OPS.laplacian_kernel, lambda a, b: laplacian_kernel_reference(a, b, LAM), (LAM,))):
        out, want = op(x, y, *args, "triton"), ref(x, y)
        torch.testing.assert_close(out, want, **F32_OUT)
        g = torch.randn_like(want)
        for a, b in zip(torch.autograd.grad(out, (x, y), g), torch.autograd.grad(want, (x, y), g)):
            torch.testing.assert_close(a, b, **F32_GRAD)
    assert calls["forward"] == 2 and calls["grads"] == 2


def test_compiled_code_runs_triton(calls):
    x, y = _pair((2,), 9, 5, 32, torch.float32)
    fn = lambda a, b: laplacian_kernel(a, b, LAM, backend="triton").sum()  # noqa: E731
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    (gx,) = torch.autograd.grad(compiled(x, y), x)
    (want,) = torch.autograd.grad(laplacian_kernel_reference(x, y, LAM).sum(), x)
    torch.testing.assert_close(gx, want, **F32_GRAD)
    assert calls["forward"] == 1 and calls["grads"] == 1      # the op chose Triton when the graph ran


# -------------------------------------------------------------------------------- dispatch, fallbacks
def _landmark_kernels(lead, m, tied, seed=0):
    """Laplacian kernels of pooled-like landmarks: the matrices the Newton–Schulz loop inverts."""
    g = torch.Generator().manual_seed(seed)
    lq = 0.3 * torch.randn(*lead, m, 16, generator=g)
    lk = lq if tied else lq + 0.1 * torch.randn(*lead, m, 16, generator=g)
    return laplacian_kernel_reference(lq, lk, 1.0).to(DEVICE)


def test_fallbacks_warn_once_and_give_the_torch_result(calls):
    x, y = _pair((1,), 7, 3, 32, torch.float32)
    with pytest.warns(RuntimeWarning, match="laplacian_kernel runs the PyTorch path.*dtype torch.float64"):
        out = laplacian_kernel(x.double(), y.double(), LAM, backend="triton")
    torch.testing.assert_close(out, laplacian_kernel(x.double(), y.double(), LAM, backend="torch"), rtol=0, atol=0)
    A = _landmark_kernels((1,), 129, tied=True)
    with pytest.warns(RuntimeWarning, match=r"newton_schulz_inverse runs the PyTorch path.*m=129 landmarks"):
        V = newton_schulz_inverse(A, iters=3, backend="triton")
    torch.testing.assert_close(V, newton_schulz_inverse(A, iters=3, backend="torch"), rtol=0, atol=0)
    with pytest.warns(RuntimeWarning, match="newton_schulz_inverse.*dtype torch.float64"):
        newton_schulz_inverse(A[..., :5, :5].double(), iters=3, backend="triton")
    assert calls == {"forward": 0, "grads": 0, "newton": 0}


def test_one_warning_per_reason(recwarn):
    x, y = _pair((1,), 7, 3, 32, torch.float64)
    for _ in range(3):
        gaussian_kernel(x, y, backend="triton")
    assert len([w for w in recwarn if "gaussian_kernel" in str(w.message)]) == 1


def test_missing_triton_falls_back_with_the_reason(monkeypatch, calls):
    monkeypatch.setattr(_triton, "_import_error", lambda: "triton is not importable (test)")
    x, y = _pair((2,), 7, 3, 32, torch.float32)
    with pytest.warns(RuntimeWarning, match="gaussian_kernel runs the PyTorch path instead of Triton: triton is not"):
        out = gaussian_kernel(x, y, backend="triton")
    torch.testing.assert_close(out, gaussian_kernel(x, y, backend="torch"), rtol=0, atol=0)
    with pytest.warns(RuntimeWarning, match="newton_schulz_inverse runs the PyTorch path instead of Triton: triton"):
        newton_schulz_inverse(_landmark_kernels((1,), 5, tied=True), backend="triton")
    assert calls == {"forward": 0, "grads": 0, "newton": 0}


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU default is what is tested")
def test_auto_and_torch_never_run_triton_on_cpu(calls, recwarn):
    x, y = _pair((2,), 7, 3, 32, torch.float32)
    for backend in ("auto", "torch"):
        out = laplacian_kernel(x, y, LAM, backend=backend)
        assert type(out.grad_fn).__name__ == "_LaplacianKernelBackward"
        newton_schulz_inverse(_landmark_kernels((1,), 5, tied=True), backend=backend)
    assert calls == {"forward": 0, "grads": 0, "newton": 0}
    assert not [w for w in recwarn if "vitmix" in str(w.message)]


def test_dispatch_modes_see_the_torch_path(calls):
    x, y = _pair((2,), 7, 3, 32, torch.float32)
    with FlopCounterMode(display=False) as counter:
        gaussian_kernel(x, y, backend="triton")
        newton_schulz_inverse(_landmark_kernels((1,), 5, tied=True), backend="triton")
    assert counter.get_total_flops() > 0 and calls == {"forward": 0, "grads": 0, "newton": 0}


def test_bad_backend_is_a_value_error():
    x, y = _pair((1,), 5, 3, 4, torch.float32)
    with pytest.raises(ValueError, match="gaussian_kernel: unknown backend 'cuda'"):
        gaussian_kernel(x, y, backend="cuda")
    with pytest.raises(ValueError, match="laplacian_kernel: unknown backend"):
        laplacian_kernel(x, y, backend="gpu")
    with pytest.raises(ValueError, match="newton_schulz_inverse: unknown backend"):
        newton_schulz_inverse(torch.eye(3), backend="Triton")
    with pytest.raises(ValueError, match="SoftAttention: unknown backend"):
        mixers.create("soft", 32, 2, backend="cuda")
    with pytest.raises(ValueError, match="LaplacianAttention: unknown backend"):
        mixers.create("laplacian", 32, 2, backend=None)


# ----------------------------------------------------------------------------------------- mixers
def _mixer_grads(layer, x, grid, backend):
    layer.backend = backend
    x = x.clone().requires_grad_()
    layer.zero_grad()
    out = layer(x, hw=grid[1:], num_prefix_tokens=grid[0])
    out.pow(2).sum().backward()
    return [out.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("name,batch,opts", [("soft", 1, {}), ("soft_norm", 3, {"landmarks": "avgpool"}),
                                             ("laplacian", 3, {}), ("laplacian", 1, {"normalize": False})])
def test_mixer_backend_triton_equals_torch(calls, name, batch, opts):
    grid = (1, 6, 5)                           # a CLS token and a 6×5 grid: 31 tokens, 3×3 landmarks at stride 2
    torch.manual_seed(0)
    layer = mixers.create(name, 64, 2, qkv_bias=True, num_landmarks=(3, 3), backend="triton", **opts).to(DEVICE)
    x = torch.randn(batch, 31, 64, device=DEVICE)
    got = _mixer_grads(layer, x, grid, "triton")
    assert calls["forward"] >= 2 and calls["grads"] >= 1 and calls["newton"] >= 1
    want = _mixer_grads(layer, x, grid, "torch")
    exact = _mixer_grads(layer.double(), x.double(), grid, "torch")
    for a, b, e in zip(got, want, exact):
        # Both float32 paths round differently (kernel sums ~1e-7 relative), and the landmark inverse
        # amplifies that by up to cond(W + εI) ~ 3e3 (unconverged at 20 steps for the untied Laplacian
        # landmarks): Triton must be as close to the float64 result as the PyTorch path, within 3x
        err, err_torch = (a.double() - e).abs().max(), (b.double() - e).abs().max()
        assert err <= 3 * err_torch + 1e-6 * e.abs().max() + 1e-12, (float(err), float(err_torch))


# ----------------------------------------------------------------------------------- no host sync
@pytest.mark.parametrize("alpha", ["transpose", "safe"])
def test_laplacian_op_never_waits_for_the_device(monkeypatch, calls, no_host_reads, alpha):
    """The Laplacian Nyström op (kernel matrices, Newton–Schulz with its start and checked fallback,
    injective map), forward and backward, never reads a tensor on the host: no sync per call, and CUDA
    graphs can capture it. On CUDA with CUDA's sync checker; on CPU tensors by forcing the device rule
    of the Newton–Schulz start and making every host read raise."""
    from vitmix.ops import nystrom_attention
    from vitmix.ops.newton import start

    g = torch.Generator().manual_seed(3)
    q, k, v = (0.3 * torch.randn(1, 2, 29, 16, generator=g) for _ in range(3))
    lq, lk = q[..., ::4, :].contiguous(), k[..., ::4, :].contiguous()       # 8 untied landmarks
    q, k, v, lq, lk = (t.to(DEVICE).bfloat16().requires_grad_() for t in (q, k, v, lq, lk))

    def run():
        out = nystrom_attention(q, k, v, lq, lk, kernel="laplacian", normalization="injective", alpha=alpha,
                                backend="triton")
        return out, torch.autograd.grad(out.float().square().sum(), (q, k, v, lq, lk))

    want = run()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    else:
        monkeypatch.setattr(start, "_sync_free", lambda t: True)
        with no_host_reads():
            got = run()
    assert calls["forward"] >= 3 and calls["grads"] >= 3 and calls["newton"] >= 1
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2 * float(b.float().abs().max()))


# ------------------------------------------------------------------------------- half inputs in place
@pytest.mark.parametrize("kernel,tied", [("laplacian", False), ("gaussian", True)])
def test_nystrom_reads_bf16_inputs_in_place(monkeypatch, kernel, tied):
    """``nystrom_attention`` hands bf16 q, k and landmarks to the Triton kernels as they are (the same
    storage, no float32 copy), and matches the float32 op on the same values."""
    from vitmix.ops import nystrom_attention

    seen = []
    real = kernel_triton.pair_forward

    def spy(x, y, *args):
        seen.append((x.dtype, y.dtype, x.data_ptr(), y.data_ptr()))
        return real(x, y, *args)
    monkeypatch.setattr(kernel_triton, "pair_forward", spy)
    g = torch.Generator().manual_seed(4)
    q, k, v = (0.3 * torch.randn(2, 2, 21, 16, generator=g).to(DEVICE, torch.bfloat16) for _ in range(3))
    k = q if tied else k
    lq = q[..., :7, :].clone()
    lk = lq if tied else k[..., 7:14, :].clone()
    args = dict(kernel=kernel, normalization="injective" if kernel == "laplacian" else None, backend="triton")
    out = nystrom_attention(q, k, v, lq, lk, **args)
    ptrs = {q.data_ptr(), k.data_ptr(), lq.data_ptr(), lk.data_ptr()}
    assert len(seen) == (2 if tied else 3)
    assert all(dx == dy == torch.bfloat16 and px in ptrs and py in ptrs for dx, dy, px, py in seen), seen
    assert out.dtype == torch.bfloat16
    kf = q.float() if tied else k.float()
    want = nystrom_attention(q.float(), kf, v.float(), lq.float(), lq.float() if tied else lk.float(), **args)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("name", ["laplacian", "soft", "soft_norm"])
def test_mixers_never_wait_for_the_device_past_the_input_check(monkeypatch, calls, no_host_reads, name):
    """The landmark mixers with ``backend="triton"``, forward and backward, read no tensor on the host
    (GPU rule forced on CPU tensors) once their input NaN/Inf check, the one read they make on purpose,
    is off."""
    from vitmix.ops.newton import start

    torch.manual_seed(0)
    layer = mixers.create(name, 64, 2, num_landmarks=(3, 3), backend="triton").to(DEVICE)
    layer.rejects_non_finite = False
    x = torch.randn(1, 31, 64, device=DEVICE, requires_grad=True)
    monkeypatch.setattr(start, "_sync_free", lambda t: True)
    with no_host_reads():
        layer(x, hw=(6, 5), num_prefix_tokens=1).square().sum().backward()
    assert calls["forward"] >= 2 and calls["grads"] >= 1 and calls["newton"] >= 1
    assert x.grad is not None and all(p.grad is not None for p in layer.parameters() if p.requires_grad)
