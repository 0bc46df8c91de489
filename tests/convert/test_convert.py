"""vitmix.convert: a softmax ViT with its attention swapped for each mixer, weights carried over.

The teacher is a state dict laid out exactly like timm's released DeiT-Tiny (names and shapes, random
weights), saved to a temporary safetensors file and loaded the way a downloaded one is
(``pretrained_cfg_overlay=dict(file=...)``); no network.
"""
import hashlib

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import Attention

import vitmix
from vitmix.conversion import find_attention_layers, load_timm_checkpoint
from vitmix.mixers import TokenMixer

pytestmark = pytest.mark.usefixtures("one_thread")

DEIT = "deit_tiny_patch16_224"
MIXERS = ["laplacian", "soft", "soft_norm", "fibottention", "nystromformer", "performer", "linear", "linformer"]


@pytest.fixture(scope="module")
def deit_file(tmp_path_factory):
    torch.manual_seed(0)
    state = timm.create_model(DEIT).state_dict()
    path = tmp_path_factory.mktemp("teacher") / "deit_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def teacher(deit_file):
    return timm.create_model(DEIT, pretrained=True, pretrained_cfg_overlay=dict(file=str(deit_file))).eval()


@pytest.fixture(scope="module")
def images():
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _attention_names(model):
    return [name for name, _ in find_attention_layers(model)]


def _outside(state, layer_names):
    return {k: v for k, v in state.items() if not any(k.startswith(n + ".") for n in layer_names)}


def test_the_teacher_file_has_the_released_deit_tiny_layout(teacher):
    state = teacher.state_dict()
    assert len(state) == 152 and len(_attention_names(teacher)) == 12
    assert state["pos_embed"].shape == (1, 197, 192) and state["head.weight"].shape == (1000, 192)
    assert state["blocks.11.attn.qkv.weight"].shape == (576, 192) and state["blocks.11.attn.qkv.bias"].shape == (576,)


def test_converting_to_softmax_reproduces_the_teacher_exactly(teacher, images):
    student = vitmix.convert(teacher, "softmax")
    with torch.no_grad():
        assert torch.equal(student(images), teacher(images))


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_attention_layer_is_replaced_and_everything_else_is_the_teachers(teacher, deit_file, mixer):
    before = sha256(deit_file)
    student = vitmix.convert(teacher, mixer)
    names = _attention_names(teacher)
    cls = vitmix.mixers.get_mixer_class(mixer)
    assert [type(student.get_submodule(n)) for n in names] == [cls] * 12
    assert all(isinstance(m, Attention) for _, m in find_attention_layers(teacher))      # the teacher is untouched
    kept, theirs = _outside(student.state_dict(), names), _outside(teacher.state_dict(), names)
    assert kept.keys() == theirs.keys() and all(torch.equal(kept[k], theirs[k]) for k in kept)
    assert sha256(deit_file) == before
    with torch.no_grad():
        out = student(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 1000) and torch.isfinite(out).all()


@pytest.mark.parametrize("mixer", ["fibottention", "linear", "performer", "nystromformer", "laplacian", "linformer"])
def test_q_k_v_and_output_projections_carry_over_under_timm_names(teacher, mixer):
    student = vitmix.convert(teacher, mixer)
    for name in ("blocks.0.attn", "blocks.11.attn"):
        old, new = teacher.get_submodule(name), student.get_submodule(name)
        for layer in ("qkv", "proj"):
            assert torch.equal(getattr(new, layer).weight, getattr(old, layer).weight)
            assert torch.equal(getattr(new, layer).bias, getattr(old, layer).bias)


def test_soft_takes_the_query_and_value_rows_and_starts_its_landmarks_as_average_pooling(teacher):
    student = vitmix.convert(teacher, "soft", landmark_stride=2)
    old, new = teacher.blocks[3].attn, student.blocks[3].attn
    c = 192
    assert torch.equal(new.W_q.weight, old.qkv.weight[:c]) and torch.equal(new.W_q.bias, old.qkv.bias[:c])
    assert torch.equal(new.W_v.weight, old.qkv.weight[2 * c:]) and torch.equal(new.W_v.bias, old.qkv.bias[2 * c:])
    assert torch.equal(new.ff.weight, old.proj.weight) and torch.equal(new.ff.bias, old.proj.bias)
    grid = torch.randn(1, 64, 14, 14)
    torch.testing.assert_close(new.Qlandmark_op(grid), torch.nn.functional.avg_pool2d(grid, 2))
    assert not new.conv.weight.any()


