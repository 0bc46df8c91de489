"""Shared pieces of the robot tests: the simulator marker and a synthetic demonstrations file
(written with h5py, no simulator), small enough to train on in a second."""
import importlib.util
import json

import numpy as np
import pytest

from vitmix.robot.sim import SPECS

HAS_H5PY = importlib.util.find_spec("h5py") is not None
HAS_SIMULATOR = HAS_H5PY and all(importlib.util.find_spec(m) is not None for m in ("robosuite", "mujoco"))
HAS_PUSHT = all(importlib.util.find_spec(m) is not None for m in ("pymunk", "shapely"))
REASON = "needs the simulators: pip install 'vitmix[robot]'"

needs_h5py = pytest.mark.skipif(not HAS_H5PY, reason=REASON)
needs_simulator = pytest.mark.skipif(not HAS_SIMULATOR, reason=REASON)
needs_pusht = pytest.mark.skipif(not HAS_PUSHT, reason=REASON)
#: size of each proprioception key
PROPRIO_SIZES = {"robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2, "agent_pos": 2}


def write_demos(path, task="lift", lengths=(5, 7), size=None):
    """A demos.hdf5 in `vitmix robot demos`' layout for ``task`` with random content; step t's action is t/10."""
    import h5py

    spec = SPECS[task]
    size = size or spec.image_size
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i, n in enumerate(lengths):
            g = data.create_group(f"demo_{i}")
            for cam in spec.cameras:
                g[f"obs/{cam}_image"] = rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8)
            for key in spec.proprio:
                g[f"obs/{key}"] = rng.normal(size=(n, PROPRIO_SIZES[key])).astype(np.float32)
            g["actions"] = np.repeat(np.arange(n, dtype=np.float32)[:, None] / 10, spec.action_dim, axis=1)
            g["states"] = np.zeros((n, 4))
            g.attrs["num_samples"] = n
        data.attrs.update(task=task, seed=0, noise=0.0, episodes=len(lengths), expert_success_rate=1.0,
                          total=sum(lengths), cameras=json.dumps(list(spec.cameras)))
    return path
