"""``train(cfg)`` and ``evaluate_checkpoint(path, ...)``: the jobs behind ``vitmix train`` / ``eval``."""
from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import random
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3
from torch import nn

from .._util import plural, table_columns
from ..data import build_datasets, build_loaders, is_sequence_dataset, is_video_dataset
from ..data.sampling import GlobalBatchSampler, SeededSamples, ShardSampler
from ..runs import (
    ABORTED, Trainable, abort_message, build_classifier, check_resumable as _check_resumable, clear_aborted,
    load_checkpoint, model_meta, prepare_run_dir as _prepare_run_dir, resume_run, resuming_line, rng_state,
    save_manifest, save_metrics, save_run_config, save_text, save_weights, seeded_subset, set_rng_state, unwrap,
)
from ..runs import load_model, resolve_checkpoint  # noqa: F401  (re-exported: vitmix.train.runner.load_model)
from .compiled import CompiledWithFallback
from .config import TrainConfig, load_yaml
from ..runs.distributed import DistInfo, cleanup, init_distributed, key_drop_path
from .engine import AMP_DTYPES, Recipe, _quiet, evaluate, train_one_epoch
from .init_from import (
    LogitDistillation, check_unchanged, check_world, find_teacher, load_converted, load_teacher, teacher_config,
    transfer_stage,
)
from .plots import plot_curves
from .sequences import build_sequence_model, check_sequence_run, data_meta, eval_set, is_sequence_run, sequence_data
from .timm_recipe import (
    WandbLog, check_start_files, check_wandb, create_optimizer, create_scheduler, load_initial_checkpoint,
    resume_schedule, set_grad_checkpointing, step_epoch, train_augment,
)


#: What ``--resume`` may change: where the run executes, how it loads data, and a longer schedule
#: (``--epochs``/``--max-steps``: the cosine decay is re-laid over the new length from the current
#: step, so the run then differs from an uninterrupted one). Anything else is refused.
RESUME_MAY_CHANGE = ("out", "resume", "device", "workers", "epochs", "max_steps")
#: The user-facing files of one checkpoint set; ``state.pt``, written last, records their digests
#: and holds everything a resume needs, so it is the manifest that decides which set is complete.
CHECKPOINT_FILES = ("best.safetensors", "metrics.jsonl", "metrics.csv", "ema.safetensors", "last.safetensors")

__all__ = ["ABORTED", "CHECKPOINT_FILES", "RESUME_MAY_CHANGE", "build_model", "check_resumable", "default_img_size",
           "evaluate_checkpoint", "load_model", "prepare_run_dir", "resolve_checkpoint", "rng_state",
           "seed_everything", "set_rng_state", "train", "world_loaders"]


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed Python and torch with ``seed + rank`` and NumPy with ``seed`` on every rank: NumPy drives
    timm's ``Mixup`` (λ, the mixup/cutmix switch, the box), whose draws per global batch must not
    depend on the world size. Per-image draws (augmentation, drop path) are keyed to the sample
    (``vitmix.data.sampling``)."""
    random.seed(seed + rank)
    np.random.seed(seed)
    torch.manual_seed(seed + rank)


def check_resumable(cfg: TrainConfig, run_dir: Path) -> None:
    """``--resume`` continues the run in ``run_dir`` as it was configured: a flag that would change
    the model, mixer, data or recipe is a one-line ``ValueError`` naming it."""
    _check_resumable(cfg, run_dir, TrainConfig, RESUME_MAY_CHANGE)


def default_img_size(model_name: str) -> int:
    """The input size a model is registered with (timm pretrained_cfg)."""
    import timm

    cfg = timm.models.get_pretrained_cfg(model_name.split(".")[0])
    size = getattr(cfg, "input_size", None) if cfg is not None else None
    return int(size[-1]) if size else 224


def build_model(cfg: TrainConfig, num_classes: int, in_chans: int, img_size: int,
                num_frames: Optional[int] = None, pretrained: bool = False) -> nn.Module:
    """The classifier of ``cfg``; ``num_frames``: clip length of video data (``None`` for images);
    ``pretrained``: with ``cfg``'s pretrained weights (``--pretrained``, ``--pretrained-path``)."""
    return build_classifier(cfg.model, num_classes, in_chans, img_size, num_frames, mixer=cfg.mixer,
                            mixer_options=cfg.mixer_options, model_options=cfg.model_options,
                            drop_path=cfg.drop_path, data=cfg.data, pretrained=pretrained,
                            pretrained_file=cfg.pretrained_path if pretrained else None)


