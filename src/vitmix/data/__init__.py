"""Datasets for training and evaluation: ``digits`` (embedded), ``fashion-mnist``, ``cifar10``,
``cifar100`` and ``imagefolder``; video clips ``(C, T, H, W)``: ``moving-fashion-mnist`` (generated) and
``clipfolder`` (folders of frame images), see :mod:`vitmix.data.video`; 1-D sequences for sequence models:
``listops``, ``pathfinder32`` (both generated) and ``sfashion-mnist``, see :mod:`vitmix.data.sequences`.

>>> from vitmix.data import build_datasets
>>> train, val, info = build_datasets("digits", img_size=32)   # doctest: +SKIP
"""
from .datasets import DATASETS, Augment, DatasetInfo, build_datasets, build_loaders, is_video_dataset, list_datasets
from .sequences import SequenceInfo, build_sequence_datasets, is_sequence_dataset
from .video import ClipFolder, MovingFashionMNIST

__all__ = ["DATASETS", "Augment", "ClipFolder", "DatasetInfo", "MovingFashionMNIST", "SequenceInfo", "build_datasets",
           "build_loaders", "build_sequence_datasets", "is_sequence_dataset", "is_video_dataset", "list_datasets"]
