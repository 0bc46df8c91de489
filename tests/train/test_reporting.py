"""What a run reports: validation time in the summary, clips/s for video, plurals, top-5 and
``--results-file`` in ``vitmix eval``, ``metrics.csv`` through the csv module; pinned CUDA loaders."""
import csv
import io
import json

import pytest
import torch

from vitmix.cli import main
from vitmix.data import build_datasets
from vitmix.train import TrainConfig, train
from vitmix.runs.distributed import DistInfo
from vitmix.train.runner import _summary_table, metrics_csv, world_loaders

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, epochs=1, max_steps=2,
            model_options={"depth": 1, "embed_dim": 32, "num_heads": 2})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "run"
    lines = []
    train(TrainConfig(**TINY, out=str(out)), log=lines.append)
    return out, "\n".join(lines)


def test_each_epoch_reports_its_validation_seconds(run):
    """Regression: the summary's `sec` was the training loop only (127 s of validation went unreported)."""
    out, log = run
    epoch, = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert epoch["val_seconds"] > 0 and epoch["epoch_seconds"] > 0
    header = next(line for line in log.splitlines() if line.startswith("epoch train loss"))
    assert header.split()[-4:] == ["train", "s", "val", "s"]
    assert "s training + " in log and "s validation" in log


def test_one_epoch_is_singular(run):
    """Regression: "for 1 epochs"."""
    assert "for 1 epoch, " in run[1] and "1 epochs" not in run[1]


def test_video_rates_are_clips_per_second():
    """Regression: video runs reported clips as img/s."""
    history = [{"epoch": 1, "train_loss": 1.0, "train_acc": 50.0, "val_loss": 1.0, "val_acc": 50.0,
                "images_per_s": 12.0, "epoch_seconds": 3.0, "val_seconds": 1.5}]
    assert "clips/s" in _summary_table(history, "clips/s").splitlines()[0]
    old = {k: v for k, v in history[0].items() if k != "val_seconds"}      # a run from before val_seconds
    assert _summary_table([old]).splitlines()[-1].split()[-1] == "n/a"


def test_metrics_csv_quotes_what_needs_quoting():
    """Regression: values holding a comma or a quote shifted every later column."""
    history = [{"epoch": 1, "note": 'lr, "warm"', "val_acc": 50.5}, {"epoch": 2, "val_acc": None, "extra": 3}]
    rows = list(csv.DictReader(io.StringIO(metrics_csv(history))))
    assert rows[0] == {"epoch": "1", "note": 'lr, "warm"', "val_acc": "50.5", "extra": ""}
    assert rows[1] == {"epoch": "2", "note": "", "val_acc": "", "extra": "3"}


@pytest.mark.parametrize("device, pinned", [("cuda", True), ("cpu", False)])
def test_cuda_loaders_pin_memory(device, pinned):
    """Batches for a CUDA device come in page-locked memory (the loader is only built here: no GPU needed)."""
    train_set, val_set, _ = build_datasets("digits", img_size=8)
    cfg = TrainConfig(**TINY)
    loaders = world_loaders(train_set, val_set, cfg, DistInfo(device=torch.device(device)))[:2]
    assert [loader.pin_memory for loader in loaders] == [pinned, pinned]


def test_eval_reports_top5_and_writes_a_results_file(run, tmp_path, capsys):
    out, _ = run
    results = tmp_path / "results.json"
    assert main(["eval", str(out), "--results-file", str(results)]) == 0
    line = capsys.readouterr().out
    saved = json.loads(results.read_text())
    assert f"top-1 {saved['top1']:.2f}%, top-5 {saved['top5']:.2f}%" in line
    assert saved["top1"] <= saved["top5"] <= 100 and saved["images"] == 360
    assert (saved["top1_err"], saved["top5_err"]) == pytest.approx((100 - saved["top1"], 100 - saved["top5"]))
    assert saved["model"] == "vit_nano_patch4_32" and saved["checkpoint"].endswith("best.safetensors")


@pytest.mark.parametrize("argv, message", [
    (["--results-file", "{tmp}"], "is a directory"),
    (["--results-file", "{tmp}/missing/r.json"], "does not exist"),
    (["--results-file", "{tmp}/r.json", "--corruptions", "all"], "--results-file is for the plain evaluation"),
])
def test_results_file_mistakes_are_one_line_before_any_work(run, tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["eval", str(run[0]), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_eval_of_a_run_reads_the_folder_it_was_trained_on(tmp_path, capsys):
    """`vitmix eval RUN` of a run trained with --data-dir evaluates that folder's validation split,
    not the dataset's default location (an image folder has none: this failed with a data error)."""
    from PIL import Image

    for split in ("train", "val"):
        for c, colour in enumerate(((250, 10, 10), (10, 10, 250))):
            folder = tmp_path / "imgs" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (16, 16), colour).save(folder / f"{i}.png")
    out = tmp_path / "run"
    assert main(["train", "--data", "imagefolder", "--data-dir", str(tmp_path / "imgs"), "--img-size", "16",
                 "--epochs", "1", "--batch-size", "4", "--model-option", "depth=1", "--model-option",
                 "embed_dim=32", "--model-option", "num_heads=2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert "imagefolder" in capsys.readouterr().out
