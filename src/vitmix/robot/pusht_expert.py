"""A scripted PushT expert: greedy choice among pushing moves, each tried out in a copy of the simulator.

A move is a point on the T's outline and a push depth: the agent goes to 45 units outside that point
(along the outline's outward normal), closes in to touch it, then pushes straight into the block, 8
units further each step; where the straight way to the start of a move crosses the block, the agent
goes round it on a circle about the block's centre of mass. Before every move the expert copies the
episode's state into a private :class:`~vitmix.robot.pusht.PushTEnv`, plays every candidate move there
(a point every ~15 units of the outline × depths 12 and 40) and executes the one that leaves the block
closest to the goal pose: distance of the centres of mass plus 100 units per radian of angle error (a
T is about 100 units across; a lower weight leaves more episodes turned but not covering the goal),
plus 5 units per unit a corner of the block comes closer than 45 to a wall (a block pinned to a wall
cannot be pushed off it: the agent does not fit behind it). The state copy is privileged information
a demonstrator may use; the policy trained on the demonstrations sees only images and the agent's
position.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .pusht import AGENT_RADIUS, GOAL_POSE, WORLD, PushTEnv, t_centroid, t_corners, t_polygon, to_world

__all__ = ["PushTExpert"]

#: push depths of the candidate moves, in table units
DEPTHS = (12.0, 40.0)
#: table units one radian of angle error counts as
ANGLE_WEIGHT = 100.0
#: a block corner nearer a wall than this (table units) costs WALL_WEIGHT per unit
WALL_CLEARANCE, WALL_WEIGHT = 45.0, 5.0
_STRIDE, _APPROACH, _STEP = 15.0, 45.0, 8.0
#: radius of the detours round the block: its farthest point from the centre of mass (~80) + the agent
_DETOUR_RADIUS = 110.0


def _outline_points(spacing: float = _STRIDE) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Points about ``spacing`` apart on the T's outline (body frame), each with its outward normal."""
    from shapely.geometry import Point

    shape = t_polygon((0.0, 0.0, 0.0))
    corners = np.array(shape.exterior.coords)
    points = []
    for a, b in zip(corners[:-1], corners[1:]):
        edge = b - a
        length = float(np.linalg.norm(edge))
        normal = np.array([edge[1], -edge[0]]) / length
        if shape.contains(Point(*((a + b) / 2 + normal))):
            normal = -normal
        count = max(1, int(length // spacing))
        points += [(a + edge * (i + 0.5) / count, normal) for i in range(count)]
    return points


def pose_error(pose) -> float:
    """Distance of the T at ``pose`` from the goal: centre-of-mass distance + angle error in table units,
    plus a penalty for a block within :data:`WALL_CLEARANCE` of a wall (the agent cannot get behind it there)."""
    angle = (pose[2] - GOAL_POSE[2] + np.pi) % (2 * np.pi) - np.pi
    corners = t_corners(pose)
    margin = float(np.min(np.minimum(corners, WORLD - corners)))
    return float(np.linalg.norm(to_world(t_centroid(), pose) - to_world(t_centroid(), GOAL_POSE))
                 + ANGLE_WEIGHT * abs(angle) + WALL_WEIGHT * max(0.0, WALL_CLEARANCE - margin))


def _detour(frm: np.ndarray, to: np.ndarray, pose) -> List[np.ndarray]:
    """Targets that take the agent round the block on a circle about its centre of mass (two steps per
    at most 45° of arc) when the straight way from ``frm`` to ``to`` would hit it; none otherwise."""
    from shapely.geometry import LineString

    if not LineString([frm, to]).intersects(t_polygon(pose).buffer(AGENT_RADIUS + 2)):
        return []
    centre = to_world(t_centroid(), pose)
    a0, a1 = (np.arctan2(*(p - centre)[::-1]) for p in (frm, to))
    turn = (a1 - a0 + np.pi) % (2 * np.pi) - np.pi
    count = int(np.ceil(abs(turn) / (np.pi / 4)))
    angles = a0 + turn * np.arange(count + 1) / max(count, 1)
    return [p for a in angles for p in [centre + _DETOUR_RADIUS * np.array([np.cos(a), np.sin(a)])] * 2]


class PushTExpert:
    """The expert of one PushT episode of ``env``: ``act(obs)`` gives the next action in [-1, 1]²."""

    def __init__(self, env: PushTEnv, noise: float = 0.0, rng: Optional[np.random.Generator] = None):
        if noise < 0:
            raise ValueError(f"--noise must be >= 0, got {noise}")
        self.env, self.noise = env, float(noise)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._model = PushTEnv(images=False)
        self._model.reset(0)
        self._outline = _outline_points()
        self._queue: List[np.ndarray] = []

    def reset(self) -> None:
        self._queue = []

    def _move(self, state: np.ndarray, point: np.ndarray, normal: np.ndarray, depth: float) -> List[np.ndarray]:
        """The agent targets (table units) of pushing at body-frame ``point`` ``depth`` units deep."""
        pose = state[4:]
        contact, direction = to_world(point, pose), to_world(normal, (0.0, 0.0, pose[2]))
        touch = contact + direction * (AGENT_RADIUS + 4)
        targets = []
        if np.linalg.norm(state[:2] - touch) > _STEP:
            start = touch + direction * _APPROACH
            targets += _detour(state[:2], start, pose) + [start] * 3 + [touch] * 3
        targets += [touch - direction * _STEP * (i + 1) for i in range(int(np.ceil(depth / _STEP)))]
        return [np.clip(t, 10.0, WORLD - 10.0) for t in targets]

    def plan(self) -> List[np.ndarray]:
        """The targets of the best move from the episode's current state."""
        state = self.env.sim_state()
        best, best_error = [], np.inf
        for point, normal in self._outline:
            for depth in DEPTHS:
                targets = self._move(state, point, normal, depth)
                self._model.set_state(state)
                for target in targets:
                    self._model.advance(target / (WORLD / 2) - 1.0)
                error = pose_error(self._model.block_pose())
                if error < best_error:
                    best, best_error = targets, error
        return best

    def act(self, obs) -> np.ndarray:
        if not self._queue:
            self._queue = self.plan()
        action = self._queue.pop(0) / (WORLD / 2) - 1.0
        if self.noise:
            action = action + self.rng.normal(0.0, self.noise, 2)
        return np.clip(action, -1.0, 1.0)
