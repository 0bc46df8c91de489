"""``vitmix.create_model``: ``timm.create_model`` that also understands ``mixer=``."""
from __future__ import annotations

import fnmatch
import functools
import inspect
import re
import warnings
from typing import Optional

import timm
import torch
from torch import nn

from ..mixers import TokenMixer, number_layers
from ..mixers.base import close_matches
from ._builder import mixer_attn_layer
from .vit import bind_token_grid


def _entrypoint(name: str):
    base = name.split(".")[0]
    if not timm.is_model(base):
        raise ValueError(f"unknown model {name!r}." + close_matches(base, list_models(), n=5)
                         + " See `vitmix models` for the full list.")
    return timm.models.model_entrypoint(base)


def _timm_vit_names() -> list:
    """timm's isotropic ViT/DeiT families: ``VisionTransformer``s that take any mixer as ``attn_layer``."""
    return timm.list_models(["vit_*", "deit_*"], exclude_filters=["*_clip_*", "*siglip*", "*_sam_*"])


def list_models(pattern: str = "") -> list:
    """vitmix models plus timm's isotropic ViT/DeiT families (which accept any mixer).

    ``pattern`` filters the names: with ``*``, ``?`` or ``[...]`` it is a shell-style wildcard over the
    whole name, as in ``timm.list_models`` (``"laplacianformer_*"``); without, a substring (``"soft"``)."""
    ours = [m for m in timm.list_models() if is_vitmix_model(m)]
    names = sorted(set(ours) | set(_timm_vit_names()))
    if any(c in pattern for c in "*?["):
        return fnmatch.filter(names, pattern)
    return [n for n in names if pattern in n]


def is_vitmix_model(name: str) -> bool:
    """True for models that vitmix itself registers in timm."""
    try:
        fn = timm.models.model_entrypoint(name.split(".")[0])
    except (KeyError, RuntimeError):       # timm versions differ in which one an unknown name raises
        return False
    return fn.__module__.startswith("vitmix.")


def _takes_mixer(fn) -> bool:
    """vitmix model functions with their own mixer handling declare ``mixer`` explicitly or pass it on;
    timm's ViT entry points take it once :func:`let_timm_vits_take_mixers` has wrapped them."""
    return fn.__module__.startswith("vitmix.") or getattr(fn, "takes_vitmix_mixer", False)


def _with_mixer_kwargs(fn):
    """timm's ViT entry point ``fn``, also taking ``mixer=`` / ``mixer_options=``: they become its
    ``attn_layer`` and the model gets what :func:`create_model` gives it (token grid, layer numbers).
    Unlike a mixer class, the two are JSON, so the config timm saves (``save_for_hf``) rebuilds the
    model: ``timm.create_model("local-dir:DIR" | "hf-hub:REPO", pretrained=True)``."""

    @functools.wraps(fn)
    def entrypoint(pretrained: bool = False, *, mixer: Optional[str] = None, mixer_options: Optional[dict] = None,
                   **kwargs):
        if mixer is None and not mixer_options:
            return fn(pretrained=pretrained, **kwargs)
        if "attn_layer" not in inspect.signature(timm.models.VisionTransformer.__init__).parameters:
            raise ValueError("this timm version has no VisionTransformer(attn_layer=...); install timm>=1.0.24")
        if kwargs.get("attn_layer") is not None:
            raise ValueError(f"{fn.__name__}: give mixer= or attn_layer=, not both")
        if pretrained and mixer is not None and mixer != _source_mixer(kwargs)[0]:
            model = _pretrained_and_converted(fn, mixer, mixer_options, kwargs)
        else:
            kwargs["attn_layer"] = mixer_attn_layer(mixer, mixer_options)
            model = _load_pretrained(fn, pretrained, kwargs, f"mixer={mixer!r} with mixer_options={mixer_options}")
        _finish(model, fn.__name__, kwargs)
        return model

    entrypoint.takes_vitmix_mixer = True
    return entrypoint


