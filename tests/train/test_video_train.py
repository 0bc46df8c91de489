"""``vitmix train`` on video clips end to end: run directory, checkpoint metadata, eval, resume, and the
one-line errors for image/video mismatches. Fashion-MNIST comes from tiny IDX files written here."""
import importlib.util
import json
from pathlib import Path

import pytest

from vitmix.cli import main
from vitmix.train import TrainConfig, evaluate_checkpoint, train
from vitmix.train.checkpoint import load_weights

pytestmark = pytest.mark.usefixtures("one_thread")

_spec = importlib.util.spec_from_file_location("video_data_tests", Path(__file__).parents[1] / "data" / "test_video.py")
_video_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_video_tests)

SMALL = {"embed_dim": 24, "depth": 1, "num_heads": 3}


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
    return _video_tests.fake_fashion_mnist(tmp_path_factory.mktemp("fashion"))


def _args(fashion_dir, out, *extra):
    return ["train", "--data", "moving-fashion-mnist", "--data-dir", str(fashion_dir), "--model",
            "timesformer_tiny_fibottention", "--out", str(out), "--batch-size", "8", "--num-frames", "6",
            "--model-option", "embed_dim=24", "--model-option", "depth=1", "--model-option", "num_heads=3", *extra]


def test_vitmix_train_on_moving_fashion_mnist_end_to_end(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(fashion_dir, out, "--epochs", "2", "--max-steps", "3")) == 0
    assert "on moving-fashion-mnist (10000 train / 2000 val, 32px)" in capsys.readouterr().out
    for name in ("config.yaml", "metrics.jsonl", "best.safetensors", "last.safetensors", "state.pt", "summary.json"):
        assert (out / name).is_file(), name
    _, meta = load_weights(out / "last.safetensors")
    assert (meta["num_frames"], meta["in_chans"], meta["num_classes"], meta["img_size"]) == (6, 1, 4, 32)
    result = evaluate_checkpoint(out, data_dir=str(fashion_dir))   # the clips it validated on
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert result["val_images"] == 2000 and result["val_acc"] == pytest.approx(history[-1]["val_acc"])
    capsys.readouterr()
    assert main(["eval", str(out), "--data-dir", str(fashion_dir), "--results-file", str(tmp_path / "r.json")]) == 0
    record = json.loads((tmp_path / "r.json").read_text())      # `vitmix eval`: the same clips, timm's keys
    assert record["top1"] == round(result["val_acc"], 4) and (record["img_size"], record["images"]) == (32, 2000)
    assert main(["eval", str(out), "--crop-pct", "0.9"]) == 2
    assert "is a video model whose clips are prepared by their dataset" in capsys.readouterr().err
    assert main(["eval", str(out), "--corruptions", "all"]) == 2
    assert "--corruptions perturbs images" in capsys.readouterr().err
    # resume to a longer schedule: the run continues from step 3 to 5
    assert main(["train", "--out", str(out), "--resume", "--max-steps", "5"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 5


def test_image_and_video_mismatches_fail_before_the_run_directory(fashion_dir, tmp_path):
    out = tmp_path / "x"
    video = dict(data="moving-fashion-mnist", data_dir=str(fashion_dir), out=str(out), max_steps=1)
    with pytest.raises(ValueError, match="holds video clips, which vit_nano_patch4_32 does not take"):
        train(TrainConfig(model="vit_nano_patch4_32", **video), log=lambda *a: None)
    with pytest.raises(ValueError, match="timesformer_tiny takes video clips"):
        train(TrainConfig(model="timesformer_tiny", data="digits", out=str(out)), log=lambda *a: None)
    with pytest.raises(ValueError, match="--channels-last works on images"):
        train(TrainConfig(model="timesformer_tiny", channels_last=True, **video), log=lambda *a: None)
    with pytest.raises(ValueError, match="--cutmix works on images"):
        train(TrainConfig(model="timesformer_tiny", cutmix=1.0, **video), log=lambda *a: None)
    assert not out.exists()


def test_any_mixer_trains_inside_the_video_model(fashion_dir, tmp_path):
    cfg = TrainConfig(model="timesformer_tiny", mixer="linear", data="moving-fashion-mnist",
                      data_dir=str(fashion_dir), model_options=SMALL, num_frames=4, batch_size=4, epochs=1,
                      max_steps=2, out=str(tmp_path / "lin"))
    summary = train(cfg, log=lambda *a: None)
    assert summary["steps"] == 2 and summary["final_val_acc"] is not None
