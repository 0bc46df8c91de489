"""``vitmix train`` and ``vitmix eval`` (whose parser and code are :mod:`.evaluate`'s)."""
from __future__ import annotations

import argparse

from ..runs import flags
from .config import TrainConfig
from .evaluate import add_parser as add_eval_parser

_HELP = {
    "model": "model name (see `vitmix models`)",
    "mixer": "token mixer replacing the model's attention (see `vitmix mixers`)",
    "data": "digits | fashion-mnist | cifar10 | cifar100 | imagefolder | moving-fashion-mnist | clipfolder",
    "data_dir": "dataset directory (default: the dataset's standard location)",
    "download": "allow torchvision to download fashion-mnist/cifar",
    "augment": "train without random crops/flips (e.g. to compare runs sample for sample)",
    "img_size": "input resolution (default: the model's)",
    "num_frames": "frames per clip for video data (moving-fashion-mnist, clipfolder; default: 8)",
    "lr": "peak learning rate, the same for any number of processes at the same global batch",
    "lr_base_batch": "scale --lr linearly by global batch / this (DeiT: 512); default: no scaling",
    "warmup_epochs": "linear warm-up length before the cosine decay",
    "smoothing": "label smoothing",
    "mixup": "mixup alpha (0 = off)",
    "cutmix": "cutmix alpha (0 = off)",
    "amp": "mixed precision (autocast; --amp-dtype)",
    "amp_dtype": "bfloat16 | float16 (float16 adds a gradient scaler)",
    "accum_steps": "accumulate gradients of this many batches per optimizer step",
    "ema_decay": "also keep an EMA of the weights with this decay (e.g. 0.9998): evaluated each epoch, ema.safetensors",
    "channels_last": "channels-last memory format for images and conv weights",
    "compile": "torch.compile the model (falls back to eager with a warning if compiling fails)",
    "tensorboard": "also log each epoch's metrics for TensorBoard in RUN/tensorboard (pip install tensorboard)",
    "keep_top_k": "keep the weights of the k best epochs as top/epoch-NNN.safetensors (k > 1)",
    "max_steps": "stop after this many optimizer steps (smoke tests)",
    "out": "run directory (default: runs/<time>-<model>-<mixer>-<data>)",
    "resume": "continue the run in --out from its last checkpoint",
    "device": "cpu | cuda | cuda:N (default: cuda if available)",
    "clip_grad": "gradient-norm clip (0 = off)",
    "init_from": "start from this trained model, its attention converted to --mixer (docs/convert.md): a vitmix "
                 "run directory or checkpoint (.safetensors/.pt), a timm model's weights file (with --model "
                 "NAME, e.g. deit_tiny_patch16_224), or a timm id hf-hub:ORG/NAME or local-dir:DIR; only read",
    "transfer_epochs": "with --init-from: epochs of attention transfer (each mixer learns its teacher layer's "
                       "output) before fine-tuning",
    "transfer_lr": "learning rate of the attention-transfer stage",
    "distill": "with --init-from: add logit distillation from the teacher to the fine-tuning loss",
    "distill_weight": "w in (1 - w) x task loss + w x T^2 x KL(teacher || student)",
    "distill_temperature": "softmax temperature T of the distillation",
    "train_subset": "train on a fixed random subset of this many images (seeded by --seed; validation stays whole)",
    "val_subset": "validate on a fixed random subset of this many images, the same for every seed and run (quick "
                  "runs; default: the whole validation split)",
    "aa": "timm auto-augment policy for training images, e.g. rand-m9-mstd0.5-inc1 (RandAugment), augmix-m5-w4-d2, "
          "original (default: none)",
    "reprob": "random-erasing probability (timm RandomErasing, after normalisation)",
    "remode": "random-erasing fill: pixel (per-pixel noise) | const (zeros) | rand (per-channel noise)",
    "color_jitter": "colour-jitter strength (default: 0.4 for colour images above 32 px, off for small ones; timm "
                    "turns it off under --aa)",
    "sched": "lr schedule after the warm-up, timm's scheduler factory: cosine (to --min-lr) | step (x --decay-rate "
             "every --decay-epochs) | plateau (x --decay-rate after --patience-epochs without a better "
             "--plateau-metric)",
    "decay_epochs": "--sched step: epochs between decays",
    "decay_rate": "--sched step/plateau: the lr decay factor",
    "patience_epochs": "--sched plateau: epochs without improvement before a decay",
    "plateau_metric": "--sched plateau: the validation metric it watches, val_acc | val_loss",
    "layer_decay": "layer-wise lr decay (timm's param_groups_layer_decay): layer i of L gets lr x F^(L-i), e.g. 0.75 "
                   "(default: off)",
    "grad_checkpointing": "recompute each block's activations in the backward pass (less memory, more compute)",
    "pretrained": "start from the model's timm pretrained weights (fitted to the data's classes, channels and "
                  "size; converted to --mixer)",
    "pretrained_path": "with --pretrained: a local file of those weights (timm's --pretrained-path; offline use; "
                       "default: none)",
    "initial_checkpoint": "load the model's weights from this file or run before training (strict; not on "
                          "--resume; default: none)",
    "num_classes": "classifier outputs (default: the dataset's classes; never fewer)",
    "log_wandb": "also log each epoch's metrics to Weights & Biases (pip install wandb)",
    "wandb_project": "the W&B project of --log-wandb (default: vitmix)",
}


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model (the default job trains a small ViT on digits)",
                       description="Train a model; writes config.yaml, metrics.jsonl, checkpoints and curves.png "
                                   "into a run directory. Scale out with "
                                   "`torchrun --nproc_per_node=N -m vitmix.cli train ...`.")
    add_config_flags(p)
    p.set_defaults(func=run_train)

    add_eval_parser(sub)


