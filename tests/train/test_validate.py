"""``vitmix eval`` as timm's ``validate.py``: preprocessing from the model's data config (flags over it),
``--model NAME`` with ``--pretrained`` (a ``local-dir:`` folder) or ``--checkpoint`` (timm's train.py
layout, written here), ``--use-ema``, timm's result keys in CSV and JSON, and one-line errors. The
accuracies are checked against the same model run by hand on the same images with the same transform."""
import argparse
import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import create_transform

import vitmix
from vitmix.cli import main
from vitmix.runs.checkpoints import set_data_config
from vitmix.train import TrainConfig, evaluate_checkpoint, train, validate
from vitmix.train.validation import TIMM_KEYS, VITMIX_KEYS, data_config, eval_transform

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "vit_nano_patch4_32"
SMALL = {"depth": 1, "embed_dim": 32, "num_heads": 2, "img_size": 16}
KWARGS = ["--model-kwargs", *(f"{k}={v}" for k, v in SMALL.items())]
CLASSES = ("ant", "bee", "cat")
#: vit_nano_patch4_32's own data config (its pretrained_cfg), at the size the model is built with
OWN = dict(input_size=(3, 16, 16), interpolation="bilinear", crop_pct=1.0, mean=(0.5,) * 3, std=(0.5,) * 3)

_spec = importlib.util.spec_from_file_location("video_data_tests", Path(__file__).parents[1] / "data" / "test_video.py")
_video_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_video_tests)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """timm validate.py's image folder: DIR/val/<class>/*.png, noise images of a non-square size (so that
    the resize and the crop matter)."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for name in CLASSES:
        (root / "val" / name).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (20, 26, 3), dtype=np.uint8)).save(root / "val" / name / f"{i}.png")
    return root


def _images(root: Path):
    """The folder's images (as PIL RGB) and labels, in class-folder order."""
    items = [(Image.open(p).convert("RGB"), c) for c, name in enumerate(CLASSES)
             for p in sorted((root / "val" / name).iterdir())]
    return [img for img, _ in items], torch.tensor([c for _, c in items])


def _random_state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = vitmix.create_model(MODEL, num_classes=len(CLASSES), **SMALL)
    return {k: torch.randn_like(v) * 0.3 if v.is_floating_point() else v for k, v in model.state_dict().items()}


