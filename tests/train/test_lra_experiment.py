"""experiments/lra/lra.py at smoke size: 2 tasks × 2 mixers × 1 seed of 2 steps on tiny generated sets; finished
runs are read back, results already in lra.json are not retrained when the run folders are gone (another machine),
the table keeps the anchors' rows beside ours, and results of another budget are refused."""
import importlib.util
import json
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _load():
    spec = importlib.util.spec_from_file_location("lra_experiment", ROOT / "experiments" / "lra" / "lra.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lra_comparison_runs_reads_back_and_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path / "cache"))
    lra = _load()
    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["--tasks", "listops,pathfinder32", "--mixers", "softmax,soft", "--seeds", "0", "--epochs", "1",
            "--max-steps", "2", "--train-size", "16", "--val-size", "8", "--batch-size", "8",
            "--runs", str(runs), "--out", str(out)]
    assert lra.main(argv) == 0
    first = json.loads((out / "lra.json").read_text())
    assert set(first["accuracy"]) == {"listops", "pathfinder32"}
    assert {m for t in first["accuracy"].values() for m in t} == {"softmax", "soft"}
    summary = json.loads((runs / "listops" / "seed0" / "soft" / "summary.json").read_text())
    assert summary["steps"] == 2 and first["accuracy"]["listops"]["soft"]["0"] == summary["final_val_acc"]
    text = (out / "lra.md").read_text()
    assert "| Standard (Nyströmformer's table) | 37.10 | 65.02 | 79.35 | 38.20 | 74.16 |" in text
    assert "—, no offline data" in text and "| **soft** (ours) |" in text
    assert "(no comparison has both mixers yet)" in text                       # nystromformer etc. were not run
    assert "Our average is over the tasks every mixer ran: listops, pathfinder32." in text
    assert (out / "lra.png").stat().st_size > 0 and (out / "lra.csv").is_file()

    import vitmix.compare.runner as runner

    def no_work(*_args, **_kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(runner, "train", no_work)
    assert lra.main(argv) == 0
    assert json.loads((out / "lra.json").read_text())["accuracy"] == first["accuracy"]
    shutil.rmtree(runs)                         # another machine: only the committed results are there
    monkeypatch.setattr(lra, "train_entry", no_work)
    assert lra.main(argv) == 0
    assert json.loads((out / "lra.json").read_text())["accuracy"] == first["accuracy"]
    with pytest.raises(ValueError, match="holds runs of budget"):
        lra.main([*argv[:-4], "--max-steps", "3", "--runs", str(runs), "--out", str(out)])


def test_goals_compare_the_means_per_task_and_overall():
    lra = _load()
    acc = {"listops": {"soft": {0: 37.0, 1: 38.0}, "nystromformer": {0: 38.0}, "linformer": {0: 36.0},
                       "laplacian": {0: 36.0}}}
    rows = lra.summarise(acc)
    soft = next(r for r in rows if r["mixer"] == "soft")
    assert soft["listops_mean"] == 37.5 and soft["listops_n"] == 2 and soft["mean"] == 37.5
    verdicts = {(g["where"], g["goal"]): g["holds"] for g in lra.goals(rows)}
    assert verdicts[("listops", "soft ≥ nystromformer − 0.5")] is True           # 37.5 vs 38.0
    assert verdicts[("listops", "soft > linformer")] is True
    assert verdicts[("mean over tasks", "laplacian ≥ soft − 0.5")] is False      # 36.0 vs 37.5
