"""Sequence datasets: the ListOps generator and evaluator against hand-worked expressions, Pathfinder labels
against an independent connectedness check, sequential Fashion-MNIST, the on-disk cache and the registry."""
import gzip
import warnings
from collections import deque

import numpy as np
import pytest

from vitmix.data import build_datasets, build_sequence_datasets, is_sequence_dataset, list_datasets
from vitmix.data import listops, pathfinder
from vitmix.data.sequences import cached


# --- ListOps ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MIN 4 7 ]", 4),
    ("[SM 5 6 7 ]", 8),                        # 18 mod 10
    ("[MED 2 9 4 ]", 4),                       # odd count: the middle value
    ("[MED 1 5 3 9 ]", 4),                     # even count: (3 + 5) / 2
    ("[MED 1 2 ]", 1),                         # even count, mean 1.5 rounded down as LRA's int(np.median)
    ("[SM [MAX 3 8 ] [MED 7 1 5 ] 9 ]", 2),    # 8 + 5 + 9 = 22
    ("[MIN [SM 9 9 ] 3 ]", 3),                 # SM gives 8
    ("[MAX [MIN 9 [MED 6 8 1 ] ] 2 ]", 6),
    ("7", 7),
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),             # LRA's text with its parentheses
])
def test_listops_evaluates_hand_worked_expressions(text, value):
    assert listops.evaluate(text) == value


