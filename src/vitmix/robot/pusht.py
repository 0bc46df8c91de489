"""PushT: a circular agent pushes a T-shaped block on a table until it covers a T-shaped goal region.

vitmix's own statement of the task of Diffusion Policy's PushT benchmark. The table is a 512 × 512
square (y grows downwards, as in the image) walled on every side; the goal is the T at (256, 256)
turned by π/4. Each step the action — the agent's target position, scaled to [-1, 1]² over the
table — is followed for 0.1 s by a PD controller (10 physics steps of 0.01 s) that sets the velocity
of the kinematic agent, a disc of radius 15. The block is a dynamic pymunk body with no damping
memory: pymunk's ``damping = 0`` zeroes its velocity every physics step, so it moves only while the
agent pushes it (quasi-static pushing, as on a table with high friction).

The reward is the coverage — the area of the goal T under the block over the goal's area (shapely
polygons) — divided by the success threshold 0.95 and clipped to [0, 1]; an episode succeeds when the
coverage exceeds 0.95. Observations are a 96² RGB image (drawn with PIL, supersampled 4× and
reduced, so deterministic) and the agent's position in table units; the block's pose is given for
experts and tests (the policy does not read it). Resets draw the agent in [50, 450]², the block in
[100, 400]² with an angle in [-π, π), from ``numpy.random.default_rng(seed)``.

pymunk and shapely come from the ``[robot]`` extra (:func:`require_pusht`).
"""
from __future__ import annotations

import importlib
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ["WORLD", "GOAL_POSE", "SUCCESS_COVERAGE", "AGENT_RADIUS", "IMAGE_SIZE", "CAMERA", "require_pusht",
           "t_centroid", "to_world", "t_corners", "t_polygon", "coverage", "PushTEnv"]

#: side of the square table, in table units
WORLD = 512.0
#: where the block must go: x, y, angle
GOAL_POSE = (256.0, 256.0, np.pi / 4)
#: coverage at which an episode succeeds and the reward saturates
SUCCESS_COVERAGE = 0.95
AGENT_RADIUS = 15.0
#: rendered image side (the policy random-crops 84² out of it)
IMAGE_SIZE = 96
#: the one camera's name (its images are stored as ``top_image``)
CAMERA = "top"
#: the T in its body frame: the 120 × 30 bar, then the 30 × 90 stem below it (rectangles x0, y0, x1, y1)
_T_BOXES = ((-60.0, 0.0, 60.0, 30.0), (-15.0, 30.0, 15.0, 120.0))
_PHYSICS_DT, _SUBSTEPS = 0.01, 10
_KP, _KD = 100.0, 20.0
_EXTRA = "pip install 'vitmix[robot]'"


def require_pusht():
    """Import pymunk and shapely or raise a one-line ``ValueError`` naming the extra."""
    try:
        importlib.import_module("shapely")
        return importlib.import_module("pymunk")
    except ImportError as err:
        raise ValueError(f"the pusht task needs pymunk and shapely ({err.name or err} is not installed): "
                         f"{_EXTRA}") from None


def _box_corners(box) -> np.ndarray:
    x0, y0, x1, y1 = box
    return np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])


