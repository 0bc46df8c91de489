"""vitmix.runs.tasks: `vitmix eval` finds a checkpoint's evaluator by the task its metadata records,
through a table of names, so train/ and dense/ never import each other."""
import importlib

import pytest
from torch import nn

from vitmix.cli import main
from vitmix.runs import load_meta, save_weights
from vitmix.runs.tasks import CLASSIFICATION, EVALUATORS, checkpoint_task, evaluator


def _checkpoint(path, **meta):
    path.parent.mkdir(parents=True, exist_ok=True)
    save_weights(nn.Linear(2, 2), path, meta)
    return path


@pytest.mark.parametrize("task", sorted(EVALUATORS))
def test_every_evaluator_in_the_table_exists(task):
    module, _, name = EVALUATORS[task].partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_task_comes_from_the_metadata_of_the_run_s_best_weights(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run / "last.safetensors", model="m")
    _checkpoint(run / "best.safetensors", model="m", task="segmentation")
    assert checkpoint_task(run) == "segmentation"
    assert checkpoint_task(run / "last.safetensors") == CLASSIFICATION          # records no task: a classifier
    assert load_meta(run / "best.safetensors") == {"model": "m", "task": "segmentation"}
    assert evaluator(run) is importlib.import_module("vitmix.dense.cli").eval_dense
    assert evaluator(run / "last.safetensors") is importlib.import_module("vitmix.train.evaluate").eval_classifier


@pytest.mark.parametrize("name, content", [("nope.safetensors", None), ("broken.safetensors", b"\x00" * 5),
                                           ("state.pt", b"")])
def test_unreadable_checkpoints_go_to_the_classifier_evaluation_which_reports_them(tmp_path, name, content):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    assert checkpoint_task(tmp_path / name) == CLASSIFICATION


def test_a_task_without_an_evaluator_is_a_one_line_error(tmp_path, capsys):
    path = _checkpoint(tmp_path / "gen" / "ema.safetensors", model="dit_nano", task="generation")
    with pytest.raises(ValueError, match="is a generation checkpoint; `vitmix eval` evaluates classification, "
                                         "detection, segmentation checkpoints"):
        evaluator(path)
    assert main(["eval", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitmix eval: error:") and "generation checkpoint" in err and "\n" not in err
