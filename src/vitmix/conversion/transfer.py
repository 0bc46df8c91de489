"""Attention transfer: train the mixers of a converted model to reproduce their teacher layers.

Each teacher attention layer's input and output are captured with forward hooks while the frozen
teacher runs on a batch; each student mixer then mixes *the teacher's* input of its layer and is
scored by the MSE to the teacher's output. Layers are trained side by side but independently (the
loss is the sum of the per-layer MSEs, and no layer sees another student layer's output), so
errors do not compound from layer to layer and a batch costs one teacher forward plus one mixer
forward per layer. End-to-end fine-tuning with the task loss (and logit distillation) follows this
stage; see ``docs/convert.md``.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .._util import autocast
from ..mixers import TokenMixer
from ..models.swap import find_attention_layers

Pairs = List[Tuple[str, nn.Module, TokenMixer]]


def paired_layers(student: nn.Module, teacher: nn.Module) -> Pairs:
    """``(name, teacher layer, student mixer)`` for every attention layer of ``teacher``: the student's
    module of the same name (as :func:`~vitmix.conversion.convert` leaves it), which must be a mixer."""
    teacher_layers = find_attention_layers(teacher)
    if not teacher_layers:
        raise ValueError(f"the teacher ({type(teacher).__name__}) has no attention layers (timm Attention or "
                         f"vitmix mixers)")
    modules = dict(student.named_modules())
    pairs = []
    for name, layer in teacher_layers:
        mixer = modules.get(name)
        if not isinstance(mixer, TokenMixer):
            found = "no such module" if mixer is None else type(mixer).__name__
            raise ValueError(f"student layer {name} is not a vitmix mixer ({found}); transfer pairs the layers of "
                             f"a model with the model vitmix.convert made of it")
        pairs.append((name, layer, mixer))
    return pairs


@contextlib.contextmanager
def _captured(pairs: Pairs) -> Iterator[Dict[str, Tuple[torch.Tensor, torch.Tensor]]]:
    """Forward hooks on the teacher layers: ``{name: (layer input, layer output)}`` of the last forward."""
    seen: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(name):
        def store(module, args, output):
            seen[name] = (args[0].detach(), output.detach())
        return store

    handles = [layer.register_forward_hook(hook(name)) for name, layer, _ in pairs]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _modes(teacher: nn.Module, mixers: Iterable[nn.Module], mixers_train: bool) -> Iterator[None]:
    """The teacher in eval mode, the mixers in ``mixers_train`` mode; the previous modes restored after."""
    mixers = list(mixers)
    before = [(m, m.training) for m in [teacher, *mixers]]
    teacher.eval()
    for mixer in mixers:
        mixer.train(mixers_train)
    try:
        yield
    finally:
        for module, training in before:
            module.train(training)


def _images(batch) -> torch.Tensor:
    """The inputs of a loader batch: ``(images, targets)`` pairs or bare image tensors."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def _bind_batch_grid(student: nn.Module, images: torch.Tensor) -> None:
    """A ``dynamic_img_size`` student learns its token grid from its patch embedding's forward hook
    (``bind_token_grid``); the transfer runs only its mixers, so run that embedding for this batch."""
    embed = getattr(student, "patch_embed", None)
    if getattr(embed, "_vitmix_grid_hook", False):
        with torch.no_grad():
            embed(images)


def _layer_losses(student: nn.Module, teacher: nn.Module, pairs: Pairs, seen: dict, images: torch.Tensor,
                  amp_dtype) -> torch.Tensor:
    """The ``(layers,)`` MSEs of the student mixers on the teacher's layer inputs of ``images``."""
    with torch.no_grad(), autocast(images.device, amp_dtype):
        teacher(images)
    _bind_batch_grid(student, images)
    losses = []
    for name, _, mixer in pairs:
        x, target = seen[name]
        with autocast(images.device, amp_dtype):
            out = mixer(x)
        losses.append(F.mse_loss(out.float(), target.float()))
    return torch.stack(losses)


