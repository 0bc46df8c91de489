"""The config of a ``vitmix dense train`` run; written to ``config.yaml`` in its run directory."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ..runs.flags import YamlConfig

#: the tasks and the data each reads
TASKS = ("segment", "detect")
DATA = {"segment": ("fashion-scenes", "maskfolder"), "detect": ("fashion-scenes", "coco")}


@dataclass
class DenseConfig(YamlConfig):
    """Everything that defines a segmentation or detection run; CLI flags map 1:1 onto the fields."""

    task: str = "segment"                  # segment (Semantic FPN) | detect (torchvision Mask/Faster R-CNN)
    model: str = "laplacianformer_nano"    # any vitmix backbone: pyramid or isotropic
    mixer: Optional[str] = None            # the backbone's token mixer (default: the model's own)
    mixer_options: Dict[str, Any] = field(default_factory=dict)
    model_options: Dict[str, Any] = field(default_factory=dict)
    data: str = "fashion-scenes"           # fashion-scenes | maskfolder (segment) | coco (detect)
    data_dir: Optional[str] = None         # maskfolder/coco: the folder; fashion-scenes: Fashion-MNIST's
    num_classes: Optional[int] = None      # maskfolder: classes in the masks (fashion-scenes/coco: read)
    img_size: int = 128                    # scene canvas / input side (user images are resized to it)
    train_scenes: int = 2000               # fashion-scenes: scenes per training epoch
    val_scenes: int = 200                  # fashion-scenes: validation scenes
    scene_seed: int = 0                    # fashion-scenes: the scenes' seed (the same val set for every run)
    masks: bool = True                     # detect: instance masks (Mask R-CNN) or boxes only (Faster R-CNN)
    epochs: int = 6
    batch_size: int = 16                   # global batch (split over torchrun processes)
    lr: float = 1e-3                       # AdamW peak, linear warm-up then cosine
    min_lr: float = 1e-5
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    clip_grad: Optional[float] = 1.0
    amp: bool = False                      # autocast (CUDA; bf16 by default)
    amp_dtype: str = "bfloat16"
    preview: int = 4                       # validation scenes drawn in predictions/epoch-NNN.png (0: none)
    workers: int = 0
    max_steps: Optional[int] = None        # stop after this many optimizer steps (smoke tests)
    seed: int = 0
    out: Optional[str] = None
    resume: bool = False
    device: Optional[str] = None

    def check_values(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"--task {self.task!r}: choose {' or '.join(TASKS)}")
        if self.data not in DATA[self.task]:
            other = next((t for t in TASKS if self.data in DATA[t]), None)
            raise ValueError(f"--data {self.data!r} is not a {self.task} dataset: choose "
                             f"{' or '.join(DATA[self.task])}" + (f" (or --task {other})" if other else ""))
        for name in ("img_size", "train_scenes", "val_scenes", "epochs", "batch_size", "max_steps", "num_classes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} {value} must be a positive integer")
        for name in ("preview", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} {getattr(self, name)} must be >= 0")
        numbers = (self.lr, self.min_lr, self.warmup_epochs, self.weight_decay)
        if not self.lr > 0 or min(numbers) < 0 or not all(map(math.isfinite, numbers)):
            raise ValueError("--lr must be > 0 and --min-lr, --warmup-epochs, --weight-decay >= 0 (finite numbers)")
        if self.min_lr > self.lr:
            raise ValueError(f"--min-lr {self.min_lr:g} is above --lr {self.lr:g}: the schedule decays from --lr "
                             "down to --min-lr; lower --min-lr")
        if self.amp_dtype not in ("bfloat16", "float16"):
            raise ValueError(f"--amp-dtype {self.amp_dtype!r}: choose bfloat16 or float16")
        if self.data == "maskfolder" and self.num_classes is None:
            raise ValueError("--data maskfolder needs --num-classes N: the number of classes in the mask PNGs")
        if self.data in ("maskfolder", "coco") and not self.data_dir:
            raise ValueError(f"--data {self.data} needs --data-dir FOLDER (see docs/dense.md for its layout)")
