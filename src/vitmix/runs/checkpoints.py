"""Checkpoint IO: model weights in safetensors, resumable state via ``torch.load(weights_only=True)``,
and :func:`resolve_checkpoint` / :func:`load_model` for a file or a run directory.

Every file is written to a temporary name in the same directory and renamed into place, so an
interrupted save never leaves a half-written checkpoint over a good one.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .._util import atomic_write  # noqa: F401  (re-exported: the tasks write through runs)

_META_KEY = "vitmix"


def tensor_bytes(obj) -> int:
    """The bytes of the tensors in ``obj`` (nested dicts, lists and tuples): about the size of its file."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_text(path: Path, text: str) -> None:
    """Write a text file atomically (e.g. ``metrics.jsonl``)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text), len(text.encode()))


def file_digest(path: Path) -> str:
    """SHA-256 of a file (the checkpoint manifest records one per file of a set)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DDP, ``--compile`` and torch.compile wrappers (nested in any order)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel) or getattr(model, "wraps_module", False):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def save_weights(model: nn.Module, path: Path, meta: Dict[str, Any]) -> None:
    """Write the model's weights and the metadata needed to rebuild it (``meta``) as safetensors."""
    state = {k: v.detach().contiguous().cpu() for k, v in unwrap(model).state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata={_META_KEY: json.dumps(meta)}), tensor_bytes(state))


def load_weights(path: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """Read ``(state_dict, meta)`` from a vitmix safetensors checkpoint."""
    meta = load_meta(path)
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise _unreadable(path, err) from None
    return state, meta


def load_meta(path: Path) -> Dict[str, Any]:
    """The metadata of a vitmix safetensors checkpoint, without reading its tensors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {}).get(_META_KEY, "{}"))
    except (SafetensorError, OSError, json.JSONDecodeError, ValueError) as err:
        raise _unreadable(path, err) from None


def _unreadable(path: Path, err: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable safetensors checkpoint ({err}); it may be truncated "
                      "or corrupt — use the run's other checkpoint (best/last)")


def load_into(model: nn.Module, state: Dict[str, torch.Tensor], source: str = "checkpoint",
              ignore: Tuple[str, ...] = ()) -> None:
    """Load ``state`` strictly, turning key/shape mismatches into a one-paragraph ``ValueError``.

    Keys starting with a prefix in ``ignore`` (e.g. ``"head."`` for another classifier) may be missing,
    extra or shaped differently: the model keeps its own values there.
    """
    own = unwrap(model).state_dict()
    shapes = [k for k in own if k in state and own[k].shape != state[k].shape]
    missing, unexpected, wrong = ([k for k in keys if not k.startswith(ignore)] for keys in (
        sorted(set(own) - set(state)), sorted(set(state) - set(own)), shapes))
    if missing or unexpected or wrong:
        _mismatch(source, own, state, missing, unexpected, wrong)
    if ignore:
        state = {k: v for k, v in state.items() if k in own and k not in shapes}
    unwrap(model).load_state_dict(state, strict=not ignore)


def _mismatch(source: str, own: dict, state: dict, missing: list, unexpected: list, shapes: list) -> None:
    """Raise the one-paragraph ``ValueError`` of :func:`load_into`."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if shapes:
        k = shapes[0]
        parts.append(f"{len(shapes)} with other shapes "
                     f"(e.g. {k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)})")
    raise ValueError(f"{source} does not match the model: " + "; ".join(parts)
                     + ". Build the model with the same --model/--mixer/--img-size as the run")


def is_safetensors(path: Path) -> bool:
    """Whether ``path`` is read as safetensors (else as a torch file), by its first bytes: safetensors
    starts with an 8-byte header length and the header's ``{``, torch with a zip or pickle signature;
    a file too short or damaged to tell goes by its suffix."""
    with open(path, "rb") as fh:
        head = fh.read(9)
    if len(head) == 9 and head[8:9] == b"{":
        return True
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return False
    return Path(path).suffix == ".safetensors"


#: The keys of a torch checkpoint dict that hold its model weights, first match wins.
WEIGHT_KEYS = ("model", "state_dict", "model_state_dict", "model_state")
#: The keys that hold an EMA of them: timm ``train.py``'s, then older timm's and other trainers'.
EMA_KEYS = ("state_dict_ema", "model_ema", "ema")
#: The file a vitmix run keeps the EMA of its weights in (``--ema-decay``; a generator samples from it).
EMA_FILE = "ema.safetensors"


def read_checkpoint(path, ema: bool = False) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """``(state_dict, meta)`` of a checkpoint file: the one reader behind every entry point that takes
    weights (``--init-from``, ``eval``, ``load_model``, ``convert``, ``save_pretrained``, ``analyze``).
    A safetensors file gives its vitmix metadata; a torch state dict (``.pt``/``.pth``/timm's
    ``.pth.tar``; read with ``weights_only=True``; a ``{"model": ...}``/``{"state_dict": ...}`` wrapper
    and DDP's ``module.`` prefix removed) gives ``meta = {}``. ``ema``: the EMA weights instead
    (:data:`EMA_KEYS` of a torch checkpoint, or a run's :data:`EMA_FILE`); a file without them, or an
    unreadable one, is a one-line ``ValueError``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if is_safetensors(path):
        return load_weights(resolve_ema(path) if ema else path)
    obj = _torch_load(path, "checkpoint")
    for key in EMA_KEYS if ema else WEIGHT_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    else:
        if ema:
            raise ValueError(f"{path} holds no EMA weights (none of {', '.join(EMA_KEYS)}): it was saved without "
                             "an EMA; evaluate it without --use-ema")
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds no state dict")
    return {k.removeprefix("module."): v for k, v in obj.items() if isinstance(v, torch.Tensor)}, {}


def resolve_ema(checkpoint) -> Path:
    """The EMA weights of a run directory (its :data:`EMA_FILE`), or the file given: a run trained without
    an EMA, or a safetensors file other than a run's EMA, is a one-line ``ValueError`` (a torch file's
    EMA keys are looked up by :func:`read_checkpoint` with ``ema=True``)."""
    path = Path(checkpoint)
    if not path.is_dir():
        if is_safetensors(resolve_checkpoint(path)) and path.name != EMA_FILE:
            raise ValueError(f"{path} holds one set of weights, not an EMA: a vitmix run keeps its EMA in {EMA_FILE} "
                             "(give the run directory or that file), a timm checkpoint in state_dict_ema")
        return path
    if not (path / EMA_FILE).is_file():
        resolve_checkpoint(path)        # not a run at all: its own message
        raise ValueError(f"{path} has no EMA weights ({EMA_FILE}): the run was trained without --ema-decay "
                         "(--model-ema); evaluate it without --use-ema")
    return path / EMA_FILE


def read_state_dict(path) -> Dict[str, torch.Tensor]:
    """The weights of a checkpoint file (see :func:`read_checkpoint`)."""
    return read_checkpoint(path)[0]


def save_state(path: Path, state: Dict[str, Any]) -> None:
    """Write the resumable training state (tensors, numbers, strings and dicts/lists of them only)."""
    atomic_write(path, lambda tmp: torch.save(state, tmp), tensor_bytes(state))


def load_state(path: Path) -> Dict[str, Any]:
    """Read training state without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training state at {path}; cannot resume")
    return _torch_load(path, "training state")


