"""Baseline mixers (linear, Performer, Nyströmformer): fast paths against their dense references,
forward and gradients, odd shapes, batch 1 and >1; method-specific properties."""
import pytest
import torch

from vitmix import mixers
from vitmix.mixers.linear import linear_attention_reference
from vitmix.mixers.nystromformer import iterative_pinv, nystromformer_reference, segment_means
from vitmix.mixers.performer import orthogonal_gaussian, performer_reference


def _layer(name, **opts):
    torch.manual_seed(0)
    return mixers.create(name, 48, 3, qkv_bias=True, **opts).double().eval()


def _reference(layer, x):
    """The whole layer through the dense reference of its attention."""
    q, k, v = layer._qkv(x)
    if layer.mixer_name == "linear":
        out = linear_attention_reference(q, k, v, layer.eps)
    elif layer.mixer_name == "performer":
        out = performer_reference(q, k, v, layer.directions, layer.eps)
    else:
        m = min(layer.num_landmarks, q.shape[-2])
        out = nystromformer_reference(q, k, v, segment_means(q, m), segment_means(k, m), layer.pinv_iters)
        if layer.conv_kernel:
            out = out + layer.conv(v)
    return layer._project_out(out)


CASES = [("linear", {}), ("performer", {}), ("performer", {"num_features": 7}), ("nystromformer", {}),
         ("nystromformer", {"num_landmarks": 5, "conv_kernel": 3})]


@pytest.mark.parametrize("name,opts", CASES, ids=[f"{n}-{o}" for n, o in CASES])
@pytest.mark.parametrize("batch,n", [(1, 17), (3, 50)])
def test_fast_path_matches_dense_reference_forward_and_gradients(name, opts, batch, n):
    layer = _layer(name, **opts)
    x = torch.randn(batch, n, 48, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *layer.parameters()])
    ref = _reference(layer, x)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, *layer.parameters()])
    # float64; only the evaluation order differs (right to left vs the N×N matrix)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_performer_estimates_softmax_attention():
    """FAVOR+ is unbiased for exp(q·k/√d): with many features the normalised estimate approaches
    softmax attention (error ~1/√m)."""
    torch.manual_seed(0)
    q, k, v = (0.5 * torch.randn(1, 2, 40, 16, dtype=torch.float64) for _ in range(3))
    exact = torch.softmax(q @ k.mT / 4.0, -1) @ v
    errors = []
    for m in (16, 4096):
        w = orthogonal_gaussian(m, 16, torch.Generator().manual_seed(1)).double()
        errors.append(float((performer_reference(q, k, v, w) - exact).norm() / exact.norm()))
    assert errors[1] < 0.05 and errors[1] < errors[0] / 4, errors


def test_orthogonal_directions_are_orthogonal_in_blocks():
    w = orthogonal_gaussian(40, 16, torch.Generator().manual_seed(0))
    block = w[:16] / w[:16].norm(dim=-1, keepdim=True)
    torch.testing.assert_close(block @ block.T, torch.eye(16), rtol=0, atol=1e-5)
    assert w.shape == (40, 16)


def test_performer_redraws_every_interval_in_training_only():
    layer = mixers.create("performer", 32, 2, redraw_interval=2)
    x = torch.randn(1, 10, 32)
    first = layer.directions.clone()
    layer.eval()
    for _ in range(3):
        layer(x)
    assert torch.equal(layer.directions, first)        # inference never redraws
    layer.train()
    layer(x), layer(x)
    assert torch.equal(layer.directions, first)
    layer(x)                                           # the third training forward redraws
    assert not torch.equal(layer.directions, first)
    fixed = mixers.create("performer", 32, 2, redraw_interval=None).train()
    before = fixed.directions.clone()
    for _ in range(3):
        fixed(x)
    assert torch.equal(fixed.directions, before)


def test_performer_compiled_training_redraws_without_recompiling():
    """Under torch.compile the counter lives in the buffer and torch.cond picks the redraw: one graph for
    every training forward (a Python counter would recompile each forward) and the same redraw steps."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    layer = mixers.create("performer", 32, 2, redraw_interval=2).train()
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(1, 10, 32, requires_grad=True)
    changed, counts = [], []
    for _ in range(5):
        before = layer.directions.clone()
        compiled(x).sum().backward()
        changed.append(not torch.equal(layer.directions, before))
        counts.append(int(layer.forwards_since_draw))
    assert changed == [False, False, True, False, True] and counts == [1, 2, 1, 2, 1]
    assert counters["stats"]["unique_graphs"] == 1
    layer(x)                                  # eager again: continues from the buffer, redraws at the interval
    assert int(layer.forwards_since_draw) == 2
    torch._dynamo.reset()


def test_nystromformer_pinv_converges_and_landmarks_are_segment_means():
    torch.manual_seed(0)
    a = torch.softmax(torch.randn(2, 8, 8, dtype=torch.float64), -1)
    torch.testing.assert_close(iterative_pinv(a, 30), torch.linalg.pinv(a), rtol=1e-6, atol=1e-8)
    t = torch.randn(1, 1, 12, 4)
    torch.testing.assert_close(segment_means(t, 3), t.reshape(1, 1, 3, 4, 4).mean(-2))
    # fewer tokens than landmarks: every token is a landmark, and with a converged pseudo-inverse
    # F·pinv(A)·B = A·pinv(A)·A = A is exact softmax attention
    layer = _layer("nystromformer", conv_kernel=0, pinv_iters=40)
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    q, k, v = layer._qkv(x)
    exact = layer._project_out(torch.softmax(q @ k.mT / 4.0, -1) @ v)
    torch.testing.assert_close(layer(x), exact, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["linear", "performer", "nystromformer"])
def test_bf16_autocast_stays_finite(name):
    layer = mixers.create(name, 64, 4)
    x = 8 * torch.randn(2, 65, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name,bad", [("linear", {"eps": 0}), ("performer", {"num_features": 0}),
                                      ("performer", {"redraw_interval": 0}),
                                      ("nystromformer", {"num_landmarks": 0}),
                                      ("nystromformer", {"conv_kernel": 4}), ("linear", {"attn_drop": 0.1})])
def test_bad_options_are_one_line_errors(name, bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key if key != "attn_drop" else "attn_drop"):
        mixers.create(name, 64, 4, **bad)


def test_performer_redraw_counter_survives_a_state_dict_round_trip():
    """The counter lives in a buffer (checkpoints) and is read back after load_state_dict."""
    a = mixers.create("performer", 32, 2, redraw_interval=3).train()
    x = torch.randn(1, 10, 32)
    a(x), a(x)
    b = mixers.create("performer", 32, 2, redraw_interval=3).train()
    b.load_state_dict(a.state_dict())
    first = b.directions.clone()
    b(x)
    assert torch.equal(b.directions, first) and int(b.forwards_since_draw) == 3
    b(x)                                  # the fourth forward since the draw redraws
    assert not torch.equal(b.directions, first) and int(b.forwards_since_draw) == 1
