"""Pure tensor functions (no parameters), each with a reference and a fast path. Imports only torch.

One package per op (``kernel/`` the Gaussian/Laplacian similarity kernels, ``newton/`` the Newton–Schulz
inverse, ``nystrom/``, ``diagonal/`` the sparse multi-diagonal attention, ``dynamic/`` the dynamic-weight
ops): the public function and custom op in its ``__init__.py``, the reference in ``naive.py``, one file per
back end (``pytorch.py``, ``c.py`` with the C source and its binding, ``triton.py``). ``fibonacci.py`` and
``index_sparse.py`` are single modules (index maths; one PyTorch back end); ``_common.py``, ``_cbuild.py``
and ``_triton.py`` are the helpers every op shares (dtype and tracing rules, building C, Triton's
availability); ``decompositions.py`` is the export table of all custom ops.
"""
from .kernel import gaussian_kernel, gaussian_kernel_reference, laplacian_kernel, laplacian_kernel_reference
from .dynamic import (
    dynamic_depthwise_conv2d,
    dynamic_depthwise_conv2d_reference,
    dynamic_linear,
    dynamic_linear_reference,
)
from .decompositions import export_decompositions
from .fibonacci import fibonacci_mask, fibonacci_offsets, offsets_mask
from .newton import newton_schulz_inverse, newton_schulz_reference
from .nystrom import avg_pool_landmarks, kernel_attention_reference, nystrom_attention, nystrom_attention_reference
from .diagonal import masked_diagonal_attention, official_diagonal_attention, sparse_diagonal_attention

__all__ = [
    "avg_pool_landmarks",
    "dynamic_depthwise_conv2d",
    "dynamic_depthwise_conv2d_reference",
    "dynamic_linear",
    "dynamic_linear_reference",
    "export_decompositions",
    "fibonacci_mask",
    "fibonacci_offsets",
    "masked_diagonal_attention",
    "offsets_mask",
    "official_diagonal_attention",
    "sparse_diagonal_attention",
    "gaussian_kernel",
    "gaussian_kernel_reference",
    "kernel_attention_reference",
    "laplacian_kernel",
    "laplacian_kernel_reference",
    "newton_schulz_inverse",
    "newton_schulz_reference",
    "nystrom_attention",
    "nystrom_attention_reference",
]
