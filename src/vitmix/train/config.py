"""One config object for a training run; written to ``config.yaml`` in the run directory."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..runs.flags import (  # noqa: F401  (re-exported: the config helpers' older home)
    TIMM_KEYS, YamlConfig, checked_value, load_yaml, parse_key_values,
)


@dataclass
class TrainConfig(YamlConfig):
    """Everything that defines a run. CLI flags map 1:1 onto these fields (``--batch-size`` → batch_size)."""

    model: str = "vit_nano_patch4_32"
    mixer: Optional[str] = None          # None: the model's own default mixer
    mixer_options: Dict[str, Any] = field(default_factory=dict)
    model_options: Dict[str, Any] = field(default_factory=dict)
    data: str = "digits"
    data_dir: Optional[str] = None
    data_options: Dict[str, Any] = field(default_factory=dict)   # sequence data: sizes, seed, generator options
    download: bool = False
    augment: bool = True                 # random resized crops (and flips for colour data) in training
    img_size: Optional[int] = None       # None: the model's default input size
    num_frames: Optional[int] = None     # video data: frames per clip (None: the dataset's default, 8)
    epochs: int = 20
    batch_size: int = 32
    lr: float = 2e-3                     # peak LR for the global batch, whatever the world size
    lr_base_batch: Optional[int] = None  # scale lr by global batch / this (DeiT: 512); None: no scaling
    min_lr: float = 1e-5
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    opt: str = "adamw"
    clip_grad: Optional[float] = 1.0
    smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    drop_path: float = 0.0
    amp: bool = False                    # autocast (amp_dtype)
    amp_dtype: str = "bfloat16"          # or "float16" (with a grad scaler)
    accum_steps: int = 1                 # micro-batches per optimizer step (global batch × this)
    ema_decay: Optional[float] = None    # keep an EMA of the weights (timm ModelEmaV3), e.g. 0.9998
    channels_last: bool = False          # NHWC images and conv weights
    compile: bool = False                # torch.compile the model (eager if compiling fails)
    keep_top_k: int = 1                  # also keep the k best epochs' weights under top/ (k > 1)
    tensorboard: bool = False            # also log the epoch metrics to run_dir/tensorboard
    seed: int = 0
    workers: int = 0
    max_steps: Optional[int] = None      # stop after this many optimizer steps (smoke tests)
    train_subset: Optional[int] = None   # train on a fixed seeded subset of this many images
    val_subset: Optional[int] = None     # validate on a fixed subset of this many images (None: all)
    out: Optional[str] = None
    resume: bool = False
    device: Optional[str] = None
    init_from: Optional[str] = None      # start from this trained run/checkpoint, converted to `mixer`
    transfer_epochs: int = 0             # epochs of attention transfer before fine-tuning (needs init_from)
    transfer_lr: float = 1e-4            # the transfer stage's AdamW learning rate
    distill: bool = False                # add logit distillation from the init_from teacher
    distill_weight: float = 0.5          # w in (1 - w) * task loss + w * T^2 * KL (DeiT's soft distillation)
    distill_temperature: float = 1.0     # T (DeiT's default)
    # timm train.py's recipe flags, with timm's meaning (README "timm's recipe flags")
    aa: Optional[str] = None             # auto-augment policy, e.g. rand-m9-mstd0.5-inc1 (RandAugment)
    reprob: float = 0.0                  # random-erasing probability
    remode: str = "pixel"                # random-erasing fill: pixel | const | rand
    color_jitter: Optional[float] = None  # None: the dataset's default (0.4 for colour images above 32 px, else off)
    sched: str = "cosine"                # cosine | step | plateau (timm's scheduler factory)
    decay_epochs: float = 90.0           # step: multiply the lr by decay_rate every this many epochs
    decay_rate: float = 0.1              # step and plateau: the decay factor
    patience_epochs: int = 10            # plateau: epochs without improvement before a decay
    plateau_metric: str = "val_acc"      # plateau: the metric it watches, val_acc (max) or val_loss (min)
    layer_decay: Optional[float] = None  # layer-wise lr decay (timm's param_groups_layer_decay)
    grad_checkpointing: bool = False     # recompute activations in the backward pass (timm's set_grad_checkpointing)
    pretrained: bool = False             # start from the model's timm pretrained weights
    pretrained_path: Optional[str] = None  # with pretrained: a local file as those weights (timm's --pretrained-path)
    initial_checkpoint: Optional[str] = None  # load these model weights before training (timm's meaning)
    num_classes: Optional[int] = None    # the model's classes (None: the dataset's); at least the dataset's
    input_size: Optional[List[int]] = None  # [C, H, W] (timm's): the data's channels and img_size
    log_wandb: bool = False              # also log the epoch metrics to Weights & Biases
    wandb_project: Optional[str] = None  # the W&B project (None: vitmix)

    def check_values(self) -> None:
        """A number out of range is a one-line ``ValueError`` naming the flag, before any work
        (a batch of 0 images would otherwise fail deep inside a mixer's reshape)."""
        for name in ("epochs", "batch_size", "max_steps", "train_subset", "val_subset", "lr_base_batch", "accum_steps",
                     "keep_top_k", "img_size", "num_frames"):
            _check(name, getattr(self, name), lambda v: v > 0, "a positive integer")
        _check("workers", self.workers, lambda v: v >= 0, "an integer >= 0")
        _check("lr", self.lr, lambda v: v > 0, "> 0")
        for name in ("min_lr", "weight_decay", "warmup_epochs", "mixup", "cutmix"):
            _check(name, getattr(self, name), lambda v: v >= 0, ">= 0")
        for name in ("smoothing", "drop_path"):
            _check(name, getattr(self, name), lambda v: 0 <= v < 1, "in [0, 1)")
        _check("clip_grad", self.clip_grad, lambda v: v > 0, "> 0 (or null: no clipping)")
        _check("ema_decay", self.ema_decay, lambda v: 0 < v < 1, "between 0 and 1 (e.g. 0.9998)")
        if self.min_lr > self.lr:   # the cosine decay would climb from --lr up to --min-lr
            raise ValueError(f"--min-lr {self.min_lr:g} is above --lr {self.lr:g}: the schedule decays from --lr "
                             "down to --min-lr; lower --min-lr")
        _check_optimizer(self.opt)
        self._check_init_from()
        self._check_timm_recipe()

    def _check_timm_recipe(self) -> None:
        """The timm recipe flags: ranges, names, and combinations that cannot work."""
        _check("reprob", self.reprob, lambda v: 0 <= v <= 1, "in [0, 1]")
        _check("color_jitter", self.color_jitter, lambda v: v >= 0, ">= 0")
        _check("decay_epochs", self.decay_epochs, lambda v: v > 0, "> 0")
        _check("decay_rate", self.decay_rate, lambda v: 0 < v <= 1, "in (0, 1]")
        _check("patience_epochs", self.patience_epochs, lambda v: v >= 0, "an integer >= 0")
        _check("layer_decay", self.layer_decay, lambda v: 0 < v <= 1, "in (0, 1] (e.g. 0.75)")
        _check("num_classes", self.num_classes, lambda v: v > 0, "a positive integer")
        for name, value, known in (("sched", self.sched, SCHEDULES), ("remode", self.remode, ERASE_MODES),
                                   ("plateau_metric", self.plateau_metric, PLATEAU_METRICS)):
            _check_choice(name, value, known)
        if self.aa:
            _check_auto_augment(self.aa)
        if not self.augment and (self.aa or self.reprob or self.color_jitter):
            used = "--aa" if self.aa else "--reprob" if self.reprob else "--color-jitter"
            raise ValueError(f"{used} is training augmentation, which --no-augment turns off: drop one of them")
        self._check_input_size()
        self._check_start_weights()

    def _check_input_size(self) -> None:
        if self.input_size is None:
            return
        self.input_size = size = list(self.input_size)     # a tuple from Python: YAML writes lists
        if len(size) != 3 or not all(isinstance(v, int) and v > 0 for v in size):
            raise ValueError(f"--input-size {size} must be three positive integers C H W (e.g. 3 224 224)")
        if size[1] != size[2]:
            raise ValueError(f"--input-size {' '.join(map(str, size))}: vitmix trains on square images; "
                             f"use --input-size {size[0]} {size[1]} {size[1]}")
        if self.img_size is not None and self.img_size != size[1]:
            raise ValueError(f"--img-size {self.img_size} differs from --input-size {' '.join(map(str, size))}: "
                             "give one of them")

    def _check_start_weights(self) -> None:
        if self.pretrained_path and not self.pretrained:
            raise ValueError("--pretrained-path FILE gives the weights of --pretrained: add --pretrained")
        if self.init_from and (self.pretrained or self.initial_checkpoint):
            used = "--pretrained" if self.pretrained else "--initial-checkpoint"
            raise ValueError(f"{used} and --init-from both give the starting weights: keep one of them")

    def _check_init_from(self) -> None:
        _check("transfer_epochs", self.transfer_epochs, lambda v: v >= 0, "an integer >= 0")
        for name in ("transfer_lr", "distill_temperature"):
            _check(name, getattr(self, name), lambda v: v > 0, "> 0")
        _check("distill_weight", self.distill_weight, lambda v: 0 <= v <= 1, "in [0, 1]")
        if not self.init_from:
            used = "--transfer-epochs" if self.transfer_epochs else "--distill" if self.distill else None
            if used:
                raise ValueError(f"{used} needs --init-from RUN_OR_FILE: the trained model to start from and "
                                 "learn from")


def _check(name: str, value, ok, expected: str) -> None:
    """``inf`` passes every bound, so a float must also be finite (``--lr inf`` trained a NaN model)."""
    if value is not None and not (ok(value) and math.isfinite(value)):
        finite = "" if math.isfinite(value) else "a finite number, "
        raise ValueError(f"--{name.replace('_', '-')} {value} must be {finite}{expected}")


#: the choices of --sched, --remode and --plateau-metric
SCHEDULES = ("cosine", "step", "plateau")
ERASE_MODES = ("pixel", "const", "rand")
PLATEAU_METRICS = ("val_acc", "val_loss")


def _check_choice(name: str, value: str, known) -> None:
    from .._util import close_matches

    if value not in known:
        raise ValueError(f"--{name.replace('_', '-')} {value!r} is not one of {', '.join(known)}."
                         + close_matches(value, known))


def _check_auto_augment(policy: str) -> None:
    """``--aa`` checked by building timm's training transform with it, before any work: timm's own
    errors for a malformed policy (``invalid literal for int()``, a bare ``AssertionError``) name
    neither the flag nor the form."""
    from timm.data import create_transform

    try:
        create_transform(32, is_training=True, auto_augment=policy)
    except Exception as err:  # noqa: BLE001 - timm's parsers raise ValueError, KeyError or AssertionError
        raise ValueError(f"--aa {policy!r} is not a timm auto-augment policy ({type(err).__name__}: "
                         f"{str(err) or 'rejected'}); write e.g. rand-m9-mstd0.5-inc1 (RandAugment), "
                         "augmix-m5-w4-d2 (AugMix) or original (AutoAugment)") from None


def _check_optimizer(opt: str) -> None:
    """``--opt`` is a timm optimizer name (after timm's ``lookahead_``-style prefixes), checked before any
    work with the close names; timm's own error named neither the flag nor an alternative."""
    from timm.optim import list_optimizers

    from .._util import close_matches

    known = list_optimizers()
    name = opt.lower().split("_")[-1]
    if name not in known:
        raise ValueError(f"--opt {opt!r} is not an optimizer timm knows.{close_matches(name, known)} "
                         "See timm.optim.list_optimizers()")
