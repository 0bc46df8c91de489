"""Triton kernels of sparse multi-diagonal attention (Fibottention's sparse mode), forward and backward (private).

Imported by :mod:`vitmix.ops.diagonal` only once Triton was chosen (``wants_triton``), so a missing
triton never breaks ``import vitmix``. Semantics are those of
:func:`~vitmix.ops.diagonal.sparse_diagonal_attention`: patch query ``j`` of head ``h`` scores the ``P``
prefix keys and the patch keys ``j + s`` for the head's signed shifts ``s`` (the plan's slot table); the ``P``
prefix queries attend densely and reuse the PyTorch helpers of the other backends.

Three kernels over blocks of ``BLOCK_N`` consecutive patch rows of one (batch, head), so that for a fixed slot
the keys of the block are consecutive rows too (coalesced loads); nothing is ever ``N × N``:

* ``_fwd``: online softmax over the prefix keys and the head's slots in float32 (running max and sum), the
  output in the input dtype and one float32 log-sum-exp per row.
* ``_bwd_query``: recomputes each score, ``a = exp(s − lse)``, ``ds = a (dout·v − dout·out)``; ``dq = scale Σ ds k``;
  stores ``delta = dout·out`` per row and, per block, the partial ``dk``/``dv`` of the prefix keys.
* ``_bwd_key``: per patch key ``t``, the mirrored slots: the key ``t`` is reached by query ``t − s`` through slot
  ``s``, so ``dk_t = scale Σ ds q``, ``dv_t = Σ a dout`` over those queries plus the prefix queries' share. Each
  program owns its rows: no atomics, every sum in float32, one rounding to the input dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .plan import DiagonalPlan, _prefix_backward, _prefix_forward, _token_major


@triton.jit
def _online_step(m_i, l_i, acc, s, v):
    """One key per row: running max ``m_i``, sum ``l_i`` and unnormalised output ``acc`` updated with score
    ``s`` (``-inf`` for no key) and value rows ``v``; a row that has seen no key yet keeps ``m_i = -inf``."""
    m_new = tl.maximum(m_i, s)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)   # exp(-inf - 0) = 0 instead of exp(nan)
    alpha = tl.exp(m_i - m_ref)
    w = tl.exp(s - m_ref)
    return m_new, l_i * alpha + w, acc * alpha[:, None] + w[:, None] * v


@triton.jit
def _rows(base, idx, stride, cols, ok, col_ok):
    """``(BLOCK_N, BLOCK_D)`` float32 rows ``idx`` of a ``(T, D)`` slice (zeros where masked)."""
    ptrs = base + idx.to(tl.int64)[:, None] * stride + cols[None, :]
    return tl.load(ptrs, mask=ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _row(base, idx, stride, cols, col_ok):
    """One float32 row ``idx`` ``(BLOCK_D,)`` of a ``(T, D)`` slice (a prefix row: ``idx · stride`` is small)."""
    return tl.load(base + idx * stride + cols, mask=col_ok, other=0.0).to(tl.float32)


@triton.jit
def _fwd(Q, K, V, OUT, LSE, SHIFTS, COUNTS, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t,
         H, N, P, M, D, scale, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    q_base, k_base, v_base = Q + b * sq_b + h * sq_h, K + b * sk_b + h * sk_h, V + b * sv_b + h * sv_h
    q = _rows(q_base, P + rows, sq_t, cols, row_ok, col_ok)
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for i in range(0, P):                      # every query sees the prefix keys
        k = _row(k_base, i, sk_t, cols, col_ok)
        s = tl.sum(q * k[None, :], 1) * scale
        m_i, l_i, acc = _online_step(m_i, l_i, acc, s, _row(v_base, i, sv_t, cols, col_ok)[None, :])
    for m in range(0, tl.load(COUNTS + h)):    # the head's real slots only (padded ones lie beyond counts[h])
        key = rows + tl.load(SHIFTS + h * M + m)
        ok = row_ok & (key >= 0) & (key < N)
        k = _rows(k_base, P + key, sk_t, cols, ok, col_ok)
        s = tl.where(ok, tl.sum(q * k, 1) * scale, float("-inf"))
        m_i, l_i, acc = _online_step(m_i, l_i, acc, s, _rows(v_base, P + key, sv_t, cols, ok, col_ok))
    seen = l_i > 0                             # a query without any key outputs 0, lse = -inf
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_ptrs = OUT + b * so_b + h * so_h + (P + rows).to(tl.int64)[:, None] * so_t + cols[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    tl.store(LSE + bh * N + rows, tl.where(seen, m_i + tl.log(l_safe), float("-inf")), mask=row_ok)


@triton.jit
def _bwd_query(Q, K, V, DOUT, OUT, LSE, DQ, DELTA, PART, SHIFTS, COUNTS, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t,
               sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, so_b, so_h, so_t, sdq_b, sdq_h, sdq_t,
               H, N, P, M, D, scale, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    k_base, v_base = K + b * sk_b + h * sk_h, V + b * sv_b + h * sv_h
    q = _rows(Q + b * sq_b + h * sq_h, P + rows, sq_t, cols, row_ok, col_ok)
    g = _rows(DOUT + b * sg_b + h * sg_h, P + rows, sg_t, cols, row_ok, col_ok)
    delta = tl.sum(g * _rows(OUT + b * so_b + h * so_h, P + rows, so_t, cols, row_ok, col_ok), 1)
    tl.store(DELTA + bh * N + rows, delta, mask=row_ok)
    lse = tl.load(LSE + bh * N + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    part = PART + (bh * tl.num_programs(0) + tl.program_id(0)) * P * 2 * D
    for i in range(0, P):                      # prefix keys: dq here, their dk/dv summed over this block
        k = _row(k_base, i, sk_t, cols, col_ok)
        a = tl.where(row_ok, tl.exp(tl.sum(q * k[None, :], 1) * scale - lse), 0.0)
        ds = a * (tl.sum(g * _row(v_base, i, sv_t, cols, col_ok)[None, :], 1) - delta)
        dq += ds[:, None] * k[None, :]
        tl.store(part + (2 * i) * D + cols, tl.sum(ds[:, None] * q, 0) * scale, mask=col_ok)
        tl.store(part + (2 * i + 1) * D + cols, tl.sum(a[:, None] * g, 0), mask=col_ok)
    for m in range(0, tl.load(COUNTS + h)):
        key = rows + tl.load(SHIFTS + h * M + m)
        ok = row_ok & (key >= 0) & (key < N)
        k = _rows(k_base, P + key, sk_t, cols, ok, col_ok)
        a = tl.where(ok, tl.exp(tl.sum(q * k, 1) * scale - lse), 0.0)
        ds = a * (tl.sum(g * _rows(v_base, P + key, sv_t, cols, ok, col_ok), 1) - delta)
        dq += ds[:, None] * k
    dq_ptrs = DQ + b * sdq_b + h * sdq_h + (P + rows).to(tl.int64)[:, None] * sdq_t + cols[None, :]
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _bwd_key(Q, K, V, DOUT, LSE, DELTA, WPRE, DSPRE, DK, DV, SHIFTS, COUNTS, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t,
             sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sdk_b, sdk_h, sdk_t, sdv_b, sdv_h, sdv_t,
             H, N, P, M, D, scale, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)   # patch keys t
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    q_base, g_base = Q + b * sq_b + h * sq_h, DOUT + b * sg_b + h * sg_h
    k = _rows(K + b * sk_b + h * sk_h, P + rows, sk_t, cols, row_ok, col_ok)
    v = _rows(V + b * sv_b + h * sv_h, P + rows, sv_t, cols, row_ok, col_ok)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for i in range(0, P):                      # the prefix queries' share, weights from _prefix_backward
        pre = bh * P * (P + N) + i * (P + N) + P + rows
        dk += tl.load(DSPRE + pre, mask=row_ok, other=0.0)[:, None] * _row(q_base, i, sq_t, cols, col_ok)[None, :]
        dv += tl.load(WPRE + pre, mask=row_ok, other=0.0)[:, None] * _row(g_base, i, sg_t, cols, col_ok)[None, :]
    for m in range(0, tl.load(COUNTS + h)):    # mirrored slots: query t - s reaches key t through shift s
        query = rows - tl.load(SHIFTS + h * M + m)
        ok = row_ok & (query >= 0) & (query < N)
        q = _rows(q_base, P + query, sq_t, cols, ok, col_ok)
        g = _rows(g_base, P + query, sg_t, cols, ok, col_ok)
        lse = tl.load(LSE + bh * N + query, mask=ok, other=0.0)
        a = tl.where(ok, tl.exp(tl.sum(q * k, 1) * scale - lse), 0.0)
        ds = a * (tl.sum(g * v, 1) - tl.load(DELTA + bh * N + query, mask=ok, other=0.0))
        dk += ds[:, None] * q
        dv += a[:, None] * g
    mask = row_ok[:, None] & col_ok[None, :]
    t = (P + rows).to(tl.int64)[:, None]
    tl.store(DK + b * sdk_b + h * sdk_h + t * sdk_t + cols[None, :], (dk * scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + b * sdv_b + h * sdv_h + t * sdv_t + cols[None, :], dv.to(DV.dtype.element_ty), mask=mask)


def _launch(n: int, d: int):
    """Launch options: the head dim padded to a power of two (≥ 16) and tiles of at most 4096 float32 values
    over 8 warps (16 per thread): ptxas for sm_90 reports no register spills for any of the three kernels at
    head dims 16..256 with these sizes, and spills with 4 warps per 4096 values."""
    block_d = max(16, triton.next_power_of_2(d))
    block_n = max(16, min(4096 // block_d, 128, triton.next_power_of_2(n)))
    return {"BLOCK_N": block_n, "BLOCK_D": block_d, "num_warps": max(1, min(8, block_n * block_d // 512))}


def _strides(*tensors):
    return [s for t in tensors for s in t.stride()[:3]]


def _grad_buffer(x: torch.Tensor) -> torch.Tensor:
    """``x``'s layout when contiguous (cheap ``.grad`` accumulation), else token-major (views of a qkv projection)."""
    b, h, t, d = x.shape
    return torch.empty_like(x) if x.is_contiguous() else _token_major(b, h, t, d, x)


