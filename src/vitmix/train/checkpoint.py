"""Checkpoints: model weights in safetensors, resumable state via ``torch.load(weights_only=True)``.

Every file is written to a temporary name in the same directory and renamed into place, so an
interrupted save never leaves a half-written checkpoint over a good one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

_META_KEY = "vitmix"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())        # mkstemp makes 0600; give the file a normal file's mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_text(path: Path, text: str) -> None:
    """Write a text file atomically (e.g. ``metrics.jsonl``)."""
    _atomic(path, lambda tmp: Path(tmp).write_text(text))


def file_digest(path: Path) -> str:
    """SHA-256 of a file (the checkpoint manifest records one per file of a set)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def remove_stray_temporaries(run_dir: Path) -> int:
    """Delete the ``.NAME.*.tmp`` files an interrupted atomic write leaves behind; returns how many."""
    stray = sorted(Path(run_dir).glob(".*.tmp"))
    for path in stray:
        path.unlink()
    return len(stray)


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
    _atomic(path, lambda tmp: save_file(state, tmp, metadata={_META_KEY: json.dumps(meta)}))


def load_weights(path: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """Read ``(state_dict, meta)`` from a vitmix safetensors checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(_META_KEY, "{}"))
        state = load_file(str(path))
    except (SafetensorError, OSError, json.JSONDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not a readable safetensors checkpoint ({err}); it may be truncated "
                         "or corrupt — use the run's other checkpoint (best/last)") from None
    return state, meta


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


def read_state_dict(path) -> Dict[str, torch.Tensor]:
    """The weights in a vitmix safetensors checkpoint or a torch ``.pt``/``.pth`` file (read with
    ``weights_only=True``; a ``{"model": ...}``/``{"state_dict": ...}`` wrapper and DDP's ``module.``
    prefix are removed). Unreadable files are a one-line ``ValueError``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        return load_weights(path)[0]
    obj = load_state(path)
    for key in ("model", "state_dict", "model_state_dict", "model_state"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds no state dict")
    return {k.removeprefix("module."): v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def save_state(path: Path, state: Dict[str, Any]) -> None:
    """Write the resumable training state (tensors, numbers, strings and dicts/lists of them only)."""
    _atomic(path, lambda tmp: torch.save(state, tmp))


def load_state(path: Path) -> Dict[str, Any]:
    """Read training state without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training state at {path}; cannot resume")
    try:
        with warnings.catch_warnings():   # torch's note on foreign pickle protocols precedes our error
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for corrupt or unsafe files
        raise ValueError(f"{path} is not a loadable training state ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:200]})") from None
