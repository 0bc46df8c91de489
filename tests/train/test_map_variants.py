"""The map-variant screen (``experiments/learning/map_variants.py``) measures its variants, not its dense path: with
the library's axes its dense map gives `laplacian`'s output and input gradient (float64, so the two evaluation
orders agree to ~1e-13; 1e-10 leaves room for any BLAS), and the other centring axis, a learnt λ and a gate each
change the layer as documented (a learnt λ and a gate start at the library's function); tied keys ignore the key
projection and the Gaussian kernel is SOFT's."""
import importlib.util
import math
import pathlib

import pytest
import torch

from vitmix import mixers
from vitmix.mixers import registry

PATH = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "learning" / "map_variants.py"
HW, PREFIX = (4, 5), 1          # an odd grid and a CLS token


@pytest.fixture(scope="module")
def variant_class():
    spec = importlib.util.spec_from_file_location("map_variants", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module.LaplacianMapVariant
    registry._MIXERS.pop("laplacian_map", None)      # the screen's mixer is not one of the library's


def _pair(variant_class, batch, **options):
    torch.manual_seed(0)
    library = mixers.create("laplacian", 32, 2, hw=HW, num_prefix_tokens=PREFIX).double()
    torch.nn.init.normal_(library.mean_weight, std=0.5)         # a trained-looking mean(V) weight, not its 0 start
    variant = variant_class(32, 2, hw=HW, num_prefix_tokens=PREFIX, **options).double()
    variant.load_state_dict(library.state_dict(), strict=False)
    if variant.log_lam is not None:      # its float32 start, exactly in float64 (else λ differs by ~1e-7)
        variant.log_lam.data.fill_(math.log(library.lam / library.qk_scale) / variant.lam_gain)
    x = torch.randn(batch, PREFIX + HW[0] * HW[1], 32, dtype=torch.float64)
    return library, variant, x


def _out_and_grad(layer, x):
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("options", [{}, {"learn_lam": True}, {"gate_gain": 10.0}])
def test_the_library_axes_give_laplacian(variant_class, batch, options):
    library, variant, x = _pair(variant_class, batch, **options)
    (out, grad), (ref, ref_grad) = _out_and_grad(variant, x), _out_and_grad(library, x)
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)
    assert torch.allclose(grad, ref_grad, rtol=0, atol=1e-10)


def test_the_other_axes_change_the_layer(variant_class):
    library, _, x = _pair(variant_class, 2)
    ref = library(x)
    for options in ({"center": "queries"}, {"center": "none"}, {"whiten": "rows"}, {"tie": True}, {"kernel": "gauss"}):
        _, variant, _ = _pair(variant_class, 2, **options)
        assert (variant(x) - ref).abs().max() > 1e-3, options


def test_tied_keys_are_the_queries(variant_class):
    # the key rows of qkv (the middle third) and the key landmarks' source no longer reach the output
    _, variant, x = _pair(variant_class, 2, tie=True)
    ref = variant(x)
    with torch.no_grad():
        variant.qkv.weight[32:64].normal_()
    assert torch.allclose(variant(x), ref, rtol=0, atol=1e-12)


def test_the_gaussian_kernel_is_softs(variant_class):
    # exp(-‖q - k‖² / (2√d)) on the unscaled q, k (SOFT scales them by d^(-1/4), then exp(-‖·‖²/2)), by hand
    _, variant, _ = _pair(variant_class, 1, kernel="gauss")
    a, b = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 3, 16, dtype=torch.float64)
    scaled = 16 ** -0.25
    by_hand = torch.exp(-((a[:, :, None] - b[:, None]) * scaled).square().sum(-1) / 2)
    assert torch.allclose(variant.kernel_matrix(a, b, lam=None), by_hand, rtol=0, atol=1e-14)


def test_an_unknown_axis_is_refused(variant_class):
    with pytest.raises(ValueError, match="center='keys'"):
        variant_class(32, 2, hw=HW, center="keys")
    with pytest.raises(ValueError, match="kernel='cosine'"):
        variant_class(32, 2, hw=HW, kernel="cosine")
