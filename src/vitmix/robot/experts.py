"""Scripted experts for Lift and Can: waypoints followed with OSC_POSE position deltas.

The end effector is driven towards each waypoint with ``clip(10·(target − eef), −1, 1)`` (no
rotation); a waypoint is done when the effector is within 1 cm of it, or after a per-phase step limit
(so a perturbed grasp never stalls an episode). Lift: hover 10 cm above the cube, descend to its
centre, close the fingers for 12 steps, lift. Can continues: rise to the bin's height + 15 cm, carry
over the bin, lower, open, and retreat upwards — robosuite only counts a placed can as a success when
the gripper is away from it. ``noise`` adds Gaussian noise of that σ to the position part of every
action (more varied demonstrations; some of them then fail and are not kept). PushT's expert is
:class:`~vitmix.robot.pusht_expert.PushTExpert`; :func:`make_expert` picks a task's.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

__all__ = ["ScriptedExpert", "make_expert"]

_OPEN, _CLOSED = -1.0, 1.0


def make_expert(env, noise: float = 0.0, rng: Optional[np.random.Generator] = None):
    """The scripted expert of ``env``'s task: :class:`ScriptedExpert` (Lift, Can) or
    :class:`~vitmix.robot.pusht_expert.PushTExpert`."""
    if env.task == "pusht":
        from .pusht_expert import PushTExpert

        return PushTExpert(env, noise, rng)
    return ScriptedExpert(env, noise, rng)


class ScriptedExpert:
    """A waypoint controller for one episode of ``env`` (a :class:`~vitmix.robot.sim.RobotEnv`)."""

    def __init__(self, env, noise: float = 0.0, rng: Optional[np.random.Generator] = None):
        if noise < 0:
            raise ValueError(f"--noise must be >= 0, got {noise}")
        self.env, self.noise = env, float(noise)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._plan: List[Tuple[str, object, float, int]] = []
        self._phase, self._steps = 0, 0

    def reset(self) -> None:
        """Plan the waypoints of the episode that just started (from the object's start position)."""
        obj = self.env.object_position()
        hover = obj + np.array([0.0, 0.0, 0.10])
        plan = [("hover", hover, _OPEN, 80), ("descend", obj, _OPEN, 60), ("grasp", None, _CLOSED, 12)]
        if self.env.task == "lift":
            plan.append(("lift", obj + np.array([0.0, 0.0, 0.25]), _CLOSED, 10_000))
        else:
            goal = self.env.goal_position()
            carry_z = goal[2] + 0.15
            plan += [("rise", np.array([obj[0], obj[1], carry_z]), _CLOSED, 80),
                     ("carry", np.array([goal[0], goal[1], carry_z]), _CLOSED, 120),
                     ("lower", np.array([goal[0], goal[1], goal[2] + 0.08]), _CLOSED, 60),
                     ("release", None, _OPEN, 10),
                     ("retreat", np.array([goal[0], goal[1], carry_z + 0.1]), _OPEN, 10_000)]
        self._plan, self._phase, self._steps = plan, 0, 0

    @property
    def phase(self) -> str:
        return self._plan[self._phase][0]

    def act(self, obs) -> np.ndarray:
        """The action for observation ``obs`` (needs ``robot0_eef_pos``)."""
        if not self._plan:
            self.reset()
        name, target, grip, limit = self._plan[self._phase]
        eef = np.asarray(obs["robot0_eef_pos"], dtype=np.float64)
        action = np.zeros(self.env.action_dim)
        action[-1] = grip
        if target is not None:
            action[:3] = np.clip(10.0 * (target - eef), -1.0, 1.0)
        if self.noise:
            action[:3] = np.clip(action[:3] + self.rng.normal(0.0, self.noise, 3), -1.0, 1.0)
        self._steps += 1
        reached = target is not None and np.linalg.norm(target - eef) < 0.01
        if (reached or self._steps >= limit) and self._phase < len(self._plan) - 1:
            self._phase, self._steps = self._phase + 1, 0
        return action
