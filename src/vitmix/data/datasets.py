"""Dataset factory: name → (train, val) torch datasets with timm transforms."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from torch.utils.data import DataLoader, Dataset

from .._util import close_matches
from .idx import find_idx, read_idx

#: where Debian's ``dataset-fashion-mnist`` installs the idx files
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
#: environment variable naming another folder to read Fashion-MNIST from when no ``--data-dir`` is given
FASHION_MNIST_ENV = "VITMIX_FASHION_MNIST_DIR"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset."""

    name: str
    num_classes: int
    in_chans: int
    native_size: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    classes: Tuple[str, ...] = ()
    num_frames: Optional[int] = None     # video data: frames per clip (items are (C, T, H, W)); None: images


class ArrayImageDataset(Dataset):
    """Images held in memory as a uint8 array ``(N, H, W)`` or ``(N, H, W, 3)`` plus integer labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Optional[Callable] = None):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels, self.transform = images, labels.astype(np.int64), transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), int(self.labels[i])


@dataclass(frozen=True)
class Augment:
    """timm's training augmentation beyond vitmix's random crops and flips, in ``create_transform``'s
    terms (``vitmix train --aa/--reprob/--remode/--color-jitter``). Pass one as ``augment``;
    ``augment=True`` is ``Augment()``: crops and flips with the dataset's colour jitter."""

    auto_augment: Optional[str] = None    # e.g. rand-m9-mstd0.5-inc1 (RandAugment)
    re_prob: float = 0.0                  # random erasing, after normalisation
    re_mode: str = "pixel"                # its fill: pixel | const | rand
    color_jitter: Optional[float] = None  # None: 0.4 for colour images above 32 px, else none


def _transforms(info: DatasetInfo, img_size: int, augment: Union[bool, Augment]):
    """timm transforms; light augmentation for the small grey datasets (no flips: digits are chiral).
    An :class:`Augment` adds timm's policies; on grey images they work on the one channel (colour
    jitter then changes brightness and contrast only), and timm turns colour jitter off under ``--aa``."""
    size = (info.in_chans, img_size, img_size)
    common = dict(input_size=size, mean=info.mean, std=info.std, interpolation="bilinear", crop_pct=1.0)
    if not augment:
        return create_transform(is_training=False, **common), create_transform(is_training=False, **common)
    extra = augment if isinstance(augment, Augment) else Augment()
    small = info.native_size <= 32
    jitter = extra.color_jitter if extra.color_jitter is not None else None if small else 0.4
    train = create_transform(
        is_training=True, scale=(0.8, 1.0) if small else (0.08, 1.0), ratio=(0.9, 1.1) if small else (3 / 4, 4 / 3),
        hflip=0.0 if info.in_chans == 1 else 0.5, color_jitter=jitter or None, auto_augment=extra.auto_augment,
        re_prob=extra.re_prob, re_mode=extra.re_mode, **common,
    )
    return posterize_to_zero_bits(train), create_transform(is_training=False, **common)


def posterize_to_zero_bits(transform):
    """``transform`` with the posterize ops of timm's RandAugment/AutoAugment/AugMix taking 0 bits (an
    all-black image, as Pillow before 13 gave): timm asks for 0 bits at high magnitudes (DeiT's
    ``rand-m9-mstd0.5-inc1`` does about once in 300 images) and Pillow 13 refuses them, which stopped a run."""
    from timm.data import auto_augment

    def posterize(img, bits_to_keep, **kwargs):
        if bits_to_keep <= 0:
            return Image.new(img.mode, img.size)
        return auto_augment.posterize(img, bits_to_keep, **kwargs)

    for step in getattr(transform, "transforms", ()):
        ops = list(getattr(step, "ops", ())) + [op for sub in getattr(step, "policy", ()) for op in sub]
        for op in ops:
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = posterize
    return transform


# --- digits: scikit-learn's bundled 8×8 digits ----------------------------------------------------------

DIGITS_INFO = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.5,), tuple(str(i) for i in range(10)))


