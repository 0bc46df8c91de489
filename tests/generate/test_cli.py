"""``vitmix generate train | sample | fd`` end to end on the bundled digits (tiny models, a few steps):
run directory, per-epoch grids, exact resume, sampling, FD, one-line errors."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from vitmix.cli import main
from vitmix.generate import runner
from vitmix.generate.runner import FD_CLASSIFIER, default_classifier_images, default_fd_samples
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


@pytest.fixture
def classifier_sizes(monkeypatch, tmp_path):
    """The training-set size of every FD classifier trained in the test (with an empty cache of its own)."""
    sizes, train = [], runner.train_feature_net

    def counting(images, labels, *args, **kwargs):
        sizes.append(len(images))
        return train(images, labels, *args, **kwargs)

    monkeypatch.setattr(runner, "train_feature_net", counting)
    monkeypatch.setattr(runner, "_fd_cache_dir", lambda: tmp_path / "fd-cache")
    return sizes


def _fd(run_dir):
    return json.loads((run_dir / "fd.json").read_text())


def test_fd_samples_0_skips_the_fd_and_still_ends_with_a_final_line(tmp_path, capsys):
    assert _train(tmp_path / "run", "--epochs", "1", "--fd-samples", "0") == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("done: 1 epoch, 2 steps in ") and "FD skipped (--fd-samples 0)" in last
    assert f"run dir {tmp_path / 'run'}" in last
    assert not (tmp_path / "run" / "fd.json").exists() and not (tmp_path / "run" / FD_CLASSIFIER).exists()


def test_the_fd_classifier_trains_on_the_subset_the_option_gives(tmp_path, classifier_sizes):
    assert _train(tmp_path / "run", "--epochs", "1", "--fd-samples", "4", "--fd-classifier-subset", "100") == 0
    assert classifier_sizes == [100]
    assert _fd(tmp_path / "run")["fd_classifier_images"] == 100 and _fd(tmp_path / "run")["fd_samples"] == 4
    assert load_weights(tmp_path / "run" / FD_CLASSIFIER)[1]["train_images"] == 100


def test_by_default_the_fd_step_scales_with_the_run(tmp_path, classifier_sizes, capsys):
    """TINY trains 2 steps of 32 images with 3 DDIM steps: 64 // 3 = 21 samples, and a classifier of
    1000 of the 1437 digits (the floor), not all of them as before."""
    assert _train(tmp_path / "run", "--epochs", "1") == 0
    fd = _fd(tmp_path / "run")
    assert fd["fd_samples"] == default_fd_samples(64, 3) == 21
    assert classifier_sizes == [fd["fd_classifier_images"]] == [default_classifier_images(64, 1437)] == [1000]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("done: 1 epoch, 2 steps in ") and f"FD (classifier features) {fd['fd']:.3f} over 21" in last


@pytest.mark.parametrize("images_seen,steps,expected", [
    (64, 3, 21), (10, 50, 2), (512, 10, 51), (32_000, 20, 1000), (600_000, 50, 1000)])
def test_default_fd_samples_follow_the_training_compute(images_seen, steps, expected):
    assert default_fd_samples(images_seen, steps) == expected


@pytest.mark.parametrize("run_images,available,expected", [
    (64, 1437, 1000), (512, 60_000, 1000), (30_000, 60_000, 30_000), (60_000, 60_000, 60_000), (64, 300, 300)])
def test_default_classifier_images_follow_the_run(run_images, available, expected):
    assert default_classifier_images(run_images, available) == expected


def test_runs_on_the_same_data_share_the_cached_classifier(tmp_path, classifier_sizes, capsys):
    for name, seed in (("a", "0"), ("b", "1")):      # the classifier does not depend on the run's seed
        assert _train(tmp_path / name, "--epochs", "1", "--fd-samples", "4", "--fd-classifier-subset", "200",
                      "--seed", seed) == 0
    assert classifier_sizes == [200] and capsys.readouterr().out.count("training the FD") == 1
    a, b = (_weights(tmp_path / name / FD_CLASSIFIER) for name in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _train(tmp_path / "c", "--epochs", "1", "--fd-samples", "4", "--fd-classifier-subset", "300") == 0
    assert classifier_sizes == [200, 300]                                       # another subset: another net


def test_a_corrupt_cached_classifier_is_trained_again(tmp_path, classifier_sizes):
    argv = ("--epochs", "1", "--fd-samples", "4", "--fd-classifier-subset", "80")
    assert _train(tmp_path / "a", *argv) == 0
    (cached,) = (tmp_path / "fd-cache").iterdir()
    cached.write_bytes(cached.read_bytes()[:100])                              # a write cut short
    assert _train(tmp_path / "b", *argv) == 0 and classifier_sizes == [80, 80]
    assert load_weights(cached)[1]["train_images"] == 80                        # rewritten whole


def test_fd_command_with_a_classifier_subset_leaves_the_runs_classifier(run, classifier_sizes, capsys):
    before = (run / FD_CLASSIFIER).read_bytes()
    assert main(["generate", "fd", "--checkpoint", str(run), "--samples", "4", "--steps", "2",
                 "--classifier-subset", "50"]) == 0
    assert classifier_sizes == [50] and "(trained on 50 images)" in capsys.readouterr().out
    assert (run / FD_CLASSIFIER).read_bytes() == before


def test_fd_command_trains_a_missing_shared_classifier_into_its_path(run, tmp_path, classifier_sizes):
    shared = tmp_path / "shared.safetensors"
    argv = ["generate", "fd", "--checkpoint", str(run), "--samples", "4", "--steps", "2", "--classifier", str(shared),
            "--classifier-subset", "60"]
    assert main(argv) == 0 and shared.is_file()
    assert main(argv) == 0 and classifier_sizes == [60]                         # the second call loads it


@pytest.mark.parametrize("argv,message", [
    (["generate", "sample", "--checkpoint", "{run}", "--classes", "0,12"], "classes are 0..9 (12 is not)"),
    (["generate", "sample", "--checkpoint", "{run}", "--classes", "a,b"], "give class indices separated by commas"),
    (["generate", "sample", "--checkpoint", "{tmp}/missing"], "does not exist"),
    (["generate", "train", "--model", "dit_nano_patch3"], "'dit_nano_patch3'. Did you mean: dit_nano_patch2"),
    (["generate", "train", "--model", "vit_nano_patch4_32"], "is a classifier"),
    (["generate", "train", "--data", "fashion-mnist", "--data-dir", "{tmp}"], "Fashion-MNIST file"),
    (["generate", "train", "--data", "digitz"], "unknown dataset 'digitz'. Did you mean: digits"),
    (["generate", "train", "--schedule", "cosin"], "--schedule 'cosin'"),
    (["generate", "train", "--fd-classifier-subset", "0"], "--fd-classifier-subset 0 must be a positive integer"),
    (["generate", "train", "--data", "digits", "--fd-classifier-subset", "5000", "--out", "{tmp}/r"],
     "--fd-classifier-subset 5000 must be between 1 and the 1437 training images"),
    (["generate", "train", "--out", "{run}", "--resume", "--lr", "0.1"], "--resume: --lr 0.1 differs"),
    (["generate", "train", "--out", "{run}"], "already holds a run"),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, argv, message):
    argv = [a.format(run=run, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitmix generate: error:") and message in err and "\n" not in err
