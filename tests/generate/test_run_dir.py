"""What `vitmix generate train --out DIR` may write into: the same rule as `vitmix train`
(tests/train/test_run_dir.py), since both prepare their run directory with vitmix.runs."""
import pytest

from vitmix.cli import main

TINY = ["--data", "digits", "--train-subset", "32", "--batch-size", "32", "--sample-steps", "2",
        "--grid-per-class", "1", "--fd-samples", "0", "--max-steps", "1", "--model-option", "embed_dim=32",
        "--model-option", "depth=1", "--model-option", "num_heads=2"]


def test_a_folder_that_is_not_a_run_is_refused_and_left_as_it_was(tmp_path, capsys):
    """Regression: `generate train --out userdir` wrote its run into a folder of the user's files."""
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "metrics.jsonl").write_text("my numbers\n")
    assert main(["generate", "train", "--out", str(user), "--epochs", "1", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitmix generate: error:") and "\n" not in err
    assert "non-empty directory that holds no vitmix run (it has metrics.jsonl)" in err
    assert [p.name for p in user.iterdir()] == ["metrics.jsonl"]
    assert (user / "metrics.jsonl").read_text() == "my numbers\n"


@pytest.mark.parametrize("flag,value,shown", [("--mixer-option", "lam=2", "--mixer-option"),
                                              ("--sample-steps", "1", "--sample-steps")])
def test_a_resume_that_changes_the_run_names_the_flag(tmp_path, capsys, flag, value, shown):
    out = tmp_path / "run"
    assert main(["generate", "train", "--out", str(out), "--epochs", "1", *TINY]) == 0
    capsys.readouterr()
    assert main(["generate", "train", "--out", str(out), "--resume", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--resume: {shown} " in err and "differs from the run's" in err and "\n" not in err


def test_a_run_that_diverged_before_its_first_epoch_can_be_retried_in_the_same_out(tmp_path, capsys, monkeypatch):
    """Regression: a non-finite diffusion loss left no aborted.json, so the retry into the same --out was refused
    as "already holds a run" (vitmix train's rule, tests/train/test_run_dir.py, now shared by every task)."""
    import json

    from vitmix.models.diffusion import GaussianDiffusion

    out = tmp_path / "run"
    real = GaussianDiffusion.training_loss
    monkeypatch.setattr(GaussianDiffusion, "training_loss", lambda *a, **k: real(*a, **k) * float("nan"))
    assert main(["generate", "train", "--out", str(out), "--epochs", "1", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert "loss became nan" in err and "finished no epoch, so the retry may use the same --out" in err
    assert "\n" not in err and json.loads((out / "aborted.json").read_text())["reason"].startswith("the loss")
    monkeypatch.undo()
    assert main(["generate", "train", "--out", str(out), "--epochs", "1", *TINY]) == 0
    assert not (out / "aborted.json").exists() and (out / "state.pt").is_file()