def _by_hand(state: dict, root: Path, **config) -> tuple:
    """Top-1 (%) and mean cross-entropy of the model with ``state`` on the folder, preprocessed by
    timm's create_transform with ``config``."""
    model = vitmix.create_model(MODEL, num_classes=len(CLASSES), **SMALL).eval()
    model.load_state_dict(state)
    transform = create_transform(**config, is_training=False)
    images, labels = _images(root)
    with torch.no_grad():
        logits = model(torch.stack([transform(img) for img in images]))
    return 100 * (logits.argmax(-1) == labels).float().mean().item(), F.cross_entropy(logits, labels).item()


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A checkpoint as timm's train.py writes it (model_best.pth.tar): weights, EMA, and its flags as an
    argparse.Namespace."""
    path = tmp_path_factory.mktemp("timm") / "model_best.pth.tar"
    weights, ema = _random_state(1), _random_state(2)
    torch.save({"epoch": 3, "arch": MODEL, "state_dict": weights, "state_dict_ema": ema, "version": 2,
                "args": argparse.Namespace(model=MODEL, lr=0.1, mean=None, input_size=[3, 16, 16]), "metric": 40.0},
               path)
    return path, weights, ema


def _eval(capsys, *argv) -> dict:
    """``vitmix eval ARGV --results-file r.json``: the result it wrote."""
    capsys.readouterr()
    out = Path(argv[argv.index("--data-dir") + 1]).parent / "result.json" if "--data-dir" in argv else None
    assert main(["eval", *argv, "--results-file", str(out)]) == 0
    return json.loads(out.read_text())


def _fails(capsys, argv, message) -> None:
    capsys.readouterr()
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_timm_checkpoint_scores_what_the_model_scores_by_hand(folder, timm_file, capsys):
    path, weights, ema = timm_file
    top1, loss = _by_hand(weights, folder, **OWN)
    record = _eval(capsys, "--model", MODEL, *KWARGS, "--checkpoint", str(path), "--data-dir", str(folder))
    assert record["top1"] == round(top1, 4) and record["loss"] == pytest.approx(loss, rel=1e-5)
    assert record["top1_err"] == round(100 - top1, 4) and (record["top5"], record["top5_err"]) == (100.0, 0.0)
    assert list(record) == [*TIMM_KEYS, *VITMIX_KEYS]
    params = sum(v.numel() for v in vitmix.create_model(MODEL, num_classes=3, **SMALL).parameters())
    assert record["param_count"] == round(params / 1e6, 2) and record["images"] == 12
    assert (record["img_size"], record["crop_pct"], record["interpolation"]) == (16, 1.0, "bilinear")
    assert (record["model"], record["data"], record["checkpoint"]) == (MODEL, "imagefolder", str(path))
    # --use-ema: the file's state_dict_ema
    ema_top1, ema_loss = _by_hand(ema, folder, **OWN)
    record = _eval(capsys, "--model", MODEL, *KWARGS, "--checkpoint", str(path), "--use-ema", "--data-dir", str(folder))
    assert record["top1"] == round(ema_top1, 4) and record["loss"] == pytest.approx(ema_loss, rel=1e-5)
    assert ema_loss != pytest.approx(loss, rel=1e-3)     # the two weight sets differ: the EMA was read


def test_timms_saved_flags_need_torchs_allow_list(timm_file, monkeypatch):
    """The argparse.Namespace of timm's checkpoints loads through torch's safe_globals; a torch without it
    refuses the file as pickled code, in one message that says how to convert it."""
    from vitmix.runs import read_checkpoint

    state, _ = read_checkpoint(timm_file[0])
    assert all(torch.equal(state[k], v) for k, v in timm_file[1].items())
    monkeypatch.delattr(torch.serialization, "safe_globals")
    with pytest.raises(ValueError, match=r"holds pickled code \(argparse.Namespace\).*weights_only=False"):
        read_checkpoint(timm_file[0])


def test_the_data_config_flags_override_the_models(folder, timm_file, capsys):
    path, weights, _ = timm_file
    asked = dict(interpolation="nearest", crop_pct=0.6, mean=(0.2, 0.3, 0.4), std=(0.5, 0.6, 0.7))
    top1, loss = _by_hand(weights, folder, **dict(OWN, **asked))
    record = _eval(capsys, "--model", MODEL, *KWARGS, "--checkpoint", str(path), "--data-dir", str(folder),
                   "--interpolation", "nearest", "--crop-pct", "0.6", "--mean", "0.2", "0.3", "0.4",
                   "--std", "0.5", "0.6", "0.7")
    assert record["top1"] == round(top1, 4) and record["loss"] == pytest.approx(loss, rel=1e-5)
    assert (record["crop_pct"], record["interpolation"]) == (0.6, "nearest")
    assert loss != pytest.approx(_by_hand(weights, folder, **OWN)[1], rel=1e-3)   # the flags changed the input


def test_the_models_data_config_builds_the_transform():
    """DeiT-style bicubic, crop_pct 0.9 gives another transform than vitmix's bilinear, crop_pct 1.0: a
    resize to 16 / 0.9 = 17 pixels, then a 16-pixel centre crop."""
    model = vitmix.create_model(MODEL, num_classes=3, **SMALL)
    set_data_config(model, dict(input_size=(3, 16, 16), interpolation="bicubic", crop_pct=0.9))
    deit = eval_transform(data_config(model)).transforms
    assert (deit[0].size, deit[0].interpolation.value, deit[1].size) == (17, "bicubic", (16, 16))
    set_data_config(model, dict(interpolation="bilinear", crop_pct=1.0))
    plain = eval_transform(data_config(model)).transforms
    assert (plain[0].size, plain[0].interpolation.value, plain[1].size) == (16, "bilinear", (16, 16))
    over = eval_transform(data_config(model, {"crop_pct": 0.5, "interpolation": "bicubic"})).transforms
    assert (over[0].size, over[0].interpolation.value) == (32, "bicubic")
    grey = data_config(model, {"input_size": (1, 16, 16), "mean": (0.3,), "std": (0.2,)})
    assert grey["input_size"] == (1, 16, 16) and grey["mean"] == (0.3,)
    with pytest.raises(ValueError, match=r"give --mean and --std with 1 value"):
        data_config(model, {"input_size": (1, 16, 16)})          # the model's mean has 3 values


def test_pretrained_weights_of_a_saved_model_with_its_data_config(folder, tmp_path, capsys):
    """--model local-dir:DIR --pretrained: timm builds the saved model and its pretrained_cfg (bicubic,
    crop_pct 0.9) is the preprocessing."""
    state = _random_state(3)
    model = vitmix.create_model(MODEL, num_classes=3, **SMALL)
    model.load_state_dict(state)
    set_data_config(model, dict(interpolation="bicubic", crop_pct=0.9, mean=(0.4,) * 3, std=(0.3,) * 3))
    saved = vitmix.save_pretrained(model, tmp_path / "saved")
    top1, loss = _by_hand(state, folder, **dict(OWN, interpolation="bicubic", crop_pct=0.9, mean=(0.4,) * 3,
                                                std=(0.3,) * 3))
    record = _eval(capsys, "--model", f"local-dir:{saved}", "--pretrained", "--data-dir", str(folder))
    assert (record["crop_pct"], record["interpolation"], record["img_size"]) == (0.9, "bicubic", 16)
    assert record["top1"] == round(top1, 4) and record["loss"] == pytest.approx(loss, rel=1e-5)
    assert record["checkpoint"] is None and "[pretrained]" in capsys.readouterr().out


def test_results_in_csv_and_json_with_timms_keys(folder, timm_file, tmp_path, capsys):
    path = timm_file[0]
    argv = ["eval", "--model", MODEL, *KWARGS, "--checkpoint", str(path), "--data-dir", str(folder)]
    assert main([*argv, "--results-file", str(tmp_path / "r.csv")]) == 0
    row, = csv.DictReader((tmp_path / "r.csv").open())
    assert list(row) == [*TIMM_KEYS, *VITMIX_KEYS] and row["model"] == MODEL and row["interpolation"] == "bilinear"
    assert main([*argv, "--results-file", str(tmp_path / "r.txt"), "--results-format", "json"]) == 0
    assert main([*argv, "--results-file", str(tmp_path / "r.json")]) == 0     # .json: JSON without the flag
    first, second = (json.loads((tmp_path / name).read_text()) for name in ("r.txt", "r.json"))
    assert first == second and float(row["top1"]) == first["top1"] and float(row["loss"]) == first["loss"]
    assert main([*argv, "--results-file", str(tmp_path / "r2.json"), "--results-format", "csv"]) == 0
    assert (tmp_path / "r2.json").read_text().startswith("model,top1,top1_err,top5,top5_err,param_count,")


def test_a_converted_model_by_mixer(folder, tmp_path, capsys):
    """--mixer builds the model with that attention: the checkpoint of a soft model loads only so."""
    torch.manual_seed(4)
    model = vitmix.create_model(MODEL, num_classes=3, mixer="soft", **SMALL)
    path = tmp_path / "soft.pth"
    torch.save(model.state_dict(), path)
    record = _eval(capsys, "--model", MODEL, *KWARGS, "--mixer", "soft", "--checkpoint", str(path),
                   "--data-dir", str(folder))
    assert record["mixer"] == "soft" and record["images"] == 12
    _fails(capsys, ["--model", MODEL, *KWARGS, "--checkpoint", str(path), "--data-dir", str(folder)],
           "a checkpoint of another architecture?")


def _tiny_run(out: Path, data: str, img_size: int, data_dir=None, **extra) -> Path:
    train(TrainConfig(model=MODEL, data=data, img_size=img_size, batch_size=16, epochs=1, max_steps=2,
                      data_dir=data_dir, model_options={"depth": 1, "embed_dim": 32, "num_heads": 2}, out=str(out),
                      **extra), log=lambda *a: None)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folder):
    """Tiny runs at their data's native size (digits 8, Fashion-MNIST 28) and on an image folder."""
    root = tmp_path_factory.mktemp("runs")
    fashion = _video_tests.fake_fashion_mnist(tmp_path_factory.mktemp("fashion"))
    rgb = tmp_path_factory.mktemp("rgb")
    for split in ("train", "val"):
        (rgb / split).mkdir()
        for name in CLASSES:
            (rgb / split / name).symlink_to(folder / "val" / name)
    return {"digits": _tiny_run(root / "digits", "digits", 8, ema_decay=0.5),
            "fashion-mnist": _tiny_run(root / "fashion", "fashion-mnist", 28, str(fashion)),
            "imagefolder": _tiny_run(root / "folder", "imagefolder", 16, str(rgb))}


