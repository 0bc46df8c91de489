"""Datasets: the embedded digits split, Fashion-MNIST idx reading, and clear errors for missing data."""
import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vitmix.data import build_datasets
from vitmix.data.datasets import FASHION_MNIST_ENV, FASHION_MNIST_SYSTEM_DIR, fashion_mnist_dir
from vitmix.data.idx import find_idx, read_idx


def test_digits_split_is_fixed_stratified_and_resized():
    train, val, info = build_datasets("digits", img_size=24)
    assert (len(train), len(val)) == (1437, 360) and info.num_classes == 10 and info.in_chans == 1
    again = build_datasets("digits", img_size=24)[1]
    np.testing.assert_array_equal(val.labels, again.labels)
    assert np.bincount(val.labels).min() >= 35  # stratified: every class ~36 of 360
    image, label = val[0]
    assert tuple(image.shape) == (1, 24, 24) and 0 <= label < 10


def _write_idx(path: Path, array: np.ndarray, gz: bool):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def _write_fake_fashion_mnist(root: Path, gz: bool):
    """12 train and 5 test random items in the four idx files."""
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    for split, n in (("train", 12), ("t10k", 5)):
        _write_idx(root / f"{split}-images-idx3-ubyte{suffix}", rng.integers(0, 255, (n, 28, 28)), gz)
        _write_idx(root / f"{split}-labels-idx1-ubyte{suffix}", rng.integers(0, 10, (n,)), gz)


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_reads_raw_idx_from_data_dir(tmp_path, gz):
    _write_fake_fashion_mnist(tmp_path, gz)
    train, val, info = build_datasets("fashion-mnist", img_size=32, data_dir=str(tmp_path))
    assert (len(train), len(val)) == (12, 5) and info.classes[9] == "Ankle boot"
    assert tuple(train[3][0].shape) == (1, 32, 32)


@pytest.mark.needs_fashion_mnist
def test_fashion_mnist_system_package_is_read():
    """Debian's dataset-fashion-mnist (CI installs it) is read from its default location."""
    train, val, _ = build_datasets("fashion-mnist", img_size=28)
    assert (len(train), len(val)) == (60000, 10000)
    assert set(np.unique(val.labels)) == set(range(10))


def test_tests_without_the_marker_run_as_on_a_machine_without_fashion_mnist():
    """tests/conftest.py hides the default location from every test not marked needs_fashion_mnist, also
    in subprocesses: such a test fails on every machine, not only on one without the package. The
    loader's error then says where it looked and how to install the package."""
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        build_datasets("fashion-mnist", img_size=28)
    code = "from vitmix.data import build_datasets; build_datasets('fashion-mnist', img_size=28)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "FileNotFoundError" in out.stderr


def test_the_folder_to_read_fashion_mnist_from_can_be_set(tmp_path, monkeypatch):
    _write_fake_fashion_mnist(tmp_path, gz=True)
    monkeypatch.setenv(FASHION_MNIST_ENV, str(tmp_path))
    assert fashion_mnist_dir() == tmp_path
    assert len(build_datasets("fashion-mnist", img_size=28)[1]) == 5
    monkeypatch.delenv(FASHION_MNIST_ENV)
    assert fashion_mnist_dir() == FASHION_MNIST_SYSTEM_DIR


def test_missing_fashion_mnist_says_where_it_looked_and_how_to_get_it(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        build_datasets("fashion-mnist", img_size=28, data_dir=str(missing))
    message = str(err.value)
    assert str(missing) in message and "apt-get install dataset-fashion-mnist" in message and "--download" in message


def test_missing_cifar_and_imagefolder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--download"):
        build_datasets("cifar10", img_size=32, data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="train/"):
        build_datasets("imagefolder", img_size=32, data_dir=str(tmp_path))


def test_imagefolder_reads_class_folders(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (20, 16), (i * 90, 10, 200)).save(tmp_path / split / cls / f"{i}.png")
    train, val, info = build_datasets("imagefolder", img_size=16, data_dir=str(tmp_path))
    assert info.classes == ("cat", "dog") and len(train) == 4 and tuple(val[0][0].shape) == (3, 16, 16)


def test_unknown_dataset_suggests_close_names():
    with pytest.raises(ValueError, match="Did you mean: digits"):
        build_datasets("digit", img_size=32)


def test_corrupt_idx_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "x-idx3-ubyte"
    bad.write_bytes(b"not an idx file at all")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(bad)
    short = tmp_path / "short-idx3-ubyte"
    short.write_bytes(bytes([0, 0, 0x08, 3]) + b"".join(d.to_bytes(4, "big") for d in (2, 4, 4)) + bytes(31))
    with pytest.raises(ValueError, match="truncated: expected 32 bytes of data, found 31"):
        read_idx(short)


@pytest.mark.parametrize("sub", ["", "raw", "FashionMNIST/raw"])
def test_find_idx_looks_in_the_flat_and_torchvision_layouts(tmp_path, sub):
    (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    _write_idx(tmp_path / sub / "t10k-labels-idx1-ubyte.gz", labels, gz=True)
    found = find_idx(tmp_path, "t10k-labels-idx1-ubyte")
    assert found == tmp_path / sub / "t10k-labels-idx1-ubyte.gz"
    np.testing.assert_array_equal(read_idx(found), labels)
    assert find_idx(tmp_path, "train-labels-idx1-ubyte") is None


def test_torchvision_reader_cannot_read_the_gzipped_debian_files(tmp_path):
    """Why vitmix keeps its own IDX reader (data/idx.py): Debian's dataset-fashion-mnist ships only
    ``*.gz`` files and torchvision's reader opens them as plain files. If this starts to pass through
    torchvision, switch to its reader and delete ours."""
    from torchvision.datasets.mnist import read_image_file

    images = np.arange(2 * 28 * 28).reshape(2, 28, 28) % 256
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    _write_idx(path, images, gz=True)
    with pytest.raises(AssertionError):
        read_image_file(str(path))
    np.testing.assert_array_equal(read_idx(path), images)


def test_cifar_download_without_network_is_a_clear_error(tmp_path, monkeypatch):
    """No network: torchvision's URLError becomes one actionable line (where, what URL, --data-dir)."""
    import urllib.error
    import urllib.request

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match=r"could not download cifar10 into .*URLError.*--data-dir"):
        build_datasets("cifar10", img_size=32, data_dir=str(tmp_path), download=True)
