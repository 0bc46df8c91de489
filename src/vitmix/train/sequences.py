"""Sequence data in ``vitmix train`` and ``vitmix eval``: ``--data listops|pathfinder32|sfashion-mnist`` with a
sequence model (``seq_*``).

The run machinery is the image one (loaders, recipe, checkpoints, resume, plots); what differs is here: the data
comes from :func:`vitmix.data.build_sequence_datasets` with the run's ``data_options`` (sizes, seed, generator
options), the model takes the data's sizes (``SequenceInfo.model_kwargs()``, which also make it mask ListOps'
padding), and a checkpoint records them as ``meta["sequence"]`` in place of an image size and channels.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..data import build_sequence_datasets, is_sequence_dataset
from ..data.sequences import SIZE_OPTIONS
from ..models.sequence import is_sequence_model
from ..runs import build_classifier

#: flags that mean something for images only, refused on sequence data: (field, flag, set when)
IMAGE_ONLY = (("img_size", "--img-size", lambda v: v is not None), ("num_frames", "--num-frames", lambda v: v),
              ("mixup", "--mixup", lambda v: v > 0), ("cutmix", "--cutmix", lambda v: v > 0),
              ("channels_last", "--channels-last", bool), ("init_from", "--init-from", bool),
              ("aa", "--aa", bool), ("reprob", "--reprob", lambda v: v > 0),
              ("color_jitter", "--color-jitter", lambda v: v is not None), ("input_size", "--input-size", bool),
              ("pretrained", "--pretrained", bool), ("num_classes", "--num-classes", lambda v: v is not None))


def is_sequence_run(cfg) -> bool:
    """True when ``cfg.data`` is a sequence dataset (an unknown name is left to the data's own error)."""
    try:
        return is_sequence_dataset(cfg.data)
    except ValueError:
        return False


def check_sequence_run(cfg) -> None:
    """One-line ``ValueError`` before any work for a model and data of different kinds (an image model on
    ListOps, a sequence model on images), ``--data-option`` on image data, and image-only flags on sequences."""
    sequences = is_sequence_run(cfg)
    if sequences and not is_sequence_model(cfg.model):
        raise ValueError(f"--data {cfg.data}: {cfg.data} holds 1-D token sequences, not images, which {cfg.model} "
                         "does not take: use a sequence model (--model seq_lra_tiny)")
    if not sequences:
        if is_sequence_model(cfg.model):
            raise ValueError(f"{cfg.model} takes 1-D token sequences, not --data {cfg.data}: train it on --data "
                             "listops, pathfinder32 or sfashion-mnist")
        if cfg.data_options:
            raise ValueError(f"--data-option is for the sequence datasets (listops, pathfinder32, sfashion-mnist); "
                             f"{cfg.data} takes none: drop {', '.join(cfg.data_options)}")
        return
    for name, flag, used in IMAGE_ONLY:
        if used(getattr(cfg, name)):
            raise ValueError(f"{flag} is for image data; {cfg.data} is a 1-D token sequence (its length comes "
                             "from the data: --data-option max_len=N for listops): drop it")


def sequence_data(cfg, progress: bool = True):
    """``(train, val, info)`` of the run's sequence dataset, built with ``cfg.data_options``: ``train_size``,
    ``val_size``, ``seed`` (of the generated sets, not the run's ``--seed``: every run sees the same data) and
    the generator's options. A generated set is cached under ``--data-dir`` or ``$VITMIX_CACHE_DIR/datasets``."""
    options = dict(cfg.data_options)
    for key in ("data_dir", "download", "progress"):
        if key in options:
            raise ValueError(f"--data-option {key}: not a data option; its flag is --{key.replace('_', '-')}"
                             if key != "progress" else "--data-option progress: not a data option")
    for key in SIZE_OPTIONS:
        if key in options and (not isinstance(options[key], int) or isinstance(options[key], bool)):
            raise ValueError(f"--data-option {key}={options[key]!r} must be an integer")
    return build_sequence_datasets(cfg.data, cfg.data_dir, progress=progress, download=cfg.download, **options)


def data_meta(cfg, info) -> dict:
    """What a checkpoint records of the data: the model's keyword arguments from it (to rebuild the model) and
    the data options (so that ``vitmix eval RUN`` validates on the run's own validation set)."""
    return {"sequence": info.model_kwargs(), **({"data_options": dict(cfg.data_options)} if cfg.data_options else {})}


def build_sequence_model(cfg, info) -> nn.Module:
    """The sequence classifier of ``cfg`` sized for ``info`` (``--model-option`` may enlarge, not shrink, it)."""
    return build_classifier(cfg.model, info.num_classes, None, None, mixer=cfg.mixer,
                            mixer_options=cfg.mixer_options, model_options=cfg.model_options,
                            drop_path=cfg.drop_path, data=cfg.data, sequence=info.model_kwargs())


def eval_set(meta: dict, data: str, data_dir: Optional[str], saved_options: Optional[dict] = None):
    """The validation split of sequence dataset ``data`` for a checkpoint of a sequence model (``meta``): the
    run's own data options when it is the run's dataset; a dataset the model cannot take is a one-line error."""
    if "sequence" not in meta:
        raise ValueError(f"--data {data} holds 1-D token sequences; {meta['model']} is an image model")
    if not is_sequence_dataset(data):
        raise ValueError(f"{meta['model']} takes 1-D token sequences, not --data {data}: evaluate it on --data "
                         "listops, pathfinder32 or sfashion-mnist")
    options = dict(saved_options or {}) if data == meta.get("data") else {}
    options["train_size"] = 1      # the validation split does not depend on it: no training set is generated
    _, val_set, info = build_sequence_datasets(data, data_dir, **options)
    model = {**meta["sequence"], **(meta.get("model_options") or {})}
    if info.num_classes != model["num_classes"]:
        raise ValueError(f"{meta['model']} was trained for {model['num_classes']} classes, but {data} has "
                         f"{info.num_classes}")
    if info.seq_len > model["seq_len"] or info.vocab_size > model["vocab_size"]:
        raise ValueError(f"{data} has sequences of {info.seq_len} tokens over {info.vocab_size} ids; the model "
                         f"takes at most {model['seq_len']} tokens over {model['vocab_size']} ids")
    return val_set


__all__ = ["build_sequence_model", "check_sequence_run", "data_meta", "eval_set", "is_sequence_run",
           "sequence_data"]
