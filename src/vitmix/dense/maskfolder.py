"""A user's image + mask-PNG folder for semantic segmentation.

Layout: ``ROOT/SPLIT/images/NAME.{png,jpg,jpeg}`` and ``ROOT/SPLIT/masks/NAME.png`` (or, without split
folders, ``ROOT/images`` and ``ROOT/masks``). A mask is a single-channel PNG (mode L or P, as
palette-indexed masks are stored) holding class indices ``0..num_classes-1``, or ``ignore_index`` for
pixels that are not scored. Pairs are checked when the dataset is built (an image without its mask,
a mask without its image); a mask's size and labels are checked when it is read. Each error is one
line naming the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def _folders(root: Path, split: Optional[str]):
    if split and not (root / split).is_dir() and any((root / s).is_dir() for s in ("train", "val")):
        raise FileNotFoundError(f"mask folder: {root / split} not found: with split folders, {root} needs both "
                                f"train/ and val/, each holding images/ and masks/")
    base = root / split if split and (root / split).is_dir() else root
    images, masks = base / "images", base / "masks"
    for folder in (images, masks):
        if not folder.is_dir():
            raise FileNotFoundError(f"mask folder: {folder} not found (expected {base}/images and {base}/masks)")
    return images, masks


class MaskFolder(Dataset):
    """Items ``(image, target)``: ``image`` float32 ``(3, H, W)`` in [0, 1], ``target`` dict with
    ``semantic`` int64 ``(H, W)`` (same format as ``FashionScenes``)."""

    def __init__(self, root, num_classes: int, split: Optional[str] = "train", ignore_index: int = 255):
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes, self.ignore_index = int(num_classes), int(ignore_index)
        image_dir, mask_dir = _folders(Path(root), split)
        images = {p.stem: p for p in sorted(image_dir.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES}
        masks = {p.stem: p for p in sorted(mask_dir.iterdir()) if p.suffix.lower() == ".png"}
        if not images:
            raise FileNotFoundError(f"mask folder: no images ({', '.join(IMAGE_SUFFIXES)}) in {image_dir}")
        for stem, path in images.items():
            if stem not in masks:
                raise FileNotFoundError(f"{path}: no mask {mask_dir / (stem + '.png')}")
        for stem, path in masks.items():
            if stem not in images:
                raise FileNotFoundError(f"{path}: mask without an image in {image_dir}")
        self.samples = [(images[s], masks[s]) for s in sorted(images)]

    def __len__(self) -> int:
        return len(self.samples)

    def read_mask(self, path: Path, size) -> torch.Tensor:
        """The checked label map of ``path`` (``size`` = the image's (W, H))."""
        with Image.open(path) as im:
            if im.mode not in ("L", "P", "I;16", "I"):
                raise ValueError(f"{path}: mask mode {im.mode} is not single-channel; save class indices "
                                 "as a grey (L) or palette (P) PNG")
            if im.size != size:
                raise ValueError(f"{path}: mask is {im.size[0]}x{im.size[1]} but its image is {size[0]}x{size[1]}")
            labels = np.asarray(im, dtype=np.int64)
        bad = (labels >= self.num_classes) & (labels != self.ignore_index)
        if bad.any():
            raise ValueError(f"{path}: mask label {int(labels[bad].max())} is outside the class range "
                             f"0..{self.num_classes - 1} (ignore index {self.ignore_index})")
        return torch.from_numpy(labels)

    def __getitem__(self, index: int):
        image_path, mask_path = self.samples[index]
        with Image.open(image_path) as im:
            size = im.size
            image = np.asarray(im.convert("RGB"))
        semantic = self.read_mask(mask_path, size)
        image = torch.from_numpy(image.copy()).permute(2, 0, 1).float().div_(255)
        return image, dict(semantic=semantic, image_id=index)


def save_mask_folder(dataset, root, split: str = "train", count: Optional[int] = None) -> Path:
    """Write ``count`` items of a segmentation dataset (``target["semantic"]``) as ``root/split/images/*.png``
    and ``root/split/masks/*.png`` (grey PNG of class indices). Returns ``root/split``."""
    base = Path(root) / split
    (base / "images").mkdir(parents=True, exist_ok=True)
    (base / "masks").mkdir(parents=True, exist_ok=True)
    for index in range(len(dataset) if count is None else count):
        image, target = dataset[index]
        name = f"{index:06d}.png"
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(base / "images" / name)
        Image.fromarray(target["semantic"].numpy().astype(np.uint8)).save(base / "masks" / name)
    return base
