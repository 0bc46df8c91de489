"""Triton kernels of the Gaussian and Laplacian kernel matrices, forward and backward (private).

For ``x: (..., N, d)`` and ``y: (..., M, d)`` with equal (possibly broadcast, any-strided) leading dims:

* forward: ``out[i, j] = exp(scale · Σ_c f(x_ic − y_jc))`` with ``f(t) = |t|``, ``scale = −1/λ``
  (Laplacian) or ``f(t) = t²``, ``scale = −1/2`` (Gaussian; the exact difference, no GEMM expansion,
  so nothing can round below 0). ``y`` (the landmark side, ``O(M·d)``) is first transposed to a
  zero-padded float32 ``(d, M)`` copy, so that one channel of the landmarks is one contiguous vector.
  One program per ``(batch·head, N-tile, M-tile)`` keeps a ``BLOCK_M×BLOCK_N`` accumulator
  (landmarks × tokens) and adds one channel at a time as an outer difference: each thread holds all
  landmarks of its tokens, so per channel it loads one value per token and the (broadcast) landmark
  vector, and every sum stays inside the thread; no ``N×M×d`` tensor exists. ``BLOCK_M`` is fitted to
  ``M`` (the next power of two >= 16, at most 64: m = 49 is one tile, so ``x`` is read once) and
  ``BLOCK_N`` fills :data:`_FWD_TILE` values.
* backward: with ``c_ij = coef · g_ij · out_ij`` (``coef = −1/λ`` resp. ``−1``) and the odd function
  ``h(t) = sign(t)`` (``sign(0) = 0``) resp. ``h(t) = t``:
  ``grad_x_i = Σ_j c_ij h(x_i − y_j)`` and, because ``h`` is odd, ``grad_y_j = Σ_i c_ij h(y_j − x_i)``.
  Token side (:func:`_token_grad`): like the forward, ``y`` is copied to float32 (zero-padded channels)
  and a program keeps a ``BLOCK_D×BLOCK_N`` accumulator (channels × tokens, 32 channels: ``g`` and
  ``out`` are read ``d/32`` times) and walks the landmarks one at a time, adding ``c_ij h(x_i − y_j)``
  for the landmark's channel vector and one ``c`` value per token. Landmark side: the same sum with the
  roles of ``x`` and ``y`` swapped and ``g``/``out`` read transposed; a program holds a
  ``BLOCK_A×BLOCK_D`` tile (landmarks × the whole head dim up to 128 channels, so ``g`` and ``out`` are
  read once, each token's ``c`` values being one contiguous row) and walks its tokens one at a time.
  The token sum is split into chunks of ``_SPLIT_ROWS`` (enough programs to fill a GPU); the per-chunk
  partial sums are added by PyTorch, so there are no atomics and the result is deterministic.

Everything is computed in float32 whatever the input dtype (float32, float16 or bfloat16 are loaded
and converted in registers, never copied); the output is float32, the gradients have the dtype of
their input. ``triton`` is imported on first use only (:func:`_forward_kernel`, :func:`_grad_kernel`),
so this module imports without it.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

#: partner-axis chunk of one backward program (the partial sums of the chunks are added by PyTorch)
_SPLIT_ROWS = 512
#: float32 values of one program's accumulator tile: forward (128 per thread) and gradients
_FWD_TILE, _TILE = 16384, 4096
#: float32 values of a token-gradient program's accumulator (32 per thread on 8 warps)
_TOKEN_GRAD_TILE = 8192
#: warps of a forward program (32 accumulators per thread) and of a gradient program (16 per thread):
#: ptxas for sm_90 reports no spills for either with 64×64 tiles (204 and 191 registers); the gradient
#: spills on 4 warps
_FWD_WARPS, _GRAD_WARPS = 4, 8


def _pow2(n: int, low: int = 16, high: int = 1 << 30) -> int:
    """The next power of two >= ``n``, clamped to ``[low, high]``."""
    return min(high, max(low, 1 << (max(n, 1) - 1).bit_length()))


def _forward_blocks(N: int, M: int) -> dict:
    """``BLOCK_M`` fitted to ``M`` (one tile up to 64 landmarks), ``BLOCK_N`` filling :data:`_FWD_TILE`."""
    block_m = _pow2(M, high=64)
    return dict(BLOCK_N=_pow2(N, high=max(16, _FWD_TILE // block_m)), BLOCK_M=block_m)


def _token_grad_blocks(N: int, D: int) -> dict:
    """``BLOCK_D`` of at most 32 channels (each thread holds the tile's channels of its token, its
    landmark vector and accumulators: 32 keep ptxas for sm_90 from spilling, 64 spill), ``BLOCK_N``
    filling :data:`_TOKEN_GRAD_TILE`."""
    block_d = _pow2(D, high=32)
    return dict(BLOCK_N=_pow2(N, high=max(16, _TOKEN_GRAD_TILE // block_d)), BLOCK_D=block_d)


def _grad_blocks(NA: int, D: int) -> dict:
    """``BLOCK_D`` covering the head dim (at most 128 channels per program), ``BLOCK_A`` filling :data:`_TILE`."""
    block_d = _pow2(D, high=128)
    return dict(BLOCK_A=_pow2(NA, high=max(16, _TILE // block_d)), BLOCK_D=block_d)


@functools.lru_cache(maxsize=None)
def _forward_kernel():
    """The ``@triton.jit`` forward, defined on first use (``triton`` is optional)."""
    import triton
    import triton.language as tl

    @triton.jit
    def pair_forward(x_ptr, yt_ptr, out_ptr, H, N, M, D, MPAD, sxb, sxh, sxn, sxd, scale,
                     L1: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
        # yt (B·H, D, MPAD): y transposed to float32 and zero-padded, so a channel's landmarks are
        # one contiguous vector; the accumulator is landmarks × tokens
        tiles_n, tiles_m = tl.cdiv(N, BLOCK_N), tl.cdiv(M, BLOCK_M)
        pid = tl.program_id(0)
        bh, tile = pid // (tiles_n * tiles_m), pid % (tiles_n * tiles_m)
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        rows = (tile // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
        m0 = (tile % tiles_m) * BLOCK_M
        cols = m0 + tl.arange(0, BLOCK_M)
        x_col = x_ptr + b * sxb + h * sxh + rows.to(tl.int64) * sxn
        y_col = yt_ptr + bh.to(tl.int64) * D * MPAD + cols
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, D):
            # masked tokens load 0: their results are never stored
            xc = tl.load(x_col, mask=rows < N, other=0.0).to(tl.float32)
            yc = tl.load(y_col)
            x_col += sxd
            y_col += MPAD
            diff = yc[:, None] - xc[None, :]
            if L1:
                acc += tl.abs(diff)
            else:
                acc += diff * diff
        out = out_ptr + bh.to(tl.int64) * N * M + rows[None, :].to(tl.int64) * M + cols[:, None]
        tl.store(out, tl.exp(acc * scale), mask=(rows[None, :] < N) & (cols[:, None] < M))

    return pair_forward


@functools.lru_cache(maxsize=None)
def _grad_kernel():
    """The ``@triton.jit`` gradient of one side, defined on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def pair_grad(a_ptr, b_ptr, g_ptr, o_ptr, part_ptr, H, NA, NB, D, SPLITS, CHUNK,
                  sab, sah, san, sad, sbb, sbh, sbn, sbd, sgb, sgh, sga, sgo, sob, soh, soa, soo, coef,
                  L1: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr):
        tiles_a, tiles_d = tl.cdiv(NA, BLOCK_A), tl.cdiv(D, BLOCK_D)
        pid = tl.program_id(0)
        per_bh = SPLITS * tiles_a * tiles_d
        bh, rest = pid // per_bh, pid % per_bh
        split, tile = rest // (tiles_a * tiles_d), rest % (tiles_a * tiles_d)
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        rows = (tile // tiles_d) * BLOCK_A + tl.arange(0, BLOCK_A)
        ch = (tile % tiles_d) * BLOCK_D + tl.arange(0, BLOCK_D)
        rows64 = rows.to(tl.int64)
        a_mask = (rows[:, None] < NA) & (ch[None, :] < D)
        at = tl.load(a_ptr + b * sab + h * sah + rows64[:, None] * san + ch[None, :] * sad, mask=a_mask,
                     other=0.0).to(tl.float32)
        start = split * CHUNK
        first = start.to(tl.int64)      # the chunk's first partner (64-bit offsets: long token axes)
        b_row = b_ptr + b * sbb + h * sbh + ch * sbd + first * sbn
        g_col = g_ptr + b * sgb + h * sgh + rows64 * sga + first * sgo
        o_col = o_ptr + b * sob + h * soh + rows64 * soa + first * soo
        acc = tl.zeros((BLOCK_A, BLOCK_D), dtype=tl.float32)
        for _ in range(start, tl.minimum(start + CHUNK, NB)):
            # one partner: its channels, and its column of c over this tile's rows (masked rows add 0)
            bj = tl.load(b_row, mask=ch < D, other=0.0).to(tl.float32)
            w = (tl.load(g_col, mask=rows < NA, other=0.0).to(tl.float32)
                 * tl.load(o_col, mask=rows < NA, other=0.0).to(tl.float32))
            b_row += sbn
            g_col += sgo
            o_col += soo
            diff = at - bj[None, :]
            if L1:
                diff = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))     # sign(0) = 0
            acc += w[:, None] * diff
        part = part_ptr + ((bh.to(tl.int64) * SPLITS + split) * NA + rows64[:, None]) * D + ch[None, :]
        tl.store(part, acc * coef, mask=a_mask)

    return pair_grad


