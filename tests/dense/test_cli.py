"""``vitmix dense train | eval`` end to end on small synthetic folders (a mask folder and a COCO folder
written from synthetic-garment scenes, so no Fashion-MNIST is needed), plus one fashion-scenes run
on the real data: run directory, prediction PNGs, exact resume after a kill, torchrun, ``vitmix
eval``/``export`` of dense runs, and one-line errors before anything is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitmix.cli import main
from vitmix.runs import load_weights

from .conftest import synthetic_garments

SIZE = 64
TINY = ["--img-size", str(SIZE), "--batch-size", "4", "--preview", "2"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A mask folder and a COCO folder of 8 train and 8 val synthetic scenes at 64²."""
    pytest.importorskip("pycocotools", reason="the COCO folder needs pycocotools (pip install 'vitmix[dense]')")
    from vitmix.dense.coco import save_coco
    from vitmix.dense.maskfolder import save_mask_folder
    from vitmix.dense.scenes import FashionScenes

    root = tmp_path_factory.mktemp("dense-data")
    garments = synthetic_garments()
    for split in ("train", "val"):
        scenes = FashionScenes(*garments, size=SIZE, length=8, split=split)
        save_mask_folder(scenes, root / "masks", split)
        save_coco(scenes, root / "coco", split)
    return root


def _segment(folders, out, *extra):
    return main(["dense", "train", "--data", "maskfolder", "--data-dir", str(folders / "masks"), "--num-classes", "11",
                 *TINY, "--out", str(out), *extra])


