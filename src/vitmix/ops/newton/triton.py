"""Triton kernel of the fixed-iteration Newton–Schulz loop ``V <- 2V − V (P V)`` (private).

:mod:`vitmix.ops.newton` computes ``P = A + εI``, the start ``V0`` (every ``alpha`` mode, the symmetry
test) and the checked fallback in PyTorch, and hands only the loop to :func:`iterate` (the same plug-in
point as the CPU C kernel, :mod:`vitmix.ops.newton.c`). One program per matrix holds the zero-padded ``P`` and ``V``
(``MP×MP``, ``MP`` the next power of two >= max(m, 16)) in registers for all iterations: two
float32 matrix products per step (``input_precision="ieee"``: true float32, never TF32) and no memory
traffic between steps. Zero padding stays zero through the iteration, as in the C kernel.
``triton`` is imported on first use only.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

#: largest matrix the kernel takes (one m×m matrix per program, in registers)
MAX_M = 128


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def ns_loop(p_ptr, v_ptr, out_ptr, M, ITERS, MP: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * M * M
        r = tl.arange(0, MP)
        mask = (r[:, None] < M) & (r[None, :] < M)
        offs = base + r[:, None] * M + r[None, :]
        P = tl.load(p_ptr + offs, mask=mask, other=0.0)
        V = tl.load(v_ptr + offs, mask=mask, other=0.0)
        for _ in range(ITERS):
            PV = tl.dot(P, V, input_precision="ieee")
            V = 2.0 * V - tl.dot(V, PV, input_precision="ieee")
        tl.store(out_ptr + offs, V, mask=mask)

    return ns_loop


def unsupported(P: torch.Tensor) -> Optional[str]:
    """Why the kernel cannot take the batch ``P (..., m, m)``, or ``None``."""
    if P.dtype != torch.float32:
        return f"dtype {P.dtype} (the Triton Newton–Schulz kernel runs in float32; float64 keeps the PyTorch path)"
    if P.shape[-1] > MAX_M:
        return (f"m={P.shape[-1]} landmarks (the Triton Newton–Schulz kernel holds one m×m matrix per program: "
                f"m <= {MAX_M})")
    return None


def iterate(P: torch.Tensor, V0: torch.Tensor, iters: int) -> torch.Tensor:
    """``iters`` steps ``V <- 2V − V P V`` from ``V0`` for float32 ``P, V0: (B, m, m)``, m <= 128."""
    P, V0 = P.contiguous(), V0.contiguous()
    out = torch.empty_like(P)
    B, m = P.shape[0], P.shape[-1]
    if B == 0:
        return out
    mp = max(16, 1 << (m - 1).bit_length())
    _kernel()[(B,)](P, V0, out, m, iters, MP=mp, num_warps=8 if mp >= 128 else 4)
    return out