@functools.lru_cache(maxsize=None)
def _token_grad_kernel():
    """The ``@triton.jit`` gradient of the token side ``x`` (a sum over the landmarks), defined on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def token_grad(x_ptr, yf_ptr, g_ptr, o_ptr, out_ptr, H, N, M, D, DPAD, sxb, sxh, sxn, sxd,
                   sgb, sgh, sgn, sgm, sob, soh, son, som, coef,
                   L1: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        # yf (B·H, M, DPAD): y in float32, zero-padded channels contiguous; the accumulator is channels ×
        # tokens, so a thread holds every channel of the tile for its tokens and reads one c per token
        tiles_n, tiles_d = tl.cdiv(N, BLOCK_N), tl.cdiv(D, BLOCK_D)
        pid = tl.program_id(0)
        bh, tile = pid // (tiles_n * tiles_d), pid % (tiles_n * tiles_d)
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        rows = (tile // tiles_d) * BLOCK_N + tl.arange(0, BLOCK_N)
        ch = (tile % tiles_d) * BLOCK_D + tl.arange(0, BLOCK_D)
        rows64 = rows.to(tl.int64)
        mask = (rows[None, :] < N) & (ch[:, None] < D)
        xt = tl.load(x_ptr + b * sxb + h * sxh + rows64[None, :] * sxn + ch[:, None] * sxd, mask=mask,
                     other=0.0).to(tl.float32)
        y_row = yf_ptr + bh.to(tl.int64) * M * DPAD + ch
        g_col = g_ptr + b * sgb + h * sgh + rows64 * sgn
        o_col = o_ptr + b * sob + h * soh + rows64 * son
        acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        for _ in range(0, M):
            yj = tl.load(y_row)
            w = (tl.load(g_col, mask=rows < N, other=0.0).to(tl.float32)
                 * tl.load(o_col, mask=rows < N, other=0.0).to(tl.float32))
            y_row += DPAD
            g_col += sgm
            o_col += som
            diff = xt - yj[:, None]
            if L1:
                diff = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))     # sign(0) = 0
            acc += w[None, :] * diff
        out = out_ptr + (bh.to(tl.int64) * N + rows64[None, :]) * D + ch[:, None]
        tl.store(out, acc * coef, mask=mask)

    return token_grad


def _as4d(t: torch.Tensor) -> torch.Tensor:
    """``t (..., R, d)`` as ``(B, H, R, d)``: a view for up to two leading dims (strides kept, broadcast
    dims included), a reshape (a copy where needed) beyond."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    if t.dim() == 4:
        return t
    return t.reshape(-1, *t.shape[-3:])


