"""``vitmix analyze``: the analyses the papers argue from, each a figure (PNG) and a small table.

Subcommands: ``approx`` (Nyström error vs landmarks), ``newton`` (Newton–Schulz residuals),
``distances`` (query–key distance distributions), ``injectivity`` (distinct queries → distinct
outputs), ``heads`` (Fibottention sparsity, overlap and head diversity), ``maps`` (attention maps of
one query for every mixer). All run on real images (Fashion-MNIST when installed, else
scikit-learn's digits) and write ``<name>.png``, ``<name>.md``, ``<name>.csv`` and ``<name>.json``
into ``--out``.
"""
from __future__ import annotations

import argparse
import shlex
import sys

ANALYSES = ("approx", "newton", "distances", "injectivity", "heads", "maps")


def _common(p: argparse.ArgumentParser, model: str, img_size: int, images: int, out: str) -> None:
    p.add_argument("--model", help=f"backbone (default: the checkpoint's, else {model})")
    p.add_argument("--img-size", type=int, help=f"input image side (default: the checkpoint's, else {img_size})")
    p.set_defaults(default_model=model, default_img_size=img_size)
    p.add_argument("--images", type=int, default=images, help=f"number of real images (default {images})")
    p.add_argument("--source", default="auto", help="auto, digits or fashion-mnist (default auto)")
    p.add_argument("--checkpoint", default=None, help="trained weights: a vitmix run directory or checkpoint (its "
                                                      "model, options, channels and size are used), or a .pt "
                                                      "state dict for --model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=out, help=f"output directory (default {out})")


def _int_list(text: str):
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _pair(text: str):
    try:
        r, c = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROW,COL, got {text!r}") from None
    return r, c


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``analyze`` sub-command and its six analyses."""
    p = subparsers.add_parser("analyze", help="analyses: approx, newton, distances, injectivity, heads, maps",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="analysis", metavar="ANALYSIS")
    sub.required = True

    a = sub.add_parser("approx", help="Nyström error vs number of landmarks, Gaussian vs Laplacian")
    _common(a, "vit_nano_patch4_32", 64, 4, "analysis/approx")
    a.add_argument("--sides", type=_int_list, default=None,
                   help="landmark grid sides s (m = s*s), e.g. 2,4,8 (default: 1..grid side)")
    a.add_argument("--lam", type=float, default=4.0, help="Laplacian width λ (default 4)")
    a.add_argument("--iters", type=int, default=20, help="Newton–Schulz iterations (default 20)")
    a.add_argument("--eps", type=float, default=0.01, help="Newton–Schulz ε (default 0.01)")

    n = sub.add_parser("newton", help="Newton–Schulz residual vs iterations, with and without ε")
    _common(n, "vit_nano_patch4_32", 64, 4, "analysis/newton")
    n.add_argument("--landmarks", type=int, default=49, help="landmarks m, a perfect square (default 49)")
    n.add_argument("--iters", type=int, default=30, help="largest iteration count (default 30)")
    n.add_argument("--eps", type=float, default=0.01, help="perturbation ε (default 0.01)")
    n.add_argument("--lam", type=float, default=4.0, help="Laplacian width λ (default 4)")

    d = sub.add_parser("distances", help="query–key L2² and L1 distance histograms per layer")
    _common(d, "vit_tiny_patch4_32", 32, 16, "analysis/distances")
    d.add_argument("--mixer", default=None, help="mixer to build --model with (default: the checkpoint's, else "
                                                 "the model's own)")
    d.add_argument("--bins", type=int, default=80)

    i = sub.add_parser("injectivity", help="distinct queries → distinct outputs, with/without the injective map")
    _common(i, "vit_nano_patch4_32", 32, 4, "analysis/injectivity")
    i.add_argument("--pool", type=int, default=2, help="landmark pooling ratio (default 2)")
    i.add_argument("--lam", type=float, default=4.0, help="Laplacian width λ (default 4)")
    i.add_argument("--tol", type=float, default=1e-4, help="relative tolerance of 'same output' (default 1e-4)")

    h = sub.add_parser("heads", help="Fibottention interaction fraction, head overlap, head diversity vs softmax")
    _common(h, "vit_nano_patch4_32", 64, 8, "analysis/heads")
    h.add_argument("--measure", default="cka", help="head similarity: cka or cosine (default cka)")

    m = sub.add_parser("maps", help="attention maps of one query for every mixer on a real image")
    _common(m, "vit_nano_patch4_32", 64, 1, "analysis/maps")
    m.add_argument("--mixers", default=None, help="comma-separated mixers (default: all with attention_map)")
    m.add_argument("--query", type=_pair, default=None, help="query patch ROW,COL (default: the centre)")
    m.add_argument("--image-index", type=int, default=0, help="which of the sampled images (default 0)")

    p.set_defaults(func=run)
    return p


def _command() -> str:
    argv = sys.argv[1:]
    if argv and argv[0] == "analyze":
        return "vitmix " + " ".join(shlex.quote(a) for a in argv)
    return ""


def _model_and_size(args):
    """``--model`` and ``--img-size`` as given, else what a vitmix checkpoint records (a flag that
    disagrees with it is an error: its weights fit only its own model), else the analysis's defaults."""
    from ._common import checkpoint_meta

    meta = checkpoint_meta(args.checkpoint) if args.checkpoint else {}
    recorded = {"model": meta.get("model"), "img_size": int(meta["img_size"]) if "img_size" in meta else None}
    for name, flag in (("model", "--model"), ("img_size", "--img-size")):
        given = getattr(args, name)
        if given is not None and recorded[name] is not None and given != recorded[name]:
            raise ValueError(f"{flag} {given} differs from the {recorded[name]} that {args.checkpoint} was trained "
                             f"with; drop {flag}")
    return (args.model or recorded["model"] or args.default_model,
            args.img_size or recorded["img_size"] or args.default_img_size)


def run(args) -> int:
    """Entry point of ``vitmix analyze``."""
    from .._util import close_matches
    from ..runs import check_output_dir
    from ._common import SOURCES

    if args.source not in SOURCES:
        raise ValueError(f"unknown --source {args.source!r}." + close_matches(args.source, SOURCES)
                         + f" Choose from {', '.join(SOURCES)}")
    model, img_size = _model_and_size(args)
    if args.images < 1 or img_size < 1:
        raise ValueError("--images and --img-size must be positive")
    # several analyses may share one --out; a folder of other files is refused
    check_output_dir(args.out, tuple(f"{a}.json" for a in ANALYSES), "vitmix analysis")
    common = dict(out=args.out, model=model, img_size=img_size, source=args.source, seed=args.seed,
                  checkpoint=args.checkpoint, command=_command() or None)
    name = args.analysis
    if name == "approx":
        from .approx import run as go

        files = go(images=args.images, sides=args.sides, lam=args.lam, iters=args.iters, eps=args.eps, **common)
    elif name == "newton":
        from .newton import run as go

        files = go(images=args.images, landmarks=args.landmarks, iters=args.iters, eps=args.eps, lam=args.lam,
                   **common)
    elif name == "distances":
        from .distances import run as go

        files = go(images=args.images, mixer=args.mixer, bins=args.bins, **common)
    elif name == "injectivity":
        from .injectivity import run as go

        files = go(images=args.images, pool=args.pool, lam=args.lam, tol=args.tol, **common)
    elif name == "heads":
        from .heads import run as go

        if args.measure not in ("cka", "cosine"):
            raise ValueError(f"--measure must be cka or cosine, got {args.measure!r}")
        files = go(images=args.images, measure=args.measure, **common)
    else:
        from .maps import run as go

        mixers = [s.strip() for s in args.mixers.split(",") if s.strip()] if args.mixers else None
        files = go(mixers=mixers, query=args.query, image_index=args.image_index, **common)
    table = next((f for f in files if f.endswith(".md")), None)
    if table:
        with open(table) as fh:
            print(fh.read())
    print("wrote", ", ".join(files))
    return 0


__all__ = ["add_parser", "run", "ANALYSES"]
