"""``vitmix robot demos | train | eval | compare``: robot imitation with a vitmix ViT image encoder
(see docs/robot.md). Heavy imports happen inside the commands (``vitmix --help`` stays fast)."""
from __future__ import annotations

import argparse

_TASKS = "lift | can | pusht"


def _csv(text: str):
    return [part.strip() for part in text.split(",") if part.strip()]


def _ints(text: str):
    try:
        return [int(part) for part in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_parser(sub) -> None:
    r = sub.add_parser("robot", help="robot imitation: scripted demos, ViT-encoder diffusion policy, rollouts",
                       description="Robot imitation learning (robosuite Lift/Can, a 2-D PushT) with a vitmix ViT as "
                                   "the image encoder of a diffusion policy; needs pip install 'vitmix[robot]' "
                                   "(docs/robot.md).")
    jobs = r.add_subparsers(dest="robot_command", metavar="JOB")

    d = jobs.add_parser("demos", help="record scripted-expert demonstrations (HDF5, robomimic layout; resumable)")
    d.add_argument("--task", required=True, help=_TASKS)
    d.add_argument("--episodes", type=int, default=200, help="expert episodes to run (successes are kept)")
    d.add_argument("--noise", type=float, default=0.0, help="σ of Gaussian noise on the expert's position actions")
    d.add_argument("--seed", type=int, default=0, help="episode i is seeded seed·100000 + i")
    d.add_argument("--out", required=True, help="directory for demos.hdf5 (rerun the same command to continue)")
    d.set_defaults(func=run_demos)

    t = jobs.add_parser("train", help="train a diffusion policy on demonstrations (a resumable run directory)")
    t.add_argument("--task", required=True, help=_TASKS)
    t.add_argument("--demos", required=True, help="a `vitmix robot demos` directory or its demos.hdf5")
    t.add_argument("--mixer", default="softmax", help="the image encoder's token mixer (see `vitmix mixers`)")
    t.add_argument("--fibottention", default="official",
                   help="Fibottention's form: official (robot code: logits times the mask) | masked (the paper's)")
    t.add_argument("--encoder", default="small", help="small (width 192, depth 4, 12 heads) | vit_b (ViT-B/8)")
    t.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    t.add_argument("--ema-decay", type=float, default=0.995, help="EMA decay of the evaluated weights")
    t.add_argument("--save-every", type=int, default=100, help="checkpoint (and curve point) every N steps")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", help="run directory (default: runs/<time>-robot-<task>-<mixer>)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda if available)")
    t.set_defaults(func=run_train)

    e = jobs.add_parser("eval", help="success rate of a trained policy over rollouts (CSV, summary, PNG strip)")
    e.add_argument("run", metavar="RUN", help="a `vitmix robot train` run directory (its EMA weights)")
    e.add_argument("--rollouts", type=int, default=50)
    e.add_argument("--seed", type=int, default=100_000, help="rollout i starts from the placement of seed + i")
    e.add_argument("--task", help="check that the policy was trained on this task")
    e.add_argument("--sample-steps", type=int, default=10, help="DDIM steps per action chunk")
    e.add_argument("--max-steps", type=int, help="steps per rollout (default: the task's 400)")
    e.add_argument("--device")
    e.set_defaults(func=run_eval)

    c = jobs.add_parser("compare", help="demos + train + eval for tasks × mixers × seeds, and the results table")
    c.add_argument("--out", required=True, help="directory of the grid (rerun the same command to continue)")
    c.add_argument("--tasks", type=_csv, default=["lift", "can", "pusht"])
    c.add_argument("--mixers", type=_csv, default=["softmax", "fibottention", "bigbird"])
    c.add_argument("--seeds", type=_ints, default=[0, 1])
    c.add_argument("--episodes", type=int, default=200, help="expert episodes per task")
    c.add_argument("--steps", type=int, default=1500)
    c.add_argument("--batch-size", type=int, default=64)
    c.add_argument("--rollouts", type=int, default=50)
    c.add_argument("--sample-steps", type=int, default=10)
    c.add_argument("--max-steps", type=int)
    c.set_defaults(func=run_compare)
    r.set_defaults(func=lambda args: r.print_help() or 2)


def run_demos(args) -> int:
    from .demos import make_demos

    make_demos(args.task, args.episodes, args.out, noise=args.noise, seed=args.seed)
    return 0


def run_train(args) -> int:
    from .runner import RobotTrainConfig, train_policy

    cfg = RobotTrainConfig(task=args.task, demos=args.demos, mixer=args.mixer, fibottention=args.fibottention,
                           encoder=args.encoder, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           ema_decay=args.ema_decay, save_every=args.save_every, seed=args.seed, out=args.out,
                           resume=args.resume, device=args.device)
    train_policy(cfg)
    return 0


def run_eval(args) -> int:
    from .runner import evaluate_policy

    evaluate_policy(args.run, args.rollouts, args.seed, task=args.task, sample_steps=args.sample_steps,
                    max_steps=args.max_steps, device=args.device)
    return 0


def run_compare(args) -> int:
    from .compare import run_comparison

    run_comparison(args.out, args.tasks, args.mixers, args.seeds, episodes=args.episodes, steps=args.steps,
                   rollouts=args.rollouts, batch_size=args.batch_size, sample_steps=args.sample_steps,
                   max_steps=args.max_steps)
    return 0
