"""Which task's code evaluates a checkpoint: ``vitmix eval`` reads the task a checkpoint's metadata
records and calls the evaluator :data:`EVALUATORS` names for it. The table holds ``"module:function"``
strings, imported on first use, so runs/ imports no task package and no task imports another: train/
and dense/ stay peers on runs/ (``tests/test_import_graph.py`` checks the package order)."""
from __future__ import annotations

import importlib
from typing import Callable

from .checkpoints import BEST_FIRST, load_meta, resolve_checkpoint

#: What a checkpoint records no task as: ``vitmix train`` classifiers.
CLASSIFICATION = "classification"

#: A checkpoint's ``task`` metadata -> ``"module:function"`` evaluating it for ``vitmix eval``, called
#: as ``function(args, checkpoint) -> exit status`` with the parsed ``vitmix eval`` arguments.
EVALUATORS = {
    CLASSIFICATION: "vitmix.train.evaluate:eval_classifier",
    "segmentation": "vitmix.dense.cli:eval_dense",
    "detection": "vitmix.dense.cli:eval_dense",
}


def checkpoint_task(checkpoint) -> str:
    """The task recorded by a checkpoint file or run directory (its best, else its last weights);
    :data:`CLASSIFICATION` when it records none, or when it cannot be read (the classifier evaluation
    then reports the missing or broken file in its own words)."""
    try:
        path = resolve_checkpoint(checkpoint, BEST_FIRST)
        if path.suffix != ".safetensors":
            return CLASSIFICATION
        return load_meta(path).get("task", CLASSIFICATION)
    except (FileNotFoundError, ValueError):
        return CLASSIFICATION


def evaluator(checkpoint) -> Callable[..., int]:
    """The ``vitmix eval`` function for ``checkpoint``'s task; a task without one is a one-line error."""
    task = checkpoint_task(checkpoint)
    target = EVALUATORS.get(task)
    if target is None:
        raise ValueError(f"{checkpoint} is a {task} checkpoint; `vitmix eval` evaluates "
                         f"{', '.join(sorted(EVALUATORS))} checkpoints")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