def _source_mixer(kwargs: dict) -> tuple:
    """``(mixer, mixer_options)`` the pretrained weights were saved with: a vitmix config read by timm
    (``hf-hub:``/``local-dir:``) names them in its model args, which timm passes on as
    ``pretrained_model_args``; timm's own checkpoints have softmax attention (``None``)."""
    saved = kwargs.get("pretrained_model_args") or {}
    return saved.get("mixer"), saved.get("mixer_options") or None


def _load_pretrained(fn, pretrained: bool, kwargs: dict, built_as: str) -> nn.Module:
    """``fn(pretrained, **kwargs)``: timm's own build and (strict) weight loading; weights that do not fit
    the model are a one-line ``ValueError`` naming the first tensor that does not."""
    if not pretrained:
        return fn(pretrained=False, **kwargs)
    from ..conversion.swap import load_error

    try:
        return fn(pretrained=True, **kwargs)
    except RuntimeError as err:
        raise ValueError(f"{fn.__name__}(pretrained=True): the pretrained weights do not fit the model built "
                         f"as {built_as}: {load_error(err)}; build it as the checkpoint was saved "
                         f"(its mixer and options, num_classes, img_size), or pick the model the file is of") from None


def _pretrained_and_converted(fn, mixer: str, mixer_options: Optional[dict], kwargs: dict) -> nn.Module:
    """``pretrained=True`` with a mixer the weights were not trained with: the model the checkpoint was
    saved as (timm's softmax ViT, or a vitmix config's mixer) loads them through timm's own path, and
    :func:`vitmix.convert` swaps its attention for ``mixer`` (q/k/v and output carried over)."""
    from ..conversion.swap import convert

    source, source_options = _source_mixer(kwargs)
    teacher_kwargs = dict(kwargs)
    if source is not None:
        teacher_kwargs["attn_layer"] = mixer_attn_layer(source, source_options)
    teacher = _load_pretrained(fn, True, teacher_kwargs, "saved" if source else "timm's softmax ViT")
    try:
        model = convert(teacher, mixer, inplace=True, **(mixer_options or {}))
    except ValueError as err:
        raise ValueError(f"{fn.__name__}(pretrained=True, mixer={mixer!r}): the pretrained "
                         f"{source or 'softmax'} weights do not convert: {err}") from None
    warnings.warn(f"{fn.__name__}: pretrained {source or 'softmax'} weights converted to mixer {mixer!r} "
                  f"(vitmix.convert); its attention is not trained yet: run an attention transfer stage and "
                  f"fine-tune before use (docs/convert.md)", UserWarning, stacklevel=3)
    return model


def let_timm_vits_take_mixers() -> None:
    """Wrap timm's ViT/DeiT entry points (in timm's registry, same names) with :func:`_with_mixer_kwargs`;
    without ``mixer=`` they are called unchanged. Called once when vitmix's models are registered."""
    registry = getattr(timm.models._registry, "_model_entrypoints", None)
    if not isinstance(registry, dict):      # another timm layout: mixers go in through attn_layer only
        return
    for name in _timm_vit_names():
        fn = registry.get(name)
        if fn is not None and not _takes_mixer(fn):
            registry[name] = _with_mixer_kwargs(fn)