@pytest.mark.parametrize("data", ["digits", "fashion-mnist", "imagefolder"])
def test_a_run_is_preprocessed_as_it_validated(runs, data, capsys):
    """The run's own data config gives the transform its dataset gives for validation, so `vitmix eval RUN`
    scores what evaluate_checkpoint (the dataset's transform) scores."""
    from vitmix.data import build_datasets

    run = runs[data]
    assert json.loads((run / "summary.json").read_text())["data"] == data
    model = vitmix.load_model(run)
    size = model.pretrained_cfg["input_size"][-1]
    data_dir = TrainConfig.load(run / "config.yaml").data_dir
    _, val_set, _ = build_datasets(data, size, data_dir, augment=False)
    assert repr(eval_transform(data_config(model))) == repr(val_set.transform)
    before = evaluate_checkpoint(run)
    capsys.readouterr()
    assert main(["eval", str(run), "--results-file", str(run / "r.json")]) == 0
    record = json.loads((run / "r.json").read_text())
    assert record["top1"] == round(before["val_acc"], 4) and record["loss"] == pytest.approx(before["val_loss"])
    assert record["images"] == before["val_images"] and record["img_size"] == size
    assert validate(run) == record                     # the Python form of the command


def test_use_ema_of_a_run(runs, capsys):
    run = runs["digits"]
    assert main(["eval", str(run), "--use-ema", "--results-file", str(run / "ema.json")]) == 0
    record = json.loads((run / "ema.json").read_text())
    ema = evaluate_checkpoint(run / "ema.safetensors")
    assert record["checkpoint"] == str(run / "ema.safetensors") and record["top1"] == round(ema["val_acc"], 4)
    _fails(capsys, [str(runs["fashion-mnist"]), "--use-ema"], "has no EMA weights (ema.safetensors)")
    _fails(capsys, [str(run / "best.safetensors"), "--use-ema"], "holds one set of weights, not an EMA")


