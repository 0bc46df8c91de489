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
"""
from __future__ import annotations

import ctypes
import functools
from math import inf
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ._cbuild import CKernel
from ._common import exporting_to_onnx, real_tensors, traced
from ._triton import wants_triton
from .fibonacci import check_offsets, offsets_mask

__all__ = [
    "DiagonalPlan", "diagonal_plan", "sparse_diagonal_attention", "masked_diagonal_attention",
    "official_diagonal_attention", "kernel_available", "BACKENDS",
]

#: values accepted by ``sparse_diagonal_attention(backend=...)``
BACKENDS = ("auto", "c", "torch", "triton")

#: what the Triton kernels accept (anything else runs the PyTorch path with a one-time warning)
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TRITON_MAX_HEAD_DIM = 256


# --------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True, eq=False)
class DiagonalPlan:
    """Per-head signed key shifts for ``num_tokens`` patch tokens, padded to a common slot count.

    Attributes:
        offsets: the validated per-head offset sets (non-negative).
        num_tokens: patch tokens ``N``.
        shifts: ``(H, M)`` int64, slot ``m`` of head ``h`` scores key ``j + shifts[h, m]``
            (``-d`` and ``+d`` for each offset ``d > 0``, ``0`` once for ``d = 0``); padded slots
            hold 0 and lie beyond ``counts[h]``.
        counts: ``(H,)`` int64, the number of real slots of each head.
        has_empty_rows: some patch query has no patch key (matters only without prefix tokens).
    """

    offsets: Tuple[Tuple[int, ...], ...]
    num_tokens: int
    shifts: torch.Tensor
    counts: torch.Tensor
    has_empty_rows: bool

    @property
    def num_heads(self) -> int:
        return len(self.offsets)

    @property
    def max_slots(self) -> int:
        return int(self.shifts.shape[1])

    def to(self, device) -> "DiagonalPlan":
        """This plan with its index tensors on ``device``."""
        return DiagonalPlan(self.offsets, self.num_tokens, self.shifts.to(device), self.counts.to(device),
                            self.has_empty_rows)


def _signed_shifts(offsets: Sequence[Sequence[int]]) -> List[List[int]]:
    """Per head, the sorted signed key shifts of sorted unique offsets: ``-d`` and ``+d`` for ``d > 0``,
    ``0`` once for ``d = 0`` (plain Python, so tracing code can compute it too)."""
    return [[-d for d in reversed(offs) if d > 0] + [0] * (0 in offs) + [d for d in offs if d > 0]
            for offs in offsets]


def _build_plan(offsets: Tuple[Tuple[int, ...], ...], num_tokens: int, device) -> DiagonalPlan:
    signed = _signed_shifts(offsets)
    m = max(len(s) for s in signed)
    with real_tensors():        # cached by _plan_cached: never fake, not even while exporting
        shifts = torch.tensor([s + [0] * (m - len(s)) for s in signed], dtype=torch.int64, device=device)
        counts = torch.tensor([len(s) for s in signed], dtype=torch.int64, device=device)
    # query j has no key iff every offset d has j - d < 0 and j + d >= N (and d != 0): the smallest
    # offset decides, rows j in [N - d_min, d_min) are empty when 2 * d_min > N.
    empty = any(min(offs) > 0 and 2 * min(offs) > num_tokens for offs in offsets)
    return DiagonalPlan(offsets, num_tokens, shifts, counts, empty)


@functools.lru_cache(maxsize=256)
def _plan_cached(offsets: Tuple[Tuple[int, ...], ...], num_tokens: int, device: str) -> DiagonalPlan:
    return _build_plan(offsets, num_tokens, device)


def diagonal_plan(offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_tokens: int,
                  device: Union[str, torch.device, None] = None) -> DiagonalPlan:
    """Validated, cached :class:`DiagonalPlan` of ``offsets`` for ``num_tokens`` patch tokens."""
    if isinstance(offsets, DiagonalPlan):
        if offsets.num_tokens != num_tokens:
            raise ValueError(f"the plan was built for N={offsets.num_tokens} patch tokens, "
                             f"the input has N={num_tokens}")
        return offsets.to(device) if device is not None and offsets.shifts.device != torch.device(device) else offsets
    checked = tuple(check_offsets(offsets, num_tokens))
    return _plan_cached(checked, int(num_tokens), str(torch.device(device or "cpu")))


def _check_qkv(q, k, v, num_heads: int, num_prefix_tokens: int) -> Tuple[int, int]:
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise ValueError(f"q, k, v must be (B, H, T, d); got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] != num_heads:
        raise ValueError(f"q has {q.shape[1]} heads but {num_heads} offset sets were given (one per head)")
    if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    t = q.shape[2]
    if num_prefix_tokens >= t:
        raise ValueError(
            f"num_prefix_tokens={num_prefix_tokens} leaves no patch tokens in a sequence of T={t} tokens; "
            f"the prefix (CLS/register) count must be smaller than the sequence length"
        )
    return t, t - num_prefix_tokens


def _plan_for(offsets, q, num_prefix_tokens) -> DiagonalPlan:
    heads = offsets.num_heads if isinstance(offsets, DiagonalPlan) else len(offsets)
    _, n = _check_qkv_shape_only(q, num_prefix_tokens)
    if heads != q.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads but {heads} offset sets were given (one per head)")
    return diagonal_plan(offsets, n, q.device)


def _check_qkv_shape_only(q, num_prefix_tokens):
    if q.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, T, d); got q of shape {tuple(q.shape)}")
    if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    t = q.shape[2]
    if num_prefix_tokens >= t:
        raise ValueError(
            f"num_prefix_tokens={num_prefix_tokens} leaves no patch tokens in a sequence of T={t} tokens; "
            f"the prefix (CLS/register) count must be smaller than the sequence length"
        )
    return t, t - num_prefix_tokens


# ------------------------------------------------------------------------------------- C kernel
def _diagonal_source() -> str:
    from ._diagonal_kernel import SOURCE

    return SOURCE


def _declare(lib) -> None:
    p, i64, dbl, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    for sfx in ("f32", "f64"):
        for step in ("fwd", "bwd"):
            fn = getattr(lib, f"vitmix_diag_{step}_{sfx}")
            fn.argtypes = [p] * 4 + [i64] * 6 + [dbl, cint]
            fn.restype = None


#: the compiled C kernel, built on first use (see :mod:`vitmix.ops._cbuild`)
_DIAGONAL = CKernel("diagonal_kernel", _diagonal_source, _declare)


def _load_kernel():
    return _DIAGONAL.load()


def kernel_available() -> bool:
    """True when the C backend can be used (a C compiler worked, or the library was cached)."""
    return _load_kernel() is not None


_N_VIEWS = 8  # q, k, v, out, dout, dq, dk, dv (then lse, a_buf, ds_buf, wpre, dspre, lse_pre)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension is contiguous (any other strides are fine), else a copy."""
    return t if t.stride(-1) == 1 and t.shape[-1] > 0 else t.contiguous()


