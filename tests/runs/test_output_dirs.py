"""Every command that writes a folder (compare, bench, eval --corruptions, analyze) follows train's rule
(issue 44 item 2): a new or empty folder, or one holding the command's own earlier output, may be
written; a folder of other files is refused in one line before any work, and left as it was."""
import hashlib
import shutil

import pytest

from vitmix.cli import main
from vitmix.runs import check_output_dir
from vitmix.train import TrainConfig, train

TRAIN = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, warmup_epochs=0,
             model_options={"depth": 1, "embed_dim": 32, "num_heads": 2}, mixer="softmax", train_subset=64)
COMPARE = ["compare", "--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16", "--batch-size", "64",
           "--warmup-epochs", "0", "--model-option", "depth=1", "--model-option", "embed_dim=32", "--model-option",
           "num_heads=2", "--train-subset", "64", "--epochs", "1", "--max-steps", "1", "--mixers", "softmax"]
BENCH = ["bench", "--mixers", "softmax", "--tokens", "16", "--dim", "16", "--heads", "2", "--passes", "fwd",
         "--min-run-time", "0.01", "--no-flops", "--no-memory", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    train(TrainConfig(**TRAIN, epochs=1, max_steps=1, out=str(out)), log=lambda *a: None)
    return out


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _user_folder(tmp_path, *names):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"my own {name}\n")
    return folder


def _refused(argv, folder, capsys, what):
    before = _tree(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"--out {folder} is a non-empty directory that holds no {what}" in err[0]
    assert "give a new or empty directory, so that no file of yours is overwritten" in err[0]
    assert _tree(folder) == before


def test_compare_refuses_a_folder_of_the_users_files(tmp_path, capsys, monkeypatch):
    """Regression: `vitmix compare --out DIR` replaced the user's leaderboard.md and runs.csv, exit 0."""
    from vitmix.compare import runner

    monkeypatch.setattr(runner, "train_entry", lambda *a, **k: pytest.fail("an entry was trained"))
    folder = _user_folder(tmp_path, "leaderboard.md", "runs.csv")
    _refused([*COMPARE, "--out", str(folder)], folder, capsys, "vitmix comparison (it has leaderboard.md)")


def test_compare_reruns_into_its_own_folder(tmp_path):
    out = tmp_path / "cmp"
    assert main([*COMPARE, "--out", str(out)]) == 0
    assert main([*COMPARE, "--out", str(out)]) == 0          # read back, leaderboard rewritten
    assert (out / "leaderboard.md").is_file()


def test_bench_refuses_a_folder_of_the_users_files(tmp_path, capsys, monkeypatch):
    """Regression: `vitmix bench --out DIR` replaced the user's results.csv, exit 0."""
    from vitmix.bench import sweep

    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    folder = _user_folder(tmp_path, "results.csv")
    _refused([*BENCH, "--out", str(folder)], folder, capsys, "vitmix bench results (it has results.csv)")


def test_bench_refreshes_its_own_results(tmp_path):
    out = tmp_path / "bench"
    assert main([*BENCH, "--out", str(out)]) == 0
    (out / "results.csv").write_text("stale\n")
    assert main([*BENCH, "--out", str(out)]) == 0
    assert (out / "results.csv").read_text().startswith("kind,name,")


def test_eval_corruptions_refuses_a_folder_of_the_users_files(run, tmp_path, capsys, monkeypatch):
    """Regression: `vitmix eval RUN --corruptions --out DIR` replaced the user's corruptions.md, exit 0."""
    from vitmix.train import runner

    folder = _user_folder(tmp_path, "corruptions.md", "notes.txt")
    with monkeypatch.context() as m:
        m.setattr(runner, "_load_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was loaded"))
        _refused(["eval", str(run), "--corruptions", "contrast", "--severities", "1", "--out", str(folder)],
                 folder, capsys, "corruption report (it has corruptions.md)")
    report = tmp_path / "report"                 # its own earlier report is refreshed
    for _ in range(2):
        assert main(["eval", str(run), "--corruptions", "contrast", "--severities", "1", "--out", str(report)]) == 0
    assert sorted(p.name for p in report.iterdir()) == ["corruptions.csv", "corruptions.json", "corruptions.md",
                                                        "corruptions.png"]


def test_the_rule(tmp_path):
    check_output_dir(tmp_path / "new", ("marker.json",), "thing")
    check_output_dir(tmp_path, ("marker.json",), "thing")                  # empty
    (tmp_path / "marker.json").write_text("{}")
    (tmp_path / "other").write_text("")
    check_output_dir(tmp_path, ("marker.json",), "thing")                  # its own output
    with pytest.raises(ValueError, match=r"holds no thing \(it has marker.json\)"):
        check_output_dir(tmp_path, ("result.json",), "thing")
    with pytest.raises(ValueError, match="is a file; give a directory for the thing"):
        check_output_dir(tmp_path / "other", ("marker.json",), "thing")


def test_analyze_refuses_a_folder_of_the_users_files(tmp_path, capsys, monkeypatch):
    """`vitmix analyze --out DIR` replaced the user's files of the analysis' names, exit 0."""
    from vitmix.analysis import approx

    monkeypatch.setattr(approx, "run", lambda **k: pytest.fail("the analysis ran"))
    folder = _user_folder(tmp_path, "approx.md")
    _refused(["analyze", "approx", "--out", str(folder)], folder, capsys, "vitmix analysis (it has approx.md)")
    (folder / "newton.json").write_text("{}")            # an earlier analysis' output: the folder is vitmix's
    with pytest.raises(pytest.fail.Exception, match="the analysis ran"):
        main(["analyze", "approx", "--out", str(folder)])


def test_eval_corruptions_without_out_never_replaces_a_users_report_beside_the_checkpoint(run, tmp_path, capsys):
    """The default report folder is the checkpoint's: a corruptions.md there that no report wrote is kept."""
    folder = _user_folder(tmp_path, "corruptions.md")
    shutil.copy(run / "best.safetensors", folder / "model.safetensors")
    before = _tree(folder)
    assert main(["eval", str(folder / "model.safetensors"), "--corruptions", "contrast", "--severities", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{folder} holds corruptions.md, which no corruption report wrote: give --out DIR" \
        in err[0], err
    assert _tree(folder) == before