def _device(student: nn.Module, device) -> torch.device:
    if device is not None:
        return torch.device(device)
    first = next(student.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _batches(loader) -> Iterator:
    """``loader``'s batches, epoch after epoch."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the transfer loader yields no batches")


def _total_steps(loader, steps: Optional[int], epochs: Optional[int]) -> int:
    if steps is not None and epochs is not None:
        raise ValueError(f"give steps ({steps}) or epochs ({epochs}), not both")
    if steps is None:
        epochs = 1 if epochs is None else epochs
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs={epochs!r} must be a positive integer")
        steps = epochs * len(loader)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer")
    return steps


@torch.no_grad()
def layer_mse(student: nn.Module, teacher: nn.Module, loader, *, batches: int = 1,
              device=None) -> Dict[str, float]:
    """Per-layer MSE between each student mixer's output and its teacher layer's, both on the teacher's
    layer input, averaged over the first ``batches`` batches of ``loader`` (mixers in eval mode)."""
    pairs = paired_layers(student, teacher)
    dev = _device(student, device)
    total = torch.zeros(len(pairs), dtype=torch.float64)
    count = 0
    with _modes(teacher, (m for _, _, m in pairs), mixers_train=False), _captured(pairs) as seen:
        for batch, _ in zip(loader, range(batches)):
            total += _layer_losses(student, teacher, pairs, seen, _images(batch).to(dev), None).double().cpu()
            count += 1
    if not count:
        raise ValueError("the loader yields no batches")
    return {name: float(v) for (name, _, _), v in zip(pairs, total / count)}


def transfer_attention(student: nn.Module, teacher: nn.Module, loader, *, steps: Optional[int] = None,
                       epochs: Optional[int] = None, lr: float = 1e-4, weight_decay: float = 0.0,
                       max_grad_norm: Optional[float] = 1.0, amp_dtype: Optional[torch.dtype] = None,
                       device=None, progress: bool = True) -> Dict[str, List[float]]:
    """Train the mixers of ``student`` (made from ``teacher`` by :func:`~vitmix.conversion.convert`) to
    reproduce the teacher's attention layers, layer by layer, the teacher frozen.

    Per batch: one teacher forward with hooks capturing each attention layer's input and output;
    each student mixer mixes its teacher layer's input, and the loss is the sum over layers of the
    MSE to the teacher layer's output (each layer sees the teacher's input, so errors do not
    compound). All of each mixer's parameters train — its own (local conv, landmarks, projections)
    and the q/k/v and output projections it took from the teacher: several mixers have no others
    (linear, Performer, Fibottention) or reuse them differently (SOFT's keys are its queries). The
    rest of the student (embeddings, MLPs, norms, head) is not touched. AdamW with a cosine decay of
    ``lr`` to 0 over the run, gradients clipped to ``max_grad_norm``.

    Args:
        student, teacher: the converted model and the model it was converted from; both are moved to
            ``device`` (default: the student's).
        loader: batches of images, or of ``(images, targets)`` (targets unused); cycled as needed.
        steps / epochs: optimizer steps, or passes over ``loader`` (default 1 epoch); not both.
        lr, weight_decay, max_grad_norm: AdamW's learning rate and decay; ``None`` does not clip.
        amp_dtype: ``torch.bfloat16``/``torch.float16`` for mixed precision (``None``: full precision).
        progress: show a tqdm bar with the mean layer MSE.
    Returns:
        ``{layer name: [MSE of each step]}``, in the teacher's layer order.
    """
    pairs = paired_layers(student, teacher)
    total = _total_steps(loader, steps, epochs)
    dev = _device(student, device)
    student.to(dev)
    teacher.to(dev)
    params = [p for _, _, mixer in pairs for p in mixer.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the student's mixers have no trainable parameters (requires_grad is False everywhere)")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    history: Dict[str, List[float]] = {name: [] for name, _, _ in pairs}
    bar = tqdm(total=total, desc="attention transfer", disable=not progress, dynamic_ncols=True, leave=False)
    with _modes(teacher, (m for _, _, m in pairs), mixers_train=True), _captured(pairs) as seen, bar:
        for step, batch in zip(range(total), _batches(loader)):
            losses = _layer_losses(student, teacher, pairs, seen, _images(batch).to(dev), amp_dtype)
            values = losses.detach().tolist()
            bad = next((name for (name, _, _), v in zip(pairs, values) if not math.isfinite(v)), None)
            if bad is not None:
                raise ValueError(f"attention transfer: the MSE of layer {bad} is not finite at step {step + 1}; "
                                 f"lower lr (now {lr}) or max_grad_norm")
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            schedule.step()
            for (name, _, _), v in zip(pairs, values):
                history[name].append(v)
            bar.update()
            bar.set_postfix(mse=f"{sum(values) / len(values):.4g}")
    return history
