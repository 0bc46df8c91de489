"""Training and evaluation: config, engine, checkpoints, plots (torchrun set-up is in ``runs/distributed.py``)."""
from .._lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, {
    "TrainConfig": ".config:TrainConfig",
    "train": ".runner:train",
    "evaluate_checkpoint": ".runner:evaluate_checkpoint",
    "load_model": ".runner:load_model",
    "validate": ".validation:validate",
})

__all__ = ["TrainConfig", "train", "evaluate_checkpoint", "load_model", "validate"]
