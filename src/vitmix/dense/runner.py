"""The jobs behind ``vitmix dense``: :func:`train_dense` and :func:`evaluate_dense`.

A run directory holds ``config.yaml``, ``last.safetensors`` and ``best.safetensors`` (best validation
mIoU for ``segment``, box AP for ``detect``), ``metrics.jsonl`` (one line per epoch),
``predictions/epoch-NNN.png`` (validation images, ground truth and prediction side by side),
``state.pt`` (what ``--resume`` needs, written last, with the digests of its epoch's files) and, at the
end, ``summary.json``. The machinery (run directory, checkpoint set, resume) is :mod:`vitmix.runs`'s,
as for ``vitmix train`` and ``vitmix generate``; under torchrun each process trains on its shard of
every batch (DDP) and the main process evaluates and writes.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .._util import close_matches, plural
from ..runs import (
    BEST_FIRST, Trainable, atomic_write, checked_step, clear_aborted, load_into, load_weights, model_meta,
    prepare_run_dir as _prepare_run_dir, resolve_checkpoint, resume_run, save_manifest, save_metrics,
    recorded_abort, save_run_config, save_text, save_weights,
)
from .config import DenseConfig

#: what ``--resume`` may change (anything else would make a different run)
RESUME_MAY_CHANGE = ("out", "resume", "device", "epochs", "max_steps", "workers", "preview")
CHECKPOINT_FILES = ("last.safetensors", "best.safetensors", "metrics.jsonl")
#: the validation number that picks best.safetensors, per task
SCORE = {"segment": "mIoU", "detect": "box_AP"}
#: the scores written in percent (metrics.jsonl, summary.json, eval JSON); summary.json's ``units`` says so,
#: since runs written before held fractions
PERCENT = ("mIoU", "pixel_accuracy")
#: the ``task`` a checkpoint's metadata records
META_TASK = {"segment": "segmentation", "detect": "detection"}
IGNORE_INDEX = 255


def _progress(**kwargs):
    from tqdm.auto import tqdm

    return lambda items: tqdm(items, leave=False, dynamic_ncols=True, **kwargs)


# ----------------------------------------------------------------------------------------------
# checks, data, models
# ----------------------------------------------------------------------------------------------
def check_model(name: str) -> None:
    """``name`` must be a vitmix model or a timm one (a CNN baseline such as ``resnet18``): a one-line
    ``ValueError`` with close matches."""
    import timm

    from ..models import list_models

    known = list_models()
    if name.split(".")[0] not in known and not timm.is_model(name.split(".")[0]):
        raise ValueError(f"unknown backbone {name!r}." + close_matches(name, known, n=3)
                         + " Small dense backbones: laplacianformer_nano, soft_nano, soft_norm_nano, weightformer_nano")


class _Resized(torch.utils.data.Dataset):
    """A user's (image, target) items at ``size``×``size``: bilinear image, nearest-neighbour semantic map."""

    def __init__(self, dataset, size: int):
        self.dataset, self.size = dataset, size

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        if tuple(image.shape[-2:]) == (self.size, self.size):
            return image, target
        image = F.interpolate(image[None], size=(self.size, self.size), mode="bilinear", align_corners=False)[0]
        semantic = F.interpolate(target["semantic"][None, None].float(), size=(self.size, self.size), mode="nearest")
        return image, dict(target, semantic=semantic[0, 0].long())


def check_dependencies(task: str) -> None:
    """Detection is scored with COCO box/mask AP through pycocotools (an optional extra)."""
    if task == "detect":
        from .metrics import require_pycocotools

        require_pycocotools("--task detect (COCO box/mask AP)")


