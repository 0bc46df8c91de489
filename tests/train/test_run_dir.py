"""What `vitmix train --out DIR` may write into, and what a stopped run says (issue 21 items 1 and 7):
a folder of the user's is never written into, a run that stopped on a non-finite loss before its
first epoch can be retried in the same --out, and Ctrl-C names the --resume command."""
import hashlib
import json

import pytest

from vitmix.cli import main
from vitmix.train import TrainConfig, engine, train
from vitmix.train.checkpoint import load_state

TINY = ["--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16", "--mixer", "softmax",
        "--model-option", "depth=1", "--model-option", "embed_dim=32", "--model-option", "num_heads=2",
        "--train-subset", "128", "--batch-size", "64", "--warmup-epochs", "0"]


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitmix train: "), err
    return err[0]


def test_a_folder_that_is_not_a_run_is_refused_and_left_as_it_was(tmp_path, capsys):
    """Regression: `--out userdir` with the user's metrics.csv and curves.png replaced both, exit 0."""
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "metrics.csv").write_text("my numbers\n")
    (user / "curves.png").write_bytes(b"my plot")
    before = _tree(user)
    assert main(["train", *TINY, "--epochs", "1", "--out", str(user)]) == 2
    assert "non-empty directory that holds no vitmix run (it has curves.png)" in _one_error_line(capsys)
    assert _tree(user) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", *TINY, "--epochs", "1", "--max-steps", "1", "--out", str(empty)]) == 0
    assert (empty / "state.pt").is_file()


def _nan_at_loss_call(monkeypatch, call: int):
    """Make the ``call``-th training loss NaN (once)."""
    real = engine.Recipe.__init__
    calls = {"n": 0}

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        loss_fn = self.loss_fn

        def loss(logits, targets):
            calls["n"] += 1
            value = loss_fn(logits, targets)
            return value * float("nan") if calls["n"] == call else value
        self.loss_fn = loss

    monkeypatch.setattr(engine.Recipe, "__init__", init)


def test_a_run_that_diverged_before_its_first_epoch_can_be_retried_in_the_same_out(tmp_path, monkeypatch, capsys):
    """Regression: after a NaN abort, `--out` held a run, so the retry with a lower --lr was refused
    (and --resume refused the changed --lr)."""
    out = tmp_path / "run"
    _nan_at_loss_call(monkeypatch, 1)
    assert main(["train", *TINY, "--epochs", "1", "--lr", "0.5", "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert "loss became nan" in line and "finished no epoch, so the retry may use the same --out" in line
    assert json.loads((out / "aborted.json").read_text())["reason"].startswith("loss became nan")
    monkeypatch.undo()
    assert main(["train", *TINY, "--epochs", "1", "--lr", "0.003", "--out", str(out)]) == 0
    assert not (out / "aborted.json").exists()
    assert TrainConfig.load(out / "config.yaml").lr == 0.003 and load_state(out / "state.pt")["epoch"] == 1
    # now a finished run: a new run there is refused again
    assert main(["train", *TINY, "--epochs", "1", "--lr", "0.001", "--out", str(out)]) == 2
    assert "already holds a run" in _one_error_line(capsys)


def test_a_run_that_diverged_after_finished_epochs_keeps_them(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _nan_at_loss_call(monkeypatch, 3)                      # 2 steps per epoch: epoch 2's second step
    assert main(["train", *TINY, "--epochs", "2", "--lr", "0.5", "--out", str(out)]) == 2
    assert "keeps the checkpoints of its finished epochs, so train the retry into another --out" in \
        _one_error_line(capsys)
    before = _tree(out)
    monkeypatch.undo()
    assert main(["train", *TINY, "--epochs", "2", "--lr", "0.003", "--out", str(out)]) == 2
    assert "stopped with a non-finite loss and keeps the checkpoints" in _one_error_line(capsys)
    assert _tree(out) == before


def test_ctrl_c_names_the_command_that_continues_the_run(tmp_path, monkeypatch, capsys):
    """Regression: Ctrl-C printed `vitmix train: interrupted` and nothing about --resume."""
    out = tmp_path / "run"
    real = engine.train_one_epoch
    epochs = {"n": 0}

    def interrupted_in_epoch_2(*args, **kwargs):
        epochs["n"] += 1
        if epochs["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr("vitmix.train.runner.train_one_epoch", interrupted_in_epoch_2)
    assert main(["train", *TINY, "--epochs", "2", "--out", str(out)]) == 130
    assert _one_error_line(capsys) == f"vitmix train: interrupted; continue with `vitmix train --out {out} --resume`"
    monkeypatch.undo()
    assert main(["train", "--out", str(out), "--resume"]) == 0
    assert load_state(out / "state.pt")["epoch"] == 2


def test_a_resumed_run_after_a_nan_abort_forgets_the_abort(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _nan_at_loss_call(monkeypatch, 3)
    cfg = TrainConfig(model="vit_nano_patch4_32", data="digits", img_size=16, mixer="softmax", train_subset=128,
                      batch_size=64, warmup_epochs=0, epochs=2, out=str(out),
                      model_options={"depth": 1, "embed_dim": 32, "num_heads": 2})
    with pytest.raises(FloatingPointError):
        train(cfg, log=lambda *a: None)
    monkeypatch.undo()
    cfg.resume = True
    assert train(cfg, log=lambda *a: None)["epochs_run"] == 2
    assert not (out / "aborted.json").exists()


@pytest.mark.parametrize("mixer", ["laplacian", "soft", "soft_norm"])
def test_a_kernel_mixer_that_diverged_is_an_abort_the_retry_replaces(tmp_path, capsys, mixer):
    """Regression (issue 44 item 1): a kernel mixer rejects the non-finite tokens of a diverged step
    before the loss is computed; that error left no aborted.json, so the retry with a sane --lr was
    refused ("already holds a run") and --resume could not change --lr."""
    out = tmp_path / "run"
    kernel = [*TINY[:TINY.index("--mixer")], "--mixer", mixer, *TINY[TINY.index("--mixer") + 2:],
              "--model-option", "depth=2", "--batch-size", "32", "--epochs", "1", "--max-steps", "4"]
    assert main(["train", *kernel, "--lr", "1e6", "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert "the input x contains NaN or Inf" in line and "the retry may use the same --out" in line
    assert "NaN or Inf" in json.loads((out / "aborted.json").read_text())["reason"]
    assert main(["train", *kernel, "--lr", "0.003", "--out", str(out)]) == 0
    assert TrainConfig.load(out / "config.yaml").lr == 0.003 and not (out / "aborted.json").exists()
