"""Sparse multi-diagonal attention in PyTorch (private): one ``index_select`` per offset slot, any device,
forward and backward, and the export decomposition of ``vitmix::sparse_diagonal_attention``."""
from __future__ import annotations

from math import inf

import torch
import torch.nn.functional as F

from .plan import DiagonalPlan, _build_plan, _prefix_forward, _unflatten_offsets


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
