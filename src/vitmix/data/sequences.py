"""Long 1-D sequence classification (Long Range Arena's tasks that can be made offline).

- ``listops``: nested list operations as symbol tokens (:mod:`vitmix.data.listops`), 10 classes,
  padded to 2000 tokens;
- ``pathfinder32``: 32×32 path images as 1024 pixel tokens (:mod:`vitmix.data.pathfinder`), 2 classes;
- ``sfashion-mnist``: Fashion-MNIST's 28×28 images as 784 pixel tokens in raster order (the stand-in for
  LRA's sequential CIFAR-10, which cannot be downloaded offline).

An item is ``(ids (seq_len,) int64, label)``: symbol ids (0 pads) or 8-bit pixel intensities 0–255 (LRA
embeds pixels as tokens too). The two generated sets are drawn from a seed and cached as ``.npz`` files
keyed by everything they depend on, under ``DATA_DIR`` when given, else ``$VITMIX_CACHE_DIR/datasets``.

>>> train, val, info = build_sequence_datasets("listops", train_size=64, val_size=16,
...                                            min_len=10, max_len=40)        # doctest: +SKIP
>>> info.seq_len, info.vocab_size, train[0][0].shape                           # doctest: +SKIP
(40, 16, torch.Size([40]))
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from .._util import atomic_write, cache_dir, close_matches
from . import listops, pathfinder
from .datasets import FASHION_MNIST_CLASSES, SEQUENCE_DATASETS, _fashion_mnist, dataset_key

SPLITS = ("train", "val")
#: the arguments of :func:`build_sequence_datasets` that every set takes besides its generator's options
SIZE_OPTIONS = ("seed", "train_size", "val_size")
#: bumped when a generator's output changes for the same parameters, so old cache files are not reused
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class SequenceInfo:
    """What a sequence model needs to know about a dataset (``kind`` tells it from an image
    :class:`~vitmix.data.DatasetInfo`)."""

    name: str
    num_classes: int
    seq_len: int          # every item has this many ids (shorter sequences padded with id 0)
    vocab_size: int       # ids are 0 .. vocab_size - 1
    input_kind: str       # "symbols" (id 0 pads) or "pixels" (8-bit intensities)
    classes: Tuple[str, ...] = ()
    kind: str = "sequence"

    def model_kwargs(self) -> dict:
        """The keyword arguments a sequence model (``seq_*``) takes from the data; symbol data pads with id 0,
        which the model then masks (``pad_id``); pixel data has no padding (0 is black)."""
        pad = {"pad_id": 0} if self.input_kind == "symbols" else {}
        return {"num_classes": self.num_classes, "seq_len": self.seq_len, "vocab_size": self.vocab_size, **pad}


class TokenSequences(Dataset):
    """Sequences of ids stored back to back (``ids`` flat, sequence ``i`` = ``ids[offsets[i]:offsets[i+1]]``)
    plus labels; each is padded with 0 to ``seq_len`` when read."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, labels: np.ndarray, seq_len: int):
        if len(offsets) != len(labels) + 1:
            raise ValueError(f"{len(offsets) - 1} sequences but {len(labels)} labels")
        longest = int(np.diff(offsets).max(initial=0))
        if longest > seq_len:
            raise ValueError(f"a sequence has {longest} tokens, more than seq_len={seq_len}")
        self.ids, self.offsets, self.labels, self.seq_len = ids, offsets, labels.astype(np.int64), seq_len

    @classmethod
    def fixed(cls, rows: np.ndarray, labels: np.ndarray) -> "TokenSequences":
        """Equal-length sequences, one per row of ``rows`` (e.g. flattened images)."""
        n, length = rows.shape
        return cls(rows.reshape(-1), np.arange(n + 1, dtype=np.int64) * length, labels, length)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        seq = self.ids[self.offsets[i]:self.offsets[i + 1]]
        out = torch.zeros(self.seq_len, dtype=torch.int64)
        out[:len(seq)] = torch.from_numpy(seq.astype(np.int64))
        return out, int(self.labels[i])