def build_data(cfg: DenseConfig):
    """``(train, val, num_classes, class_names)`` of ``cfg.data``; a missing or broken folder fails here,
    before the run directory exists."""
    if cfg.data == "fashion-scenes":
        from .scenes import SCENE_CLASSES, FashionScenes

        common = dict(size=cfg.img_size, seed=cfg.scene_seed, data_dir=cfg.data_dir)
        train = FashionScenes.from_fashion_mnist("train", length=cfg.train_scenes, **common)
        val = FashionScenes.from_fashion_mnist("val", length=cfg.val_scenes, **common)
        return train, val, len(SCENE_CLASSES), list(SCENE_CLASSES)
    if cfg.data == "maskfolder":
        from .maskfolder import MaskFolder

        train, val = (MaskFolder(cfg.data_dir, cfg.num_classes, split) for split in ("train", "val"))
        train[0], val[0]       # a mask of the wrong mode, size or labels fails now, not in the first epoch
        names = [f"class {i}" for i in range(cfg.num_classes)]
        return _Resized(train, cfg.img_size), _Resized(val, cfg.img_size), cfg.num_classes, names
    from .coco import CocoDetection

    train, val = CocoDetection(cfg.data_dir, "train"), CocoDetection(cfg.data_dir, "val")
    if train.category_ids != val.category_ids:
        raise ValueError(f"{cfg.data_dir}: the train and val annotations list different categories "
                         f"({train.category_ids} vs {val.category_ids}); give both the same 'categories'")
    if cfg.masks and not (train.has_masks and val.has_masks):
        raise ValueError(f"{cfg.data_dir}: some annotations have no 'segmentation', so Mask R-CNN cannot train on "
                         "them; add --no-masks (boxes only, Faster R-CNN)")
    return train, val, train.num_classes, list(train.classes)


def build_dense_model(meta: dict) -> nn.Module:
    """The segmenter (Semantic FPN) or detector (torchvision Mask/Faster R-CNN) of a checkpoint's (or a
    config's) metadata."""
    from .detection import create_detector
    from .heads import create_segmenter

    kwargs = dict(meta.get("model_options") or {})
    if meta.get("mixer_options"):
        kwargs["mixer_options"] = meta["mixer_options"]
    if meta["task"] == META_TASK["segment"]:
        return create_segmenter(meta["model"], meta["num_classes"], img_size=meta["img_size"], mixer=meta.get("mixer"),
                                **kwargs)
    return create_detector(meta["model"], meta["num_classes"], masks=meta["masks"], img_size=meta["img_size"],
                           mixer=meta.get("mixer"), backbone_kwargs=kwargs)


def _meta(cfg: DenseConfig, num_classes: int, classes, epoch: int) -> dict:
    return {**model_meta(cfg), "task": META_TASK[cfg.task], "num_classes": num_classes, "classes": list(classes),
            "img_size": cfg.img_size, "in_chans": 3, "data": cfg.data, "masks": cfg.masks, "epoch": epoch}


def _collate(task: str):
    from .scenes import detection_collate, segmentation_collate

    return segmentation_collate if task == "segment" else detection_collate


# ----------------------------------------------------------------------------------------------
# one epoch, evaluation, pictures
# ----------------------------------------------------------------------------------------------
def _autocast(cfg: DenseConfig, device: torch.device):
    if not cfg.amp:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, cfg.amp_dtype))


def _loss(model, batch, task: str, device, cfg: DenseConfig) -> torch.Tensor:
    """The training loss of one batch (detection: the sum of torchvision's RPN and head losses)."""
    images, targets = batch
    with _autocast(cfg, device):
        if task == "segment":
            logits = model(images.to(device))
            loss = F.cross_entropy(logits.float(), targets.to(device), ignore_index=IGNORE_INDEX)
            return loss
        images = [im.to(device) for im in images]
        targets = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in t.items() if k != "semantic"}
                   for t in targets]
        parts = model(images, targets)
        return sum(v.float() for v in parts.values())


def _train_epoch(model, optimizer, scheduler, loader, cfg: DenseConfig, epoch: int, step: int, device, dist_info
                 ) -> Tuple[dict, int]:
    from ..runs.distributed import all_reduce_sum

    model.train()
    total, seen, t0 = 0.0, 0, time.perf_counter()
    bar = _progress(desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not dist_info.is_main)(loader)
    for batch in bar:
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break
        loss = _loss(model, batch, cfg.task, device, cfg)
        checked_step(loss, model, optimizer, cfg.clip_grad, step)
        step += 1
        scheduler.step_update(step)
        n = len(batch[0])
        total, seen = total + loss.item() * n, seen + n
        elapsed = time.perf_counter() - t0
        bar.set_postfix(loss=f"{total / seen:.3f}", img_s=f"{seen * dist_info.world_size / max(elapsed, 1e-9):.1f}")
    total, seen = all_reduce_sum([total, seen], dist_info)
    seconds = time.perf_counter() - t0
    return {"epoch": epoch + 1, "step": step, "train_loss": total / max(seen, 1),
            "images_per_s": seen / max(seconds, 1e-9),
            "epoch_seconds": seconds, "lr": optimizer.param_groups[0]["lr"]}, step