@pytest.mark.parametrize("text, message", [
    ("[MAX 2 9", "incomplete"), ("[MAX 2 ] 3", "continues after its end"), ("[MAX ]", "without"),
    ("[MAX 2 12 ]", "unknown ListOps token '12'"), ("[AVG 1 2 ]", "unknown ListOps token"),
])
def test_listops_malformed_expressions_are_named(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        listops.evaluate(text)


def _operator_depth(tokens):
    depth = deepest = 0
    for t in tokens:
        depth += (t in listops.OPERATORS) - (t == listops.CLOSE)
        deepest = max(deepest, depth)
    return deepest


def test_listops_samples_follow_the_recipe_and_their_labels_evaluate():
    for i in range(30):
        tokens, value = listops.sample(f"0/train/{i}")              # LRA's defaults: 500 < length < 2000
        assert 500 < len(tokens) < 2000 and listops.evaluate(tokens) == value
        assert _operator_depth(tokens) <= listops.MAX_DEPTH - 1     # the root is depth 1, digits at depth 10
    small = [listops.sample(f"1/val/{i}", min_len=5, max_len=30, max_depth=4, max_args=3) for i in range(200)]
    assert all(5 < len(t) < 30 and _operator_depth(t) <= 3 and listops.evaluate(t) == v for t, v in small)
    assert len({v for _, v in small}) >= 8                          # labels spread over the digits
    # 2..max_args arguments: count each operator's direct arguments
    for tokens, _ in small:
        stack = []
        for t in tokens:
            if t in listops.OPERATORS:
                stack.append(0)
            elif t == listops.CLOSE:
                assert 2 <= stack.pop() <= 3
                if stack:
                    stack[-1] += 1
            elif stack:
                stack[-1] += 1


def test_listops_is_deterministic_and_ids_round_trip():
    a, b = listops.sample("7/train/3", 5, 40), listops.sample("7/train/3", 5, 40)
    assert a == b and listops.sample("8/train/3", 5, 40) != a
    ids = listops.encode(a[0])
    assert ids.dtype == np.uint8 and ids.max() < len(listops.VOCAB) and listops.decode(ids) == " ".join(a[0])
    with pytest.raises(ValueError, match="unknown ListOps token"):
        listops.encode(["[MAX", "x"])


def test_listops_rejects_lengths_its_depth_cannot_reach():
    assert listops.longest(3, 2) == 2 + 2 * (2 + 2 * 1)
    with pytest.raises(ValueError, match="at most 10 tokens"):
        listops.sample("0", min_len=10, max_len=50, max_depth=3, max_args=2)
    with pytest.raises(ValueError, match="min_len < max_len - 1"):
        listops.sample("0", min_len=20, max_len=21)


# --- Pathfinder -----------------------------------------------------------------------------------------

def _joined(image, a, b, link):
    """Whether a flood fill over the drawn pixels, stepping up to ``link`` pixels (Chebyshev), gets from a to b."""
    on = image > 0
    seen = np.zeros_like(on)
    queue = deque([tuple(a)])
    seen[tuple(a)] = True
    h, w = on.shape
    while queue:
        r, c = queue.popleft()
        if (r, c) == tuple(b):
            return True
        for rr in range(max(r - link, 0), min(r + link + 1, h)):
            for cc in range(max(c - link, 0), min(c + link + 1, w)):
                if on[rr, cc] and not seen[rr, cc]:
                    seen[rr, cc] = True
                    queue.append((rr, cc))
    return False


def test_pathfinder_labels_are_the_connectedness_of_the_markers():
    images, labels, markers = pathfinder.generate(seed=3, split=0, n=40)
    assert images.shape == (40, 32, 32) and set(np.unique(images)) == {0, 255}
    assert labels.sum() == 20                                        # balanced
    gaps = 0
    for image, label, (a, b) in zip(images, labels, markers):
        assert image[a[0] - 1:a[0] + 2, a[1] - 1:a[1] + 2].all() and image[b[0] - 1:b[0] + 2, b[1] - 1:b[1] + 2].all()
        assert _joined(image, a, b, pathfinder.LINK) == bool(label)
        gaps += bool(label) and not _joined(image, a, b, 1)          # a positive broken at 8-connectivity: dashed
    assert gaps >= 10


def test_pathfinder_is_deterministic_per_image_and_checks_its_parameters():
    first = pathfinder.generate(5, 1, 6)
    longer = pathfinder.generate(5, 1, 9)
    np.testing.assert_array_equal(first[0], longer[0][:6])           # image i depends on (seed, split, i) only
    assert not np.array_equal(first[0], pathfinder.generate(6, 1, 6)[0])
    with pytest.raises(ValueError, match="gap"):
        pathfinder.generate(0, 0, 1, pathfinder.PathfinderParams(gap=3))
    with pytest.raises(ValueError, match="size >= 12"):
        pathfinder.PathfinderParams(size=8).check()
    with pytest.raises(ValueError, match="do not fit a 12x12 image"):            # bounded, not an endless retry
        pathfinder.generate(0, 0, 1, pathfinder.PathfinderParams(size=12, dashes=12, dash=3))


# --- the cache -----------------------------------------------------------------------------------------

def test_cache_writes_once_reads_back_and_remakes_a_broken_file(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return {"x": np.arange(5)}
    first = cached(tmp_path, "demo", {"seed": 1}, make)
    again = cached(tmp_path, "demo", {"seed": 1}, make)
    np.testing.assert_array_equal(first["x"], again["x"])
    assert len(calls) == 1 and sorted(p.name for p in tmp_path.iterdir())[0].startswith("demo-")
    cached(tmp_path, "demo", {"seed": 2}, make)                       # another key: another file
    assert len(calls) == 2 and len(list(tmp_path.iterdir())) == 2
    path = min(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime)
    path.write_bytes(b"not a zip")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        remade = cached(tmp_path, "demo", {"seed": 1}, make)
    assert len(calls) == 3 and remade["x"].tolist() == [0, 1, 2, 3, 4]
    with open(path, "wb") as f:                                       # readable, but made for another key
        np.savez(f, key=np.array("{}"), x=np.zeros(5))
    with pytest.warns(RuntimeWarning, match="made for other parameters"):
        assert cached(tmp_path, "demo", {"seed": 1}, make)["x"].tolist() == [0, 1, 2, 3, 4]
    assert len(calls) == 4
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_generated_sets_are_cached_keyed_by_seed_size_and_options(tmp_path, monkeypatch):
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    train, val, info = build_sequence_datasets("listops", train_size=12, val_size=4, min_len=5, max_len=30,
                                               progress=False)
    assert (len(train), len(val), info.seq_len, info.vocab_size, info.num_classes) == (12, 4, 30, 16, 10)
    ids, label = train[0]
    assert ids.shape == (30,) and listops.evaluate(listops.decode(ids.tolist())) == label
    assert ids[-1] == listops.PAD_ID                                  # padded to max_len
    files = sorted((tmp_path / "datasets").iterdir())
    assert len(files) == 2

    def no_generating(*args, **kwargs):
        raise AssertionError("generated a set again")
    monkeypatch.setattr(listops, "sample", no_generating)
    again, _, _ = build_sequence_datasets("listops", train_size=12, val_size=4, min_len=5, max_len=30,
                                          progress=False)
    assert [again[i][1] for i in range(12)] == [train[i][1] for i in range(12)]
    for other in ({"seed": 1}, {"train_size": 13}, {"max_args": 3}):     # each is part of the key
        with pytest.raises(AssertionError, match="generated a set again"):
            build_sequence_datasets("listops", **{"train_size": 12, "val_size": 4, "min_len": 5, "max_len": 30,
                                                  "progress": False, **other})


def test_pathfinder_dataset_gives_pixel_tokens(tmp_path):
    train, val, info = build_sequence_datasets("pathfinder", data_dir=str(tmp_path), train_size=4, val_size=2,
                                               distractors=2, progress=False)
    assert (info.name, info.seq_len, info.vocab_size, info.input_kind) == ("pathfinder32", 1024, 256, "pixels")
    ids, label = train[1]
    assert ids.shape == (1024,) and set(ids.unique().tolist()) == {0, 255} and label == 1
    assert len(list(tmp_path.glob("pathfinder32-*.npz"))) == 2
    more, _, _ = build_sequence_datasets("pathfinder", data_dir=str(tmp_path), train_size=6, val_size=2,
                                         distractors=2, progress=False)
    assert len(more) == 6 and more[1][0].tolist() == ids.tolist()  # its own file (the count is in the key), nested
    assert len(list(tmp_path.glob("pathfinder32-*.npz"))) == 3


# --- sequential Fashion-MNIST --------------------------------------------------------------------------

def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_sfashion_mnist_is_raster_order_pixel_tokens(tmp_path):
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (n, 28, 28)) for s, n in (("train", 6), ("t10k", 3))}
    for split, imgs in images.items():
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", imgs)
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", np.arange(len(imgs)))
    train, val, info = build_sequence_datasets("sfashion-mnist", data_dir=str(tmp_path))
    assert (len(train), len(val), info.seq_len, info.classes[9]) == (6, 3, 784, "Ankle boot")
    ids, label = train[4]
    assert ids.tolist() == images["train"][4].reshape(-1).tolist() and label == 4
    assert len(build_sequence_datasets("sfmnist", data_dir=str(tmp_path), train_size=2, val_size=1)[0]) == 2
    with pytest.raises(ValueError, match="has 6 train images, fewer than the 7"):
        build_sequence_datasets("sfashion-mnist", data_dir=str(tmp_path), train_size=7)


