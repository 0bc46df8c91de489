"""``vitmix dense train``'s messages (issue 44): a mask folder's missing split and bad masks are
one-line errors before the run folder exists, "1 epoch" in the log, and --no-masks' help."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from vitmix.cli import build_parser, main

from .conftest import synthetic_garments

SIZE = 32


@pytest.fixture()
def masks(tmp_path):
    """A mask folder of 4 train and 4 val synthetic scenes at 32² (11 classes)."""
    from vitmix.dense.maskfolder import save_mask_folder
    from vitmix.dense.scenes import FashionScenes

    for split in ("train", "val"):
        save_mask_folder(FashionScenes(*synthetic_garments(), size=SIZE, length=4, split=split),
                         tmp_path / "masks", split)
    return tmp_path / "masks"


def _train(masks, out, *extra):
    return main(["dense", "train", "--data", "maskfolder", "--data-dir", str(masks), "--num-classes", "11",
                 "--model", "vit_nano_patch4_32", "--img-size", str(SIZE), "--batch-size", "4", "--preview", "0",
                 "--out", str(out), *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0], err
    return err[0]


def test_a_missing_val_split_names_that_folder(masks, tmp_path, capsys):
    shutil.rmtree(masks / "val")
    assert _train(masks, tmp_path / "run") == 2
    assert f"{masks / 'val'} not found" in _one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_bad_mask_fails_before_the_run_folder_is_made(masks, tmp_path, capsys):
    bad = sorted((masks / "val" / "masks").iterdir())[0]
    Image.fromarray(np.full((SIZE, SIZE), 40, np.uint8)).save(bad)
    assert _train(masks, tmp_path / "run") == 2
    assert f"{bad}: mask label 40 is outside the class range" in _one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_one_epoch_is_logged_in_the_singular(masks, tmp_path, capsys):
    assert _train(masks, tmp_path / "run", "--epochs", "1", "--max-steps", "1") == 0
    out = capsys.readouterr().out
    assert "for 1 epoch," in out and "done: 1 epoch, 1 step in" in out, out


def test_no_masks_help_says_what_it_does():
    dense = build_parser()._subparsers._group_actions[0].choices["dense"]
    train = dense._subparsers._group_actions[0].choices["train"]
    action = next(a for a in train._actions if "--no-masks" in a.option_strings)
    assert action.help.startswith("detect: boxes only (Faster R-CNN)"), action.help
