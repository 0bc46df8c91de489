"""A user's COCO folder and image + mask-PNG folder: round trip from fashion-scenes, and one-line errors."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitmix.dense.maskfolder import MaskFolder, save_mask_folder

pytest.importorskip("pycocotools", reason="the COCO reader needs pycocotools (pip install 'vitmix[dense]')")
from vitmix.dense.coco import CocoDetection, save_coco  # noqa: E402


@pytest.fixture
def coco_folder(tmp_path, scenes):
    ds = scenes(size=64, length=3)
    save_coco(ds, tmp_path, "val")
    return tmp_path, ds


def _edit(root, change):
    path = root / "annotations" / "instances_val.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _one_line_error(exc_type, match, make):
    with pytest.raises(exc_type, match=match) as e:
        make()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_coco_folder_round_trips_boxes_masks_and_labels(coco_folder):
    root, scenes = coco_folder
    ds = CocoDetection(root, "val")
    assert len(ds) == 3 and ds.num_classes == 11 and ds.classes[1] == "T-shirt/top" and ds.has_masks
    for i in range(3):
        image, target = ds[i]
        image_ref, target_ref = scenes[i]
        assert torch.allclose(image, image_ref, atol=1 / 255)
        assert torch.equal(target["boxes"], target_ref["boxes"]) and torch.equal(target["labels"], target_ref["labels"])
        assert torch.equal(target["masks"], target_ref["masks"])


def test_an_image_without_annotations_is_a_valid_empty_target(coco_folder):
    root, _ = coco_folder
    _edit(root, lambda d: d.update(annotations=[a for a in d["annotations"] if a["image_id"] != 1]))
    image, target = CocoDetection(root, "val")[1]
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
    assert target["masks"].shape == (0, 64, 64)


def test_missing_annotation_file_and_missing_image_name_the_file(coco_folder):
    root, _ = coco_folder
    msg = _one_line_error(FileNotFoundError, "instances_train.json not found", lambda: CocoDetection(root, "train"))
    assert "instances_val.json" in msg   # says what is there
    (root / "val" / "000002.png").unlink()
    _one_line_error(FileNotFoundError, r"instances_val.json: image '000002.png' not found",
                    lambda: CocoDetection(root, "val"))


@pytest.mark.parametrize("change, match", [
    (lambda d: d["annotations"][0].update(image_id=99), "refers to image_id 99, which is not in 'images'"),
    (lambda d: d["annotations"][0].update(category_id=42), "category_id 42, which is not in 'categories'"),
    (lambda d: d["annotations"][0].update(bbox=[50, 50, 30, 30]), r"box \[50, 50, 30, 30\] lies outside image"),
    (lambda d: d["annotations"][0].update(bbox=[5, 5, 0, 3]), "empty box"),
    (lambda d: d["images"].append(dict(d["images"][0])), "image id 0 is listed twice"),
    (lambda d: d.pop("categories"), "no 'categories' list"),
])
def test_inconsistent_coco_files_are_one_line_errors_naming_the_file(coco_folder, change, match):
    root, _ = coco_folder
    path = _edit(root, change)
    msg = _one_line_error(ValueError, match, lambda: CocoDetection(root, "val"))
    assert str(path) in msg


def test_an_image_of_another_size_than_its_entry_is_an_error(coco_folder):
    root, _ = coco_folder
    Image.new("RGB", (32, 32)).save(root / "val" / "000000.png")
    _one_line_error(ValueError, "000000.png: image is 32x32 but instances_val.json says 64x64",
                    lambda: CocoDetection(root, "val")[0])


def test_mask_folder_round_trips_the_semantic_maps(tmp_path, scenes):
    ds = scenes(size=64, length=2)
    save_mask_folder(ds, tmp_path, "train")
    folder = MaskFolder(tmp_path, num_classes=11, split="train")
    assert len(folder) == 2
    image, target = folder[1]
    assert torch.equal(target["semantic"], ds[1][1]["semantic"]) and image.shape == (3, 64, 64)


def _mask_folder(tmp_path, mask: np.ndarray, mode=None):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    Image.new("RGB", (8, 6)).save(tmp_path / "images" / "a.png")
    Image.fromarray(mask).save(tmp_path / "masks" / "a.png")
    return tmp_path


def test_mask_labels_may_be_the_ignore_index_but_not_outside_the_classes(tmp_path):
    mask = np.zeros((6, 8), np.uint8)
    mask[0, 0] = 255
    root = _mask_folder(tmp_path, mask)
    assert int(MaskFolder(root, 3, split=None)[0][1]["semantic"][0, 0]) == 255
    mask[1, 1] = 5
    Image.fromarray(mask).save(root / "masks" / "a.png")
    _one_line_error(ValueError, r"a.png: mask label 5 is outside the class range 0..2",
                    lambda: MaskFolder(root, 3, split=None)[0])


def test_mask_folder_errors_name_the_file(tmp_path):
    root = _mask_folder(tmp_path, np.zeros((6, 8), np.uint8))
    Image.new("RGB", (8, 6)).save(root / "images" / "b.png")
    _one_line_error(FileNotFoundError, r"b.png: no mask .*b.png", lambda: MaskFolder(root, 3, split=None))
    (root / "images" / "b.png").unlink()
    Image.new("L", (8, 6)).save(root / "masks" / "c.png")
    _one_line_error(FileNotFoundError, r"c.png: mask without an image", lambda: MaskFolder(root, 3, split=None))
    (root / "masks" / "c.png").unlink()
    Image.new("RGB", (8, 6)).save(root / "masks" / "a.png")
    _one_line_error(ValueError, "mask mode RGB is not single-channel", lambda: MaskFolder(root, 3, split=None)[0])
    Image.new("L", (4, 4)).save(root / "masks" / "a.png")
    _one_line_error(ValueError, "mask is 4x4 but its image is 8x6", lambda: MaskFolder(root, 3, split=None)[0])
    _one_line_error(FileNotFoundError, "not found", lambda: MaskFolder(tmp_path / "nowhere", 3))
