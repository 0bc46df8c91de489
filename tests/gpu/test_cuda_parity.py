"""CUDA parity: every registered mixer and the smallest model of every family on the GPU, against float64 on
the CPU with the same weights; the Triton back end against the PyTorch one; inductor against eager.

The checks are written for whatever device is present. Without CUDA the GPU cases skip with the reason
"no CUDA device", and the harness itself runs on the CPU (float32 and bf16 autocast against float64, a
perturbed weight that must fail, a compiled graph whose custom ops are counted), so CI proves the
plumbing that the GPU run relies on. ``benchmarks/gpu_check.sh`` runs this file on the GPU machine.

Bounds. float32 (TF32 off): output and every parameter gradient within 1e-4 of the largest float64 entry;
bf16 autocast: finite and within 2e-2. A model whose float32 rounding is amplified beyond that on the CPU
too (the untrained ``laplacianformer_tiny``: ill-conditioned 2×2 landmark kernels, a 3e-2 gradient
difference between CPU float32 and float64) is held to 3× the CPU's own error at the same precision: the
GPU must be as accurate as the CPU, a wrong kernel is off by orders of magnitude more.
"""
import collections
import contextlib
import copy
import re

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import vitmix
from vitmix.export import relative_error
from vitmix.ops import _triton
from _families import FAMILIES, family_model, model_inputs
from _triton_device import count_calls

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")

FP32_RTOL, BF16_RTOL = 1e-4, 2e-2
#: how much larger than the CPU's error at the same precision the device's may be (see the docstring)
CPU_ERROR_FACTOR = 3.0
#: a mixer layer: a class token and an 8×8 grid (the landmark mixers pool it), 2 heads of 32
DIM, HEADS, TOKENS = 64, 2, 1 + 64
#: mixers with a Triton back end (``backend=``) and the Triton entry points each must reach on CUDA
TRITON_MIXERS = {"soft": ("forward", "grads", "newton"), "soft_norm": ("forward", "grads", "newton"),
                 "laplacian": ("forward", "grads", "newton"), "fibottention": ("diagonal", "diagonal_grads"),
                 "longformer": ("diagonal", "diagonal_grads")}
#: the custom ops a compiled graph of each mixer calls (what a silent fallback to eager would not call)
CUSTOM_OPS = {"laplacian": ("vitmix::laplacian_kernel", "vitmix::newton_schulz_inverse"),
              "soft": ("vitmix::gaussian_kernel", "vitmix::newton_schulz_inverse"),
              "fibottention": ("vitmix::sparse_diagonal_attention",)}


# ------------------------------------------------------------------------------------------------ harness
@contextlib.contextmanager
def no_tf32():
    """True float32 products on CUDA (TF32 off for matmuls and cuDNN convolutions), restored afterwards."""
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn


def on(module, args, device, dtype=torch.float32):
    """A copy of ``module`` and ``args`` on ``device``, floating point in ``dtype``."""
    args = tuple(a.to(device, dtype) if a.is_floating_point() else a.to(device) for a in args)
    return copy.deepcopy(module).to(device, dtype), args


def forward_backward(module, args, amp=None, call=None):
    """Output and every parameter gradient of a fixed weighted sum of the output (under ``amp`` autocast when
    given), as float64 CPU tensors; ``call`` (e.g. the compiled module) runs in place of ``module``."""
    module.zero_grad(set_to_none=True)
    with torch.autocast(args[0].device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        out = (module if call is None else call)(*args)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=torch.float64, device=out.device).view_as(out)
    (out.double() * weights).sum().backward()
    grads = {n: p.grad.detach().double().cpu() for n, p in module.named_parameters() if p.grad is not None}
    return out.detach().double().cpu(), grads


def errors(got, want) -> dict:
    """Relative error (of each tensor's largest entry) of the output and every gradient; NaN where not finite."""
    (out, grads), (ref, ref_grads) = got, want
    assert grads.keys() == ref_grads.keys(), sorted(set(grads) ^ set(ref_grads))
    pairs = {"output": (out, ref), **{f"grad {n}": (grads[n], ref_grads[n]) for n in ref_grads}}
    return {k: relative_error(a, b) if torch.isfinite(a).all() else float("nan") for k, (a, b) in pairs.items()}