def _token_major(b, h, t, d, like):
    """An uninitialised ``(B, H, T, D)`` view of a token-major ``(B, T, H, D)`` buffer."""
    return like.new_empty(b, t, h, d).permute(0, 2, 1, 3)


def _c_call(fn, views, extras, plan, b, h, n, p, d, scale):
    ptrs = (ctypes.c_void_p * (_N_VIEWS + 6))()
    strides = (ctypes.c_int64 * (3 * _N_VIEWS))()
    for i, t in enumerate(views):
        if t is not None:
            ptrs[i] = t.data_ptr()
            strides[3 * i: 3 * i + 3] = list(t.stride()[:3])
    for i, t in enumerate(extras):
        if t is not None:
            ptrs[_N_VIEWS + i] = t.data_ptr()
    fn(ptrs, strides, plan.shifts.data_ptr(), plan.counts.data_ptr(), b, h, n, p, plan.max_slots, d, float(scale),
       torch.get_num_threads())


def _c_forward(lib, q, k, v, plan, p, scale):
    """Output (a token-major ``(B, H, T, D)`` view) and the log-sum-exp of the patch and prefix rows."""
    b, h, t, d = q.shape
    n = t - p
    out = _token_major(b, h, t, d, q)
    lse = q.new_empty(b, h, n)
    lse_pre = q.new_empty(b, h, p)
    fn = lib.vitmix_diag_fwd_f32 if q.dtype == torch.float32 else lib.vitmix_diag_fwd_f64
    _c_call(fn, (q, k, v, out, None, None, None, None), (lse, None, None, None, None, lse_pre), plan, b, h, n, p, d,
            scale)
    return out, lse, lse_pre


