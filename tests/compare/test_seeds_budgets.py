"""`vitmix compare --seeds` and `--budget` on digits: per-seed runs, resume across seeds, a failing seed,
equal-FLOP and equal-time step counts, the learning curves, and bad input before any training."""
import json
import shutil
import statistics

import pytest

from vitmix.cli import main
from vitmix.compare import aggregate, budget, runner
from vitmix.compare.leaderboard import markdown, ranked

TINY = ["--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16", "--batch-size", "64",
        "--lr", "0.003", "--warmup-epochs", "0", "--model-option", "depth=1", "--model-option", "embed_dim=32",
        "--model-option", "num_heads=2", "--train-subset", "256", "--epochs", "1"]
TWO = ["--mixers", "softmax", "--models", "weightformer_nano_patch4_32"]
LABELS = ("softmax", "weightformer_nano_patch4_32")


def _board(out):
    return json.loads((out / "leaderboard.json").read_text())


def _spy_train(monkeypatch):
    """Record (entry dir, seed, resume) of every run that trains, and train it for real."""
    calls, real = [], runner.train

    def train(cfg, **kwargs):
        calls.append((cfg.out.split("/")[-2], cfg.seed, cfg.resume))
        return real(cfg, **kwargs)

    monkeypatch.setattr(runner, "train", train)
    return calls


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """Two entries, seed 0 first, then seeds 0,1 (seed 0 must be read back, seed 1 trained)."""
    out = tmp_path_factory.mktemp("seeds") / "digits"
    assert main(["compare", *TINY, *TWO, "--seeds", "0", "--out", str(out)]) == 0
    first = {label: (out / label / "seed-0" / "result.json").read_text() for label in LABELS}
    with pytest.MonkeyPatch.context() as mp:
        calls = _spy_train(mp)
        assert main(["compare", *TINY, *TWO, "--seeds", "0,1", "--out", str(out)]) == 0
    return out, first, calls


def test_each_seed_is_a_run_and_earlier_seeds_are_read_back(seeded):
    out, first, calls = seeded
    assert sorted(calls) == [("softmax", 1, False), ("weightformer_nano_patch4_32", 1, False)]
    for label in LABELS:
        assert (out / label / "seed-0" / "result.json").read_text() == first[label]
        assert (out / label / "seed-1" / "summary.json").is_file()
    board = _board(out)
    assert board["seeds"] == [0, 1] and board["budget"] == "epochs"
    for row in board["rows"]:
        runs = [json.loads((out / row["entry"] / f"seed-{s}" / "result.json").read_text()) for s in (0, 1)]
        assert row["n"] == 2 and row["seeds"] == [0, 1] and [r["seed"] for r in row["runs"]] == [0, 1]
        for key in ("top1", "train_images_per_s", "latency_ms"):
            values = [r[key] for r in runs]
            assert row[key] == pytest.approx(statistics.fmean(values))
            assert row[f"{key}_std"] == pytest.approx(statistics.stdev(values))
    assert [r["top1"] for r in board["rows"]] == sorted((r["top1"] for r in board["rows"]), reverse=True)
    assert board["rows"][0]["p_vs_best"] is None and "within_noise" in board["rows"][1]
    runs_csv = (out / "runs.csv").read_text().splitlines()
    assert runs_csv[0].startswith("entry,seed,status,top1") and len(runs_csv) == 5
    assert "top1_std" in (out / "leaderboard.csv").read_text().splitlines()[0]
    table = (out / "leaderboard.md").read_text()
    assert "| n |" in table and "| vs #1 |" in table and "Welch" in table and "| best |" in table
    for name in ("accuracy_vs_throughput.png", "loss_curves.png", "learning_curves.png"):
        assert (out / name).stat().st_size > 0


