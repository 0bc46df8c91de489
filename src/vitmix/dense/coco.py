"""A user's COCO-format folder for detection and instance segmentation (read with pycocotools).

Layout (either works): ``ROOT/annotations/instances_SPLIT.json`` or ``ROOT/instances_SPLIT.json``, and
each image's ``file_name`` under ``ROOT/SPLIT/``, ``ROOT/images/`` or ``ROOT/``. The file is checked
when the dataset is built — every image file exists, every annotation names a listed image and
category, every box lies inside its image — and each problem is one line naming the file. Images with
no annotation are valid (empty targets). Crowd annotations (``iscrowd=1``) are left out of the
targets, as torchvision's references do. Category ids map to labels ``1..K`` in increasing id order
(0 is the background); ``category_ids[label - 1]`` maps back.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

_BOX_TOLERANCE = 1.0   # pixels a box may overhang its image (rounding in exporters)


def find_annotations(root: Path, split: str) -> Path:
    """``instances_SPLIT.json`` under ``root/annotations`` or ``root``; FileNotFoundError naming both."""
    candidates = [root / "annotations" / f"instances_{split}.json", root / f"instances_{split}.json"]
    for path in candidates:
        if path.is_file():
            return path
    patterns = ("instances_*.json", "annotations/instances_*.json")
    found = sorted(p.name for pattern in patterns for p in root.glob(pattern))
    hint = f" (found: {', '.join(found)})" if found else ""
    raise FileNotFoundError(f"COCO annotations {candidates[0]} not found (nor {candidates[1]}){hint}")


class CocoDetection(Dataset):
    """Items ``(image, target)``: ``image`` float32 ``(3, H, W)`` in [0, 1]; ``target`` in torchvision's
    format (``boxes`` xyxy float32, ``labels`` int64 1..K, ``masks`` uint8 ``(K, H, W)`` when every
    annotation has a ``segmentation``, ``image_id`` the COCO id)."""

    def __init__(self, root, split: str = "train"):
        from pycocotools.coco import COCO

        self.root = Path(root)
        self.annotation_file = find_annotations(self.root, split)
        try:
            data = json.loads(self.annotation_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.annotation_file}: not valid JSON ({e})") from None
        _check_coco(data, self.annotation_file)
        self.coco = COCO()
        self.coco.dataset = data
        with contextlib.redirect_stdout(io.StringIO()):
            self.coco.createIndex()
        self.image_ids: List[int] = sorted(self.coco.imgs)
        self.category_ids: List[int] = sorted(self.coco.cats)
        self.classes = ("background",) + tuple(self.coco.cats[c]["name"] for c in self.category_ids)
        self._label = {c: i + 1 for i, c in enumerate(self.category_ids)}
        self.has_masks = all("segmentation" in a and a["segmentation"] for a in data["annotations"])
        self._paths = {i: self._find_image(split, self.coco.imgs[i]["file_name"]) for i in self.image_ids}

    @property
    def num_classes(self) -> int:
        """Categories + background."""
        return len(self.category_ids) + 1

    def _find_image(self, split: str, file_name: str) -> Path:
        for folder in (self.root / split, self.root / "images", self.root):
            if (folder / file_name).is_file():
                return folder / file_name
        raise FileNotFoundError(f"{self.annotation_file}: image {file_name!r} not found in "
                                f"{self.root / split}, {self.root / 'images'} or {self.root}")

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, index: int):
        image_id = self.image_ids[index]
        info = self.coco.imgs[image_id]
        path = self._paths[image_id]
        with Image.open(path) as im:
            image = np.asarray(im.convert("RGB"))
        if image.shape[:2] != (info["height"], info["width"]):
            raise ValueError(f"{path}: image is {image.shape[1]}x{image.shape[0]} but "
                             f"{self.annotation_file.name} says {info['width']}x{info['height']}")
        anns = [a for a in self.coco.imgToAnns.get(image_id, []) if not a.get("iscrowd", 0)]
        boxes = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                              for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, info["width"])
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, info["height"])
        labels = torch.tensor([self._label[a["category_id"]] for a in anns], dtype=torch.int64)
        target = dict(boxes=boxes, labels=labels, image_id=image_id)
        if self.has_masks:
            masks = [self.coco.annToMask(a) for a in anns]
            target["masks"] = (torch.from_numpy(np.stack(masks)) if masks else
                               torch.zeros((0, info["height"], info["width"]), dtype=torch.uint8))
        return torch.from_numpy(image.copy()).permute(2, 0, 1).float().div_(255), target


def _check_coco(data: dict, path: Path) -> None:
    """One-line ValueErrors naming ``path`` for the inconsistencies a COCO file can have."""
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise ValueError(f"{path}: no {key!r} list (a COCO instances file has images, annotations, categories)")
    if not data["categories"]:
        raise ValueError(f"{path}: 'categories' is empty")
    images = {}
    for im in data["images"]:
        if not all(k in im for k in ("id", "file_name", "width", "height")):
            raise ValueError(f"{path}: image entry {im} lacks one of id, file_name, width, height")
        if im["id"] in images:
            raise ValueError(f"{path}: image id {im['id']} is listed twice")
        images[im["id"]] = im
    categories = {c["id"] for c in data["categories"]}
    for ann in data["annotations"]:
        _check_annotation(ann, images, categories, path)


def _check_annotation(ann: dict, images: dict, categories: set, path: Path) -> None:
    ann_id = ann.get("id", "?")
    if ann.get("image_id") not in images:
        raise ValueError(f"{path}: annotation {ann_id} refers to image_id {ann.get('image_id')}, "
                         "which is not in 'images'")
    if ann.get("category_id") not in categories:
        raise ValueError(f"{path}: annotation {ann_id} has category_id {ann.get('category_id')}, which is not in "
                         f"'categories' (ids {sorted(categories)})")
    box = ann.get("bbox")
    if not (isinstance(box, list) and len(box) == 4):
        raise ValueError(f"{path}: annotation {ann_id} has no bbox [x, y, width, height]")
    im, (x, y, w, h) = images[ann["image_id"]], box
    if w <= 0 or h <= 0:
        raise ValueError(f"{path}: annotation {ann_id} has an empty box {box}")
    t = _BOX_TOLERANCE
    if x < -t or y < -t or x + w > im["width"] + t or y + h > im["height"] + t:
        raise ValueError(f"{path}: annotation {ann_id} box {box} lies outside image {im['id']} "
                         f"({im['width']}x{im['height']})")


def save_coco(dataset, root, split: str = "train", count: Optional[int] = None) -> Path:
    """Write ``count`` items of a detection dataset (e.g. ``FashionScenes``) as a COCO folder:
    ``root/split/NNNNNN.png`` and ``root/annotations/instances_split.json`` (masks as RLE). Returns the
    annotation file. Label ``l`` becomes category id ``l``, named from ``dataset.classes``."""
    from .metrics import _rle

    root = Path(root)
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    classes = getattr(dataset, "classes", None)
    images, annotations, labels_seen = [], [], set()
    for index in range(len(dataset) if count is None else count):
        image, target = dataset[index]
        height, width = image.shape[-2:]
        file_name = f"{index:06d}.png"
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(root / split / file_name)
        images.append(dict(id=index, file_name=file_name, width=int(width), height=int(height)))
        for k, (box, label) in enumerate(zip(target["boxes"].tolist(), target["labels"].tolist())):
            x1, y1, x2, y2 = box
            ann = dict(id=len(annotations) + 1, image_id=index, category_id=int(label), iscrowd=0,
                       bbox=[x1, y1, x2 - x1, y2 - y1], area=(x2 - x1) * (y2 - y1))
            if "masks" in target:
                mask = target["masks"][k].numpy() > 0
                ann.update(segmentation=_rle(mask), area=float(mask.sum()))
            annotations.append(ann)
            labels_seen.add(int(label))
    top = max(labels_seen | {len(classes) - 1 if classes else 0})
    categories = [dict(id=c, name=classes[c] if classes and c < len(classes) else str(c)) for c in range(1, top + 1)]
    out = root / "annotations" / f"instances_{split}.json"
    out.write_text(json.dumps(dict(images=images, annotations=annotations, categories=categories)))
    return out
