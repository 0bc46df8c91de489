"""What ``vitmix eval`` measures for a classifier, as timm's ``validate.py``: :func:`validate` scores a
vitmix run (or checkpoint), or a model built by name with timm's pretrained weights and/or a checkpoint
file, on a validation split preprocessed from the model's data config (``timm.data.resolve_data_config``
and ``create_transform``: interpolation, crop_pct, mean/std, channels; timm's flag names override it),
and reports timm's result keys. A run's model carries its run's data config (``runs.run_data_config``), so
a run is preprocessed as it was validated while training. The command around it is :mod:`.evaluate`.

Nothing heavy is imported at module level (the ``vitmix eval`` parser reads the names below)."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Optional

#: timm ``validate.py``'s result keys, in its order; ``vitmix eval`` adds :data:`VITMIX_KEYS`
TIMM_KEYS = ("model", "top1", "top1_err", "top5", "top5_err", "param_count", "img_size", "crop_pct", "interpolation")
VITMIX_KEYS = ("mixer", "data", "images", "loss", "checkpoint")
#: the preprocessing flags (timm's names), over the model's data config
PREPROCESSING = ("img_size", "input_size", "crop_pct", "crop_mode", "interpolation", "mean", "std")
#: the flags that build a model by name instead of reading a run's checkpoint
MODEL_FLAGS = ("pretrained", "mixer", "num_classes", "model_options", "mixer_options")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "box", "hamming", "lanczos")
CROP_MODES = ("center", "squash", "border")
#: where timm's validate.py finds the validation images of an image folder (else the folder itself)
VAL_SPLITS = ("val", "validation")
#: prefixes of timm model ids that name a saved model (a folder, a Hub repository), not an architecture
HUB_PREFIXES = ("hf-hub:", "local-dir:")
#: flag names of the options whose parameter names differ
_FLAG_NAMES = {"model_options": "model_kwargs", "mixer_options": "mixer_option"}


def validate(checkpoint=None, *, model: Optional[str] = None, pretrained: bool = False, mixer: Optional[str] = None,
             mixer_options: Optional[dict] = None, model_options: Optional[dict] = None,
             num_classes: Optional[int] = None, use_ema: bool = False, data: Optional[str] = None,
             data_dir: Optional[str] = None, batch_size: int = 128, workers: int = 0, device: Optional[str] = None,
             amp: bool = False, preprocessing: Optional[dict] = None) -> dict:
    """What ``vitmix eval`` measures: the top-1/top-5 accuracy of a run's model (``checkpoint``: a run
    directory or a vitmix checkpoint), or of ``model`` built by name with ``pretrained`` weights and/or the
    weights of ``checkpoint`` (any vitmix, timm or torch file; ``model_options``: its constructor's,
    ``mixer``/``mixer_options``: the attention it is built with), on ``data``'s validation split (default:
    the run's; with ``model`` and ``data_dir`` only: an image folder, as timm's ``validate.py``),
    preprocessed from the model's data config overridden by ``preprocessing`` (timm's names:
    :data:`PREPROCESSING`). Returns timm's result keys (:data:`TIMM_KEYS`), then :data:`VITMIX_KEYS`."""
    from ..runs import parse_device

    pre = _check_preprocessing({k: v for k, v in (preprocessing or {}).items() if v is not None})
    for flag, value in (("--batch-size", batch_size), ("--num-classes", num_classes)):
        if value is not None and value <= 0:
            raise ValueError(f"{flag} {value} must be a positive integer")
    if workers < 0:
        raise ValueError(f"--workers {workers} must be an integer >= 0")
    if model is None:
        for flag, value in zip(MODEL_FLAGS, (pretrained, mixer, num_classes, model_options, mixer_options)):
            if value not in (None, False):
                raise ValueError(f"--{_FLAG_NAMES.get(flag, flag).replace('_', '-')} builds a model by name: give "
                                 "--model NAME too (a run's checkpoint records its own model)")
        net, meta, source, data, (val_set, classes, chans) = _from_run(checkpoint, use_ema, data, data_dir, device)
        name, mixer = meta["model"], meta.get("mixer")
    else:
        if data is None and data_dir is None:
            raise ValueError(f"--model {model}: give the validation data, --data-dir DIR (an image folder: "
                             "DIR/val/<class>/* or DIR/<class>/*) or --data NAME")
        data = data or "imagefolder"
        val_set, classes, chans = _val_set(data, data_dir, 224, None)
        net, meta, source = _build_model(model, pretrained, (mixer, mixer_options), num_classes, model_options,
                                         checkpoint, use_ema, (classes, chans), pre)
        net, name, mixer = net.to(parse_device(device)), model, mixer or meta.get("mixer")
    config = _preprocessing(net, name, meta, val_set, pre)
    if "sequence" not in meta:
        _check_fit(net, name, meta if model is None else None, data, classes, chans, config)
    metrics, params = _measure(net, val_set, batch_size, workers, amp), sum(p.numel() for p in net.parameters())
    top1 = metrics["val_acc"]
    top5 = metrics.get("val_acc_top5", 100.0 if metrics["val_images"] else 0.0)  # <= 5 classes: all in the top 5
    record = dict(model=name, top1=round(top1, 4), top1_err=round(100 - top1, 4), top5=round(top5, 4),
                  top5_err=round(100 - top5, 4), param_count=round(params / 1e6, 2), img_size=config["input_size"][-1],
                  crop_pct=config["crop_pct"], interpolation=config["interpolation"], mixer=mixer, data=data,
                  images=metrics["val_images"], loss=metrics["val_loss"], checkpoint=source)
    if "sequence" in meta:             # img_size is timm's last input dim: the longest sequence here
        record["seq_len"] = config["input_size"][-1]
    return record


