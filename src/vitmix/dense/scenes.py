"""``fashion-scenes``: Fashion-MNIST garments composed onto larger canvases, for segmentation and detection.

Every scene is a pure function of ``(seed, split, index)``: it is drawn in ``__getitem__`` from a NumPy
generator keyed to those three numbers, so it is the same in every run, every DataLoader worker and at
every world size, and nothing is written to disk (``save_coco`` / ``save_mask_folder`` write a set when
asked). Train scenes use only garments of Fashion-MNIST's train split, validation scenes only those of
its test split (``FashionScenes.from_fashion_mnist``).

A scene holds 2–5 garments (by default) at random sizes and positions, painted back to front with a
random tint each, so later garments occlude earlier ones; optional clutter (faint rectangles and noise)
sits under them. The targets describe what is *visible*: an instance's mask is its garment minus what
covers it, its box the tight box of that mask, and a garment left with less than ``min_visible`` of its
own area is dropped entirely (not painted), so the semantic map is exactly the union of the instance
masks. Labels: 0 background, ``1 + c`` for Fashion-MNIST class ``c``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..data.datasets import FASHION_MNIST_CLASSES

#: class names of the labels, index = label (0 is the background)
SCENE_CLASSES = ("background",) + FASHION_MNIST_CLASSES
NUM_SCENE_CLASSES = len(SCENE_CLASSES)   # 11
_SPLIT_KEYS = {"train": 0, "val": 1}
_GARMENT_THRESHOLD = 0.1   # a garment pixel is its intensity above this (Fashion-MNIST backgrounds are 0)


@dataclass
class Scene:
    """One composed scene: ``image`` float32 ``(3, H, W)`` in [0, 1]; ``semantic`` int64 ``(H, W)``;
    per visible instance, back to front: ``masks`` bool ``(K, H, W)``, ``boxes`` float32 ``(K, 4)``
    as ``x1, y1, x2, y2`` (pixel edges, so a one-pixel mask has a box of width 1), ``labels`` int64 ``(K,)``."""

    image: torch.Tensor
    semantic: torch.Tensor
    masks: torch.Tensor
    boxes: torch.Tensor
    labels: torch.Tensor


def mask_to_box(mask: torch.Tensor) -> torch.Tensor:
    """The tight ``x1, y1, x2, y2`` box (pixel edges) of a non-empty boolean ``(H, W)`` mask."""
    ys = torch.nonzero(mask.any(1)).flatten()
    xs = torch.nonzero(mask.any(0)).flatten()
    return torch.tensor([xs[0], ys[0], xs[-1] + 1, ys[-1] + 1], dtype=torch.float32)


class FashionScenes(Dataset):
    """Seeded scenes of garments; items are ``(image, target)`` in torchvision's detection format
    (``target``: ``boxes``, ``labels``, ``masks`` (uint8), ``semantic``, ``image_id``).

    Args:
        garments: uint8 ``(N, h, w)`` grey garments on a black background (Fashion-MNIST's 28×28).
        garment_labels: ``(N,)`` classes 0–9 of ``garments``.
        size: canvas side (or ``(H, W)``); at least 32.
        length: number of scenes (the dataset's ``len``).
        seed: the scenes' seed; ``split`` ("train" / "val") is part of the key too.
        objects: (min, max) garments drawn per scene (before dropping hidden ones).
        scale: (min, max) garment side as a fraction of the canvas' shorter side.
        clutter: faint rectangles and noise in the background (never labelled).
        min_visible: a garment keeps its instance only if this fraction of its pixels stays visible.
    """

    def __init__(self, garments: np.ndarray, garment_labels: np.ndarray, size=128, length: int = 1000,
                 seed: int = 0, split: str = "train", objects: Tuple[int, int] = (2, 5),
                 scale: Tuple[float, float] = (0.2, 0.5), clutter: bool = True, min_visible: float = 0.3):
        self.size = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        _check_arguments(garments, garment_labels, self.size, length, seed, split, objects, scale, min_visible)
        self.garments = torch.from_numpy(np.array(garments, copy=True))   # uint8: 47 MB for Fashion-MNIST's train split
        self.garment_labels = np.asarray(garment_labels, dtype=np.int64)
        self.length, self.seed, self.split = int(length), int(seed), split
        self.objects, self.scale, self.clutter, self.min_visible = tuple(objects), tuple(scale), clutter, min_visible
        self.classes = SCENE_CLASSES

    @classmethod
    def from_fashion_mnist(cls, split: str, data_dir: Optional[str] = None, **kwargs) -> "FashionScenes":
        """Scenes of Fashion-MNIST's train split (``split="train"``) or test split (``split="val"``),
        read where vitmix reads Fashion-MNIST (``data_dir``, else ``$VITMIX_FASHION_MNIST_DIR`` or
        Debian's folder)."""
        from ..data.datasets import build_datasets

        if split not in _SPLIT_KEYS:
            raise ValueError(f"fashion-scenes split must be 'train' or 'val', got {split!r}")
        train, val, _ = build_datasets("fashion-mnist", 28, data_dir=data_dir)
        source = train if split == "train" else val
        return cls(source.images, source.labels, split=split, **kwargs)

    def __len__(self) -> int:
        return self.length

    def rng(self, index: int) -> np.random.Generator:
        """The generator that draws scene ``index``: keyed to (seed, split, index) only."""
        return np.random.default_rng([self.seed, _SPLIT_KEYS[self.split], int(index)])

    def scene(self, index: int) -> Scene:
        """Compose scene ``index`` (``0 <= index < len(self)``)."""
        if not 0 <= index < self.length:
            raise IndexError(f"scene index {index} out of range for {self.length} scenes")
        rng = self.rng(index)
        height, width = self.size
        image = _background(rng, self.size, self.clutter)
        placed = [self._place(rng) for _ in range(int(rng.integers(self.objects[0], self.objects[1] + 1)))]
        kept = _visible_instances(placed, self.size, self.min_visible)
        semantic = torch.zeros(self.size, dtype=torch.int64)
        for item in placed:   # back to front: later garments cover earlier ones
            if item["keep"]:
                alpha = item["canvas_alpha"]
                image = image * (1 - alpha) + alpha * item["colour"][:, None, None]
        masks = torch.stack([k["visible"] for k in kept]) if kept else torch.zeros((0, height, width), dtype=torch.bool)
        labels = torch.tensor([k["label"] for k in kept], dtype=torch.int64)
        for mask, label in zip(masks, labels):
            semantic[mask] = label
        boxes = torch.stack([mask_to_box(m) for m in masks]) if kept else torch.zeros((0, 4))
        return Scene(image.clamp_(0, 1), semantic, masks, boxes, labels)

    def __getitem__(self, index: int):
        s = self.scene(index)
        target = dict(boxes=s.boxes, labels=s.labels, masks=s.masks.to(torch.uint8), semantic=s.semantic,
                      image_id=int(index))
        return s.image, target

    def _place(self, rng: np.random.Generator) -> dict:
        """Draw one garment, its size, position and tint; its mask on the full canvas."""
        height, width = self.size
        g = int(rng.integers(len(self.garments)))
        side = max(4, int(round(rng.uniform(*self.scale) * min(height, width))))
        top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
        colour = torch.from_numpy(rng.uniform(0.35, 1.0, size=3)).float()
        resized = F.interpolate(self.garments[g][None, None].float().div_(255), size=(side, side), mode="bilinear",
                                align_corners=False)[0, 0]
        alpha = torch.zeros(self.size)
        alpha[top:top + side, left:left + side] = resized
        mask = alpha > _GARMENT_THRESHOLD
        return dict(label=1 + int(self.garment_labels[g]), colour=colour, mask=mask,
                    canvas_alpha=alpha * mask)   # only labelled pixels change the image


def _visible_instances(placed: List[dict], size, min_visible: float) -> List[dict]:
    """Mark which placed garments stay (front to back) and give each its visible mask; back to front."""
    covered = torch.zeros(size, dtype=torch.bool)
    for item in reversed(placed):
        visible = item["mask"] & ~covered
        area = int(item["mask"].sum())
        item["keep"] = int(visible.sum()) > 0 and int(visible.sum()) >= min_visible * area
        if item["keep"]:
            item["visible"] = visible
            covered |= item["mask"]
    return [item for item in placed if item["keep"]]


def _background(rng: np.random.Generator, size, clutter: bool) -> torch.Tensor:
    """A dark canvas; with ``clutter``, faint rectangles and pixel noise (background, never labelled)."""
    height, width = size
    image = torch.full((3, height, width), float(rng.uniform(0.0, 0.15)))
    if not clutter:
        return image
    for _ in range(int(rng.integers(1, 5))):
        h, w = (int(rng.integers(2, max(3, s // 3))) for s in size)
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        image[:, top:top + h, left:left + w] = torch.from_numpy(rng.uniform(0.0, 0.3, size=(3, 1, 1))).float()
    noise = torch.from_numpy(rng.normal(0.0, 0.04, size=(3, height, width))).float()
    return image + noise


def _check_arguments(garments, labels, size, length, seed, split, objects, scale, min_visible) -> None:
    if split not in _SPLIT_KEYS:
        raise ValueError(f"fashion-scenes split must be 'train' or 'val', got {split!r}")
    if garments.ndim != 3 or garments.dtype != np.uint8 or len(garments) == 0:
        raise ValueError(f"garments must be a non-empty uint8 array (N, h, w), got {garments.dtype} {garments.shape}")
    if len(labels) != len(garments) or (len(labels) and not 0 <= int(np.min(labels)) <= int(np.max(labels)) < 10):
        raise ValueError(f"garment_labels must hold one class 0-9 per garment ({len(garments)}), got {len(labels)}")
    if min(size) < 32:
        raise ValueError(f"fashion-scenes canvas {size[0]}x{size[1]} is too small: use at least 32x32 (128 or 256)")
    if seed < 0:
        raise ValueError(f"fashion-scenes seed must be >= 0, got {seed}")
    if length < 1:
        raise ValueError(f"fashion-scenes length must be at least 1, got {length}")
    if not 1 <= objects[0] <= objects[1]:
        raise ValueError(f"objects must be (min, max) with 1 <= min <= max, got {objects}")
    if not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError(f"scale must be (min, max) fractions of the canvas with 0 < min <= max <= 1, got {scale}")
    if not 0 <= min_visible <= 1:
        raise ValueError(f"min_visible must be in [0, 1], got {min_visible}")


def detection_collate(batch: Sequence) -> Tuple[List[torch.Tensor], List[Dict]]:
    """Lists of images and targets, as torchvision's detection models take them."""
    images, targets = zip(*batch)
    return list(images), list(targets)


def segmentation_collate(batch: Sequence) -> Tuple[torch.Tensor, torch.Tensor]:
    """Stacked images ``(B, 3, H, W)`` and semantic maps ``(B, H, W)`` (same-size items)."""
    images, targets = zip(*batch)
    return torch.stack(images), torch.stack([t["semantic"] for t in targets])