def evaluate(model, loader, task: str, num_classes: int, device, amp: bool = False, masks: bool = True) -> dict:
    """The task's validation numbers: ``mIoU`` and ``pixel_accuracy`` in percent (segment; as ``vitmix
    train`` reports accuracy), or COCO ``box_AP``, ``box_AP50``, ``box_AP75`` and, with masks,
    ``mask_*`` as pycocotools gives them, in [0, 1] (detect)."""
    from .metrics import evaluate_detection, evaluate_segmentation

    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    with ctx:
        if task == "segment":
            scores = evaluate_segmentation(model, _progress(desc="val")(loader), num_classes, IGNORE_INDEX, device)
            return {k: 100 * v if k in PERCENT else v for k, v in scores.items()}
        return evaluate_detection(model, _progress(desc="val")(loader), num_classes, masks, device)


def _palette(num_classes: int) -> torch.Tensor:
    """A fixed colour per class (background black), uint8 ``(num_classes + 1, 3)``; the last row: ignored pixels."""
    gen = torch.Generator().manual_seed(7)
    colours = torch.randint(60, 256, (num_classes + 1, 3), generator=gen, dtype=torch.uint8)
    colours[0] = 0
    colours[-1] = 255
    return colours


@torch.no_grad()
def save_predictions(model, dataset, task: str, num_classes: int, path: Path, count: int, device,
                     classes=None) -> Optional[Path]:
    """A PNG of ``count`` validation images: one row each, the image, its ground truth and the prediction
    (segment: class colours; detect: boxes, labelled, and instance masks over the image)."""
    import torchvision
    from PIL import Image
    from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

    if count <= 0:
        return None
    model.eval()
    palette = _palette(num_classes)
    tiles = []
    for i in range(min(count, len(dataset))):
        image, target = dataset[i]
        rgb = (image.clamp(0, 1) * 255).round().byte()
        if task == "segment":
            pred = model(image[None].to(device)).argmax(1)[0].cpu()
            truth = target["semantic"].clamp(max=num_classes)   # the ignore index → the last colour
            tiles += [rgb, palette[truth].permute(2, 0, 1), palette[pred].permute(2, 0, 1)]
            continue
        out = {k: v.cpu() for k, v in model([image.to(device)])[0].items()}
        keep = out["scores"] >= 0.5
        tiles += [_draw(rgb, target, palette, classes, draw_bounding_boxes, draw_segmentation_masks),
                  _draw(rgb, {k: v[keep] for k, v in out.items()}, palette, classes, draw_bounding_boxes,
                        draw_segmentation_masks)]
    per_row = 3 if task == "segment" else 2
    grid = torchvision.utils.make_grid(torch.stack(tiles).float() / 255, nrow=per_row, padding=2, pad_value=1.0)
    array = (grid * 255).round().byte().permute(1, 2, 0).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Image.fromarray(array).save(tmp, format="PNG"))
    return path


def _draw(rgb, target: dict, palette, classes, draw_boxes, draw_masks):
    """``rgb`` with the instance masks (if any) and the labelled boxes of ``target`` drawn over it."""
    labels = target["labels"].tolist()
    colours = [tuple(int(c) for c in palette[label]) for label in labels]
    picture = rgb
    if "masks" in target and len(labels):
        masks = target["masks"]
        masks = masks[:, 0] > 0.5 if masks.dim() == 4 else masks.bool()
        picture = draw_masks(picture, masks, alpha=0.45, colors=colours)
    if len(labels):
        names = [classes[label] if classes and label < len(classes) else str(label) for label in labels]
        picture = draw_boxes(picture, target["boxes"], labels=names, colors=colours)
    return picture


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------
def prepare_run_dir(cfg: DenseConfig) -> Path:
    """The run directory, checked (not created): see :func:`vitmix.runs.prepare_run_dir`."""
    return _prepare_run_dir(cfg, DenseConfig, RESUME_MAY_CHANGE,
                            f"dense-{cfg.task}-{cfg.model}-{cfg.mixer or 'default'}-{cfg.data}")


