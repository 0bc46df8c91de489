"""L1 (Manhattan) distance and its backward, the hot loops of the Laplacian kernel (private).

Two back ends compute the same numbers:

* ``eager``: ``torch.cdist(p=1)`` forward (a loop over pairs, no N×M×d tensor) and a backward that
  walks over row chunks of ``x`` so that the ``sign`` tensor of one chunk stays below
  ``_CHUNK_ELEMENTS`` elements. Works on every device and dtype.
* ``compiled`` (CPU, float32/float64, large problems): the same expressions handed to
  ``torch.compile`` (TorchInductor generates one fused C++/OpenMP loop per function, so neither the
  ``|x - y|`` nor the ``sign`` tensor is ever materialised). Backward computes ``grad_x`` and
  ``grad_y`` from one pass over the (query, landmark, channel) triples. Used when the problem has
  at least ``_COMPILE_MIN_ELEMENTS`` (N·M·d·batch) triples, when ``torch.compile`` works on this
  machine (a C++ compiler is needed) and when ``VITMIX_DISABLE_COMPILE`` is not set; any failure
  falls back to ``eager`` for the rest of the process, with one warning.

Gradients use ``sign(0) = 0`` (the subgradient the official CUDA operator uses).
"""
from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

_CHUNK_ELEMENTS = 1 << 20          # eager backward: elements of one sign-chunk (4 MiB in float32)
_COMPILE_MIN_ELEMENTS = 1 << 22    # below this many N·M·d triples the eager path is fast enough
_ROW_BLOCK = 128                   # compiled backward: rows per partial sum of grad_y

_compiled = {}
_compile_broken: Optional[str] = None


def _dist_fn(x: torch.Tensor, y: torch.Tensor, neg_inv_lam: float) -> torch.Tensor:
    # x (B, N, d), y (B, M, d) -> exp(-sum|x - y| / lam) (B, N, M); fused by inductor.
    d = (x.unsqueeze(2) - y.unsqueeze(1)).abs().sum(-1)
    return torch.exp(d * neg_inv_lam)


def _plain_dist_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.unsqueeze(2) - y.unsqueeze(1)).abs().sum(-1)


def _bwd_fn(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    # g (B, N, M) with N a multiple of _ROW_BLOCK, x (B, N, d), y (B, M, d).
    # grad_x[n, c] = sum_m g[n, m] sign(x[n, c] - y[m, c]);  grad_y[m, c] = -sum_n (same terms).
    b, n, d = x.shape
    m = y.shape[1]
    x5 = x.view(b, n // _ROW_BLOCK, _ROW_BLOCK, 1, d)
    g5 = g.view(b, n // _ROW_BLOCK, _ROW_BLOCK, m, 1)
    y5 = y.view(b, 1, 1, m, d)
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    w = torch.where(x5 > y5, g5, torch.where(x5 < y5, -g5, zero))
    gx = w.sum(3).view(b, n, d)
    gy = -w.sum(2).sum(1)
    return gx, gy


_BASE_FNS = {"dist_exp": _dist_fn, "dist": _plain_dist_fn, "bwd": _bwd_fn}


def get_compiled(name: str, base=None):
    """``torch.compile(base, dynamic=True)``, built once per name (``base`` defaults to the L1 loops)."""
    fn = _compiled.get(name)
    if fn is None:
        fn = torch.compile(base if base is not None else _BASE_FNS[name], dynamic=True, fullgraph=True)
        _compiled[name] = fn
    return fn


_get_compiled = get_compiled


def compile_ok(t: torch.Tensor, work: int) -> bool:
    """Whether to run a fused ``torch.compile`` loop for a problem of ``work`` elementary steps on ``t``'s device."""
    if _compile_broken is not None or os.environ.get("VITMIX_DISABLE_COMPILE"):
        return False
    if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64):
        return False
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        # inside an outer torch.compile the eager code is traced anyway; under a dispatch mode
        # (MemTracker, FlopCounterMode, ...) inductor refuses to run
        return False
    return work >= _COMPILE_MIN_ELEMENTS


def _use_compiled(x: torch.Tensor, y: torch.Tensor) -> bool:
    batch = x.numel() // max(x.shape[-1] * x.shape[-2], 1)
    return compile_ok(x, batch * x.shape[-2] * y.shape[-2] * x.shape[-1])


def disable_compile(err: BaseException) -> None:
    _disable_compile(err)


def _disable_compile(err: BaseException) -> None:
    global _compile_broken
    _compile_broken = f"{type(err).__name__}: {err}"
    warnings.warn(
        "vitmix: torch.compile of the L1-distance kernels failed, falling back to the slower eager "
        f"path ({_compile_broken[:300]}). Set VITMIX_DISABLE_COMPILE=1 to silence this.",
        RuntimeWarning,
        stacklevel=3,
    )


def _flat3(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def laplace_forward(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """exp(-||x_i - y_j||_1 / lam) without autograd; x (..., N, d), y (..., M, d) same batch shape."""
    if _use_compiled(x, y):
        try:
            out = _get_compiled("dist_exp")(_flat3(x), _flat3(y), -1.0 / lam)
            return out.view(*x.shape[:-1], y.shape[-2])
        except Exception as err:  # pragma: no cover - depends on the machine's compiler
            _disable_compile(err)
    d = torch.cdist(x, y, p=1.0)
    return d.mul_(-1.0 / lam).exp_()


def l1_backward(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``sum_ij g_ij * ||x_i - y_j||_1`` w.r.t. x and y (sign(0) = 0), memory O(chunk)."""
    batch_shape = x.shape[:-2]
    n, d = x.shape[-2:]
    m = y.shape[-2]
    gf, xf, yf = _flat3(g), _flat3(x), _flat3(y)
    if _use_compiled(x, y):
        try:
            pad = (-n) % _ROW_BLOCK
            if pad:
                # zero weights for the padded rows: they add nothing to grad_y
                gf = torch.nn.functional.pad(gf, (0, 0, 0, pad))
                xf = torch.nn.functional.pad(xf, (0, 0, 0, pad))
            gx, gy = _get_compiled("bwd")(gf, xf, yf)
            return gx[:, :n].reshape(*batch_shape, n, d), gy.reshape(*batch_shape, m, d)
        except Exception as err:  # pragma: no cover - depends on the machine's compiler
            _disable_compile(err)
    b = xf.shape[0]
    gx = torch.empty_like(xf)
    gy = torch.zeros_like(yf)
    rows = max(1, _CHUNK_ELEMENTS // max(b * m * d, 1))
    for s in range(0, n, rows):
        xs = xf[:, s:s + rows]
        sgn = torch.sign(xs.unsqueeze(2) - yf.unsqueeze(1))       # (b, rows, m, d)
        sgn.mul_(gf[:, s:s + rows].unsqueeze(-1))
        gx[:, s:s + rows] = sgn.sum(2)
        gy -= sgn.sum(1)
    return gx.reshape(*batch_shape, n, d), gy.reshape(*batch_shape, m, d)
