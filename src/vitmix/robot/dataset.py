"""Training windows of demonstrations: ``n_obs`` observation steps and the ``horizon`` actions that
start with the first of them (Diffusion Policy's sampler: windows run off either end of a demo by
repeating its first or last step, so every step of every demo starts a window)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch

from .demos import open_demos
from .sim import SPECS

__all__ = ["N_OBS", "HORIZON", "N_ACTION", "DemoWindows", "proprio_stats"]

#: observation steps the policy sees, actions it predicts, and how many of them are executed
N_OBS, HORIZON, N_ACTION = 2, 16, 8


class DemoWindows(torch.utils.data.Dataset):
    """All windows of a demonstrations file, held in memory: items ``(images, proprio, actions)`` with
    images ``(n_obs, cameras, 3, S, S)`` uint8, proprio ``(n_obs, P)`` and actions ``(horizon, A)`` — for
    Lift/Can S = 84, P = 9, A = 7; for PushT S = 96, P = 2, A = 2 (:data:`~vitmix.robot.sim.SPECS`)."""

    def __init__(self, path, task: str, n_obs: int = N_OBS, horizon: int = HORIZON):
        spec = SPECS[task]
        with open_demos(path, task) as f:
            demos = [f["data"][name] for name in sorted(f["data"], key=lambda n: int(n.split("_")[-1]))]
            self.images: List[np.ndarray] = [np.stack([d["obs"][f"{c}_image"][()] for c in spec.cameras], 1)
                                             for d in demos]
            self.proprio: List[np.ndarray] = [np.concatenate([d["obs"][k][()] for k in spec.proprio], -1)
                                              for d in demos]
            self.actions: List[np.ndarray] = [d["actions"][()].astype(np.float32) for d in demos]
        if self.actions[0].shape[-1] != spec.action_dim or self.proprio[0].shape[-1] != spec.proprio_dim:
            raise ValueError(f"{path}: actions of size {self.actions[0].shape[-1]} and proprioception of size "
                             f"{self.proprio[0].shape[-1]}, but {task} has {spec.action_dim} and {spec.proprio_dim}")
        self.n_obs, self.horizon = n_obs, horizon
        self.index: List[Tuple[int, int]] = [(d, t) for d, a in enumerate(self.actions)
                                             for t in range(-(n_obs - 1), len(a))]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        d, start = self.index[i]
        last = len(self.actions[d]) - 1
        steps = np.clip(np.arange(start, start + self.horizon), 0, last)
        obs = steps[: self.n_obs]
        images = torch.from_numpy(self.images[d][obs]).permute(0, 1, 4, 2, 3)     # (T, cams, 3, H, W)
        return images, torch.from_numpy(self.proprio[d][obs]), torch.from_numpy(self.actions[d][steps])


def proprio_stats(data: DemoWindows) -> Dict[str, List[float]]:
    """Per-dimension min and max of the proprioception (the policy scales it to [-1, 1])."""
    allp = np.concatenate(data.proprio)
    return {"min": allp.min(0).tolist(), "max": allp.max(0).tolist()}
