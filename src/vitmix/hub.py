"""Share a vitmix model the timm way: ``save_pretrained`` / ``push_to_hub``.

Both go through timm's own ``save_for_hf`` / ``push_to_hf_hub``, so the folder (or Hub repository)
holds what timm expects — ``config.json`` (architecture, ``model_args``, preprocessing),
``model.safetensors`` — plus a generated model card (``README.md``) naming the mixer, its options,
the data and the accuracy. Anyone with timm and vitmix installed rebuilds the model with timm's
call::

    import timm, vitmix                      # importing vitmix registers its models and mixers in timm
    model = timm.create_model("local-dir:shared/my-model", pretrained=True)   # or "hf-hub:user/repo"

The mixer is stored in ``model_args`` by name (``mixer``, ``mixer_options``), never as a class:
vitmix's models take those arguments, and vitmix lets timm's ViT/DeiT entry points take them too,
so ``vitmix.create_model("deit_tiny_patch16_224", mixer="soft")`` round-trips like any vitmix model.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from torch import nn

#: what a run directory or checkpoint file is passed as
RunOrModel = Union[nn.Module, str, Path]


def save_pretrained(model_or_run: RunOrModel, save_directory: Union[str, Path], *,
                    model_card: Optional[dict] = None) -> Path:
    """Write ``model_or_run`` to ``save_directory`` for ``timm.create_model("local-dir:...")``.

    Args:
        model_or_run: a model built by ``vitmix.create_model`` / ``timm.create_model``, or a vitmix run
            directory / checkpoint file (its ``best.safetensors``; the card then names its data and
            validation accuracy).
        save_directory: created if missing; ``config.json``, ``model.safetensors`` and ``README.md``
            in it are replaced.
        model_card: entries merged into the generated card (timm's ``generate_readme`` fields:
            ``description``, ``details``, ``usage``, ``citation``, ``tags``, ``license``).

    Returns the directory.
    """
    from timm.models import save_for_hf
    from timm.models._hub import generate_readme

    model, facts = _model_and_facts(model_or_run)
    out = Path(save_directory)
    with _json_model_args(model):
        save_for_hf(model, str(out), safe_serialization=True, data_config=facts.pop("data_config", None),
                    model_config=facts.pop("model_config", None))
    card = _card(model, facts, f"local-dir:{out}", model_card)
    (out / "README.md").write_text(generate_readme(card, out.resolve().name), encoding="utf-8")
    return out


def push_to_hub(model_or_run: RunOrModel, repo_id: str, *, commit_message: str = "Add model",
                token: Optional[str] = None, revision: Optional[str] = None, private: bool = False,
                create_pr: bool = False, model_card: Optional[dict] = None):
    """Upload ``model_or_run`` (as :func:`save_pretrained` writes it) to the Hugging Face Hub
    repository ``repo_id`` through timm's ``push_to_hf_hub``; rebuilt with
    ``timm.create_model("hf-hub:<repo_id>", pretrained=True)``. The card is written when the
    repository has none yet (timm's rule). Returns what ``huggingface_hub`` returns for the commit."""
    from timm.models import push_to_hf_hub

    model, facts = _model_and_facts(model_or_run)
    data_config, model_config = facts.pop("data_config", None), facts.pop("model_config", None)
    card = _card(model, facts, f"hf-hub:{repo_id}", model_card)
    with _json_model_args(model):
        return push_to_hf_hub(model, repo_id, commit_message=commit_message, token=token, revision=revision,
                              private=private, create_pr=create_pr, model_card=card, model_config=model_config,
                              safe_serialization=True, data_config=data_config)


# ------------------------------------------------------------------------------- the model and its facts
def _model_and_facts(model_or_run: RunOrModel) -> Tuple[nn.Module, Dict[str, Any]]:
    """The model (on CPU, eval) and what the card says about it: from a run's checkpoint metadata and
    ``summary.json``, or from the model's own build arguments."""
    if isinstance(model_or_run, nn.Module):
        model = model_or_run
        if not hasattr(model, "pretrained_cfg"):
            raise ValueError(f"{type(model).__name__} was not built by vitmix.create_model or timm.create_model "
                             f"(it has no pretrained_cfg), so timm could not rebuild it; build it with one of them")
        return model, _mixer_facts(model)
    return _from_run(Path(model_or_run))


def _from_run(path: Path) -> Tuple[nn.Module, Dict[str, Any]]:
    from .runs import load_checkpoint
    from .runs.checkpoints import known_dataset, run_data_config

    model, meta, checkpoint = load_checkpoint(path, device="cpu")   # one-line errors name what is missing
    facts = _mixer_facts(model)
    facts.update(data=meta.get("data"), epoch=meta.get("epoch"), val_acc=meta.get("val_acc"),
                 checkpoint=checkpoint.name)
    summary = checkpoint.parent / "summary.json"
    if summary.is_file():
        facts["best_val_acc"] = json.loads(summary.read_text()).get("best_val_acc")
    info = known_dataset(meta.get("data"))
    if info is not None:   # the run's normalisation and class names, for timm's pretrained_cfg / label_names
        facts["data_config"] = run_data_config(meta)
        if len(info.classes) == meta.get("num_classes"):
            facts["model_config"] = {"label_names": list(info.classes)}
    return model, facts


def _mixer_facts(model: nn.Module) -> Dict[str, Any]:
    """Architecture, mixer (the one asked for, else the architecture's own: every vitmix mixer in it)
    and mixer options."""
    from .mixers import TokenMixer

    args = _shareable_args(model)
    inside = sorted({m.mixer_name for m in model.modules() if isinstance(m, TokenMixer)})
    return {"architecture": model.pretrained_cfg.get("architecture"),
            "mixer": args.get("mixer") or ", ".join(inside) or "timm's softmax Attention",
            "mixer_options": args.get("mixer_options") or {}}


def _shareable_args(model: nn.Module) -> dict:
    """timm's recorded build arguments with a vitmix ``attn_layer`` class (``timm.create_model(...,
    attn_layer=vitmix.timm_attn(...))``) replaced by its JSON form, ``mixer`` + ``mixer_options``."""
    from .mixers import TokenMixer

    args = dict(getattr(model, "_model_args", {}))
    attn = args.get("attn_layer")
    if isinstance(attn, type) and issubclass(attn, TokenMixer):
        del args["attn_layer"]
        args.update(mixer=attn.mixer_name, mixer_options=dict(getattr(attn, "bound_options", {})))
    for key, value in args.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(f"the model's build argument {key}={value!r} is not JSON, so a saved config could "
                             f"not rebuild it; build the model with JSON arguments (for a mixer: "
                             f"mixer='name', mixer_options={{...}})") from None
    return args


@contextlib.contextmanager
def _json_model_args(model: nn.Module):
    """The model's recorded arguments in their JSON form while timm writes its config."""
    had = hasattr(model, "_model_args")
    original = getattr(model, "_model_args", None)
    model._model_args = _shareable_args(model)
    try:
        yield
    finally:
        if had:
            model._model_args = original
        else:
            del model._model_args


# ------------------------------------------------------------------------------------ the model card
def _card(model: nn.Module, facts: Dict[str, Any], source: str, extra: Optional[dict]) -> dict:
    """timm's model-card fields: details (mixer, options, data, accuracy, size) and how to load it."""
    mixer = facts["mixer"]
    details = {"Architecture": f"`{facts.get('architecture')}` (timm registry name)",
               "Token mixer": f"`{mixer}` (vitmix)",
               "Mixer options": _options_text(facts.get("mixer_options") or {}),
               "Params (M)": f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}",
               "Image size": "x".join(str(s) for s in _input_size(model)[1:])}
    if facts.get("data"):
        details["Dataset"] = facts["data"]
    if facts.get("val_acc") is not None:
        details["Validation top-1 (%)"] = (f"{facts['val_acc']:.2f} ({facts.get('checkpoint')}, epoch "
                                           f"{facts.get('epoch')}; best of the run: {facts.get('best_val_acc')})")
    card = {
        "description": f"A vision transformer with the `{mixer}` token mixer, built with vitmix on timm.",
        "details": details,
        "usage": ("```python\nimport timm\nimport vitmix  # registers vitmix's models and mixers in timm\n\n"
                  f"model = timm.create_model(\"{source}\", pretrained=True).eval()\n```\n"),
        "tags": ["image-classification", "timm", "vitmix"],
    }
    for key, value in (extra or {}).items():
        card[key] = dict(card["details"], **value) if key == "details" else value
    return card


def _input_size(model: nn.Module) -> tuple:
    """The size the model is built for now (timm's export helper; its source cfg may say 224)."""
    try:
        from timm.models._input import get_model_input_config
    except ImportError:                      # an older timm: the cfg it was created with
        return tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    return tuple(get_model_input_config(model)["input_size"])


def _options_text(options: dict) -> str:
    return ", ".join(f"`{k}={v!r}`" for k, v in sorted(options.items())) or "defaults"


__all__ = ["push_to_hub", "save_pretrained"]
