"""Shared pieces of the robot tests: the simulator marker and a synthetic demonstrations file
(written with h5py, no simulator), small enough to train on in a second."""
import importlib.util
import json

import numpy as np
import pytest

from vitmix.robot.sim import CAMERAS

HAS_H5PY = importlib.util.find_spec("h5py") is not None
HAS_SIMULATOR = HAS_H5PY and all(importlib.util.find_spec(m) is not None for m in ("robosuite", "mujoco"))
REASON = "needs the simulators: pip install 'vitmix[robot]'"

needs_h5py = pytest.mark.skipif(not HAS_H5PY, reason=REASON)
needs_simulator = pytest.mark.skipif(not HAS_SIMULATOR, reason=REASON)


def write_demos(path, task="lift", lengths=(5, 7), size=84):
    """A demos.hdf5 in `vitmix robot demos`' layout with random content; step t's action is t/10."""
    import h5py

    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i, n in enumerate(lengths):
            g = data.create_group(f"demo_{i}")
            for cam in CAMERAS:
                g[f"obs/{cam}_image"] = rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8)
            g["obs/robot0_eef_pos"] = rng.normal(size=(n, 3)).astype(np.float32)
            g["obs/robot0_eef_quat"] = rng.normal(size=(n, 4)).astype(np.float32)
            g["obs/robot0_gripper_qpos"] = rng.normal(size=(n, 2)).astype(np.float32)
            g["actions"] = np.repeat(np.arange(n, dtype=np.float32)[:, None] / 10, 7, axis=1)
            g["states"] = np.zeros((n, 4))
            g.attrs["num_samples"] = n
        data.attrs.update(task=task, seed=0, noise=0.0, episodes=len(lengths), expert_success_rate=1.0,
                          total=sum(lengths), cameras=json.dumps(list(CAMERAS)))
    return path
