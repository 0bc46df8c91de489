"""Datasets for training and evaluation: ``digits`` (embedded), ``fashion-mnist``, ``cifar10``,
``cifar100`` and ``imagefolder``; video clips ``(C, T, H, W)``: ``moving-fashion-mnist`` (generated) and
``clipfolder`` (folders of frame images), see :mod:`vitmix.data.video`.

>>> from vitmix.data import build_datasets
>>> train, val, info = build_datasets("digits", img_size=32)   # doctest: +SKIP
"""
from .datasets import DATASETS, DatasetInfo, build_datasets, build_loaders, is_video_dataset, list_datasets
from .video import ClipFolder, MovingFashionMNIST

__all__ = ["DATASETS", "ClipFolder", "DatasetInfo", "MovingFashionMNIST", "build_datasets", "build_loaders",
           "is_video_dataset", "list_datasets"]
