"""A training run killed in the middle of writing a checkpoint continues from the last complete one
(synthetic demonstrations, no simulator)."""
import json

import pytest
import torch

from vitmix.robot import runner
from vitmix.robot.runner import RobotTrainConfig, train_policy
from vitmix.runs.checkpoints import load_weights

from .conftest import needs_h5py, write_demos

pytestmark = needs_h5py


def test_killed_mid_checkpoint_resumes_from_the_last_complete_one(tmp_path, monkeypatch):
    demos = write_demos(tmp_path / "demos" / "demos.hdf5")
    cfg = dict(task="lift", demos=str(demos), batch_size=2, save_every=2, out=str(tmp_path / "run"), device="cpu")
    real = runner.save_manifest
    calls = []

    def killed_on_the_second(*args, **kwargs):
        calls.append(args[3])
        if len(calls) == 2:                     # the weights of step 4 are written, its manifest is not
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "save_manifest", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        train_policy(RobotTrainConfig(steps=6, **cfg), log=lambda *_: None)
    assert load_weights(tmp_path / "run" / "ema.safetensors")[1]["step"] == 4
    monkeypatch.setattr(runner, "save_manifest", real)
    # resuming rewrites the stale weights from the manifest (step 2), even when there is nothing left to train
    train_policy(RobotTrainConfig(steps=2, resume=True, **cfg), log=lambda *_: None)
    assert load_weights(tmp_path / "run" / "ema.safetensors")[1]["step"] == 2
    lines = []
    train_policy(RobotTrainConfig(steps=6, resume=True, **cfg), log=lines.append)
    assert any("steps 3..6" in line for line in lines)
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [2, 4, 6]
    state, meta = load_weights(tmp_path / "run" / "ema.safetensors")
    assert meta["step"] == 6 and all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_a_run_that_diverged_before_its_first_checkpoint_can_be_retried_in_the_same_out(tmp_path, monkeypatch):
    """Regression: a non-finite loss left no aborted.json, so the retry into the same --out was refused as
    "already holds a run" (vitmix train's rule, tests/train/test_run_dir.py, shared by every task)."""
    from vitmix.robot.policy import DiffusionPolicy

    demos = write_demos(tmp_path / "demos" / "demos.hdf5")
    cfg = dict(task="lift", demos=str(demos), batch_size=2, save_every=2, steps=2, out=str(tmp_path / "run"),
               device="cpu")
    real = DiffusionPolicy.loss
    monkeypatch.setattr(DiffusionPolicy, "loss", lambda *a, **k: real(*a, **k) * float("nan"))
    with pytest.raises(FloatingPointError, match="loss became nan.*finished no epoch, so the retry may use the same"):
        train_policy(RobotTrainConfig(**cfg), log=lambda *_: None)
    assert json.loads((tmp_path / "run" / "aborted.json").read_text())["reason"].startswith("the loss became nan")
    monkeypatch.undo()
    train_policy(RobotTrainConfig(**cfg), log=lambda *_: None)
    assert not (tmp_path / "run" / "aborted.json").exists() and (tmp_path / "run" / "state.pt").is_file()
