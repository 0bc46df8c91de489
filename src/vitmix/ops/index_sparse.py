"""Index-sparse attention: each patch query attends to its own list of patch keys (plus the prefix).

Head ``h`` of a patch query scores the patch keys of its row of an ``index`` (patch-relative
positions, ``-1`` marks an empty slot) and every prefix (CLS/register) key; prefix queries attend to
all keys. Consecutive queries may share one row (``query_block``), as in block-sparse patterns;
``query_block=1`` gives every query its own list. This is the general form of patterns such as
BigBird's random blocks, which are not diagonals and so do not fit :mod:`vitmix.ops.diagonal`.
Two implementations:

- :func:`index_sparse_attention` — the sparse path: each patch query scores only its ``P + M``
  keys, O(N·M·d) time and O(N·M + N·d) memory in forward and backward. Keys and values are gathered
  once per query block, a few slots at a time (never one ``(B, H, N, M, d)`` tensor), and scored
  with small dense products (query block × gathered keys). A custom autograd function saves
  ``q, k, v``, the output and one log-sum-exp per row; backward recomputes the weights and
  scatters the key/value gradients with ``index_add_``. Pure PyTorch, any device.
- :func:`masked_index_attention` — the reference: dense ``softmax(q kᵀ · scale + M) v`` with
  ``M = -inf`` outside the pattern (:func:`index_mask`), O(N²).

Both take ``q, k, v`` of shape ``(B, H, P + N, d)`` and an :class:`IndexPattern` (or a raw
``(H, N, M)`` index, one list per query, validated on every call). A patch query whose slots are all
empty and that has no prefix key outputs zeros. Half-precision inputs are computed in float32
(autocast is switched off inside) and cast back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F

from ._common import compute_dtype, no_autocast

__all__ = ["IndexPattern", "index_pattern", "index_sparse_attention", "masked_index_attention", "index_mask"]

#: elements per sample of one gathered ``(B, H, NB, slots, d)`` chunk; bounds the working memory of the
#: sparse path (1 MiB per sample in float32: the former whole-batch bound at batch 4, and one chunk for
#: BigBird's default 48 slots up to ViT-Tiny at 224²). Per sample, not per batch, so the chunking never
#: reads the batch size (torch.export keeps the batch symbolic)
_CHUNK_ELEMENTS_PER_SAMPLE = 1 << 18


@dataclass(frozen=True, eq=False)
class IndexPattern:
    """A validated key list per (head, block of consecutive patch queries).

    Attributes:
        index: ``(H, NB, M)`` int64; ``index[h, i, m]`` is a patch key of every query of block ``i``
            (queries ``i·query_block … (i+1)·query_block - 1``) in head ``h`` (``0 <= index < N``,
            each key at most once per row) or ``-1`` (empty slot).
        num_tokens: patch tokens ``N``; ``NB = ⌈N / query_block⌉``.
        query_block: consecutive queries sharing one key list (1: a list per query).
    """

    index: torch.Tensor
    num_tokens: int
    query_block: int = 1

    @property
    def num_heads(self) -> int:
        return int(self.index.shape[0])

    @property
    def max_keys(self) -> int:
        return int(self.index.shape[2])

    def token_index(self) -> torch.Tensor:
        """``(H, N, M)``: the key list of every patch query."""
        rows = torch.arange(self.num_tokens, device=self.index.device) // self.query_block
        return self.index[:, rows]

    def to(self, device) -> "IndexPattern":
        """This pattern with its index on ``device``."""
        return IndexPattern(self.index.to(device), self.num_tokens, self.query_block)


def index_pattern(index: torch.Tensor, num_tokens: int, query_block: int = 1) -> IndexPattern:
    """Check ``index`` (``(H, ⌈N / query_block⌉, M)`` integers, ``-1 <= index < N``, no key twice in a
    row) and wrap it."""
    if isinstance(index, IndexPattern):
        index, query_block = index.index, index.query_block
    if isinstance(query_block, bool) or not isinstance(query_block, int) or query_block < 1:
        raise ValueError(f"query_block={query_block!r} must be a positive integer")
    if not isinstance(index, torch.Tensor) or index.dim() != 3 or index.dtype.is_floating_point:
        raise ValueError(f"index must be an integer tensor of shape (H, N / query_block, M), got "
                         f"{getattr(index, 'shape', type(index).__name__)}")
    blocks = -(-num_tokens // query_block)
    if index.shape[1] != blocks:
        raise ValueError(f"index has {index.shape[1]} query rows; N={num_tokens} patch tokens in blocks of "
                         f"{query_block} need {blocks}")
    index = index.to(torch.int64)
    if index.numel() and (int(index.min()) < -1 or int(index.max()) >= num_tokens):
        raise ValueError(f"index values must lie in [-1, {num_tokens}) (patch-relative keys, -1 = empty slot), "
                         f"got [{int(index.min())}, {int(index.max())}]")
    ordered = index.sort(-1).values
    if bool(((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any()):
        raise ValueError("index lists a key twice in one row; each (query, key) pair may appear once")
    return IndexPattern(index.contiguous(), int(num_tokens), query_block)


def _check_inputs(q, k, v, pattern, num_prefix_tokens) -> IndexPattern:
    if not (q.dim() == k.dim() == v.dim() == 4) or q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"q, k, v must be (B, H, T, d) of one shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    p = num_prefix_tokens
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < q.shape[2]:
        raise ValueError(f"num_prefix_tokens must be an int in [0, T={q.shape[2]}), got {p!r}")
    n = q.shape[2] - p
    if not isinstance(pattern, IndexPattern):
        pattern = index_pattern(pattern, n)
    elif pattern.num_tokens != n:
        raise ValueError(f"the pattern was built for N={pattern.num_tokens} patch tokens, the input has N={n}")
    if pattern.num_heads != q.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads but the pattern has {pattern.num_heads}")
    return pattern.to(q.device) if pattern.index.device != q.device else pattern


# ------------------------------------------------------------------------------------ sparse path
def _flat_rows(index: torch.Tensor, n: int) -> torch.Tensor:
    """``(H, NB, M)`` patch keys → rows of the ``(B, H·N, d)`` flattening (empty slots → key 0)."""
    return index.clamp_min(0) + (torch.arange(index.shape[0], device=index.device) * n)[:, None, None]


def _chunks(h, nb, m, d):
    """Slot ranges ``[lo, hi)`` whose gathered keys hold at most ``_CHUNK_ELEMENTS_PER_SAMPLE`` per sample."""
    step = max(1, _CHUNK_ELEMENTS_PER_SAMPLE // max(1, h * nb * d))
    return [(s, min(s + step, m)) for s in range(0, m, step)]


def _gather(flat, rows, b, h, d):
    """Rows ``(H, NB, c)`` of ``flat (B, H·N, d)`` → ``(B, H, NB, c, d)``."""
    return flat.index_select(1, rows.reshape(-1)).view(b, h, rows.shape[1], rows.shape[2], d)


def _blocks(t, qb):
    """``(B, H, N, d)`` → ``(B, H, NB, qb, d)``, zero rows appended to fill the last block."""
    b, h, n, d = t.shape
    nb = -(-n // qb)
    return F.pad(t, (0, 0, 0, nb * qb - n)).view(b, h, nb, qb, d)


def _scores(qblk, kpre, kflat, rows, valid, scale):
    """``(B, H, NB, qb, P + M)`` scores, ``-inf`` on empty slots."""
    b, h, nb, qb, d = qblk.shape
    p, m = kpre.shape[2], rows.shape[-1]
    s = qblk.new_full((b, h, nb, qb, p + m), float("-inf"))
    if p:
        s[..., :p] = (qblk @ kpre.transpose(-1, -2)[:, :, None]) * scale
    for lo, hi in _chunks(h, nb, m, d):
        kg = _gather(kflat, rows[..., lo:hi], b, h, d)
        s[..., p + lo:p + hi] = (qblk @ kg.transpose(-1, -2)).mul_(scale).masked_fill_(
            ~valid[:, :, None, lo:hi], float("-inf"))
    return s


def _weights_(s, lse):
    """Softmax weights from scores ``s`` and their log-sum-exp, in place of ``s``."""
    empty = torch.isinf(lse)  # a query without any key: zero weights, zero output
    return s.sub_(lse.masked_fill(empty, 0.0)[..., None]).exp_().masked_fill_(empty[..., None], 0.0)


def _flatten_patch(t, p):
    """Patch rows of ``t (B, H, T, d)`` as ``(B, H·N, d)``."""
    b, h, tt, d = t.shape
    return t[:, :, p:].reshape(b, h * (tt - p), d)


class _IndexAttention(torch.autograd.Function):
    """Patch queries ``qp (B, H, N, d)`` against the prefix keys and their listed patch keys."""

    @staticmethod
    def forward(ctx, qp, k, v, index, qb, p, scale):
        with no_autocast(qp.device.type):
            b, h, n, d = qp.shape
            rows, valid = _flat_rows(index, n), index >= 0
            kflat, vflat = _flatten_patch(k, p), _flatten_patch(v, p)
            qblk = _blocks(qp, qb)
            s = _scores(qblk, k[:, :, :p], kflat, rows, valid, scale)
            lse = torch.logsumexp(s, dim=-1)
            w = _weights_(s, lse)
            out = w[..., :p] @ v[:, :, None, :p] if p else torch.zeros_like(qblk)
            for lo, hi in _chunks(h, rows.shape[1], rows.shape[-1], d):
                out += w[..., p + lo:p + hi] @ _gather(vflat, rows[..., lo:hi], b, h, d)
        out = out.flatten(2, 3)[:, :, :n]           # sizes spelt out: B = 0 leaves -1 ambiguous
        ctx.save_for_backward(qp, k, v, out, lse, index)
        ctx.qb, ctx.p, ctx.scale = qb, p, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        qp, k, v, out, lse, index = ctx.saved_tensors
        with no_autocast(qp.device.type):
            grads = _index_backward(qp, k, v, out, lse, index, dout.to(qp.dtype), ctx.qb, ctx.p, ctx.scale)
        return grads + (None, None, None, None)


def _index_backward(qp, k, v, out, lse, index, dout, qb, p, scale):
    """``dq`` (patch queries), ``dk``, ``dv`` (all tokens), recomputing the weights from ``lse``."""
    b, h, n, d = qp.shape
    rows, valid = _flat_rows(index, n), index >= 0
    kpre, vpre = k[:, :, None, :p], v[:, :, None, :p]
    kflat, vflat = _flatten_patch(k, p), _flatten_patch(v, p)
    qblk, dblk = _blocks(qp, qb), _blocks(dout, qb)
    w = _weights_(_scores(qblk, k[:, :, :p], kflat, rows, valid, scale), lse)
    delta = (dblk * _blocks(out, qb)).sum(-1, keepdim=True)
    dq = torch.zeros_like(qblk)
    dkflat, dvflat = torch.zeros_like(kflat), torch.zeros_like(vflat)
    for lo, hi in _chunks(h, rows.shape[1], rows.shape[-1], d):
        r = rows[..., lo:hi].reshape(-1)
        kg, vg = _gather(kflat, rows[..., lo:hi], b, h, d), _gather(vflat, rows[..., lo:hi], b, h, d)
        wc = w[..., p + lo:p + hi]
        ds = wc * (dblk @ vg.transpose(-1, -2) - delta)              # zero on empty slots (wc = 0)
        dq += (ds @ kg) * scale
        dkflat.index_add_(1, r, (ds.transpose(-1, -2) @ qblk).reshape(b, r.numel(), d), alpha=scale)
        dvflat.index_add_(1, r, (wc.transpose(-1, -2) @ dblk).reshape(b, r.numel(), d))
    dk, dv = dkflat.view(b, h, n, d), dvflat.view(b, h, n, d)
    if p:
        wp = w[..., :p]
        dsp = wp * (dblk @ vpre.transpose(-1, -2) - delta)
        dq += (dsp @ kpre) * scale
        dk = torch.cat([(dsp.transpose(-1, -2) @ qblk).sum(2) * scale, dk], dim=2)
        dv = torch.cat([(wp.transpose(-1, -2) @ dblk).sum(2), dv], dim=2)
    return dq.flatten(2, 3)[:, :, :n], dk, dv


def index_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           pattern: Union[IndexPattern, torch.Tensor], num_prefix_tokens: int = 0,
                           scale: Optional[float] = None) -> torch.Tensor:
    """Index-sparse attention, O(N·M·d) time and O(N·M + N·d) memory in forward and backward.

    Args:
        q, k, v: ``(B, H, P + N, d)``; the first ``P`` tokens are prefix (CLS/register) tokens.
        pattern: an :class:`IndexPattern`, or an ``(H, N, M)`` index (one list per query,
            validated on each call).
        num_prefix_tokens: ``P``; prefix queries attend to all keys (dense, ``O(P·T·d)``) and every
            patch query attends to the prefix keys.
        scale: logit scale, default ``d ** -0.5``.

    Returns:
        ``(B, H, P + N, d)`` in the dtype of ``q`` (half precision is computed in float32).
    """
    pattern = _check_inputs(q, k, v, pattern, num_prefix_tokens)
    p = num_prefix_tokens
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dtype = compute_dtype(q)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    out = _IndexAttention.apply(qc[:, :, p:], kc, vc, pattern.index, pattern.query_block, p, scale)
    if p:
        with no_autocast(q.device.type):
            pre = F.softmax((qc[:, :, :p] @ kc.transpose(-1, -2)) * scale, dim=-1) @ vc
        out = torch.cat([pre, out], dim=2)
    return out.to(q.dtype)


# --------------------------------------------------------------------------------------- reference
def index_mask(pattern: Union[IndexPattern, torch.Tensor], num_prefix_tokens: int = 0, device=None) -> torch.Tensor:
    """Dense boolean ``(H, T, T)`` mask of ``pattern`` (``T = P + N``): True where a query may attend.

    Prefix rows and columns are all True. O(H·T²) memory: for references, tests and plots only.
    """
    if not isinstance(pattern, IndexPattern):
        pattern = index_pattern(pattern, pattern.shape[1])
    index = pattern.token_index()
    index = index.to(device) if device is not None else index
    h, n, _ = index.shape
    p = num_prefix_tokens
    patch = torch.zeros(h, n, n + 1, dtype=torch.bool, device=index.device)
    patch.scatter_(2, torch.where(index >= 0, index, n), True)      # empty slots land in a spare column
    mask = torch.ones(h, p + n, p + n, dtype=torch.bool, device=index.device)
    mask[:, p:, p:] = patch[..., :n]
    return mask


def masked_index_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           pattern: Union[IndexPattern, torch.Tensor], num_prefix_tokens: int = 0,
                           scale: Optional[float] = None, attn_drop: float = 0.0,
                           mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference: dense ``softmax(q kᵀ · scale + M) v`` with ``M = -inf`` outside the pattern.

    Same arguments as :func:`index_sparse_attention` (plus training-time ``attn_drop`` on the
    weights, and ``mask``: a precomputed :func:`index_mask`). O(N²) time and memory. Queries
    without any key output zeros.
    """
    if mask is None:
        mask = index_mask(_check_inputs(q, k, v, pattern, num_prefix_tokens), num_prefix_tokens, q.device)
    dtype = compute_dtype(q)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    with no_autocast(q.device.type):
        scores = (qc @ kc.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else float(scale))
        row_ok = mask.any(dim=-1, keepdim=True)
        w = scores.masked_fill(~mask & row_ok, float("-inf")).softmax(dim=-1) * row_ok
        if attn_drop:
            w = F.dropout(w, attn_drop)
        return (w @ vc).to(q.dtype)
