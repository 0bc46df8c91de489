"""PushT: coverage on hand-worked poses, the physics (agent follows its target, the block moves only
when pushed), the renderer, the scripted expert on seeded episodes, and demos + train + eval at smoke size."""
import csv
import json

import numpy as np
import pytest

from vitmix.cli import main

from .conftest import needs_h5py, needs_pusht, write_demos

pytestmark = needs_pusht

# the T's area: a 120 × 30 bar and a 30 × 90 stem
T_AREA = 120 * 30 + 30 * 90


def test_coverage_on_hand_worked_poses():
    from vitmix.robot.pusht import GOAL_POSE, coverage

    assert coverage(GOAL_POSE) == pytest.approx(1.0)
    assert coverage((60.0, 60.0, 0.0)) == 0.0                                   # far from the goal
    upright = (0.0, 0.0, 0.0)
    # shifted 60 along the bar: half the bar (60 × 30) overlaps, the stems miss each other
    assert coverage((60.0, 0.0, 0.0), goal=upright) == pytest.approx(60 * 30 / T_AREA)
    # shifted 15 down the stem: 120 × 15 of the bar, 30 × 15 of the bar over the stem, 75 × 30 of the stem
    assert coverage((0.0, 15.0, 0.0), goal=upright) == pytest.approx((120 * 15 + 30 * 15 + 75 * 30) / T_AREA)
    # the same half-bar shift along the goal's own (rotated) bar
    x, y, angle = GOAL_POSE
    shifted = (x + 60 * np.cos(angle), y + 60 * np.sin(angle), angle)
    assert coverage(shifted) == pytest.approx(60 * 30 / T_AREA)
    assert coverage((x, y, angle + np.pi)) < 0.2                                 # upside down


def _env(**kw):
    from vitmix.robot.pusht import PushTEnv

    return PushTEnv(**kw)


def _to_action(point):
    return np.asarray(point, dtype=np.float64) / 256.0 - 1.0


def test_agent_follows_its_target_and_resets_are_seeded():
    env = _env(images=False)
    first = env.reset(seed=3)
    again = env.reset(seed=3)
    assert np.array_equal(first["agent_pos"], again["agent_pos"])
    assert np.array_equal(first["block_pose"], again["block_pose"])
    assert not np.array_equal(env.reset(seed=4)["agent_pos"], first["agent_pos"])
    env.set_state([100.0, 450.0, 0.0, 0.0, 400.0, 120.0, 0.0])                 # block out of the way
    target = np.array([200.0, 450.0])
    distances = []
    for _ in range(10):
        obs, _, _ = env.step(_to_action(target))
        distances.append(np.linalg.norm(obs["agent_pos"] - target))
    assert distances[0] < 100 and distances[-1] < 2.0
    assert np.allclose(obs["block_pose"], [400.0, 120.0, 0.0])                 # untouched


def test_block_moves_only_while_pushed():
    env = _env(images=False)
    env.reset(seed=0)
    # block upright at (256, 200): its bar spans x 196..316, y 200..230; the agent starts left of it
    env.set_state([150.0, 215.0, 0.0, 0.0, 256.0, 200.0, 0.0])
    for _ in range(8):
        obs, _, _ = env.step(_to_action([300.0, 215.0]))
    pushed = obs["block_pose"]
    assert pushed[0] > 256.0 + 20 and abs(pushed[1] - 200.0) < 15
    for _ in range(5):
        obs, _, _ = env.step(_to_action([100.0, 400.0]))                      # agent leaves the block
    still = obs["block_pose"]
    for _ in range(3):
        obs, _, _ = env.step(_to_action([100.0, 400.0]))
    assert np.allclose(obs["block_pose"], still, atol=1e-6)                   # quasi-static: no sliding on


def test_reward_is_coverage_over_the_success_threshold():
    from vitmix.robot.pusht import GOAL_POSE, SUCCESS_COVERAGE

    env = _env(images=False)
    env.reset(seed=0)
    env.set_state([60.0, 450.0, 0.0, 0.0, *GOAL_POSE])
    _, reward, success = env.step(_to_action([60.0, 450.0]))
    assert reward == 1.0 and success
    x, y, angle = GOAL_POSE
    env.set_state([60.0, 450.0, 0.0, 0.0, x + 60 * np.cos(angle), y + 60 * np.sin(angle), angle])
    _, reward, success = env.step(_to_action([60.0, 450.0]))
    assert reward == pytest.approx(60 * 30 / T_AREA / SUCCESS_COVERAGE, abs=1e-6) and not success


