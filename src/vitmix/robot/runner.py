"""Train a robot policy on vitmix's run machinery and evaluate it by rollouts.

A training run directory holds ``config.yaml``, ``last.safetensors`` (model) and ``ema.safetensors``
(EMA weights, used for evaluation), ``metrics.jsonl`` and ``curves.png`` (training loss per checkpoint),
and ``state.pt``, the manifest of the last complete checkpoint (``runs.resume``): a run killed at any
point continues with ``--resume``. Evaluation writes ``eval-seed<S>-n<R>/episodes.csv`` (one row
per rollout), ``summary.json`` and ``rollouts.png`` (a strip of frames of the first rollouts); the
folder is named by what determines its content, so a rerun rewrites it with the same numbers and
another evaluation never replaces it.

The metric is the official one: the mean over rollouts of the episode's maximum reward, which for
Lift and Can (sparse reward 1 on success) is the success rate, and for PushT the mean maximum coverage
(reward = coverage / 0.95, clipped at 1).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import torch
import yaml

from ..runs.checkpoints import atomic_write, load_weights, save_text, save_weights
from ..runs.device import parse_device
from ..runs.directory import clear_aborted, prepare_run_dir, recorded_abort
from ..runs.resume import Resumed, Trainable, resume_run, save_manifest, save_metrics
from .dataset import HORIZON, N_ACTION, N_OBS, DemoWindows, proprio_stats
from .policy import ENCODERS, FIBOTTENTION_FORMS, DiffusionPolicy
from .sim import MAX_STEPS, SPECS, check_task, make_env

__all__ = ["RobotTrainConfig", "CHECKPOINT_FILES", "train_policy", "load_policy", "evaluate_policy", "eval_dir"]

CHECKPOINT_FILES = ("last.safetensors", "ema.safetensors", "metrics.jsonl")
#: what ``--resume`` may change (the first two are the run's own)
RESUME_MAY_CHANGE = ("out", "resume", "steps", "device")


@dataclasses.dataclass
class RobotTrainConfig:
    """``vitmix robot train``'s settings (saved as the run's ``config.yaml``)."""

    task: str = "lift"
    demos: str = ""
    mixer: str = "softmax"
    fibottention: str = "official"
    encoder: str = "small"
    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-4
    weight_decay: float = 1e-6
    ema_decay: float = 0.995
    save_every: int = 100
    seed: int = 0
    out: Optional[str] = None
    resume: bool = False
    device: Optional[str] = None

    @classmethod
    def field_names(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def load(cls, path) -> "RobotTrainConfig":
        return cls(**{k: v for k, v in yaml.safe_load(Path(path).read_text()).items() if k in cls.field_names()})

    def check(self) -> None:
        check_task(self.task)
        for name in ("steps", "batch_size", "save_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.fibottention not in FIBOTTENTION_FORMS:
            raise ValueError(f"--fibottention {self.fibottention!r} is not one of {', '.join(FIBOTTENTION_FORMS)}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"--encoder {self.encoder!r} is not one of {', '.join(ENCODERS)}")
        if not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"--ema-decay {self.ema_decay} must be between 0 and 1 (e.g. 0.995)")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")


def _meta(cfg: RobotTrainConfig, stats: dict, step: int, demos: int) -> dict:
    return {"task": cfg.task, "mixer": cfg.mixer, "fibottention": cfg.fibottention, "encoder": cfg.encoder,
            "proprio_min": stats["min"], "proprio_max": stats["max"], "cameras": list(SPECS[cfg.task].cameras),
            "action_dim": SPECS[cfg.task].action_dim, "crop": SPECS[cfg.task].crop, "n_obs": N_OBS,
            "horizon": HORIZON, "n_action": N_ACTION, "step": step, "demos": demos, "seed": cfg.seed}


def _build(meta: dict) -> DiffusionPolicy:
    """The policy a checkpoint's metadata describes (Lift/Can's action size and crop where it names none)."""
    return DiffusionPolicy(meta["mixer"], meta["fibottention"], meta["encoder"], action_dim=meta.get("action_dim", 7),
                           proprio_dim=len(meta["proprio_min"]), proprio_min=meta["proprio_min"],
                           proprio_max=meta["proprio_max"], cameras=meta["cameras"], n_obs=meta["n_obs"],
                           horizon=meta["horizon"], crop=meta.get("crop", SPECS["lift"].crop))


def _save_policy(run_dir: Path, model, ema, meta: dict) -> None:
    save_weights(model, run_dir / "last.safetensors", meta)
    save_weights(ema.module, run_dir / "ema.safetensors", meta)


def _batches(loader):
    while True:
        yield from loader


def plot_loss(history: List[dict], path: Path, title: str) -> None:
    """The training loss per checkpoint as a PNG (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], marker="o", ms=3)
    ax.set(xlabel="optimizer step", ylabel="diffusion loss", title=title, yscale="log")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


