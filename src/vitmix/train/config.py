"""One config object for a training run; written to ``config.yaml`` in the run directory."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import yaml

from .._util import close_matches


class YamlConfig:
    """What a run config dataclass shares: field names (= CLI flags), dict/YAML round trips, and a
    close-match error for unknown keys. Subclassed by :class:`TrainConfig` and ``vitmix generate``'s."""

    @classmethod
    def field_names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def load(cls, path: Path) -> "YamlConfig":
        return cls.from_dict(load_yaml(path))

    @classmethod
    def from_dict(cls, values: dict) -> "YamlConfig":
        """The config of ``values`` (a YAML mapping or the CLI's flags): an unknown key, a value of the
        wrong type or out of range is a one-line ``ValueError`` naming the key."""
        unknown = set(values) - set(cls.field_names())
        if unknown:
            bad = sorted(unknown)[0]
            raise ValueError(f"unknown config key {bad!r}." + _key_hint(bad, cls.field_names()))
        hints = typing.get_type_hints(cls)
        config = cls(**{key: checked_value(key, value, hints[key]) for key, value in values.items()})
        config.check_values()
        return config

    def check_values(self) -> None:
        """Raise a one-line ``ValueError`` for a value out of range (none by default)."""


@dataclass
class TrainConfig(YamlConfig):
    """Everything that defines a run. CLI flags map 1:1 onto these fields (``--batch-size`` → batch_size)."""

    model: str = "vit_nano_patch4_32"
    mixer: Optional[str] = None          # None: the model's own default mixer
    mixer_options: Dict[str, Any] = field(default_factory=dict)
    model_options: Dict[str, Any] = field(default_factory=dict)
    data: str = "digits"
    data_dir: Optional[str] = None
    download: bool = False
    augment: bool = True                 # random resized crops (and flips for colour data) in training
    img_size: Optional[int] = None       # None: the model's default input size
    num_frames: Optional[int] = None     # video data: frames per clip (None: the dataset's default, 8)
    epochs: int = 20
    batch_size: int = 32
    lr: float = 2e-3                     # peak LR for the global batch, whatever the world size
    lr_base_batch: Optional[int] = None  # scale lr by global batch / this (DeiT: 512); None: no scaling
    min_lr: float = 1e-5
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    opt: str = "adamw"
    clip_grad: Optional[float] = 1.0
    smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    drop_path: float = 0.0
    amp: bool = False                    # autocast (amp_dtype)
    amp_dtype: str = "bfloat16"          # or "float16" (with a grad scaler)
    accum_steps: int = 1                 # micro-batches per optimizer step (global batch × this)
    ema_decay: Optional[float] = None    # keep an EMA of the weights (timm ModelEmaV3), e.g. 0.9998
    channels_last: bool = False          # NHWC images and conv weights
    compile: bool = False                # torch.compile the model (eager if compiling fails)
    keep_top_k: int = 1                  # also keep the k best epochs' weights under top/ (k > 1)
    tensorboard: bool = False            # also log the epoch metrics to run_dir/tensorboard
    seed: int = 0
    workers: int = 0
    max_steps: Optional[int] = None      # stop after this many optimizer steps (smoke tests)
    train_subset: Optional[int] = None   # train on a fixed seeded subset of this many images
    out: Optional[str] = None
    resume: bool = False
    device: Optional[str] = None

    def check_values(self) -> None:
        """A number out of range is a one-line ``ValueError`` naming the flag, before any work
        (a batch of 0 images would otherwise fail deep inside a mixer's reshape)."""
        for name in ("epochs", "batch_size", "max_steps", "train_subset", "lr_base_batch", "accum_steps",
                     "keep_top_k", "img_size", "num_frames"):
            _check(name, getattr(self, name), lambda v: v > 0, "a positive integer")
        _check("workers", self.workers, lambda v: v >= 0, "an integer >= 0")
        _check("lr", self.lr, lambda v: v > 0, "> 0")
        for name in ("min_lr", "weight_decay", "warmup_epochs", "mixup", "cutmix"):
            _check(name, getattr(self, name), lambda v: v >= 0, ">= 0")
        for name in ("smoothing", "drop_path"):
            _check(name, getattr(self, name), lambda v: 0 <= v < 1, "in [0, 1)")
        _check("clip_grad", self.clip_grad, lambda v: v > 0, "> 0 (or null: no clipping)")
        _check("ema_decay", self.ema_decay, lambda v: 0 < v < 1, "between 0 and 1 (e.g. 0.9998)")


def _check(name: str, value, ok, expected: str) -> None:
    if value is not None and not ok(value):
        raise ValueError(f"--{name.replace('_', '-')} {value} must be {expected}")


#: timm ``train.py`` names of config keys that vitmix spells differently (the same meaning).
TIMM_KEYS = {"grad_accum_steps": "accum_steps", "model_ema_decay": "ema_decay", "torchcompile": "compile",
             "checkpoint_hist": "keep_top_k", "dataset": "data", "dataset_download": "download",
             "model_kwargs": "model_options", "no_aug": "augment (false)"}


def _key_hint(key: str, names) -> str:
    if key.replace("-", "_") in TIMM_KEYS:
        return f" That is timm's name; vitmix's key is {TIMM_KEYS[key.replace('-', '_')]}."
    return close_matches(key, names) or " The keys are the flags' names with _ for - (see --help)."


_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
               list: "a list"}


def checked_value(key: str, value, hint):
    """``value`` for config key ``key`` of annotated type ``hint``, or a one-line ``ValueError``
    naming the key, the value and the type expected. A float written as ``1e-3`` is a string to
    YAML 1.1 (it wants ``1.0e-3``), so strings that spell a number are read as one."""
    args = typing.get_args(hint)
    if type(None) in args:                        # Optional[X]
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    kind = typing.get_origin(hint) or hint
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if kind is Any or _is_kind(value, kind):
        return value
    expected = "true or false" if kind is bool else _KIND_NAMES.get(kind, getattr(kind, "__name__", str(kind)))
    if kind is dict:
        raise ValueError(f"config key {key}: {value!r} is not a mapping; write it as "
                         f"{key}: {_as_mapping(value)}")
    raise ValueError(f"config key {key}: {value!r} is {_kind_of(value)}, expected {expected}")


def _is_kind(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _kind_of(value) -> str:
    return "null" if value is None else _KIND_NAMES.get(type(value), f"a {type(value).__name__}")


def _as_mapping(value) -> str:
    """The YAML mapping a ``KEY=VALUE[,KEY=VALUE]`` string (the ``-M`` form) stands for."""
    pairs = [p.split("=", 1) for p in str(value).split(",") if "=" in p]
    if not pairs:
        return "{KEY: VALUE, ...}"
    return "{" + ", ".join(f"{k.strip()}: {v.strip()}" for k, v in pairs) + "}"


def load_yaml(path) -> dict:
    """Read a YAML mapping, with a clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of config keys, got {type(values).__name__}")
    return values


def parse_key_values(items) -> Dict[str, Any]:
    """``["num_landmarks=16", "lam=4"]`` → ``{"num_landmarks": 16, "lam": 4}`` (values parsed as YAML)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return out
