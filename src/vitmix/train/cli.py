"""``vitmix train`` and ``vitmix eval``."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .config import TrainConfig, load_yaml, parse_key_values

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
    "train_subset": "train on a fixed random subset of this many images (seeded by --seed; validation stays whole)",
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
    e.add_argument("--corruptions", metavar="all|NAME,NAME",
                   help="also evaluate under these corruptions (names and parameters: docs/robustness.md)")
    e.add_argument("--severities", metavar="1,2,3", help="corruption severities, 1..5 (default: 1,2,3,4,5)")
    e.add_argument("--seed", type=int, help="seed of the corruptions' random noise (default: 0)")
    e.add_argument("--out", metavar="DIR", help="corruption report directory (default: the run directory, "
                                                "or the checkpoint's folder)")
    e.set_defaults(func=run_eval)


def add_config_flags(p: argparse.ArgumentParser, exclude=()) -> None:
    """``--config`` plus one flag per :class:`TrainConfig` field (not those in ``exclude``), and the
    repeatable ``-M``/``--model-option`` KEY=VALUE options; read back with :func:`config_from_args`."""
    p.add_argument("--config", help="YAML file of config values; flags given on the command line override it")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("mixer_options", "model_options") or f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            if default:   # on by default: the flag turns it off
                p.add_argument("--no-" + flag[2:], dest=f.name, action="store_false", default=None,
                               help=_HELP.get(f.name))
            else:
                p.add_argument(flag, action="store_true", default=None, help=_HELP.get(f.name))
            continue
        kind = {int: int, float: float}.get(type(default), str)
        if f.name in ("img_size", "num_frames", "max_steps", "workers", "seed", "epochs", "batch_size", "train_subset",
                      "lr_base_batch", "accum_steps", "keep_top_k"):
            kind = int
        if f.name in ("clip_grad", "ema_decay"):
            kind = float
        p.add_argument(flag, type=kind, default=None, metavar=f.name.upper(),
                       help=f"{_HELP.get(f.name, f.name.replace('_', ' '))} (default: {default})")
    p.add_argument("--mixer-option", "-M", action="append", metavar="KEY=VALUE",
                   help="mixer option, repeatable (e.g. -M num_landmarks=16)")
    p.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                   help="model constructor option, repeatable (e.g. --model-option depth=4)")


def config_from_args(args: argparse.Namespace, config_cls=TrainConfig):
    """The run's config: ``--config`` overlaid by the flags given. With ``--resume`` the base is the
    run's own ``config.yaml``, so ``vitmix train --out RUN --resume`` needs no other flag (and a flag
    that would change the run is refused by the runner). ``config_cls``: any :class:`YamlConfig`
    dataclass whose fields are the flags (``vitmix generate train`` passes its own); an optional
    field given as 0 (``--clip-grad 0``, ``--ema-decay 0``) means off."""
    resume, out = getattr(args, "resume", None), getattr(args, "out", None)
    saved = Path(out or "", "config.yaml")
    values = load_yaml(saved) if resume and out and saved.is_file() else {}
    values.update(load_yaml(args.config) if args.config else {})
    for name in config_cls.field_names():
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.mixer_option:
        values["mixer_options"] = {**values.get("mixer_options", {}), **parse_key_values(args.mixer_option)}
    if args.model_option:
        values["model_options"] = {**values.get("model_options", {}), **parse_key_values(args.model_option)}
    for name in ("clip_grad", "ema_decay"):
        if values.get(name) == 0:
            values[name] = None
    return config_cls.from_dict(values)


def run_train(args) -> int:
    from .runner import train

    train(config_from_args(args))
    return 0


def run_eval(args) -> int:
    from .runner import evaluate_checkpoint

    checkpoint = _eval_checkpoint(args)
    if args.corruptions is not None:
        return _run_corruptions(args, checkpoint)
    given = [flag for flag in ("severities", "seed", "out") if getattr(args, flag) is not None]
    if given:
        raise ValueError(f"--{given[0]} sets up the corruption report: add --corruptions all (or names)")
    r = evaluate_checkpoint(checkpoint, args.data, args.data_dir, args.batch_size, args.device, args.amp)
    print(f"{r['model']} (mixer={r['mixer'] or 'default'}) on {r['data']}: val acc {r['val_acc']:.2f}% "
          f"({r['val_images']} images), val loss {r['val_loss']:.4f}  [{r['checkpoint']}]")
    return 0


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
        corruption_summary, corruption_table, default_report_dir, evaluate_checkpoint_corruptions,
        write_corruption_report,
    )
    from .runner import resolve_checkpoint

    names = parse_corruptions(args.corruptions)
    severities = parse_severities(args.severities if args.severities is not None else "1,2,3,4,5")
    resolve_checkpoint(checkpoint)                      # a missing checkpoint fails here, before the data
    out = Path(args.out) if args.out else default_report_dir(checkpoint)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory for the corruption report")
    result = evaluate_checkpoint_corruptions(
        checkpoint, data=args.data, data_dir=args.data_dir, device=args.device, corruptions=names,
        severities=severities, seed=args.seed or 0, batch_size=args.batch_size, amp=args.amp)
    paths = write_corruption_report(result, out)
    print(f"{result['model']} (mixer={result['mixer'] or 'default'}) on {result['data']}  [{result['checkpoint']}]")
    print(corruption_table(result))
    print(corruption_summary(result))
    print(f"report: {paths['corruptions.md']} (+ .csv, .json, .png)")
    return 0
