"""The config of a ``vitmix generate train`` run; written to ``config.yaml`` in its run directory."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ..runs.flags import YamlConfig


@dataclass
class GenerateConfig(YamlConfig):
    """Everything that defines a generation run; CLI flags map 1:1 onto the fields."""

    model: str = "dit_nano_patch2"
    mixer: Optional[str] = None              # dit_*: the attention's vitmix mixer (default softmax)
    mixer_options: Dict[str, Any] = field(default_factory=dict)
    model_options: Dict[str, Any] = field(default_factory=dict)
    data: str = "fashion-mnist"
    data_dir: Optional[str] = None
    download: bool = False
    img_size: Optional[int] = None           # None: the dataset's native size (28 for Fashion-MNIST)
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3                         # AdamW, constant (DiT: 1e-4 at batch 256 for 400k steps)
    weight_decay: float = 0.0                # DiT: none
    clip_grad: Optional[float] = None
    ema_decay: Optional[float] = 0.999       # EMA (with warm-up) used for samples, grids, FD (DiT: 0.9999)
    timesteps: int = 1000
    schedule: str = "cosine"                 # cosine | linear
    prediction: str = "eps"                  # eps | v
    sample_steps: int = 50                   # DDIM steps for grids and FD
    guidance: float = 2.0                    # classifier-free guidance scale (1 = none)
    eta: float = 0.0                         # DDIM η: 0 deterministic, 1 ancestral
    grid_per_class: int = 8                  # samples per class (row) in each epoch's PNG grid
    fd_samples: Optional[int] = None         # generated images for the FD at the end (0 = skip; None: scaled
                                             # to the run, see runner.default_fd_samples)
    fd_classifier_subset: Optional[int] = None  # the FD classifier's training images (None: scaled to the run)
    train_subset: Optional[int] = None       # train on a fixed seeded subset of this many images
    max_steps: Optional[int] = None          # stop after this many optimizer steps (smoke tests)
    seed: int = 0
    out: Optional[str] = None
    resume: bool = False
    device: Optional[str] = None
