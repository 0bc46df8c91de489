"""The simulated tasks: robosuite Lift and Can (PickPlaceCan) on a Panda with the OSC_POSE controller,
observed through two 84² cameras rendered by a fast ``mujoco.Renderer``; and PushT, a 2-D pymunk task
seen by one 96² camera (:mod:`vitmix.robot.pusht`). :data:`SPECS` says what each task observes and
does; :func:`make_env` builds its environment.

robosuite's own camera path renders a few frames a second on a CPU; a renderer whose offscreen buffer
is the image size, without shadows, reflections or multisampling and with the collision geoms hidden
renders the same view about ten times faster. Images are upright (row 0 at the top; robosuite's
default OpenGL convention stores them upside down).

robosuite and mujoco come from the ``[robot]`` extra; without them every entry point raises a
one-line ``ValueError`` naming it (:func:`require_simulator`).
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .._util import close_matches

__all__ = ["TASKS", "CAMERAS", "IMAGE_SIZE", "MAX_STEPS", "PROPRIO_KEYS", "EXTRA", "TaskSpec", "SPECS",
           "check_task", "require_simulator", "make_env", "FastRenderer", "RobotEnv"]

#: vitmix task name → its simulator's environment
TASKS = {"lift": "Lift", "can": "PickPlaceCan", "pusht": "PushT"}
#: the two cameras of the official Lift/Can setup
CAMERAS = ("agentview", "robot0_eye_in_hand")
#: rendered image side of Lift/Can (the policy random-crops 76² out of it)
IMAGE_SIZE = 84
#: proprioception of Lift/Can: end-effector position (3), quaternion (4), fingers (2)
PROPRIO_KEYS = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")


@dataclass(frozen=True)
class TaskSpec:
    """What a task's demonstrations and policy hold: camera names (images ``<camera>_image``), the
    proprioception keys and their total size, the action size, the image side and the policy's crop
    side, the rollout length limit of the official evaluation, and what its metric (the mean over
    rollouts of the episodes' maximum reward) measures."""

    cameras: Tuple[str, ...]
    proprio: Tuple[str, ...]
    proprio_dim: int
    action_dim: int
    image_size: int
    crop: int
    max_steps: int
    metric: str


_ROBOSUITE = TaskSpec(CAMERAS, PROPRIO_KEYS, 9, 7, IMAGE_SIZE, 76, 400, "success")
#: every task's :class:`TaskSpec` (PushT: one 96² camera cropped to 84², the agent's position, a 2-D target)
SPECS = {"lift": _ROBOSUITE, "can": _ROBOSUITE, "pusht": TaskSpec(("top",), ("agent_pos",), 2, 2, 96, 84, 300,
                                                                   "max coverage")}
#: rollout length limit of the official evaluation
MAX_STEPS = {task: spec.max_steps for task, spec in SPECS.items()}
#: how a user gets the simulators
EXTRA = "pip install 'vitmix[robot]'"


def check_task(task: str) -> str:
    """``task`` if vitmix has it, else a one-line ``ValueError`` with close names."""
    if task not in TASKS:
        raise ValueError(f"unknown robot task {task!r}." + close_matches(str(task), list(TASKS))
                         + f" Tasks: {', '.join(TASKS)}")
    return task


def require_simulator(task: str = "lift"):
    """Import ``task``'s simulator (robosuite with mujoco, or pymunk with shapely for PushT) and h5py, or
    raise a one-line ``ValueError`` naming the extra."""
    if task == "pusht":
        from .pusht import require_pusht

        if importlib.util.find_spec("h5py") is None:
            raise ValueError(f"the robot tasks need h5py for their demonstrations: {EXTRA}")
        return require_pusht()
    os.environ.setdefault("MUJOCO_GL", "egl")          # headless rendering (osmesa also works)
    _load_triton_first()
    logging.disable(logging.WARNING)     # robosuite warns at import about optional robots vitmix never uses
    try:
        for name in ("mujoco", "h5py"):
            importlib.import_module(name)
        suite = importlib.import_module("robosuite")
    except ImportError as err:
        raise ValueError(f"the robot tasks need the simulators ({err.name or err} is not installed): "
                         f"{EXTRA}") from None
    finally:
        logging.disable(logging.NOTSET)
    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)
    return suite


def _load_triton_first() -> None:
    """Mesa's GL driver and triton each load an LLVM; triton's, loaded once a GL context exists (torch
    imports it lazily, e.g. when timm builds the policy), crashes the process — so it is loaded first."""
    if importlib.util.find_spec("triton") is not None:
        try:
            importlib.import_module("triton")
        except Exception:            # a broken triton is torch's concern, not the simulator's
            pass