def _subset(train_set, size: Optional[int], seed: int):
    """A fixed, seeded random subset of ``size`` training images (the whole set when ``size`` is None)."""
    order = seeded_subset(len(train_set), size, seed)
    return train_set if order is None else torch.utils.data.Subset(train_set, order.tolist())


#: the seed of ``--val-subset``'s draw: fixed, so runs of any ``--seed`` validate on the same images
VAL_SUBSET_SEED = 0


def val_subset(val_set, size: Optional[int]):
    """A fixed random subset of ``size`` validation images (the whole set for ``None``), drawn with
    :data:`VAL_SUBSET_SEED`; smaller subsets are nested in larger ones."""
    if size is not None and size > len(val_set):
        raise ValueError(f"--val-subset {size} must be between 1 and the {len(val_set)} validation images")
    order = seeded_subset(len(val_set), size, VAL_SUBSET_SEED, "--val-subset")
    return val_set if order is None else torch.utils.data.Subset(val_set, order.tolist())


def _meta(cfg: TrainConfig, img_size: int, data_info, metrics: dict) -> dict:
    """What a checkpoint records to rebuild its model, and the epoch's ``epoch``/``val_acc``."""
    if getattr(data_info, "kind", None) == "sequence":
        shape = data_meta(cfg, data_info)
    else:
        shape = {"img_size": img_size, "in_chans": data_info.in_chans,
                 **({} if data_info.num_frames is None else {"num_frames": data_info.num_frames})}
    start = {} if not cfg.init_from else {"init_from": cfg.init_from, "transfer_epochs": cfg.transfer_epochs,
                                          "distill": cfg.distill}
    return {**model_meta(cfg), "num_classes": data_info.num_classes, **shape, "data": cfg.data,
            "epoch": metrics["epoch"], "val_acc": metrics["val_acc"],
            **({"data_dir": str(cfg.data_dir)} if cfg.data_dir else {}), **start}


def _rate_unit(data: str) -> str:
    """What ``images_per_s`` counts, for the logs: clips for video data, sequences for 1-D data, else images."""
    return "clips/s" if is_video_dataset(data) else "seq/s" if is_sequence_dataset(data) else "img/s"


def _size_text(cfg: TrainConfig, size: int) -> str:
    """The input size for the log line: pixels, or the tokens of a sequence."""
    return f"{size} tokens" if is_sequence_run(cfg) else f"{size}px"


def _summary_table(history, rate_unit: str = "img/s") -> str:
    """One row per epoch; ``train s`` is the training loop, ``val s`` the validation after it."""
    head = (f"{'epoch':>5} {'train loss':>10} {'train acc':>9} {'val loss':>9} {'val acc':>8} {rate_unit:>8} "
            f"{'train s':>7} {'val s':>6}")
    lines = [head, "-" * len(head)]
    for h in history:
        tacc = f"{h['train_acc']:.2f}" if h["train_acc"] is not None else "n/a"
        val_s = f"{h['val_seconds']:.1f}" if h.get("val_seconds") is not None else "n/a"  # older runs
        lines.append(f"{h['epoch']:>5} {h['train_loss']:>10.4f} {tacc:>9} {h['val_loss']:>9.4f} "
                     f"{h['val_acc']:>8.2f} {h['images_per_s']:>8.0f} {h['epoch_seconds']:>7.1f} {val_s:>6}")
    return "\n".join(lines)


