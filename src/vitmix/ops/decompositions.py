"""Export decompositions of vitmix's custom ops into standard PyTorch (ATen) operations.

``torch.export`` keeps the ``vitmix::*`` custom ops as single nodes (their real implementations, C
kernels included, run when the exported program does). Targets that only know standard operators
(ONNX, some mobile runtimes) need them rewritten; :func:`export_decompositions` gives the table for
:meth:`torch.export.ExportedProgram.run_decompositions`:

========================================  ====================================================================
op                                        decomposition
========================================  ====================================================================
``vitmix::gaussian_kernel``               the GEMM expansion ``-2 x·y + |x|² + |y|²``, clamped, ``exp``
``vitmix::laplacian_kernel``              the reference's broadcast ``|x_i - y_j|`` summed over features
``vitmix::newton_schulz_inverse``         the start and ``iters`` unrolled ``V <- 2V - V P V`` batched matmuls
``vitmix::sparse_diagonal_attention``     the PyTorch path: one gather of shifted keys/values per slot
``vitmix::dynamic_depthwise_conv2d``      ``k²`` shifted products (ONNX's ``Conv`` cannot take a batch-sized
                                          ``group`` count)
========================================  ====================================================================

Each equals the op up to float rounding (tests compare them). Inference only: the ``*_backward`` ops
are not decomposed. ``newton_schulz_inverse(mode="exact")`` has no fixed form (``ValueError``).

``torch.onnx.export`` needs no table: while either ONNX exporter traces a model
(:func:`vitmix.ops._common.exporting_to_onnx`), the ops run these decompositions inline instead of
the custom ops, so ``torch.onnx.export(model, ..., dynamo=True)`` and timm's ``onnx_export`` (the
TorchScript exporter) see only standard operators. For the TorchScript exporter, importing
:mod:`vitmix.ops` also registers a translation of ``Tensor.mT`` (which it lacks; the ops and
mixers use it), once ``torch.onnx`` is imported.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

from .._lazy import call_after_import
from . import diagonal, dynamic, kernel, newton  # noqa: F401  (importing them registers the custom ops)
from .diagonal.pytorch import _diagonal_decomposition
from .dynamic.pytorch import dynamic_depthwise_conv2d_taps
from .kernel.pytorch import _gaussian_decomposition, _laplacian_decomposition
from .newton.pytorch import _newton_decomposition

__all__ = ["export_decompositions", "register_torchscript_onnx_symbolics"]


def export_decompositions() -> Dict[torch._ops.OpOverload, Callable]:
    """``{op: decomposition}`` for every forward custom op of :mod:`vitmix.ops` (a new dict each call)."""
    ops = torch.ops.vitmix
    return {
        ops.gaussian_kernel.default: _gaussian_decomposition,
        ops.laplacian_kernel.default: _laplacian_decomposition,
        ops.newton_schulz_inverse.default: _newton_decomposition,
        ops.sparse_diagonal_attention.default: _diagonal_decomposition,
        ops.dynamic_depthwise_conv2d.default: dynamic_depthwise_conv2d_taps,
    }


def _matrix_transpose_symbolic(g, x):
    """ONNX ``Transpose`` of the last two dimensions: the TorchScript exporter's missing ``aten::mT``."""
    rank = x.type().dim()
    if rank is None or rank < 2:
        raise ValueError(f"Tensor.mT needs a tensor of known rank >= 2 in the ONNX export, got rank {rank}")
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return g.op("Transpose", x, perm_i=perm)


def register_torchscript_onnx_symbolics() -> None:
    """Teach torch's TorchScript ONNX exporter (``torch.onnx.export(..., dynamo=False)``, timm's
    ``onnx_export``) ``Tensor.mT``, which it lacks; called once ``torch.onnx`` is imported."""
    torch.onnx.register_custom_op_symbolic("aten::mT", _matrix_transpose_symbolic, 7)


call_after_import("torch.onnx", register_torchscript_onnx_symbolics)
