"""The softmax baseline equals timm's Attention given the same weights."""
import pytest
import torch
from timm.layers import Attention

from vitmix import mixers


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("qkv_bias,qk_norm", [(True, False), (False, True)])
def test_equals_timm_attention(fused, qkv_bias, qk_norm):
    norm = torch.nn.LayerNorm
    ref = Attention(96, num_heads=6, qkv_bias=qkv_bias, qk_norm=qk_norm, norm_layer=norm).eval()
    ours = mixers.create("softmax", 96, 6, qkv_bias=qkv_bias, qk_norm=qk_norm, norm_layer=norm, fused=fused).eval()
    ours.load_state_dict(ref.state_dict())  # same parameter names, so checkpoints are interchangeable
    x = torch.randn(3, 37, 96, dtype=torch.float64)
    ref.double(), ours.double()
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)  # float64: only rounding differs


def test_attention_mask_matches_timm():
    ref = Attention(64, num_heads=4).eval()
    ours = mixers.create("softmax", 64, 4).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 10, 64)
    mask = torch.rand(2, 1, 10, 10) > 0.3
    mask[..., 0] = True  # every query keeps at least one key
    torch.testing.assert_close(ours(x, attn_mask=mask), ref(x, attn_mask=mask), rtol=1e-5, atol=1e-6)


def test_attention_map_rows_are_distributions_and_reproduce_output():
    layer = mixers.create("softmax", 64, 4, fused=False).eval()
    x = torch.randn(2, 17, 64)
    attn = layer.attention_map(x)
    assert attn.shape == (2, 4, 17, 17)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 17))
    v = layer.qkv(x).reshape(2, 17, 3, 4, 16)[:, :, 2].transpose(1, 2)
    out = layer.proj((attn @ v).transpose(1, 2).reshape(2, 17, 64))
    torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-6)


def test_fused_and_manual_paths_agree_in_gradients():
    torch.manual_seed(0)
    a = mixers.create("softmax", 64, 4, fused=True)
    b = mixers.create("softmax", 64, 4, fused=False)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 50, 64)
    a(x).square().sum().backward()
    b(x).square().sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5)
