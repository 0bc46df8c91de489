"""``vitmix models`` and ``vitmix mixers``: what is registered."""
from __future__ import annotations

import re


def plain(text: str) -> str:
    """A docstring line as terminal text: ``code``, :class:`X` and :func:`y` lose their markup."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1).split(".")[-1], text)
    return text.replace("``", "")


def add_parser(sub) -> None:
    m = sub.add_parser("models", help="list models that accept vitmix mixers")
    m.add_argument("pattern", nargs="?", default="",
                   help="filter: a substring, or timm-style wildcards ('laplacianformer_*')")
    m.add_argument("--all", action="store_true", help="also list timm's ViT/DeiT families")
    m.add_argument("--table", action="store_true",
                   help="markdown table of vitmix's models: input size, mixer, parameters, GMACs of one image")
    m.set_defaults(func=run_models)
    x = sub.add_parser("mixers", help="list registered token mixers and their options")
    x.set_defaults(func=run_mixers)


def run_models(args) -> int:
    from .models import is_vitmix_model, list_models

    names = list_models(args.pattern)
    if not args.all or args.table:
        names = [n for n in names if is_vitmix_model(n)]
    if args.table:
        print(model_table(names))
        return 0
    for name in names:
        print(name)
    if not args.all:
        print("\n(timm's vit_*/deit_* models also accept --mixer; list them with `vitmix models --all`)")
    return 0


def run_mixers(args) -> int:
    from .mixers import get_mixer_class, list_mixers
    from .mixers.base import TokenMixer

    shared = set(TokenMixer.option_names())
    for name in list_mixers():
        cls = get_mixer_class(name)
        doc = plain((cls.__doc__ or "").strip().splitlines()[0]) if cls.__doc__ else ""
        own = [o for o in cls.option_names() if o not in shared and o not in ("dim", "num_heads")]
        print(f"{name:<14} {doc} [cost: {cls.complexity} in tokens]")
        if own:
            print(f"{'':<14} options: {', '.join(own)}")
        print(f"{'':<14} 1-D: {sequence_line(cls)}")
    return 0


#: how each ``padding_mask`` setting reads in ``vitmix mixers``
_MASKING = {"masked": "key-padding mask within the batch", "by_length": "key-padding mask (one run per valid length)",
            None: "no key-padding mask"}


def sequence_line(cls) -> str:
    """What a mixer class does on a 1-D sequence (``sequence=True``) and how it takes a key-padding mask."""
    what = cls.sequence_support(refuse=False)
    if what is None:
        return "no (needs an image token grid)"
    return f"{plain(what)}; {_MASKING.get(cls.padding_mask, cls.padding_mask)}"


def model_table(names) -> str:
    """One markdown row per model: default input (frames × H × W for video models), the mixer in its blocks,
    parameters and the multiply-accumulates of one forward pass at that input (FlopCounterMode, FLOPs / 2)."""
    import timm
    import torch

    from ._util import markdown_table
    from .bench.flops import count_flops
    from .mixers.base import TokenMixer

    rows = []
    for name in names:
        model = timm.create_model(name).eval()
        size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        kinds = sorted({getattr(m, "mixer_name", None) or type(m).__name__ for m in model.modules()
                        if isinstance(m, TokenMixer)}) or ["none (dynamic MLP/conv)"]
        # diffusion backbones (model_task "generation") call as model(x, t, y): one denoising step
        inputs = model.example_inputs() if hasattr(model, "example_inputs") else (torch.zeros(1, *size),)
        with torch.no_grad():
            flops = count_flops(lambda m=model, i=inputs: m(*i)).total
        params = sum(p.numel() for p in model.parameters())
        frames = getattr(model, "num_frames", None)   # video models take clips: say how many frames
        shape = f"{frames}×{size[1]}×{size[2]}" if frames else f"{size[1]}×{size[2]}"
        rows.append([f"`{name}`", shape, ", ".join(kinds), f"{params / 1e6:.2f}M",
                     f"{flops / 2e9:.2f}"])
    return markdown_table(["model", "input", "mixer", "params", "GMACs"], rows, align="lllrr")
