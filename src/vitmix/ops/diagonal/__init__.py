"""Multi-diagonal sparse attention (Fibottention's token mixing), sparse and dense references.

Head ``h`` of a patch query ``j`` attends to the patch keys ``j ± d`` for ``d`` in the head's
offset set ``F_h`` (``d = 0`` is the query itself) and to every prefix (CLS/register) key; prefix
queries attend to all keys. Three implementations of that pattern:

- :func:`sparse_diagonal_attention` — the real thing: each query scores only its ``P + 2|F_h|``
  keys, O(N·|F|·d) time and memory, no ``N × N`` tensor in forward or backward. A fused custom
  autograd function saves only ``q, k, v``, the output and one log-sum-exp per row; backward
  recomputes the scores. Three backends: ``"c"`` — a small multithreaded C kernel compiled on first
  use with the system compiler (CPU, float32/float64), ``"triton"`` — Triton kernels (CUDA; CPU only
  under ``TRITON_INTERPRET=1``; float32/float16/bfloat16, head dim ≤ 256, see ``docs/gpu.md``), and
  ``"torch"`` — vectorised PyTorch, one ``index_select`` per offset slot, any device.
  ``backend="auto"`` picks ``"triton"`` for CUDA tensors when it can run, ``"c"`` on CPU when a compiler
  is available, else ``"torch"``.
- :func:`masked_diagonal_attention` — dense scores with ``-inf`` outside the pattern: the
  reference semantics (O(N²)).
- :func:`official_diagonal_attention` — the official Fibottention code's *multiplicative* mask:
  ``softmax((q kᵀ · scale) ⊙ Ω) v``; masked logits become 0, so masked keys keep weight
  ``e⁰ / Z``. Dense O(N²); only for reproducing the official numbers.

All three take ``q, k, v`` of shape ``(B, H, P + N, d)`` and per-head offsets (e.g. from
:func:`vitmix.ops.fibonacci.fibonacci_offsets`) or a :class:`DiagonalPlan`. A query without any
key (possible only with ``P = 0`` when a head's smallest offset exceeds ``N / 2``) outputs zeros in
``sparse`` and ``masked`` mode. Half-precision inputs are computed in float32 and cast back.

Layout: this module holds the public function, the backend choice, the autograd function and the
custom ops; ``plan.py`` the plan, checks and layout helpers every path shares; ``naive.py`` the dense
references; ``pytorch.py`` the PyTorch back end and the export decomposition; ``c.py`` the CPU C
kernel (source and binding); ``triton.py`` the Triton kernels.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._common import exporting_to_onnx, traced
from .._triton import wants_triton
from .c import _c_backward, _c_forward, _load_kernel, kernel_available
from .naive import masked_diagonal_attention, official_diagonal_attention
from .plan import (
    BACKENDS, DiagonalPlan, _check_qkv, _compute_dtype, _flat_plan, _flatten_offsets, _plan_for, _prefix_backward,
    _prefix_forward, _resolve_scale, _token_major, _traced_offsets, _unit_last, diagonal_plan,
)
from .pytorch import _diagonal_decomposition, _torch_backward, _torch_forward


__all__ = [
    "DiagonalPlan", "diagonal_plan", "sparse_diagonal_attention", "masked_diagonal_attention",
    "official_diagonal_attention", "kernel_available", "BACKENDS",
]


#: what the Triton kernels accept (anything else runs the PyTorch path with a one-time warning)
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_TRITON_MAX_HEAD_DIM = 256


def _diagonal_forward(q, k, v, plan, p, scale, engine):
    """``(out, lse, lse_pre)`` of ``engine`` (``"c"``, ``"triton"`` or ``"torch"``; ``lse_pre`` may be ``None``
    when ``p = 0``); the C and Triton kernels read strided q/k/v in place and return a token-major output."""
    if engine == "triton":
        from . import triton as diagonal_triton      # imports triton: only once Triton was chosen

        return diagonal_triton.diagonal_forward(_unit_last(q), _unit_last(k), _unit_last(v), plan, p, scale)
    if engine == "c":
        return _c_forward(_load_kernel(), _unit_last(q), _unit_last(k), _unit_last(v), plan, p, scale)
    out, lse = _torch_forward(q[:, :, p:], k, v, plan, p, scale)
    lse_pre = None
    if p:
        out_pre, lse_pre = _prefix_forward(q, k, v, p, scale)
        out = torch.cat([out_pre, out], dim=2)
    return out, lse, lse_pre


def _diagonal_backward(dout, q, k, v, out, lse, lse_pre, plan, p, scale, engine, like_inputs=True):
    if engine == "triton":
        from . import triton as diagonal_triton

        return diagonal_triton.diagonal_backward(_unit_last(dout), q, k, v, out, lse, lse_pre, plan, p, scale)
    if engine == "c":
        return _c_backward(_load_kernel(), q, k, v, out, lse, lse_pre, _unit_last(dout), plan, p, scale,
                           like_inputs)
    dq, dk, dv = _torch_backward(q[:, :, p:], k, v, out[:, :, p:], lse, dout[:, :, p:], plan, p, scale)
    if p:
        wpre, dspre = _prefix_backward(q, k, v, out, dout, lse_pre, p, scale)
        dq = torch.cat([(dspre @ k) * scale, dq], dim=2)
        dk = dk + (dspre.transpose(-1, -2) @ q[:, :, :p]) * scale
        dv = dv + wpre.transpose(-1, -2) @ dout[:, :, :p]
    return dq, dk, dv


class _DiagonalAttention(torch.autograd.Function):
    """Multi-diagonal attention over the full sequence (eager calls). Saves q, k, v, out and one
    log-sum-exp per row (all O(T·d)); backward recomputes the scores. The C and Triton backends read
    strided q/k/v in place and return token-major outputs, so the mixer's head merge is free."""

    @staticmethod
    def forward(ctx, q, k, v, plan, p, scale, engine):
        if engine != "torch":
            q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        out, lse, lse_pre = _diagonal_forward(q, k, v, plan, p, scale, engine)
        ctx.save_for_backward(q, k, v, out, lse, lse_pre)
        ctx.plan, ctx.p, ctx.scale, ctx.engine = plan, p, scale, engine
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, lse_pre = ctx.saved_tensors
        dq, dk, dv = _diagonal_backward(dout, q, k, v, out, lse, lse_pre, ctx.plan, ctx.p, ctx.scale, ctx.engine)
        return dq, dk, dv, None, None, None, None