#: fields whose default (``None``) does not tell the flag's type
_INT = ("img_size", "num_frames", "max_steps", "train_subset", "val_subset", "lr_base_batch", "num_classes")


def add_config_flags(p: argparse.ArgumentParser, exclude=()) -> None:
    """``--config`` plus one flag per :class:`TrainConfig` field (not those in ``exclude``), and the
    repeatable ``-M``/``--model-option`` KEY=VALUE options; read back with :func:`config_from_args`."""
    p.add_argument("--config", "-c", help="YAML file of config values, or the name of a shipped recipe (digits, "
                                          "fashion-mnist, ...); flags given on the command line override it")
    flags.add_field_flags(p, TrainConfig, _HELP, ints=_INT, floats=("clip_grad", "ema_decay", "color_jitter",
                                                                      "layer_decay"),
                          exclude=(*exclude, "input_size"), aliases=TIMM_ALIASES)
    add_timm_flags(p, exclude)


#: timm ``train.py`` names that mean exactly what a vitmix flag means: extra names of that flag.
TIMM_ALIASES = {"batch_size": ("-b",), "workers": ("-j",), "accum_steps": ("--grad-accum-steps",),
                "ema_decay": ("--model-ema-decay",), "keep_top_k": ("--checkpoint-hist",),
                "download": ("--dataset-download",), "augment": ("--no-aug",)}
#: timm's EMA decay when ``--model-ema`` is given without ``--model-ema-decay``
TIMM_EMA_DECAY = 0.9998
#: timm ``train.py`` flags whose meaning differs from anything in vitmix: refused with what to use.
_OUT_HINT = ("timm's --output/--experiment make a folder per run under a parent; vitmix's --out is the run "
             "directory itself: use --out OUTPUT/EXPERIMENT")
_LR_BASE_HINT = ("timm derives the LR from --lr-base x batch / --lr-base-size (square root for Adam-type "
                 "optimizers); vitmix takes the LR itself: --lr LR, or --lr LR --lr-base-batch N for LR x "
                 "global batch / N")