def build_recipe(cfg: TrainConfig, model: nn.Module, lr: float, steps_per_epoch: int, num_classes: int,
                 device: torch.device) -> Recipe:
    """Optimizer (with ``--layer-decay``'s groups), lr schedule (``--sched``), loss, mixup, EMA and grad
    scaler from ``cfg`` (all timm/torch pieces, see :mod:`.timm_recipe`)."""
    optimizer = create_optimizer(cfg, model, lr)
    scheduler = create_scheduler(cfg, optimizer, lr, steps_per_epoch)
    mixup_fn = None
    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.smoothing,
                         num_classes=num_classes)
        loss_fn = SoftTargetCrossEntropy()
    else:
        loss_fn = LabelSmoothingCrossEntropy(cfg.smoothing) if cfg.smoothing > 0 else nn.CrossEntropyLoss()
    ema = ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema_decay else None
    scaler = torch.amp.GradScaler(device.type) if cfg.amp and cfg.amp_dtype == "float16" else None
    return Recipe(optimizer, scheduler, loss_fn, clip_grad=cfg.clip_grad, amp=cfg.amp, amp_dtype=cfg.amp_dtype,
                  scaler=scaler, accum_steps=cfg.accum_steps, ema=ema, channels_last=cfg.channels_last,
                  mixup_fn=mixup_fn, max_steps=cfg.max_steps, keep_top_k=cfg.keep_top_k)


def metrics_csv(history) -> str:
    """``metrics.jsonl`` as CSV, one row per epoch (for spreadsheets and plotting tools); the csv
    module quotes a value holding a comma, quote or newline. ``None`` is an empty cell."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=table_columns(history), lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    return text.getvalue()


def train(cfg: TrainConfig, log=print, on_epoch: Optional[Callable[[dict], None]] = None) -> dict:
    """Train ``cfg.model`` on ``cfg.data``; returns a summary dict (also written to ``summary.json``).

    Everything that can fail on bad input (model, mixer, data, image size, resume state) is checked
    before the run directory is created, and an existing run is never overwritten without ``resume``.
    ``on_epoch(metrics)`` is called on the main process after each epoch's checkpoint is written
    (e.g. to drive an outer progress bar).
    """
    info = init_distributed(cfg.device)
    quiet = lambda *a, **k: None  # noqa: E731  (other ranks neither log nor report)
    try:
        return _train(cfg, info, log if info.is_main else quiet, on_epoch if info.is_main else None)
    finally:
        cleanup(info)


def tensorboard_writer(run_dir: Path):
    """A TensorBoard ``SummaryWriter`` logging into ``run_dir/tensorboard``."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir / "tensorboard"))


def check_numbers(cfg: TrainConfig) -> None:
    """Settings out of range are a one-line ``ValueError`` naming the flag (the numbers are checked by
    the config itself; again here for a ``TrainConfig`` built in Python)."""
    cfg.check_values()
    if cfg.amp_dtype not in AMP_DTYPES:
        raise ValueError(f"--amp-dtype {cfg.amp_dtype!r}: choose {' or '.join(AMP_DTYPES)}")
    if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--tensorboard needs the tensorboard package: pip install tensorboard")
    check_wandb(cfg)
    check_start_files(cfg)


def check_video_recipe(cfg: TrainConfig, data_info) -> None:
    """Image-only recipe flags on clips ``(B, C, T, H, W)`` are a one-line ``ValueError``."""
    if data_info.num_frames is None:
        return
    for flag, on in (("--channels-last", cfg.channels_last), ("--cutmix", cfg.cutmix > 0), ("--aa", cfg.aa),
                     ("--reprob", cfg.reprob > 0), ("--color-jitter", cfg.color_jitter)):
        if on:
            raise ValueError(f"{flag} works on images (B, C, H, W); {data_info.name} gives clips (B, C, T, H, W)")


def model_data(cfg: TrainConfig, data_info):
    """``data_info`` as the model sees it: ``--num-classes`` (timm's: the classifier's outputs, which must
    hold every label of the data) and ``--input-size``'s channels (the data's, checked)."""
    if cfg.input_size and cfg.input_size[0] != data_info.in_chans:
        raise ValueError(f"--input-size {' '.join(map(str, cfg.input_size))}: --data {cfg.data} has "
                         f"{plural(data_info.in_chans, 'channel')}; use --input-size {data_info.in_chans} "
                         f"{cfg.input_size[1]} {cfg.input_size[2]}")
    if cfg.num_classes is None or cfg.num_classes == data_info.num_classes:
        return data_info
    if cfg.num_classes < data_info.num_classes:
        raise ValueError(f"--num-classes {cfg.num_classes} is below the {data_info.num_classes} classes of --data "
                         f"{cfg.data} (labels up to {data_info.num_classes - 1}); use --num-classes "
                         f"{data_info.num_classes} or drop the flag")
    return dataclasses.replace(data_info, num_classes=cfg.num_classes)


