"""One training epoch and one evaluation pass."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Optional

import torch
from torch import nn
from tqdm.auto import tqdm

from .distributed import DistInfo, all_reduce_sum


def _quiet(info: DistInfo) -> bool:
    """Progress bars only on rank 0, and never when TQDM_DISABLE is set (CI logs, tests)."""
    return not info.is_main or os.environ.get("TQDM_DISABLE", "") not in ("", "0")


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on the run's device, or a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def train_one_epoch(model: nn.Module, loader, loss_fn, optimizer, scheduler, *, epoch: int, epochs: int,
                    info: DistInfo, step: int, mixup_fn=None, clip_grad: Optional[float] = None,
                    amp: bool = False, max_steps: Optional[int] = None):
    """Train for one epoch; returns ``(metrics, step)``. Accuracy is on hard labels (n/a under mixup)."""
    model.train()
    loss_sum = correct = seen = 0.0
    start = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, disable=_quiet(info),
               dynamic_ncols=True)
    for images, targets in bar:
        if max_steps is not None and step >= max_steps:
            break
        images, targets = images.to(info.device), targets.to(info.device)
        hard = targets
        if mixup_fn is not None:
            images, targets = mixup_fn(images, targets)
        with autocast(info.device, amp):
            logits = model(images)
            loss = loss_fn(logits.float(), targets)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}; lower --lr or disable --amp")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        optimizer.step()
        step += 1
        scheduler.step_update(num_updates=step)
        n = images.shape[0]
        loss_sum += loss.item() * n
        seen += n
        if mixup_fn is None:
            correct += (logits.argmax(-1) == hard).sum().item()
        rate = seen / max(time.perf_counter() - start, 1e-9)
        postfix = {"loss": f"{loss_sum / seen:.3f}", "img/s": f"{rate * info.world_size:.0f}"}
        if mixup_fn is None:
            postfix["acc"] = f"{100 * correct / seen:.1f}"
        bar.set_postfix(postfix)
    elapsed = time.perf_counter() - start
    loss_sum, correct, seen = all_reduce_sum([loss_sum, correct, seen], info)
    metrics = {
        "train_loss": loss_sum / max(seen, 1),
        "train_acc": None if mixup_fn is not None else 100 * correct / max(seen, 1),
        "images_per_s": seen / max(elapsed, 1e-9),
        "epoch_seconds": elapsed,
        "lr": optimizer.param_groups[0]["lr"],
    }
    return metrics, step


@torch.no_grad()
def evaluate(model: nn.Module, loader, info: DistInfo, amp: bool = False, desc: str = "eval"):
    """Top-1 accuracy (%) and cross-entropy loss over ``loader`` (summed over ranks)."""
    model.eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loss_sum = correct = seen = 0.0
    for images, targets in tqdm(loader, desc=desc, leave=False, disable=_quiet(info), dynamic_ncols=True):
        images, targets = images.to(info.device), targets.to(info.device)
        with autocast(info.device, amp):
            logits = model(images).float()
        loss_sum += loss_fn(logits, targets).item()
        correct += (logits.argmax(-1) == targets).sum().item()
        seen += images.shape[0]
    loss_sum, correct, seen = all_reduce_sum([loss_sum, correct, seen], info)
    return {"val_loss": loss_sum / max(seen, 1), "val_acc": 100 * correct / max(seen, 1), "val_images": int(seen)}
