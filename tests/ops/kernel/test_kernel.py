"""Pairwise Gaussian / Laplacian kernels: fast paths vs references, gradients, dtypes, memory."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _memory import peak_memory_mib  # noqa: E402

from vitmix.ops import (  # noqa: E402
    gaussian_kernel,
    gaussian_kernel_reference,
    laplacian_kernel,
    laplacian_kernel_reference,
)
from vitmix.ops.kernel import c as kernel_c  # noqa: E402

KERNELS = {
    "gaussian": (gaussian_kernel, gaussian_kernel_reference),
    "laplacian": (lambda x, y: laplacian_kernel(x, y, 3.0), lambda x, y: laplacian_kernel_reference(x, y, 3.0)),
}
# (x shape, y shape): odd sizes, batch 1 and > 1, broadcast leading dims
SHAPES = [
    ((7, 3), (5, 3)),
    ((1, 1, 13, 8), (1, 1, 5, 8)),
    ((2, 3, 11, 5), (2, 3, 4, 5)),
    ((2, 1, 9, 4), (1, 3, 6, 4)),
]


def _grads(fn, x, y, g):
    x = x.detach().requires_grad_()
    y = y.detach().requires_grad_()
    out = fn(x, y)
    gx, gy = torch.autograd.grad(out, (x, y), g)
    return out.detach(), gx, gy


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("xs,ys", SHAPES)
def test_fast_matches_reference_forward_and_grads(name, xs, ys):
    fast, ref = KERNELS[name]
    torch.manual_seed(0)
    x = torch.randn(xs, dtype=torch.float64)
    y = torch.randn(ys, dtype=torch.float64)
    shape = torch.broadcast_shapes(xs[:-2], ys[:-2]) + (xs[-2], ys[-2])
    g = torch.randn(shape, dtype=torch.float64)
    o1, gx1, gy1 = _grads(fast, x, y, g)
    o2, gx2, gy2 = _grads(ref, x, y, g)
    # float64, only the summation order differs (GEMM expansion / cdist vs broadcast): 1e-12 relative
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx1, gx2, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(gy1, gy2, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("name", KERNELS)
def test_gradcheck_float64(name):
    fast, _ = KERNELS[name]
    torch.manual_seed(1)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fast, (x, y), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradgradcheck(fast, (x, y), eps=1e-6, atol=1e-6) if name == "gaussian" else True


def test_laplacian_gradient_uses_sign_zero_at_ties():
    # x and y share some coordinates exactly: the subgradient there must be 0 (official CUDA: sign(0)=0)
    x = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, -1.0]], dtype=torch.float64)
    y = torch.tensor([[0.0, 3.0, 2.0]], dtype=torch.float64)
    g = torch.ones(2, 1, dtype=torch.float64)
    _, gx, gy = _grads(lambda a, b: laplacian_kernel(a, b, 2.0), x, y, g)
    _, gx_r, gy_r = _grads(lambda a, b: laplacian_kernel_reference(a, b, 2.0), x, y, g)
    torch.testing.assert_close(gx, gx_r, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gy, gy_r, rtol=1e-12, atol=1e-14)
    assert gx[0, 0] == 0 and gx[0, 2] == 0  # tied coordinates of the first row


def test_gaussian_clamps_rounding_negative_distance():
    # identical large vectors: the GEMM expansion cancels to ~0 (maybe < 0); the kernel must be 1, not > 1
    x = torch.full((3, 64), 100.0)
    out = gaussian_kernel(x, x)
    assert torch.all(out <= 1.0) and torch.allclose(out, torch.ones(3, 3))


L1_BACKENDS = ["c", "eager"] if kernel_c.L1_KERNEL.load() is not None else ["eager"]


def _force_l1_backend(monkeypatch, backend):
    if backend == "c":
        monkeypatch.setattr(kernel_c, "_C_MIN_ELEMENTS", 0)     # every size takes the C kernel
    else:
        monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")


@pytest.mark.parametrize("backend", L1_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_laplacian_backends_match_reference(monkeypatch, backend, dtype):
    """The C kernel and the eager path give the reference's numbers: odd N/M/d, batch 1 and > 1, row
    counts that are not multiples of the C kernel's row blocks (nor of the four rows its forward takes
    at once), channel counts that take each of its backward's paths (groups of four vector blocks,
    single blocks, a scalar tail), and exact ties (sign(0) = 0)."""
    _force_l1_backend(monkeypatch, backend)
    torch.manual_seed(2)
    for xs, ys in [((2, 3, 37, 16), (2, 3, 7, 16)), ((1, 1, 130, 8), (1, 1, 9, 8)), ((1, 5, 3), (1, 4, 3)),
                   ((2, 2, 41, 37), (2, 2, 11, 37)), ((1, 1, 6, 45), (1, 1, 1, 45))]:
        x = torch.randn(xs, dtype=dtype)
        y = torch.randn(ys, dtype=dtype)
        y[..., 0, :] = x[..., 0, :]                              # ties: zero subgradient
        g = torch.randn(xs[:-1] + (ys[-2],), dtype=dtype)
        o1, gx1, gy1 = _grads(lambda a, b: laplacian_kernel(a, b, 4.0), x, y, g)
        o2, gx2, gy2 = _grads(lambda a, b: laplacian_kernel_reference(a, b, 4.0), x.double(), y.double(), g.double())
        # float32: sums of <= 16 terms / <= 130 terms, 1e-5 relative covers the rounding; float64: 1e-12
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(o1, o2.to(dtype), **tol)
        torch.testing.assert_close(gx1, gx2.to(dtype), **tol)
        torch.testing.assert_close(gy1, gy2.to(dtype), **tol)


def test_laplacian_c_kernel_threads_match_reference(monkeypatch):
    """A call large enough for all threads (``C_PARALLEL_WORK``) splits the rows over threads and sums the
    per-item ``grad_y`` partials: same numbers as the reference, and as one thread up to rounding."""
    if "c" not in L1_BACKENDS:
        pytest.fail("no C compiler: the C kernel could not be built (install cc/gcc)")
    _force_l1_backend(monkeypatch, "c")
    monkeypatch.setattr(kernel_c, "C_PARALLEL_WORK", 0)
    torch.manual_seed(3)
    x, y = torch.randn(3, 2, 70, 32), torch.randn(3, 2, 9, 32)
    g = torch.randn(3, 2, 70, 9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        o1, gx1, gy1 = _grads(lambda a, b: laplacian_kernel(a, b, 4.0), x, y, g)
    finally:
        torch.set_num_threads(threads)
    o2, gx2, gy2 = _grads(lambda a, b: laplacian_kernel_reference(a, b, 4.0), x.double(), y.double(), g.double())
    # float32 sums of 32 (distance) and <= 70 (grad_y) terms: 1e-5 covers the rounding
    for a, b in ((o1, o2), (gx1, gx2), (gy1, gy2)):
        torch.testing.assert_close(a, b.float(), rtol=1e-5, atol=1e-5)


def test_laplacian_c_kernel_gradcheck(monkeypatch):
    if "c" not in L1_BACKENDS:
        pytest.fail("no C compiler: the C kernel could not be built (install cc/gcc)")
    _force_l1_backend(monkeypatch, "c")
    x = torch.randn(2, 11, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: laplacian_kernel(a, b, 2.0), (x, y), eps=1e-6, atol=1e-8)


def test_laplacian_without_a_compiler_falls_back_to_eager(monkeypatch, tmp_path):
    """Fault injection: a compiler that fails and an empty cache -> one warning, then the eager path
    with the same numbers."""
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_c.L1_KERNEL, "_lib", None)
    monkeypatch.setattr(kernel_c.L1_KERNEL, "_tried", False)
    monkeypatch.setattr(kernel_c, "_C_MIN_ELEMENTS", 0)
    x, y = torch.randn(3, 17, 8, requires_grad=True), torch.randn(3, 5, 8, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="could not compile the l1_kernel"):
        out = laplacian_kernel(x, y, 4.0)
    out.sum().backward()
    ref = laplacian_kernel_reference(x.detach(), y.detach(), 4.0)
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-6)
    assert list(tmp_path.iterdir()) == []                    # nothing half-written left behind


def test_corrupt_cached_l1_library_is_rebuilt(monkeypatch, tmp_path):
    """Fault injection: a truncated library in the cache (a killed build, a full disk) is detected on
    load by its recorded SHA-256, rebuilt, and the kernel works."""
    if "c" not in L1_BACKENDS:
        pytest.fail("no C compiler: the C kernel could not be built (install cc/gcc)")
    from vitmix.ops._cbuild import find_compiler

    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_c.L1_KERNEL, "_lib", None)
    monkeypatch.setattr(kernel_c.L1_KERNEL, "_tried", False)
    record = Path(kernel_c.L1_KERNEL.record_path(find_compiler()))
    digest = "0" * 64
    record.write_text(digest)
    target = tmp_path / f"{record.stem}_{digest[:16]}.so"
    target.write_bytes(b"\x7fELF" + bytes(96))                 # a truncated library where the record points
    with pytest.warns(RuntimeWarning, match="rebuilding it"):
        assert kernel_c.L1_KERNEL.load() is not None
    target = tmp_path / f"{record.stem}_{record.read_text()[:16]}.so"
    assert target.stat().st_size > 1000
    _force_l1_backend(monkeypatch, "c")
    x, y = torch.randn(2, 9, 4), torch.randn(2, 3, 4)
    torch.testing.assert_close(laplacian_kernel(x, y), laplacian_kernel_reference(x, y), rtol=1e-5, atol=1e-6)


def test_concurrent_first_use_from_several_processes(tmp_path):
    """Several processes building the C kernel into one empty cache at once (torchrun, pytest-xdist)
    all succeed and agree: the build writes atomically."""
    import os
    import subprocess

    code = ("import torch, vitmix.ops.kernel.c as l;"
            "from vitmix.ops import laplacian_kernel, laplacian_kernel_reference;"
            "l._C_MIN_ELEMENTS = 0; assert l.L1_KERNEL.load() is not None; torch.manual_seed(0);"
            "x, y = torch.randn(2, 33, 8), torch.randn(2, 5, 8);"
            "torch.testing.assert_close(laplacian_kernel(x, y), laplacian_kernel_reference(x, y),"
            " rtol=1e-5, atol=1e-6)")
    env = dict(os.environ, VITMIX_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    env.pop("VITMIX_DISABLE_C_KERNEL", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    records = list(tmp_path.glob("l1_kernel_*.sha256"))
    assert len(records) == 1 and not list(tmp_path.glob("*.tmp"))
    assert (tmp_path / f"{records[0].stem}_{records[0].read_text()[:16]}.so").is_file()   # names a complete library


@pytest.mark.parametrize("name", KERNELS)
def test_bf16_inputs_compute_in_float32(name):
    fast, ref = KERNELS[name]
    torch.manual_seed(3)
    x = torch.randn(2, 9, 16).bfloat16().requires_grad_()
    y = torch.randn(2, 5, 16).bfloat16().requires_grad_()
    out = fast(x, y)
    assert out.dtype == torch.float32
    expect = ref(x.detach().float(), y.detach().float())
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)  # same bf16 values, float32 arithmetic
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()
    assert torch.isfinite(y.grad.float()).all()


@pytest.mark.parametrize("name", KERNELS)
def test_autocast_bf16_is_float32_and_finite(name):
    fast, _ = KERNELS[name]
    x = torch.randn(1, 2, 17, 32, requires_grad=True)
    y = torch.randn(1, 2, 6, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fast(x @ torch.eye(32), y)  # the matmul yields bf16 under autocast
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()


@pytest.mark.parametrize("name", KERNELS)
def test_nan_propagates(name):
    fast, _ = KERNELS[name]
    x = torch.randn(5, 4)
    x[2, 1] = float("nan")
    out = fast(x, torch.randn(3, 4))
    assert torch.isnan(out[2]).all() and torch.isfinite(out[[0, 1, 3, 4]]).all()


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="feature dims differ"):
        gaussian_kernel(torch.randn(4, 3), torch.randn(4, 5))
    with pytest.raises(ValueError, match="lam"):
        laplacian_kernel(torch.randn(4, 3), torch.randn(4, 3), lam=0.0)
    with pytest.raises(ValueError, match="broadcast"):
        laplacian_kernel(torch.randn(2, 4, 3), torch.randn(3, 4, 3))
    with pytest.raises(ValueError, match="floating-point"):
        gaussian_kernel(torch.ones(4, 3, dtype=torch.long), torch.randn(4, 3))


@pytest.mark.parametrize("name", KERNELS)
def test_backward_keeps_no_n_m_d_tensor(name):
    """Forward+backward peak stays far below the N·M·d difference tensor (what the reference builds)."""
    fast, ref = KERNELS[name]
    n, m, d = 4096, 49, 64
    x = torch.randn(n, d, requires_grad=True)
    y = torch.randn(m, d, requires_grad=True)
    nmd_mib = n * m * d * 4 / 2**20  # 49 MiB

    def step(fn):
        return lambda: fn(x, y).sum().backward()

    fast_peak = peak_memory_mib(step(fast))
    ref_peak = peak_memory_mib(step(ref))
    # the eager L1 backward walks over 1M-element chunks (a few 4 MiB temporaries), independent of N
    assert fast_peak < 0.4 * nmd_mib, (fast_peak, nmd_mib)
    assert ref_peak > nmd_mib  # the probe does see N·M·d tensors


@pytest.mark.parametrize("backend", L1_BACKENDS)
def test_laplacian_reads_strided_and_broadcast_inputs(monkeypatch, backend):
    """q/k as views of a fused qkv projection (non-contiguous), broadcast batch dims (stride 0) and a
    3-D input: the C kernel reads them in place; values and gradients equal the reference."""
    _force_l1_backend(monkeypatch, backend)
    torch.manual_seed(4)
    qkv = torch.randn(2, 13, 3, 3, 8)                          # (B, N, 3, heads, d)
    q = qkv.permute(2, 0, 3, 1, 4)[0]                           # (B, heads, N, d), non-contiguous
    assert not q.is_contiguous()
    lk = torch.randn(1, 3, 5, 8)                                # broadcast over the batch
    g = torch.randn(2, 3, 13, 5)
    for x, y in [(q, lk), (q[:, :1].expand(2, 3, 13, 8), lk), (q[:, 0], lk[:, 0].expand(2, 5, 8))]:
        gg = g if x.dim() == 4 else g[:, 0]
        o1, gx1, gy1 = _grads(lambda a, b: laplacian_kernel(a, b, 4.0), x, y, gg)
        o2, gx2, gy2 = _grads(lambda a, b: laplacian_kernel_reference(a, b, 4.0), x, y, gg)
        torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gx1, gx2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gy1, gy2, rtol=1e-5, atol=1e-5)
