"""LaplacianFormer's token mixing for training on CPU: one C call forward, one C call backward (private).

At the widths where small ViTs live (N ≈ 65–200 tokens, 16–25 landmarks, head dim 32) the composed path
of :class:`vitmix.mixers.laplacian.LaplacianAttention` is ~40 torch ops forward and ~60 backward per layer
(views and copies of ``q, k, v``, the pooling products, three kernel matrices, the Newton–Schulz start and
loop, the normaliser's products, the depthwise conv), each costing more in dispatch and memory traffic
than in arithmetic. :func:`laplacian_mix_train` computes the same function with the same gradients:

* forward: :func:`vitmix.ops.nystrom.c.laplacian_mix`'s C call (pooling, kernels, Newton–Schulz,
  injective map, local conv, heads merged), which also keeps each slice's ``C_q``, ``C_k`` and ``M``;
* backward: one work item per (batch, head) slice re-reads ``q, k, v`` from the saved ``qkv`` output,
  recomputes the normaliser's ``m×m`` / ``N×m`` intermediates and applies, in order, the injective map's
  backward (the formulas of :func:`vitmix.ops.nystrom._injective_bwd`), the implicit Newton–Schulz
  backward ``dW = -Mᵀ dM Mᵀ`` (:mod:`vitmix.ops.newton`), the L1 kernels' backward (``sign(0) = 0``, as the
  composed path's C kernel), the adjoint of the adaptive pooling and the conv's backward, and writes the
  gradient of the ``qkv`` output directly in its ``(B, N, 3C)`` layout.

The composed path is the reference (tests compare the output and every gradient in float64 and
float32, and gradcheck the function); it runs wherever this does not apply (see the layer's
``_fused`` rule) or the library cannot be built.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import c

def _ptr(t: Optional[torch.Tensor]) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


class _LaplacianMix(torch.autograd.Function):
    """``laplacian_mix`` with a C backward; the configuration travels as a dict (see :func:`laplacian_mix_train`)."""

    @staticmethod
    def forward(ctx, y, conv_weight, conv_bias, mean_weight, cfg):
        y = y.contiguous()
        out, saved = c.laplacian_mix(y, conv_weight, conv_bias, save=True, mean_weight=mean_weight, **cfg)
        ctx.save_for_backward(y, conv_weight, mean_weight, saved)
        ctx.cfg, ctx.has_bias = cfg, conv_bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        y, conv_weight, mean_weight, saved = ctx.saved_tensors
        cfg = ctx.cfg
        prefix, h, w = cfg["grid"]
        heads, (mh, mw) = cfg["heads"], cfg["landmarks"]
        b, n, c3 = y.shape
        ch = c3 // 3
        d, s = ch // heads, b * heads
        dt = y.dtype
        g = g.to(dt).contiguous()
        ksize = 0 if conv_weight is None else conv_weight.shape[-1]
        taps = ksize * ksize
        wt = None if conv_weight is None else conv_weight.detach().reshape(ch, -1).to(dt).contiguous()
        weights = None if mean_weight is None else mean_weight.detach().to(dt).contiguous()
        dy = torch.empty_like(y)
        dconv_w = torch.empty(s, d, taps, dtype=dt) if ksize else None
        dconv_b = torch.empty(s, d, dtype=dt) if ksize else None
        dmean = torch.empty(s, dtype=dt)
        threads = c.slice_threads(b * heads, b * heads * 2 * n * mh * mw * (2 * d + mh * mw))
        lib = c.NYSTROM_KERNEL.load()
        with torch.profiler.record_function("vitmix::laplacian_mix_backward (C)"):
            failed = getattr(lib, f"vitmix_laplacian_mix_backward_{c._SUFFIX[dt]}")(
                _ptr(y), _ptr(g), _ptr(wt), _ptr(weights), _ptr(saved), _ptr(dy), _ptr(dconv_w), _ptr(dconv_b),
                _ptr(dmean), b, n, prefix, h, w, heads, d, mh, mw, 1.0 / cfg["lam"], cfg["norm_eps"],
                cfg["contrast"], ksize, threads)
        if failed:
            raise MemoryError(f"laplacian attention: the C backward could not allocate its buffers for {failed} slices")
        gw = gb = gm = None
        if ksize:
            gw = dconv_w.view(b, ch, taps).sum(0).view_as(conv_weight).to(conv_weight.dtype)
            gb = dconv_b.view(b, ch).sum(0).to(conv_weight.dtype) if ctx.has_bias else None
        if mean_weight is not None:
            gm = dmean.view(b, heads).sum(0).view_as(mean_weight).to(mean_weight.dtype)
        return dy, gw, gb, gm, None


def laplacian_mix_train(y: torch.Tensor, conv_weight: Optional[torch.Tensor], conv_bias: Optional[torch.Tensor], *,
                        grid, heads: int, landmarks, lam: float, eps: float, iters: int, alpha: str, norm_eps: float,
                        contrast: float, mean_weight: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """:func:`vitmix.ops.nystrom.c.laplacian_mix` with gradients for ``y``, the conv's weight and bias and the mean
    weight (same arguments; ``mean_weight`` has shape ``(heads,)``), or ``None`` where the library is unavailable
    or m > 256 (the caller's composed path runs)."""
    if c.NYSTROM_KERNEL.load() is None or landmarks[0] * landmarks[1] > c.MAX_LANDMARKS:
        return None
    cfg = dict(grid=tuple(grid), heads=int(heads), landmarks=tuple(landmarks), lam=float(lam), eps=float(eps),
               iters=int(iters), alpha=alpha, norm_eps=float(norm_eps), contrast=float(contrast))
    return _LaplacianMix.apply(y, conv_weight, conv_bias, mean_weight, cfg)


__all__ = ["laplacian_mix_train"]