def _from_run(checkpoint, use_ema: bool, data: Optional[str], data_dir: Optional[str], device: Optional[str]):
    """``(model, meta, checkpoint path, data, (val set, classes, channels))`` of a run directory or vitmix
    checkpoint; the data default to the run's (from the folder it was read from)."""
    from ..runs import load_checkpoint, resolve_ema

    if checkpoint is None:
        raise ValueError("give a run directory or checkpoint, or --model NAME")
    net, meta, path = load_checkpoint(resolve_ema(checkpoint) if use_ema else checkpoint, device)
    if data is None and data_dir is None:
        data_dir = meta.get("data_dir")
    data = data or meta.get("data")
    if "sequence" in meta:             # 1-D ids: the data's own validation split (classes checked there)
        from .sequences import eval_set

        return net, meta, str(path), data, (eval_set(meta, data, data_dir, meta.get("data_options")), None, None)
    return net, meta, str(path), data, _val_set(data, data_dir, int(meta["img_size"]), meta.get("num_frames"))


def _preprocessing(net, name: str, meta: dict, val_set, pre: dict) -> dict:
    """The data config the validation images get (set on ``val_set``); a video run's clips keep their
    dataset's preparation (no crop or interpolation to report), as a sequence run's ids do."""
    if "sequence" in meta:
        if pre:
            raise ValueError(f"--{next(iter(pre)).replace('_', '-')} sets image preprocessing; {name} is a sequence "
                             "model whose ids come from its dataset")
        return dict(input_size=(1, 1, int(meta["sequence"]["seq_len"])), crop_pct=None, interpolation=None)
    if meta.get("num_frames") is not None:
        if pre:
            raise ValueError(f"--{next(iter(pre)).replace('_', '-')} sets image preprocessing; {name} is a video model "
                             "whose clips are prepared by their dataset")
        size = int(meta["img_size"])
        return dict(input_size=(int(meta["in_chans"]), size, size), crop_pct=None, interpolation=None)
    config = data_config(net, pre)
    _check_input(net, name, config)
    _preprocess(val_set, config)
    return config


