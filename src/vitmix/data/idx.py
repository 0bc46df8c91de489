"""vitmix's one reader of the IDX format of MNIST-style datasets (gzipped or not).

Everything that reads Fashion-MNIST (``vitmix train --data fashion-mnist``, the images of
``vitmix analyze``) goes through :func:`find_idx` and :func:`read_idx`.

Why not torchvision's reader: Debian's ``dataset-fashion-mnist`` installs only the gzipped files
(``/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``, one flat
folder), while ``torchvision.datasets.FashionMNIST`` wants uncompressed files under
``ROOT/FashionMNIST/raw/`` and its ``read_image_file``/``read_label_file`` open the path as a plain
file (checked with torchvision 0.29: a ``.gz`` path fails its header ``assert``). Using it would
mean unpacking the system files into a writable copy first; it also reports a damaged file with a
bare ``AssertionError`` and does not notice a truncated one, where this reader names the file.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Optional

import numpy as np

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
#: where the files may sit below a data folder: flat (Debian), torchvision's raw/ layouts
_SUBDIRS = ("", "raw", "FashionMNIST/raw")


def find_idx(root, stem: str) -> Optional[Path]:
    """The file ``stem`` (e.g. ``"t10k-images-idx3-ubyte"``), plain or ``.gz``, in ``root`` or its
    ``raw/`` or ``FashionMNIST/raw/`` folder (torchvision's layouts); ``None`` when absent."""
    for sub in _SUBDIRS:
        for suffix in ("", ".gz"):
            p = Path(root) / sub / (stem + suffix)
            if p.is_file():
                return p
    return None


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file into an array; ``ValueError`` if the header is not IDX or data is missing."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number); re-download the dataset")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_DTYPES[data[2]])
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - offset != expected:
        raise ValueError(f"{path} is truncated: expected {expected} bytes of data, found {len(data) - offset}")
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(dims)


__all__ = ["find_idx", "read_idx"]
