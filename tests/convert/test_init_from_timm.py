"""``--init-from`` with a timm teacher: a timm model's weights file (``--model NAME --init-from FILE``) and a model
shared the timm way (``local-dir:DIR``; ``hf-hub:`` goes through the same timm helpers, with the Hub's download).

The weights are a DeiT-Tiny state dict in timm's layout (one block, random weights) written by the test; the
student trains on digits (1 channel, 10 classes, 32×32), so timm's checkpoint filter fits the teacher's patch
embedding, head and position embeddings to the data. No network."""
import json

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitmix
from vitmix.cli import main
from vitmix.data.datasets import DIGITS_INFO
from vitmix.train import TrainConfig
from vitmix.train import init_from

pytestmark = pytest.mark.usefixtures("one_thread")

DEIT = "deit_tiny_patch16_224"
RUN = ["--img-size", "32", "--epochs", "1", "--max-steps", "1", "--train-subset", "32", "--batch-size", "16"]


@pytest.fixture(scope="module")
def deit_state():
    torch.manual_seed(0)
    return {k: v.contiguous() for k, v in timm.create_model(DEIT, depth=1).state_dict().items()}


@pytest.fixture(scope="module")
def deit_file(deit_state, tmp_path_factory):
    path = tmp_path_factory.mktemp("deit") / "deit_tiny.safetensors"
    save_file(deit_state, str(path))
    return path


def _teacher(init, **flags):
    source = init_from.find_teacher(init)
    cfg = init_from.teacher_config(TrainConfig(mixer="laplacian", img_size=32, **flags), source)
    return source, cfg, init_from.load_teacher(source, cfg, DIGITS_INFO, 32, "cpu")


def test_a_timm_weights_file_is_read_through_timms_filter_for_the_data(deit_file, deit_state):
    source, cfg, teacher = _teacher(str(deit_file), model=DEIT, model_options={"depth": 1})
    state = teacher.state_dict()
    assert cfg.model == DEIT and source.meta == {}
    torch.testing.assert_close(state["blocks.0.mlp.fc1.weight"], deit_state["blocks.0.mlp.fc1.weight"], rtol=0, atol=0)
    torch.testing.assert_close(state["blocks.0.attn.qkv.weight"], deit_state["blocks.0.attn.qkv.weight"], rtol=0,
                               atol=0)
    # 1 channel: timm sums the RGB filters; 10 classes: a new head; 32²: 2×2 position embeddings + CLS
    torch.testing.assert_close(state["patch_embed.proj.weight"], deit_state["patch_embed.proj.weight"].sum(1, True))
    assert state["head.weight"].shape == (10, 192) and state["pos_embed"].shape == (1, 5, 192)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_a_weights_file_of_another_architecture_is_a_one_line_error(deit_file, tmp_path, capsys):
    out = tmp_path / "student"
    code = main(["train", "--model", "deit_small_patch16_224", "--model-option", "depth=1",
                 "--init-from", str(deit_file), "--mixer", "soft", *RUN, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "does not match deit_small_patch16_224: cls_token" in err
    assert not out.exists()


@pytest.fixture(scope="module")
def shared_deit(deit_state, tmp_path_factory):
    model = vitmix.create_model(DEIT, depth=1)
    model.load_state_dict(deit_state)
    return vitmix.save_pretrained(model, tmp_path_factory.mktemp("shared") / "deit")


def test_a_local_dir_teacher_gives_the_architecture_and_trains(shared_deit, deit_state, tmp_path):
    source, cfg, teacher = _teacher(f"local-dir:{shared_deit}")
    assert (cfg.model, cfg.model_options["depth"], cfg.init_from) == (DEIT, 1, f"local-dir:{shared_deit}")
    assert not set(cfg.model_options) & {"num_classes", "in_chans", "img_size", "mixer"}      # the data's, the run's
    assert source.checkpoint == shared_deit / "model.safetensors"
    torch.testing.assert_close(teacher.state_dict()["blocks.0.norm1.weight"], deit_state["blocks.0.norm1.weight"])
    out = tmp_path / "student"
    assert main(["train", "--init-from", f"local-dir:{shared_deit}", "--mixer", "soft", *RUN, "--out", str(out)]) == 0
    record = json.loads((out / "init.json").read_text())
    assert record["teacher"]["source"] == f"local-dir:{shared_deit}" and record["teacher"]["model"] == DEIT
    assert record["teacher"]["sha256"] == source.sha256
    student = vitmix.load_model(out)
    assert {b.attn.mixer_name for b in student.blocks} == {"soft"} and len(student.blocks) == 1


def test_bad_timm_teachers_are_one_line_errors(shared_deit, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"--init-from local-dir:.*: no config.json in"):
        init_from.find_teacher(f"local-dir:{tmp_path}")
    source = init_from.find_teacher(f"local-dir:{shared_deit}")
    with pytest.raises(ValueError, match=r"--model 'vit_tiny_patch4_32' differs from the teacher's "
                                         r"'deit_tiny_patch16_224'.*drop the flag"):
        init_from.teacher_config(TrainConfig(model="vit_tiny_patch4_32", mixer="soft"), source)


def test_a_hub_teacher_is_resolved_with_timms_helpers_and_the_hubs_download(shared_deit, monkeypatch):
    """hf-hub: what the Hub would serve is the local-dir folder (its config through timm's reader, its weights
    file through hf_hub_download, which raises for a file the repository does not hold)."""
    import huggingface_hub
    from timm.models import _hub

    asked = []

    def download(repo, name, **kwargs):
        asked.append((repo, name))
        if not (shared_deit / name).is_file():
            raise huggingface_hub.errors.EntryNotFoundError(name)
        return str(shared_deit / name)

    monkeypatch.setattr(_hub, "load_model_config_from_hf", lambda repo, **kw: _hub.load_model_config_from_path(
        shared_deit))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    source = init_from.find_teacher("hf-hub:someone/deit-tiny")
    assert source.timm_id == "hf-hub:someone/deit-tiny" and source.checkpoint == shared_deit / "model.safetensors"
    assert source.timm_model[0] == DEIT and asked == [("someone/deit-tiny", "model.safetensors")]
    (shared_deit / "model.safetensors").rename(shared_deit / "moved")
    try:
        with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin next to its config"):
            init_from.find_teacher("hf-hub:someone/deit-tiny")
    finally:
        (shared_deit / "moved").rename(shared_deit / "model.safetensors")