def _measure(net, val_set, batch_size: int, workers: int, amp: bool) -> dict:
    """The training loop's validation metrics (``val_acc``, ``val_acc_top5``, ``val_loss``, ``val_images``)."""
    from torch.utils.data import DataLoader

    from ..runs.distributed import DistInfo
    from .engine import evaluate

    device = next(net.parameters()).device
    loader = DataLoader(val_set, batch_size=batch_size, shuffle=False, num_workers=workers,
                        pin_memory=device.type == "cuda")
    return evaluate(net, loader, DistInfo(device=device), amp)


# --- preprocessing --------------------------------------------------------------------------------------------

def data_config(model, preprocessing: Optional[dict] = None) -> dict:
    """timm's data config of ``model`` (its ``pretrained_cfg``; a vitmix run's model carries its run's)
    with ``preprocessing`` (timm's flag names) over it; ``--img-size`` keeps the model's channels."""
    from timm.data import resolve_model_data_config

    pre = dict(preprocessing or {})
    channels = model.pretrained_cfg.get("input_size", (3,))[0] if hasattr(model, "pretrained_cfg") else 3
    config = resolve_model_data_config(model, args=dict(pre, in_chans=channels), use_test_size=True)
    chans = config["input_size"][0]
    for key in ("mean", "std"):
        if len(config[key]) != chans:
            raise ValueError(f"the data config's {key} {tuple(config[key])} has {len(config[key])} values for "
                             f"{chans}-channel input: give --mean and --std with {chans} value(s)")
    return config


def eval_transform(config: dict):
    """The validation transform of a data config: timm's ``create_transform(is_training=False)``."""
    from timm.data import create_transform

    return create_transform(**config, is_training=False)


def _check_preprocessing(pre: dict) -> dict:
    """The preprocessing flags given, checked: sizes and crop positive, mean/std of 1 or C values."""
    if "img_size" in pre and "input_size" in pre:
        raise ValueError("give --img-size or --input-size, not both")
    sizes = pre.get("input_size") or ([pre["img_size"]] if "img_size" in pre else [])
    if any(s <= 0 for s in sizes):
        raise ValueError(f"--{'input' if 'input_size' in pre else 'img'}-size {' '.join(map(str, sizes))}: sizes "
                         "must be positive")
    if pre.get("crop_pct", 1) <= 0:
        raise ValueError(f"--crop-pct {pre['crop_pct']} must be positive (1.0: no crop; DeiT's 0.9)")
    channels = pre["input_size"][0] if "input_size" in pre else None
    for key in ("mean", "std"):
        values = pre.get(key)
        if values is not None and channels is not None and len(values) not in (1, channels):
            raise ValueError(f"--{key} takes 1 or {channels} values (one per channel of --input-size), "
                             f"got {len(values)}")
    if any(s <= 0 for s in pre.get("std", ())):
        raise ValueError(f"--std {' '.join(map(str, pre['std']))}: each value must be positive")
    return pre


def _preprocess(val_set, config: dict) -> None:
    """Give the validation images the data config's transform (an image folder is also read with the
    config's channels, as timm's ``input_img_mode``)."""
    val_set.transform = eval_transform(config)
    if hasattr(val_set, "loader"):      # torchvision's ImageFolder: read as the model's channels
        channels = config["input_size"][0]
        if channels not in (1, 3):
            raise ValueError(f"an image folder gives 1 (grey) or 3 (RGB) channels, not the {channels} the model takes")
        val_set.loader = partial(_open_image, mode="L" if channels == 1 else "RGB")


def _open_image(path, mode: str):
    from PIL import Image

    with open(path, "rb") as fh:
        return Image.open(fh).convert(mode)


