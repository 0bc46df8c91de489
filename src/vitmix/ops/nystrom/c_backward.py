"""The C source of the training backwards of LaplacianFormer's and SOFT's layers (private; bound by :mod:`.c_grad`).

Appended to :mod:`.c`'s source (one library: it calls that file's static helpers, ``gemm``, the kernel
matrix, pooling, gathering) and instantiated for float32 and float64 the same way. One work item per
(batch, head) slice; what each step computes is documented in :mod:`.c_grad`.
"""
from __future__ import annotations

#: the exported backwards (``csrc/nystrom.h``), for float32 and float64 (``_f32``/``_f64``)
PROTOTYPES = (
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


__all__ = ["PROTOTYPES"]