def diagonal_forward(q, k, v, plan: DiagonalPlan, p: int, scale: float):
    """``(out, lse, lse_pre)``: ``out`` a token-major ``(B, H, T, d)`` view in ``q``'s dtype, ``lse`` ``(B, H, N)``
    float32, ``lse_pre`` ``(B, H, P)`` float32 or ``None``. ``q, k, v`` need unit stride along ``d``."""
    b, h, t, d = q.shape
    n = t - p
    out = _token_major(b, h, t, d, q)
    lse = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    opts = _launch(n, d)
    _fwd[(triton.cdiv(n, opts["BLOCK_N"]), b * h)](
        q, k, v, out, lse, plan.shifts, plan.counts, *_strides(q, k, v, out), h, n, p, plan.max_slots, d, scale,
        **opts)
    lse_pre = None
    if p:  # dense prefix rows, in float32 as every other backend computes them
        out_pre, lse_pre = _prefix_forward(q[:, :, :p].float(), k.float(), v.float(), p, scale)
        out[:, :, :p] = out_pre
    return out, lse, lse_pre


def diagonal_backward(dout, q, k, v, out, lse, lse_pre, plan: DiagonalPlan, p: int, scale: float):
    """``(dq, dk, dv)`` in the dtypes of ``q, k, v`` from the saved forward results."""
    b, h, t, d = q.shape
    n = t - p
    dq, dk, dv = _grad_buffer(q), _grad_buffer(k), _grad_buffer(v)
    opts = _launch(n, d)
    grid = (triton.cdiv(n, opts["BLOCK_N"]), b * h)
    delta = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    wpre = dspre = part = delta                 # placeholders, never read when p = 0
    if p:
        part = torch.empty(b, h, grid[0], p, 2, d, device=q.device, dtype=torch.float32)
        wpre, dspre = _prefix_backward(q[:, :, :p].float(), k.float(), v.float(), out[:, :, :p].float(),
                                       dout[:, :, :p].float(), lse_pre, p, scale)
    common = (plan.shifts, plan.counts)
    _bwd_query[grid](q, k, v, dout, out, lse, dq, delta, part, *common, *_strides(q, k, v, dout, out, dq),
                     h, n, p, plan.max_slots, d, scale, **opts)
    _bwd_key[grid](q, k, v, dout, lse, delta, wpre, dspre, dk, dv, *common, *_strides(q, k, v, dout, dk, dv),
                   h, n, p, plan.max_slots, d, scale, **opts)
    if p:
        _prefix_rows(dq, dk, dv, q, k, dout, wpre, dspre, part.sum(2), p, scale)
    return dq, dk, dv


def _prefix_rows(dq, dk, dv, q, k, dout, wpre, dspre, part, p, scale):
    """Gradients of the ``P`` prefix rows in float32: ``dq`` of the dense prefix queries, ``dk``/``dv`` of the
    prefix keys from the prefix queries plus ``part`` ``(B, H, P, 2, d)``, the patch queries' share."""
    dq[:, :, :p] = (dspre @ k.float()) * scale
    dk[:, :, :p] = (dspre[..., :p].transpose(-1, -2) @ q[:, :, :p].float()) * scale + part[:, :, :, 0]
    dv[:, :, :p] = wpre[..., :p].transpose(-1, -2) @ dout[:, :, :p].float() + part[:, :, :, 1]
