"""Video data: the generated moving-Fashion-MNIST clips (deterministic, solvable only from motion) and
the folder-of-clips loader with its one-line errors."""
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitmix.data import ClipFolder, MovingFashionMNIST, build_datasets, is_video_dataset
from vitmix.data.video import DIRECTIONS, clip_path, shrink_half

OPPOSITE = {0: 1, 1: 0, 2: 3, 3: 2}       # right <-> left, down <-> up (DIRECTIONS order)


def _items(n: int = 40, seed: int = 0) -> np.ndarray:
    """Fashion-MNIST-like items: random 28×28 uint8 blobs (no download needed)."""
    rng = np.random.default_rng(seed)
    items = np.zeros((n, 28, 28), dtype=np.uint8)
    items[:, 4:24, 6:22] = rng.integers(60, 255, (n, 20, 16))
    return items


def test_clips_are_deterministic_and_have_the_documented_shape():
    a = MovingFashionMNIST(_items(), 50, num_frames=8, img_size=32, seed=3, mean=0.1, std=0.2)
    b = MovingFashionMNIST(_items(), 50, num_frames=8, img_size=32, seed=3, mean=0.1, std=0.2)
    other = MovingFashionMNIST(_items(), 50, num_frames=8, img_size=32, seed=4, mean=0.1, std=0.2)
    clip, label = a[7]
    assert clip.shape == (1, 8, 32, 32) and clip.dtype == torch.float32 and label in range(4)
    assert all(torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in range(50))
    assert any(not torch.equal(a[i][0], other[i][0]) for i in range(50))
    frames, _ = a.frames(7)
    torch.testing.assert_close(clip[0], (torch.from_numpy(frames).float() / 255 - 0.1) / 0.2, rtol=0, atol=0)
    assert sorted(np.bincount([a[i][1] for i in range(50)], minlength=4)) == sorted(
        np.bincount([a.draw(i)[2] for i in range(50)], minlength=4))


def test_items_are_halved_by_2x2_means():
    items = np.arange(2 * 28 * 28).reshape(2, 28, 28).astype(np.uint8)
    want = items.astype(np.float64).reshape(2, 14, 2, 14, 2).mean(axis=(2, 4))
    np.testing.assert_array_equal(shrink_half(items), np.round(want).astype(np.uint8))


def test_the_item_moves_by_a_constant_step_and_stays_on_the_canvas():
    ds = MovingFashionMNIST(_items(), 20, num_frames=8, img_size=32)
    for i in range(20):
        frames, label = ds.frames(i)
        image = ds.items[ds.draw(i)[1]]
        mass = frames.reshape(8, -1).sum(axis=1)
        assert (mass == int(image.sum())).all()          # the whole 14×14 item is in every frame
        ys, xs = zip(*[np.argwhere(f).min(axis=0) for f in frames])
        dy, dx = DIRECTIONS[MovingFashionMNIST.classes[label]]
        steps = np.diff(xs if dx else ys)
        assert len(set(steps)) == 1 and np.sign(steps[0]) == (dx or dy) and abs(steps[0]) == 2  # 18 px // 7
        assert len(set(ys if dx else xs)) == 1


def test_a_clip_and_its_opposite_hold_the_same_frames_in_reverse_order():
    """So any model that ignores frame order (one frame, frames averaged) cannot tell d from -d."""
    ds = MovingFashionMNIST(_items(), 30, num_frames=8, img_size=32)
    for i in range(30):
        frames, label = ds.frames(i)
        reverse, opposite = ds.frames(i, direction=OPPOSITE[label])
        assert opposite == OPPOSITE[label]
        np.testing.assert_array_equal(reverse, frames[::-1])


def test_a_frame_averaged_model_is_at_chance_on_the_direction_and_motion_solves_it():
    """Logistic regression on the mean frame can at best find the axis, 50 % (measured: 34 %, it overfits
    1024 pixels on 600 clips); on the last minus the first frame (the motion): 100 %. 400 held-out clips
    (binomial noise ±5 % at 50 %, so 58 % would already be a leak)."""
    from sklearn.linear_model import LogisticRegression

    items = _items(200, seed=1)
    train = MovingFashionMNIST(items[:150], 600, num_frames=8, img_size=32, seed=0)
    test = MovingFashionMNIST(items[150:], 400, num_frames=8, img_size=32, seed=1)

    def features(ds, motion):
        clips = [ds.frames(i) for i in range(len(ds))]
        x = np.stack([(f[-1].astype(np.float32) - f[0]) if motion else f.mean(axis=0) for f, _ in clips]) / 255
        return x.reshape(len(ds), -1), np.array([label for _, label in clips])

    scores = {}
    for motion in (False, True):
        x, y = features(train, motion)
        xt, yt = features(test, motion)
        scores[motion] = LogisticRegression(max_iter=300, C=0.1).fit(x, y).score(xt, yt)
    assert scores[False] < 0.58          # the axis only (chance within the axis): 50 % + noise
    assert scores[True] > 0.9


