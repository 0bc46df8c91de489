"""One epoch's checkpoint set and ``--resume`` from it, for every task.

A set is the task's user-facing files (weights, ``metrics.jsonl``, ...) and ``state.pt``, written
last: it records their digests and holds everything a resume needs (model, optimizer, EMA, grad
scaler, step, history, random streams), so it is the manifest that decides which set is complete.
"""
from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from .._util import plural

from .checkpoints import (
    atomic_write, file_digest, load_into, load_state, load_weights, save_state, save_text, unwrap,
)
from .directory import remove_stray_temporaries


def rng_state(loader=None) -> dict:
    """Every random stream a resumed run must continue: torch (CPU, CUDA), Python, NumPy (timm's
    mixup) and, given one, the train loader's generator. NumPy's array is stored as a tensor so that
    ``torch.load(weights_only=True)`` reads it back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)}
    if loader is not None:
        state["loader"] = loader.generator.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state, loader=None) -> None:
    """Restore what :func:`rng_state` captured (a bare tensor: the torch state of older runs)."""
    if isinstance(state, torch.Tensor):
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if loader is not None and "loader" in state:
        loader.generator.set_state(state["loader"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Trainable:
    """What a checkpoint set saves and a resume restores besides the files: the model, its optimizer,
    the EMA and grad scaler when the run keeps one, and the train loader whose generator continues."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    ema: Optional[Any] = None
    scaler: Optional[Any] = None
    loader: Optional[Any] = None


@dataclass
class Resumed:
    """Where a resumed run continues: its finished epochs, optimizer steps, history, and the whole
    ``state.pt`` (task entries such as ``best_acc``); all empty for a run that finished no epoch."""

    epoch: int = 0
    step: int = 0
    history: List[dict] = field(default_factory=list)
    state: Dict[str, Any] = field(default_factory=dict)


def save_metrics(run_dir: Path, history: Sequence[dict]) -> None:
    """``metrics.jsonl``: one JSON line per epoch."""
    save_text(run_dir / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))


def save_manifest(run_dir: Path, parts: Trainable, epoch: int, step: int, history: list, files: Sequence[str],
                  **extra) -> None:
    """Write ``state.pt``, the last file of a checkpoint set: the digests of those of ``files`` that
    exist, everything :func:`resume_run` restores, and the task's ``extra`` entries."""
    own = {}
    if parts.ema is not None:
        own["ema"] = {k: v.detach().cpu() for k, v in parts.ema.module.state_dict().items()}
    if parts.scaler is not None:
        own["scaler"] = parts.scaler.state_dict()
    save_state(run_dir / "state.pt", {
        **own, "model": {k: v.detach().cpu() for k, v in unwrap(parts.model).state_dict().items()},
        "optimizer": parts.optimizer.state_dict(), "epoch": epoch, "step": step, **extra, "history": history,
        "rng": rng_state(parts.loader),
        "files": {name: file_digest(run_dir / name) for name in files if (run_dir / name).is_file()},
    })


def resume_run(run_dir: Path, parts: Trainable, log, rewrite: Callable[[List[dict]], None],
           is_main: bool = True) -> Resumed:
    """Load the last complete checkpoint set of ``run_dir`` into ``parts``. Files newer than its
    manifest (a run killed while writing the next set) are ignored with one warning line;
    ``metrics.jsonl`` is rewritten from it and ``rewrite(history)`` rewrites the task's weights."""
    removed = remove_stray_temporaries(run_dir) if is_main else 0
    if removed:
        log(f"warning: removed {removed} temporary file(s) an interrupted write left in {run_dir}")
    if not (run_dir / "state.pt").is_file():              # killed before its first checkpoint
        log(f"warning: {run_dir} has no complete checkpoint yet; starting the run from the beginning")
        return Resumed()
    state = load_state(run_dir / "state.pt")
    _restore(run_dir, parts, state)
    epoch, step = int(state["epoch"]), int(state["step"])
    history = state.get("history")
    if history is None:                                   # runs written before the manifest held it
        history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    history = list(history[:epoch])
    stale = _stale_files(run_dir, state.get("files", {}), is_main)
    if stale and is_main:
        log(f"warning: ignoring the partial checkpoint set of an interrupted epoch ({', '.join(stale)}); "
            f"resuming from the complete set of epoch {epoch} in {run_dir}/state.pt")
        save_metrics(run_dir, history)
        rewrite(history)
        _restore_files(run_dir, state["files"], stale, epoch, log)
    return Resumed(epoch, step, history, state)


