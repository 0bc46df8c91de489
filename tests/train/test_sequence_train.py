"""``vitmix train`` / ``vitmix eval`` on the 1-D sequence datasets (listops, pathfinder32, sfashion-mnist) with
``seq_lra_tiny``, at tiny sizes (``--data-option``): run directory, checkpoint metadata, eval, resume, the shipped
``lra-*`` configs, the padding mask reaching the model, and the one-line errors for mismatched input."""
import gzip
import json

import numpy as np
import pytest
import torch

from vitmix.cli import main
from vitmix.configs import resolve_config
from vitmix.train import TrainConfig
from vitmix.train.checkpoint import load_weights
from vitmix.train.sequences import build_sequence_model, sequence_data

pytestmark = pytest.mark.usefixtures("one_thread")

#: a ListOps small enough for a few CI steps: 32 + 8 expressions of 10..60 tokens
TINY_LISTOPS = ("--data-option", "train_size=32", "--data-option", "val_size=8", "--data-option", "min_len=10",
                "--data-option", "max_len=60")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Generated sets go to this test's own cache folder (``$VITMIX_CACHE_DIR/datasets``)."""
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path / "cache"))


def _listops(out, *extra):
    return ["train", "--data", "listops", "--model", "seq_lra_tiny", "--out", str(out), "--batch-size", "8",
            *TINY_LISTOPS, *extra]


def test_vitmix_train_on_listops_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_listops(out, "--mixer", "soft", "--epochs", "2", "--max-steps", "6")) == 0
    printed = capsys.readouterr().out
    assert "on listops (32 train / 8 val, 60 tokens)" in printed and "seq/s" in printed
    for name in ("config.yaml", "metrics.jsonl", "best.safetensors", "last.safetensors", "state.pt", "summary.json",
                 "curves.png"):
        assert (out / name).is_file(), name
    assert sorted(p.name[:8] for p in (tmp_path / "cache" / "datasets").iterdir()) == ["listops-", "listops-"]
    _, meta = load_weights(out / "last.safetensors")
    assert meta["sequence"] == {"num_classes": 10, "seq_len": 60, "vocab_size": 16, "pad_id": 0}
    assert meta["data_options"]["max_len"] == 60 and "img_size" not in meta and meta["mixer"] == "soft"

    results = tmp_path / "eval.json"               # the run's own validation set, from its data options
    assert main(["eval", str(out), "--results-file", str(results)]) == 0
    assert "seq_lra_tiny (mixer=soft) on listops: top-1" in capsys.readouterr().out
    record = json.loads(results.read_text())
    from vitmix.train.runner import evaluate_checkpoint
    assert record["top1"] == round(evaluate_checkpoint(out)["val_acc"], 4) and record["seq_len"] == 60
    assert main(["train", "--out", str(out), "--resume", "--epochs", "3", "--max-steps", "9"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["epochs_run"], summary["steps"]) == (3, 9)


def test_the_padding_mask_reaches_the_model(tmp_path):
    """ListOps pads with id 0: the model trained by `vitmix train` masks it, so a padded sample's logits are
    those of the sample alone (without the mask, padding changed them)."""
    cfg = TrainConfig(model="seq_lra_tiny", data="listops", mixer="soft",
                      data_options={"train_size": 4, "val_size": 1, "min_len": 10, "max_len": 60})
    train_set, _, info = sequence_data(cfg, progress=False)
    model = build_sequence_model(cfg, info).eval()
    assert model.pad_id == 0
    ids = torch.stack([train_set[i][0] for i in range(4)])
    lengths = (ids != 0).sum(1)
    assert lengths.min() < lengths.max() < 60                 # variable lengths, all padded
    with torch.no_grad():
        batch = model(ids)
        alone = torch.cat([model(ids[i:i + 1, :lengths[i]]) for i in range(4)])
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)
    cut, mask = model.padding_mask(ids)
    assert cut.shape[1] == int(lengths.max()) and mask.sum(1).tolist() == lengths.tolist()


