"""``vitmix compare``: several mixers (and whole models), one recipe, one leaderboard."""
from __future__ import annotations

import argparse

from ..train.cli import add_config_flags, config_from_args

EPILOG = """examples:
  vitmix compare --model vit_nano_patch4_32 --mixers softmax,soft,laplacian,fibottention,performer \\
      --data fashion-mnist --epochs 5
  vitmix compare --config configs/compare-fashion-mnist.yaml --corruptions all   # + robustness column

Rerunning the same command continues where it stopped: finished entries are read back, interrupted
ones resume from their last checkpoint, failed ones are tried again."""


def _names(text: str):
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="train several mixers/models with one recipe and rank them",
                       description="Train the model once per mixer (and once per whole model in --models) on the "
                                   "same data, recipe and seed, then write leaderboard.md/.csv/.json, "
                                   "accuracy_vs_throughput.png and loss_curves.png into --out.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixers", default="", help="comma-separated mixers to put in --model (see `vitmix mixers`)")
    p.add_argument("--models", default="",
                   help="comma-separated whole models trained with the same recipe (e.g. weightformer_nano_patch4_32)")
    p.add_argument("--out", help="comparison directory (default: runs/compare/<model>-<data>)")
    p.add_argument("--corruptions", metavar="all|NAME,...",
                   help="also measure accuracy under these image corruptions (see `vitmix eval --corruptions`)")
    p.add_argument("--severities", default="1,2,3,4,5", help="corruption severities (default 1,2,3,4,5)")
    p.add_argument("--corruption-images", type=int, metavar="N",
                   help="measure corruptions on a fixed seeded subset of N validation images (default: all)")
    p.add_argument("--remeasure", action="store_true",
                   help="measure the cost columns of finished entries again, e.g. on a quiet machine (no retraining)")
    add_config_flags(p, exclude=("out", "resume", "mixer"))
    p.set_defaults(func=run)


def corruption_options(args) -> dict | None:
    """``evaluate_corruptions`` keyword arguments from the flags (``None`` without --corruptions)."""
    if not args.corruptions:
        return None
    from ..data.corruptions import parse_corruptions, parse_severities

    if args.corruption_images is not None and args.corruption_images <= 0:
        raise ValueError(f"--corruption-images {args.corruption_images} must be a positive integer")
    return {"corruptions": parse_corruptions(args.corruptions), "severities": parse_severities(args.severities),
            "seed": args.seed if args.seed is not None else 0, "images": args.corruption_images}


def run(args) -> int:
    from .runner import run_compare

    base = config_from_args(args)
    mixers, models = _names(args.mixers), _names(args.models)
    out = args.out or f"runs/compare/{base.model}-{base.data}"
    rows = run_compare(base, mixers, models, out, corruption_options(args), remeasure=args.remeasure)
    from .leaderboard import markdown

    print("\n" + markdown(rows, f"{base.model} on {base.data}").split("\n", 2)[2])
    return 0 if any(r["status"] == "ok" for r in rows) else 1
