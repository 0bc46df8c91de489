"""Obviously-correct references of the Gaussian and Laplacian kernel matrices: each broadcasts the
``(..., N, M, d)`` difference tensor (O(N·M·d) memory) and lets autograd differentiate it."""
from __future__ import annotations

import torch

from .._common import no_autocast
from .checks import _check_lam, _check_pair, _prepare

__all__ = ["gaussian_kernel_reference", "laplacian_kernel_reference"]


def gaussian_kernel_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Reference Gaussian kernel: broadcasts the ``(..., N, M, d)`` difference (O(N·M·d) memory)."""
    _check_pair("gaussian_kernel_reference", x, y)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        diff = xs.unsqueeze(-2) - ys.unsqueeze(-3)
        return torch.exp(-0.5 * diff.square().sum(-1))


def laplacian_kernel_reference(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0) -> torch.Tensor:
    """Reference Laplacian kernel: broadcasts the ``(..., N, M, d)`` difference, autograd through ``abs``."""
    _check_pair("laplacian_kernel_reference", x, y)
    lam_f = _check_lam(lam)
    with no_autocast(x.device.type):
        xs, ys = _prepare(x, y)
        diff = xs.unsqueeze(-2) - ys.unsqueeze(-3)
        return torch.exp(-diff.abs().sum(-1) / lam_f)
