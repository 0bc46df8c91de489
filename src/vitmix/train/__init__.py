"""Training and evaluation: config, engine, checkpoints, distributed set-up, plots."""
from .config import TrainConfig
from .runner import evaluate_checkpoint, train

__all__ = ["TrainConfig", "train", "evaluate_checkpoint"]