def _strides(t: torch.Tensor):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def pair_forward(x: torch.Tensor, y: torch.Tensor, l1: bool, scale: float) -> torch.Tensor:
    """``exp(scale · Σ_c f(x_ic − y_jc))`` in float32, shape ``(..., N, M)`` (no autograd)."""
    x4, y4 = _as4d(x), _as4d(y)
    B, H, N, D = x4.shape
    M = y4.shape[2]
    out = torch.empty(B, H, N, M, dtype=torch.float32, device=x.device)
    if out.numel():
        bl = _forward_blocks(N, M)
        mpad = -(-M // bl["BLOCK_M"]) * bl["BLOCK_M"]
        # the landmark side transposed to float32, zero-padded to whole tiles: O(M·d) per head
        yt = torch.zeros(B, H, D, mpad, dtype=torch.float32, device=x.device)
        yt[..., :M] = y4.transpose(-1, -2)
        grid = (B * H * -(-N // bl["BLOCK_N"]) * (mpad // bl["BLOCK_M"]),)
        _forward_kernel()[grid](x4, yt, out, H, N, M, D, mpad, *_strides(x4), float(scale), L1=l1,
                                num_warps=_FWD_WARPS, **bl)
    return out.view(*x.shape[:-1], M)


def _grad_one_side(a4, b4, g4, o4, l1: bool, coef: float, transposed: bool) -> torch.Tensor:
    """``Σ_partner c · h(a − b)`` for every row of ``a`` (``transposed``: ``a`` is the column side of
    ``g``/``out``), float32 ``(B, H, NA, d)``."""
    B, H, NA, D = a4.shape
    NB = b4.shape[2]
    sg, so = _strides(g4), _strides(o4)
    if transposed:
        sg, so = (sg[0], sg[1], sg[3], sg[2]), (so[0], so[1], so[3], so[2])
    bl = _grad_blocks(NA, D)
    chunk = max(1, _SPLIT_ROWS)
    splits = max(1, -(-NB // chunk))
    # one chunk: the kernel writes the gradient in its final dtype (no float32 buffer to convert)
    part = torch.empty(B, H, splits, NA, D, dtype=a4.dtype if splits == 1 else torch.float32, device=a4.device)
    if part.numel():
        grid = (B * H * splits * -(-NA // bl["BLOCK_A"]) * -(-D // bl["BLOCK_D"]),)
        _grad_kernel()[grid](a4, b4, g4, o4, part, H, NA, NB, D, splits, chunk, *_strides(a4), *_strides(b4),
                            *sg, *so, float(coef), L1=l1, num_warps=_GRAD_WARPS, **bl)
    return part.sum(2) if splits > 1 else part[:, :, 0]


def _token_grad(x4, y4, g4, o4, l1: bool, coef: float) -> torch.Tensor:
    """``Σ_j c_ij h(x_i − y_j)`` for every token ``i``, ``(B, H, N, d)`` in the dtype of ``x``."""
    B, H, N, D = x4.shape
    M = y4.shape[2]
    out = torch.empty(B, H, N, D, dtype=x4.dtype, device=x4.device)
    if out.numel():
        bl = _token_grad_blocks(N, D)
        dpad = -(-D // bl["BLOCK_D"]) * bl["BLOCK_D"]
        yf = torch.zeros(B, H, M, dpad, dtype=torch.float32, device=x4.device)     # O(M·d) per head
        yf[..., :D] = y4
        grid = (B * H * -(-N // bl["BLOCK_N"]) * (dpad // bl["BLOCK_D"]),)
        _token_grad_kernel()[grid](x4, yf, g4, o4, out, H, N, M, D, dpad, *_strides(x4), *_strides(g4),
                                   *_strides(o4), float(coef), L1=l1, num_warps=_GRAD_WARPS, **bl)
    return out


def pair_grads(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, l1: bool, coef: float,
               need_x: bool = True, need_y: bool = True) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(dL/dx, dL/dy)`` from ``g = dL/dout`` and the saved output, in the dtypes of ``x`` and ``y``."""
    x4, y4, g4, o4 = _as4d(x), _as4d(y), _as4d(g), _as4d(out)
    gx = _token_grad(x4, y4, g4, o4, l1, coef).reshape(x.shape) if need_x else None
    gy = _grad_one_side(y4, x4, g4, o4, l1, coef, True).reshape(y.shape).to(y.dtype) if need_y else None
    return gx, gy


def _constants(kind: str, lam: float) -> Tuple[bool, float, float]:
    """``(l1, forward scale, backward coefficient)`` of ``kind``."""
    if kind == "laplacian":
        return True, -1.0 / lam, -1.0 / lam
    return False, -0.5, -1.0


def kernel_forward(kind: str, x: torch.Tensor, y: torch.Tensor, lam: float = 1.0) -> torch.Tensor:
    """Forward of ``kind`` (``"gaussian"`` or ``"laplacian"``), float32, without autograd."""
    l1, scale, _ = _constants(kind, lam)
    return pair_forward(x, y, l1, scale)


def kernel_grads(kind: str, g, x, y, out, lam: float = 1.0, need_x: bool = True, need_y: bool = True):
    """Gradients of :func:`kernel_forward` w.r.t. ``x`` and ``y``."""
    l1, _, coef = _constants(kind, lam)
    return pair_grads(g, x, y, out, l1, coef, need_x, need_y)


class TritonPairKernel(torch.autograd.Function):
    """Kernel matrix ``kind`` of same-batch ``x``, ``y`` by Triton; saves only ``x``, ``y`` and the output."""

    @staticmethod
    def forward(ctx, x, y, kind: str, lam: float):
        out = kernel_forward(kind, x, y, lam)
        ctx.save_for_backward(x, y, out)
        ctx.kind, ctx.lam = kind, lam
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, y, out = ctx.saved_tensors
        gx, gy = kernel_grads(ctx.kind, g, x, y, out, ctx.lam, *ctx.needs_input_grad[:2])
        return gx, gy, None, None