def _op_setup(q, k, v, offsets, offset_counts, p, backend):
    """The engine (``"c"``, ``"triton"`` or ``"torch"``) and the cached plan of one op call."""
    engine = _engine(q, k, v, backend)
    return engine, _flat_plan(tuple(offsets), tuple(offset_counts), q.shape[2] - p,
                              "cpu" if engine == "c" else str(q.device))


def _as_token_major(t: torch.Tensor) -> torch.Tensor:
    b, h, n, d = t.shape
    return t if t.transpose(1, 2).is_contiguous() else _token_major(b, h, n, d, t).copy_(t)


@torch.library.custom_op("vitmix::sparse_diagonal_attention", mutates_args=())
def _diagonal_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: List[int], offset_counts: List[int],
                 num_prefix_tokens: int, scale: float, backend: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, lse_pre)`` of :func:`sparse_diagonal_attention` for float32/float64 ``q, k, v``."""
    p = num_prefix_tokens
    engine, plan = _op_setup(q, k, v, offsets, offset_counts, p, backend)
    out, lse, lse_pre = _diagonal_forward(q, k, v, plan, p, scale, engine)
    if lse_pre is None:
        lse_pre = q.new_empty(q.shape[0], q.shape[1], 0)
    return _as_token_major(out), lse.contiguous(), lse_pre.contiguous()


@torch.library.custom_op("vitmix::sparse_diagonal_attention_backward", mutates_args=())
def _diagonal_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, lse_pre: torch.Tensor, offsets: List[int], offset_counts: List[int],
                          num_prefix_tokens: int, scale: float,
                          backend: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`_diagonal_op` from ``dout`` and its saved inputs and outputs."""
    p = num_prefix_tokens
    engine, plan = _op_setup(q, k, v, offsets, offset_counts, p, backend)
    grads = _diagonal_backward(dout, q, k, v, out, lse, lse_pre, plan, p, scale, engine, like_inputs=False)
    return tuple(_as_token_major(g) for g in grads)


@_diagonal_op.register_fake
def _(q, k, v, offsets, offset_counts, num_prefix_tokens, scale, backend):
    b, h, t, d = q.shape
    p = num_prefix_tokens
    return _token_major(b, h, t, d, q), q.new_empty(b, h, t - p), q.new_empty(b, h, p)


@_diagonal_backward_op.register_fake
def _(dout, q, k, v, out, lse, lse_pre, offsets, offset_counts, num_prefix_tokens, scale, backend):
    b, h, t, d = q.shape
    return tuple(_token_major(b, h, t, d, q) for _ in range(3))


def _diagonal_op_setup(ctx, inputs, output):
    q, k, v, offsets, offset_counts, p, scale, backend = inputs
    out, lse, lse_pre = output
    ctx.mark_non_differentiable(lse, lse_pre)
    ctx.save_for_backward(q, k, v, out, lse, lse_pre)
    ctx.static = (offsets, offset_counts, p, scale, backend)


def _diagonal_op_grad(ctx, dout, _dlse, _dlse_pre):
    q, k, v, out, lse, lse_pre = ctx.saved_tensors
    dq, dk, dv = _diagonal_backward_op(dout, q, k, v, out, lse, lse_pre, *ctx.static)
    return dq, dk, dv, None, None, None, None, None


