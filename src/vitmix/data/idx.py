"""Reader for the IDX format of MNIST-style datasets (gzipped or not)."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file into an array; ``ValueError`` if the header is not IDX."""
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
