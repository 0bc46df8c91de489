"""One optimizer step of a task's loop, with the checks every task makes."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def checked_step(loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer, clip_grad: Optional[float],
                 step: int, hint: str = "lower --lr") -> None:
    """Back-propagate ``loss`` and step ``optimizer`` (gradients clipped to norm ``clip_grad`` when set); a
    non-finite loss at step ``step + 1`` is a ``FloatingPointError`` that says what to change (``hint``)."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"the loss became {loss.item()} at step {step + 1}; {hint}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_grad:
        nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    optimizer.step()
