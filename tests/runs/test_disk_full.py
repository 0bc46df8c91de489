"""A full disk while a checkpoint is written (issue 44 item 4): one line naming the folder and the
space needed, nothing partial left, and --resume goes on from the last complete set."""
import errno
import re
import shutil
from collections import namedtuple

import pytest
import torch

from vitmix.cli import main
from vitmix.runs import checkpoints, load_state, save_state, save_text

FLAGS = ["--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16", "--mixer", "softmax",
         "--model-option", "depth=1", "--model-option", "embed_dim=32", "--model-option", "num_heads=2",
         "--train-subset", "128", "--batch-size", "64", "--warmup-epochs", "0", "--epochs", "2"]
Usage = namedtuple("Usage", "total used free")


def _full_disk_in_epoch(monkeypatch, epoch: int):
    """safetensors' writer fails with ENOSPC on the weights of epoch ``epoch``, after writing part of them."""
    real = checkpoints.save_file

    def save_file(state, tmp, metadata=None):
        if metadata and f'"epoch": {epoch},' in metadata["vitmix"]:
            with open(tmp, "wb") as fh:
                fh.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(state, tmp, metadata=metadata)

    monkeypatch.setattr(checkpoints, "save_file", save_file)


def test_a_full_disk_is_one_line_naming_the_folder_and_the_space_and_resume_recovers(tmp_path, monkeypatch, capsys):
    """Regression: a 30-41-line traceback."""
    out = tmp_path / "run"
    _full_disk_in_epoch(monkeypatch, 2)
    assert main(["train", *FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.match(rf"vitmix train: error: no space left in {re.escape(str(out))} to write (best|last).safetensors "
                    r"\(about [0-9.]+ MB needed, [0-9.]+ MB free\): free some space there", err[0]), err[0]
    assert "run the command again (a training run continues with --resume)" in err[0]
    size_mb = (out / "last.safetensors").stat().st_size / 2**20     # epoch 1's weights: the size asked for
    assert f"about {size_mb:.1f} MB needed" in err[0]
    assert not list(out.glob(".*.tmp")) and load_state(out / "state.pt")["epoch"] == 1
    monkeypatch.undo()
    assert main(["train", "--out", str(out), "--resume"]) == 0
    assert load_state(out / "state.pt")["epoch"] == 2


def test_torch_save_reports_a_full_disk_by_the_free_space(tmp_path, monkeypatch):
    """torch.save's zip writer says "file write failed" (a RuntimeError, no errno): the free space
    below the state's size tells that the disk is full."""
    def failing_save(obj, f):
        open(f, "wb").write(b"\0" * 10)
        raise RuntimeError("[enforce fail at inline_container.cc] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(torch, "save", failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * 2**20, 10 * 2**20 - 2**19, 2**19))
    with pytest.raises(OSError) as err:
        save_state(tmp_path / "state.pt", {"model": {"w": torch.zeros(2**18)}})          # 1 MB
    assert err.value.errno == errno.ENOSPC
    assert err.value.strerror.startswith(f"no space left in {tmp_path} to write state.pt (about 1.0 MB needed, "
                                         "0.5 MB free)")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * 2**30, 0, 10 * 2**30))
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):                       # not a full disk
        save_state(tmp_path / "state.pt", {"model": {"w": torch.zeros(4)}})
    assert list(tmp_path.iterdir()) == []


def test_a_text_file_on_a_full_disk(tmp_path, monkeypatch):
    def write_text(self, text):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(type(tmp_path), "write_text", write_text)
    with pytest.raises(OSError, match=rf"no space left in {tmp_path} to write metrics.jsonl \(about 0.0 MB needed"):
        save_text(tmp_path / "metrics.jsonl", "{}\n")