def prepare_run_dir(cfg: TrainConfig) -> Path:
    """The run directory, checked: a new run never lands on an existing one, a resume needs one."""
    return _prepare_run_dir(cfg, TrainConfig, RESUME_MAY_CHANGE, f"{cfg.model}-{cfg.mixer or 'default'}-{cfg.data}")


def _saved_default_size(cfg: TrainConfig) -> TrainConfig:
    """``--resume --img-size S`` on a run saved without a size (null: the model's default) asks for no
    change when S is that default: ``cfg`` with the size left unset again, so the check passes."""
    saved = Path(cfg.out or "", "config.yaml")
    if not (cfg.resume and cfg.img_size is not None and saved.is_file()):
        return cfg
    values = load_yaml(saved)
    if values.get("img_size") is None and cfg.img_size == default_img_size(values.get("model", cfg.model)):
        return dataclasses.replace(cfg, img_size=None)
    return cfg


def world_loaders(train_set, val_set, cfg: TrainConfig, info: DistInfo):
    """``(train_loader, val_loader, batch_sampler)`` for this rank, the same run at any world size:
    each step trains on one global batch of ``world_size × batch_size`` images of a permutation that
    depends only on ``(seed, epoch)``, every image augmented from ``(seed, epoch, index)``; each rank
    validates its own shard, every image once."""
    batches = GlobalBatchSampler(len(train_set), cfg.batch_size, info.world_size, info.rank, cfg.seed)
    val_shard = ShardSampler(len(val_set), info.world_size, info.rank) if info.enabled else None
    train_loader, val_loader = build_loaders(SeededSamples(train_set, cfg.seed), val_set, cfg.batch_size,
                                             cfg.workers, cfg.seed, val_sampler=val_shard, batch_sampler=batches,
                                             pin_memory=info.device.type == "cuda")
    return train_loader, val_loader, batches


