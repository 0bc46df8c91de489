"""benchmarks/gpu_check.sh: its dry run (every part in a tiny CPU form) proves the plumbing the GPU run
relies on; the training check's failure paths are forced with written logs and metrics."""
import importlib.util
import json
import math
import pathlib
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
PARTS = ("env", "triton", "parity", "train", "bench")


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("bench_script_gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_dry_run_runs_every_part_and_writes_the_summary(tmp_path):
    """About 40 s of CPU (2.5 min of wall time on a loaded 2-core machine); the script's dry-run limit is 480 s."""
    out = tmp_path / "out"
    ran = subprocess.run(["bash", str(SCRIPT), "--out", str(out), "--dry-run"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"},
                         timeout=540)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["bench-results.json", "bench-results.md", "logs.tar.gz",
                                                     "summary.md"]
    md = (out / "summary.md").read_text()
    table = [line.split("|")[1:-1] for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    parts = {cells[0].strip(): [c.strip() for c in cells] for cells in table if cells[0].strip() in PARTS}
    assert list(parts) == list(PARTS) and all(row[1] == "ok" for row in parts.values()), md
    assert all(float(row[2]) > 0 for row in parts.values())
    assert "skipped: no CUDA device" in parts["parity"][4] and "collected" in parts["triton"][4]
    assert parts["train"][4].startswith("train-laplacian: ok, last train loss")
    assert "| laplacian op ≥ 8× SDPA at N=16384" in md and md.startswith("# GPU check (dry run")
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"./logs/env.log", "./logs/train-laplacian.log", "./bench/results.json", "./env.json",
            "./parts.tsv"} <= names
    assert not any("/images/" in n for n in names)
    assert json.loads((out / "bench-results.json").read_text())["environment"]["device"] == "cpu"


def test_usage_errors_are_one_line_with_exit_2(tmp_path):
    for argv, message in ((["--dry-run"], "--out DIR is required"), (["--out", str(tmp_path), "--fast"],
                                                                     "unknown option --fast")):
        ran = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, timeout=60)
        assert ran.returncode == 2 and ran.stderr.count("\n") == 1 and message in ran.stderr


def _run(tmp_path, log: str, losses):
    run = tmp_path / "train-x"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": i, "train_loss": x, "val_loss": 0.5}) + "\n"
                                               for i, x in enumerate(losses)))
    (tmp_path / "x.log").write_text(log)
    return run, tmp_path / "x.log"


def test_train_check_passes_finite_losses(check, tmp_path, capsys):
    assert check.train_check(*_run(tmp_path, "epoch 1 ...\n", [0.9, 0.7])) == 0
    assert "train-x: ok, last train loss 0.7000" in capsys.readouterr().out


def test_train_check_fails_on_a_compile_fallback(check, tmp_path, capsys):
    log = ("UserWarning: vitmix: torch.compile failed (BackendCompilerFailed: ptxas error); training continues "
           "without compiling\n")
    assert check.train_check(*_run(tmp_path, log, [0.9])) == 1
    assert "torch.compile fell back to eager" in capsys.readouterr().out


@pytest.mark.parametrize("losses", [[0.9, math.nan], [math.inf], []])
def test_train_check_fails_on_a_non_finite_or_missing_loss(check, tmp_path, capsys, losses):
    assert check.train_check(*_run(tmp_path, "", losses)) == 1
    assert "FAIL" in capsys.readouterr().out
