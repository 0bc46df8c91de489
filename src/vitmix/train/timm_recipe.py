"""The pieces behind ``vitmix train``'s timm ``train.py`` recipe flags, each built with timm's own
factory so that a flag means what it means in timm: the training augmentation (``--aa``, ``--reprob``,
``--remode``, ``--color-jitter``), the optimizer with layer-wise lr decay (``--layer-decay``), the lr
schedule (``--sched``), gradient checkpointing, the starting weights (``--initial-checkpoint``) and
Weights & Biases logging (``--log-wandb``). Everything here is rebuilt from ``config.yaml`` on
``--resume``; the one piece with state of its own, the plateau schedule, is replayed from the run's
recorded epochs (:func:`resume_schedule`).
"""
from __future__ import annotations

import importlib
import math
import warnings
from pathlib import Path
from typing import Union

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import PlateauLRScheduler, create_scheduler_v2
from torch import nn

from ..data import Augment
from ..runs import load_into, read_checkpoint, resolve_checkpoint
from .config import TrainConfig

#: the warm-up starts at this fraction of the peak lr (vitmix's schedule since its first version)
WARMUP_START = 0.01


def train_augment(cfg: TrainConfig) -> Union[bool, Augment]:
    """``build_datasets``' ``augment`` for ``cfg``: off, or crops and flips plus timm's policies."""
    if not cfg.augment:
        return False
    return Augment(auto_augment=cfg.aa, re_prob=cfg.reprob, re_mode=cfg.remode, color_jitter=cfg.color_jitter)


def create_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2``; ``--layer-decay`` gives each layer group its ``lr_scale``
    (timm's ``param_groups_layer_decay``, read by the scheduler), which needs the model's
    ``group_matcher``: without one timm would put every parameter in one group, so it is an error."""
    if cfg.layer_decay is not None and not hasattr(model, "group_matcher"):
        raise ValueError(f"--layer-decay: {cfg.model} ({type(model).__name__}) has no layer groups (timm's "
                         "group_matcher); drop --layer-decay or train a ViT-style model (vit_*, deit_*, "
                         "laplacianformer_*, weightformer_*)")
    return create_optimizer_v2(model, opt=cfg.opt, lr=lr, weight_decay=cfg.weight_decay,
                               layer_decay=cfg.layer_decay)


def create_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, lr: float, steps_per_epoch: int):
    """timm's ``create_scheduler_v2`` for ``--sched``, warmed up linearly from ``lr × WARMUP_START``
    over ``--warmup-epochs`` before the schedule proper. ``cosine`` and ``step`` are stepped per optimizer
    step (``step_update``): every length is given in steps (one "epoch" of the factory = one step), so
    ``--max-steps`` shortens the cosine exactly. ``plateau`` is stepped per epoch on ``--plateau-metric``
    (``step(epoch, metric)``), as timm steps it, after a warm-up of whole epochs (``--warmup-epochs``
    rounded up: timm's plateau warm-up reaches the peak lr only at a whole epoch). timm's deprecation
    warning for it says a resume restarts its state, which :func:`resume_schedule` replays instead, so it
    is not shown."""
    common = dict(sched=cfg.sched, min_lr=cfg.min_lr, warmup_lr=lr * WARMUP_START, decay_rate=cfg.decay_rate)
    if cfg.sched == "plateau":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "PlateauLRScheduler is deprecated", FutureWarning)
            scheduler, _ = create_scheduler_v2(optimizer, warmup_epochs=math.ceil(cfg.warmup_epochs),
                                               patience_epochs=cfg.patience_epochs,
                                               plateau_mode="min" if cfg.plateau_metric == "val_loss" else "max",
                                               **common)
        return scheduler
    total = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    scheduler, _ = create_scheduler_v2(optimizer, num_epochs=max(total, 1),
                                       warmup_epochs=int(cfg.warmup_epochs * steps_per_epoch), warmup_prefix=True,
                                       decay_epochs=cfg.decay_epochs * steps_per_epoch, step_on_epochs=False,
                                       updates_per_epoch=1, **common)
    return scheduler


def step_epoch(scheduler, epoch: int, metrics: dict, cfg: TrainConfig) -> None:
    """The end of epoch ``epoch`` (1-based) for the scheduler: a plateau schedule decides on its
    metric; the per-step schedules ignore it (timm's ``step`` does nothing for them)."""
    scheduler.step(epoch, metrics[cfg.plateau_metric])


def resume_schedule(scheduler, history, step: int, cfg: TrainConfig) -> None:
    """Bring a resumed run's new scheduler to where the run left it. A per-step schedule is a function
    of the step. A plateau schedule also holds its best metric, its epochs without improvement and the
    lr it decayed to, which timm does not checkpoint: it is given the recorded epochs' metrics again,
    from its starting lr (the optimizer's loaded lr is the end state, not the start)."""
    if isinstance(scheduler, PlateauLRScheduler):
        if scheduler.warmup_t:
            scheduler.update_groups(scheduler.warmup_lr_init)
        else:
            for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_values):
                group[scheduler.param_group_field] = base
        for metrics in history:
            step_epoch(scheduler, metrics["epoch"], metrics, cfg)
    scheduler.step_update(num_updates=step)


def set_grad_checkpointing(model: nn.Module, name: str) -> None:
    """``--grad-checkpointing``: timm's ``model.set_grad_checkpointing(True)``; a model without it is a
    one-line error."""
    try:
        model.set_grad_checkpointing(True)
    except (AttributeError, NotImplementedError, AssertionError):
        raise ValueError(f"--grad-checkpointing: {name} ({type(model).__name__}) has no set_grad_checkpointing "
                         "(timm's API for it); drop the flag") from None


def load_initial_checkpoint(model: nn.Module, path: str) -> None:
    """``--initial-checkpoint FILE`` (timm's meaning): the model's weights from a file or run directory
    before training, loaded strictly (read with ``weights_only=True`` / safetensors)."""
    file = resolve_checkpoint(Path(path).expanduser())
    load_into(model, read_checkpoint(file)[0], f"--initial-checkpoint {file}")


def check_start_files(cfg: TrainConfig) -> None:
    """A new run's ``--pretrained-path``/``--initial-checkpoint`` must exist (a resumed run has its own
    weights and needs neither)."""
    for flag, path in (("--pretrained-path", cfg.pretrained_path), ("--initial-checkpoint", cfg.initial_checkpoint)):
        if path and not cfg.resume and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"{flag} {path}: no such file or run directory")


def check_wandb(cfg: TrainConfig) -> None:
    """``--log-wandb`` without the wandb package is a one-line error before any work."""
    if not cfg.log_wandb:
        return
    try:
        importlib.import_module("wandb")
    except ImportError:
        raise ValueError("--log-wandb needs the wandb package: pip install wandb") from None


class WandbLog:
    """The epoch metrics of a run logged to Weights & Biases (timm ``train.py``'s ``--log-wandb``): one
    W&B run named after the run directory, its config the run's ``config.yaml`` values."""

    def __init__(self, cfg: TrainConfig, run_dir: Path):
        import wandb

        self.run = wandb.init(project=cfg.wandb_project or "vitmix", name=Path(run_dir).name, config=cfg.to_dict(),
                              dir=str(run_dir))

    def log(self, metrics: dict, epoch: int) -> None:
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=epoch)

    def close(self) -> None:
        self.run.finish()