def _torch_load(path: Path, what: str):
    """``torch.load(path, weights_only=True)``; a file it refuses or cannot read is a one-line
    ``ValueError`` in vitmix's words (torch's own message for a refused pickle is many lines and ends
    in advice to turn the protection off)."""
    try:
        with warnings.catch_warnings():   # torch's note on foreign pickle protocols precedes our error
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            with _timm_args_allowed():
                return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" not in str(err):
            raise ValueError(f"{path} is not a loadable {what}: it is truncated or corrupt ({_first_line(err)})"
                             ) from None
        found = re.search(r"GLOBAL (\S+)", str(err))
        raise ValueError(
            f"{path} is not a loadable {what}: it holds pickled code "
            f"({found.group(1) if found else 'objects beyond tensors'}), not only tensors, and vitmix will not "
            "unpickle it, since that could run arbitrary code. If you trust its source, convert it once: in Python, "
            f"torch.load('{path}', weights_only=False), then save only its tensors with torch.save(state_dict, "
            "'weights.pt') or safetensors.torch.save_file(state_dict, 'weights.safetensors'), and give that file"
        ) from None
    except Exception as err:  # torch raises several types for corrupt files (RuntimeError, EOFError, ...)
        raise ValueError(f"{path} is not a loadable {what}: it is empty, truncated or corrupt "
                         f"({_first_line(err)})") from None


def _timm_args_allowed():
    """timm's ``train.py`` saves its flags in a checkpoint as an ``argparse.Namespace`` (plain values): that
    class, and no other, is allowed to ``weights_only`` loading (torch >= 2.5; before, such a file is
    refused as pickled code, with the way to convert it)."""
    allow = getattr(torch.serialization, "safe_globals", None)
    return allow([argparse.Namespace]) if allow is not None else contextlib.nullcontext()