def create_model(name: str, pretrained: bool = False, *, mixer: Optional[str] = None,
                 mixer_options: Optional[dict] = None, **kwargs) -> nn.Module:
    """Create model ``name`` with its attention replaced by ``mixer``.

    Works for vitmix's own models and for timm ``VisionTransformer`` families
    (``deit_tiny_patch16_224``, ``vit_base_patch16_224`` ...), where the mixer goes in through
    ``attn_layer``. Image sizes must be divisible by the patch size. The token grid is fixed on
    the mixers so non-square inputs work; pass ``dynamic_img_size=True`` to infer it per call.
    ``pretrained=True`` with a mixer the checkpoint was not saved with (timm's softmax ViT/DeiT
    weights) loads them through timm and converts them with :func:`vitmix.convert`, with one warning
    line: the converted attention needs a transfer stage and fine-tuning (``docs/convert.md``).
    """
    fn = _entrypoint(name)
    if _takes_mixer(fn):    # by name, so that timm records JSON model args (save_for_hf / local-dir: rebuild it)
        if mixer is not None:
            kwargs["mixer"] = mixer
        if mixer_options:
            kwargs["mixer_options"] = mixer_options
    elif mixer is not None or mixer_options:
        if "attn_layer" not in inspect.signature(timm.models.VisionTransformer.__init__).parameters:
            raise ValueError("this timm version has no VisionTransformer(attn_layer=...); install timm>=1.0.24")
        kwargs["attn_layer"] = mixer_attn_layer(mixer, mixer_options)
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError as err:  # an option the architecture does not take
        raise ValueError(f"cannot build {name!r}: {err}{_option_suggestion(err)}".replace("' Did", "'. Did")) from None
    _finish(model, name, kwargs)
    return model


def _option_suggestion(err: TypeError) -> str:
    """Close matches for a misspelt model option, from the signature of the class that refused it
    (Python names it, ``VisionTransformer.__init__() got an unexpected keyword argument 'dept'``;
    the class object is found among the locals of the frames that built it)."""
    found = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(err))
    if not found:
        return ""
    cls_name, option = found.groups()
    tb = err.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, type) and value.__name__ == cls_name:
                return close_matches(option, inspect.signature(value.__init__).parameters)
        tb = tb.tb_next
    return ""


def _finish(model: nn.Module, name: str, kwargs: dict) -> None:
    """What every vitmix-built model gets after timm builds it (each step is idempotent)."""
    _check_patch_grid(model, name)
    number_layers(model)
    _materialize_lazy(model, kwargs)


def _materialize_lazy(model: nn.Module, kwargs: dict) -> None:
    """Settle parameters that wait for the token grid (``TokenMixer.awaits_grid``: Linformer's E/F
    inside a pyramid, whose stages pass their grid only in a forward) — and any torch lazy ones —
    with one forward at the model's input size, so the model is counted, saved and handed to an
    optimizer with its final shapes."""
    waiting = any(getattr(m, "awaits_grid", False) for m in model.modules() if isinstance(m, TokenMixer))
    if not waiting and not any(isinstance(p, nn.parameter.UninitializedParameter) for p in model.parameters()):
        return
    size = kwargs.get("img_size") or model.pretrained_cfg.get("input_size", (3, 224, 224))[-2:]
    size = (size, size) if isinstance(size, int) else tuple(size)
    was_training = model.training
    with torch.no_grad():
        if hasattr(model, "example_inputs"):          # models that take more than images (e.g. video clips)
            model.eval()(*model.example_inputs(1))
        else:
            model.eval()(torch.zeros(1, kwargs.get("in_chans", 3), *size))
    model.train(was_training)


def _check_patch_grid(model: nn.Module, name: str) -> None:
    vit = getattr(model, "model", model)                                   # features_only: FeatureGetterNet
    embed = getattr(vit, "patch_embed", None)
    img, patch = getattr(embed, "img_size", None), getattr(embed, "patch_size", None)
    if img is None or patch is None:
        return
    if any(i % p for i, p in zip(img, patch)):
        raise ValueError(
            f"image size {tuple(img)} of {name!r} is not divisible by its patch size {tuple(patch)}; "
            f"use a multiple of {tuple(patch)}"
        )
    if not getattr(vit, "binds_own_token_grid", False):   # video models: a grid in space, another in time
        bind_token_grid(model)  # the real (non-square) grid: fixed, or per call with dynamic_img_size


let_timm_vits_take_mixers()   # on import: timm.create_model("deit_*", mixer=...), and configs saved from such models
