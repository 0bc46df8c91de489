"""Video clip datasets: items are ``(clip, label)`` with ``clip`` a float tensor ``(C, T, H, W)``.

* :class:`MovingFashionMNIST` (``--data moving-fashion-mnist``): generated, deterministic clips of a
  Fashion-MNIST item (halved to 14×14) gliding across a black canvas; the label is the direction of
  motion (right, left, down, up). The path is drawn so that a clip with direction ``d`` and the one
  with the opposite direction from the same random draw hold *the same frames in reverse order*: a
  model that ignores frame order (one frame, or frames averaged) cannot tell ``d`` from ``-d`` and
  is at best 50 % right, where 25 % is chance — only temporal mixing solves the task.
* :class:`ClipFolder` (``--data clipfolder --data-dir DIR``): ``DIR/{train,val}/<class>/<clip>/``
  with each clip a folder of frame images (sorted by name), sampled to ``T`` evenly spaced frames.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

__all__ = ["MovingFashionMNIST", "ClipFolder", "DIRECTIONS", "FRAME_SUFFIXES", "clip_path", "shrink_half"]

#: label → unit step (dy, dx) on the canvas
DIRECTIONS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}
#: frame files a clip folder may hold
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
ITEM_SIZE = 14


def shrink_half(images: np.ndarray) -> np.ndarray:
    """``(N, 28, 28)`` uint8 → ``(N, 14, 14)`` uint8 by 2×2 averaging (rounded)."""
    n, h, w = images.shape
    blocks = images.reshape(n, h // 2, 2, w // 2, 2).astype(np.float32).mean(axis=(2, 4))
    return np.round(blocks).astype(np.uint8)


def clip_path(direction: int, num_frames: int, canvas: int, rng: np.random.Generator,
              item: int = ITEM_SIZE) -> Tuple[np.ndarray, np.ndarray]:
    """Top-left corners ``(rows, cols)`` of the item in each of ``num_frames`` frames.

    The speed is the largest whole step that keeps the item inside the canvas; the lowest position
    along the axis of motion and the position across it are drawn from ``rng`` *before* the
    direction is used, so ``d`` and its opposite give the same positions in reverse order."""
    room = canvas - item
    speed = room // max(num_frames - 1, 1)
    if speed < 1:
        raise ValueError(f"a {canvas}×{canvas} canvas leaves no room to move a {item}×{item} item over "
                         f"{num_frames} frames; use an image size of at least {item + num_frames - 1}")
    low = int(rng.integers(0, room - speed * (num_frames - 1) + 1))
    across = int(rng.integers(0, room + 1))
    dy, dx = list(DIRECTIONS.values())[direction]
    steps = np.arange(num_frames) if dx + dy > 0 else np.arange(num_frames)[::-1]
    along = low + speed * steps
    if dx:
        return np.full(num_frames, across), along
    return along, np.full(num_frames, across)


class MovingFashionMNIST(Dataset):
    """``length`` generated clips ``(1, T, H, W)`` (normalised with ``mean``/``std``), label = direction.

    Clip ``i`` depends only on ``(seed, i)``: its Fashion-MNIST item, its direction and its path are
    drawn from ``numpy.random.default_rng([seed, i])``, so every run, worker and machine sees the
    same clips. ``items``: ``(M, 28, 28)`` uint8 Fashion-MNIST images (train split for training).
    """

    classes = tuple(DIRECTIONS)

    def __init__(self, items: np.ndarray, length: int, num_frames: int = 8, img_size: int = 32, seed: int = 0,
                 mean: float = 0.0, std: float = 1.0):
        if items.ndim != 3 or items.shape[1:] != (28, 28):
            raise ValueError(f"items must be Fashion-MNIST images (M, 28, 28), got {items.shape}")
        if length <= 0 or num_frames <= 0:
            raise ValueError(f"length={length} and num_frames={num_frames} must be positive")
        self.items = shrink_half(items)
        self.length, self.num_frames, self.img_size, self.seed = int(length), int(num_frames), int(img_size), seed
        self.mean, self.std = float(mean), float(std)
        clip_path(0, self.num_frames, self.img_size, np.random.default_rng(0))   # too small a canvas: fail now

    def __len__(self) -> int:
        return self.length

    def draw(self, index: int) -> Tuple[np.ndarray, int, int, np.random.Generator]:
        """The random choices of clip ``index``: ``(item image, item index, direction, rng for the path)``."""
        if not 0 <= index < self.length:
            raise IndexError(f"clip {index} out of range for {self.length} clips")
        rng = np.random.default_rng([self.seed, index])
        item = int(rng.integers(len(self.items)))
        direction = int(rng.integers(len(DIRECTIONS)))
        return self.items[item], item, direction, rng

    def frames(self, index: int, direction: Optional[int] = None) -> Tuple[np.ndarray, int]:
        """``(uint8 frames (T, H, W), label)`` of clip ``index``; ``direction`` overrides the drawn one
        (the same item and path draw, e.g. to compare a clip with its opposite)."""
        image, _, drawn, rng = self.draw(index)
        direction = drawn if direction is None else int(direction)
        rows, cols = clip_path(direction, self.num_frames, self.img_size, rng)
        out = np.zeros((self.num_frames, self.img_size, self.img_size), dtype=np.uint8)
        for t, (r, c) in enumerate(zip(rows, cols)):
            out[t, r:r + ITEM_SIZE, c:c + ITEM_SIZE] = image
        return out, direction

    def __getitem__(self, index: int):
        frames, label = self.frames(index)
        clip = (torch.from_numpy(frames).float() / 255.0 - self.mean) / self.std
        return clip.unsqueeze(0), label


def _frame_files(clip: Path) -> list:
    return sorted(p for p in clip.iterdir() if p.is_file() and p.suffix.lower() in FRAME_SUFFIXES)


class ClipFolder(Dataset):
    """Clips stored as folders of frame images under ``root/<class>/<clip>/`` (classes and clips sorted).

    Each clip is read as ``num_frames`` evenly spaced frames (a shorter clip repeats frames), each
    resized to ``img_size``² (bilinear) and normalised per channel; items are ``(C, T, H, W)`` tensors.
    ``classes`` fixes the class list (e.g. the train split's for ``val``)."""

    def __init__(self, root, num_frames: int = 8, img_size: int = 32, in_chans: int = 3, mean: Sequence[float] = (0.5,),
                 std: Sequence[float] = (0.5,), classes: Optional[Sequence[str]] = None):
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"clip folder {root} does not exist")
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        if classes is not None and found != list(classes):
            raise ValueError(f"class folders of {root} ({found}) differ from {list(classes)}")
        if not found:
            raise ValueError(f"{root} has no class folders; expected {root}/<class>/<clip>/<frame images>")
        self.root, self.classes, self.num_frames, self.img_size = root, tuple(found), int(num_frames), int(img_size)
        self.mode = {1: "L", 3: "RGB"}[in_chans]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1, 1)
        self.clips = [(clip, label) for label, name in enumerate(found) for clip in self._class_clips(root / name)]

    @staticmethod
    def _class_clips(folder: Path) -> list:
        clips = sorted(p for p in folder.iterdir() if p.is_dir())
        if not clips:
            raise ValueError(f"class folder {folder} holds no clip folders; each clip is a folder of frame images")
        for clip in clips:
            if not _frame_files(clip):
                raise ValueError(f"clip folder {clip} holds no frame images ({', '.join(FRAME_SUFFIXES)})")
        return clips

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, index: int):
        clip, label = self.clips[index]
        files = _frame_files(clip)
        picks = np.linspace(0, len(files) - 1, self.num_frames).round().astype(int)
        frames = []
        for i in picks:
            with Image.open(files[i]) as img:
                img = img.convert(self.mode).resize((self.img_size, self.img_size), Image.BILINEAR)
                frames.append(torch.from_numpy(np.asarray(img, dtype=np.float32).copy()) / 255.0)
        video = torch.stack(frames)                                   # (T, H, W) or (T, H, W, 3)
        video = video.unsqueeze(0) if video.dim() == 3 else video.permute(3, 0, 1, 2)
        return (video - self.mean) / self.std, label