_diagonal_op.register_autograd(_diagonal_op_grad, setup_context=_diagonal_op_setup)


def sparse_diagonal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_prefix_tokens: int = 0,
                              scale: Optional[float] = None, backend: str = "auto") -> torch.Tensor:
    """Multi-diagonal attention computed sparsely: O(N·|F|·d) time and memory, forward and backward.

    Args:
        q, k, v: ``(B, H, P + N, d)``; the first ``P`` tokens are prefix (CLS/register) tokens.
        offsets: ``H`` offset sets (patch query ``j`` of head ``h`` sees patch keys ``j ± d``,
            ``d ∈ offsets[h]``; ``0`` means the query itself) or a :class:`DiagonalPlan`.
        num_prefix_tokens: ``P``; prefix queries attend to all keys (dense, ``O(P·T·d)``) and every
            query attends to the prefix keys.
        scale: logit scale, default ``d ** -0.5``.
        backend: ``"auto"`` | ``"c"`` | ``"torch"`` | ``"triton"`` (see the module docstring). ``"c"``
            raises ``ValueError`` when the kernel is unavailable or the input is not on the CPU;
            ``"triton"`` runs the PyTorch path with a one-time warning naming the reason when it cannot run.

    Returns:
        ``(B, H, P + N, d)`` in the dtype of ``q`` (half precision is computed in float32). With the C
        and Triton backends this is a view of a token-major ``(B, P + N, H, d)`` buffer
        (``out.transpose(1, 2)`` is contiguous), so merging heads costs no copy.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    _check_qkv(q, k, v, q.shape[1] if q.dim() == 4 else -1, num_prefix_tokens)
    p = num_prefix_tokens
    scale = _resolve_scale(scale, q.shape[-1])
    dtype = _compute_dtype(q)
    onnx = exporting_to_onnx()
    if traced() or onnx:
        if backend == "c" and q.device.type != "cpu":
            raise ValueError(_C_ON_CPU_ONLY)
        flat, counts = _flatten_offsets(_traced_offsets(offsets, q, p))
        op = _diagonal_decomposition if onnx else _diagonal_op      # ONNX has no translation of the custom op
        return op(q.to(dtype), k.to(dtype), v.to(dtype), flat, counts, p, scale, backend)[0].to(q.dtype)
    plan = _plan_for(offsets, q, p)
    engine = _engine(q, k, v, backend)
    # the Triton kernels read half precision as is (computing in float32): no upcast copies
    qc, kc, vc = (q, k, v) if engine == "triton" else (q.to(dtype), k.to(dtype), v.to(dtype))
    out = _DiagonalAttention.apply(qc, kc, vc, plan.to("cpu") if engine == "c" else plan, p, scale, engine)
    return out.to(q.dtype)


_C_ON_CPU_ONLY = "backend='c' runs on CPU tensors only; use backend='torch' (or 'auto') on this device"


def _backend_uses_c(device: torch.device, backend: str) -> bool:
    """Whether ``backend`` runs the C kernel on ``device`` (``ValueError`` for an impossible ``"c"``)."""
    on_cpu = torch.device(device).type == "cpu"
    if backend == "c":
        if not on_cpu:
            raise ValueError(_C_ON_CPU_ONLY)
        if _load_kernel() is None:
            raise ValueError("backend='c' needs a working C compiler (cc/gcc/clang, or CC=...); use backend='torch'")
    return on_cpu and backend in ("auto", "c") and _load_kernel() is not None


def _triton_unsupported(q, k, v) -> Optional[str]:
    """Why the Triton kernels cannot take ``q, k, v``, or ``None`` when they can."""
    for t in (q, k, v):
        if t.dtype not in _TRITON_DTYPES:
            return f"dtype {t.dtype} (supported: float32, float16, bfloat16)"
    if q.shape[-1] > _TRITON_MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} (supported: up to {_TRITON_MAX_HEAD_DIM})"
    if q.shape[0] * q.shape[1] > 65535:  # the second launch-grid axis of a CUDA kernel
        return f"batch·heads = {q.shape[0] * q.shape[1]} (supported: up to 65535)"
    return None


def _engine(q, k, v, backend: str) -> str:
    """``"triton"``, ``"c"`` or ``"torch"``: what ``backend`` runs on ``q, k, v`` (``"triton"`` asked for but
    impossible warns once and runs ``"torch"``; an impossible ``"c"`` raises ``ValueError``)."""
    if backend in ("auto", "triton") and wants_triton("sparse_diagonal_attention", q, backend,
                                                      _triton_unsupported(q, k, v)):
        return "triton"
    if backend == "triton":
        return "torch"
    return "c" if _backend_uses_c(q.device, backend) else "torch"