# --- the on-disk cache of generated sets ---------------------------------------------------------------

def cached(root: Path, name: str, key: dict, make: Callable[[], Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """The arrays ``make()`` returns, read from ``root/NAME-DIGEST.npz`` when an earlier call saved them
    (``DIGEST`` hashes ``key``); else made and written atomically. An unreadable file, or one whose stored
    key differs, is made again (with a warning)."""
    text = json.dumps({"version": GENERATOR_VERSION, **key}, sort_keys=True)
    path = Path(root) / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            if str(arrays.pop("key")) == text:
                return arrays
            warnings.warn(f"{path} was made for other parameters; generating it again", RuntimeWarning,
                          stacklevel=2)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            warnings.warn(f"{path} is unreadable ({type(err).__name__}: {err}); generating it again",
                          RuntimeWarning, stacklevel=2)
    arrays = make()

    def write(tmp):
        with open(tmp, "wb") as f:           # a file object: np.savez would add ".npz" to a name
            np.savez_compressed(f, key=np.array(text), **arrays)
    atomic_write(path, write)
    return arrays


def _bar(total: int, desc: str, progress: bool):
    return tqdm(total=total, desc=desc, disable=not progress, dynamic_ncols=True, leave=False)


# --- listops ----------------------------------------------------------------------------------------

LISTOPS_PARAMS = {"min_len": listops.MIN_LEN, "max_len": listops.MAX_LEN, "max_depth": listops.MAX_DEPTH,
                  "max_args": listops.MAX_ARGS}


def _listops_split(seed: int, split: str, n: int, params: dict, progress: bool) -> Dict[str, np.ndarray]:
    ids, lengths, labels = [], [], []
    with _bar(n, f"generating listops {split}", progress) as bar:
        for i in range(n):
            tokens, value = listops.sample(f"{seed}/{split}/{i}", **params)
            ids.append(listops.encode(tokens))
            lengths.append(len(tokens))
            labels.append(value)
            bar.update(1)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    flat = np.concatenate(ids) if ids else np.zeros(0, np.uint8)
    return {"ids": flat, "offsets": offsets, "labels": np.array(labels, np.uint8)}


def _listops(root, seed, sizes, params, progress, download):
    params = {**LISTOPS_PARAMS, **params}
    sets = []
    for split, n in zip(SPLITS, sizes):
        key = {"seed": seed, "split": split, "size": n, **params}
        arrays = cached(root, "listops", key, functools.partial(_listops_split, seed, split, n, params, progress))
        sets.append(TokenSequences(arrays["ids"], arrays["offsets"], arrays["labels"], params["max_len"]))
    info = SequenceInfo("listops", 10, params["max_len"], len(listops.VOCAB), "symbols",
                        tuple(str(d) for d in range(10)))
    return sets[0], sets[1], info


# --- pathfinder32 -------------------------------------------------------------------------------------

#: the options of ``pathfinder32`` (:class:`~vitmix.data.pathfinder.PathfinderParams`' fields)
PATHFINDER_PARAMS = tuple(f.name for f in dataclasses.fields(pathfinder.PathfinderParams))


def _pathfinder_split(seed: int, split: str, n: int, p, progress: bool) -> Dict[str, np.ndarray]:
    with _bar(n, f"generating pathfinder{p.size} {split}", progress) as bar:
        images, labels, markers = pathfinder.generate(seed, SPLITS.index(split), n, p, progress=bar.update)
    return {"images": images, "labels": labels.astype(np.uint8), "markers": markers}


def _pathfinder(root, seed, sizes, params, progress, download):
    p = pathfinder.PathfinderParams(**params)
    p.check()
    sets = []
    for split, n in zip(SPLITS, sizes):
        # the item count under its own name: PathfinderParams' `size` is the image side
        key = {"seed": seed, "split": split, "items": n, **dataclasses.asdict(p)}
        arrays = cached(root, f"pathfinder{p.size}", key, functools.partial(_pathfinder_split, seed, split, n, p,
                                                                            progress))
        sets.append(TokenSequences.fixed(arrays["images"].reshape(n, -1), arrays["labels"]))
    info = SequenceInfo("pathfinder32", 2, p.size * p.size, 256, "pixels", ("disconnected", "connected"))
    return sets[0], sets[1], info


# --- sequential Fashion-MNIST ---------------------------------------------------------------------------

def _sfashion_mnist(data_dir, seed, sizes, params, progress, download):
    train, val, _ = _fashion_mnist(data_dir, download, 28, False)      # the raw uint8 images; its missing-data error
    sets = []
    for split, items, n in (("train", train, sizes[0]), ("val", val, sizes[1])):
        n = len(items) if n is None else n
        if n > len(items):
            raise ValueError(f"sfashion-mnist has {len(items)} {split} images, fewer than the {n} asked for")
        sets.append(TokenSequences.fixed(items.images[:n].reshape(n, -1), items.labels[:n]))
    return sets[0], sets[1], SequenceInfo("sfashion-mnist", 10, 784, 256, "pixels", FASHION_MNIST_CLASSES)


#: name → (builder, default (train, val) sizes, the options it takes)
_BUILDERS = {
    "listops": (_listops, (96000, 2000), tuple(LISTOPS_PARAMS)),
    "pathfinder32": (_pathfinder, (20000, 2000), PATHFINDER_PARAMS),
    "sfashion-mnist": (_sfashion_mnist, (None, None), ()),              # None: every image
}
assert set(_BUILDERS) == set(SEQUENCE_DATASETS), "vitmix.data.datasets.SEQUENCE_DATASETS lists every builder"


def is_sequence_dataset(name: str) -> bool:
    """True for the ``--data`` names whose items are 1-D id sequences."""
    return dataset_key(name) in SEQUENCE_DATASETS


def build_sequence_datasets(name: str, data_dir: Optional[str] = None, seed: int = 0,
                            train_size: Optional[int] = None, val_size: Optional[int] = None,
                            progress: bool = True, download: bool = False, **options):
    """Return ``(train, val, info)`` for sequence dataset ``name``.

    Args:
        data_dir: for the generated sets, where their cache files go (default ``$VITMIX_CACHE_DIR/datasets``);
            for ``sfashion-mnist``, the folder with Fashion-MNIST's idx files (as ``--data fashion-mnist``).
        seed: the generated sets are a function of it (and of the sizes and options).
        train_size, val_size: items per split (defaults: listops 96,000 / 2,000 as LRA's recipe,
            pathfinder32 20,000 / 2,000, sfashion-mnist all 60,000 / 10,000; smaller takes the first ones).
        progress: a progress bar while a set is generated.
        options: the generator's options, e.g. ``min_len=``, ``max_len=`` (listops) or ``distractors=``
            (pathfinder32); :data:`LISTOPS_PARAMS` and :class:`~vitmix.data.pathfinder.PathfinderParams`.
    """
    key = dataset_key(name)
    if key not in SEQUENCE_DATASETS:
        raise ValueError(f"{key} is not a sequence dataset; sequence datasets: {', '.join(SEQUENCE_DATASETS)}")
    build, default_sizes, valid = _BUILDERS[key]
    for opt in options:
        if opt not in valid:
            known = (*SIZE_OPTIONS, *valid)
            raise ValueError(f"{key} has no option {opt!r}." + close_matches(opt, known)
                             + f" Options: {', '.join(known)}")
    sizes = (default_sizes[0] if train_size is None else train_size, default_sizes[1] if val_size is None else val_size)
    if any(n is not None and n < 1 for n in sizes):
        raise ValueError(f"dataset sizes must be positive, got train_size={sizes[0]}, val_size={sizes[1]}")
    where = data_dir if data_dir or key == "sfashion-mnist" else cache_dir("datasets")
    return build(where, seed, sizes, options, progress, download)


__all__ = ["GENERATOR_VERSION", "LISTOPS_PARAMS", "PATHFINDER_PARAMS", "SIZE_OPTIONS", "SPLITS", "SequenceInfo",
           "TokenSequences", "build_sequence_datasets", "cached", "is_sequence_dataset"]
