"""What ``vitmix train`` / ``export`` say and accept around a finished run (issue 44): a resume says
where it continues and accepts the model's default size as no change, ``--init-from`` names a dense
run as one, and ``vitmix export --checkpoint RUN`` needs no ``--model``."""
from __future__ import annotations

import pytest
import torch

from vitmix.cli import main

SMALL = ["--model-option", "depth=1", "--model-option", "embed_dim=32", "--model-option", "num_heads=2",
         "--batch-size", "64"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-epoch digits run at the model's default size (saved as img_size: null), 2 steps."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", *SMALL, "--epochs", "1", "--max-steps", "2", "--out", str(out)]) == 0
    return out


def test_resume_accepts_the_default_size_and_says_where_it_continues(run, capsys):
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--img-size", "32", "--epochs", "2",
                 "--max-steps", "3"]) == 0
    out = capsys.readouterr()
    assert f"resuming {run} at epoch 2, after 1 finished epoch and 2 steps" in out.out, out.out + out.err
    assert main(["train", "--out", str(run), "--resume", "--img-size", "16", "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert "--img-size 16 differs from the run's unset (the model's default)" in err and "None" not in err


def test_export_takes_the_model_from_the_run(run, tmp_path, capsys):
    out = tmp_path / "model.pt2"
    assert main(["export", "--checkpoint", str(run), "--format", "pt2", "--out", str(out), "--no-verify"]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert main(["export", "--format", "pt2"]) == 2
    assert "give --model NAME" in capsys.readouterr().err


def test_init_from_a_dense_run_says_so(tmp_path, capsys):
    from vitmix.runs import save_weights

    meta = {"task": "segmentation", "model": "vit_nano_patch4_32", "num_classes": 11, "in_chans": 3,
            "img_size": 64, "data": "fashion-scenes"}
    save_weights(torch.nn.Linear(2, 2), tmp_path / "best.safetensors", meta)
    assert main(["train", "--init-from", str(tmp_path), "--mixer", "soft", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a `vitmix dense` segmentation run; --init-from takes a classifier" in err, err
    assert not (tmp_path / "s").exists()
