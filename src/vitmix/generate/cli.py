"""``vitmix generate train | sample | fd``: class-conditional diffusion with DiT / WeightFormer-DiT."""
from __future__ import annotations

import argparse
import json

from ..runs import flags
from .config import GenerateConfig

_HELP = {
    "model": "diffusion backbone: dit_nano_patch2, dit_tiny_patch2, weightformer_dit_nano_patch2, ...",
    "mixer": "token mixer of the dit_* attention (see `vitmix mixers`; default softmax)",
    "data": "digits | fashion-mnist | cifar10 | cifar100 | imagefolder",
    "data_dir": "dataset directory (default: the dataset's standard location)",
    "download": "allow torchvision to download fashion-mnist/cifar",
    "img_size": "image size (default: the dataset's native size; a multiple of the patch)",
    "lr": "AdamW learning rate (constant)",
    "clip_grad": "gradient-norm clip (default: none, as DiT)",
    "ema_decay": "EMA decay of the weights used for samples and FD (0 = no EMA)",
    "timesteps": "diffusion steps T",
    "schedule": "noise schedule: cosine | linear",
    "prediction": "training target: eps (noise) | v (velocity)",
    "sample_steps": "DDIM steps for the epoch grids and the FD",
    "guidance": "classifier-free guidance scale (1 = none)",
    "eta": "DDIM eta: 0 deterministic, 1 ancestral (DDPM-like)",
    "grid_per_class": "samples per class (one row per class) in samples/epoch-NNN.png",
    "fd_samples": "generated images for the final FD (classifier features); 0 skips it (default: the images "
                  "trained on / --sample-steps, 2 to 1000)",
    "fd_classifier_subset": "train the FD feature classifier on a fixed subset of this many training images "
                            "(default: as many as the run trained on, at least 1000; cached per subset)",
    "train_subset": "train on a fixed random subset of this many images (seeded by --seed)",
    "max_steps": "stop after this many optimizer steps (smoke tests)",
    "out": "run directory (default: runs/<time>-generate-<model>-<mixer>-<data>)",
    "resume": "continue the run in --out from its last complete epoch",
    "device": "cpu | cuda | cuda:N (default: cuda if available)",
}
_INT = ("img_size", "epochs", "batch_size", "timesteps", "sample_steps", "grid_per_class", "fd_samples",
        "fd_classifier_subset", "train_subset", "max_steps", "seed")
_FLOAT = ("lr", "weight_decay", "clip_grad", "ema_decay", "guidance", "eta")


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="class-conditional diffusion (DiT, WeightFormer-DiT): train | sample | fd",
                       description="Train and sample class-conditional diffusion models (DDPM/DDIM with "
                                   "classifier-free guidance); see docs/generation.md.")
    jobs = g.add_subparsers(dest="generate_command", metavar="JOB")
    t = jobs.add_parser("train", help="train a diffusion backbone; PNG sample grids per epoch, FD at the end")
    _add_config_flags(t)
    t.set_defaults(func=run_train)

    s = jobs.add_parser("sample", help="a PNG grid of class-conditional samples from a run")
    s.add_argument("--checkpoint", required=True, metavar="RUN_OR_FILE",
                   help="a run directory (its ema.safetensors, else last.safetensors) or a .safetensors file")
    s.add_argument("--classes", default="all", help="class indices, e.g. 0,1,2 (default: all), one row each")
    s.add_argument("--n", type=int, default=8, help="samples per class")
    s.add_argument("--out", default="samples.png", help="PNG file to write")
    _add_sampler_flags(s)
    s.set_defaults(func=run_sample)

    f = jobs.add_parser("fd", help="FD (classifier features) of a run against its dataset's validation images")
    f.add_argument("--checkpoint", required=True, metavar="RUN_OR_FILE")
    f.add_argument("--samples", type=int, default=1000, help="generated (and real) images compared")
    f.add_argument("--classifier", help="FD feature classifier to use (default: RUN/fd_classifier.safetensors, "
                                        "trained there when missing)")
    f.add_argument("--classifier-subset", type=int, metavar="N",
                   help="the FD classifier trained on a fixed subset of N training images (cached), instead of "
                        "the run's; with --classifier, how to train that file when it is missing (default: all)")
    f.add_argument("--data-dir")
    _add_sampler_flags(f, eta=False)
    f.set_defaults(func=run_fd)
    g.set_defaults(func=lambda args: _missing_job(g))


def _missing_job(parser) -> int:
    parser.print_help()
    return 2


def _add_sampler_flags(p, eta: bool = True) -> None:
    p.add_argument("--steps", type=int, help="DDIM steps (default: the run's --sample-steps)")
    p.add_argument("--guidance", type=float, help="classifier-free guidance scale (default: the run's)")
    if eta:
        p.add_argument("--eta", type=float, help="DDIM eta (default: the run's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial noise")
    p.add_argument("--device")


def _add_config_flags(p) -> None:
    p.add_argument("--config", help="YAML file of config values; flags given on the command line override it")
    flags.add_field_flags(p, GenerateConfig, _HELP, ints=_INT, floats=_FLOAT)


def config_from_args(args: argparse.Namespace) -> GenerateConfig:
    """``--config`` (or, with ``--resume``, the run's own config.yaml) overlaid by the flags given."""
    return flags.config_from_args(args, GenerateConfig)


def run_train(args) -> int:
    from .runner import train_generator

    train_generator(config_from_args(args))
    return 0


def run_sample(args) -> int:
    from .runner import sample_grid

    path = sample_grid(args.checkpoint, args.out, args.classes, args.n, args.steps, args.guidance, args.eta,
                       args.seed, args.device)
    print(f"wrote {path}")
    return 0


def run_fd(args) -> int:
    from .fd import FD_LABEL
    from .runner import measure_checkpoint_fd

    r = measure_checkpoint_fd(args.checkpoint, args.samples, args.steps, args.guidance, args.classifier,
                              args.data_dir, args.seed, args.device, args.classifier_subset)
    trained_on = f" (trained on {r['fd_classifier_images']} images)" if r.get("fd_classifier_images") else ""
    print(f"{FD_LABEL}: {r['fd']:.3f} over {r['fd_samples']} samples (real-vs-real floor {r['fd_real_floor']:.3f}); "
          f"class agreement {r['class_agreement']:.1f}%; classifier val acc {r['fd_classifier_val_acc']:.2f}%"
          f"{trained_on}  [{r['checkpoint']}]")
    print(json.dumps(r))
    return 0
