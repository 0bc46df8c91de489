"""Datasets for training and evaluation: ``digits`` (embedded), ``fashion-mnist``, ``cifar10``,
``cifar100`` and ``imagefolder``.

>>> from vitmix.data import build_datasets
>>> train, val, info = build_datasets("digits", img_size=32)   # doctest: +SKIP
"""
from .datasets import DATASETS, DatasetInfo, build_datasets, build_loaders, list_datasets

__all__ = ["DATASETS", "DatasetInfo", "build_datasets", "build_loaders", "list_datasets"]
