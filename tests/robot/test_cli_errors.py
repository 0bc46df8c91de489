"""`vitmix robot` input errors: one line on stderr, exit 2, nothing of the user's overwritten."""
import hashlib
import sys

import pytest
import torch

from vitmix.cli import main
from vitmix.robot.policy import DiffusionPolicy
from vitmix.runs.checkpoints import save_weights

from .conftest import needs_h5py, write_demos


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_missing_simulator_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "robosuite", None)          # forces ImportError on import
    _one_line_error(capsys, ["robot", "demos", "--task", "lift", "--episodes", "1", "--out", str(tmp_path / "d")],
                    "pip install 'vitmix[robot]'", "is not installed")
    assert not (tmp_path / "d").exists()


@needs_h5py
def test_missing_pusht_physics_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymunk", None)
    _one_line_error(capsys, ["robot", "demos", "--task", "pusht", "--episodes", "1", "--out", str(tmp_path / "d")],
                    "pip install 'vitmix[robot]'", "pusht task needs pymunk and shapely")
    assert not (tmp_path / "d").exists()


def test_unknown_task_suggests_close_names(tmp_path, capsys):
    _one_line_error(capsys, ["robot", "demos", "--task", "lfit", "--out", str(tmp_path / "d")],
                    "unknown robot task 'lfit'", "Did you mean: lift")


@needs_h5py
def test_demos_never_overwrite_a_recording(tmp_path, capsys):
    write_demos(tmp_path / "d" / "demos.hdf5")
    before = _tree(tmp_path)
    _one_line_error(capsys, ["robot", "demos", "--task", "lift", "--episodes", "1", "--out", str(tmp_path / "d")],
                    "already exists")
    assert _tree(tmp_path) == before


@needs_h5py
@pytest.mark.parametrize("case", ["other task", "truncated", "missing"])
def test_train_rejects_bad_demonstrations_before_writing(tmp_path, capsys, case):
    demos = write_demos(tmp_path / "demos" / "demos.hdf5", task="can" if case == "other task" else "lift")
    if case == "truncated":
        demos.write_bytes(demos.read_bytes()[:4000])
    elif case == "missing":
        demos.unlink()
    needle = {"other task": "demonstrations of 'can', not 'lift'", "truncated": "may be truncated",
              "missing": "no demonstrations at"}[case]
    _one_line_error(capsys, ["robot", "train", "--task", "lift", "--demos", str(demos), "--steps", "1",
                             "--out", str(tmp_path / "run")], needle)
    assert not (tmp_path / "run").exists()


def _policy_run(tmp_path, task="lift"):
    run = tmp_path / "run"
    run.mkdir()
    meta = {"task": task, "mixer": "softmax", "fibottention": "official", "encoder": "small",
            "proprio_min": [-1.0] * 9, "proprio_max": [1.0] * 9, "cameras": ["agentview", "robot0_eye_in_hand"],
            "n_obs": 2, "horizon": 16, "n_action": 8, "step": 1, "demos": 1, "seed": 0}
    torch.manual_seed(0)
    save_weights(DiffusionPolicy(), run / "ema.safetensors", meta)
    return run


def test_eval_rejects_the_wrong_task_and_zero_rollouts(tmp_path, capsys):
    run = _policy_run(tmp_path)
    before = _tree(tmp_path)
    _one_line_error(capsys, ["robot", "eval", str(run), "--task", "can", "--rollouts", "1"],
                    "is a 'lift' policy; it cannot be evaluated on 'can'")
    _one_line_error(capsys, ["robot", "eval", str(run), "--rollouts", "0"], "--rollouts must be a positive integer")
    _one_line_error(capsys, ["robot", "eval", str(tmp_path / "nothing"), "--rollouts", "1"], "does not exist")
    assert _tree(tmp_path) == before
