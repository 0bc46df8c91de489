"""Attention transfer: converted mixers trained layer by layer on their teacher layers' inputs and outputs."""
import pytest
import timm
import torch
from torch.utils.data import DataLoader, TensorDataset

import vitmix
from vitmix.conversion import layer_mse, transfer_attention

pytestmark = pytest.mark.usefixtures("one_thread")

MIXERS = ["laplacian", "soft", "soft_norm", "fibottention", "nystromformer", "performer", "linear", "linformer"]


@pytest.fixture(scope="module")
def teacher():
    """DeiT-Tiny's layers (two of them) with peaked attention: timm's initial q/k/v are so small that every
    mixer starts almost at the (uniform) teacher; scaled up, each has something to learn."""
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", depth=2).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(8)
    return model


@pytest.fixture(scope="module")
def loader():
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4, 3, 224, 224, generator=gen), torch.randint(0, 1000, (4,), generator=gen))
    return DataLoader(data, batch_size=2)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mixer", MIXERS)
def test_a_few_steps_reduce_every_layers_mse_and_touch_only_the_mixers(teacher, loader, mixer):
    student = vitmix.convert(teacher, mixer)
    teacher_before, student_before = _state(teacher), _state(student)
    before = layer_mse(student, teacher, loader, batches=2)
    history = transfer_attention(student, teacher, loader, steps=3, lr=1e-4, progress=False)
    after = layer_mse(student, teacher, loader, batches=2)
    assert list(history) == list(before) == ["blocks.0.attn", "blocks.1.attn"]
    assert all(len(losses) == 3 for losses in history.values())
    assert all(after[name] < before[name] for name in before), (before, after)
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())      # frozen
    changed = {k for k, v in student.state_dict().items() if not torch.equal(v, student_before[k])}
    assert changed and all(k.startswith(("blocks.0.attn.", "blocks.1.attn.")) for k in changed)


def test_epochs_count_passes_over_the_loader_and_modes_come_back(teacher, loader):
    student = vitmix.convert(teacher, "linear").train()
    history = transfer_attention(student, teacher, loader, epochs=2, progress=True)
    assert [len(v) for v in history.values()] == [2 * len(loader)] * 2
    assert student.training and all(m.training for m in student.modules())
    assert not teacher.training


def test_bare_image_batches_and_the_default_of_one_epoch(teacher):
    student = vitmix.convert(teacher, "performer")
    history = transfer_attention(student, teacher, [torch.randn(1, 3, 224, 224)] * 3, progress=False)
    assert [len(v) for v in history.values()] == [3, 3]


def test_bad_input_is_a_one_line_error(teacher, loader):
    student = vitmix.convert(teacher, "linear")
    with pytest.raises(ValueError, match=r"give steps \(2\) or epochs \(1\), not both"):
        transfer_attention(student, teacher, loader, steps=2, epochs=1)
    with pytest.raises(ValueError, match="steps=0 must be a positive integer"):
        transfer_attention(student, teacher, loader, steps=0)
    with pytest.raises(ValueError, match=r"student layer blocks\.0\.attn is not a vitmix mixer \(Attention\)"):
        transfer_attention(teacher, teacher, loader, steps=1)
    other = vitmix.convert(timm.create_model("deit_tiny_patch16_224", depth=3), "linear")
    with pytest.raises(ValueError, match=r"student layer blocks\.2\.attn is not a vitmix mixer \(no such module\)"):
        transfer_attention(student, other, loader, steps=1)
    with pytest.raises(ValueError, match="loader yields no batches"):
        transfer_attention(student, teacher, [], steps=1)


def test_a_diverging_layer_is_named(teacher, loader):
    student = vitmix.convert(teacher, "softmax")
    with torch.no_grad():
        student.blocks[1].attn.proj.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"MSE of layer blocks\.1\.attn is not finite at step 1; lower lr"):
        transfer_attention(student, teacher, loader, steps=2, progress=False)
