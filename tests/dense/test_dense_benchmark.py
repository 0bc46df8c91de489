"""``experiments/dense/dense.py`` end to end at a tiny scale (synthetic garments as the Fashion-MNIST files, one
optimizer step per run): the table, CSV and JSON rows, the goals, and that a second call trains and measures
nothing, an interrupted run is continued with ``--resume`` and a run folder that is gone is read back from
the committed ``dense.json``."""
from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from .conftest import synthetic_garments

ROOT = Path(__file__).resolve().parents[2]
HAVE_COCO = importlib.util.find_spec("pycocotools") is not None


def _load():
    spec = importlib.util.spec_from_file_location("bench_script_dense", ROOT / "experiments" / "dense" / "dense.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def fashion_dir(tmp_path):
    """A folder with the four Fashion-MNIST files, holding synthetic garments."""
    garments, labels = synthetic_garments()
    root = tmp_path / "fashion-mnist"
    root.mkdir()
    for stem in ("train", "t10k"):
        _write_idx(root / f"{stem}-images-idx3-ubyte.gz", garments)
        _write_idx(root / f"{stem}-labels-idx1-ubyte.gz", labels)
    return root


def _never(*_args, **_kwargs):
    raise AssertionError("trained or measured again")


@pytest.mark.slow
def test_dense_benchmark_end_to_end_then_resumes(tmp_path, fashion_dir, monkeypatch):
    import vitmix.dense.runner as runner

    dense = _load()
    runs, out = tmp_path / "runs", tmp_path / "out"
    # detection is scored with pycocotools (the `dense` extra): without it, the segmentation tasks alone
    tasks = ("segment-64", "segment-128") + (("detect-64",) if HAVE_COCO else ())
    argv = ["--quick", "--max-steps", "1", "--backbones", "laplacian", "--seeds", "0",
            "--tasks", ",".join(tasks), "--threads", "1", "--memory-batch", "2",
            "--data-dir", str(fashion_dir), "--runs-dir", str(runs), "--out", str(out)]
    assert dense.main(argv) == 0

    md = (out / "dense.md").read_text()
    assert "| laplacian |" in md and "## Goals" in md and "## Recipe" in md
    assert "backbone GFLOPs 64² → 128²" in md and "rise of the peak RSS" in md
    # growth of both costs of the linear backbone; laplacian ≥ soft is not asked (no soft): 2 goals
    assert md.count("from 64² to 128² (goal ≤ 4.5×)") == 2
    with open(out / "dense.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["backbone"] for r in rows] == ["laplacian"]
    for r in rows:
        assert 0 <= float(r["segment-64_mIoU_mean"]) <= 100 and float(r["segment-128_mIoU_n"]) == 1
        assert 0 < float(r["gflops_64"]) < float(r["gflops_128"]) and float(r["peak_mib_128"]) > 0
        assert float(r[f"train_img_s_{tasks[-1]}"]) > 0 and float(r["gflops_ratio"]) > 1
        if HAVE_COCO:
            assert float(r["detect-64_mask_AP_n"]) == 1
    data = json.loads((out / "dense.json").read_text())
    assert [(r["key"], r["backbone"], r["status"]) for r in data["runs"]] == [
        (k, "laplacian", "done") for k in tasks]
    assert len(data["goals"]) == 2 and (out / "dense.png").stat().st_size > 0
    # each run says where it trained (a sweep may be resumed on another machine); one device: no summary line
    assert {r["device"] for r in data["runs"]} == {"cpu"} and "Runs trained on" not in md
    assert "| trained on |" in md and md.count("| cpu |") == len(tasks)

    # again: every run is finished and every cost cached, so nothing is trained or measured
    monkeypatch.setattr(dense, "measure_costs", _never)
    real_train = runner.train_dense
    monkeypatch.setattr(runner, "train_dense", _never)
    assert dense.main(argv) == 0
    before = json.loads((out / "dense.json").read_text())
    assert before["rows"] == data["rows"]
    # --report-only rewrites the results but keeps the command and machine that trained in the header
    assert dense.main(argv + ["--report-only"]) == 0
    rewritten = json.loads((out / "dense.json").read_text())
    assert (rewritten["command"], rewritten["environment"]) == (before["command"], before["environment"])
    assert "--report-only" not in (out / "dense.md").read_text().splitlines()[2]

    # an interrupted run (no summary.json yet) is continued with --resume, and only it
    (runs / "segment-128" / "laplacian" / "seed-0" / "summary.json").unlink()
    resumed = []
    monkeypatch.setattr(runner, "train_dense", lambda cfg, log=print: resumed.append(cfg) or real_train(cfg, log))
    assert dense.main(argv) == 0
    assert [(c.model, c.img_size, c.resume) for c in resumed] == [("laplacianformer_nano", 128, True)]

    # a run folder that is gone (a fresh checkout) is read back from the committed dense.json
    shutil.rmtree(runs / "segment-64" / "laplacian")
    monkeypatch.setattr(runner, "train_dense", _never)
    assert dense.main(argv) == 0
    statuses = {(r["key"], r["backbone"]): r["status"] for r in json.loads((out / "dense.json").read_text())["runs"]}
    assert statuses[("segment-64", "laplacian")] == "committed" and statuses[("segment-128", "laplacian")] == "done"

    # --jobs 2: the missing runs train at once, each in its own `python -m vitmix dense train` process (the
    # in-process trainer, patched to fail, is not used), its output in <run_dir>.log
    for key in ("segment-64", "segment-128"):
        shutil.rmtree(runs / key / "laplacian", ignore_errors=True)
    (out / "dense.json").unlink()
    assert dense.main(argv + ["--jobs", "2"]) == 0
    data = json.loads((out / "dense.json").read_text())
    assert {(r["key"], r["status"]) for r in data["runs"]} == {(k, "done") for k in tasks}
    for key in ("segment-64", "segment-128"):
        assert "epoch" in (runs / key / "laplacian" / "seed-0.log").read_text()


def test_the_report_counts_the_devices_of_a_mixed_sweep():
    dense = _load()
    records = [{"status": "committed", "device": "cpu"}, {"status": "done", "device": "cuda:0"},
               {"status": "done", "device": "cuda:0"}, {"status": "missing"}]
    assert dense._devices_line(records) == (" Runs trained on: cpu (1), cuda (2) (the *trained on* column of "
                                            "*Runs*).")
    assert dense._devices_line(records[1:]) == ""       # one device: the header already says which
    assert dense._device_name(None) == "–"              # summaries written before the device was recorded


def test_runs_in_percent_and_committed_fractions_are_tabulated_alike():
    """dense.json keeps fractions (the committed runs); a run that says its mIoU is in percent is read as such."""
    dense = _load()
    now = {"final": {"mIoU": 30.5, "box_AP": 0.3}, "units": {"mIoU": "%", "pixel_accuracy": "%"}}
    before = {"final": {"mIoU": 0.305}}
    assert dense._fraction(now, "mIoU") == pytest.approx(0.305) == dense._fraction(before, "mIoU")
    assert dense._fraction(now, "box_AP") == 0.3 and dense._fraction(now, "mask_AP") is None


def test_quick_runs_never_write_the_committed_folder():
    dense = _load()
    segment = ["--tasks", "segment-128"]
    assert dense.parse_args(["--quick", *segment]).out == Path("runs/dense-bench-quick/results")
    assert dense.parse_args(segment).out == ROOT / "experiments" / "dense" / "results"


def test_a_study_backbone_passes_its_mixer_options_to_training_and_costs(tmp_path, monkeypatch):
    dense = _load()
    args = dense.parse_args(["--backbones", "laplacian-4x4", "--tasks", "segment-128", "--seeds", "0",
                             "--runs-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    (run,) = dense.plan(args)
    argv = dense.train_argv(run, args, resume=False)
    assert argv[argv.index("--model") + 1] == "laplacianformer_nano" and "--mixer" not in argv
    assert argv[argv.index("-M") + 1] == "num_landmarks=16"
    assert dense.backbone_flags("laplacian-4x4") == "--model laplacianformer_nano -M num_landmarks=16"
    assert dense.backbone_flags("softmax") == "--model laplacianformer_nano --mixer softmax"
    # the cost pass builds the same backbone: a fixed 4×4 grid where the default rule gives 7×7 (64×64 tokens)
    import vitmix.dense.heads as heads

    built, real = [], heads.DenseBackbone
    monkeypatch.setattr(heads, "DenseBackbone", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    monkeypatch.setattr(dense, "train_speed", lambda *a, **kw: 1.0)
    dense.cost_worker(dict(dense.cost_spec("laplacian-4x4", args), sizes=[256], memory_batch=1, threads=1))
    stage1 = next(m for m in built[0].modules() if hasattr(m, "landmark_count"))
    assert stage1.landmark_count(64, 64) == (4, 4)


def test_unknown_backbones_are_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        _load().parse_args(["--backbones", "laplacian-8x8"])
    assert "unknown laplacian-8x8 (choose from laplacian, soft, weightformer, softmax, resnet18, laplacian-4x4)" in (
        capsys.readouterr().err)


def test_jobs_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        _load().parse_args(["--tasks", "segment-128", "--jobs", "0"])
    assert "--jobs 0: must be at least 1" in capsys.readouterr().err


def test_detection_tasks_without_pycocotools_stop_before_any_run(without_pycocotools, capsys):
    dense = _load()
    with pytest.raises(SystemExit) as stop:
        dense.parse_args([])                       # the default tasks include detect-256
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "needs pycocotools" in err and "--tasks segment-128,segment-256" in err
    assert dense.parse_args(["--tasks", "segment-128"]).tasks == ["segment-128"]
