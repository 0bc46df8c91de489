"""oneDNN's fused linear (+ GELU) for float32 CPU inference (private): one primitive with the bias and
the activation in its epilogue, used by WeightFormer's MLP (:class:`~vitmix.models._blocks.WeightFormerMlp`)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _available() -> bool:
    """Whether this torch build runs oneDNN's fused ``_linear_pointwise`` (checked once, on first use)."""
    try:
        x = torch.ones(1, 2)
        return bool(torch.ops.mkldnn._linear_pointwise(x, torch.ones(3, 2), None, "gelu", [], "none").shape == (1, 3))
    except Exception:  # no oneDNN in this build, or a changed private signature
        return False


_AVAILABLE: Optional[bool] = None


def applies(x: Tensor) -> bool:
    """The fused oneDNN inference path applies: float32 CPU tensors, no autograd, no autocast."""
    global _AVAILABLE
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled():
        return False
    if torch.is_autocast_enabled("cpu") or torch.jit.is_scripting() or torch.compiler.is_compiling():
        return False  # traced: plain linears (inductor fuses them; export/ONNX keep a symbolic batch)
    if _AVAILABLE is None:
        _AVAILABLE = _available()
    return _AVAILABLE


def fused_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], gelu: Optional[str] = None) -> Tensor:
    """``[GELU](x @ weight.T + bias)`` as one oneDNN primitive (bias and GELU fused in the epilogue)."""
    if gelu is None:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], gelu)


__all__ = ["applies", "fused_linear"]