def _train_loader(dataset, cfg: DenseConfig, dist_info):
    """This rank's shuffled share of the training scenes (the same shards for a seed at any world size)."""
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, dist_info.world_size, dist_info.rank, shuffle=True, seed=cfg.seed,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=cfg.batch_size // dist_info.world_size, sampler=sampler, drop_last=True,
                      num_workers=cfg.workers, collate_fn=_collate(cfg.task))


def _val_loader(dataset, task: str, batch_size: int, workers: int = 0):
    """The validation scenes in order (every rank evaluates all of them)."""
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=max(1, batch_size), shuffle=False, num_workers=workers,
                      collate_fn=_collate(task))


def _scheduler(optimizer, cfg: DenseConfig, steps_per_epoch: int):
    from timm.scheduler import CosineLRScheduler

    total = max(1, cfg.epochs * steps_per_epoch if cfg.max_steps is None else min(cfg.max_steps,
                                                                                  cfg.epochs * steps_per_epoch))
    warmup = min(int(round(cfg.warmup_epochs * steps_per_epoch)), total - 1)
    return CosineLRScheduler(optimizer, t_initial=total, lr_min=cfg.min_lr, warmup_t=warmup,
                             warmup_lr_init=cfg.lr * 1e-3, warmup_prefix=True, t_in_epochs=False)


def _check_batches(cfg: DenseConfig, dist_info, train_size: int) -> None:
    if cfg.batch_size % dist_info.world_size:
        raise ValueError(f"--batch-size {cfg.batch_size} (the global batch) must be divisible by the "
                         f"{dist_info.world_size} torchrun processes")
    if train_size < cfg.batch_size:
        raise ValueError(f"--batch-size {cfg.batch_size} is larger than the {train_size} training images; "
                         "lower it (or raise --train-scenes)")


def train_dense(cfg: DenseConfig, log=print) -> dict:
    """Train a segmentation or detection model (``cfg.task``) on ``cfg.data``; returns the summary.

    Bad input (model, numbers, data, run directory) fails before anything is written."""
    from ..runs.distributed import cleanup, init_distributed

    check_model(cfg.model)
    check_dependencies(cfg.task)
    run_dir = prepare_run_dir(cfg)
    train_set, val_set, num_classes, classes = build_data(cfg)
    dist_info = init_distributed(cfg.device)
    try:
        _check_batches(cfg, dist_info, len(train_set))
        return _train(cfg, run_dir, train_set, val_set, num_classes, classes, dist_info,
                      log if dist_info.is_main else (lambda *a, **k: None))
    finally:
        cleanup(dist_info)