def _first_line(err: Exception) -> str:
    """``Type: first line of the message`` (at most 200 characters), also for an empty message."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200]}" if lines else type(err).__name__


#: Which file of a run directory :func:`resolve_checkpoint` takes, first match wins. A classifier run
#: keeps the best-validated weights; a generator has no validation score, and its samples come from the EMA.
BEST_FIRST = ("best.safetensors", "last.safetensors")
EMA_FIRST = ("ema.safetensors", "last.safetensors")


def resolve_checkpoint(path, prefer: Sequence[str] = BEST_FIRST) -> Path:
    """A checkpoint file as given, or the first of ``prefer`` that a run directory holds
    (:data:`BEST_FIRST` for ``vitmix train`` runs, :data:`EMA_FIRST` for ``vitmix generate`` runs)."""
    path = Path(path)
    if path.is_dir():
        for name in prefer:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path} is a directory without {' or '.join(prefer)} (no epoch finished yet?)")
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def build_classifier(model: str, num_classes: int, in_chans: int, img_size: int, num_frames: Optional[int] = None,
                     *, mixer: Optional[str] = None, mixer_options: Optional[dict] = None,
                     model_options: Optional[dict] = None, drop_path: float = 0.0, data: Optional[str] = None,
                     pretrained: bool = False, pretrained_file: Optional[str] = None,
                     sequence: Optional[dict] = None) -> nn.Module:
    """The classifier ``model`` (``num_frames``: clip length of video data, ``None`` for images; ``sequence``:
    a sequence dataset's ``SequenceInfo.model_kwargs()`` for 1-D data, which replace ``in_chans`` and
    ``img_size``); a model that is no classifier, or video or sequence data for an image model (and back), is a
    one-line ``ValueError``. ``pretrained``: with timm's pretrained weights (from ``pretrained_file`` when
    given, timm's ``pretrained_cfg_overlay=dict(file=...)``), fitted by timm to the classes, channels and size."""
    from ..models.sequence import is_sequence_model
    from ..models.timesformer import is_video_model

    if is_sequence_model(model) != (sequence is not None):
        raise ValueError(f"{model} takes 1-D token sequences: train it on --data listops, pathfinder32 or "
                         "sfashion-mnist" if sequence is None else f"--data {data}: {data} holds 1-D token "
                         f"sequences, not images, which {model} does not take: use a sequence model (--model "
                         "seq_lra_tiny)")
    if sequence is not None:
        kwargs = sequence_model_kwargs(sequence, model_options or {}, data)
    else:
        kwargs = dict(model_options or {}, num_classes=num_classes, in_chans=in_chans, img_size=img_size)
    if is_video_model(model) != (num_frames is not None):
        raise ValueError(f"{model} takes video clips: train it on --data moving-fashion-mnist or clipfolder"
                         if num_frames is None else f"--data {data} holds video clips, which {model} does not "
                         "take: use a video model such as timesformer_tiny (see `vitmix models timesformer`)")
    if num_frames is not None:
        kwargs["num_frames"] = num_frames
    if drop_path:
        kwargs["drop_path_rate"] = drop_path
    if pretrained_file:
        kwargs["pretrained_cfg_overlay"] = dict(file=str(Path(pretrained_file).expanduser()))
    net = _create(model, pretrained, dict(mixer=mixer, mixer_options=mixer_options or None, **kwargs))
    task = getattr(net, "task", "classification")
    if task != "classification":      # before the run directory exists: nothing is left behind
        raise ValueError(f"{model} is a {task} model, not a classifier; train it with "
                         f"`vitmix generate train --model {model}`")
    return net


def sequence_model_kwargs(sequence: dict, model_options: dict, data: Optional[str] = None) -> dict:
    """A sequence model's keyword arguments: the data's (``sequence``) under the user's ``model_options``,
    which may give more positions or ids than the data needs but not fewer (one-line ``ValueError``)."""
    for key, what in (("seq_len", "tokens, longer than the model's position table"), ("vocab_size", "ids")):
        if key in model_options and model_options[key] < sequence[key]:
            fix = "shorten the data (--data-option max_len=N)" if key == "seq_len" else "raise it"
            raise ValueError(f"--data {data} has up to {sequence[key]} {what} (--model-option {key}="
                             f"{model_options[key]}); give the model {key} >= {sequence[key]} or {fix}")
    return {**sequence, **model_options}


def _create(model: str, pretrained: bool, kwargs: dict) -> nn.Module:
    """``create_model``; pretrained weights that cannot be fetched, or do not fit, are a one-line error."""
    from ..models import create_model
    from ..models.swap import load_error

    if not pretrained:
        return create_model(model, **kwargs)
    try:
        return create_model(model, pretrained=True, **kwargs)
    except RuntimeError as err:
        if "state_dict" in str(err):        # torch's load error: the weights are of another build
            raise ValueError(f"--pretrained: the pretrained weights of {model} do not fit the model built for this "
                             f"run: {load_error(err)}; build it as they were saved (--mixer, --model-option), or "
                             "start from a timm ViT/DeiT, whose weights are converted to --mixer") from None
        raise ValueError(f"--pretrained: no pretrained weights of {model} ({load_error(err)}); give a local "
                         "file of them with --pretrained-path FILE") from None
    except OSError as err:                  # the Hub: offline, or no such file
        raise ValueError(f"--pretrained: the pretrained weights of {model} could not be fetched "
                         f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}); "
                         "give a local file of them with --pretrained-path FILE") from None