def test_sfashion_mnist_without_the_data_says_how_to_get_it():
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        build_sequence_datasets("sfashion-mnist")


@pytest.mark.needs_fashion_mnist
def test_sfashion_mnist_reads_the_system_package():
    train, val, info = build_sequence_datasets("sfashion-mnist")
    assert (len(train), len(val)) == (60000, 10000) and train[0][0].shape == (784,)


# --- the registry ------------------------------------------------------------------------------------

def test_sequence_datasets_are_named_and_kept_apart_from_image_datasets():
    assert {"listops", "pathfinder32", "sfashion-mnist"} <= set(list_datasets())
    assert is_sequence_dataset("ListOps") and is_sequence_dataset("pathfinder") and not is_sequence_dataset("digits")
    with pytest.raises(ValueError, match="listops holds 1-D token sequences, not images"):
        build_datasets("listops", img_size=32)
    with pytest.raises(ValueError, match="digits is not a sequence dataset"):
        build_sequence_datasets("digits")
    with pytest.raises(ValueError, match="Did you mean: listops"):
        build_sequence_datasets("listop")
    with pytest.raises(ValueError, match="no option 'max_lenn'. Did you mean: max_len"):
        build_sequence_datasets("listops", max_lenn=3)
    with pytest.raises(ValueError, match="sfashion-mnist has no option 'x'. Options: seed, train_size, val_size$"):
        build_sequence_datasets("sfashion-mnist", x=1)
    with pytest.raises(ValueError, match="no option 'trian_size'. Did you mean: train_size"):
        build_sequence_datasets("listops", trian_size=1)
    with pytest.raises(ValueError, match="sizes must be positive"):
        build_sequence_datasets("listops", train_size=0)


def test_sequence_info_gives_the_model_its_sizes(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, info = build_sequence_datasets("listops", data_dir=str(tmp_path), train_size=1, val_size=1,
                                             min_len=3, max_len=12, progress=False)
    assert info.kind == "sequence"
    assert info.model_kwargs() == {"num_classes": 10, "seq_len": 12, "vocab_size": 16, "pad_id": 0}   # 0 pads


def test_training_an_image_model_on_a_sequence_set_is_a_one_line_cli_error(tmp_path, capsys):
    from vitmix.cli import main

    assert main(["train", "--data", "listops", "--model", "vit_nano_patch4_32", "--epochs", "1",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "listops holds 1-D token sequences, not images" in err[0], err
    assert not (tmp_path / "run").exists()