def _digits(data_dir, download, img_size, augment, val_fraction: float = 0.2, split_seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 → 0..255
    # A fixed stratified split: the same validation images on every machine and run.
    idx_train, idx_val = train_test_split(np.arange(len(images)), test_size=val_fraction,
                                          stratify=digits.target, random_state=split_seed)
    t_train, t_val = _transforms(DIGITS_INFO, img_size, augment)
    return (ArrayImageDataset(images[idx_train], digits.target[idx_train], t_train),
            ArrayImageDataset(images[idx_val], digits.target[idx_val], t_val), DIGITS_INFO)


# --- Fashion-MNIST from raw idx files (data/idx.py says why not torchvision's reader) -----------------------

def fashion_mnist_dir() -> Path:
    """The folder Fashion-MNIST is read from without ``--data-dir``: ``$VITMIX_FASHION_MNIST_DIR`` when
    set, else :data:`FASHION_MNIST_SYSTEM_DIR` (read at each call, so a changed setting applies)."""
    return Path(os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_SYSTEM_DIR)


FASHION_INFO = DatasetInfo("fashion-mnist", 10, 1, 28, (0.2860,), (0.3530,), FASHION_MNIST_CLASSES)
_FASHION_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                  "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _fashion_mnist(data_dir, download, img_size, augment):
    roots = [Path(data_dir)] if data_dir else [fashion_mnist_dir()]
    if download:
        import torchvision

        root = Path(data_dir or "data")
        torchvision.datasets.FashionMNIST(root, train=True, download=True)
        torchvision.datasets.FashionMNIST(root, train=False, download=True)
        roots = [root]
    arrays = {}
    for split, (img_stem, lbl_stem) in _FASHION_FILES.items():
        paths = [next((p for p in (find_idx(r, s) for r in roots) if p), None) for s in (img_stem, lbl_stem)]
        if None in paths:
            looked = ", ".join(str(r) for r in roots)
            raise FileNotFoundError(
                f"Fashion-MNIST file {img_stem if paths[0] is None else lbl_stem}[.gz] not found in {looked} "
                f"(also looked in raw/ and FashionMNIST/raw/). Install it with "
                f"`apt-get install dataset-fashion-mnist` (files go to {FASHION_MNIST_SYSTEM_DIR}), "
                f"pass --data-dir DIR holding the idx files (or set {FASHION_MNIST_ENV}=DIR), or add --download"
            )
        arrays[split] = (read_idx(paths[0]), read_idx(paths[1]))
    t_train, t_val = _transforms(FASHION_INFO, img_size, augment)
    return (ArrayImageDataset(*arrays["train"], t_train), ArrayImageDataset(*arrays["val"], t_val), FASHION_INFO)


# --- CIFAR through torchvision ------------------------------------------------------------------------------

CIFAR10_INFO = DatasetInfo("cifar10", 10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR100_INFO = replace(CIFAR10_INFO, name="cifar100", num_classes=100)


def _cifar(num_classes: int):
    info = CIFAR10_INFO if num_classes == 10 else CIFAR100_INFO
    name = info.name

    def build(data_dir, download, img_size, augment):
        import torchvision

        cls = torchvision.datasets.CIFAR10 if num_classes == 10 else torchvision.datasets.CIFAR100
        root = Path(data_dir or "data")
        t_train, t_val = _transforms(info, img_size, augment)
        try:
            train = cls(str(root), train=True, transform=t_train, download=download)
            val = cls(str(root), train=False, transform=t_val, download=download)
        except RuntimeError as err:  # torchvision: "Dataset not found or corrupted."
            raise FileNotFoundError(
                f"{name} not found under {root.resolve()} ({err}). Pass --data-dir DIR containing "
                f"{cls.base_folder}/, or add --download to fetch it"
            ) from None
        except OSError as err:       # URLError and socket errors: no network, proxy, DNS
            raise FileNotFoundError(
                f"could not download {name} into {root.resolve()} ({type(err).__name__}: {err}); on a machine "
                f"without network, fetch {cls.url} elsewhere, unpack it there and pass --data-dir"
            ) from None
        return train, val, DatasetInfo(name, num_classes, 3, 32, info.mean, info.std, tuple(train.classes))

    return build


# --- ImageFolder: DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg ---------------------------------------

#: ImageFolder data is normalised as ImageNet (timm's constants); its classes and size come from the folder
IMAGEFOLDER_INFO = DatasetInfo("imagefolder", 0, 3, 0, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)


def _imagefolder(data_dir, download, img_size, augment):
    import torchvision

    if not data_dir:
        raise ValueError("--data imagefolder needs --data-dir DIR with train/ and val/ class folders")
    root = Path(data_dir)
    missing = [s for s in ("train", "val") if not (root / s).is_dir()]
    if missing:
        raise FileNotFoundError(f"{root} has no {' or '.join(s + '/' for s in missing)} folder; expected "
                                f"{root}/train/<class>/* and {root}/val/<class>/*")
    probe = torchvision.datasets.ImageFolder(str(root / "train"))
    info = replace(IMAGEFOLDER_INFO, num_classes=len(probe.classes), native_size=img_size, classes=tuple(probe.classes))
    t_train, t_val = _transforms(info, img_size, augment)
    train = torchvision.datasets.ImageFolder(str(root / "train"), transform=t_train)
    val = torchvision.datasets.ImageFolder(str(root / "val"), transform=t_val)
    if val.classes != train.classes:
        raise ValueError(f"train/ and val/ class folders differ in {root}: {train.classes} vs {val.classes}")
    return train, val, info


# --- video: generated moving Fashion-MNIST, and folders of frame-image clips (data/video.py) --------------

#: frames per clip when ``num_frames`` is not given (the ``timesformer_*`` models' default)
DEFAULT_NUM_FRAMES = 8
#: clips in the generated splits (train clips use Fashion-MNIST's train images, val clips its test images)
MOVING_TRAIN_CLIPS, MOVING_VAL_CLIPS = 10000, 2000
#: per-pixel mean/std of moving-Fashion-MNIST clips at 32×32 (measured on 500 clips: 0.0538, 0.1810)
_MOVING_MEAN, _MOVING_STD = (0.054,), (0.181,)


def _moving_fashion_mnist(data_dir, download, img_size, augment, num_frames):
    from .video import MovingFashionMNIST

    train_items, val_items, _ = _fashion_mnist(data_dir, download, 28, False)   # the raw uint8 arrays
    t = num_frames or DEFAULT_NUM_FRAMES
    common = dict(num_frames=t, img_size=img_size, mean=_MOVING_MEAN[0], std=_MOVING_STD[0])
    train = MovingFashionMNIST(train_items.images, MOVING_TRAIN_CLIPS, seed=0, **common)
    val = MovingFashionMNIST(val_items.images, MOVING_VAL_CLIPS, seed=1, **common)
    return train, val, DatasetInfo("moving-fashion-mnist", len(train.classes), 1, img_size, _MOVING_MEAN,
                                   _MOVING_STD, train.classes, num_frames=t)


def _clipfolder(data_dir, download, img_size, augment, num_frames):
    from .video import ClipFolder

    if not data_dir:
        raise ValueError("--data clipfolder needs --data-dir DIR with train/ and val/ folders of "
                         "<class>/<clip>/ frame images")
    root = Path(data_dir)
    missing = [s for s in ("train", "val") if not (root / s).is_dir()]
    if missing:
        raise FileNotFoundError(f"{root} has no {' or '.join(s + '/' for s in missing)} folder; expected "
                                f"{root}/train/<class>/<clip>/<frames> and {root}/val/<class>/<clip>/<frames>")
    t = num_frames or DEFAULT_NUM_FRAMES
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    train = ClipFolder(root / "train", t, img_size, 3, mean, std)
    val = ClipFolder(root / "val", t, img_size, 3, mean, std, classes=train.classes)
    return train, val, DatasetInfo("clipfolder", len(train.classes), 3, img_size, mean, std, train.classes, t)


DATASETS: Dict[str, Callable] = {
    "digits": _digits,
    "fashion-mnist": _fashion_mnist,
    "cifar10": _cifar(10),
    "cifar100": _cifar(100),
    "imagefolder": _imagefolder,
    "moving-fashion-mnist": _moving_fashion_mnist,
    "clipfolder": _clipfolder,
}
#: the datasets whose items are clips (C, T, H, W); their builders also take ``num_frames``
VIDEO_DATASETS = ("moving-fashion-mnist", "clipfolder")
#: the datasets whose items are 1-D id sequences, for sequence models (built by
#: :func:`vitmix.data.sequences.build_sequence_datasets`, not :func:`build_datasets`)
SEQUENCE_DATASETS = ("listops", "pathfinder32", "sfashion-mnist")


def list_datasets():
    """Names accepted by ``--data``."""
    return sorted([*DATASETS, *SEQUENCE_DATASETS])


def dataset_key(name: str) -> str:
    """The canonical ``--data`` name of ``name`` (aliases such as ``fmnist`` resolved); ``ValueError``
    for an unknown one."""
    key = name.lower().replace("_", "-")
    key = {"fashion": "fashion-mnist", "fashionmnist": "fashion-mnist", "fmnist": "fashion-mnist",
           "moving-fmnist": "moving-fashion-mnist", "pathfinder": "pathfinder32",
           "sequential-fashion-mnist": "sfashion-mnist", "sfmnist": "sfashion-mnist"}.get(key, key)
    if key not in DATASETS and key not in SEQUENCE_DATASETS:
        raise ValueError(f"unknown dataset {name!r}." + close_matches(key, list_datasets())
                         + f" Available: {', '.join(list_datasets())}")
    return key


def is_video_dataset(name: str) -> bool:
    """True for the ``--data`` names whose items are clips ``(C, T, H, W)``."""
    return dataset_key(name) in VIDEO_DATASETS


def build_datasets(name: str, img_size: int, data_dir: Optional[str] = None, download: bool = False,
                   augment: Union[bool, Augment] = True, num_frames: Optional[int] = None):
    """Return ``(train, val, info)`` for dataset ``name`` resized to ``img_size``×``img_size``; video
    datasets give clips of ``num_frames`` frames (default :data:`DEFAULT_NUM_FRAMES`). ``augment``:
    training augmentation on (``True``, or an :class:`Augment` of timm's policies) or off."""
    key = dataset_key(name)
    if key in SEQUENCE_DATASETS:
        raise ValueError(f"{key} holds 1-D token sequences, not images: use a sequence model (seq_*); "
                         f"vitmix.data.build_sequence_datasets builds it")
    if img_size <= 0:
        raise ValueError(f"image size must be positive, got {img_size}")
    if key not in VIDEO_DATASETS:
        if num_frames is not None:
            raise ValueError(f"--num-frames is for video data ({', '.join(VIDEO_DATASETS)}); {key} holds images")
        return DATASETS[key](data_dir, download, img_size, augment)
    if num_frames is not None and num_frames <= 0:
        raise ValueError(f"--num-frames {num_frames} must be a positive integer")
    return DATASETS[key](data_dir, download, img_size, augment, num_frames)


def build_loaders(train, val, batch_size: int, workers: int = 0, seed: int = 0, sampler=None,
                  val_sampler=None, batch_sampler=None, pin_memory: bool = False):
    """DataLoaders with a seeded shuffle so CPU runs repeat exactly; a ``batch_sampler`` (e.g.
    ``vitmix.data.sampling.GlobalBatchSampler``) forms the training batches itself. ``pin_memory``:
    batches in page-locked memory, for faster (asynchronous) copies to a CUDA device."""
    gen = torch.Generator().manual_seed(seed)
    kw = dict(num_workers=workers, persistent_workers=workers > 0, pin_memory=pin_memory)
    if batch_sampler is not None:
        train_loader = DataLoader(train, batch_sampler=batch_sampler, generator=gen, **kw)
    else:
        train_loader = DataLoader(train, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                                  drop_last=len(train) > batch_size, generator=gen, **kw)
    val_loader = DataLoader(val, batch_size=batch_size, shuffle=False, sampler=val_sampler, **kw)
    return train_loader, val_loader
