"""Helpers of the tests that compare a landmark layer's one-call C paths (``_fused``) with its composed path."""
import torch


def use_composed(monkeypatch, layer) -> None:
    """Turn the layer's C paths off: what runs is the composition of torch ops and vitmix.ops (the reference)."""
    monkeypatch.setattr(layer, "_fused", lambda *args: None)


def train_grads(layer, x, hw, prefix) -> list:
    """Output, input gradient and every parameter gradient of one training step of ``layer`` on ``x``."""
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    out = layer(x, hw=hw, num_prefix_tokens=prefix)
    (out.pow(2).sum() + out.sum()).backward()
    return [out.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]


def assert_training_falls_back(c_calls, monkeypatch, layer, x, hw, prefix, key: str) -> None:
    """With the C library unavailable (no compiler, VITMIX_DISABLE_C_KERNEL) training runs the composed path:
    the C training call (counted under ``key``) never produced an output, and the numbers are exactly the
    composed path's."""
    from vitmix.mixers.fused import library

    monkeypatch.setattr(library.LAYERS_KERNEL, "_lib", None)
    monkeypatch.setattr(library.LAYERS_KERNEL, "_tried", True)
    without = train_grads(layer, x, hw, prefix)
    assert c_calls[key] == 0
    use_composed(monkeypatch, layer)
    for a, b in zip(without, train_grads(layer, x, hw, prefix)):
        assert torch.equal(a, b)


def assert_training_matches_composed(c_calls, monkeypatch, layer, x, hw, prefix, key: str) -> None:
    """One training step through the layer's C call (counted under ``key``) against the composed path: output
    and every gradient within 1e-11 (float64) or 2e-5 (float32) of each tensor's scale."""
    fused = train_grads(layer, x, hw, prefix)
    assert c_calls[key] == 1
    use_composed(monkeypatch, layer)
    ref = train_grads(layer, x, hw, prefix)
    assert c_calls[key] == 1
    assert len(fused) == len(ref) == 2 + len(list(layer.parameters()))
    bound = 1e-11 if x.dtype == torch.float64 else 2e-5
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, rtol=bound, atol=bound * b.abs().max().item())