def assert_within(errs: dict, bounds) -> None:
    """Every entry of ``errs`` finite and within its bound (``bounds``: one number, or a dict by entry)."""
    bad = {k: (e, bounds if isinstance(bounds, float) else bounds[k]) for k, e in errs.items()
           if not e <= (bounds if isinstance(bounds, float) else bounds[k])}      # NaN fails too
    assert not bad, "error > bound: " + ", ".join(f"{k}: {e:.2e} > {b:.1e}" for k, (e, b) in bad.items())


def check_against_float64(module, args, device, amp=None) -> dict:
    """``module`` on ``device`` (float32, TF32 off, or under ``amp`` autocast) against float64 on the CPU with
    the same weights; the bound of each tensor is the precision's (1e-4 / 2e-2) or 3× the CPU's own error at
    that precision, whichever is larger. Returns the device's errors."""
    floor = FP32_RTOL if amp is None else BF16_RTOL
    reference = forward_backward(*on(module, args, "cpu", torch.float64))
    cpu = errors(forward_backward(*on(module, args, "cpu"), amp=amp), reference)
    with no_tf32():
        errs = errors(forward_backward(*on(module, args, device), amp=amp), reference)
    assert_within(errs, {k: max(floor, CPU_ERROR_FACTOR * e) for k, e in cpu.items()})
    return errs


def mixer_layer(name: str, **options):
    torch.manual_seed(0)
    return vitmix.mixers.create(name, DIM, num_heads=HEADS, **options).eval()


def mixer_input():
    return (torch.randn(2, TOKENS, DIM, generator=torch.Generator().manual_seed(1)),)


@pytest.fixture
def triton_calls(monkeypatch):
    """Counts of the Triton entry points that ran; a silent fallback to PyTorch leaves them at 0."""
    if not _triton.triton_available():
        pytest.skip(f"the Triton kernels cannot run: {_triton._import_error()}")
    if _triton.interpreting():
        pytest.skip("TRITON_INTERPRET=1: the kernels would run in the interpreter, not compiled for the GPU")
    from vitmix.ops.diagonal import triton as diagonal_triton
    from vitmix.ops.kernel import triton as kernel_triton
    from vitmix.ops.newton import triton as newton_triton

    counts = collections.Counter()

    count_calls(monkeypatch, counts, [
        (kernel_triton, "pair_forward", "forward"), (kernel_triton, "pair_grads", "grads"),
        (newton_triton, "iterate", "newton"), (diagonal_triton, "diagonal_forward", "diagonal"),
        (diagonal_triton, "diagonal_backward", "diagonal_grads")])
    return counts