def test_an_interrupted_seed_resumes_and_the_others_are_read_back(seeded, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(seeded[0], out)
    (out / "softmax" / "seed-1" / "result.json").unlink()
    (out / "softmax" / "seed-1" / "summary.json").unlink()      # killed after its checkpoint
    calls = _spy_train(monkeypatch)
    assert main(["compare", *TINY, *TWO, "--seeds", "0,1", "--out", str(out)]) == 0
    assert calls == [("softmax", 1, True)]
    row = next(r for r in _board(out)["rows"] if r["entry"] == "softmax")
    assert row["n"] == 2 and row["runs"][1]["run_dir"] == str(out / "softmax" / "seed-1")


def test_a_failing_seed_is_marked_and_the_rest_is_reported(seeded, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(seeded[0], out)
    real = runner.train

    def train(cfg, **kwargs):
        if cfg.mixer is None and cfg.seed == 2:
            raise RuntimeError("forced failure in seed 2")
        return real(cfg, **kwargs)

    monkeypatch.setattr(runner, "train", train)
    assert main(["compare", *TINY, *TWO, "--seeds", "0,1,2", "--out", str(out)]) == 0
    rows = {r["entry"]: r for r in _board(out)["rows"]}
    wf, softmax = rows["weightformer_nano_patch4_32"], rows["softmax"]
    assert wf["status"] == "ok" and wf["n"] == 2 and wf["failed_seeds"] == [2]
    assert wf["error"].startswith("RuntimeError: forced failure in seed 2")
    assert [r["status"] for r in wf["runs"]] == ["ok", "ok", "failed"]
    assert softmax["n"] == 3 and softmax["failed_seeds"] == []
    assert "ok; seed 2 failed: RuntimeError: forced failure" in (out / "leaderboard.md").read_text()
    assert "failed" in (out / "runs.csv").read_text()


def test_a_one_seed_comparison_is_reused_by_seeds(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--mixers", "softmax", "--out", str(out)]) == 0
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("the seed-0 run was retrained"))
    monkeypatch.setattr(runner, "measure_model", lambda *a, **k: pytest.fail("the seed-0 run was re-measured"))
    assert main(["compare", *TINY, "--mixers", "softmax", "--seeds", "0", "--out", str(out)]) == 0
    assert (out / "softmax" / "seed-0" / "last.safetensors").is_file() and not (out / "softmax" / "state.pt").exists()
    assert _board(out)["rows"][0]["runs"][0]["run_dir"] == str(out / "softmax" / "seed-0")
    # and a per-seed comparison is not rerun as a one-seed one
    assert main(["compare", *TINY, "--mixers", "softmax", "--out", str(out)]) == 2


def test_flops_budget_gives_every_entry_the_same_training_flops(tmp_path):
    """softmax and nystromformer differ 2.7x in forward FLOPs: the same budget buys them different steps."""
    out = tmp_path / "flops"
    flops = 5.3e8
    assert main(["compare", *TINY, "--mixers", "softmax,nystromformer", "--budget", f"flops={flops:g}",
                 "--out", str(out)]) == 0
    rows = {r["entry"]: r for r in _board(out)["rows"]}
    plans = json.loads((out / "budget.json").read_text())
    assert plans["budget"] == "flops=5.3e+08"
    for label, row in rows.items():
        step_cost = 3 * row["gflops"] * 1e9 * 64            # 3 × forward FLOPs per image × batch
        summary = json.loads((out / label / "summary.json").read_text())
        assert row["steps"] == summary["steps"] == int(flops // step_cost) == plans["entries"][label]["max_steps"]
        assert flops - step_cost < row["train_flops"] <= flops
        assert summary["epochs_run"] == -(-row["steps"] // 4)         # 4 steps of 64 images per epoch
        learning = row["runs"][0]["learning"]
        assert learning["images"][-1] == row["images"] == row["steps"] * 64
        assert learning["flops"][-1] == pytest.approx(row["train_flops"])
        history = [json.loads(x) for x in (out / label / "metrics.jsonl").read_text().splitlines()]
        assert history[-1]["lr"] == pytest.approx(1e-5, rel=0.05)    # the cosine schedule ends with the budget
    assert rows["softmax"]["steps"] > rows["nystromformer"]["steps"]
    assert "Budget `--budget flops=5.3e+08`" in (out / "leaderboard.md").read_text()
    assert (out / "learning_curves.png").stat().st_size > 0


def test_time_budget_is_converted_to_steps_once(tmp_path, monkeypatch):
    out = tmp_path / "time"
    monkeypatch.setattr(runner, "calibrate_step_seconds", lambda *a, **k: 0.5)
    assert main(["compare", *TINY, "--mixers", "softmax", "--budget", "time=2.2", "--out", str(out)]) == 0
    plan = json.loads((out / "budget.json").read_text())["entries"]["softmax"]
    assert (plan["step_seconds"], plan["max_steps"], plan["epochs"]) == (0.5, 4, 1)
    assert _board(out)["rows"][0]["steps"] == 4
    monkeypatch.setattr(runner, "calibrate_step_seconds", lambda *a, **k: pytest.fail("calibrated twice"))
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("retrained"))
    assert main(["compare", *TINY, "--mixers", "softmax", "--budget", "time=2.2", "--out", str(out)]) == 0


def test_a_run_stopped_by_max_steps_is_finished(tmp_path, monkeypatch):
    """--max-steps 2 ends the run inside its first of 2 epochs: a rerun must read it back, not resume it."""
    out = tmp_path / "steps"
    args = ["compare", *TINY, "--mixers", "softmax", "--epochs", "2", "--max-steps", "2", "--out", str(out)]
    assert main(args) == 0
    assert _board(out)["rows"][0]["steps"] == 2
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    monkeypatch.setattr(runner, "measure_model", lambda *a, **k: pytest.fail("a finished run was re-measured"))
    assert main(args) == 0


@pytest.mark.parametrize("flags, message", [
    (["--seeds", ""], "--seeds is empty"),
    (["--seeds", " , "], "--seeds is empty"),
    (["--seeds", "0,1,0"], "seed 0 given twice"),
    (["--seeds", "0,one"], "'one' is not an integer"),
    (["--seeds", "0,1", "--seed", "3"], "--seed and --seeds"),
    (["--budget", "steps=3"], "give epochs, time=SECONDS or flops=N"),
    (["--budget", "flops=-1"], "must be a positive number"),
    (["--budget", "time=soon"], "'soon' is not a number"),
    (["--budget", "flops=1000"], "cannot be met: one training step of softmax takes"),
    (["--budget", "flops=1e12", "--max-steps", "3"], "--max-steps and --budget flops=1e+12"),
])
def test_bad_seeds_and_budgets_fail_before_any_training(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("trained despite bad input"))
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--mixers", "softmax", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_too_little_time_for_one_step_fails_before_any_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "calibrate_step_seconds", lambda *a, **k: 0.5)
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("trained despite bad input"))
    assert main(["compare", *TINY, "--mixers", "softmax", "--budget", "time=0.1", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "time=0.1 cannot be met: one training step of softmax takes 0.5 s" in err and err.count("\n") == 1


def test_another_budget_in_the_same_directory_is_refused(seeded, capsys, monkeypatch):
    out = seeded[0]
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("trained despite bad input"))
    assert main(["compare", *TINY, *TWO, "--seeds", "0,1", "--budget", "flops=1e12", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "made under --budget epochs, not flops=1e+12" in err and err.count("\n") == 1
    assert not (out / "budget.json").exists()


def test_welch_marks_overlapping_seeds_as_noise():
    def runs(entry, top1s):
        return [{"entry": entry, "seed": s, "status": "ok", "top1": v, "params": 1000} for s, v in enumerate(top1s)]

    rows = runs("a", [90.0, 95.0, 85.0]) + runs("b", [91.0, 86.0, 92.0]) + runs("c", [50.0, 51.0, 52.0]) \
        + runs("d", [60.0])
    board = {r["entry"]: r for r in ranked(rows)}
    assert [board[k]["rank"] for k in "abcd"] == [1, 2, 4, 3]
    assert board["b"]["within_noise"] is True and board["b"]["p_vs_best"] > 0.5
    assert board["c"]["within_noise"] is False and board["c"]["p_vs_best"] < 0.01
    assert board["d"]["p_vs_best"] is None                       # one seed: no test
    assert board["a"]["top1_std"] == pytest.approx(5.0) and board["a"]["params_std"] == 0
    table = markdown(rows, "t")
    assert "90.00 ± 5.00" in table and "≈ (p " in table and "| 1k |" in table      # no "± 0" on constants
    for run, gflops in zip(rows, [0.055362828, 0.055362816, 0.055362816]):    # counts 12 FLOPs apart
        run["gflops"] = gflops
    assert "| 0.0554 |" in markdown(rows, "t")           # a spread below the digits shown is no "± 0.0000"


def test_welch_p_matches_the_textbook_formula():
    a, b = [1.0, 2.0, 4.0, 7.0], [3.0, 5.0, 6.0]
    va, vb = statistics.variance(a) / 4, statistics.variance(b) / 3
    t = (statistics.fmean(a) - statistics.fmean(b)) / (va + vb) ** 0.5
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
    from scipy.stats import t as student

    assert aggregate.welch_p(a, b) == pytest.approx(2 * student.sf(abs(t), df))
    assert aggregate.welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0 and aggregate.welch_p([1.0, 1.0], [2.0, 2.0]) == 0.0


def test_steps_per_epoch_matches_the_trainer():
    assert budget.steps_per_epoch(256, 64) == 4 and budget.steps_per_epoch(300, 64) == 4
    assert budget.steps_per_epoch(50, 64) == 1 and budget.steps_per_epoch(256, 64, accum_steps=3) == 1
    assert budget.parse_seeds(None) is None and budget.parse_seeds("2, 0") == [2, 0]
    assert str(budget.parse_budget("flops=2e13")) == "flops=2e+13" and str(budget.parse_budget(None)) == "epochs"


def test_calibration_times_full_training_steps():
    """The time budget's exchange rate times forward, backward and the optimizer step (the weights move)."""
    import torch

    from vitmix import create_model
    from vitmix.train import TrainConfig

    model = create_model("vit_nano_patch4_32", mixer="softmax", img_size=16, in_chans=1, num_classes=10, depth=1,
                         embed_dim=32, num_heads=2)
    before = [p.detach().clone() for p in model.parameters()]
    seconds = budget.calibrate_step_seconds(model, TrainConfig(batch_size=8), 16, 1, 10, torch.device("cpu"))
    assert seconds > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_clearing_an_unstarted_run_never_deletes_per_seed_runs(tmp_path):
    """A folder holding per-seed runs has no state.pt of its own; it must not be taken for a run
    that died before its first checkpoint (which is cleared so it can restart)."""
    entry = tmp_path / "softmax"
    (entry / "seed-0").mkdir(parents=True)
    (entry / "seed-0" / "last.safetensors").write_bytes(b"kept")
    runner._clear_unstarted(entry)
    assert (entry / "seed-0" / "last.safetensors").read_bytes() == b"kept"
    died = tmp_path / "died"
    died.mkdir()
    (died / "config.yaml").write_text("seed: 0\n")
    runner._clear_unstarted(died)
    assert not died.exists()
