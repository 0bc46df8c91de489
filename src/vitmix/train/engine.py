"""One training epoch and one evaluation pass."""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn
from tqdm.auto import tqdm

from .._util import autocast
from .checkpoint import unwrap
from ..runs.distributed import DistInfo, SampleKeys, all_reduce_sum


def _quiet(info: DistInfo) -> bool:
    """Progress bars only on rank 0, and never when TQDM_DISABLE is set (CI logs, tests)."""
    return not info.is_main or os.environ.get("TQDM_DISABLE", "") not in ("", "0")


#: --amp-dtype: bf16, or fp16 with a grad scaler
AMP_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Recipe:
    """How each optimizer step is taken (the ``vitmix train`` flags behind it in brackets)."""

    optimizer: torch.optim.Optimizer
    scheduler: object                              # timm scheduler: step_update(num_updates=...)
    loss_fn: nn.Module
    clip_grad: Optional[float] = None              # --clip-grad
    amp: bool = False                              # --amp
    amp_dtype: str = "bfloat16"                    # --amp-dtype; float16 uses `scaler`
    scaler: Optional[torch.amp.GradScaler] = None
    accum_steps: int = 1                           # --accum-steps micro-batches per optimizer step
    ema: Optional[nn.Module] = None                # timm ModelEmaV3 (--ema-decay)
    channels_last: bool = False                    # --channels-last
    mixup_fn: Optional[object] = None
    sample_keys: Optional[SampleKeys] = None       # drop path keyed to (seed, epoch, sample index)
    max_steps: Optional[int] = None                # --max-steps (optimizer steps)
    keep_top_k: int = 1                            # --keep-top-k checkpoints kept under top/
    distill: Optional[Callable] = None             # --distill: (task loss, logits, images) -> loss


def _optimizer_step(model: nn.Module, r: Recipe, step: int) -> int:
    if r.scaler is not None:
        r.scaler.unscale_(r.optimizer)                 # clip the true gradients
    if r.clip_grad:
        nn.utils.clip_grad_norm_(model.parameters(), r.clip_grad)
    if r.scaler is not None:
        r.scaler.step(r.optimizer)
        r.scaler.update()
    else:
        r.optimizer.step()
    r.optimizer.zero_grad(set_to_none=True)
    step += 1
    r.scheduler.step_update(num_updates=step)
    if r.ema is not None:
        r.ema.update(unwrap(model), step=step)
    return step


def train_one_epoch(model: nn.Module, loader, r: Recipe, *, epoch: int, epochs: int, info: DistInfo, step: int):
    """Train for one epoch; returns ``(metrics, step)``. Accuracy is on hard labels (n/a under mixup).

    With ``accum_steps = k`` every optimizer step averages the gradients of k micro-batches (the
    last, incomplete group of an epoch is dropped, so every step sees k batches)."""
    model.train()
    loss_sum = correct = seen = 0.0
    start = time.perf_counter()
    usable = len(loader) - len(loader) % r.accum_steps
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, disable=_quiet(info),
               dynamic_ncols=True, total=usable)
    r.optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(bar):
        if i >= usable or (r.max_steps is not None and step >= r.max_steps):
            break
        images, targets = batch[0], batch[1]
        if r.sample_keys is not None and len(batch) > 2:     # SeededSamples adds each row's index
            r.sample_keys.start(epoch, batch[2])
        images, targets = images.to(info.device, non_blocking=True), targets.to(info.device, non_blocking=True)
        if r.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        hard = targets
        if r.mixup_fn is not None:
            images, targets = r.mixup_fn(images, targets)
        last_micro = (i + 1) % r.accum_steps == 0
        sync = contextlib.nullcontext() if last_micro or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast(info.device, AMP_DTYPES[r.amp_dtype] if r.amp else None):
                logits = model(images)
                loss = r.loss_fn(logits.float(), targets)
                if r.distill is not None:
                    loss = r.distill(loss, logits, images)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss became {loss.item()} at step {step}; lower --lr or disable --amp")
            scaled = loss / r.accum_steps
            (r.scaler.scale(scaled) if r.scaler is not None else scaled).backward()
        if last_micro:
            step = _optimizer_step(model, r, step)
        n = images.shape[0]
        loss_sum += loss.item() * n
        seen += n
        if r.mixup_fn is None:
            correct += (logits.argmax(-1) == hard).sum().item()
        rate = seen / max(time.perf_counter() - start, 1e-9)
        unit = {5: "clips/s", 2: "seq/s"}.get(images.ndim, "img/s")   # video (B, C, T, H, W), sequences (B, N)
        postfix = {"loss": f"{loss_sum / seen:.3f}", unit: f"{rate * info.world_size:.0f}"}
        if r.mixup_fn is None:
            postfix["acc"] = f"{100 * correct / seen:.1f}"
        bar.set_postfix(postfix)
    elapsed = time.perf_counter() - start
    loss_sum, correct, seen = all_reduce_sum([loss_sum, correct, seen], info)
    metrics = {
        "train_loss": loss_sum / max(seen, 1),
        "train_acc": None if r.mixup_fn is not None else 100 * correct / max(seen, 1),
        "images_per_s": seen / max(elapsed, 1e-9),
        "epoch_seconds": elapsed,
        "lr": max(group["lr"] for group in r.optimizer.param_groups),   # the peak: --layer-decay scales the rest
    }
    return metrics, step


@torch.no_grad()
def evaluate(model: nn.Module, loader, info: DistInfo, amp: bool = False, desc: str = "eval",
             amp_dtype: str = "bfloat16", channels_last: bool = False):
    """Top-1 accuracy (%), top-5 accuracy (``val_acc_top5``, when there are more than 5 classes) and
    cross-entropy loss over ``loader`` (summed over ranks: each rank's loader must hold its own
    images, e.g. ``vitmix.data.sampling.ShardSampler``)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module       # shards may differ by a batch: no DDP forward (buffer broadcast) here
    model.eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loss_sum = correct = correct5 = seen = 0.0
    num_classes = 0
    for images, targets in tqdm(loader, desc=desc, leave=False, disable=_quiet(info), dynamic_ncols=True):
        images, targets = images.to(info.device, non_blocking=True), targets.to(info.device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(info.device, AMP_DTYPES[amp_dtype] if amp else None):
            logits = model(images).float()
        loss_sum += loss_fn(logits, targets).item()
        correct += (logits.argmax(-1) == targets).sum().item()
        num_classes = logits.shape[-1]
        if num_classes > 5:
            correct5 += (logits.topk(5, dim=-1).indices == targets[:, None]).any(-1).sum().item()
        seen += images.shape[0]
    loss_sum, correct, correct5, seen = all_reduce_sum([loss_sum, correct, correct5, seen], info)
    result = {"val_loss": loss_sum / max(seen, 1), "val_acc": 100 * correct / max(seen, 1), "val_images": int(seen)}
    if num_classes > 5:
        result["val_acc_top5"] = 100 * correct5 / max(seen, 1)
    return result