def _c_backward(lib, q, k, v, out, lse, lse_pre, dout, plan, p, scale, like_inputs=True):
    """``dq, dk, dv``, all computed by the kernel. ``like_inputs``: each gradient in the layout of its
    input when that is contiguous (cheap accumulation into ``.grad``), else token-major (inputs that
    are views of a qkv projection); ``False``: all token-major (the custom op's fixed layout)."""
    b, h, t, d = q.shape
    n = t - p
    dq, dk, dv = (torch.empty_like(x) if like_inputs and x.is_contiguous() else _token_major(b, h, t, d, q)
                  for x in (q, k, v))
    a_buf = q.new_empty(b, h, n, p + plan.max_slots)
    ds_buf = q.new_empty(b, h, n, p + plan.max_slots)
    wpre = q.new_empty(b, h, p, t)
    dspre = q.new_empty(b, h, p, t)
    fn = lib.vitmix_diag_bwd_f32 if q.dtype == torch.float32 else lib.vitmix_diag_bwd_f64
    _c_call(fn, (q, k, v, out, dout, dq, dk, dv), (lse, a_buf, ds_buf, wpre, dspre, lse_pre), plan, b, h, n, p, d,
            scale)
    return dq, dk, dv


def _prefix_forward(q, k, v, p, scale):
    """Dense rows of the ``p`` prefix queries: output ``(B, H, P, D)`` and log-sum-exp ``(B, H, P)``."""
    s = (q[:, :, :p] @ k.transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _prefix_backward(q, k, v, out, dout, lse_pre, p, scale):
    """Softmax weights and score gradients ``(B, H, P, T)`` of the prefix queries."""
    s = (q[:, :, :p] @ k.transpose(-1, -2)) * scale
    w = torch.exp(s - lse_pre[..., None])
    delta = torch.linalg.vecdot(dout[:, :, :p], out[:, :, :p])[..., None]
    return w.contiguous(), (w * (dout[:, :, :p] @ v.transpose(-1, -2) - delta)).contiguous()


def _pad_rows(x, pad):
    """``(B, H, N, d) -> (B, H·(N + 2·pad), d)``: each head's rows with ``pad`` zero rows on both sides."""
    b, h, n, d = x.shape
    return F.pad(x, (0, 0, pad, pad)).reshape(b, h * (n + 2 * pad), d)


def _slot_rows(plan: DiagonalPlan, m: int, n: int, pad: int):
    """Flat row index ``(H·N,)`` into :func:`_pad_rows` output for slot ``m``, and its validity ``(H, N)``."""
    j = torch.arange(n, device=plan.shifts.device)
    key = j[None, :] + plan.shifts[:, m, None]
    valid = (key >= 0) & (key < n) & (plan.counts[:, None] > m)
    head = torch.arange(plan.num_heads, device=plan.shifts.device)[:, None] * (n + 2 * pad)
    return (head + pad + key).reshape(-1), valid


def _torch_prepare(plan, n):
    pad = max(max(offs) for offs in plan.offsets)      # the largest |shift| (from Python ints: no sync)
    return pad, [_slot_rows(plan, m, n, pad) for m in range(plan.max_slots)]


def _torch_scores(qp, kpad, kpre, slots, scale):
    """``(B, H, N, P + M)`` scores (``-inf`` on invalid slots)."""
    b, h, n, d = qp.shape
    p = kpre.shape[2]
    s = qp.new_full((b, h, n, p + len(slots)), float("-inf"))
    if p:
        s[..., :p] = (qp @ kpre.transpose(-1, -2)) * scale
    for m, (rows, valid) in enumerate(slots):
        kg = kpad.index_select(1, rows).view(b, h, n, d)
        s[..., p + m] = torch.linalg.vecdot(qp, kg).mul_(scale).masked_fill_(~valid, float("-inf"))
    return s


def _torch_weights(s, lse):
    empty = torch.isinf(lse)
    return torch.exp(s - lse.masked_fill(empty, 0.0)[..., None]).masked_fill_(empty[..., None], 0.0)


def _torch_forward(qp, k, v, plan, p, scale):
    b, h, n, d = qp.shape
    pad, slots = _torch_prepare(plan, n)
    kpad, vpad = _pad_rows(k[:, :, p:], pad), _pad_rows(v[:, :, p:], pad)
    s = _torch_scores(qp, kpad, k[:, :, :p], slots, scale)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a query with no key
    w = _torch_weights(s, lse)
    out = w[..., :p] @ v[:, :, :p] if p else torch.zeros_like(qp)
    for m, (rows, _) in enumerate(slots):
        out.addcmul_(w[..., p + m, None], vpad.index_select(1, rows).view(b, h, n, d))
    return out, lse


def _torch_backward(qp, k, v, out, lse, dout, plan, p, scale):
    b, h, n, d = qp.shape
    pad, slots = _torch_prepare(plan, n)
    kpre, vpre = k[:, :, :p], v[:, :, :p]
    kpad, vpad = _pad_rows(k[:, :, p:], pad), _pad_rows(v[:, :, p:], pad)
    w = _torch_weights(_torch_scores(qp, kpad, kpre, slots, scale), lse)
    delta = torch.linalg.vecdot(dout, out)[..., None]
    dq = torch.zeros_like(qp)
    dkpad = torch.zeros_like(kpad)
    dvpad = torch.zeros_like(vpad)
    for m, (rows, _) in enumerate(slots):
        wm = w[..., p + m, None]
        dsm = wm * (torch.linalg.vecdot(dout, vpad.index_select(1, rows).view(b, h, n, d))[..., None] - delta)
        dq.addcmul_(dsm, kpad.index_select(1, rows).view(b, h, n, d), value=scale)  # ds = 0 on invalid slots
        dkpad.index_add_(1, rows, (dsm * qp).reshape(b, h * n, d), alpha=scale)
        dvpad.index_add_(1, rows, (wm * dout).reshape(b, h * n, d))
    dk_patch = dkpad.view(b, h, n + 2 * pad, d)[:, :, pad:pad + n]
    dv_patch = dvpad.view(b, h, n + 2 * pad, d)[:, :, pad:pad + n]
    if p:
        wp = w[..., :p]
        dsp = wp * (dout @ vpre.transpose(-1, -2) - delta)
        dq.add_(dsp @ kpre, alpha=scale)
        dk_pre = (dsp.transpose(-1, -2) @ qp) * scale
        dv_pre = wp.transpose(-1, -2) @ dout
        return dq, torch.cat([dk_pre, dk_patch], dim=2), torch.cat([dv_pre, dv_patch], dim=2)
    return dq, dk_patch.contiguous(), dv_patch.contiguous()


def _diagonal_forward(q, k, v, plan, p, scale, engine):
    """``(out, lse, lse_pre)`` of ``engine`` (``"c"``, ``"triton"`` or ``"torch"``; ``lse_pre`` may be ``None``
    when ``p = 0``); the C and Triton kernels read strided q/k/v in place and return a token-major output."""
    if engine == "triton":
        from . import _triton_diagonal

        return _triton_diagonal.diagonal_forward(_unit_last(q), _unit_last(k), _unit_last(v), plan, p, scale)
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
        from . import _triton_diagonal

        return _triton_diagonal.diagonal_backward(_unit_last(dout), q, k, v, out, lse, lse_pre, plan, p, scale)
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


# ------------------------------------------------------------------------------------ custom op
# Under torch.compile / torch.export the same forward and backward run as custom ops. The per-head
# offsets travel as Python ints (``offsets`` flattened, ``offset_counts`` per head), so the graph
# holds no index tensors and export decompositions can rebuild the pattern; the backend is chosen
# when the op runs. Outputs have one layout whatever the backend: token-major ``out``/``dq``/``dk``/
# ``dv`` (a free head merge, and the layout of a qkv projection's gradient), contiguous log-sum-exps.
def _flatten_offsets(offsets: Sequence[Sequence[int]]) -> Tuple[List[int], List[int]]:
    return [d for offs in offsets for d in offs], [len(offs) for offs in offsets]


def _unflatten_offsets(flat: Sequence[int], counts: Sequence[int]) -> Tuple[Tuple[int, ...], ...]:
    starts = [sum(counts[:h]) for h in range(len(counts))]
    return tuple(tuple(int(d) for d in flat[s:s + c]) for s, c in zip(starts, counts))


def _op_setup(q, k, v, offsets, offset_counts, p, backend):
    """The engine (``"c"``, ``"triton"`` or ``"torch"``) and the cached plan of one op call."""
    engine = _engine(q, k, v, backend)
    return engine, _flat_plan(tuple(offsets), tuple(offset_counts), q.shape[2] - p,
                              "cpu" if engine == "c" else str(q.device))


@functools.lru_cache(maxsize=256)
def _flat_plan(offsets: Tuple[int, ...], offset_counts: Tuple[int, ...], num_tokens: int, device: str) -> DiagonalPlan:
    """:func:`_plan_cached` keyed by the op's flat arguments: regrouping them per head on every compiled
    call cost ~17 µs, 10 % of a 14×14 layer's sparse product."""
    return _plan_cached(_unflatten_offsets(offsets, offset_counts), num_tokens, device)


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


def _diagonal_decomposition(q, k, v, offsets, offset_counts, num_prefix_tokens, scale, backend):
    """Export decomposition of ``vitmix::sparse_diagonal_attention``: the PyTorch path written out of place
    (exporters want functional graphs), the pattern rebuilt from the op's integer arguments: per slot
    one gather of the shifted keys and values, a softmax over the ``P + M`` slots of each query row."""
    p = num_prefix_tokens
    b, h, t, d = q.shape
    n = t - p
    plan = _build_plan(_unflatten_offsets(offsets, offset_counts), n, q.device)
    pad, slots = _torch_prepare(plan, n)
    qp = q[:, :, p:]
    kpad, vpad = _pad_rows(k[:, :, p:], pad), _pad_rows(v[:, :, p:], pad)
    # a product and a sum, not linalg.vecdot: the TorchScript ONNX exporter has no vecdot
    scores = [((qp * kpad.index_select(1, rows).view(b, h, n, d)).sum(-1) * scale).masked_fill(~valid, -inf)
              for rows, valid in slots]
    s = torch.stack(scores, dim=-1)
    if p:
        s = torch.cat([(qp @ k[:, :, :p].transpose(-1, -2)) * scale, s], dim=-1)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a query with no key
    empty = torch.isinf(lse)
    w = torch.exp(s - lse.masked_fill(empty, 0.0)[..., None]).masked_fill(empty[..., None], 0.0)
    out = sum(w[..., p + m, None] * vpad.index_select(1, rows).view(b, h, n, d) for m, (rows, _) in enumerate(slots))
    if not p:
        return out, lse, q.new_empty(b, h, 0)
    out_pre, lse_pre = _prefix_forward(q, k, v, p, scale)
    return torch.cat([out_pre, out + w[..., :p] @ v[:, :, :p]], dim=2), lse, lse_pre


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


def _resolve_scale(scale, d):
    return d ** -0.5 if scale is None else float(scale)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


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


def _traced_offsets(offsets, q, p) -> Tuple[Tuple[int, ...], ...]:
    """The validated per-head offsets, from Python values only (no plan tensors while tracing)."""
    _, n = _check_qkv_shape_only(q, p)
    heads = offsets.num_heads if isinstance(offsets, DiagonalPlan) else len(offsets)
    if heads != q.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads but {heads} offset sets were given (one per head)")
    if isinstance(offsets, DiagonalPlan):
        if offsets.num_tokens != n:
            raise ValueError(f"the plan was built for N={offsets.num_tokens} patch tokens, the input has N={n}")
        return offsets.offsets
    return tuple(check_offsets(offsets, n))


def _dense_mask(offsets, q, num_prefix_tokens):
    plan = _plan_for(offsets, q, num_prefix_tokens)
    return offsets_mask(plan.offsets, plan.num_tokens, num_prefix_tokens, device=q.device)


def masked_diagonal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_prefix_tokens: int = 0,
                              scale: Optional[float] = None, attn_drop: float = 0.0,
                              mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference: dense ``softmax(q kᵀ · scale + M) v`` with ``M = -inf`` outside the pattern.

    Same arguments as :func:`sparse_diagonal_attention` (plus training-time ``attn_drop`` on the
    weights; ``mask``: a precomputed ``(H, T, T)`` boolean mask, e.g. cached by a module). O(N²)
    time and memory. Queries without any key output zeros (not NaN).
    """
    _check_qkv(q, k, v, q.shape[1] if q.dim() == 4 else -1, num_prefix_tokens)
    if mask is None:
        mask = _dense_mask(offsets, q, num_prefix_tokens)
    dtype = _compute_dtype(q)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    scores = (qc @ kc.transpose(-1, -2)) * _resolve_scale(scale, q.shape[-1])
    row_ok = mask.any(dim=-1, keepdim=True)
    w = scores.masked_fill(~mask & row_ok, float("-inf")).softmax(dim=-1) * row_ok
    if attn_drop:
        w = F.dropout(w, attn_drop)
    return (w @ vc).to(q.dtype)


def official_diagonal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                offsets: Union[Sequence[Sequence[int]], DiagonalPlan], num_prefix_tokens: int = 0,
                                scale: Optional[float] = None, attn_drop: float = 0.0,
                                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The official code's semantics: ``softmax((q · scale) kᵀ ⊙ Ω) v`` with a 0/1 mask ``Ω``.

    Masked logits become 0 rather than ``-inf``, so every masked key still receives weight
    ``1 / Z`` — dense O(N²) work and a uniform-average leak that grows with ``N``. Provided only to
    reproduce results of the official implementation. ``attn_drop`` and ``mask`` as in
    :func:`masked_diagonal_attention`.
    """
    _check_qkv(q, k, v, q.shape[1] if q.dim() == 4 else -1, num_prefix_tokens)
    if mask is None:
        mask = _dense_mask(offsets, q, num_prefix_tokens)
    dtype = _compute_dtype(q)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    scores = ((qc * _resolve_scale(scale, q.shape[-1])) @ kc.transpose(-1, -2)) * mask.to(dtype)
    w = scores.softmax(dim=-1)
    if attn_drop:
        w = F.dropout(w, attn_drop)
    return (w @ vc).to(q.dtype)
