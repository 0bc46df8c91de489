"""The slot chunking of :mod:`vitmix.ops.index_sparse`: sized per sample (never from the batch, which
torch.export keeps symbolic), and any split gives the unchunked result.

Float64: chunked and unchunked paths differ only in the order of the per-chunk sums (~1e-16
relative), so 1e-12 passes any split and fails any slot that is dropped, repeated or mis-masked.
"""
import pytest
import torch

from vitmix.ops import index_sparse
from vitmix.ops.index_sparse import index_pattern, index_sparse_attention, masked_index_attention

HEADS, N, SLOTS, D = 2, 11, 6, 4


def _pattern(block):
    g = torch.Generator().manual_seed(0)
    rows = -(-N // block)
    index = torch.stack([torch.stack([torch.randperm(N, generator=g)[:SLOTS] for _ in range(rows)])
                         for _ in range(HEADS)])
    index[:, :, 2] = -1                                     # an empty slot inside every chunk split
    return index_pattern(index, N, block)


def _forward_backward(fn, q, k, v):
    out = fn(q, k, v)
    g = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out)
    return out, torch.autograd.grad(out, (q, k, v), g)


def test_chunks_cover_every_slot_once_and_ignore_the_batch(monkeypatch):
    monkeypatch.setattr(index_sparse, "_CHUNK_ELEMENTS_PER_SAMPLE", HEADS * 3 * D * 2)   # 2 slots a chunk
    assert index_sparse._chunks(HEADS, 3, 5, D) == [(0, 2), (2, 4), (4, 5)]
    monkeypatch.setattr(index_sparse, "_CHUNK_ELEMENTS_PER_SAMPLE", 1)                   # at least 1 slot
    assert index_sparse._chunks(HEADS, 3, 2, D) == [(0, 1), (1, 2)]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("prefix,block", [(0, 1), (2, 4)])
@pytest.mark.parametrize("slots_per_chunk", [1, 4])
def test_any_chunk_split_matches_the_masked_reference(monkeypatch, batch, prefix, block, slots_per_chunk):
    pattern = _pattern(block)
    monkeypatch.setattr(index_sparse, "_CHUNK_ELEMENTS_PER_SAMPLE",
                        HEADS * pattern.index.shape[1] * D * slots_per_chunk)
    g = torch.Generator().manual_seed(batch)
    q, k, v = (torch.randn(batch, HEADS, prefix + N, D, dtype=torch.float64, generator=g).requires_grad_()
               for _ in range(3))
    got = _forward_backward(lambda *t: index_sparse_attention(*t, pattern, prefix), q, k, v)
    want = _forward_backward(lambda *t: masked_index_attention(*t, pattern, prefix), q, k, v)
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