def test_bad_input_is_one_line(folder, timm_file, runs, tmp_path, capsys):
    path = str(timm_file[0])
    plain = tmp_path / "plain.pth"
    torch.save(timm_file[1], plain)
    (tmp_path / "empty").mkdir()
    for name in ("a", "b"):             # a folder of two classes
        (tmp_path / "two" / "val" / name).mkdir(parents=True)
        Image.new("RGB", (16, 16)).save(tmp_path / "two" / "val" / name / "0.png")
    model = ["--model", MODEL, *KWARGS]
    cases = {
        "Did you mean: vit_nano_patch4_32": ["--model", "vit_nano_patc4_32", "--checkpoint", path,
                                             "--data-dir", str(folder)],
        "a checkpoint of another architecture?": ["--model", "vit_tiny_patch4_32", "--checkpoint", path,
                                                  "--data-dir", str(folder)],
        "--data-dir {tmp}/nope does not exist": [*model, "--checkpoint", path, "--data-dir", "{tmp}/nope"],
        "holds no class folders": [*model, "--checkpoint", path, "--data-dir", "{tmp}/empty"],
        "needs weights: --pretrained (timm's) or --checkpoint FILE": [*model, "--data-dir", str(folder)],
        "give the validation data": [*model, "--checkpoint", path],
        "--use-ema reads the EMA weights of a checkpoint": [*model, "--pretrained", "--use-ema", "--data-dir",
                                                            str(folder)],
        "--model builds image classifiers": ["--model", "timesformer_tiny", "--checkpoint", path, "--data-dir",
                                             str(folder)],
        "holds no EMA weights (none of state_dict_ema": [*model, "--checkpoint", str(plain), "--use-ema",
                                                         "--data-dir", str(folder)],
        "--pretrained builds a model by name: give --model NAME": [str(runs["digits"]), "--pretrained"],
        "--model-kwargs builds a model by name": [str(runs["digits"]), "--model-kwargs", "depth=2"],
        "--results-format is the format of --results-file": [str(runs["digits"]), "--results-format", "csv"],
        "takes 8x8 images, not the 32x32": [str(runs["digits"]), "--img-size", "32"],
        "--mean takes 1 or 3 values": [*model, "--checkpoint", path, "--data-dir", str(folder), "--input-size", "3",
                                       "16", "16", "--mean", "0.1", "0.2"],
        "--crop-pct 0.0 must be positive": [str(runs["digits"]), "--crop-pct", "0"],
        "predicts 3 classes, but imagefolder has 2": [*model, "--checkpoint", path, "--num-classes", "3",
                                                      "--data-dir", "{tmp}/two"],
        "--use-ema is for the plain evaluation": [str(runs["digits"]), "--corruptions", "all", "--use-ema"],
    }
    for message, argv in cases.items():
        _fails(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv], message.replace("{tmp}", str(tmp_path)))