def train_policy(cfg: RobotTrainConfig, log: Callable[[str], None] = print) -> Path:
    """Train (or, with ``cfg.resume``, continue) a policy; returns the run directory."""
    cfg.check()
    run_dir = prepare_run_dir(cfg, RobotTrainConfig, RESUME_MAY_CHANGE, f"robot-{cfg.task}-{cfg.mixer}")
    if not cfg.demos:
        raise ValueError("--demos is required: a directory or file written by `vitmix robot demos`")
    device = parse_device(cfg.device)
    data = DemoWindows(cfg.demos, cfg.task)                 # a wrong or broken file fails before any write
    stats = proprio_stats(data)
    torch.manual_seed(cfg.seed)
    spec = SPECS[cfg.task]
    model = DiffusionPolicy(cfg.mixer, cfg.fibottention, cfg.encoder, action_dim=spec.action_dim,
                            proprio_dim=spec.proprio_dim, proprio_min=stats["min"], proprio_max=stats["max"],
                            cameras=spec.cameras, crop=spec.crop).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    from timm.utils import ModelEmaV3

    ema = ModelEmaV3(model, decay=cfg.ema_decay, use_warmup=True)
    loader = torch.utils.data.DataLoader(data, batch_size=cfg.batch_size, shuffle=True,
                                         drop_last=len(data) >= cfg.batch_size,
                                         generator=torch.Generator().manual_seed(cfg.seed))
    parts = Trainable(model, optimizer, ema=ema, loader=loader)
    run_dir.mkdir(parents=True, exist_ok=True)
    clear_aborted(run_dir)
    demos = len(data.actions)
    if cfg.resume:       # weights newer than the manifest (killed mid-checkpoint) are rewritten from it
        resumed = resume_run(run_dir, parts, log, lambda history: _save_policy(
            run_dir, model, ema, _meta(cfg, stats, history[-1]["step"] if history else 0, demos)))
    else:
        save_text(run_dir / "config.yaml", yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
        resumed = Resumed()
    step, history = resumed.step, list(resumed.history)
    seconds = history[-1]["seconds"] if history else 0.0
    if step >= cfg.steps:
        log(f"{run_dir}: already trained for {step} steps")
        return run_dir
    log(f"training {cfg.mixer} policy on {cfg.task}: {demos} demos, {len(data)} windows, steps {step + 1}.."
        f"{cfg.steps} -> {run_dir}")
    model.train()
    losses, start = [], time.perf_counter()
    with recorded_abort(run_dir):
        for images, proprio, actions in _batches(loader):
            loss = model.loss(images.to(device), proprio.to(device), actions.to(device))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the loss became {loss.item()} at step {step + 1}; lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            ema.update(model, step=step)
            losses.append(loss.item())
            if step % cfg.save_every == 0 or step == cfg.steps:
                elapsed = seconds + time.perf_counter() - start
                history.append({"step": step, "loss": float(np.mean(losses)), "seconds": round(elapsed, 1)})
                _save_policy(run_dir, model, ema, _meta(cfg, stats, step, demos))
                save_metrics(run_dir, history)
                save_manifest(run_dir, parts, len(history), step, history, CHECKPOINT_FILES)
                plot_loss(history, run_dir / "curves.png", f"{cfg.task} · {cfg.mixer}")
                log(f"step {step}/{cfg.steps}: loss {history[-1]['loss']:.4f}, {elapsed:.0f} s")
                losses = []
            if step >= cfg.steps:
                break
    return run_dir


def load_policy(run, device=None):
    """The EMA policy of a run directory (or a ``.safetensors`` file) and its metadata."""
    path = Path(run)
    if path.is_dir():
        path = path / "ema.safetensors"
    state, meta = load_weights(path)
    if "task" not in meta or "mixer" not in meta:
        raise ValueError(f"{path} is not a vitmix robot policy (its metadata names no task)")
    model = _build(meta)
    model.load_state_dict(state)
    return model.to(parse_device(device)).eval(), meta


def eval_dir(run, seed: int, rollouts: int) -> Path:
    """Where :func:`evaluate_policy` writes the evaluation of ``run`` with ``seed`` and ``rollouts``."""
    return (Path(run) if Path(run).is_dir() else Path(run).parent) / f"eval-seed{seed}-n{rollouts}"


def _stack(history: collections.deque, cameras, proprio_keys) -> tuple:
    images = np.stack([np.stack([o[f"{c}_image"] for c in cameras]) for o in history])       # (T, cams, H, W, 3)
    proprio = np.stack([np.concatenate([o[k] for k in proprio_keys]) for o in history])
    return (torch.from_numpy(images).permute(0, 1, 4, 2, 3)[None], torch.from_numpy(proprio).float()[None])


def evaluate_policy(run, rollouts: int = 50, seed: int = 100_000, task: Optional[str] = None,
                    sample_steps: int = 10, max_steps: Optional[int] = None, strip: int = 3, device=None,
                    log: Callable[[str], None] = print) -> dict:
    """Roll the run's policy out ``rollouts`` times (episode ``i`` seeded ``seed + i``); writes
    ``RUN/eval/`` and returns the summary (``success_rate`` = mean of the episodes' max reward)."""
    if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
        raise ValueError(f"--rollouts must be a positive integer, got {rollouts!r}")
    if sample_steps < 1:
        raise ValueError(f"--sample-steps must be >= 1, got {sample_steps}")
    model, meta = load_policy(run, device)
    if task is not None and check_task(task) != meta["task"]:
        raise ValueError(f"{run} is a {meta['task']!r} policy; it cannot be evaluated on {task!r}")
    task = meta["task"]
    limit = max_steps or MAX_STEPS[task]
    out = eval_dir(run, seed, rollouts)
    env = make_env(task, cameras=meta["cameras"])
    dev = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    rows, frames, start = [], [], time.perf_counter()
    try:
        for episode in range(rollouts):
            obs = env.reset(seed=seed + episode)
            history = collections.deque([obs] * meta["n_obs"], maxlen=meta["n_obs"])
            best, steps, shots = 0.0, 0, []
            while steps < limit and best < 1.0:
                images, proprio = _stack(history, meta["cameras"], SPECS[task].proprio)
                actions = model.predict(images.to(dev), proprio.to(dev), sample_steps, generator)[0].cpu().numpy()
                first = meta["n_obs"] - 1
                for action in actions[first:first + meta["n_action"]]:
                    obs, reward, _ = env.step(np.clip(action, -1, 1))
                    history.append(obs)
                    best, steps = max(best, reward), steps + 1
                    if episode < strip and steps % 8 == 1:
                        shots.append(obs[f"{meta['cameras'][0]}_image"])
                    if best >= 1.0 or steps >= limit:
                        break
            if episode < strip:
                frames.append(shots + [obs[f"{meta['cameras'][0]}_image"]])
            rows.append({"episode": episode, "seed": seed + episode, "success": int(best >= 1.0),
                         "max_reward": best, "steps": steps})
            log(f"rollout {episode + 1}/{rollouts}: {'success' if best >= 1.0 else 'failure'} in {steps} steps "
                f"({time.perf_counter() - start:.0f} s)")
    finally:
        env.close()
    summary = {"task": task, "mixer": meta["mixer"], "fibottention": meta["fibottention"], "rollouts": rollouts,
               "seed": seed, "success_rate": float(np.mean([r["max_reward"] for r in rows])),
               "train_steps": meta["step"], "sample_steps": sample_steps, "max_steps": limit,
               "seconds": round(time.perf_counter() - start, 1)}
    out.mkdir(parents=True, exist_ok=True)
    from .._util import write_csv

    write_csv(out / "episodes.csv", rows)
    save_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    _save_strip(frames, out / "rollouts.png")
    log(f"{task} · {meta['mixer']}: {SPECS[task].metric} {summary['success_rate']:.2f} over {rollouts} rollouts "
        f"-> {out}")
    return summary


def _save_strip(frames: List[List[np.ndarray]], path: Path, per_row: int = 12) -> None:
    """One row per rollout: every 8th frame (up to ``per_row``, the last one kept), as a PNG."""
    if not frames:
        return
    from PIL import Image

    rows = []
    for shots in frames:
        picked = shots[:per_row - 1] + [shots[-1]] if len(shots) > per_row else shots
        row = np.concatenate(picked + [np.zeros_like(picked[0])] * (per_row - len(picked)), axis=1)
        rows.append(row)
    atomic_write(path, lambda tmp: Image.fromarray(np.concatenate(rows, axis=0)).save(tmp, format="png"))