def test_render_shape_colours_and_determinism():
    a, b = _env(), _env()
    obs_a, obs_b = a.reset(seed=7), b.reset(seed=7)
    image = obs_a["top_image"]
    assert image.shape == (96, 96, 3) and image.dtype == np.uint8
    assert np.array_equal(image, obs_b["top_image"])
    assert not np.array_equal(image, b.reset(seed=8)["top_image"])
    col, row = (obs_a["agent_pos"] * 96 / 512).astype(int)
    assert tuple(image[row, col]) == (65, 105, 225)                            # the agent is drawn where it is
    goal = (np.array([256.0, 256.0]) + 40 * np.array([-np.sin(np.pi / 4), np.cos(np.pi / 4)])) * 96 / 512
    assert tuple(a.render()[int(goal[1]), int(goal[0])]) in {(144, 238, 144), (119, 136, 153), (65, 105, 225)}


@pytest.mark.parametrize("seed", [0, 5])
def test_expert_covers_the_goal_on_seeded_episodes(seed):
    from vitmix.robot.pusht_expert import PushTExpert

    env = _env(images=False)
    obs = env.reset(seed=seed)
    expert = PushTExpert(env)
    success = False
    for _ in range(300):
        obs, _, success = env.step(expert.act(obs))
        if success:
            break
    assert success                                          # coverage above 0.95 within the 300 steps


def test_policy_sees_100_patch_tokens_of_84_pixel_crops():
    import torch

    from vitmix.robot.policy import DiffusionPolicy

    policy = DiffusionPolicy(action_dim=2, proprio_dim=2, cameras=("top",), crop=84, horizon=16).eval()
    assert policy.encoder.vit.patch_embed.num_patches == 100
    images = torch.randint(0, 255, (1, 2, 1, 3, 96, 96), dtype=torch.uint8)
    actions = policy.predict(images, torch.zeros(1, 2, 2), steps=1, generator=torch.Generator().manual_seed(0))
    assert actions.shape == (1, 16, 2)


@needs_h5py
def test_expert_demos_train_and_eval(tmp_path, capsys):
    import h5py

    demos, run = tmp_path / "demos", tmp_path / "run"
    assert main(["robot", "demos", "--task", "pusht", "--episodes", "1", "--out", str(demos)]) == 0
    with h5py.File(demos / "demos.hdf5") as f:
        data = f["data"]
        assert data.attrs["task"] == "pusht" and data.attrs["expert_success_rate"] == 1.0
        demo = data["demo_0"]
        n = demo.attrs["num_samples"]
        assert demo["obs/top_image"].shape == (n, 96, 96, 3) and demo["obs/agent_pos"].shape == (n, 2)
        assert demo["actions"].shape == (n, 2) and demo["states"].shape == (n, 7)
        assert np.abs(demo["actions"][()]).max() <= 1.0
    assert main(["robot", "train", "--task", "pusht", "--demos", str(demos), "--mixer", "fibottention", "--steps", "4",
                 "--batch-size", "4", "--save-every", "2", "--out", str(run)]) == 0
    from vitmix.runs.checkpoints import load_weights

    _, meta = load_weights(run / "ema.safetensors")
    assert meta["task"] == "pusht" and meta["cameras"] == ["top"] and meta["action_dim"] == 2 and meta["crop"] == 84
    assert main(["robot", "eval", str(run), "--task", "pusht", "--rollouts", "2", "--max-steps", "8",
                 "--sample-steps", "1"]) == 0
    out = run / "eval-seed100000-n2"
    rows = list(csv.DictReader((out / "episodes.csv").open()))
    assert [int(r["seed"]) for r in rows] == [100000, 100001] and all(int(r["steps"]) <= 8 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "pusht" and summary["max_steps"] == 8
    assert summary["success_rate"] == pytest.approx(np.mean([float(r["max_reward"]) for r in rows]))
    assert (out / "rollouts.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["robot", "train", "--task", "lift", "--demos", str(demos), "--steps", "1",
                 "--out", str(tmp_path / "other")]) == 2                         # pusht demos are not lift's
    assert "demonstrations of 'pusht', not 'lift'" in capsys.readouterr().err


@needs_h5py
def test_demos_of_the_wrong_size_are_refused(tmp_path):
    import h5py

    from vitmix.robot.dataset import DemoWindows

    demos = write_demos(tmp_path / "demos.hdf5", task="pusht")
    with h5py.File(demos, "r+") as f:                               # 7-D actions under a pusht label
        for name in f["data"]:
            actions = f["data"][name]["actions"][()]
            del f["data"][name]["actions"]
            f["data"][name]["actions"] = np.repeat(actions[:, :1], 7, axis=1)
    with pytest.raises(ValueError, match="actions of size 7 .* pusht has 2"):
        DemoWindows(demos, "pusht")

