"""Each task end to end at smoke size, through the CLI: 3 expert demonstrations (all succeed: the
experts' success on seeded episodes), 20 training steps with a resume half-way, 2 rollouts."""
import csv
import json

import pytest

from vitmix.cli import main

from .conftest import needs_simulator

pytestmark = needs_simulator


@pytest.mark.parametrize("task", ["lift", "can"])
def test_demos_train_resume_eval(tmp_path, task, capsys):
    import h5py

    demos, run = tmp_path / "demos", tmp_path / "run"
    assert main(["robot", "demos", "--task", task, "--episodes", "3", "--out", str(demos)]) == 0
    with h5py.File(demos / "demos.hdf5") as f:
        data = f["data"]
        assert data.attrs["task"] == task and data.attrs["expert_success_rate"] == 1.0 and len(data) == 3
        demo = data["demo_0"]
        n = demo.attrs["num_samples"]
        assert demo["obs/agentview_image"].shape == (n, 84, 84, 3)
        assert demo["obs/robot0_eye_in_hand_image"].shape == (n, 84, 84, 3)
        assert demo["actions"].shape == (n, 7) and demo["states"].shape[0] == n
    assert not (demos / "episodes").exists()
    train = ["robot", "train", "--task", task, "--demos", str(demos), "--mixer", "fibottention", "--batch-size", "4",
             "--save-every", "5", "--out", str(run)]
    assert main([*train, "--steps", "10"]) == 0
    capsys.readouterr()
    assert main([*train, "--steps", "20", "--resume"]) == 0
    assert "steps 11..20" in capsys.readouterr().out
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [5, 10, 15, 20]
    assert (run / "curves.png").stat().st_size > 0
    assert main(["robot", "eval", str(run), "--rollouts", "2", "--max-steps", "16", "--sample-steps", "2"]) == 0
    out = run / "eval-seed100000-n2"
    rows = list(csv.DictReader((out / "episodes.csv").open()))
    assert [int(r["seed"]) for r in rows] == [100000, 100001] and all(int(r["steps"]) <= 16 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success_rate"] == sum(float(r["max_reward"]) for r in rows) / 2
    assert summary["task"] == task and summary["train_steps"] == 20
    assert (out / "rollouts.png").stat().st_size > 0
