"""Triton kernel of the Newton–Schulz loop against the PyTorch loop and the unrolled reference, its fallback
start and the custom op (the interpreter on CPU without a GPU, as in ``tests/ops/kernel/test_triton.py``).
"""
import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install 'vitmix[gpu]'): no Triton kernels to test")

import torch  # noqa: E402

from vitmix.ops import _triton  # noqa: E402
from vitmix.ops.kernel import laplacian_kernel_reference  # noqa: E402
from vitmix.ops.newton import newton_schulz_inverse, newton_schulz_reference  # noqa: E402
from vitmix.ops.newton import start as newton_start  # noqa: E402
from vitmix.ops.newton import triton as newton_triton  # noqa: E402
from _triton_device import triton_test_device  # noqa: E402

DEVICE = triton_test_device()

pytestmark = pytest.mark.usefixtures("one_thread")
OPS = torch.ops.vitmix


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _triton.warn_once.cache_clear()      # each test sees its own one-time warnings
    yield


def _landmark_kernels(lead, m, tied, seed=0):
    g = torch.Generator().manual_seed(seed)
    lq = 0.3 * torch.randn(*lead, m, 16, generator=g)
    lk = lq if tied else lq + 0.1 * torch.randn(*lead, m, 16, generator=g)
    return laplacian_kernel_reference(lq, lk, 1.0).to(DEVICE)


# both runs are float32 with the same start; only the order of the float32 sums in the products
# differs, amplified by the iteration (values of V ~ 1..10)
NS_TOL = dict(rtol=1e-4, atol=1e-5)


# the interpreter runs the kernel's m-step outer-product loops one step at a time: the large m get
# fewer iterations (every step runs the same code; m = 128 spans four 32-row blocks)
ITERS = {1: 20, 7: 20, 17: 10, 49: 6, 128: 2}


@pytest.mark.parametrize("lead,m", [((1,), 1), ((3,), 7), ((1, 2), 49), ((3, 1), 17), ((1,), 128)])
@pytest.mark.parametrize("tied", [True, False])
def test_newton_schulz_matches_torch_and_reference(calls, lead, m, tied):
    A = _landmark_kernels(lead, m, tied).requires_grad_()
    alphas = ("safe", "transpose", "official") if tied else ("safe", "transpose")
    iters = ITERS[m] if DEVICE == "cpu" else 20
    for alpha in alphas:
        V = newton_schulz_inverse(A, iters=iters, alpha=alpha, backend="triton")
        want = newton_schulz_inverse(A, iters=iters, alpha=alpha, backend="torch")
        torch.testing.assert_close(V, want, **NS_TOL)
        if m <= 49:      # the unrolled reference, forward only (its gradients unroll the steps)
            torch.testing.assert_close(V, newton_schulz_reference(A.detach(), iters=iters, alpha=alpha), **NS_TOL)
        g = torch.randn_like(V)
        (gA,), (gA_torch,) = torch.autograd.grad(V, A, g), torch.autograd.grad(want, A, g)
        torch.testing.assert_close(gA, gA_torch, rtol=1e-4, atol=1e-4 * float(gA_torch.abs().max()))
    assert calls["newton"] >= len(alphas)


def test_newton_schulz_fallback_start_and_half_input(calls, monkeypatch):
    # the identity start is rerun from αPᵀ where its residual is too large: force the rerun for all
    monkeypatch.setattr(newton_start, "_FALLBACK_RESIDUAL", 0.0)
    A = _landmark_kernels((2,), 9, tied=False)
    V = newton_schulz_inverse(A, iters=12, backend="triton")
    torch.testing.assert_close(V, newton_schulz_inverse(A, iters=12, backend="torch"), **NS_TOL)
    assert calls["newton"] == 2
    Vh = newton_schulz_inverse(A.bfloat16(), iters=12, backend="triton")     # computed in float32
    assert Vh.dtype == torch.float32
    torch.testing.assert_close(Vh, newton_schulz_inverse(A.bfloat16(), iters=12, backend="torch"), **NS_TOL)
    assert newton_schulz_inverse(A, iters=0, backend="triton").shape == A.shape     # no loop to run


def test_newton_schulz_custom_op_runs_triton(calls):
    A = _landmark_kernels((2,), 9, tied=True)
    V = OPS.newton_schulz_inverse(A, 20, 0.01, None, "safe", "newton", "triton")
    torch.testing.assert_close(V, newton_schulz_inverse(A, backend="torch"), **NS_TOL)
    assert calls["newton"] == 1


def test_block_rule_fits_m():
    # m <= 64: one block of rows; m = 128: four blocks of 32 rows (a 4096-value accumulator, no spills)
    assert newton_triton.blocks(1) == dict(MP=16, BR=16)
    assert newton_triton.blocks(49) == dict(MP=64, BR=64)
    assert newton_triton.blocks(128) == dict(MP=128, BR=32)


def test_triton_loop_without_host_reads(monkeypatch, calls, no_host_reads):
    """The GPU rule (start and checked fallback chosen by tensor ops) with the Triton loop: no tensor is
    read on the host (no sync), both loops run, and the result equals the CPU path's."""
    monkeypatch.setattr(newton_start, "_FALLBACK_RESIDUAL", 0.0)       # every identity start is rerun
    A = _landmark_kernels((2,), 9, tied=False)
    want = newton_schulz_inverse(A, iters=12, backend="torch")
    monkeypatch.setattr(newton_start, "_sync_free", lambda t: True)
    with no_host_reads():
        V = newton_schulz_inverse(A, iters=12, backend="triton")
    assert calls["newton"] == 2
    torch.testing.assert_close(V, want, **NS_TOL)