def test_vitmix_train_on_pathfinder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", "pathfinder32", "--model", "seq_lra_tiny", "--mixer", "nystromformer",
                 "--out", str(out), "--batch-size", "8", "--epochs", "1", "--max-steps", "2",
                 "--data-option", "train_size=16", "--data-option", "val_size=8"]) == 0
    assert "on pathfinder32 (16 train / 8 val, 1024 tokens)" in capsys.readouterr().out
    _, meta = load_weights(out / "last.safetensors")
    assert meta["sequence"] == {"num_classes": 2, "seq_len": 1024, "vocab_size": 256}   # pixels: nothing pads


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_vitmix_train_on_sfashion_mnist_idx_files(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("t10k", 8)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    out = tmp_path / "run"
    assert main(["train", "--data", "sfashion-mnist", "--data-dir", str(tmp_path), "--model", "seq_lra_tiny",
                 "--mixer", "laplacian", "--out", str(out), "--batch-size", "8", "--epochs", "1",
                 "--max-steps", "1"]) == 0
    assert "on sfashion-mnist (16 train / 8 val, 784 tokens)" in capsys.readouterr().out


def test_sfashion_mnist_without_the_data_is_a_one_line_error(tmp_path, capsys):
    """The session hides Fashion-MNIST (tests/conftest.py): the error says where to get it, nothing is left."""
    out = tmp_path / "run"
    assert main(["train", "--data", "sfashion-mnist", "--model", "seq_lra_tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "apt-get install dataset-fashion-mnist" in err[0], err
    assert not out.exists()


def test_the_shipped_lra_configs_are_nystromformers_recipe(tmp_path, capsys):
    for name, data in (("lra-listops", "listops"), ("lra-pathfinder", "pathfinder32"),
                       ("lra-sfashion-mnist", "sfashion-mnist")):
        cfg = TrainConfig.load(resolve_config(name))
        assert (cfg.model, cfg.data, cfg.lr, cfg.batch_size) == ("seq_lra_tiny", data, 1e-4, 32), name
        assert cfg.data_options == {"train_size": 16000, "val_size": 2000}, name
    out = tmp_path / "run"                                 # flags overlay the config's data options
    assert main(["train", "--config", "lra-listops", "--mixer", "softmax", "--out", str(out), "--epochs", "1",
                 "--max-steps", "1", "--batch-size", "4", *TINY_LISTOPS]) == 0
    assert "on listops (32 train / 8 val, 60 tokens)" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--data", "listops", "--model", "vit_nano_patch4_32"], "listops holds 1-D token sequences, not images, "
                                                              "which vit_nano_patch4_32 does not take: use a sequence "
                                                              "model (--model seq_lra_tiny)"),
    (["--data", "digits", "--model", "seq_lra_tiny"], "seq_lra_tiny takes 1-D token sequences, not --data digits"),
    (["--data", "digits", "--data-option", "train_size=3"], "--data-option is for the sequence datasets"),
    (["--data", "listops", "--model", "seq_lra_tiny", "--mixer", "weightformer", *TINY_LISTOPS],
     "'weightformer' is an image model"),
    (["--data", "listops", "--model", "seq_lra_tiny", "--model-option", "seq_len=40", *TINY_LISTOPS],
     "--data listops has up to 60 tokens, longer than the model's position table (--model-option seq_len=40); "
     "give the model seq_len >= 60 or shorten the data (--data-option max_len=N)"),
    (["--data", "listops", "--model", "seq_lra_tiny", "--img-size", "32", *TINY_LISTOPS],
     "--img-size is for image data"),
    (["--data", "listops", "--model", "seq_lra_tiny", "--data-option", "trian_size=3"],
     "listops has no option 'trian_size'. Did you mean: train_size"),
    (["--data", "listops", "--model", "seq_lra_tiny", "--data-option", "train_size=many"],
     "--data-option train_size='many' must be an integer"),
])
def test_mismatched_sequence_input_is_a_one_line_error(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    assert main(["train", *args, "--out", str(out), "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_eval_of_a_sequence_run_on_other_data_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_listops(out, "--epochs", "1", "--max-steps", "1")) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--data", "digits"]) == 2
    assert "takes 1-D token sequences, not --data digits" in capsys.readouterr().err


@pytest.mark.needs_fashion_mnist
def test_vitmix_train_on_the_installed_fashion_mnist(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config", "lra-sfashion-mnist", "--mixer", "soft", "--out", str(out), "--epochs", "1",
                 "--max-steps", "1", "--batch-size", "4", "--data-option", "train_size=8",
                 "--data-option", "val_size=4"]) == 0
    assert "on sfashion-mnist (8 train / 4 val, 784 tokens)" in capsys.readouterr().out


def test_what_a_sequence_checkpoint_cannot_do_is_a_one_line_error(tmp_path, capsys):
    """Image corruptions need images; torch.export cannot trace a mixer that sizes its work by each sample's
    masked length (a pad_id model), while one that masks within the batch exports."""
    import vitmix
    from vitmix.export import export_program

    out = tmp_path / "run"
    assert main(_listops(out, "--mixer", "softmax", "--epochs", "1", "--max-steps", "1")) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--corruptions", "all"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--corruptions perturbs images" in err[0] and "sequence model" in err[0], err
    masked = vitmix.load_model(out)
    assert masked.pad_id == 0 and export_program(masked, masked.example_inputs(2)[0]) is not None
    by_length = vitmix.create_model("seq_lra_tiny", mixer="fibottention", seq_len=60, vocab_size=16, pad_id=0)
    with pytest.raises(ValueError, match="masks its padding .* torch.export cannot trace"):
        export_program(by_length.eval(), by_length.example_inputs(2)[0])


def test_compare_on_sequence_data_points_to_the_lra_study(tmp_path, capsys):
    assert main(["compare", "--data", "listops", "--model", "seq_lra_tiny", "--mixers", "soft",
                 "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "experiments/lra/lra.py" in err[0], err