def _train(cfg: TrainConfig, info: DistInfo, log, on_epoch=None) -> dict:
    check_numbers(cfg)
    check_sequence_run(cfg)
    source = None
    if cfg.init_from:                # the teacher gives the architecture (and, by default, the data)
        source = find_teacher(cfg.init_from)
        cfg = teacher_config(cfg, source)
        check_world(cfg, info.world_size)
    cfg = _saved_default_size(cfg)
    run_dir = prepare_run_dir(cfg)   # first: a changed --resume is refused even where its new data is missing
    if source is not None and cfg.resume:
        check_unchanged(run_dir, source)
    seed_everything(cfg.seed, info.rank)
    img_size = cfg.input_size[-1] if cfg.input_size else cfg.img_size or default_img_size(cfg.model)
    if is_sequence_run(cfg):         # 1-D ids (vitmix.train.sequences): the data gives the model its sizes
        train_set, val_set, data_info = sequence_data(cfg, progress=not _quiet(info))
        img_size = data_info.seq_len
        model = build_sequence_model(cfg, data_info)
    else:
        train_set, val_set, data_info = build_datasets(cfg.data, img_size, cfg.data_dir, cfg.download,
                                                       train_augment(cfg), num_frames=cfg.num_frames)
        check_video_recipe(cfg, data_info)
        data_info = model_data(cfg, data_info)
        model = build_model(cfg, data_info.num_classes, data_info.in_chans, img_size, data_info.num_frames,
                            pretrained=cfg.pretrained and not cfg.resume)     # resumed: its own weights
    model = model.to(info.device)
    train_set = _subset(train_set, cfg.train_subset, cfg.seed)
    val_set = val_subset(val_set, cfg.val_subset)
    if cfg.initial_checkpoint and not cfg.resume:
        load_initial_checkpoint(model, cfg.initial_checkpoint)
    if cfg.grad_checkpointing:
        set_grad_checkpointing(model, cfg.model)
    teacher = None
    if source is not None:
        teacher = load_teacher(source, cfg, data_info, img_size, info.device)
        load_converted(model, teacher, cfg)
    sample_keys = key_drop_path(model, cfg.seed, by_module=cfg.grad_checkpointing)
    train_loader, val_loader, sampler = world_loaders(train_set, val_set, cfg, info)
    global_batch = cfg.batch_size * info.world_size * cfg.accum_steps
    lr = cfg.lr * global_batch / cfg.lr_base_batch if cfg.lr_base_batch else cfg.lr
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    r = build_recipe(cfg, model, lr, len(train_loader) // cfg.accum_steps, data_info.num_classes, info.device)
    r.sample_keys = sample_keys

    start_epoch, step, best_acc, history = 0, 0, -1.0, []
    if cfg.resume:
        start_epoch, step, best_acc, history = _resume(run_dir, model, r, train_loader, info.is_main, log,
                                                       lambda metrics: _meta(cfg, img_size, data_info, metrics))
        if cfg.epochs < start_epoch:
            raise ValueError(f"--epochs {cfg.epochs} is below the {start_epoch} epochs {run_dir} has already run")
        resume_schedule(r.scheduler, history, step, cfg)

    if cfg.compile:
        model = CompiledWithFallback(model)
    if info.enabled:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[info.device.index]
                                                    if info.device.type == "cuda" else None)

    n_params = sum(p.numel() for p in unwrap(model).parameters())
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        clear_aborted(run_dir)
        size_key = "seq_len" if is_sequence_run(cfg) else "img_size"
        save_run_config(run_dir, cfg, f"{size_key}={img_size} world_size={info.world_size}")
    log(f"vitmix train: {cfg.model} (mixer={cfg.mixer or 'default'}, {n_params / 1e6:.2f}M params) on {cfg.data} "
        f"({len(train_set)} train / {len(val_set)} val, {_size_text(cfg, img_size)}) "
        f"for {plural(cfg.epochs, 'epoch')}, "
        f"device={info.device}, world={info.world_size}, lr {lr:g} for a global batch of {global_batch}"
        f"{f' (--lr × {global_batch}/{cfg.lr_base_batch})' if cfg.lr_base_batch else ''}; run dir {run_dir}")

    t0, start_record = time.perf_counter(), None
    try:
        if teacher is not None:
            start_record = _start_from_teacher(cfg, info, run_dir, source, unwrap(model), teacher, r,
                                               (train_loader, val_loader, sampler), start_epoch > 0 or step > 0,
                                               _meta(cfg, img_size, data_info, {"epoch": 0, "val_acc": None}), log)
        history, step = _epochs(cfg, info, model, r, (train_loader, val_loader, sampler), run_dir,
                                (start_epoch, step, best_acc, history), lambda m: _meta(cfg, img_size, data_info, m),
                                log, on_epoch)
    except FloatingPointError as err:      # as runs.recorded_abort, beside the interrupt's own message
        raise FloatingPointError(abort_message(run_dir, err, info.is_main)) from None
    except KeyboardInterrupt:      # the last finished epoch is on disk: say how to go on from it
        raise KeyboardInterrupt(f"continue with `vitmix train --out {run_dir} --resume`") from None
    return _finish(cfg, run_dir, history, n_params, step, time.perf_counter() - t0, info.is_main, log,
                   {"init_from": start_record} if start_record else {})


def _start_from_teacher(cfg, info, run_dir, source, model, teacher, r: Recipe, loaders, resumed: bool, meta, log):
    """The ``--init-from`` stage before the epochs (see :mod:`.init_from`): the attention transfer (or the
    weights of a finished one), the random state restarted after it, the distillation loss. Returns the
    run's ``init.json`` record (``None`` on other ranks)."""
    log(f"starting from {source.checkpoint} ({source.meta.get('model', cfg.model)}, mixer="
        f"{source.meta.get('mixer') or 'default'}), its attention converted to {cfg.mixer}"
        f"{'; distilling its logits' if cfg.distill else ''}")
    record = None
    if info.is_main:
        record = transfer_stage(run_dir, source, cfg, model, teacher, loaders, resumed=resumed, meta=meta,
                                progress=not _quiet(info), log=log)
    if not resumed:           # the fine-tune starts alike whether the transfer ran now or before a resume
        seed_everything(cfg.seed, info.rank)    # (the EMA needs nothing: timm's first update copies the model)
        loaders[0].generator.manual_seed(cfg.seed)
    if cfg.distill:
        r.distill = LogitDistillation(teacher, cfg.distill_weight, cfg.distill_temperature)
    return record