def _check_input(model, name: str, config: dict) -> None:
    """A ViT built for a fixed input size and channel count does not take others: a one-line error
    instead of a shape error deep in the forward."""
    embed = getattr(model, "patch_embed", None)
    size = getattr(embed, "img_size", None)
    want = tuple(config["input_size"])
    if size is not None and getattr(embed, "strict_img_size", True) and not getattr(model, "dynamic_img_size", False):
        if tuple(size) != want[1:]:
            raise ValueError(f"{name} takes {size[0]}x{size[1]} images, not the {want[1]}x{want[2]} of the data "
                             "config: drop --img-size/--input-size, or build the model at that size (--model NAME "
                             "--img-size S)")
    chans = getattr(getattr(embed, "proj", None), "in_channels", None)
    if chans is not None and chans != want[0]:
        raise ValueError(f"{name} takes {chans}-channel images, not the {want[0]} of the data config: give "
                         f"--input-size {chans} {want[1]} {want[2]}")


def _check_fit(model, name: str, meta: Optional[dict], data: str, classes: int, chans: Optional[int],
               config: dict) -> None:
    """The model's classes (and a run's channels) against the data's: a one-line error naming the fix."""
    if meta is not None:
        if (meta["num_classes"], meta["in_chans"]) != (classes, chans if chans is not None else meta["in_chans"]):
            raise ValueError(f"{name} ({meta.get('data')}) was trained for {meta['num_classes']} classes / "
                             f"{meta['in_chans']} channels, but {data} has {classes} / {chans}")
        return
    outputs = getattr(model, "num_classes", None)
    if outputs is not None and outputs != classes:
        raise ValueError(f"--model {name} predicts {outputs} classes, but {data} has {classes}: evaluate it on data of "
                         f"its classes, or give --num-classes {classes} with a --checkpoint trained for them")
    if chans is not None and chans != config["input_size"][0]:
        raise ValueError(f"{data} has {chans}-channel images, the model takes {config['input_size'][0]}: build it "
                         f"with --input-size {chans} H W")


# --- data -------------------------------------------------------------------------------------------------------

def _val_set(data: str, data_dir: Optional[str], img_size: int, num_frames: Optional[int]):
    """``(validation set, classes, channels)`` of ``data`` (channels ``None``: an image folder, read as
    the model's); its transform is the dataset's until :func:`_preprocess` sets the data config's."""
    from ..data import build_datasets
    from ..data.datasets import dataset_key

    if dataset_key(data) == "imagefolder":
        return _image_folder(data_dir)
    _, val_set, info = build_datasets(data, img_size, data_dir, augment=False, num_frames=num_frames)
    return val_set, info.num_classes, info.in_chans


def _class_folders(path: Path) -> list:
    return sorted(p.name for p in path.iterdir() if p.is_dir())


def _image_folder(data_dir: Optional[str]):
    """timm ``validate.py``'s image folder: ``DIR/val`` (or ``validation``) when there is one, else ``DIR``,
    holding ``<class>/<image>``; class indices are the sorted folder names (as torchvision's and timm's)."""
    import torchvision

    if not data_dir:
        raise ValueError("--data imagefolder needs --data-dir DIR (DIR/val/<class>/* or DIR/<class>/*)")
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--data-dir {root} does not exist" if not root.exists() else
                                f"--data-dir {root} is a file; give the folder of the class folders")
    split = next((root / s for s in VAL_SPLITS if (root / s).is_dir()), root)
    classes = _class_folders(split)
    if split == root and (root / "train").is_dir():
        raise FileNotFoundError(f"{root} has train/ but no {' or '.join(s + '/' for s in VAL_SPLITS)}: evaluate on "
                                f"the validation images ({root}/val/<class>/*)")
    if not classes:
        raise FileNotFoundError(f"{split} holds no class folders; expected {split}/<class>/<image>")
    if split != root and (root / "train").is_dir() and _class_folders(root / "train") != classes:
        raise ValueError(f"train/ and {split.name}/ class folders differ in {root}: the class indices would not be "
                         "the ones the model was trained with")
    try:
        val_set = torchvision.datasets.ImageFolder(str(split))
    except FileNotFoundError as err:      # a class folder without images
        raise FileNotFoundError(f"{split}: {err}") from None
    return val_set, len(classes), None


# --- the model ------------------------------------------------------------------------------------------------