def _train(cfg, run_dir, train_set, val_set, num_classes, classes, dist_info, log) -> dict:
    import torch.distributed as dist

    from ..runs import resuming_line

    device = dist_info.device
    torch.manual_seed(cfg.seed)
    model = build_dense_model(_meta(cfg, num_classes, classes, 0)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    train_loader = _train_loader(train_set, cfg, dist_info)
    scheduler = _scheduler(optimizer, cfg, len(train_loader))
    start, step, history, best = 0, 0, [], -math.inf
    if cfg.resume:
        done = resume_run(run_dir, Trainable(model, optimizer), log,
                          lambda h: _rewrite_weights(run_dir, model, _meta(cfg, num_classes, classes, len(h))),
                          is_main=dist_info.is_main)
        start, step, history = done.epoch, done.step, done.history
        log(resuming_line(run_dir, start, step))
        best = done.state.get("best_score", best)
        if "percent" not in done.state:       # a run saved while PERCENT scores were fractions: one unit throughout
            history, best = _fractions_to_percent(history, best, cfg.task)
    if dist_info.is_main:
        clear_aborted(run_dir)
        save_run_config(run_dir, cfg, f"num_classes={num_classes}")
    net = model
    if dist_info.enabled:
        # dense batches are small per process: on CUDA, BatchNorm (SOFT's stem) normalises over the global
        # batch (SyncBN, as detectron2/mmdet). torch's SyncBatchNorm is CUDA-only: on CPU each process keeps
        # its own batch statistics
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        net = nn.parallel.DistributedDataParallel(model, find_unused_parameters=cfg.task == "detect")
    scheduler.step_update(step)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"vitmix dense {cfg.task}: {cfg.model} (mixer={cfg.mixer or 'default'}, {n_params / 1e6:.2f}M params) on "
        f"{cfg.data} ({len(train_set)} train / {len(val_set)} val images, {cfg.img_size}px, {num_classes} classes) "
        f"for {plural(cfg.epochs, 'epoch')}, batch {cfg.batch_size}, device={device}, "
        f"world size {dist_info.world_size}; run dir {run_dir}")
    val_loader = _val_loader(val_set, cfg.task, cfg.batch_size // dist_info.world_size, cfg.workers)
    key = SCORE[cfg.task]
    with recorded_abort(run_dir, dist_info.is_main):
        for epoch in range(start, cfg.epochs):
            if cfg.max_steps is not None and step >= cfg.max_steps:
                break
            train_loader.sampler.set_epoch(epoch)
            metrics, step = _train_epoch(net, optimizer, scheduler, train_loader, cfg, epoch, step, device, dist_info)
            if dist_info.is_main:
                t0 = time.perf_counter()
                metrics.update(evaluate(model, val_loader, cfg.task, num_classes, device, masks=cfg.masks))
                metrics["val_seconds"] = time.perf_counter() - t0
                picture = run_dir / "predictions" / f"epoch-{epoch + 1:03d}.png"
                save_predictions(model, val_set, cfg.task, num_classes, picture, cfg.preview, device, classes)
                history.append(metrics)
                score = metrics[key] if math.isfinite(metrics[key]) else -math.inf
                meta = _meta(cfg, num_classes, classes, epoch + 1)
                save_weights(model, run_dir / "last.safetensors", meta)
                if score > best or not (run_dir / "best.safetensors").is_file():
                    best = max(best, score)
                    save_weights(model, run_dir / "best.safetensors", dict(meta, best_score=score))
                save_metrics(run_dir, history)
                save_manifest(run_dir, Trainable(model, optimizer), epoch + 1, step, history, CHECKPOINT_FILES,
                              best_score=best, percent=PERCENT)
                log(_epoch_line(cfg, metrics))
            else:
                history.append(metrics)
            if dist_info.enabled:
                dist.barrier()
    summary = {"run_dir": str(run_dir), "task": cfg.task, "model": cfg.model, "mixer": cfg.mixer, "data": cfg.data,
               "params": n_params, "img_size": cfg.img_size, "device": str(device), "epochs_run": len(history),
               "steps": step,
               "train_seconds": sum(h["epoch_seconds"] for h in history),
               "final": {k: v for k, v in (history[-1] if history else {}).items() if k in _REPORTED},
               "units": {k: "%" for k in PERCENT},
               f"best_{key}": best if history else None}
    if dist_info.is_main:
        save_text(run_dir / "summary.json", json.dumps(summary, indent=2))
        log(f"done: {plural(len(history), 'epoch')}, {plural(step, 'step')} in {summary['train_seconds']:.0f} s; "
            + (_scores(summary["final"]) if history else "no epoch trained") + f"; run dir {run_dir}")
    return summary


def _fractions_to_percent(history: list, best: float, task: str):
    """``history`` and ``best`` of a run saved before the :data:`PERCENT` scores were percentages, rescaled."""
    history = [{k: v * 100 if k in PERCENT else v for k, v in h.items()} for h in history]
    return history, best * 100 if SCORE[task] in PERCENT and math.isfinite(best) else best


_REPORTED = ("mIoU", "pixel_accuracy", "box_AP", "box_AP50", "box_AP75", "mask_AP", "mask_AP50", "mask_AP75",
             "train_loss", "images_per_s")


def _scores(metrics: dict) -> str:
    """``mIoU 41.2 %, pixel acc 88.0 %`` or ``box AP 12.3, mask AP 10.1`` (COCO AP in %)."""
    if "mIoU" in metrics:
        return f"mIoU {metrics['mIoU']:.2f} %, pixel acc {metrics['pixel_accuracy']:.2f} %"
    parts = [f"box AP {100 * metrics['box_AP']:.2f} (AP50 {100 * metrics['box_AP50']:.2f})"]
    if "mask_AP" in metrics:
        parts.append(f"mask AP {100 * metrics['mask_AP']:.2f}")
    return ", ".join(parts)


def _epoch_line(cfg: DenseConfig, m: dict) -> str:
    return (f"epoch {m['epoch']:>3}/{cfg.epochs}: loss {m['train_loss']:.4f}, {m['images_per_s']:.1f} img/s; "
            f"val {_scores(m)}; predictions/epoch-{m['epoch']:03d}.png")


def _rewrite_weights(run_dir: Path, model, meta: dict) -> None:
    save_weights(model, run_dir / "last.safetensors", meta)


# ----------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------
def load_dense(checkpoint, device: Optional[str] = None):
    """``(model, meta, path)`` of a ``vitmix dense train`` checkpoint file or run directory (its best)."""
    from ..runs import parse_device

    path = resolve_checkpoint(checkpoint, BEST_FIRST)
    state, meta = load_weights(path)
    if meta.get("task") not in META_TASK.values():
        raise ValueError(f"{path} is not a `vitmix dense train` checkpoint (no segmentation/detection metadata)")
    model = build_dense_model(meta)
    load_into(model, state, str(path))
    return model.to(parse_device(device)).eval(), meta, path


def evaluate_dense(checkpoint, data_dir: Optional[str] = None, batch_size: int = 8, device: Optional[str] = None,
                   amp: bool = False, val_scenes: Optional[int] = None) -> dict:
    """The task's validation numbers of a dense checkpoint on the validation split it was trained with
    (``fashion-scenes``: the run's own validation scenes; ``data_dir`` overrides the run's folder)."""
    model, meta, path = load_dense(checkpoint, device)
    run_cfg = _run_config(path)
    check_dependencies(run_cfg.get("task", "segment"))
    values = dict(run_cfg, data_dir=data_dir or run_cfg.get("data_dir"))
    if val_scenes is not None:
        values["val_scenes"] = val_scenes
    cfg = DenseConfig.from_dict({k: v for k, v in values.items() if k in DenseConfig.field_names()})
    _, val_set, num_classes, _ = build_data(cfg)
    task = cfg.task
    loader = _val_loader(val_set, task, batch_size)
    dev = next(model.parameters()).device
    result = evaluate(model, loader, task, num_classes, dev, amp, masks=meta.get("masks", True))
    return {"checkpoint": str(path), "task": task, "model": meta["model"], "mixer": meta.get("mixer"),
            "data": meta["data"], "val_images": len(val_set), **result}


def _run_config(path: Path) -> dict:
    """The config a checkpoint was trained with: its run directory's ``config.yaml``, else its metadata."""
    from ..runs.flags import load_yaml

    saved = path.parent / "config.yaml"
    if saved.is_file():
        return load_yaml(saved)
    meta = load_weights(path)[1]
    task = next(t for t, name in META_TASK.items() if name == meta["task"])
    return {"task": task, "model": meta["model"], "mixer": meta.get("mixer"), "data": meta["data"],
            "img_size": meta["img_size"], "masks": meta.get("masks", True),
            "num_classes": meta["num_classes"] if meta["data"] == "maskfolder" else None}


def describe(result: dict) -> str:
    """One line for ``vitmix eval`` / ``vitmix dense eval``."""
    return (f"{result['model']} (mixer={result['mixer'] or 'default'}) {result['task']} on {result['data']}: "
            f"{_scores(result)} ({result['val_images']} images)  [{result['checkpoint']}]")