def _epochs(cfg, info, model, r, loaders, run_dir, start, meta_for, log, on_epoch):
    """The epoch loop: train, validate, checkpoint, log; returns ``(history, step)``."""
    train_loader, val_loader, sampler = loaders
    start_epoch, step, best_acc, history = start
    board = tensorboard_writer(run_dir) if cfg.tensorboard and info.is_main else None
    wandb = WandbLog(cfg, run_dir) if cfg.log_wandb and info.is_main else None
    for epoch in range(start_epoch, cfg.epochs):
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break                                          # a resumed run already at its step limit
        sampler.set_epoch(epoch)
        metrics, step = train_one_epoch(model, train_loader, r, epoch=epoch, epochs=cfg.epochs, info=info, step=step)
        metrics.update(_validate(model, r, val_loader, info, cfg), epoch=epoch + 1)
        step_epoch(r.scheduler, epoch + 1, metrics, cfg)        # --sched plateau: its decision for the next epoch
        history.append(metrics)
        if board is not None:
            _log_board(board, metrics, epoch + 1)
        if wandb is not None:
            wandb.log(metrics, epoch + 1)
        if info.is_main:
            _save_epoch(run_dir, model, r, train_loader, history, step, best_acc, meta_for(metrics))
        best_acc = max(best_acc, metrics["val_acc"])
        ema_text = f" (EMA {metrics['val_acc_ema']:.2f}%)" if r.ema is not None else ""
        log(f"epoch {epoch + 1:>3}/{cfg.epochs}: train loss {metrics['train_loss']:.4f}, "
            f"val loss {metrics['val_loss']:.4f}, val acc {metrics['val_acc']:.2f}%{ema_text}, "
            f"{metrics['images_per_s']:.0f} {_rate_unit(cfg.data)}, {metrics['epoch_seconds']:.1f}s training + "
            f"{metrics['val_seconds']:.1f}s validation")
        if on_epoch is not None:
            on_epoch(metrics)
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break
    if board is not None:
        board.close()
    if wandb is not None:
        wandb.close()
    return history, step


def _log_board(board, metrics: dict, epoch: int) -> None:
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and key != "epoch":
            board.add_scalar(key, value, epoch)
    board.flush()


def _validate(model, r, val_loader, info, cfg) -> dict:
    """Validation loss/accuracy of the model, and of its EMA when one is kept, and the seconds it took."""
    start = time.perf_counter()
    metrics = evaluate(model, val_loader, info, cfg.amp, amp_dtype=cfg.amp_dtype, channels_last=cfg.channels_last)
    if r.ema is not None:
        ema = evaluate(r.ema.module, val_loader, info, cfg.amp, "eval ema", cfg.amp_dtype, cfg.channels_last)
        metrics.update(val_loss_ema=ema["val_loss"], val_acc_ema=ema["val_acc"])
    metrics["val_seconds"] = time.perf_counter() - start
    return metrics


def _finish(cfg, run_dir, history, n_params, step, seconds, is_main, log, extra=None) -> dict:
    """``summary.json``, the curves, the summary table and the final line; ``extra``: more summary entries."""
    summary = {"run_dir": str(run_dir), "model": cfg.model, "mixer": cfg.mixer, "data": cfg.data,
               "params": n_params, "epochs_run": len(history), "steps": step,
               "final_val_acc": history[-1]["val_acc"] if history else None,
               "best_val_acc": max((h["val_acc"] for h in history), default=None),
               "train_seconds": seconds, **(extra or {})}
    if is_main and history:
        plot_curves(history, run_dir / "curves.png", f"{cfg.model} ({cfg.mixer or 'default'}) on {cfg.data}")
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        log("\n" + _summary_table(history, _rate_unit(cfg.data)))
        log(f"\nfinal val accuracy {summary['final_val_acc']:.2f}% (best {summary['best_val_acc']:.2f}%) "
            f"in {summary['train_seconds']:.0f}s; run directory: {run_dir}")
    return summary