def _restore_files(run_dir: Path, files: Dict[str, str], stale: Sequence[str], epoch: int, log) -> None:
    """Give back the complete set's own copy of each file in ``stale`` that ``rewrite`` did not: from
    a file of the set with the same recorded digest (``best`` is a copy of ``last`` or of a ``top/``
    file of the epoch that set it). A file whose contents no file of the set holds is removed, so that
    no reader takes a truncated or foreign file for the set's."""
    def intact(name: str) -> bool:
        return (run_dir / name).is_file() and file_digest(run_dir / name) == files[name]

    for name in stale:
        if name not in files or intact(name):            # a top/ file of the unfinished epoch; rewritten
            continue
        twin = next((other for other, digest in files.items()
                     if other != name and digest == files[name] and intact(other)), None)
        if twin is not None:
            atomic_write(run_dir / name, lambda tmp, source=run_dir / twin: shutil.copyfile(source, tmp),
                         (run_dir / twin).stat().st_size)
            log(f"warning: restored {name} of epoch {epoch}'s set from {twin}")
            continue
        (run_dir / name).unlink(missing_ok=True)
        log(f"warning: {run_dir / name} was not the one of epoch {epoch}'s set and no other file holds its "
            "contents: removed it (the run's other checkpoints stand in for it, e.g. last.safetensors for "
            "best; the next epoch that writes it puts it back)")


def _restore(run_dir: Path, parts: Trainable, state: dict) -> None:
    """Model, optimizer, EMA, grad scaler and random streams from ``state``."""
    weights = state.get("model")
    if weights is None:                                   # runs written before the manifest existed
        weights, _ = load_weights(run_dir / "last.safetensors")
    load_into(parts.model, weights, f"{run_dir}/state.pt")
    parts.optimizer.load_state_dict(state["optimizer"])
    if parts.ema is not None:
        if "ema" not in state:
            raise ValueError(f"--resume: {run_dir} was trained without --ema-decay; it cannot resume with it")
        parts.ema.module.load_state_dict(state["ema"])
    if parts.scaler is not None and "scaler" in state:
        parts.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"], parts.loader)


def _stale_files(run_dir: Path, files: Dict[str, str], is_main: bool) -> List[str]:
    """The files of the set that differ from the manifest's digests, and ``top/`` weights of an epoch
    that never completed (deleted)."""
    stale = [n for n, digest in files.items() if not (run_dir / n).is_file() or file_digest(run_dir / n) != digest]
    for path in (run_dir / "top").glob("epoch-*.safetensors") if is_main else ():
        if f"top/{path.name}" not in files:
            path.unlink()
            stale.append(f"top/{path.name}")
    return stale


def seeded_subset(available: int, size: Optional[int], seed: int, flag: str = "--train-subset"
                  ) -> Optional[torch.Tensor]:
    """The indices of a fixed random subset of ``size`` of ``available`` training images (``None``:
    all): the first ``size`` of one seeded permutation, so smaller subsets of a seed are nested in
    larger ones. A size out of range is a one-line ``ValueError`` naming ``flag``."""
    if size is None:
        return None
    check_subset(size, available, flag)
    return torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:size]


def check_subset(size: Optional[int], available: int, flag: str = "--train-subset") -> None:
    """``size`` must be between 1 and ``available`` (or ``None``)."""
    if size is not None and not 0 < size <= available:
        raise ValueError(f"{flag} {size} must be between 1 and the {available} training images")


def resuming_line(run_dir: Path, epoch: int, step: int) -> str:
    """What a resume says before it trains: where it continues (epoch N = the first one to run)."""
    return (f"resuming {run_dir} at epoch {epoch + 1}, after {plural(epoch, 'finished epoch')} and "
            f"{plural(step, 'step')}")
