"""Fibottention analysis helpers: interaction fractions, offset overlap, head diversity."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitmix
from vitmix.analysis import fibottention as fa
from vitmix.ops.fibonacci import head_offsets


def test_interaction_fractions_of_vit_b():
    # counts of attended index pairs over 196²: the same on any CPU; abs=5e-5 only rounds the recorded values
    fr = fa.interaction_fractions(head_offsets(12, 196), 196, 1)
    assert fr["patch_mean"] == pytest.approx(0.01994, abs=5e-5)
    assert fr["with_prefix_mean"] == pytest.approx(0.0299, abs=5e-5)
    assert len(fr["patch"]) == 12 and fr["patch"][0] == pytest.approx(2 * (195 + 194 + 193 + 191) / 196**2)


def test_model_interaction_table_matches_attention_maps():
    model = vitmix.create_model("vit_nano_patch4_32_fibottention", depth=2)
    rows = fa.model_interaction_table(model, 64)
    assert len(rows) == 2 * 4 and [r["layer"] for r in rows] == [0] * 4 + [1] * 4
    tokens = model.patch_embed(torch.randn(1, 3, 32, 32))
    tokens = model._pos_embed(tokens)
    amap = model.blocks[0].attn.attention_map(model.blocks[0].norm1(tokens))  # (1, 4, 65, 65)
    for r in rows[:4]:
        nonzero = amap[0, r["head"]] > 0
        assert nonzero[1:, 1:].float().mean().item() == pytest.approx(r["patch_fraction"])
        assert nonzero.float().mean().item() == pytest.approx(r["with_prefix_fraction"])


def test_offset_overlap():
    wythoff = fa.offset_overlap(head_offsets(12, 196))
    assert torch.equal(wythoff, torch.eye(12, dtype=torch.float64))  # Wythoff rows are disjoint
    mod = head_offsets(12, 196, variant="modified")  # (0,1,2,3,5) and (1,3,4,7) share 1 and 3
    ov = fa.offset_overlap(mod)
    assert ov[0, 1] == pytest.approx(2 / 7) and ov[1, 0] == ov[0, 1]
    pairs = fa.offset_overlap([(1, 2), (2, 5)], num_tokens=10, by="pairs")
    assert pairs[0, 1] == pytest.approx(16 / (18 + 16 + 10))
    with pytest.raises(ValueError, match="num_tokens"):
        fa.offset_overlap(mod, by="pairs")


def test_head_similarity_measures():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 50, 1, 8, generator=g, dtype=torch.float64)
    rot, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    other = torch.randn(2, 50, 1, 8, generator=g, dtype=torch.float64)
    heads = torch.cat([base, base @ rot, 3 * base, other], dim=2)
    cka = fa.head_similarity(heads, "cka")
    assert cka[0, 1] == pytest.approx(1.0) and cka[0, 2] == pytest.approx(1.0)  # rotation/scale invariant
    assert cka[0, 3] < 0.5
    cos = fa.head_similarity(heads, "cosine")
    assert cos[0, 2] == pytest.approx(1.0) and abs(cos[0, 1]) < 0.9 and abs(cos[0, 3]) < 0.3
    assert torch.equal(cka, cka.T)
    with pytest.raises(ValueError, match="cka"):
        fa.head_similarity(heads, "svcca")
    with pytest.raises(ValueError, match=r"\(B, N, H, d\)"):
        fa.head_similarity(heads[0])


def test_model_head_diversity_for_fibottention_and_dense_vits():
    x = torch.randn(2, 3, 32, 32)
    fibo = vitmix.create_model("vit_nano_patch4_32_fibottention", depth=2)
    outs = fa.capture_head_outputs(fibo, x)
    assert len(outs) == 2 and outs[0].shape == (2, 65, 4, 32)
    res = fa.model_head_diversity(fibo, x)
    assert [r["layer"] for r in res] == [0, 1]
    for r in res:
        assert r["similarity"].shape == (4, 4) and 0 < r["diversity"] <= 1
        assert r["diversity"] == pytest.approx(1 - r["mean_similarity"])
    dense = VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=1, num_heads=4, num_classes=3)
    assert len(fa.model_head_diversity(dense, x, measure="cosine")) == 1
    assert fibo.training  # mode restored