def _save_epoch(run_dir, model, r, loader, history, step, best_acc, meta) -> None:
    """Write one checkpoint set; ``state.pt`` goes last and records the digests of the others."""
    if meta["val_acc"] > best_acc:
        save_weights(model, run_dir / "best.safetensors", meta)
    top = _update_top_k(run_dir, model, history, meta, r.keep_top_k)
    save_metrics(run_dir, history)
    save_text(run_dir / "metrics.csv", metrics_csv(history))
    if r.ema is not None:
        save_weights(r.ema.module, run_dir / "ema.safetensors", dict(meta, val_acc=history[-1]["val_acc_ema"]))
    save_weights(model, run_dir / "last.safetensors", meta)
    save_manifest(run_dir, _trainable(model, r, loader), meta["epoch"], step, history, (*CHECKPOINT_FILES, *top),
                  best_acc=max(best_acc, meta["val_acc"]))


def _trainable(model, r: Recipe, loader) -> Trainable:
    return Trainable(model, r.optimizer, ema=r.ema, scaler=r.scaler, loader=loader)


def _update_top_k(run_dir: Path, model, history, meta, k: int) -> list:
    """Keep ``top/epoch-NNN.safetensors`` for the ``k`` best epochs so far (ties: the earlier epoch);
    returns their names. Nothing is written for ``k = 1`` (``best.safetensors`` is the top-1)."""
    if k <= 1:
        return []
    ranked = sorted(history, key=lambda h: (-h["val_acc"], h["epoch"]))[:k]
    keep = {f"top/epoch-{h['epoch']:03d}.safetensors" for h in ranked}
    name = f"top/epoch-{meta['epoch']:03d}.safetensors"
    if name in keep:
        save_weights(model, run_dir / name, meta)
    for path in (run_dir / "top").glob("epoch-*.safetensors"):
        if f"top/{path.name}" not in keep:
            path.unlink()
    return sorted(keep)


def _resume(run_dir, model, r, loader, is_main, log, meta_for):
    """Load the last complete checkpoint set (see :func:`vitmix.runs.resume_run`): ``(epoch, step,
    best_acc, history)``; a partial or damaged set is rewritten from it, ``best.safetensors`` from
    the set's copy of the best epoch's weights (``last`` or ``top/``), or removed when none has them."""
    def rewrite(history):       # every file the restored state determines (best: see resume_run)
        if history:
            meta = meta_for(history[-1])
            save_weights(model, run_dir / "last.safetensors", meta)
            if r.ema is not None:
                save_weights(r.ema.module, run_dir / "ema.safetensors",
                             dict(meta, val_acc=history[-1]["val_acc_ema"]))
            save_text(run_dir / "metrics.csv", metrics_csv(history))

    done = resume_run(run_dir, _trainable(model, r, loader), log, rewrite, is_main)
    log(resuming_line(run_dir, done.epoch, done.step))
    return done.epoch, done.step, float(done.state.get("best_acc", -1.0)), done.history


_load_checkpoint = load_checkpoint   # the name robustness.py and the tests patch


def evaluate_checkpoint(checkpoint, data: Optional[str] = None, data_dir: Optional[str] = None,
                        batch_size: int = 128, device: Optional[str] = None, amp: bool = False) -> dict:
    """Rebuild the model recorded in a vitmix checkpoint and measure it on ``data``'s validation split."""
    model, meta, path = _load_checkpoint(checkpoint, device)
    if data is None and data_dir is None:   # the data it was trained on, from the folder it was read from
        data_dir = meta.get("data_dir")
    data = data or meta.get("data")
    if "sequence" in meta or is_sequence_dataset(data):
        val_set = eval_set(meta, data, data_dir, meta.get("data_options"))
    else:
        _, val_set, data_info = build_datasets(data, int(meta["img_size"]), data_dir, augment=False,
                                               num_frames=meta.get("num_frames"))
        if data_info.num_classes > meta["num_classes"] or data_info.in_chans != meta["in_chans"]:   # --num-classes
            raise ValueError(f"{path} was trained for {meta['num_classes']} classes / {meta['in_chans']} channels, "
                             f"but {data} has {data_info.num_classes} / {data_info.in_chans}")
    info = DistInfo(device=next(model.parameters()).device)
    _, val_loader = build_loaders(val_set, val_set, batch_size, pin_memory=info.device.type == "cuda")
    result = evaluate(model, val_loader, info, amp)
    result.update(checkpoint=str(path), model=meta["model"], mixer=meta.get("mixer"), data=data)
    return result