def custom_op_calls(fn) -> collections.Counter:
    """Runs ``fn`` under the profiler: how often each ``vitmix::`` custom op was called. Eager calls go to the
    ops' autograd functions directly; only a traced or compiled graph calls the registered ops (the C paths'
    profiler labels, ``"vitmix::laplacian_mix (C)"``, are not ops)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(e.name for e in prof.events() if re.fullmatch(r"vitmix::\w+", e.name))


def check_compiled(module, args, device, ops, backend: str = "inductor", triton_calls=None) -> collections.Counter:
    """``torch.compile(module, backend=backend, fullgraph=True)`` against eager on ``device`` (float32, TF32
    off; output and every gradient within 1e-4), asserting that the compiled graph called each of ``ops``.
    ``triton_calls`` (the fixture's counter) is cleared before the checked call: it then holds that call's."""
    module, args = on(module, args, device)
    with no_tf32():
        eager = forward_backward(module, args)
        torch._dynamo.reset()
        compiled = torch.compile(module, backend=backend, fullgraph=True)
        forward_backward(module, args, call=compiled)      # compiles; the checked call runs the cached graph
        if triton_calls is not None:
            triton_calls.clear()
        result = []
        calls = custom_op_calls(lambda: result.append(forward_backward(module, args, call=compiled)))
        torch._dynamo.reset()
    assert_within(errors(result[0], eager), FP32_RTOL)
    assert all(calls[op] > 0 for op in ops), f"the compiled graph did not call {ops}: {dict(calls)}"
    return calls


# ------------------------------------------------------------------------- the harness on the CPU (CI)
def test_harness_float32_and_bf16_against_float64_on_cpu():
    """The float64 comparison with the CPU as the device: float32 well within 1e-4, bf16 autocast within
    2e-2 of the output, every gradient finite."""
    layer, x = mixer_layer("laplacian"), mixer_input()
    fp32 = check_against_float64(layer, x, "cpu")
    assert max(fp32.values()) < FP32_RTOL / 10 and fp32.keys() >= {"output", "grad qkv.weight"}
    bf16 = check_against_float64(layer, x, "cpu", amp=torch.bfloat16)
    assert bf16["output"] < BF16_RTOL and max(bf16.values()) < 1.0


def test_harness_fails_on_a_wrong_weight_and_on_nan():
    layer, x = mixer_layer("softmax"), mixer_input()
    reference = forward_backward(*on(layer, x, "cpu", torch.float64))
    wrong, x32 = on(layer, x, "cpu")
    with torch.no_grad():
        wrong.proj.weight[0, 0] += 1e-2
    with pytest.raises(AssertionError, match="output: .* > 1.0e-04"):
        assert_within(errors(forward_backward(wrong, x32), reference), FP32_RTOL)
    out, grads = forward_backward(*on(layer, x, "cpu"))
    grads["qkv.weight"][0, 0] = float("nan")
    with pytest.raises(AssertionError, match="grad qkv.weight: nan"):
        assert_within(errors((out, grads), reference), FP32_RTOL)


def test_harness_counts_the_custom_ops_of_a_compiled_graph_on_cpu():
    """``aot_eager`` on the CPU stands in for inductor on the GPU: the compiled graph calls the custom ops,
    eager calls none of them (so the count tells a compiled run from a silent fallback)."""
    layer, x = mixer_layer("laplacian"), mixer_input()
    calls = check_compiled(layer, x, "cpu", CUSTOM_OPS["laplacian"], backend="aot_eager")
    assert calls["vitmix::laplacian_kernel_backward"] > 0
    assert not custom_op_calls(lambda: forward_backward(*on(layer, x, "cpu")))


# ------------------------------------------------------------------------------------------------ CUDA
@needs_cuda
@pytest.mark.parametrize("name", vitmix.list_mixers())
def test_mixer_on_cuda_matches_float64(name):
    layer, x = mixer_layer(name), mixer_input()
    check_against_float64(layer, x, "cuda")
    check_against_float64(layer, x, "cuda", amp=torch.bfloat16)


@needs_cuda
@pytest.mark.parametrize("row", FAMILIES, ids=[r["models"] for r in FAMILIES])
def test_smallest_model_of_each_family_on_cuda_matches_float64(row):
    model = family_model(row)
    args = model_inputs(model, 2)
    check_against_float64(model, args, "cuda")
    check_against_float64(model, args, "cuda", amp=torch.bfloat16)


@needs_cuda
@pytest.mark.parametrize("name", sorted(TRITON_MIXERS))
def test_triton_backend_matches_torch_backend_on_cuda(name, triton_calls):
    x = mixer_input()
    with no_tf32():
        want = forward_backward(*on(mixer_layer(name, backend="torch"), x, "cuda"))
        assert not triton_calls
        got = forward_backward(*on(mixer_layer(name, backend="triton"), x, "cuda"))
    assert_within(errors(got, want), FP32_RTOL)
    assert all(triton_calls[key] > 0 for key in TRITON_MIXERS[name]), dict(triton_calls)


@needs_cuda
@pytest.mark.parametrize("name", sorted(CUSTOM_OPS))
def test_inductor_matches_eager_on_cuda(name, triton_calls):
    """The compiled graph calls the custom ops and they run the Triton kernels (not the PyTorch fallback)."""
    check_compiled(mixer_layer(name), mixer_input(), "cuda", CUSTOM_OPS[name], triton_calls=triton_calls)
    assert all(triton_calls[key] > 0 for key in TRITON_MIXERS[name]), dict(triton_calls)
