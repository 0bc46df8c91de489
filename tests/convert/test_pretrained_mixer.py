"""``pretrained=True`` with ``mixer=``: the softmax weights load through timm's own path and are converted.

The checkpoint is a DeiT-Tiny state dict in timm's released layout (two blocks to keep it quick, random
weights) written to a temporary safetensors file and loaded as a downloaded one is
(``pretrained_cfg_overlay=dict(file=...)``); no network.
"""
import warnings

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitmix
from vitmix.mixers import TokenMixer

pytestmark = pytest.mark.usefixtures("one_thread")

DEIT = "deit_tiny_patch16_224"
SMALL = dict(depth=2)          # the file and every model built from it: two blocks


@pytest.fixture(scope="module")
def deit_file(tmp_path_factory):
    torch.manual_seed(0)
    state = timm.create_model(DEIT, **SMALL).state_dict()
    path = tmp_path_factory.mktemp("deit") / "deit_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def _pretrained(create, path, **kwargs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = create(DEIT, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **SMALL, **kwargs)
    return model.eval(), [str(w.message) for w in seen if "vitmix.convert" in str(w.message)]


@pytest.mark.parametrize("create", [timm.create_model, vitmix.create_model], ids=["timm", "vitmix"])
@pytest.mark.parametrize("mixer", ["laplacian", "soft", "fibottention"])
def test_pretrained_softmax_weights_are_converted_to_the_mixer(deit_file, create, mixer):
    model, lines = _pretrained(create, deit_file, mixer=mixer)
    teacher = timm.create_model(DEIT, pretrained=True, pretrained_cfg_overlay=dict(file=str(deit_file)), **SMALL)
    expected = vitmix.convert(teacher.eval(), mixer)
    assert len(lines) == 1 and f"converted to mixer {mixer!r}" in lines[0] and "fine-tune" in lines[0]
    assert "\n" not in lines[0]
    layers = [b.attn for b in model.blocks]
    assert all(isinstance(a, TokenMixer) and a.mixer_name == mixer for a in layers)
    theirs = expected.state_dict()
    assert model.state_dict().keys() == theirs.keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, theirs[key], rtol=0, atol=0, msg=key)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected(x), rtol=0, atol=0)


def test_a_new_head_and_options_are_timms_and_the_mixers(deit_file):
    model, lines = _pretrained(vitmix.create_model, deit_file, mixer="laplacian", num_classes=10,
                               mixer_options=dict(landmark_stride=2))
    assert len(lines) == 1 and model.head.weight.shape == (10, 192)
    assert model.blocks[0].attn.landmark_stride == 2
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 10)


def test_without_a_mixer_or_pretrained_nothing_changes(deit_file):
    plain, lines = _pretrained(timm.create_model, deit_file)
    assert lines == [] and type(plain.blocks[0].attn).__name__ == "Attention"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        untrained = vitmix.create_model(DEIT, mixer="laplacian", **SMALL)
    assert untrained.blocks[0].attn.mixer_name == "laplacian"


def test_a_checkpoint_saved_with_the_mixer_loads_as_it_is(deit_file, tmp_path):
    converted, _ = _pretrained(vitmix.create_model, deit_file, mixer="laplacian")
    folder = vitmix.save_pretrained(converted, tmp_path / "shared")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), converted(x), rtol=0, atol=0)
    # another mixer: the saved laplacian layers are the teacher of the conversion
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        other = timm.create_model(f"local-dir:{folder}", pretrained=True, mixer="soft")
    assert any("pretrained laplacian weights converted to mixer 'soft'" in str(w.message) for w in seen)
    assert all(b.attn.mixer_name == "soft" for b in other.blocks)


def test_options_that_do_not_fit_the_checkpoint_are_one_line_errors(deit_file):
    with pytest.raises(ValueError, match=r"pretrained softmax weights do not convert: .*dim=100.*drop dim") as err:
        _pretrained(vitmix.create_model, deit_file, mixer="soft", mixer_options=dict(dim=100))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"has no option 'landmark_strid'.*landmark_stride"):
        _pretrained(timm.create_model, deit_file, mixer="laplacian", mixer_options=dict(landmark_strid=2))


def test_a_weights_file_of_another_architecture_is_a_one_line_error(deit_file):
    with pytest.raises(ValueError, match=r"do not fit the model .*cls_token is \[1, 1, 192\] in the file, "
                                         r"\[1, 1, 384\] in the model; build it as the checkpoint was saved") as err:
        vitmix.create_model("deit_small_patch16_224", pretrained=True, mixer="soft", depth=2,
                            pretrained_cfg_overlay=dict(file=str(deit_file)))
    assert "\n" not in str(err.value)
