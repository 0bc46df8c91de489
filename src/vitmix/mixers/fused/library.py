"""The landmark layers' C library (``csrc/landmark_layers.c``) and its forward calls (private).

:func:`laplacian_mix` and :func:`soft_mix` are LaplacianFormer's and SOFT's whole token mixing for one layer
(the heads' gather from the projections, the landmark module, the Nyström product of
:mod:`vitmix.ops.nystrom`'s C core, the local conv, the head merge) in one call; :mod:`.autograd` pairs them
with the C backwards. The library is built from this package's ``csrc`` and the shared headers of
``vitmix/ops/csrc`` (the Nyström core and Newton–Schulz are the same code as :mod:`vitmix.ops.nystrom.c`'s).
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

import torch

from ...ops._cbuild import CSRC, CKernel
from ...ops.newton.c import _RULES
from ...ops.nystrom.c import _NORMS, _SUFFIX, MAX_LANDMARKS, slice_threads

#: the exported functions (``csrc/landmark_layers.h``), for float32 and float64 (``_f32``/``_f64``)
PROTOTYPES = (
    "int64_t vitmix_laplacian_mix(const TYPE *y, const TYPE *conv_w, const TYPE *conv_b, TYPE *out, "
    "int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, "
    "int64_t mw, TYPE scale, TYPE eps, int64_t iters, int rule, TYPE norm_eps, TYPE contrast, "
    "const TYPE *mean_w, int64_t ksize, TYPE *save, int nthreads)",
    "int64_t vitmix_soft_mix(const TYPE *qp, const TYPE *vp, const TYPE *lm_w, const TYPE *ln_w, "
    "const TYPE *ln_b, TYPE ln_eps, const TYPE *conv_w, TYPE *out, int64_t B, int64_t n, int64_t prefix, "
    "int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw, int64_t s, int pool_first, "
    "TYPE scale, TYPE eps, int64_t iters, int rule, int norm, int64_t ksize, TYPE *save, int nthreads)",
    "int64_t vitmix_laplacian_mix_backward(const TYPE *y, const TYPE *gout, const TYPE *conv_w, "
    "const TYPE *mean_w, const TYPE *saved, TYPE *dy, TYPE *dconv_w, TYPE *dconv_b, TYPE *dmean, "
    "int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, "
    "int64_t mw, TYPE scale, TYPE norm_eps, TYPE contrast, int64_t ksize, int nthreads)",
    "int64_t vitmix_soft_mix_backward(const TYPE *qp, const TYPE *vp, const TYPE *lm_w, "
    "const TYPE *ln_w, const TYPE *ln_b, TYPE ln_eps, const TYPE *conv_w, const TYPE *gout, "
    "const TYPE *saved, TYPE *dqp, TYPE *dvp, TYPE *dlmt, TYPE *dln_w, TYPE *dln_b, TYPE *dconv_w, "
    "int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, "
    "int64_t mw, int64_t s, int pool_first, TYPE scale, int norm, int64_t ksize, int nthreads)",
)

#: the landmark layers' C library, built on first use from ``csrc/landmark_layers.c`` (see :mod:`vitmix.ops._cbuild`)
LAYERS_KERNEL = CKernel("landmark_layers", "landmark_layers.c", PROTOTYPES,
                        folder=os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc"), include_dirs=(CSRC,))


def laplacian_mix(y: torch.Tensor, conv_weight: Optional[torch.Tensor], conv_bias: Optional[torch.Tensor], *,
                  grid, heads: int, landmarks, lam: float, eps: float, iters: int, alpha: str, norm_eps: float,
                  contrast: float, mean_weight: Optional[torch.Tensor] = None, save: bool = False):
    """LaplacianFormer's token mixing for inference from its fused ``qkv`` output ``y (B, N, 3C)``, in one C
    call: adaptive-pooled landmarks of the grid queries and keys, the untied Laplacian kernels
    (``exp(-|q - k|₁ / lam)``), Newton–Schulz (``alpha``: ``"transpose"`` or ``"official"``), the injective map
    whose whitened part is multiplied by ``contrast`` and whose ``mean(V)`` term by ``mean_weight (heads,)``
    (``None``: 1), and the depthwise conv of the grid values (``conv_weight
    (C, 1, k, k)``, ``conv_bias (C,)``; ``None``: no conv). Returns ``(B, N, C)`` with the heads merged (the input
    of the output projection), or ``None`` when the library is unavailable or m > 256.
    :func:`.laplacian.supports` says where this is the layer's own computation (the tests compare it with the
    composed path). ``save=True`` (the training forward of :mod:`.autograd`; library loaded, m checked)
    returns ``(out, saved)`` with each slice's ``C_q``, ``C_k`` and ``M`` for the C backward."""
    lib = LAYERS_KERNEL.load()
    if lib is None or landmarks[0] * landmarks[1] > MAX_LANDMARKS:
        return None
    prefix, h, w = grid
    b, n, c3 = y.shape
    c, (mh, mw) = c3 // 3, landmarks
    y = y.contiguous()
    out = torch.empty(b, n, c, dtype=y.dtype)
    ksize = 0 if conv_weight is None else conv_weight.shape[-1]
    wt = conv_weight.reshape(c, -1).to(y.dtype).contiguous() if conv_weight is not None else None
    bias = conv_bias.to(y.dtype).contiguous() if conv_bias is not None and conv_weight is not None else None
    mean_w = mean_weight.to(y.dtype).contiguous() if mean_weight is not None else None
    d, m = c // heads, mh * mw
    threads = slice_threads(b * heads, b * heads * 2 * n * m * (2 * d + m))
    saved = torch.empty(b * heads, 2 * n * m + m * m, dtype=y.dtype) if save else None
    with torch.profiler.record_function("vitmix::laplacian_mix (C)"):
        failed = getattr(lib, f"vitmix_laplacian_mix_{_SUFFIX[y.dtype]}")(
            ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(None if wt is None else wt.data_ptr()),
            ctypes.c_void_p(None if bias is None else bias.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            b, n, prefix, h, w, heads, d, mh, mw, 1.0 / lam, eps, iters,
            _RULES["official" if alpha == "official" else None], norm_eps, contrast,
            ctypes.c_void_p(None if mean_w is None else mean_w.data_ptr()), ksize,
            ctypes.c_void_p(None if saved is None else saved.data_ptr()), threads)
    if failed:
        raise MemoryError(f"laplacian attention: the C forward could not allocate its buffers for {failed} slices")
    return (out, saved) if save else out


def soft_mix(qp: torch.Tensor, vp: torch.Tensor, landmark_conv: Optional[torch.Tensor], landmark_norm,
             conv_weight: Optional[torch.Tensor], *, grid, heads: int, landmarks, stride: int, pool_first: bool,
             scale: float, eps: float, iters: int, alpha: str, normalization: Optional[str], save: bool = False):
    """SOFT's token mixing from its projections ``qp = W_q x`` and ``vp = W_v x`` (``(B, N, C)``) in one C call:
    queries ``scale · qp``; landmarks by the strided conv ``landmark_conv (d, d, s, s)``, then LayerNorm(d) with
    ``landmark_norm = (weight, bias, eps)`` and GELU (``landmark_conv=None``: window means), the tied Gaussian
    kernels, Newton–Schulz (``alpha``; the symmetric start), ``normalization`` ``None`` or ``"soft_norm"``, and the
    per-head filter ``conv_weight (heads, 1, k, k)`` on the grid values. Returns ``(B, N, C)`` with the heads
    merged, or ``None`` when the library is unavailable or m > 256. ``save=True`` (the training forward of
    :mod:`.autograd`; library loaded, m checked) returns ``(out, saved)`` with each slice's ``C_q``, ``M`` and
    landmarks before the LayerNorm for the C backward."""
    lib = LAYERS_KERNEL.load()
    if lib is None or landmarks[0] * landmarks[1] > MAX_LANDMARKS:
        return None
    prefix, h, w = grid
    b, n, c = qp.shape
    (mh, mw), d = landmarks, c // heads
    dt = qp.dtype
    qp, vp = qp.contiguous(), vp.to(dt).contiguous()
    out = torch.empty(b, n, c, dtype=dt)
    lm_w = None if landmark_conv is None else landmark_conv.to(dt).contiguous()
    ln_w = ln_b = None
    ln_eps = 0.0
    if lm_w is not None:
        ln_w, ln_b, ln_eps = landmark_norm
        ln_w, ln_b = ln_w.to(dt).contiguous(), ln_b.to(dt).contiguous()
    ksize = 0 if conv_weight is None else conv_weight.shape[-1]
    cw = None if conv_weight is None else conv_weight.reshape(heads, -1).to(dt).contiguous()
    m = mh * mw
    threads = slice_threads(b * heads, b * heads * n * m * (2 * d + m))
    saved = torch.empty(b * heads, n * m + m * m + m * d, dtype=dt) if save else None
    ptr = [ctypes.c_void_p(None if t is None else t.data_ptr()) for t in (qp, vp, lm_w, ln_w, ln_b)]
    with torch.profiler.record_function("vitmix::soft_mix (C)"):
        failed = getattr(lib, f"vitmix_soft_mix_{_SUFFIX[dt]}")(
            *ptr, ln_eps, ctypes.c_void_p(None if cw is None else cw.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            b, n, prefix, h, w, heads, d, mh, mw, stride, int(pool_first), scale, eps, iters,
            _RULES["official" if alpha == "official" else True], _NORMS[normalization], ksize,
            ctypes.c_void_p(None if saved is None else saved.data_ptr()), threads)
    if failed:
        raise MemoryError(f"SOFT attention: the C forward could not allocate its buffers for {failed} slices")
    return (out, saved) if save else out


__all__ = ["LAYERS_KERNEL", "MAX_LANDMARKS", "PROTOTYPES", "laplacian_mix", "soft_mix", "slice_threads"]
