"""`vitmix compare` end to end on digits: leaderboard files, resume, failures as rows, bad input."""
import json

import pytest
import yaml

from vitmix.cli import main
from vitmix.compare import runner
from vitmix.compare.leaderboard import markdown
from vitmix.train import TrainConfig

TINY = ["--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16", "--batch-size", "64",
        "--lr", "0.003", "--warmup-epochs", "0", "--model-option", "depth=1", "--model-option", "embed_dim=32",
        "--model-option", "num_heads=2", "--train-subset", "256", "--epochs", "1"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "digits"
    code = main(["compare", *TINY, "--mixers", "softmax,laplacian", "--models", "weightformer_nano_patch4_32",
                 "--out", str(out)])
    return out, code


def test_leaderboard_files_and_rows(compared):
    out, code = compared
    assert code == 0
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "runs.csv", "accuracy_vs_throughput.png",
                 "loss_curves.png", "learning_curves.png", "compare.yaml"):
        assert (out / name).stat().st_size > 0, name
    board = json.loads((out / "leaderboard.json").read_text())
    rows = board["rows"]
    assert sorted(r["entry"] for r in rows) == ["laplacian", "softmax", "weightformer_nano_patch4_32"]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert [r["top1"] for r in rows] == sorted((r["top1"] for r in rows), reverse=True)
    for r in rows:
        summary = json.loads((out / r["entry"] / "summary.json").read_text())
        assert r["top1"] == summary["final_val_acc"] and r["params"] == summary["params"]
        assert r["gflops"] > 0 and r["latency_ms"] > 0 and r["train_images_per_s"] > 0
        assert r["peak_train_mb"] is None or r["peak_train_mb"] > 0
        assert r["n"] == 1 and [run["seed"] for run in r["runs"]] == [0]
        assert len(r["runs"][0]["curves"]["val_loss"]) == 1
        # the budget it used: 256 images / batch 64 = 4 steps, 3 × forward FLOPs per training image
        assert (r["steps"], r["images"]) == (4, 256) and r["budget"] == "epochs"
        assert r["train_flops"] == pytest.approx(256 * 3 * r["gflops"] * 1e9)
    assert board["recipe"]["train_subset"] == 256
    csv_lines = (out / "leaderboard.csv").read_text().splitlines()
    assert csv_lines[0].startswith("rank,entry,top1") and len(csv_lines) == 4
    manifest = yaml.safe_load((out / "compare.yaml").read_text())
    assert manifest["mixers"] == ["softmax", "laplacian"] and manifest["recipe"]["lr"] == 0.003
    # WeightFormer entered as a whole model with the same width/depth (attention-free: no num_heads)
    wf = yaml.safe_load((out / "weightformer_nano_patch4_32" / "config.yaml").read_text())
    assert wf["model_options"] == {"depth": 1, "embed_dim": 32} and wf["mixer"] is None


def test_rerun_reads_results_back_without_training(compared, monkeypatch):
    out, _ = compared
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("a finished entry was retrained"))
    monkeypatch.setattr(runner, "measure_model", lambda *a, **k: pytest.fail("a finished entry was re-measured"))
    before = (out / "softmax" / "result.json").read_text()
    assert main(["compare", *TINY, "--mixers", "softmax,laplacian", "--out", str(out)]) == 0
    assert (out / "softmax" / "result.json").read_text() == before


def test_corrupt_result_is_measured_again_not_retrained(compared, monkeypatch):
    out, _ = compared
    (out / "softmax" / "result.json").write_text("{not json")
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("a trained entry was retrained"))
    assert main(["compare", *TINY, "--mixers", "softmax", "--out", str(out)]) == 0
    assert json.loads((out / "softmax" / "result.json").read_text())["status"] == "ok"


def test_a_failing_entry_is_a_row_and_the_others_run(tmp_path, monkeypatch, capsys):
    real_train = runner.train

    def train(cfg, **kwargs):
        if cfg.mixer == "laplacian":
            raise RuntimeError("forced failure\nsecond line")
        return real_train(cfg, **kwargs)

    monkeypatch.setattr(runner, "train", train)
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--mixers", "laplacian,softmax", "--out", str(out)]) == 0
    rows = json.loads((out / "leaderboard.json").read_text())["rows"]
    assert [(r["entry"], r["status"]) for r in rows] == [("softmax", "ok"), ("laplacian", "failed")]
    assert rows[1]["error"].startswith("RuntimeError: forced failure second line")
    assert "failed: RuntimeError: forced failure" in (out / "leaderboard.md").read_text()
    # the failed entry is tried again on the next run, and now trains
    monkeypatch.setattr(runner, "train", real_train)
    assert main(["compare", *TINY, "--mixers", "laplacian,softmax", "--out", str(out)]) == 0
    rows = json.loads((out / "leaderboard.json").read_text())["rows"]
    assert all(r["status"] == "ok" for r in rows)