def make_env(task: str, cameras: Optional[Sequence[str]] = None, images: bool = True):
    """``task``'s environment: a :class:`RobotEnv`, or a :class:`~vitmix.robot.pusht.PushTEnv`."""
    spec = SPECS[check_task(task)]
    cameras = spec.cameras if cameras is None else cameras
    if task == "pusht":
        from .pusht import PushTEnv

        return PushTEnv(cameras, spec.image_size, images)
    return RobotEnv(task, cameras, spec.image_size, images)


class FastRenderer:
    """84² RGB frames of a MuJoCo model's cameras, upright, as ``uint8`` ``(H, W, 3)``."""

    def __init__(self, model, size: int = IMAGE_SIZE):
        import mujoco

        model.vis.global_.offwidth = max(model.vis.global_.offwidth, size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, size)
        model.vis.quality.offsamples = 0
        self._renderer = mujoco.Renderer(model, size, size)
        scene = self._renderer.scene
        scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._option = mujoco.MjvOption()
        self._option.geomgroup[0] = 0                   # group 0: the collision meshes
        self._model = model

    def render(self, data, camera: str) -> np.ndarray:
        self._renderer.update_scene(data, camera=camera, scene_option=self._option)
        return self._renderer.render().copy()

    def close(self) -> None:
        self._renderer.close()


class RobotEnv:
    """One robosuite task with fast two-camera images: ``reset(seed)``, ``step(action)``, ``observe()``.

    Actions are OSC_POSE deltas in [-1, 1]⁷ (position, axis-angle rotation, gripper: -1 open, +1
    closed). ``observe()`` gives ``<camera>_image`` frames plus the :data:`PROPRIO_KEYS` and the
    object's position (the scripted experts read it; the policy does not)."""

    def __init__(self, task: str, cameras: Sequence[str] = CAMERAS, image_size: int = IMAGE_SIZE,
                 images: bool = True):
        if TASKS.get(task) == "PushT":
            raise ValueError("pusht is not a robosuite task; build it with make_env('pusht')")
        suite = require_simulator()
        from robosuite.controllers import load_composite_controller_config

        self.task = check_task(task)
        self.cameras, self.image_size = tuple(cameras), image_size
        self.env = suite.make(
            TASKS[task], robots="Panda", controller_configs=load_composite_controller_config(controller="BASIC"),
            has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False, use_object_obs=True,
            control_freq=20, horizon=MAX_STEPS[task], ignore_done=True, reward_shaping=False,
            hard_reset=False)   # keep one MjModel: the renderer holds it
        self._renderer = FastRenderer(self.env.sim.model._model, image_size) if images else None
        self._obs: Dict[str, np.ndarray] = {}

    @property
    def action_dim(self) -> int:
        return self.env.action_dim

    def reset(self, seed: Optional[int] = None) -> Dict[str, np.ndarray]:
        """A new episode; with ``seed`` the object placement is a function of it."""
        if seed is not None:
            self.env.rng = np.random.default_rng(seed)
            for sampler in _placement_samplers(self.env):
                sampler.rng = self.env.rng
        self._obs = self.env.reset()
        return self.observe()

    def step(self, action: np.ndarray):
        """Apply ``action``; returns ``(observation, reward, success)``."""
        self._obs, reward, _, _ = self.env.step(np.asarray(action, dtype=np.float64))
        return self.observe(), float(reward), bool(self.env._check_success())

    def observe(self) -> Dict[str, np.ndarray]:
        out = {k: np.asarray(self._obs[k], dtype=np.float32) for k in PROPRIO_KEYS}
        out["object_pos"] = np.asarray(self.object_position(), dtype=np.float32)
        if self._renderer is not None:
            for cam in self.cameras:
                out[f"{cam}_image"] = self._renderer.render(self.env.sim.data._data, cam)
        return out

    def object_position(self) -> np.ndarray:
        env = self.env
        if self.task == "lift":
            return np.array(env.sim.data.body_xpos[env.cube_body_id])
        return np.array(env.sim.data.body_xpos[env.obj_body_id["Can"]])

    def goal_position(self) -> np.ndarray:
        """Where the object must go: the can's bin (Can); above the start for Lift."""
        env = self.env
        if self.task == "can":
            return np.array(env.target_bin_placements[env.object_to_id["can"]])
        return self.object_position() + np.array([0.0, 0.0, 0.2])

    def sim_state(self) -> np.ndarray:
        return np.asarray(self.env.sim.get_state().flatten())

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
        self.env.close()


def _placement_samplers(env):
    """The object placement samplers of a robosuite env (their ``rng`` draws the initial positions)."""
    sampler = getattr(env, "placement_initializer", None)
    if sampler is None:
        return []
    return [sampler, *getattr(sampler, "samplers", {}).values()]
