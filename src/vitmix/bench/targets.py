"""What a sweep measures: mixer specs and model names parsed and checked, and the settings validated
up front (``ValueError`` with close matches), so a sweep never fails half way through on a typo."""
from __future__ import annotations

from typing import List

import torch

from .._util import close_matches
from ..runs.device import parse_device
from .config import PASSES, BenchConfig, Target

#: ``--dtype`` → the autocast dtype (fp32: none)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_mixer_spec(spec: str) -> Target:
    """``"softmax:fused=false"`` → ``Target(label, "softmax", {"fused": False})``."""
    parts = [p.strip() for p in spec.strip().split(":") if p.strip()]
    if not parts:
        raise ValueError("empty mixer name in --mixers")
    options = {}
    for part in parts[1:]:
        if "=" not in part:
            raise ValueError(f"mixer option {part!r} in {spec!r} is not key=value (e.g. softmax:fused=false)")
        key, value = part.split("=", 1)
        options[key.strip()] = _parse_value(value.strip())
    return Target(label=":".join(parts), name=parts[0], options=options)


def parse_model_spec(spec: str) -> Target:
    """``"deit_tiny_patch16_224:mixer=laplacian:landmark_stride=2"`` → ``Target(label,
    "deit_tiny_patch16_224", {"mixer": "laplacian", "landmark_stride": 2})``: the model with ``mixer``
    in its blocks and the other keys as that mixer's options (the model's own mixer without ``mixer=``)."""
    target = parse_mixer_spec(spec)
    mixer = target.options.get("mixer")
    if mixer is None and target.options:
        raise ValueError(f"--models {spec!r}: mixer options need the mixer they are for "
                         f"({target.name}:mixer=NAME:key=value)")
    return target


def _check_mixer_options(mixer: str, options: dict) -> str:
    """The registered name of ``mixer``; an unknown mixer or option is a ``ValueError`` with close matches."""
    from ..mixers import get_mixer_class

    cls = get_mixer_class(mixer)  # ValueError with close matches
    valid = cls.option_names()
    for key in options:
        if key not in valid:
            raise ValueError(f"mixer {cls.mixer_name!r} has no option {key!r}."
                             + close_matches(key, valid) + f" Options: {', '.join(valid)}")
    return cls.mixer_name


def model_kwargs(target: Target) -> dict:
    """``create_model`` arguments of a ``--models`` target: its mixer and the mixer's options."""
    options = dict(target.options)
    mixer = options.pop("mixer", None)
    return dict(mixer=mixer, mixer_options=options or None) if mixer is not None else {}


def resolve_targets(config: BenchConfig) -> List[Target]:
    """Validate the names (``ValueError`` with close matches) and add the softmax baseline."""
    from ..mixers import list_mixers

    names = [n.strip() for n in config.names if n.strip()]
    if not names:
        raise ValueError(f"no {config.kind} given")
    targets: List[Target] = []
    if config.kind == "mixers":
        if "all" in names:  # "all" expands in place; other specs (e.g. softmax:fused=false) stay
            i = names.index("all")
            names = names[:i] + [m for m in list_mixers() if m not in names] + names[i + 1:]
        for spec in names:
            target = parse_mixer_spec(spec)
            target.name = _check_mixer_options(target.name, target.options)
            targets.append(target)
        if not any(t.name == "softmax" and not t.options for t in targets):
            targets.insert(0, Target("softmax", "softmax", {}, baseline=True))
        else:
            for t in targets:
                t.baseline = t.name == "softmax" and not t.options
    elif config.kind == "models":
        from ..models import list_models

        known = set(list_models())
        import timm

        specs = [parse_model_spec(spec) for spec in names]
        for name in [t.name for t in specs] + [config.baseline_model]:
            if name not in known and not timm.is_model(name):
                raise ValueError(f"unknown model {name!r}." + close_matches(name, sorted(known), n=5)
                                 + " See `vitmix models` for the list.")
        for target in specs:
            kwargs = model_kwargs(target)
            if kwargs:
                _check_mixer_options(kwargs["mixer"], kwargs["mixer_options"] or {})
            target.baseline = target.name == config.baseline_model and not target.options
            targets.append(target)
        if not any(t.baseline for t in targets):
            targets.insert(0, Target(config.baseline_model, config.baseline_model, {}, baseline=True))
    else:
        raise ValueError(f"kind must be 'mixers' or 'models', got {config.kind!r}")
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate names in {', '.join(labels)}")
    return targets


def validate(config: BenchConfig) -> None:
    """Check every setting up front so a sweep never fails half way through on a typo."""
    if config.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {config.dtype!r}." + close_matches(config.dtype, DTYPES)
                         + f" Choose from {', '.join(DTYPES)}")
    for p in config.passes:
        if p not in PASSES:
            raise ValueError(f"unknown pass {p!r}." + close_matches(p, PASSES) + f" Choose from {', '.join(PASSES)}")
    if not config.passes:
        raise ValueError("give at least one pass (fwd, fwd+bwd)")
    if config.sizes is not None and (not config.sizes or any(int(s) <= 0 for s in config.sizes)):
        raise ValueError(f"sizes must be positive integers, got {config.sizes}")
    for key in ("batch", "dim", "heads"):
        if int(getattr(config, key)) <= 0:
            raise ValueError(f"{key} must be positive, got {getattr(config, key)}")
    if config.kind == "mixers" and config.dim % config.heads:
        raise ValueError(f"dim={config.dim} is not divisible by heads={config.heads}; "
                         f"try dim={config.heads * max(1, round(config.dim / config.heads))}")
    if config.threads is not None and config.threads < 1:
        raise ValueError(f"threads must be >= 1, got {config.threads}")
    if config.max_seconds <= 0:
        raise ValueError(f"max_seconds must be positive, got {config.max_seconds}")
    if config.min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive, got {config.min_run_time}")
    parse_device(config.device)
    if config.compile:
        _check_compile_backend(config.compile_backend)


def _check_compile_backend(name: str) -> None:
    """``ValueError`` with close matches for a backend ``torch.compile`` does not know."""
    from torch._dynamo import list_backends

    backends = list_backends(exclude_tags=())
    if name not in backends:
        raise ValueError(f"unknown torch.compile backend {name!r}." + close_matches(name, backends)
                         + " Common ones: inductor, aot_eager, eager")


__all__ = ["DTYPES", "parse_mixer_spec", "resolve_targets", "validate"]
