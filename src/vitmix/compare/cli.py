"""``vitmix compare``: several mixers (and whole models), one recipe, one leaderboard."""
from __future__ import annotations

import argparse

from ..train.cli import add_config_flags, config_from_args

EPILOG = """examples:
  vitmix compare --model vit_nano_patch4_32 --mixers softmax,soft,laplacian,fibottention,performer \\
      --data fashion-mnist --epochs 5
  vitmix compare --config configs/compare-fashion-mnist.yaml --corruptions all   # + robustness column
  vitmix compare --config configs/compare-fashion-mnist.yaml --mixers softmax,soft --seeds 0,1,2 \\
      --budget flops=4.1e12 --out runs/compare/equal-flops   # 3 seeds each, the same training FLOPs

Rerunning the same command continues where it stopped: finished entries are read back, interrupted
ones resume from their last checkpoint, failed ones are tried again."""


def _names(text: str):
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="train several mixers/models with one recipe and rank them",
                       description="Train the model once per mixer (and once per whole model in --models) on the "
                                   "same data, recipe and seed (or once per seed of --seeds), for the same epochs, "
                                   "time or FLOPs (--budget), then write leaderboard.md/.csv/.json, runs.csv, "
                                   "accuracy_vs_throughput.png, loss_curves.png and learning_curves.png into --out.",
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
    p.add_argument("--seeds", metavar="S,S,...",
                   help="train every entry once per seed (e.g. 0,1,2): mean ± std, n and a noise test in the "
                        "leaderboard; runs in OUT/<entry>/seed-<s>/ (default: one run at --seed)")
    p.add_argument("--budget", default="epochs", metavar="epochs|time=SECONDS|flops=N",
                   help="what every entry gets the same of: --epochs (default), seconds of training (time per "
                        "step measured once per entry, then a fixed number of steps) or training FLOPs "
                        "(3 × forward per image); the LR schedule is laid over the budget")
    p.add_argument("--remeasure", action="store_true",
                   help="measure the cost columns of finished entries again, e.g. on a quiet machine (no retraining)")
    # a comparison trains every entry from scratch: starting from a teacher is `vitmix train --init-from`
    add_config_flags(p, exclude=("out", "resume", "mixer", "init_from", "transfer_epochs", "transfer_lr", "distill",
                                 "distill_weight", "distill_temperature"))
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
    from .budget import parse_budget, parse_seeds
    from .runner import run_compare

    seeds, budget = parse_seeds(args.seeds), parse_budget(args.budget)
    if seeds is not None and args.seed is not None:
        raise ValueError("--seed and --seeds both choose the seed: give --seeds only (e.g. --seeds 0,1,2)")
    base = config_from_args(args)
    mixers, models = _names(args.mixers), _names(args.models)
    out = args.out or f"runs/compare/{base.model}-{base.data}"
    rows = run_compare(base, mixers, models, out, corruption_options(args), remeasure=args.remeasure, seeds=seeds,
                       budget=budget)
    from .leaderboard import markdown

    print("\n" + markdown(rows, f"{base.model} on {base.data}").split("\n", 2)[2])
    return 0 if any(r["status"] == "ok" for r in rows) else 1
