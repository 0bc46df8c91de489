"""One config object for a training run; written to ``config.yaml`` in the run directory."""
from __future__ import annotations

import dataclasses
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
        unknown = set(values) - set(cls.field_names())
        if unknown:
            bad = sorted(unknown)[0]
            raise ValueError(f"unknown config key {bad!r}." + close_matches(bad, cls.field_names()))
        return cls(**values)


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