def t_centroid() -> np.ndarray:
    """The T's centre of mass in its body frame (the two boxes weighted by their areas)."""
    areas = np.array([(b[2] - b[0]) * (b[3] - b[1]) for b in _T_BOXES])
    centres = np.array([((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in _T_BOXES])
    return (areas[:, None] * centres).sum(0) / areas.sum()


def to_world(points, pose) -> np.ndarray:
    """Body-frame ``points`` (``(..., 2)``) of a T at ``pose`` (x, y, angle) in table coordinates."""
    x, y, angle = pose
    c, s = np.cos(angle), np.sin(angle)
    return points @ np.array([[c, s], [-s, c]]) + np.array([x, y])


def t_corners(pose) -> np.ndarray:
    """The corners of the T's two rectangles at ``pose``, ``(8, 2)``."""
    return to_world(np.concatenate([_box_corners(b) for b in _T_BOXES]), pose)


def t_polygon(pose):
    """The T at ``pose`` (x, y, angle of its body frame) as a shapely polygon."""
    from shapely.geometry import Polygon
    from shapely.ops import unary_union

    return unary_union([Polygon(to_world(_box_corners(b), pose)) for b in _T_BOXES])


def coverage(pose, goal=GOAL_POSE) -> float:
    """The fraction of the goal T's area that the T at ``pose`` covers."""
    target = t_polygon(goal)
    return float(target.intersection(t_polygon(pose)).area / target.area)


class PushTEnv:
    """PushT with the robosuite tasks' interface: ``reset(seed)``, ``step(action)``, ``observe()``.

    ``step`` returns ``(observation, reward, success)``; observations hold ``top_image`` (96², uint8,
    when ``images``), ``agent_pos`` (the proprioception) and ``block_pose``."""

    task = "pusht"
    action_dim = 2

    def __init__(self, cameras=(CAMERA,), image_size: int = IMAGE_SIZE, images: bool = True):
        if tuple(cameras) != (CAMERA,):
            raise ValueError(f"pusht has one camera, {CAMERA!r}; got {list(cameras)}")
        self.pymunk = require_pusht()
        self.cameras, self.image_size, self.images = (CAMERA,), image_size, images
        self._build()

    def _build(self) -> None:
        pm = self.pymunk
        self.space = pm.Space()
        self.space.gravity = (0.0, 0.0)
        self.space.damping = 0.0            # the block keeps no velocity between physics steps
        walls = [((5, 506), (5, 5)), ((5, 5), (506, 5)), ((506, 5), (506, 506)), ((5, 506), (506, 506))]
        for a, b in walls:
            self.space.add(pm.Segment(self.space.static_body, a, b, 2.0))
        self.agent = pm.Body(body_type=pm.Body.KINEMATIC)
        agent_shape = pm.Circle(self.agent, AGENT_RADIUS)
        self.block = pm.Body()
        shapes = [pm.Poly(self.block, [tuple(p) for p in _box_corners(b)]) for b in _T_BOXES]
        for shape in shapes:
            shape.mass, shape.friction = 0.5, 1.0
        self.block.center_of_gravity = tuple(t_centroid())
        self.space.add(self.agent, agent_shape, self.block, *shapes)
        self._target = np.zeros(2)

    def reset(self, seed: Optional[int] = None) -> Dict[str, np.ndarray]:
        """A new episode; with ``seed`` the agent's and the block's start is a function of it."""
        rng = np.random.default_rng(seed)
        agent = rng.uniform(50, 450, 2)
        block = rng.uniform(100, 400, 2)
        angle = rng.uniform(-np.pi, np.pi)
        self.agent.position, self.agent.velocity = tuple(agent), (0.0, 0.0)
        self._place_block(block[0], block[1], angle)
        self.space.reindex_shapes_for_body(self.agent)
        self._target = agent.copy()
        return self.observe()

    def step(self, action) -> Tuple[Dict[str, np.ndarray], float, bool]:
        """Drive the agent towards ``action`` (its target in [-1, 1]², clipped) for one control step."""
        self.advance(action)
        cover = coverage(self.block_pose())
        return self.observe(), float(np.clip(cover / SUCCESS_COVERAGE, 0.0, 1.0)), cover > SUCCESS_COVERAGE

    def advance(self, action) -> None:
        """The physics of :meth:`step` alone (no coverage, no observation): what a planner simulates."""
        self._target = (np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0) + 1.0) * WORLD / 2
        for _ in range(_SUBSTEPS):
            pos, vel = np.array(self.agent.position), np.array(self.agent.velocity)
            accel = _KP * (self._target - pos) - _KD * vel
            self.agent.velocity = tuple(vel + accel * _PHYSICS_DT)
            self.space.step(_PHYSICS_DT)

    def _place_block(self, x: float, y: float, angle: float) -> None:
        """Put the block's body frame at ``(x, y, angle)``: the angle first, because pymunk turns a body
        about its centre of gravity, which would move an origin placed before."""
        self.block.angle = float(angle)
        self.block.position = (float(x), float(y))
        self.block.velocity, self.block.angular_velocity = (0.0, 0.0), 0.0
        self.space.reindex_shapes_for_body(self.block)

    def block_pose(self) -> np.ndarray:
        """x, y of the block's body frame origin (the middle of the bar's top edge) and its angle."""
        x, y = self.block.position
        return np.array([x, y, self.block.angle])

    def agent_position(self) -> np.ndarray:
        return np.array(self.agent.position)

    def observe(self) -> Dict[str, np.ndarray]:
        out = {"agent_pos": self.agent_position().astype(np.float32),
               "block_pose": self.block_pose().astype(np.float32)}
        if self.images:
            out[f"{CAMERA}_image"] = self.render()
        return out

    def render(self) -> np.ndarray:
        """The table seen from above as ``(S, S, 3)`` uint8: goal T in green, block grey, agent blue."""
        from PIL import Image, ImageDraw

        scale = 4 * self.image_size / WORLD
        canvas = Image.new("RGB", (4 * self.image_size,) * 2, (255, 255, 255))
        draw = ImageDraw.Draw(canvas)
        for pose, colour in ((GOAL_POSE, (144, 238, 144)), (self.block_pose(), (119, 136, 153))):
            for box in _T_BOXES:
                draw.polygon([tuple(p) for p in to_world(_box_corners(box), pose) * scale], fill=colour)
        (x, y), r = self.agent_position() * scale, AGENT_RADIUS * scale
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(65, 105, 225))
        return np.asarray(canvas.resize((self.image_size,) * 2, Image.BOX))

    def sim_state(self) -> np.ndarray:
        """Agent position and velocity, block pose: what :meth:`set_state` restores."""
        return np.array([*self.agent.position, *self.agent.velocity, *self.block_pose()])

    def set_state(self, state) -> None:
        ax, ay, vx, vy, bx, by, angle = (float(v) for v in state)
        self.agent.position, self.agent.velocity = (ax, ay), (vx, vy)
        self._place_block(bx, by, angle)
        self.space.reindex_shapes_for_body(self.agent)

    def close(self) -> None:
        pass