@pytest.mark.parametrize("mixer", ["laplacian", "nystromformer", "soft"])
def test_local_convolutions_start_at_zero(teacher, mixer):
    student = vitmix.convert(teacher, mixer)
    assert all(not p.any() for b in student.blocks for p in b.attn.conv.parameters())


def test_linformer_projections_start_as_average_pooling(teacher, images):
    """With k = N the pooling is the identity, so the converted layer is the teacher's softmax attention."""
    student = vitmix.convert(teacher, "linformer", k=197)
    with torch.no_grad():
        torch.testing.assert_close(student(images), teacher(images), rtol=1e-4, atol=1e-4)
    pooled = vitmix.convert(teacher, "linformer", k=64).blocks[0].attn.compress_k
    assert pooled.shape == (64, 197)
    torch.testing.assert_close(pooled.sum(-1), torch.ones(64))     # each row averages its segment of tokens
    assert ((pooled > 0).sum(0) >= 1).all()                         # every token is in a segment
    assert (pooled[0, :4] == 0.25).all() and not pooled[0, 4:].any()   # row 0: the mean of tokens 0-3


@pytest.mark.parametrize("mixer", ["laplacian", "soft", "linformer", "fibottention"])
def test_a_converted_model_loads_into_the_model_vitmix_builds_for_that_mixer(teacher, mixer):
    """So a converted model saves and reloads like any vitmix model of that mixer."""
    state = vitmix.convert(teacher, mixer).state_dict()
    vitmix.create_model(DEIT, mixer=mixer).load_state_dict(state, strict=True)


def test_the_grid_and_layer_numbers_are_set_as_create_model_sets_them(teacher):
    student = vitmix.convert(teacher, "fibottention")
    layers = [m for _, m in find_attention_layers(student)]
    assert [m.layer_idx for m in layers] == list(range(12))
    assert all(m.hw == (14, 14) and m.num_prefix_tokens == 1 for m in layers)
    assert all(m.seq_len == 197 for m in (b.attn for b in vitmix.convert(teacher, "linformer").blocks))


def test_vitmix_models_convert_from_their_softmax_mixer():
    teacher = vitmix.create_model("vit_nano_patch4_32", mixer="softmax", img_size=(32, 48)).eval()
    student = vitmix.convert(teacher, "laplacian", landmark_stride=2)
    assert all(isinstance(b.attn, vitmix.mixers.get_mixer_class("laplacian")) for b in student.blocks)
    assert student.blocks[0].attn.hw == (8, 12)                          # the real, non-square grid
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        assert torch.equal(vitmix.convert(teacher, "softmax")(x), teacher(x))
        assert student(x).shape == (2, 10)


def test_inplace_converts_the_model_itself():
    model = timm.create_model(DEIT, depth=2, img_size=64)
    assert vitmix.convert(model, "linear", inplace=True) is model
    assert all(isinstance(b.attn, TokenMixer) for b in model.blocks)


def test_teacher_options_are_kept_qk_norm_with_its_own_eps():
    teacher = timm.create_model(DEIT, depth=1, img_size=64, qk_norm=True).eval()
    with torch.no_grad():
        teacher.blocks[0].attn.q_norm.weight.uniform_(0.5, 1.5)
    student = vitmix.convert(teacher, "softmax")
    assert student.blocks[0].attn.q_norm.eps == teacher.blocks[0].attn.q_norm.eps == 1e-6
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(student(x), teacher(x))


# --- from files: vitmix runs/checkpoints, timm checkpoints ------------------------------------------------------
def _vitmix_checkpoint(path, mixer="softmax"):
    from vitmix.train.checkpoint import save_weights

    model = vitmix.create_model("vit_nano_patch4_32", mixer=mixer)
    save_weights(model, path / "best.safetensors", dict(model="vit_nano_patch4_32", mixer=mixer, mixer_options={},
                                                        num_classes=10, in_chans=3, img_size=32))
    return model


def test_a_run_directory_converts_and_its_checkpoint_is_not_modified(tmp_path):
    model = _vitmix_checkpoint(tmp_path)
    before = sha256(tmp_path / "best.safetensors")
    for source in (tmp_path, tmp_path / "best.safetensors", str(tmp_path)):
        student = vitmix.convert(source, "soft_norm")
        assert all(isinstance(b.attn, vitmix.mixers.get_mixer_class("soft_norm")) for b in student.blocks)
        assert torch.equal(student.head.weight.cpu(), model.head.weight)
    assert sha256(tmp_path / "best.safetensors") == before


