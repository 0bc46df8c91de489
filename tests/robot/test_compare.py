"""`vitmix robot compare`: the table and the claim from rows, and the grid end to end at toy size,
continued by rerunning the command, also where only its committed results files are left."""
import shutil

import pytest

from vitmix.cli import main
from vitmix.robot.compare import results_table

from .conftest import needs_simulator

DEMOS = {"lift": {"kept": 3, "episodes": 3, "seed": 0, "noise": 0.0, "expert_success_rate": 1.0}}


def _rows(fib, soft, big):
    rows = []
    for mixer, values in (("softmax", soft), ("fibottention", fib), ("bigbird", big)):
        rows += [{"task": "lift", "mixer": mixer, "seed": s, "success_rate": v, "rollouts": 50, "train_steps": 1500,
                  "train_seconds": 10.0} for s, v in enumerate(values)]
    return rows


@pytest.mark.parametrize("fib, verdict", [((0.8, 0.6), "holds"), ((0.3, 0.5), "fails")])
def test_table_reports_per_seed_values_and_the_claim(fib, verdict):
    text = results_table(_rows(fib, soft=(0.5, 0.5), big=(0.7, 0.3)), DEMOS)
    assert f"**{verdict}**" in text
    assert "| softmax | 0.50 ± 0.00 (0.50, 0.50) | 0.500 |" in text
    assert "3/3 expert episodes kept (100%), seed 0" in text


def test_comparison_names_pusht_metric_and_runs_it_by_default():
    from vitmix.cli import build_parser

    rows = [{"task": task, "mixer": "softmax", "seed": 0, "success_rate": value, "rollouts": 2, "train_steps": 4,
             "train_seconds": 1.0} for task, value in (("lift", 1.0), ("pusht", 0.5))]
    demos = {t: {"kept": 1, "episodes": 1, "seed": 0, "noise": 0.0, "expert_success_rate": 1.0}
             for t in ("lift", "pusht")}
    text = results_table(rows, demos)
    assert "| mixer | lift success (per seed) | pusht max coverage (per seed) | mean over tasks |" in text
    assert "| softmax | 1.00 ± 0.00 (1.00) | 0.50 ± 0.00 (0.50) | 0.750 |" in text
    args = build_parser().parse_args(["robot", "compare", "--out", "x"])
    assert args.tasks == ["lift", "can", "pusht"]


@needs_simulator
def test_compare_grid_runs_and_continues(tmp_path, capsys):
    argv = ["robot", "compare", "--out", str(tmp_path / "grid"), "--tasks", "lift", "--seeds", "0", "--episodes", "1",
            "--steps", "2", "--batch-size", "4", "--rollouts", "1", "--max-steps", "8", "--sample-steps", "1"]
    assert main(argv) == 0
    table = (tmp_path / "grid" / "results.md").read_text()
    assert "| fibottention |" in table and "| bigbird |" in table and "Paper's claim" in table
    capsys.readouterr()
    assert main(argv) == 0                                      # everything done: nothing retrained or re-rolled
    out = capsys.readouterr().out
    assert "already trained for 2 steps" not in out and "rollout 1/1" not in out      # read from results.json
    assert (tmp_path / "grid" / "results.md").read_text() == table
    shutil.rmtree(tmp_path / "grid" / "runs")        # another machine: only the committed results files
    shutil.rmtree(tmp_path / "grid" / "demos")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "demonstrations" not in out and "training" not in out and "rollout" not in out
    assert (tmp_path / "grid" / "results.md").read_text() == table
    assert main([*argv[:-2], "--sample-steps", "2"]) == 2                  # another recipe: refused, kept
    assert "holds runs of recipe" in capsys.readouterr().err
    assert (tmp_path / "grid" / "results.md").read_text() == table


def test_table_of_a_grid_still_running_leaves_its_holes_open():
    rows = _rows((0.8,), soft=(0.5,), big=(0.7,)) + [{"task": "can", "mixer": "softmax", "seed": 0, "success_rate": 0.2,
                                                     "rollouts": 50, "train_steps": 1500, "train_seconds": 10.0}]
    text = results_table(rows, {**DEMOS, "can": DEMOS["lift"]})
    assert "| fibottention | 0.80 ± 0.00 (0.80) | – | – |" in text
    assert "| softmax | 0.50 ± 0.00 (0.50) | 0.20 ± 0.00 (0.20) | 0.350 |" in text
    assert "not checked" in text
