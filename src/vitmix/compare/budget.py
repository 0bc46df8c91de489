"""What a comparison trains for: ``--seeds`` and ``--budget epochs | time=SECONDS | flops=N``.

A budget is turned into a number of optimizer steps per entry *before* any training, so that the
cosine schedule is laid over the whole budget (``max_steps`` = the steps, ``epochs`` = enough epochs
to hold them) and a rerun or another seed trains exactly as long:

- ``epochs``: the recipe's ``--epochs`` (and ``--max-steps``), the same for every entry;
- ``flops=N``: ``floor(N / (training FLOPs per image × global batch))`` steps, where the training
  FLOPs of an image are 3 × its forward FLOPs (forward + a backward of about twice its cost; the
  forward count is the leaderboard's GFLOPs column, :func:`forward_flops`);
- ``time=SECONDS``: ``floor(SECONDS / seconds per step)`` steps, the seconds per step measured once
  per entry by :func:`calibrate_step_seconds` (median of full training steps on random data) before
  anything trains, because timing the run itself on a shared machine would make the budget drift.

The plans are kept in ``OUT/budget.json``: a rerun reads them back instead of measuring again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

#: Training FLOPs of one image as a multiple of its forward FLOPs (backward ≈ 2 × forward).
TRAIN_FLOPS_PER_FORWARD = 3


class BudgetError(ValueError):
    """A budget that cannot be planned (below one step, or given twice): bad input, never an entry's failure."""


@dataclass(frozen=True)
class Budget:
    """``kind`` is ``"epochs"``, ``"time"`` (``amount`` in seconds) or ``"flops"`` (``amount`` in FLOPs)."""

    kind: str = "epochs"
    amount: Optional[float] = None

    def __str__(self) -> str:
        return self.kind if self.amount is None else f"{self.kind}={self.amount:g}"


def parse_budget(text: Optional[str]) -> Budget:
    """``"epochs"``, ``"time=600"`` or ``"flops=1e15"`` → :class:`Budget`; anything else is a one-line error."""
    text = (text or "epochs").strip()
    if text == "epochs":
        return Budget()
    kind, _, value = text.partition("=")
    kind = kind.strip()
    if kind not in ("time", "flops") or not value.strip():
        raise ValueError(f"--budget {text!r}: give epochs, time=SECONDS or flops=N (e.g. flops=1e15)")
    try:
        amount = float(value)
    except ValueError:
        raise ValueError(f"--budget {text!r}: {value.strip()!r} is not a number") from None
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"--budget {text!r}: the {kind} budget must be a positive number")
    return Budget(kind, amount)


def parse_seeds(text: Optional[str]) -> Optional[List[int]]:
    """``"0,1,2"`` → ``[0, 1, 2]``; ``None`` (no ``--seeds``) stays ``None``. Empty, repeated or
    non-integer seeds are a one-line ``ValueError``."""
    if text is None:
        return None
    items = [s.strip() for s in text.split(",")]
    if not any(items):
        raise ValueError("--seeds is empty: give comma-separated integers, e.g. --seeds 0,1,2")
    seeds = []
    for item in items:
        try:
            seeds.append(int(item))
        except ValueError:
            raise ValueError(f"--seeds {text!r}: {item!r} is not an integer (e.g. --seeds 0,1,2)") from None
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"--seeds {text!r}: seed {', '.join(map(str, repeated))} given twice")
    return seeds


def steps_per_epoch(train_images: int, batch_size: int, accum_steps: int = 1) -> int:
    """Optimizer steps in one epoch of ``vitmix train`` on one process (its loader drops the last,
    incomplete batch unless the set fits in one batch; its last incomplete accumulation group too)."""
    batches = train_images // batch_size if train_images > batch_size else 1
    return max(batches // accum_steps, 1)


def forward_flops(model: torch.nn.Module, img_size: int, in_chans: int, device="cpu") -> int:
    """Forward FLOPs of one image at ``img_size`` (``vitmix bench``'s counter; 1 MAC = 2 FLOPs)."""
    from ..bench.flops import count_flops

    one = torch.randn(1, in_chans, img_size, img_size, device=device)
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        flops = count_flops(lambda: model(one)).total
    model.train(was_training)
    return flops


def calibrate_step_seconds(model: torch.nn.Module, cfg, img_size: int, in_chans: int, num_classes: int,
                           device) -> float:
    """Median seconds of one full training step (forward, loss, backward, clip, AdamW step) at the
    recipe's batch size and precision, on random images: the time budget's exchange rate."""
    from timm.optim import create_optimizer_v2

    from .._util import autocast
    from ..bench.timing import time_call
    from ..train.engine import AMP_DTYPES

    model = model.to(device).train()
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay)
    images = torch.randn(cfg.batch_size, in_chans, img_size, img_size, device=device)
    targets = torch.randint(0, num_classes, (cfg.batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        for _ in range(cfg.accum_steps):
            with autocast(device, AMP_DTYPES[cfg.amp_dtype] if cfg.amp else None):
                loss = loss_fn(model(images).float(), targets)
            loss.backward()
        if cfg.clip_grad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return time_call(step, device=device, min_run_time=1.0, min_samples=5, warmup=2).median_s


def steps_for_budget(budget: Budget, label: str, *, step_flops: Optional[float] = None,
                     step_seconds: Optional[float] = None) -> int:
    """The whole number of steps a time or FLOP budget buys; a budget below one step is a one-line error."""
    cost, unit = (step_flops, "FLOPs") if budget.kind == "flops" else (step_seconds, "s")
    steps = int(budget.amount // cost)
    if steps < 1:
        raise BudgetError(f"--budget {budget} cannot be met: one training step of {label} takes {cost:.4g} {unit}; "
                         "give a budget of at least that")
    return steps
