"""Scripted-expert demonstrations written as HDF5 in robomimic's layout, resumably.

``DIR/demos.hdf5`` holds ``data/demo_<i>/obs/<camera>_image`` (``(T, 84, 84, 3)`` uint8, upright),
``obs/robot0_eef_pos``, ``obs/robot0_eef_quat``, ``obs/robot0_gripper_qpos``, ``actions`` (``(T, 7)``
OSC_POSE deltas) and ``states`` (the flattened MuJoCo state) — for PushT ``obs/top_image`` (96²),
``obs/agent_pos``, 2-D target actions and the 7-D pymunk state — one group per kept (successful)
episode; ``data`` carries the task, seed, noise, cameras and the experts' success rate as attributes.

Episode ``i`` is seeded by ``seed · 100000 + i`` (object placement and action noise). Each finished
episode is first written to ``DIR/episodes/<i>.npz`` (atomically), so a killed run continues where
it stopped; the HDF5 file is assembled, atomically, once every episode is done, and the parts removed.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np

from ..runs.checkpoints import atomic_write
from .experts import make_expert
from .sim import MAX_STEPS, SPECS, RobotEnv, check_task, make_env, require_simulator

__all__ = ["DEMO_FILE", "episode_seed", "record_episode", "make_demos", "open_demos"]

#: the demonstrations file inside ``--out``
DEMO_FILE = "demos.hdf5"


def episode_seed(seed: int, episode: int) -> int:
    return int(seed) * 100_000 + int(episode)


def record_episode(env: RobotEnv, seed: int, noise: float = 0.0) -> Dict[str, np.ndarray]:
    """Run the scripted expert for one episode; the arrays of :data:`DEMO_FILE`'s layout plus
    ``success`` (the episode stops at the first successful step, as robomimic's demos do)."""
    obs = env.reset(seed=seed)
    expert = make_expert(env, noise, np.random.default_rng(seed))
    expert.reset()
    frames = {key: [] for key in (*SPECS[env.task].proprio, *(f"{c}_image" for c in env.cameras))}
    actions, states, success = [], [], False
    for _ in range(MAX_STEPS[env.task]):
        for key in frames:
            frames[key].append(obs[key])
        states.append(env.sim_state())
        action = expert.act(obs)
        actions.append(action)
        obs, _, success = env.step(action)
        if success:
            break
    out = {f"obs/{k}": np.stack(v) for k, v in frames.items()}
    out.update(actions=np.asarray(actions, np.float32), states=np.asarray(states), success=np.array(success))
    return out


def make_demos(task: str, episodes: int, out, noise: float = 0.0, seed: int = 0,
               log: Callable[[str], None] = print) -> Path:
    """Record ``episodes`` expert episodes of ``task`` into ``out/demos.hdf5`` (successes kept)."""
    check_task(task)
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"--episodes must be a positive integer, got {episodes!r}")
    if noise < 0:
        raise ValueError(f"--noise must be >= 0, got {noise}")
    out = Path(out)
    final = out / DEMO_FILE
    if final.exists():
        raise ValueError(f"{final} already exists; give another --out (demonstrations are never overwritten)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory for the demonstrations")
    parts = out / "episodes"
    settings = {"task": task, "noise": float(noise), "seed": int(seed), "cameras": list(SPECS[task].cameras)}
    settings_file = parts / "settings.json"
    if settings_file.is_file():
        saved = json.loads(settings_file.read_text())
        if saved != settings:
            raise ValueError(f"{out} holds an unfinished recording with other settings ({saved}); continue it "
                             "with those, or give another --out")
    elif out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {out} is a non-empty directory that holds no recording; give a new or empty one")
    require_simulator(task)
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write(settings_file, lambda tmp: Path(tmp).write_text(json.dumps(settings)))
    env = make_env(task)
    kept, start = 0, time.perf_counter()
    try:
        for i in range(episodes):
            path = parts / f"{i:06d}.npz"
            if path.is_file():
                with np.load(path) as done:
                    kept += bool(done["success"])
                continue
            episode = record_episode(env, episode_seed(seed, i), noise)
            atomic_write(path, lambda tmp, ep=episode: _save_npz(tmp, ep))
            kept += bool(episode["success"])
            log(f"episode {i + 1}/{episodes}: {'success' if episode['success'] else 'failure'} in "
                f"{len(episode['actions'])} steps; kept {kept} ({kept / (i + 1):.0%}), "
                f"{time.perf_counter() - start:.0f} s")
    finally:
        env.close()
    if kept == 0:
        raise ValueError(f"the expert succeeded in none of the {episodes} episodes (noise {noise}); "
                         "lower --noise")
    atomic_write(final, lambda tmp: _assemble(tmp, parts, episodes, settings))
    shutil.rmtree(parts)
    log(f"{final}: {kept} demonstrations of {task} kept out of {episodes} ({kept / episodes:.0%} expert success)")
    return final


def _save_npz(tmp, episode) -> None:
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **episode)


def _assemble(tmp, parts: Path, episodes: int, settings: dict) -> None:
    import h5py

    with h5py.File(tmp, "w") as f:
        data = f.create_group("data")
        kept, total = 0, 0
        for i in range(episodes):
            with np.load(parts / f"{i:06d}.npz") as ep:
                if not bool(ep["success"]):
                    continue
                group = data.create_group(f"demo_{kept}")
                for key in ep.files:
                    if key == "success":
                        continue
                    image = key.endswith("_image")
                    group.create_dataset(key, data=ep[key], compression="gzip" if image else None)
                group.attrs["num_samples"] = len(ep["actions"])
                group.attrs["seed"] = episode_seed(settings["seed"], i)
                kept, total = kept + 1, total + len(ep["actions"])
        data.attrs["total"] = total
        data.attrs["episodes"] = episodes
        data.attrs["expert_success_rate"] = kept / episodes
        data.attrs["env_args"] = json.dumps({"env_name": settings["task"], "type": "robosuite", "controller":
                                             "OSC_POSE", "control_freq": 20})
        for key, value in settings.items():
            data.attrs[key] = json.dumps(value) if isinstance(value, list) else value


def open_demos(path, task: Optional[str] = None):
    """``path`` (a demos file or its directory) opened read-only with h5py, checked: a readable
    vitmix demonstrations file, of ``task`` when given. One-line errors otherwise."""
    require_simulator(task or "lift")
    import h5py

    path = Path(path)
    if path.is_dir():
        path = path / DEMO_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no demonstrations at {path}; record them with `vitmix robot demos --out DIR`")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise ValueError(f"{path} is not a readable HDF5 file ({str(err).splitlines()[0][:120]}); it may be "
                         "truncated: record the demonstrations again") from None
    data = f.get("data")
    if data is None or "task" not in data.attrs or not len(data):
        f.close()
        raise ValueError(f"{path} holds no vitmix demonstrations (no data/demo_* groups with a task attribute)")
    if task is not None and data.attrs["task"] != task:
        saved = data.attrs["task"]
        f.close()
        raise ValueError(f"{path} holds demonstrations of {saved!r}, not {task!r}; give that task's demos")
    return f
