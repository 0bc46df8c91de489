"""Training and evaluation: config, engine, checkpoints, distributed set-up, plots."""
from .._lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, {
    "TrainConfig": ".config:TrainConfig",
    "train": ".runner:train",
    "evaluate_checkpoint": ".runner:evaluate_checkpoint",
    "load_model": ".runner:load_model",
})

__all__ = ["TrainConfig", "train", "evaluate_checkpoint", "load_model"]
