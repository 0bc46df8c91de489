"""Pure tensor functions (no parameters), each with a reference and a fast path. Imports only torch."""
from .kernels import gaussian_kernel, gaussian_kernel_reference, laplacian_kernel, laplacian_kernel_reference
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
from .sparse_diagonal import masked_diagonal_attention, official_diagonal_attention, sparse_diagonal_attention

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
