"""Pairwise Gaussian / Laplacian kernels: fast paths vs references, gradients, dtypes, memory."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _memory import peak_memory_mib  # noqa: E402

from vitmix.ops import (  # noqa: E402
    gaussian_kernel,
    gaussian_kernel_reference,
    laplacian_kernel,
    laplacian_kernel_reference,
)
from vitmix.ops import _l1  # noqa: E402

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


def test_compiled_laplacian_path_matches_reference(monkeypatch):
    """The fused torch.compile loops (used for large CPU problems) give the same numbers, incl. odd N."""
    monkeypatch.setattr(_l1, "_COMPILE_MIN_ELEMENTS", 0)
    torch.manual_seed(2)
    for xs, ys in [((2, 3, 37, 16), (2, 3, 7, 16)), ((1, 1, 130, 8), (1, 1, 9, 8))]:
        x = torch.randn(xs)
        y = torch.randn(ys)
        g = torch.randn(xs[:-1] + (ys[-2],))
        o1, gx1, gy1 = _grads(lambda a, b: laplacian_kernel(a, b, 4.0), x, y, g)
        assert _l1._compile_broken is None, f"torch.compile path failed: {_l1._compile_broken}"
        o2, gx2, gy2 = _grads(lambda a, b: laplacian_kernel_reference(a, b, 4.0), x.double(), y.double(), g.double())
        # float32 sums of <= 16 terms / <= 130 terms: 1e-5 relative covers the rounding
        torch.testing.assert_close(o1, o2.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gx1, gx2.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gy1, gy2.float(), rtol=1e-5, atol=1e-5)


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
