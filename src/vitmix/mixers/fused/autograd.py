"""LaplacianFormer's and SOFT's token mixing for training on CPU: one C call forward, one backward (private).

At the widths where small ViTs live (N ≈ 65–200 tokens, 16–25 landmarks, head dim 32) the composed path
of :class:`vitmix.mixers.laplacian.LaplacianAttention` is ~40 torch ops forward and ~60 backward per layer
(views and copies of ``q, k, v``, the pooling products, three kernel matrices, the Newton–Schulz start and
loop, the normaliser's products, the depthwise conv), each costing more in dispatch and memory traffic
than in arithmetic. :func:`laplacian_mix_train` computes the same function with the same gradients:

* forward: :func:`.library.laplacian_mix`'s C call (pooling, kernels, Newton–Schulz,
  injective map, local conv, heads merged), which also keeps each slice's ``C_q``, ``C_k`` and ``M``;
* backward: one work item per (batch, head) slice re-reads ``q, k, v`` from the saved ``qkv`` output,
  recomputes the normaliser's ``m×m`` / ``N×m`` intermediates and applies, in order, the injective map's
  backward (the formulas of :func:`vitmix.ops.nystrom._injective_bwd`), the implicit Newton–Schulz
  backward ``dW = -Mᵀ dM Mᵀ`` (:mod:`vitmix.ops.newton`), the L1 kernels' backward (``sign(0) = 0``, as the
  composed path's C kernel), the adjoint of the adaptive pooling and the conv's backward, and writes the
  gradient of the ``qkv`` output directly in its ``(B, N, 3C)`` layout.

:func:`soft_mix_train` does the same for SOFT and SOFT-Norm (:class:`vitmix.mixers.soft.SoftAttention`), from
``W_q x`` and ``W_v x``, with the landmark module's backward (GELU, LayerNorm, strided conv, pooling) in C;
its steps are listed at its C entry point (``vitmix_soft_mix_backward`` in ``csrc/landmark_layers_backward_typed.h``).

The composed path is the reference (tests compare the output and every gradient in float64 and
float32, and gradcheck the function); it runs wherever this does not apply (see the layer's
rule, :func:`.laplacian.supports` / :func:`.soft.supports`) or the library cannot be built.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import library as c

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
        lib = c.LAYERS_KERNEL.load()
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
    """:func:`.library.laplacian_mix` with gradients for ``y``, the conv's weight and bias and the mean
    weight (same arguments; ``mean_weight`` has shape ``(heads,)``), or ``None`` where the library is unavailable
    or m > 256 (the caller's composed path runs)."""
    if c.LAYERS_KERNEL.load() is None or landmarks[0] * landmarks[1] > c.MAX_LANDMARKS:
        return None
    cfg = dict(grid=tuple(grid), heads=int(heads), landmarks=tuple(landmarks), lam=float(lam), eps=float(eps),
               iters=int(iters), alpha=alpha, norm_eps=float(norm_eps), contrast=float(contrast))
    return _LaplacianMix.apply(y, conv_weight, conv_bias, mean_weight, cfg)


class _SoftMix(torch.autograd.Function):
    """``soft_mix`` with a C backward; the configuration travels as a dict (see :func:`soft_mix_train`)."""

    @staticmethod
    def forward(ctx, qp, vp, landmark_conv, norm_weight, norm_bias, conv_weight, cfg):
        vp_dtype = vp.dtype                 # the C call computes in qp's dtype; vp's gradient goes back in its own
        qp, vp = qp.contiguous(), vp.to(qp.dtype).contiguous()
        norm = None if landmark_conv is None else (norm_weight, norm_bias, cfg["norm_eps"])
        config = {key: value for key, value in cfg.items() if key != "norm_eps"}
        out, saved = c.soft_mix(qp, vp, landmark_conv, norm, conv_weight, save=True, **config)
        ctx.save_for_backward(qp, vp, landmark_conv, norm_weight, norm_bias, conv_weight, saved)
        ctx.cfg, ctx.vp_dtype = cfg, vp_dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        qp, vp, lm_conv, ln_w, ln_b, conv_w, saved = ctx.saved_tensors
        cfg = ctx.cfg
        prefix, h, w = cfg["grid"]
        heads, (mh, mw), stride = cfg["heads"], cfg["landmarks"], cfg["stride"]
        b, n, ch = qp.shape
        d, slices, dt = ch // heads, b * heads, qp.dtype
        g = g.to(dt).contiguous()

        def prepared(t):
            return None if t is None else t.detach().to(dt).contiguous()

        lm_w, ln_wt, ln_bt = prepared(lm_conv), prepared(ln_w), prepared(ln_b)
        ksize = 0 if conv_w is None else conv_w.shape[-1]
        cw = None if conv_w is None else conv_w.detach().reshape(heads, -1).to(dt).contiguous()
        dqp, dvp = torch.empty_like(qp), torch.empty_like(vp)
        conv_lm = lm_conv is not None
        dlmt = torch.zeros(slices, stride * stride * d * d, dtype=dt) if conv_lm else None
        dln_w = torch.zeros(slices, d, dtype=dt) if conv_lm else None
        dln_b = torch.zeros(slices, d, dtype=dt) if conv_lm else None
        dconv = torch.empty(slices, ksize * ksize, dtype=dt) if ksize else None
        m = mh * mw
        threads = c.slice_threads(slices, slices * 2 * n * m * (2 * d + m))
        lib = c.LAYERS_KERNEL.load()
        with torch.profiler.record_function("vitmix::soft_mix_backward (C)"):
            failed = getattr(lib, f"vitmix_soft_mix_backward_{c._SUFFIX[dt]}")(
                _ptr(qp), _ptr(vp), _ptr(lm_w), _ptr(ln_wt), _ptr(ln_bt), cfg["norm_eps"], _ptr(cw), _ptr(g),
                _ptr(saved), _ptr(dqp), _ptr(dvp), _ptr(dlmt), _ptr(dln_w), _ptr(dln_b), _ptr(dconv), b, n, prefix, h,
                w, heads, d, mh, mw, stride, int(cfg["pool_first"]), cfg["scale"], c._NORMS[cfg["normalization"]],
                ksize, threads)
        if failed:
            raise MemoryError(f"SOFT attention: the C backward could not allocate its buffers for {failed} slices")
        g_lm = g_lnw = g_lnb = g_conv = None
        if conv_lm:   # taps (s, s, d_in, d_out) summed over slices -> the conv's (d_out, d_in, s, s)
            taps = dlmt.sum(0).view(stride, stride, d, d).permute(3, 2, 0, 1)
            g_lm = taps.to(lm_conv.dtype).contiguous()
            g_lnw, g_lnb = dln_w.sum(0).to(ln_w.dtype), dln_b.sum(0).to(ln_b.dtype)
        if ksize:
            g_conv = dconv.view(b, heads, ksize * ksize).sum(0).view_as(conv_w).to(conv_w.dtype)   # B may be 0
        return dqp, dvp.to(ctx.vp_dtype), g_lm, g_lnw, g_lnb, g_conv, None


def soft_mix_train(qp: torch.Tensor, vp: torch.Tensor, landmark_conv: Optional[torch.Tensor],
                   landmark_norm: Optional[tuple], conv_weight: Optional[torch.Tensor], *, grid, heads: int, landmarks,
                   stride: int, pool_first: bool, scale: float, eps: float, iters: int, alpha: str,
                   normalization: Optional[str]) -> Optional[torch.Tensor]:
    """:func:`.library.soft_mix` with gradients for ``qp``, ``vp``, the landmark conv, the LayerNorm's
    weight and bias (``landmark_norm = (weight, bias, eps)``) and the local filter (same arguments), or ``None``
    where the library is unavailable or m > 256 (the caller's composed path runs)."""
    if c.LAYERS_KERNEL.load() is None or landmarks[0] * landmarks[1] > c.MAX_LANDMARKS:
        return None
    norm_w, norm_b, norm_eps = landmark_norm if landmark_conv is not None else (None, None, 0.0)
    cfg = dict(grid=tuple(grid), heads=int(heads), landmarks=tuple(landmarks), stride=int(stride),
               pool_first=bool(pool_first), scale=float(scale), eps=float(eps), iters=int(iters), alpha=alpha,
               normalization=normalization, norm_eps=float(norm_eps))
    return _SoftMix.apply(qp, vp, landmark_conv, norm_w, norm_b, conv_weight, cfg)


__all__ = ["laplacian_mix_train", "soft_mix_train"]