def test_a_dense_run_refuses_the_classifier_flags():
    from vitmix.dense.cli import CLASSIFIER_EVAL_FLAGS, eval_dense

    for flag, value in (("use_ema", True), ("crop_pct", 0.9), ("results_format", "csv")):
        args = argparse.Namespace(**dict({f: None for f in CLASSIFIER_EVAL_FLAGS}, use_ema=False))
        setattr(args, flag, value)
        with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} is for classifiers"):
            eval_dense(args, "runs/seg")


def test_pretrained_softmax_weights_converted_by_mixer(folder, tmp_path, capsys):
    """--pretrained --mixer soft on a saved DeiT (one block): the softmax weights are converted, and the
    images get DeiT's data config (224 px, bicubic, crop_pct 0.9, ImageNet's mean/std)."""
    import timm
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    torch.manual_seed(5)
    saved = vitmix.save_pretrained(vitmix.create_model("deit_tiny_patch16_224", depth=1, num_classes=3),
                                   tmp_path / "deit")
    teacher = timm.create_model(f"local-dir:{saved}", pretrained=True).eval()
    expected = vitmix.convert(teacher, "soft")
    transform = create_transform(input_size=(3, 224, 224), interpolation="bicubic", crop_pct=0.9,
                                 mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, is_training=False)
    images, labels = _images(folder)
    with torch.no_grad():
        logits = expected(torch.stack([transform(img) for img in images]))
    with pytest.warns(UserWarning, match="converted to mixer 'soft'"):
        record = _eval(capsys, "--model", f"local-dir:{saved}", "--pretrained", "--mixer", "soft",
                       "--data-dir", str(folder))
    assert (record["img_size"], record["crop_pct"], record["interpolation"], record["mixer"]) == (
        224, 0.9, "bicubic", "soft")
    assert record["top1"] == round(100 * (logits.argmax(-1) == labels).float().mean().item(), 4)
    assert record["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)


def test_a_vitmix_checkpoint_by_model_name_is_built_from_its_metadata(runs):
    """--model NAME --checkpoint RUN/best.safetensors: the file's metadata gives the options, size, classes and
    data config, so the score is the run's."""
    run = runs["digits"]
    by_name = validate(run / "best.safetensors", model=MODEL, data="digits")
    by_run = validate(run)
    assert {k: by_name[k] for k in ("top1", "top5", "loss", "img_size", "crop_pct", "interpolation", "images")} == {
        k: by_run[k] for k in ("top1", "top5", "loss", "img_size", "crop_pct", "interpolation", "images")}