def test_corrupt_run_directory_is_reported_in_its_row(tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--mixers", "softmax", "--out", str(out)]) == 0
    (out / "softmax" / "result.json").unlink()
    (out / "softmax" / "summary.json").unlink()
    (out / "softmax" / "state.pt").write_bytes(b"garbage")
    assert main(["compare", *TINY, "--mixers", "softmax", "--out", str(out)]) == 1   # nothing trained
    row = json.loads((out / "leaderboard.json").read_text())["rows"][0]
    assert row["status"] == "failed" and "state.pt" in row["error"]


def test_unknown_names_fail_before_any_training(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--mixers", "softmax,lapalcian", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown mixer 'lapalcian'" in err and "laplacian" in err and "\n" == err[-1] and err.count("\n") == 1
    assert main(["compare", *TINY, "--models", "weightformer_nan", "--out", str(out)]) == 2
    assert "weightformer_nano_patch4_32" in capsys.readouterr().err
    assert main(["compare", *TINY, "--out", str(out)]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert not out.exists()


def test_another_recipe_in_the_same_directory_is_refused(compared, capsys):
    out, _ = compared
    assert main(["compare", *TINY, "--mixers", "softmax", "--lr", "0.1", "--out", str(out)]) == 2
    assert "lr: 0.003 -> 0.1" in capsys.readouterr().err


def test_markdown_orders_failed_rows_last():
    rows = [{"entry": "a", "status": "failed", "error": "ValueError: x | y"},
            {"entry": "b", "status": "ok", "top1": 50.0, "params": 1500},
            {"entry": "c", "status": "ok", "top1": 70.0, "params": 2_500_000}]
    table = markdown(rows, "t").splitlines()
    body = [line for line in table if line.startswith("| ") and not line.startswith("| #")]
    assert [line.split(" | ")[1] for line in body] == ["c", "b", "a"]
    assert "2.50M" in body[0] and "2k" in body[1] and "x \\| y" in body[2]


def test_entries_share_the_recipe():
    base = TrainConfig(model="vit_nano_patch4_32", data="digits", model_options={"depth": 2, "num_heads": 2})
    entries = runner.plan_entries(base, ["softmax", "soft"], ["weightformer_nano_patch4_32"], "out")
    assert [e.config.mixer for e in entries] == ["softmax", "soft", None]
    assert entries[2].config.model_options == {"depth": 2}
    assert {e.config.lr for e in entries} == {base.lr} and entries[1].run_dir.name == "soft"


def test_missing_dataset_is_one_error_before_any_entry(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = [a if a != "digits" else "fashion-mnist" for a in TINY]
    assert main(["compare", *args, "--data-dir", str(tmp_path / "nowhere"), "--mixers", "softmax,soft",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere" in err and "apt-get install dataset-fashion-mnist" in err
    assert not out.exists()


def test_corruptions_are_added_without_retraining(compared, monkeypatch):
    out, _ = compared
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("a trained entry was retrained"))
    args = ["compare", *TINY, "--mixers", "softmax", "--out", str(out), "--corruptions", "gaussian_noise,contrast",
            "--severities", "1,5", "--corruption-images", "50"]
    assert main(args) == 0
    row = json.loads((out / "leaderboard.json").read_text())["rows"][0]
    assert set(row["corruptions"]) == {"gaussian_noise", "contrast"}
    assert row["corruption_settings"]["images"] == 50 and row["corruption_settings"]["severities"] == [1, 5]
    report = json.loads((out / "softmax" / "corruptions.json").read_text())
    assert report["images"] == 50 and report["mean"] == row["corruption_acc"]
    assert "corrupted %" in (out / "leaderboard.md").read_text()
    # the same request again is read back; another one is measured again (still without training)
    before = (out / "softmax" / "result.json").read_text()
    assert main(args) == 0
    assert (out / "softmax" / "result.json").read_text() == before
    assert main([*args[:-1], "40"]) == 0
    assert json.loads((out / "softmax" / "result.json").read_text())["corruption_settings"]["images"] == 40


def test_remeasure_updates_costs_and_keeps_accuracy(compared, monkeypatch):
    out, _ = compared
    before = json.loads((out / "softmax" / "result.json").read_text())
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("remeasure retrained"))
    monkeypatch.setattr(runner, "measure_model", lambda *a, **k: {"latency_ms": 123.0, "train_images_per_s": 7.0})
    assert main(["compare", *TINY, "--mixers", "softmax", "--out", str(out), "--remeasure"]) == 0
    after = json.loads((out / "softmax" / "result.json").read_text())
    assert (after["latency_ms"], after["train_images_per_s"]) == (123.0, 7.0)
    assert after["top1"] == before["top1"] and after["params"] == before["params"]
