"""``vitmix dense train | eval``: semantic segmentation and detection on any vitmix backbone."""
from __future__ import annotations

import json

from ..runs import flags
from .config import DenseConfig

_HELP = {
    "task": "segment (Semantic FPN; mIoU) | detect (torchvision Mask R-CNN, or Faster R-CNN with --no-masks; COCO AP)",
    "model": "backbone: laplacianformer_nano, soft_nano, soft_norm_nano, weightformer_nano, vit_* (any vitmix model)",
    "mixer": "token mixer of the backbone (see `vitmix mixers`; default: the model's own)",
    "data": "fashion-scenes (offline, generated) | maskfolder (segment) | coco (detect)",
    "data_dir": "maskfolder/coco: the dataset folder (docs/dense.md); fashion-scenes: where Fashion-MNIST is",
    "num_classes": "maskfolder: number of classes in the mask PNGs (255 = ignored)",
    "img_size": "input side: the scene canvas, or the size user images are resized to",
    "train_scenes": "fashion-scenes: scenes per training epoch",
    "val_scenes": "fashion-scenes: validation scenes",
    "scene_seed": "fashion-scenes: seed of the scenes (the validation scenes are the same for every run)",
    "masks": "detect: boxes only (Faster R-CNN), without the instance masks of Mask R-CNN",
    "batch_size": "global batch size (split over torchrun processes)",
    "lr": "AdamW peak learning rate (linear warm-up, then cosine)",
    "clip_grad": "gradient-norm clip (0 = off)",
    "amp": "mixed precision (autocast; --amp-dtype)",
    "preview": "validation images drawn in predictions/epoch-NNN.png (0 = none)",
    "max_steps": "stop after this many optimizer steps (smoke tests)",
    "out": "run directory (default: runs/<time>-dense-<task>-<model>-<mixer>-<data>)",
    "resume": "continue the run in --out from its last complete epoch",
    "device": "cpu | cuda | cuda:N (default: cuda if available)",
}
_INT = ("num_classes", "max_steps")
_FLOAT = ("clip_grad",)


def add_parser(sub) -> None:
    d = sub.add_parser("dense", help="semantic segmentation and detection on vitmix backbones: train | eval",
                       description="Train and evaluate dense prediction (Semantic-FPN segmentation, torchvision "
                                   "Mask/Faster R-CNN detection) on any vitmix backbone; see docs/dense.md. "
                                   "Scale out with `torchrun --nproc_per_node=N -m vitmix.cli dense train ...`.")
    jobs = d.add_subparsers(dest="dense_command", metavar="JOB")
    t = jobs.add_parser("train", help="train a segmenter or detector; a PNG of predictions per epoch")
    t.add_argument("--config", help="YAML file of config values; flags given on the command line override it")
    flags.add_field_flags(t, DenseConfig, _HELP, ints=_INT, floats=_FLOAT)
    t.set_defaults(func=run_train)

    e = jobs.add_parser("eval", help="mIoU / pixel accuracy or COCO AP of a dense run on its validation split")
    e.add_argument("checkpoint", metavar="RUN_DIR_OR_CHECKPOINT", help="a run directory (its best.safetensors) "
                                                                       "or a .safetensors file")
    add_eval_flags(e)
    e.set_defaults(func=run_eval)
    d.set_defaults(func=lambda args: _missing_job(d))


def add_eval_flags(p) -> None:
    p.add_argument("--data-dir", help="the dataset folder (default: the run's)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--val-scenes", type=int, help="fashion-scenes: validation scenes (default: the run's)")
    p.add_argument("--device")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--results-file", metavar="PATH", help="also write the result as JSON to PATH")


def _missing_job(parser) -> int:
    parser.print_help()
    return 2


def run_train(args) -> int:
    from .runner import train_dense

    train_dense(flags.config_from_args(args, DenseConfig))
    return 0


def run_eval(args) -> int:
    return report_eval(args.checkpoint, args.data_dir, args.batch_size, args.device, args.amp,
                       getattr(args, "val_scenes", None), args.results_file)


#: ``vitmix eval`` flags that only a classifier takes (its preprocessing, EMA, corruptions, CSV results)
CLASSIFIER_EVAL_FLAGS = ("corruptions", "severities", "seed", "out", "data", "use_ema", "img_size", "input_size",
                         "crop_pct", "crop_mode", "interpolation", "mean", "std", "results_format")


def eval_dense(args, checkpoint: str) -> int:
    """``vitmix eval`` of a dense checkpoint (``runs/tasks.py`` routes it here): the classifier-only
    flags are refused, the rest mean what they mean for ``vitmix dense eval``."""
    given = [flag for flag in CLASSIFIER_EVAL_FLAGS if getattr(args, flag, None) not in (None, False)]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} is for classifiers; {checkpoint} is a `vitmix dense` run "
                         "(see `vitmix dense eval --help`)")
    return report_eval(checkpoint, args.data_dir, args.batch_size, args.device, args.amp,
                       results_file=args.results_file)


def report_eval(checkpoint, data_dir, batch_size, device, amp, val_scenes=None, results_file=None) -> int:
    """Evaluate a dense checkpoint, print one line, optionally write JSON (``vitmix eval`` shares this)."""
    from pathlib import Path

    from .runner import describe, evaluate_dense

    if batch_size <= 0:
        raise ValueError(f"--batch-size {batch_size} must be a positive integer")
    if results_file is not None and Path(results_file).is_dir():
        raise ValueError(f"--results-file {results_file} is a directory; give a file name such as "
                         f"{Path(results_file) / 'results.json'}")
    if results_file is not None and not Path(results_file).parent.is_dir():
        raise FileNotFoundError(f"--results-file {results_file}: the folder {Path(results_file).parent} does not exist")
    result = evaluate_dense(checkpoint, data_dir, batch_size, device, amp, val_scenes)
    print(describe(result))
    if results_file is not None:
        Path(results_file).write_text(json.dumps(result, indent=2) + "\n")
    return 0
