"""``vitmix generate train | sample | fd`` end to end on the bundled digits (tiny models, a few steps):
run directory, per-epoch grids, exact resume, sampling, FD, one-line errors."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from vitmix.cli import main
from vitmix.train.checkpoint import load_weights

TINY = ["--data", "digits", "--train-subset", "64", "--batch-size", "32", "--sample-steps", "3",
        "--grid-per-class", "2", "--model-option", "embed_dim=32", "--model-option", "depth=2",
        "--model-option", "num_heads=2"]


def _train(out, *extra):
    return main(["generate", "train", "--out", str(out), *TINY, *extra])


def _weights(path):
    return load_weights(path)[0]


def _grid_shape(path, rows, cols, side=32):
    """Images of ``side`` px (8×8 digits enlarged 4×) with 2 px padding around each."""
    return Image.open(path).size == (cols * (side + 2) + 2, rows * (side + 2) + 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "run"
    assert _train(out, "--epochs", "1", "--fd-samples", "20", "--model", "weightformer_dit_nano_patch2") == 0
    return out


def test_train_writes_a_complete_run_directory(run):
    for name in ("config.yaml", "last.safetensors", "ema.safetensors", "metrics.jsonl", "state.pt",
                 "samples/epoch-001.png", "fd_classifier.safetensors", "fd.json", "summary.json"):
        assert (run / name).is_file(), name
    assert _grid_shape(run / "samples" / "epoch-001.png", rows=10, cols=2)   # one row per class
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1] and history[0]["step"] == 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["fd"] > 0 and summary["fd_samples"] == 20 and summary["img_size"] == 8
    assert 0 <= summary["class_agreement"] <= 100 and summary["class_agreement"] * 20 / 100 == pytest.approx(
        round(summary["class_agreement"] * 20 / 100))                     # a share of the 20 samples
    assert load_weights(run / "ema.safetensors")[1]["task"] == "generation"


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert _train(straight, "--epochs", "2", "--fd-samples", "0") == 0
    assert _train(split, "--epochs", "1", "--fd-samples", "0") == 0
    assert main(["generate", "train", "--out", str(split), "--resume", "--epochs", "2"]) == 0
    for name in ("last.safetensors", "ema.safetensors"):
        a, b = _weights(straight / name), _weights(split / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [[json.loads(line)["train_loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]
              for d in (straight, split)]
    assert losses[0] == losses[1] and len(losses[0]) == 2
    assert (split / "samples" / "epoch-002.png").is_file()


def test_sample_writes_one_row_per_requested_class(run, tmp_path):
    out = tmp_path / "grid.png"
    assert main(["generate", "sample", "--checkpoint", str(run), "--classes", "0,3,7", "--n", "4",
                 "--out", str(out), "--steps", "2"]) == 0
    assert _grid_shape(out, rows=3, cols=4)
    again = tmp_path / "again.png"
    main(["generate", "sample", "--checkpoint", str(run), "--classes", "0,3,7", "--n", "4", "--out", str(again),
          "--steps", "2"])
    assert out.read_bytes() == again.read_bytes()                                   # same seed, same grid


def test_fd_command_reuses_the_cached_classifier(run, capsys):
    assert main(["generate", "fd", "--checkpoint", str(run), "--samples", "20", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "FD (classifier features):" in out and "training the FD" not in out


@pytest.mark.parametrize("argv,message", [
    (["generate", "sample", "--checkpoint", "{run}", "--classes", "0,12"], "classes are 0..9 (12 is not)"),
    (["generate", "sample", "--checkpoint", "{run}", "--classes", "a,b"], "give class indices separated by commas"),
    (["generate", "sample", "--checkpoint", "{tmp}/missing"], "does not exist"),
    (["generate", "train", "--model", "dit_nano_patch3"], "'dit_nano_patch3'. Did you mean: dit_nano_patch2"),
    (["generate", "train", "--model", "vit_nano_patch4_32"], "is a classifier"),
    (["generate", "train", "--data", "fashion-mnist", "--data-dir", "{tmp}"], "Fashion-MNIST file"),
    (["generate", "train", "--data", "digitz"], "unknown dataset 'digitz'. Did you mean: digits"),
    (["generate", "train", "--schedule", "cosin"], "--schedule 'cosin'"),
    (["generate", "train", "--out", "{run}", "--resume", "--lr", "0.1"], "--resume: --lr 0.1 differs"),
    (["generate", "train", "--out", "{run}"], "already holds a run"),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, argv, message):
    argv = [a.format(run=run, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitmix generate: error:") and message in err and "\n" not in err
