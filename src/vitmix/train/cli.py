"""``vitmix train`` and ``vitmix eval``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..runs import flags
from .config import TrainConfig

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

    e = sub.add_parser("eval", help="evaluate a checkpoint on a dataset's validation split",
                       description="Evaluate a checkpoint on a dataset's validation split; with --corruptions, "
                                   "also under image corruptions (ImageNet-C family), written to "
                                   "corruptions.md/.csv/.json/.png.")
    e.add_argument("checkpoint_path", nargs="?", metavar="RUN_DIR_OR_CHECKPOINT",
                   help="a .safetensors checkpoint or a run directory (its best.safetensors)")
    e.add_argument("--checkpoint", help="the same, as a flag")
    e.add_argument("--data", help="dataset (default: the one the checkpoint was trained on)")
    e.add_argument("--data-dir")
    e.add_argument("--batch-size", type=int, default=128)
    e.add_argument("--device")
    e.add_argument("--amp", action="store_true", help="bf16 autocast")
    e.add_argument("--results-file", metavar="PATH", help="also write the result as JSON to PATH (as timm's "
                                                           "validate.py does)")
    e.add_argument("--corruptions", metavar="all|NAME,NAME",
                   help="also evaluate under these corruptions (names and parameters: docs/robustness.md)")
    e.add_argument("--severities", metavar="1,2,3", help="corruption severities, 1..5 (default: 1,2,3,4,5)")
    e.add_argument("--seed", type=int, help="seed of the corruptions' random noise (default: 0)")
    e.add_argument("--out", metavar="DIR", help="corruption report directory (default: the run directory, "
                                                "or the checkpoint's folder)")
    e.set_defaults(func=run_eval)


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


def run_eval(args) -> int:
    """``vitmix eval``: the checkpoint's task picks its evaluator (``runs/tasks.py``)."""
    from ..runs.tasks import evaluator

    checkpoint = _eval_checkpoint(args)
    return evaluator(checkpoint)(args, checkpoint)


def eval_classifier(args, checkpoint: str) -> int:
    """``vitmix eval`` of a classifier: validation accuracy, or the corruption report."""
    from .runner import evaluate_checkpoint

    if args.corruptions is not None:
        if args.results_file is not None:
            raise ValueError("--results-file is for the plain evaluation; with --corruptions the results go to "
                             "corruptions.json in --out")
        return _run_corruptions(args, checkpoint)
    given = [flag for flag in ("severities", "seed", "out") if getattr(args, flag) is not None]
    if given:
        raise ValueError(f"--{given[0]} sets up the corruption report: add --corruptions all (or names)")
    results_file = _results_file(args.results_file)
    r = evaluate_checkpoint(checkpoint, args.data, args.data_dir, args.batch_size, args.device, args.amp)
    top5 = f", top-5 {r['val_acc_top5']:.2f}%" if "val_acc_top5" in r else ""
    print(f"{r['model']} (mixer={r['mixer'] or 'default'}) on {r['data']}: val acc {r['val_acc']:.2f}%{top5} "
          f"({r['val_images']} images), val loss {r['val_loss']:.4f}  [{r['checkpoint']}]")
    if results_file is not None:
        results_file.write_text(json.dumps(r, indent=2) + "\n")
    return 0


def _results_file(path):
    """``--results-file``, checked before any work: a file in an existing folder."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--results-file {path} is a directory; give a file name such as {path / 'results.json'}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"--results-file {path}: the folder {path.parent} does not exist")
    return path


def _eval_checkpoint(args) -> str:
    """The checkpoint given positionally or with --checkpoint (one of them, or both the same)."""
    given = {c for c in (args.checkpoint_path, args.checkpoint) if c}
    if len(given) != 1:
        raise ValueError("give one checkpoint: vitmix eval RUN_DIR_OR_CHECKPOINT" if not given else
                         f"two different checkpoints given ({' and '.join(sorted(given))}); give one")
    return given.pop()


def _run_corruptions(args, checkpoint: str) -> int:
    """``vitmix eval --corruptions``: every name, severity and path is checked before any work."""
    from ..data.corruptions import parse_corruptions, parse_severities
    from .robustness import (
        REPORT_FILES, corruption_summary, corruption_table, default_report_dir, evaluate_checkpoint_corruptions,
        write_corruption_report,
    )
    from ..runs import check_output_dir
    from .runner import resolve_checkpoint

    names = parse_corruptions(args.corruptions)
    severities = parse_severities(args.severities if args.severities is not None else "1,2,3,4,5")
    resolve_checkpoint(checkpoint)                      # a missing checkpoint fails here, before the data
    out = Path(args.out) if args.out else default_report_dir(checkpoint)
    if args.out:          # a folder given must be new, empty, a run's or hold an earlier report
        check_output_dir(out, ("corruptions.json", "config.yaml"), "corruption report")
    elif not (out / "corruptions.json").is_file():    # the checkpoint's folder: never over files of yours
        theirs = [name for name in REPORT_FILES if (out / name).exists()]
        if theirs:
            raise ValueError(f"{out} holds {theirs[0]}, which no corruption report wrote: give --out DIR for "
                             "the report, so that no file of yours is overwritten")
    result = evaluate_checkpoint_corruptions(
        checkpoint, data=args.data, data_dir=args.data_dir, device=args.device, corruptions=names,
        severities=severities, seed=args.seed or 0, batch_size=args.batch_size, amp=args.amp)
    paths = write_corruption_report(result, out)
    print(f"{result['model']} (mixer={result['mixer'] or 'default'}) on {result['data']}  [{result['checkpoint']}]")
    print(corruption_table(result))
    print(corruption_summary(result))
    print(f"report: {paths['corruptions.md']} (+ .csv, .json, .png)")
    return 0
