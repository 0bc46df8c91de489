"""Reading checkpoint files a user hands over (issue 44 items 5, 6 and 8): one reader for every entry
point, and a one-line message in vitmix's words for an empty file, a pickle that holds code, and a plain
torch state dict where a vitmix checkpoint is needed."""
import os
import shutil

import pytest
import torch

import vitmix
from vitmix.cli import main
from vitmix.runs import load_state, read_checkpoint, read_state_dict
from vitmix.train import TrainConfig, train

TINY = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, warmup_epochs=0, mixer="softmax",
            model_options={"depth": 1, "embed_dim": 32, "num_heads": 2}, train_subset=64)
FLAGS = ["--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16", "--model-option", "depth=1",
         "--model-option", "embed_dim=32", "--model-option", "num_heads=2", "--train-subset", "64",
         "--batch-size", "64", "--warmup-epochs", "0", "--epochs", "1", "--max-steps", "1"]


class Bomb:
    """Unpickling it would create the file ``path``: proof that code ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.makedirs, (self.path,))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    train(TrainConfig(**TINY, epochs=1, max_steps=1, out=str(out)), log=lambda *a: None)
    return out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitmix ") and "Traceback" not in err[0], err
    return err[0]


def test_an_empty_pt_is_a_one_line_error_at_every_entry_point(run, tmp_path, capsys):
    """Regression (item 5): an empty .pt crashed the error formatter itself (IndexError, 42-44 lines)."""
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert main(["train", "--init-from", str(empty), "--mixer", "soft", *FLAGS, "--out", str(tmp_path / "a")]) == 2
    assert f"{empty} is not a loadable checkpoint: it is empty, truncated or corrupt" in _one_line(capsys)
    assert main(["analyze", "approx", "--checkpoint", str(empty), "--out", str(tmp_path / "b")]) == 2
    assert "is not a loadable checkpoint: it is empty, truncated or corrupt" in _one_line(capsys)
    resumable = tmp_path / "run"
    shutil.copytree(run, resumable)
    (resumable / "state.pt").write_bytes(b"")
    assert main(["train", "--out", str(resumable), "--resume"]) == 2
    assert f"{resumable / 'state.pt'} is not a loadable training state: it is empty" in _one_line(capsys)


@pytest.mark.parametrize("name", ["state.pt", "weights.pt", "weights.pth", "weights.bin"])
def test_a_pickle_that_holds_code_is_refused_in_vitmix_words_and_never_runs(tmp_path, name):
    """Regression (item 6): the message was torch's, cut at 200 characters, ending with its advice to
    re-run with weights_only=False before the arbitrary-code caveat."""
    ran = tmp_path / "the-bomb-ran"
    bomb = tmp_path / name
    torch.save({"weight": torch.zeros(2), "payload": Bomb(ran)}, bomb)
    for read in (load_state, read_state_dict, read_checkpoint):
        with pytest.raises(ValueError) as err:
            read(bomb)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{bomb} is not a loadable ")
        assert "holds pickled code (os.makedirs)" in message
        assert "vitmix will not unpickle it, since that could run arbitrary code" in message
        assert f"If you trust its source, convert it once: in Python, torch.load('{bomb}', weights_only=False)" \
            in message and message.endswith("and give that file")
    assert not ran.exists()


def test_a_plain_state_dict_is_named_as_such_at_every_entry_point(tmp_path, capsys):
    """Regression (item 8): a plain .pt worked with --init-from, but vitmix.convert, vitmix eval and
    save_pretrained called it "not a readable safetensors checkpoint ... truncated or corrupt"."""
    model = vitmix.create_model("vit_nano_patch4_32", num_classes=10, img_size=16, in_chans=1, depth=1,
                                embed_dim=32, num_heads=2)
    plain = tmp_path / "weights.pt"
    torch.save(model.state_dict(), plain)
    expected = f"{plain} is a torch state dict: weights without the vitmix metadata of their model"
    for call in (lambda: vitmix.convert(plain, "soft"), lambda: vitmix.load_model(plain),
                 lambda: vitmix.save_pretrained(plain, tmp_path / "hub")):
        with pytest.raises(ValueError, match="is a torch state dict") as err:
            call()
        assert str(err.value).startswith(expected) and "corrupt" not in str(err.value)
    assert not (tmp_path / "hub").exists()
    assert main(["eval", str(plain)]) == 2
    line = _one_line(capsys)
    assert expected in line and f"vitmix train --init-from {plain} --model NAME --mixer NAME" in line
    state, meta = read_checkpoint(plain)                    # the one reader: the weights, no metadata
    assert meta == {} and state.keys() == model.state_dict().keys()
    assert main(["train", "--init-from", str(plain), "--mixer", "soft", *FLAGS, "--out", str(tmp_path / "r")]) == 0


def test_the_format_is_read_from_the_file_not_its_name(tmp_path):
    """A torch file under another suffix (.ckpt) and a safetensors file named .pt read as what they are."""
    from safetensors.torch import save_file

    weights = {"w": torch.arange(3.0)}
    torch.save({"state_dict": weights}, tmp_path / "model.ckpt")
    save_file(weights, str(tmp_path / "model.pt"), metadata={"vitmix": '{"epoch": 1}'})
    state, meta = read_checkpoint(tmp_path / "model.ckpt")
    assert meta == {} and torch.equal(state["w"], weights["w"])
    state, meta = read_checkpoint(tmp_path / "model.pt")
    assert meta == {"epoch": 1} and torch.equal(state["w"], weights["w"])