def _model_kwargs(meta: dict, pretrained: bool, num_classes: Optional[int], model_options: Optional[dict],
                  mixer: tuple, data: tuple, pre: dict) -> dict:
    """The constructor arguments of ``--model``: what the user gave (``--num-classes``, ``--input-size`` /
    ``--img-size``, ``--model-kwargs``, ``--mixer``), else what a vitmix checkpoint's metadata records,
    else the data's classes and channels (with ``pretrained``: the pretrained model's own)."""
    classes, chans = data
    size = tuple(pre["input_size"]) if "input_size" in pre else None
    derived = dict(num_classes=num_classes or meta.get("num_classes") or (None if pretrained else classes),
                   in_chans=size[0] if size else meta.get("in_chans") or (None if pretrained else chans),
                   img_size=(size[1] if size[1] == size[2] else size[1:]) if size else pre.get("img_size")
                   or meta.get("img_size"))
    kwargs = {**(meta.get("model_options") or {}), **{k: v for k, v in derived.items() if v is not None},
              **(model_options or {})}
    for key, value in zip(("mixer", "mixer_options"), mixer):
        if value or meta.get(key):
            kwargs[key] = value or meta[key]
    return kwargs


def _build_model(name: str, pretrained: bool, mixer: tuple, num_classes: Optional[int],
                 model_options: Optional[dict], checkpoint, use_ema: bool, data: tuple, pre: dict):
    """``(model, meta, checkpoint path or None)``: ``--model NAME`` built as timm's ``validate.py`` does
    (``pretrained``, then the ``checkpoint``'s weights, strictly), with the classes, channels and size of
    :func:`_model_kwargs`."""
    import timm

    from ..models import create_model
    from ..models.timesformer import is_video_model
    from ..runs import load_into, read_checkpoint, resolve_checkpoint, resolve_ema
    from ..runs.checkpoints import run_data_config, set_data_config

    if not pretrained and checkpoint is None:
        raise ValueError(f"--model {name} needs weights: --pretrained (timm's) or --checkpoint FILE")
    if use_ema and checkpoint is None:
        raise ValueError("--use-ema reads the EMA weights of a checkpoint: give --checkpoint FILE")
    if not name.startswith(HUB_PREFIXES) and is_video_model(name):
        raise ValueError("--model builds image classifiers; evaluate a video run by its directory (vitmix eval RUN)")
    state, meta, path = {}, {}, None
    if checkpoint is not None:
        path = resolve_ema(checkpoint) if use_ema else resolve_checkpoint(checkpoint)
        state, meta = read_checkpoint(path, ema=use_ema)
    kwargs = _model_kwargs(meta, pretrained, num_classes, model_options, mixer, data, pre)
    try:
        if name.startswith(HUB_PREFIXES):   # timm reads the saved config (and mixer: vitmix's wrapped ViTs take it)
            model = timm.create_model(name, pretrained=pretrained, **kwargs)
        else:
            model = create_model(name, pretrained=pretrained, **kwargs)
    except (RuntimeError, OSError) as err:      # no pretrained weights, no network, no such folder
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise ValueError(f"--model {name}{' --pretrained' if pretrained else ''}: {lines[0]}") from None
    if getattr(model, "task", "classification") != "classification":
        raise ValueError(f"{name} is a {model.task} model, not a classifier")
    if path is not None:
        load_into(model, state, f"{path} (a checkpoint of another architecture?)")
        if all(k in meta for k in ("img_size", "in_chans")):     # a vitmix checkpoint: its run's data config
            set_data_config(model, run_data_config(meta))
    if "in_chans" in kwargs or "img_size" in kwargs:   # the size built, for the data config
        built = getattr(getattr(model, "patch_embed", None), "img_size", None)
        cfg_size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        set_data_config(model, {"input_size": (kwargs.get("in_chans", cfg_size[0]),
                                               *(tuple(built) if built is not None else cfg_size[1:]))})
    return model.eval(), meta, str(path) if path is not None else None
