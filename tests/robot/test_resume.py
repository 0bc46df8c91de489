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