def load_checkpoint(checkpoint, device: Optional[str] = None) -> Tuple[nn.Module, Dict[str, Any], Path]:
    """``(model, meta, path)`` of a classifier checkpoint file or run directory (see :func:`load_model`)."""
    from .device import parse_device

    path = resolve_checkpoint(checkpoint)
    state, meta = read_checkpoint(path)
    shape = ("sequence",) if "sequence" in meta else ("in_chans", "img_size")   # 1-D id runs: the data's sizes
    missing = [k for k in ("model", "num_classes", *shape) if k not in meta]
    if not is_safetensors(path):
        raise ValueError(f"{path} is a torch state dict: weights without the vitmix metadata of their model, so "
                         "vitmix cannot rebuild it. Build the model (vitmix.create_model) and load them with "
                         f"vitmix.runs.load_into(model, vitmix.runs.read_state_dict('{path}')), evaluate them with "
                         f"`vitmix eval --model NAME --checkpoint {path}`, or start a run from them with "
                         f"`vitmix train --init-from {path} --model NAME --mixer NAME`")
    if missing:
        raise ValueError(f"{path} has no vitmix metadata ({', '.join(missing)} missing); was it written by "
                         "vitmix train? Build the model yourself and load it with load_into")
    dev = parse_device(device)
    sequence = meta.get("sequence")
    model = build_classifier(meta["model"], meta["num_classes"], meta.get("in_chans"),
                             None if sequence else int(meta["img_size"]), meta.get("num_frames"),
                             mixer=meta.get("mixer"), mixer_options=meta.get("mixer_options"),
                             model_options=meta.get("model_options"), data=meta.get("data"), sequence=sequence)
    load_into(model, state, str(path))
    set_data_config(model, run_data_config(meta))
    return model.to(dev).eval(), meta, path


def known_dataset(data: Optional[str]):
    """The ``DatasetInfo`` vitmix holds for ``data`` without reading it (its image datasets; the class
    names of digits and Fashion-MNIST), else None."""
    from ..data import datasets

    infos = [v for v in vars(datasets).values() if isinstance(v, datasets.DatasetInfo) and v.name == data]
    return infos[0] if infos else None


def run_data_config(meta: Dict[str, Any]) -> Dict[str, Any]:
    """The preprocessing a run trained with, as timm's ``pretrained_cfg`` keys: its channels and image size,
    and for vitmix's image datasets (not video clips) the normalisation and the validation resize
    (bilinear, no crop), so that ``vitmix eval`` preprocesses as the run validated; a sequence run's is
    timm's ``(C, H, W)`` for its N ids, as the ``seq_*`` models' own configs."""
    if "sequence" in meta:
        return dict(input_size=(1, 1, int(meta["sequence"]["seq_len"])))
    size = int(meta["img_size"])
    config: Dict[str, Any] = dict(input_size=(int(meta["in_chans"]), size, size))
    info = known_dataset(meta.get("data"))
    if info is not None:
        config.update(mean=tuple(info.mean), std=tuple(info.std), crop_pct=1.0, interpolation="bilinear")
    return config


def set_data_config(model: nn.Module, config: Dict[str, Any]) -> None:
    """Give ``model.pretrained_cfg`` (and timm's ``default_cfg`` alias) the data ``config``, so that
    ``timm.data.resolve_data_config(model=model)`` builds the preprocessing the weights were trained with."""
    if isinstance(getattr(model, "pretrained_cfg", None), dict):
        model.pretrained_cfg = dict(model.pretrained_cfg, **config)
        model.default_cfg = model.pretrained_cfg


def load_model(checkpoint, device: Optional[str] = None) -> nn.Module:
    """The model of a vitmix checkpoint file or run directory, rebuilt from the checkpoint's own
    metadata (model, mixer and its options, classes, channels, image size) and put in eval mode.
    Its ``pretrained_cfg`` is the run's data config (:func:`run_data_config`), so timm's
    ``resolve_data_config(model=model)`` gives the run's channels, size and normalisation.

    >>> model = vitmix.load_model("runs/my-run")          # doctest: +SKIP  (its best.safetensors)
    """
    return load_checkpoint(checkpoint, device)[0]


def model_meta(cfg) -> Dict[str, Any]:
    """The part of a checkpoint's metadata every task records from its config: the model and mixer
    with their options (the task adds sizes, classes and its own settings)."""
    return {"model": cfg.model, "mixer": cfg.mixer, "mixer_options": cfg.mixer_options,
            "model_options": cfg.model_options}
