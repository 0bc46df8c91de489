"""Triton kernel of the fixed-iteration Newton–Schulz loop ``V <- 2V − V (P V)`` (private).

:mod:`vitmix.ops.newton` computes ``P = A + εI``, the start ``V0`` (every ``alpha`` mode, the symmetry
test) and the checked fallback in PyTorch, and hands only the loop to :func:`iterate` (the same plug-in
point as the CPU C kernel, :mod:`vitmix.ops.newton.c`).

One program per matrix runs all iterations. Each product is built one block of ``BR`` rows at a time
as a sum of ``m`` outer products (a column of the left factor times a row of the right one), so the
sum runs over exactly ``m`` terms (no padding of the inner dimension: m = 49 costs 49 steps, not 64),
every multiply-add is a true float32 FMA inside one thread (never TF32, no cross-thread reduction),
and a program holds only a ``BR×MP`` accumulator (``MP`` the next power of two >= max(m, 16), ``BR·MP
<= 4096``). ``V`` and ``P V`` live in a small per-matrix work buffer (``3·m²`` floats, cache-resident)
between the two products of a step, separated by a block-wide barrier. Holding ``P``, ``V`` and ``P V``
in registers instead spills: ``ptxas`` for sm_90 reports a 7.5 KB stack at m = 64 and 22 KB at m = 128.
``triton`` is imported on first use only.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

#: largest matrix the kernel takes
MAX_M = 128
#: float32 values of one program's accumulator (the rows of a block times the padded width)
_TILE = 4096
#: warps per program: with one program per matrix a small batch (batch 1 × 6 heads: 6 programs) leaves
#: most of the GPU idle, so each program gets 8 warps (256 threads) to hide the latency of the
#: outer-product loop's loads; ``ptxas`` for sm_90 reports 192 registers and no spills at m = 64 and 128
#: (4 warps: 255 registers, and a small spill at m = 64)
_NUM_WARPS = 8


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def ns_loop(p_ptr, work_ptr, M, ITERS, MP: tl.constexpr, BR: tl.constexpr):
        # work (B, 3, M, M): V0 in slot 0; V alternates between slots 0 and 1; P V goes to slot 2
        mat = tl.program_id(0).to(tl.int64)
        mm = M * M
        p = p_ptr + mat * mm
        work = work_ptr + mat * 3 * mm
        pv = work + 2 * mm
        cols = tl.arange(0, MP)
        col_ok = cols < M
        for it in range(ITERS):
            v = work + (it % 2) * mm
            v_next = work + ((it + 1) % 2) * mm
            for r0 in range(0, M, BR):           # P V
                rows = r0 + tl.arange(0, BR)
                row_ok = rows < M
                acc = tl.zeros((BR, MP), dtype=tl.float32)
                for k in range(M):
                    a = tl.load(p + rows * M + k, mask=row_ok, other=0.0)
                    b = tl.load(v + k * M + cols, mask=col_ok, other=0.0)
                    acc += a[:, None] * b[None, :]
                tl.store(pv + rows[:, None] * M + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])
            tl.debug_barrier()                   # P V complete before any row of V (P V) reads it
            for r0 in range(0, M, BR):           # 2 V − V (P V)
                rows = r0 + tl.arange(0, BR)
                row_ok = rows < M
                offs = rows[:, None] * M + cols[None, :]
                mask = row_ok[:, None] & col_ok[None, :]
                acc = 2.0 * tl.load(v + offs, mask=mask, other=0.0)
                for k in range(M):
                    a = tl.load(v + rows * M + k, mask=row_ok, other=0.0)
                    b = tl.load(pv + k * M + cols, mask=col_ok, other=0.0)
                    acc -= a[:, None] * b[None, :]
                tl.store(v_next + offs, acc, mask=mask)
            tl.debug_barrier()                   # the new V complete before the next step reads it

    return ns_loop


def unsupported(P: torch.Tensor) -> Optional[str]:
    """Why the kernel cannot take the batch ``P (..., m, m)``, or ``None``."""
    if P.dtype != torch.float32:
        return f"dtype {P.dtype} (the Triton Newton–Schulz kernel runs in float32; float64 keeps the PyTorch path)"
    if P.shape[-1] > MAX_M:
        return f"m={P.shape[-1]} landmarks (the Triton Newton–Schulz kernel takes m <= {MAX_M})"
    return None


def blocks(m: int) -> dict:
    """The padded width ``MP`` of an m×m matrix and the rows ``BR`` of a block (``BR·MP <= 4096``:
    m <= 64 is one block, m = 128 four blocks of 32 rows)."""
    mp = max(16, 1 << (m - 1).bit_length())
    return dict(MP=mp, BR=min(mp, _TILE // mp))


def iterate(P: torch.Tensor, V0: torch.Tensor, iters: int) -> torch.Tensor:
    """``iters`` steps ``V <- 2V − V P V`` from ``V0`` for float32 ``P, V0: (B, m, m)``, m <= 128."""
    P = P.contiguous()
    B, m = P.shape[0], P.shape[-1]
    work = torch.empty(B, 3, m, m, dtype=P.dtype, device=P.device)
    work[:, 0].copy_(V0)
    if B and iters:
        _kernel()[(B,)](P, work, m, iters, num_warps=_NUM_WARPS, **blocks(m))
    return work[:, iters % 2]