def _fails(argv, capsys, message):
    """``vitmix ARGV`` exits with status 2 and one error line matching ``message``."""
    import re

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def _history(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def seg_run(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("seg") / "run"
    assert _segment(folders, out, "--epochs", "2") == 0
    return out


def test_segment_run_directory_metrics_and_prediction_png(seg_run):
    for name in ("config.yaml", "last.safetensors", "best.safetensors", "metrics.jsonl", "state.pt", "summary.json",
                 "predictions/epoch-001.png", "predictions/epoch-002.png"):
        assert (seg_run / name).is_file(), name
    history = _history(seg_run)
    assert [h["epoch"] for h in history] == [1, 2] and history[-1]["step"] == 4     # 8 images / batch 4
    for h in history:
        assert 0 <= h["mIoU"] <= 100 and 0 <= h["pixel_accuracy"] <= 100 and h["train_loss"] > 0
    # 2 preview rows of (image, ground truth, prediction), 64 px tiles with 2 px padding
    assert Image.open(seg_run / "predictions" / "epoch-002.png").size == (3 * 66 + 2, 2 * 66 + 2)
    meta = load_weights(seg_run / "best.safetensors")[1]
    assert (meta["task"], meta["num_classes"], meta["img_size"]) == ("segmentation", 11, SIZE)
    best = max(h["mIoU"] for h in history)
    assert meta["best_score"] == pytest.approx(best)
    summary = json.loads((seg_run / "summary.json").read_text())
    assert summary["best_mIoU"] == pytest.approx(best) and summary["final"]["mIoU"] == history[-1]["mIoU"]
    # percent, as vitmix train's accuracies (mostly background pixels: far above 1 %, a fraction never is)
    assert summary["units"] == {"mIoU": "%", "pixel_accuracy": "%"} and history[-1]["pixel_accuracy"] > 1


def test_vitmix_eval_of_a_dense_run_reports_its_task_metrics(seg_run, tmp_path, capsys):
    results = tmp_path / "r.json"
    assert main(["eval", str(seg_run), "--results-file", str(results)]) == 0
    line = capsys.readouterr().out
    assert "segment on maskfolder: mIoU" in line and "pixel acc" in line and "(8 images)" in line
    got = json.loads(results.read_text())
    best = load_weights(seg_run / "best.safetensors")[1]["best_score"]
    assert got["mIoU"] == pytest.approx(best, abs=1e-12)          # the same weights on the same scenes
    assert main(["dense", "eval", str(seg_run / "last.safetensors")]) == 0
    assert f"mIoU {_history(seg_run)[-1]['mIoU']:.2f} %" in capsys.readouterr().out
    _fails(["eval", str(seg_run), "--corruptions", "all"], capsys, "--corruptions is for classifiers")


def test_a_segmenter_exports_and_a_detector_is_refused(seg_run, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "seg.onnx"
    assert main(["export", "--model", "laplacianformer_nano", "--checkpoint", str(seg_run), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.is_file() and f"logits: float32 [batch, 11, {SIZE}, {SIZE}]" in text and ": ok" in text


# Runs `vitmix dense train ARGS...` and SIGKILLs itself right after the second epoch's last.safetensors
# is written, before that epoch's state.pt: the run dies holding a partial checkpoint set.
KILL_DRIVER = """
import os, signal, sys
from vitmix.dense import runner
real = runner.save_weights
calls = []
def dying(model, path, meta):
    real(model, path, meta)
    calls.append(path.name)
    if path.name == "last.safetensors" and meta["epoch"] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
runner.save_weights = dying
from vitmix.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_resume_after_kill_9_while_saving_matches_an_uninterrupted_run(folders, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _segment(folders, straight, "--epochs", "3") == 0
    args = ["dense", "train", "--data", "maskfolder", "--data-dir", str(folders / "masks"), "--num-classes", "11",
            *TINY, "--epochs", "3", "--out", str(killed)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    dead = subprocess.run([sys.executable, "-c", KILL_DRIVER, *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert dead.returncode == -9, dead.stderr[-2000:]
    assert len(_history(killed)) == 1                              # epoch 2's set never completed
    assert main(["dense", "train", "--out", str(killed), "--resume"]) == 0
    a, b = load_weights(straight / "last.safetensors")[0], load_weights(killed / "last.safetensors")[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [h["train_loss"] for h in _history(straight)] == [h["train_loss"] for h in _history(killed)]


def test_resuming_a_run_saved_with_fractional_scores_keeps_one_unit(folders, tmp_path):
    """A segmentation run saved while mIoU was a fraction (its state.pt has no ``percent`` entry) is resumed in
    percent throughout: its earlier epochs and best score are rescaled, so the next epoch's percent mIoU is not
    compared with a fraction (which would always replace best.safetensors)."""
    out = tmp_path / "old"
    assert _segment(folders, out, "--epochs", "1") == 0
    (first,) = _history(out)
    state = torch.load(out / "state.pt", weights_only=True)
    old = {k: v for k, v in state.items() if k != "percent"}
    old["history"] = [{k: v / 100 if k in ("mIoU", "pixel_accuracy") else v for k, v in h.items()}
                      for h in state["history"]]
    old["best_score"] = state["best_score"] / 100
    torch.save(old, out / "state.pt")
    assert main(["dense", "train", "--out", str(out), "--resume", "--epochs", "2"]) == 0
    again, second = _history(out)
    assert again["mIoU"] == pytest.approx(first["mIoU"]) and again["pixel_accuracy"] == pytest.approx(
        first["pixel_accuracy"])
    assert torch.load(out / "state.pt", weights_only=True)["best_score"] == pytest.approx(
        max(first["mIoU"], second["mIoU"]))


def test_a_run_that_diverged_before_its_first_epoch_can_be_retried_in_the_same_out(folders, tmp_path, capsys,
                                                                                   monkeypatch):
    """Regression: a non-finite loss left no aborted.json, so the retry into the same --out was refused as
    "already holds a run" (vitmix train's rule, tests/train/test_run_dir.py, now shared by every task)."""
    from vitmix.dense import runner

    out = tmp_path / "run"
    real = runner._loss
    monkeypatch.setattr(runner, "_loss", lambda *a, **k: real(*a, **k) * float("nan"))
    capsys.readouterr()
    assert _segment(folders, out, "--max-steps", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]      # after the progress bar's line
    assert err.startswith("vitmix dense: error: the loss became nan")
    assert err.endswith("finished no epoch, so the retry may use the same --out")
    assert json.loads((out / "aborted.json").read_text())["reason"].startswith("the loss became nan")
    monkeypatch.undo()
    assert _segment(folders, out, "--max-steps", "1") == 0
    assert not (out / "aborted.json").exists() and (out / "state.pt").is_file()


def test_resume_refuses_a_flag_that_would_change_the_run(seg_run, capsys):
    _fails(["dense", "train", "--out", str(seg_run), "--resume", "--lr", "0.5"], capsys, "--lr")


@pytest.mark.parametrize("masks", [True, False], ids=["mask-rcnn", "faster-rcnn"])
def test_detect_on_a_coco_folder_trains_and_reports_coco_ap(folders, tmp_path, capsys, masks):
    out = tmp_path / "det"
    extra = [] if masks else ["--no-masks"]
    assert main(["dense", "train", "--task", "detect", "--data", "coco", "--data-dir", str(folders / "coco"), *TINY,
                 "--epochs", "1", "--out", str(out), *extra]) == 0
    (h,) = _history(out)
    keys = {"box_AP", "box_AP50", "box_AP75"} | ({"mask_AP", "mask_AP50", "mask_AP75"} if masks else set())
    assert keys <= set(h) and ("mask_AP" in h) == masks
    assert all(0 <= h[k] <= 1 for k in keys)
    assert Image.open(out / "predictions" / "epoch-001.png").size == (2 * 66 + 2, 2 * 66 + 2)  # truth | prediction
    capsys.readouterr()
    assert main(["dense", "eval", str(out)]) == 0
    assert "detect on coco: box AP" in capsys.readouterr().out
    _fails(["export", "--model", "laplacianformer_nano", "--checkpoint", str(out), "--out", str(tmp_path / "d.onnx")],
           capsys, "is a detector")


def test_amp_trains_with_finite_losses(folders, tmp_path):
    out = tmp_path / "amp"
    assert _segment(folders, out, "--epochs", "1", "--amp", "--model", "soft_nano") == 0
    (h,) = _history(out)
    assert torch.isfinite(torch.tensor(h["train_loss"])) and 0 <= h["mIoU"] <= 100


def test_isotropic_backbone_with_any_mixer(folders, tmp_path):
    out = tmp_path / "vit"
    assert _segment(folders, out, "--epochs", "1", "--model", "vit_nano_patch4_32", "--mixer", "fibottention",
                    "--model-option", "depth=2") == 0
    assert load_weights(out / "last.safetensors")[1]["mixer"] == "fibottention"


def test_the_resnet18_fpn_baseline_trains_from_the_cli(folders, tmp_path):
    out = tmp_path / "resnet"
    assert _segment(folders, out, "--epochs", "1", "--model", "resnet18") == 0
    assert load_weights(out / "last.safetensors")[1]["model"] == "resnet18" and len(_history(out)) == 1


def test_torchrun_two_processes_equal_one_process(folders, tmp_path):
    """Two gloo processes × 2 images and one process × 4 images: the same batches (the sampler splits
    each global batch), so the same losses and weights up to the two-way gradient average's rounding.
    The backbone has no BatchNorm: torch's SyncBatchNorm is CUDA-only, so on CPU a BatchNorm stem
    (laplacianformer_nano's) would see each process's half batch."""
    common = ["-m", "vitmix.cli", "dense", "train", "--data", "maskfolder", "--data-dir", str(folders / "masks"),
              "--num-classes", "11", "--img-size", str(SIZE), "--batch-size", "4", "--epochs", "2", "--preview", "0",
              "--model", "weightformer_nano"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          *common, "--out", str(tmp_path / "ddp")], capture_output=True, text=True, timeout=300,
                         env=env)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    assert "world size 2" in ddp.stdout
    one = subprocess.run([sys.executable, *common, "--out", str(tmp_path / "one")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    for a, b in zip(_history(tmp_path / "ddp"), _history(tmp_path / "one")):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["mIoU"] == pytest.approx(b["mIoU"], abs=0.1)           # percent
    wa, wb = (load_weights(tmp_path / run / "last.safetensors")[0] for run in ("ddp", "one"))
    flat_a, flat_b = (torch.cat([w[k].flatten() for k in sorted(w)]) for w in (wa, wb))
    # observed 1.6e-5: Adam's steps on near-zero gradients are rounding noise of the two-way average; one
    # batch drawn differently would move the weights by ~lr per step, a relative ~1e-2 here
    assert ((flat_a - flat_b).norm() / flat_b.norm()).item() <= 1e-4


@pytest.mark.parametrize("args, message", [
    (["--model", "laplacianformer_nanno"], "unknown backbone 'laplacianformer_nanno'.*laplacianformer_nano"),
    (["--task", "segment", "--data", "coco"], "not a segment dataset.*--task detect"),
    (["--task", "classify"], "--task 'classify'"),
    (["--data", "maskfolder"], "needs --num-classes"),
    (["--data", "maskfolder", "--num-classes", "3"], "needs --data-dir"),
    (["--data", "maskfolder", "--num-classes", "3", "--data-dir", "/nonexistent/masks"], "nonexistent"),
    (["--batch-size", "0"], "--batch-size 0 must be a positive integer"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    _fails(["dense", "train", "--out", str(out), *args], capsys, message)
    assert not out.exists()


def test_detection_without_pycocotools_is_refused_before_training(tmp_path, capsys, without_pycocotools):
    """Detection is scored with pycocotools; without it the run must say so at once (it used to train a
    whole run and then fail in its first evaluation with a ModuleNotFoundError)."""
    out = tmp_path / "run"
    _fails(["dense", "train", "--task", "detect", "--out", str(out)], capsys,
           r"--task detect \(COCO box/mask AP\) needs pycocotools.*pip install 'vitmix\[dense\]'")
    assert not out.exists()


def test_a_batch_larger_than_the_data_is_refused_before_writing(folders, tmp_path, capsys):
    out = tmp_path / "run"
    capsys.readouterr()
    assert _segment(folders, out, "--batch-size", "16") == 2
    assert "larger than the 8 training images" in capsys.readouterr().err
    assert not out.exists()


def test_mask_images_of_another_size_are_resized(folders, tmp_path):
    from vitmix.dense.config import DenseConfig
    from vitmix.dense.runner import build_data

    cfg = DenseConfig(data="maskfolder", data_dir=str(folders / "masks"), num_classes=11, img_size=96)
    train, val, classes, _ = build_data(cfg)
    image, target = train[0]
    assert image.shape == (3, 96, 96) and target["semantic"].shape == (96, 96) and classes == 11
    assert set(target["semantic"].unique().tolist()) <= set(range(11))    # nearest neighbour: no new labels


@pytest.mark.needs_fashion_mnist
def test_fashion_scenes_segmentation_smoke(tmp_path):
    out = tmp_path / "scenes"
    assert main(["dense", "train", "--out", str(out), "--img-size", str(SIZE), "--train-scenes", "8",
                 "--val-scenes", "4", "--batch-size", "4", "--epochs", "1", "--preview", "1"]) == 0
    (h,) = _history(out)
    assert h["step"] == 2 and 0 <= h["mIoU"] <= 100
    assert Path(out / "predictions" / "epoch-001.png").is_file()