def test_a_timm_checkpoint_file_loads_with_timms_own_loading(deit_file, teacher):
    loaded = load_timm_checkpoint(DEIT, deit_file)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), teacher.state_dict().values()))


# --- bad input: one-line ValueErrors naming the layer and the mismatch ------------------------------------------
def _one_line(err):
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_model_without_attention_layers_is_a_one_line_error():
    with pytest.raises(ValueError, match="Sequential has no attention layers") as err:
        vitmix.convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), "laplacian")
    _one_line(err)


@pytest.mark.parametrize("options, expected", [
    (dict(num_heads=4), r"blocks\.0\.attn: soft num_heads=4 does not fit the teacher layer's num_heads=3"),
    (dict(dim=128), r"blocks\.0\.attn: soft dim=128 does not fit the teacher layer's dim=192"),
    (dict(num_landmarks=None, landmark_stride=4), r"blocks\.0\.attn: soft does not fit the teacher's 14x14 token grid"),
    (dict(landmark_strid=2), r"no option 'landmark_strid'.*Did you mean: landmark_stride"),
])
def test_options_that_do_not_fit_the_teacher_are_one_line_errors(teacher, options, expected):
    with pytest.raises(ValueError, match=expected) as err:
        vitmix.convert(teacher, "soft", **options)
    _one_line(err)


@pytest.mark.parametrize("mixer, options, expected", [
    ("linformer", dict(seq_len=100), r"blocks\.0\.attn: cannot convert to linformer: seq_len=100 disagrees"),
    ("soft", dict(), r"blocks\.0\.attn: cannot convert to soft: .*qk_norm"),
])
def test_mixer_errors_name_the_layer(mixer, options, expected):
    teacher = timm.create_model(DEIT, depth=1, img_size=224, qk_norm=mixer == "soft").eval()
    with pytest.raises(ValueError, match=expected) as err:
        vitmix.convert(teacher, mixer, **options)
    _one_line(err)


def test_the_teachers_own_width_and_heads_may_be_repeated():
    teacher = timm.create_model(DEIT, depth=1, img_size=64).eval()
    student = vitmix.convert(teacher, "laplacian", dim=192, num_heads=3, rope=True)   # head dim 64 takes RoPE
    assert student.blocks[0].attn.num_heads == 3 and student.blocks[0].attn.rope


def test_a_layer_with_no_qkv_to_carry_over_is_a_one_line_error():
    teacher = vitmix.create_model("vit_nano_patch4_32", mixer="soft")
    with pytest.raises(ValueError, match=r"blocks\.0\.attn \(SoftAttention\) has no fused qkv and proj") as err:
        vitmix.convert(teacher, "laplacian")
    _one_line(err)


def test_a_checkpoint_whose_shapes_do_not_match_its_model_is_a_one_line_error(tmp_path, deit_file):
    from vitmix.train.checkpoint import save_weights

    model = vitmix.create_model("vit_nano_patch4_32", mixer="softmax", embed_dim=64)
    save_weights(model, tmp_path / "best.safetensors", dict(model="vit_nano_patch4_32", mixer="softmax",
                                                             num_classes=10, in_chans=3, img_size=32))
    before = sha256(tmp_path / "best.safetensors")
    with pytest.raises(ValueError, match=r"best\.safetensors does not match the model: .*with other shapes") as err:
        vitmix.convert(tmp_path, "laplacian")
    _one_line(err)
    with pytest.raises(ValueError, match=r"does not match deit_small_patch16_224: cls_token is \[1, 1, 192\] in the "
                                         r"file, \[1, 1, 384\] in the model") as err:
        load_timm_checkpoint("deit_small_patch16_224", deit_file)
    _one_line(err)
    assert sha256(tmp_path / "best.safetensors") == before
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_timm_checkpoint(DEIT, tmp_path / "missing.safetensors")


def test_load_attention_names_a_tensor_the_mixer_lacks_or_has_in_another_shape():
    layer = vitmix.create_mixer("linear", 64, 2)
    with pytest.raises(ValueError, match=r"LinearAttention has no 'gate\.weight' to take the teacher's weights"):
        layer.load_attention({"gate.weight": torch.zeros(64, 64)})
    with pytest.raises(ValueError, match=r"LinearAttention\.qkv\.weight has shape \(192, 64\), the teacher.s \(96, 3"):
        layer.load_attention({"qkv.weight": torch.zeros(96, 32)})
