"""fashion-scenes: determinism, split separation, consistency of labels, masks and boxes."""
import gzip

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from vitmix.dense.scenes import FashionScenes, detection_collate, mask_to_box, segmentation_collate


def _same(a, b):
    (ia, ta), (ib, tb) = a, b
    return torch.equal(ia, ib) and all(torch.equal(ta[k], tb[k]) for k in ("boxes", "labels", "masks", "semantic"))


def test_same_seed_and_index_give_the_same_scene_in_a_new_dataset(scenes):
    first, second = scenes(seed=3), scenes(seed=3)
    for i in (0, 5):
        assert _same(first[i], second[i])


def test_index_seed_and_split_each_change_the_scene(scenes):
    base = scenes(seed=3)
    assert not torch.equal(base[0][0], base[1][0])
    assert not torch.equal(base[0][0], scenes(seed=4)[0][0])
    assert not torch.equal(base[0][0], scenes(seed=3, split="val")[0][0])


def test_a_scene_does_not_depend_on_length_or_on_what_was_drawn_before(scenes):
    short, long = scenes(length=3), scenes(length=50)
    long[7]   # draws nothing shared
    assert _same(short[2], long[2])


def test_dataloader_workers_give_the_scenes_of_direct_indexing(scenes):
    ds = scenes(length=4)
    loaded = [item for batch in DataLoader(ds, batch_size=1, num_workers=2, collate_fn=detection_collate)
              for item in zip(*batch)]
    assert all(_same(loaded[i], ds[i]) for i in range(4))


def test_semantic_map_is_the_union_of_disjoint_visible_masks_and_boxes_are_tight(scenes):
    ds = scenes(length=8, objects=(3, 6))
    for i in range(len(ds)):
        image, t = ds[i]
        masks = t["masks"].bool()
        assert image.shape == (3, 128, 128) and image.min() >= 0 and image.max() <= 1
        assert masks.shape[0] == len(t["labels"]) == len(t["boxes"]) >= 1
        assert int(masks.sum(0).max()) == 1                           # visible parts never overlap
        assert all(int(m.sum()) > 0 for m in masks)
        expected = torch.zeros(128, 128, dtype=torch.int64)
        for m, label in zip(masks, t["labels"]):
            expected[m] = label
        assert torch.equal(t["semantic"], expected)
        assert ((t["labels"] >= 1) & (t["labels"] <= 10)).all()
        for m, box in zip(masks, t["boxes"]):
            x1, y1, x2, y2 = box.long().tolist()
            assert int(m[y1:y2, x1:x2].sum()) == int(m.sum())           # the box holds the whole mask
            assert m[y1, x1:x2].any() and m[y2 - 1, x1:x2].any() and m[y1:y2, x1].any() and m[y1:y2, x2 - 1].any()


def test_later_garments_occlude_earlier_ones(scenes):
    """With many large garments, some instance's box contains pixels of another instance (occlusion), and
    with min_visible=1 every kept garment is whole: the synthetic garments are rectangles, so then no box
    contains another instance's pixels."""
    def occluded(ds):
        for i in range(len(ds)):
            t = ds[i][1]
            for k, (x1, y1, x2, y2) in enumerate(t["boxes"].long().tolist()):
                others = t["masks"][:, y1:y2, x1:x2].clone()
                others[k] = 0
                if others.any():
                    return True
        return False

    assert occluded(scenes(length=10, objects=(5, 6), scale=(0.4, 0.6)))
    assert not occluded(scenes(length=10, objects=(5, 6), scale=(0.2, 0.3), min_visible=1.0))


def test_hidden_garments_are_dropped_and_not_painted(scenes):
    ds = scenes(length=10, objects=(6, 6), scale=(0.5, 0.7), min_visible=0.9)
    counts = [len(ds[i][1]["labels"]) for i in range(len(ds))]
    assert min(counts) < 6          # some garments were hidden enough to be dropped
    for i in range(len(ds)):         # and nothing unlabelled is bright: dropped garments are not painted
        image, t = ds[i]
        assert float(image.mean(0)[t["semantic"] == 0].max()) < 0.6


def test_without_clutter_the_background_is_flat(scenes):
    image, t = scenes(clutter=False)[0]
    background = image[:, t["semantic"] == 0]
    assert background.unique().numel() == 1


def test_mask_to_box_uses_pixel_edges():
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[2, 3] = True
    assert mask_to_box(mask).tolist() == [3.0, 2.0, 4.0, 3.0]


def test_segmentation_collate_stacks_semantic_maps(scenes):
    images, labels = segmentation_collate([scenes()[0], scenes()[1]])
    assert images.shape == (2, 3, 128, 128) and labels.shape == (2, 128, 128) and labels.dtype == torch.int64


def test_256_canvas_and_non_square_canvas(scenes):
    assert scenes(size=256)[0][0].shape == (3, 256, 256)
    assert scenes(size=(128, 192))[0][1]["semantic"].shape == (128, 192)


@pytest.mark.parametrize("kwargs, message", [
    (dict(size=16), "too small"), (dict(split="test"), "split"), (dict(objects=(3, 2)), "objects"),
    (dict(scale=(0.5, 1.5)), "scale"), (dict(length=0), "length"), (dict(seed=-1), "seed"),
])
def test_bad_arguments_are_one_line_errors(scenes, kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        scenes(**kwargs)
    assert "\n" not in str(e.value)


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_train_scenes_use_the_train_split_and_val_scenes_the_test_split(tmp_path, monkeypatch):
    """Fake idx files whose train garments are all 100 and test garments all 200."""
    for stem, value, n in (("train", 100, 12), ("t10k", 200, 5)):
        _write_idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", np.full((n, 28, 28), value))
        _write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    monkeypatch.setenv("VITMIX_FASHION_MNIST_DIR", str(tmp_path))
    train = FashionScenes.from_fashion_mnist("train", length=2)
    val = FashionScenes.from_fashion_mnist("val", length=2)
    assert len(train.garments) == 12 and len(val.garments) == 5
    assert torch.all(train.garments == 100) and torch.all(val.garments == 200)
    with pytest.raises(ValueError, match="split"):
        FashionScenes.from_fashion_mnist("test")


@pytest.mark.needs_fashion_mnist
def test_real_fashion_mnist_scenes():
    train = FashionScenes.from_fashion_mnist("train", size=128, length=4)
    val = FashionScenes.from_fashion_mnist("val", size=128, length=4)
    assert (len(train.garments), len(val.garments)) == (60000, 10000)
    image, t = train[0]
    assert image.shape == (3, 128, 128) and len(t["labels"]) >= 1
    assert not torch.equal(image, val[0][0])


def test_min_visible_zero_still_keeps_only_instances_with_visible_pixels(scenes):
    ds = scenes(length=6, objects=(6, 6), scale=(0.5, 0.7), min_visible=0.0)
    assert all(int(m.sum()) > 0 for i in range(len(ds)) for m in ds[i][1]["masks"])