def test_small_canvas_and_bad_items_raise_value_errors():
    with pytest.raises(ValueError, match="no room to move"):
        MovingFashionMNIST(_items(), 10, num_frames=8, img_size=16)
    with pytest.raises(ValueError, match=r"\(M, 28, 28\)"):
        MovingFashionMNIST(np.zeros((4, 8, 8), np.uint8), 10)
    with pytest.raises(IndexError):
        MovingFashionMNIST(_items(), 10)[10]
    rows, cols = clip_path(0, 15, 32, np.random.default_rng(0))     # 16 frames would need 14 + 15 px
    assert (np.diff(cols) == 1).all() and len(set(rows)) == 1


def _write_idx(path: Path, array: np.ndarray):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def fake_fashion_mnist(root: Path) -> Path:
    """A tiny Fashion-MNIST in IDX files (train 40, test 20 items) for ``--data-dir``."""
    for split, n in (("train", 40), ("t10k", 20)):
        _write_idx(root / f"{split}-images-idx3-ubyte.gz", _items(n))
        _write_idx(root / f"{split}-labels-idx1-ubyte.gz", np.zeros(n))
    return root


def test_build_datasets_gives_moving_fashion_mnist_clips(tmp_path):
    train, val, info = build_datasets("moving-fashion-mnist", 32, str(fake_fashion_mnist(tmp_path)), num_frames=6)
    assert is_video_dataset("moving_fashion_mnist") and not is_video_dataset("digits")
    assert (len(train), len(val)) == (10000, 2000) and info.num_frames == 6 and info.in_chans == 1
    assert info.classes == ("right", "left", "down", "up") and train[0][0].shape == (1, 6, 32, 32)
    assert not torch.equal(train[0][0], val[0][0])       # other seed, other items
    assert build_datasets("moving-fmnist", 32, str(tmp_path))[2].num_frames == 8
    with pytest.raises(ValueError, match="--num-frames is for video data"):
        build_datasets("digits", 16, num_frames=8)
    with pytest.raises(ValueError, match="--num-frames 0 must be a positive"):
        build_datasets("moving-fashion-mnist", 32, str(tmp_path), num_frames=0)


# ------------------------------------------------------------------------------ folder of clips
def _clip(folder: Path, frames, size=(12, 10)):
    folder.mkdir(parents=True)
    for t, value in enumerate(frames):
        Image.new("RGB", size, (value, value, 255 - value)).save(folder / f"frame_{t:03d}.png")


def _clip_tree(root: Path):
    for split in ("train", "val"):
        _clip(root / split / "jump" / "c1", [0, 40, 80, 120, 160])
        _clip(root / split / "run" / "c2", [200, 100])
        _clip(root / split / "run" / "c3", [10, 20, 30])
    return root


def test_clip_folder_reads_evenly_spaced_frames(tmp_path):
    _clip_tree(tmp_path)
    ds = ClipFolder(tmp_path / "train", num_frames=3, img_size=8, in_chans=3, mean=(0.0,) * 3, std=(1.0,) * 3)
    assert ds.classes == ("jump", "run") and len(ds) == 3
    clip, label = ds[0]
    assert clip.shape == (3, 3, 8, 8) and label == 0
    # 5 frames sampled at 0, 2, 4: red = 0, 80, 160; blue = 255 - red
    torch.testing.assert_close(clip[0, :, 0, 0], torch.tensor([0, 80, 160]) / 255.0)
    torch.testing.assert_close(clip[2, :, 0, 0], torch.tensor([255, 175, 95]) / 255.0)
    short, label = ds[1]                                   # 2 frames read as 3: the first, one of them again, the last
    assert label == 1 and torch.equal(short[0, 0], clip.new_full((8, 8), 200 / 255))
    assert torch.equal(short[0, -1], clip.new_full((8, 8), 100 / 255))
    train, val, info = build_datasets("clipfolder", 8, str(tmp_path), num_frames=4)
    assert info.num_frames == 4 and info.in_chans == 3 and info.classes == ("jump", "run") and len(val) == 3
    assert train[2][0].shape == (3, 4, 8, 8)


def test_clip_folder_errors_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ClipFolder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no class folders"):
        ClipFolder(tmp_path / "empty")
    (tmp_path / "a" / "cls").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no clip folders"):
        ClipFolder(tmp_path / "a")
    (tmp_path / "a" / "cls" / "clip0").mkdir()
    (tmp_path / "a" / "cls" / "clip0" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="clip0 holds no frame images"):
        ClipFolder(tmp_path / "a")
    with pytest.raises(ValueError, match="needs --data-dir"):
        build_datasets("clipfolder", 8)
    with pytest.raises(FileNotFoundError, match="no train/ or val/ folder"):
        build_datasets("clipfolder", 8, str(tmp_path / "empty"))
    tree = _clip_tree(tmp_path / "tree")
    _clip(tree / "val" / "swim" / "c9", [1])
    with pytest.raises(ValueError, match="differ from"):
        build_datasets("clipfolder", 8, str(tree))