TIMM_DIFFERENT = {
    "--output": _OUT_HINT, "--experiment": _OUT_HINT,
    "--lr-base": _LR_BASE_HINT, "--lr-base-size": _LR_BASE_HINT, "--lr-base-scale": _LR_BASE_HINT,
    "--drop": "timm's dropout rate has no vitmix flag: give it to the model with --model-option drop_rate=P "
              "(--drop-path is stochastic depth, as in timm)",
    "--warmup-lr": "vitmix's warm-up starts at --lr / 100 and is not settable; its length is --warmup-epochs",
}


class _Refused(argparse.Action):
    """A timm flag that vitmix does not take under that name: the parse stops with ``hint``."""

    def __init__(self, option_strings, dest, hint: str = "", **kwargs) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.hint = hint

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: {self.hint}")


class _TorchCompile(argparse.Action):
    """timm's ``--torchcompile [BACKEND]``: vitmix's ``--compile``, which uses inductor."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values not in (None, "inductor"):
            parser.error(f"{option_string} {values}: vitmix compiles with the inductor backend only; use --compile")
        namespace.compile = True


def timm_dataset(name: str) -> str:
    """timm's ``--dataset`` as vitmix's ``--data``: ``torch/cifar10`` → ``cifar10``, ``torch/fashion_mnist``
    → ``fashion-mnist``, ``folder``/``image_folder`` (or empty: timm's default) → ``imagefolder``;
    vitmix's own names pass through."""
    base = name.lower().removeprefix("torch/")
    if base in ("", "folder", "image_folder", "imagefolder"):
        return "imagefolder"
    return base.replace("_", "-")


def add_timm_flags(p: argparse.ArgumentParser, exclude=()) -> None:
    """The timm ``train.py`` flags that need more than a second name (README: "timm's flag names"),
    and the refused ones."""
    timm = p.add_argument_group("timm train.py names", "also accepted, with timm's meaning (see README)")
    if "data" not in exclude:
        timm.add_argument("--dataset", "-d", dest="data", type=timm_dataset, metavar="NAME",
                          help="timm's dataset name for --data: torch/cifar10, torch/fashion_mnist, folder, ...")
    if "compile" not in exclude:
        timm.add_argument("--torchcompile", dest="compile", nargs="?", action=_TorchCompile, default=None,
                          metavar="inductor", help="--compile")
    if "ema_decay" not in exclude:
        timm.add_argument("--model-ema", action="store_true", default=None,
                          help=f"keep an EMA of the weights: --ema-decay {TIMM_EMA_DECAY} unless a decay is given")
    timm.add_argument("--model-kwargs", dest="model_option", nargs="+", action="extend", metavar="KEY=VALUE",
                      help="--model-option KEY=VALUE, several at once")
    if "input_size" not in exclude:
        timm.add_argument("--input-size", nargs=3, type=int, metavar=("C", "H", "W"),
                          help="the input's channels and size: the data's channels, --img-size H (square: H = W)")
    for flag, hint in TIMM_DIFFERENT.items():
        p.add_argument(flag, action=_Refused, hint=hint)


def config_from_args(args: argparse.Namespace, config_cls=TrainConfig):
    """The run's config: ``--config`` overlaid by the flags given. With ``--resume`` the base is the
    run's own ``config.yaml``, so ``vitmix train --out RUN --resume`` needs no other flag (and a flag
    that would change the run is refused by the runner). ``config_cls``: any :class:`YamlConfig`
    dataclass whose fields are the flags (``vitmix generate train`` passes its own); an optional
    field given as 0 (``--clip-grad 0``, ``--ema-decay 0``) means off."""
    return flags.config_from_args(args, config_cls, adjust=_timm_model_ema)


def _timm_model_ema(values: dict, args: argparse.Namespace) -> None:
    """timm's ``--model-ema`` without ``--model-ema-decay``: its default decay."""
    if getattr(args, "model_ema", None) and values.get("ema_decay") is None:
        values["ema_decay"] = TIMM_EMA_DECAY


def run_train(args) -> int:
    from .runner import train

    train(config_from_args(args))
    return 0
