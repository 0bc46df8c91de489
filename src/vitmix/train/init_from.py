"""``vitmix train --init-from RUN_OR_FILE --mixer NAME``: a run that starts from a trained model.

The teacher is a vitmix run directory or checkpoint file, a timm model's weights file
(``--model deit_tiny_patch16_224 --init-from deit.safetensors``: read with timm's checkpoint filter,
which fits the head, channels and position embeddings to the data), or a model shared the timm
way (``hf-hub:ORG/NAME``, ``local-dir:DIR``: its config names the architecture). It is only ever
read, and converted to ``--mixer``
with :func:`vitmix.convert`; ``--transfer-epochs K`` first trains the new mixers to reproduce the
teacher's attention (:func:`vitmix.conversion.transfer_attention`), and ``--distill`` adds the frozen
teacher's logits to the fine-tuning loss (:class:`LogitDistillation`). What a resume needs is in
the run directory: ``config.yaml`` names the teacher, ``init.json`` records its digest and the
transfer stage, ``transfer.safetensors`` holds the weights the transfer ended with. See
``docs/convert.md``.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..runs import (
    build_classifier, file_digest, flag_of, load_into, load_weights, read_checkpoint, resolve_checkpoint,
    save_text, save_weights,
)
from ..models import is_vitmix_model
from .config import TrainConfig

#: the run's record of its teacher and transfer stage, and the weights the transfer stage ended with
INIT_FILE = "init.json"
TRANSFER_WEIGHTS = "transfer.safetensors"
#: validation batches the layer MSE is measured on before and after the transfer stage
MSE_BATCHES = 4
#: what a teacher's metadata fixes: the student keeps the teacher's architecture
_ARCHITECTURE = ("model", "model_options", "img_size", "num_frames")
#: the metadata a vitmix checkpoint rebuilds its model from (a file without it is built from the flags)
_REBUILD_KEYS = ("model", "num_classes", "in_chans", "img_size")
#: teachers named the timm way: a Hugging Face Hub repository or a folder saved with save_pretrained
TIMM_SOURCES = ("hf-hub:", "local-dir:")
#: a timm config's model args that are the data's or the teacher's mixer, not the architecture's
_NOT_ARCHITECTURE = ("num_classes", "in_chans", "img_size", "mixer", "mixer_options", "pretrained_model_args")


@dataclass
class TeacherSource:
    """The teacher a run starts from: where it was asked for, the file read, its vitmix metadata
    (empty for a bare ``.pt``/``.pth`` state dict or a file vitmix did not write), weights and digest."""

    given: Path
    checkpoint: Path
    meta: dict
    state: Dict[str, torch.Tensor] = field(repr=False)
    sha256: str
    #: a ``hf-hub:``/``local-dir:`` teacher: the id timm builds it from, and its architecture and model args
    timm_id: Optional[str] = None
    timm_model: Optional[Tuple[str, dict]] = None

    @property
    def where(self) -> str:
        return self.timm_id or str(self.given)


def find_teacher(init_from: str) -> TeacherSource:
    """Read the teacher of ``--init-from``: a run directory (its best, else last, checkpoint) or a
    checkpoint file, or a ``hf-hub:``/``local-dir:`` model; a missing path, a run without checkpoints or an
    unreadable file is a one-line error."""
    if init_from.startswith(TIMM_SOURCES):
        return _timm_teacher(init_from)
    given = Path(init_from).expanduser().absolute()
    if not given.exists():
        raise FileNotFoundError(f"--init-from {init_from}: no run directory or checkpoint file at {given}")
    try:
        path = resolve_checkpoint(given)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--init-from: {err}") from None
    if path.suffix not in (".safetensors", ".pt", ".pth"):
        raise ValueError(f"--init-from {path}: not a .safetensors, .pt or .pth checkpoint")
    state, meta = read_checkpoint(path)
    if meta.get("task") in ("segmentation", "detection"):   # its `data` is a dense dataset: say what it is
        raise ValueError(f"--init-from {path} is a `vitmix dense` {meta['task']} run; --init-from takes a "
                         "classifier (a `vitmix train` run or a timm checkpoint)")
    if not all(key in meta for key in _REBUILD_KEYS):
        meta = {}
    return TeacherSource(given, path, meta, state, file_digest(path))


def _timm_teacher(init_from: str) -> TeacherSource:
    """A teacher shared the timm way: its config (architecture, model args) read with timm's own helpers,
    its weights file found (from the Hub's cache, or downloaded, for ``hf-hub:``) for the run's record."""
    from timm.models._hub import load_model_config_from_hf, load_model_config_from_path

    source, _, rest = init_from.partition(":")
    if source == "local-dir":
        folder = Path(rest).expanduser().absolute()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"--init-from {init_from}: no config.json in {folder} (a folder written by "
                                    "vitmix.save_pretrained or timm's save_for_hf)")
        _, model_name, model_args = load_model_config_from_path(folder)
        names = [folder / n for n in _WEIGHT_FILES]
        weights = next((p for p in names if p.is_file()), None)
        timm_id = f"local-dir:{folder}"
    else:
        from huggingface_hub import hf_hub_download

        _, model_name, model_args = load_model_config_from_hf(rest)
        weights = _hub_weights(rest, hf_hub_download)
        timm_id = init_from
    if weights is None:
        raise FileNotFoundError(f"--init-from {init_from}: no {' or '.join(_WEIGHT_FILES)} next to its config.json")
    return TeacherSource(Path(weights), Path(weights), {}, {}, file_digest(Path(weights)), timm_id,
                         (model_name, dict(model_args or {})))


#: the weights file of a timm-shared model, in the order timm prefers them
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _hub_weights(repo: str, download) -> Optional[str]:
    for name in _WEIGHT_FILES:
        try:
            return download(repo, name)
        except Exception:  # noqa: BLE001 - the Hub client's not-found errors differ between versions
            continue
    return None


def _timm_config(cfg: TrainConfig, source: TeacherSource) -> TrainConfig:
    """``cfg`` for a ``hf-hub:``/``local-dir:`` teacher: its architecture and model args (a flag asking for
    another is a one-line error); the data, image size and classes are the run's."""
    model, args = source.timm_model
    options = {k: v for k, v in args.items() if k not in _NOT_ARCHITECTURE}
    default = TrainConfig()
    for name, theirs in (("model", model), ("model_options", options)):
        mine = getattr(cfg, name)
        if mine not in (theirs, getattr(default, name)):
            raise ValueError(f"{flag_of(name)} {mine!r} differs from the teacher's {theirs!r} ({source.timm_id}): "
                             "the student keeps the teacher's architecture; drop the flag")
    return dataclasses.replace(cfg, init_from=source.timm_id, model=model, model_options=options)


def teacher_config(cfg: TrainConfig, source: TeacherSource) -> TrainConfig:
    """``cfg`` for a run from ``source``: the teacher's architecture (model, options, image size) from
    its metadata — a flag asking for another is a one-line error — and, unless ``--data`` is given,
    its data. A file without metadata is built from the flags (``--model``, ``--model-option``...)."""
    if not cfg.mixer:
        raise ValueError("--init-from needs --mixer NAME: the mixer the teacher's attention is converted to "
                         "(see `vitmix mixers`)")
    if source.timm_id:
        return _timm_config(cfg, source)
    cfg = dataclasses.replace(cfg, init_from=str(source.given))
    meta = source.meta
    if not meta:
        return cfg
    default, values = TrainConfig(), {}
    for name in _ARCHITECTURE:
        theirs = meta.get(name) if name != "model_options" else meta.get(name) or {}
        mine = getattr(cfg, name)
        if name in ("img_size", "num_frames") and theirs is not None:
            theirs = int(theirs)
        if mine not in (theirs, getattr(default, name)):
            raise ValueError(f"{flag_of(name)} {mine!r} differs from the teacher's {theirs!r} ({source.checkpoint}): "
                             "the student keeps the teacher's architecture; drop the flag")
        values[name] = theirs
    if cfg.data == default.data and meta.get("data"):          # --data not given: the teacher's data
        values["data"] = meta["data"]
        if cfg.data_dir is None:
            values["data_dir"] = meta.get("data_dir")
    return dataclasses.replace(cfg, **values)


def check_world(cfg: TrainConfig, world_size: int) -> None:
    """The transfer stage trains on one process (its mixers' gradients are not averaged over ranks)."""
    if cfg.transfer_epochs and world_size > 1:
        raise ValueError(f"--transfer-epochs runs on one process, not {world_size} (the mixers' gradients are not "
                         "averaged over ranks): train with one process, or with --transfer-epochs 0")


def check_unchanged(run_dir: Path, source: TeacherSource) -> None:
    """A resumed run needs the teacher it started from: a checkpoint rewritten since is a one-line error."""
    record = read_record(run_dir)
    if record is not None and record["teacher"]["sha256"] != source.sha256:
        raise ValueError(f"--resume: the teacher {source.checkpoint} changed since {run_dir} started from it "
                         f"(sha256 {record['teacher']['sha256'][:12]}..., now {source.sha256[:12]}...); resume needs "
                         "the same teacher: restore it or start a new --out")


def load_teacher(source: TeacherSource, cfg: TrainConfig, data_info, img_size: int, device) -> nn.Module:
    """The teacher model, frozen (eval mode, no gradients) on ``device``. Its classes and channels must
    be the data's: the student keeps the teacher's head."""
    meta = source.meta
    timm_teacher = source.timm_id or (not meta and not is_vitmix_model(cfg.model))
    if timm_teacher:
        return _load_timm_teacher(source, cfg, data_info, img_size).to(device).eval().requires_grad_(False)
    if meta:
        if (meta["num_classes"], meta["in_chans"]) != (data_info.num_classes, data_info.in_chans):
            raise ValueError(f"--init-from {source.checkpoint} was trained for {meta['num_classes']} classes / "
                             f"{meta['in_chans']} channels, but --data {cfg.data} has {data_info.num_classes} / "
                             f"{data_info.in_chans}; the student keeps the teacher's head")
        teacher = build_classifier(meta["model"], meta["num_classes"], meta["in_chans"], int(meta["img_size"]),
                                   meta.get("num_frames"), mixer=meta.get("mixer"),
                                   mixer_options=meta.get("mixer_options"), model_options=meta.get("model_options"),
                                   data=meta.get("data"))
        where = str(source.checkpoint)
    else:
        teacher = build_classifier(cfg.model, data_info.num_classes, data_info.in_chans, img_size,
                                   data_info.num_frames, model_options=cfg.model_options, data=cfg.data)
        where = (f"--init-from {source.checkpoint} (no vitmix metadata, so the teacher is built from --model "
                 f"{cfg.model}, --model-option and --img-size {img_size})")
    load_into(teacher, source.state, where)
    return teacher.to(device).eval().requires_grad_(False)


def _load_timm_teacher(source: TeacherSource, cfg: TrainConfig, data_info, img_size: int) -> nn.Module:
    """A timm teacher through timm's pretrained path, built for the run's data: timm's checkpoint filter
    gives it a new head for other classes, sums its patch embedding for other channels and resamples its
    position embeddings for another image size (the student, built for the data, then takes its weights)."""
    import timm

    from ..conversion import load_timm_checkpoint
    from ..models.vit import bind_token_grid

    data = dict(num_classes=data_info.num_classes, in_chans=data_info.in_chans, img_size=img_size)
    if source.timm_id:
        try:
            teacher = timm.create_model(source.timm_id, pretrained=True, **data)
        except RuntimeError as err:
            raise ValueError(f"--init-from {source.timm_id}: its weights do not fit its config ({err})"
                             .splitlines()[0]) from None
    else:
        teacher = load_timm_checkpoint(cfg.model, source.checkpoint, **dict(cfg.model_options, **data))
    return bind_token_grid(teacher)


def load_converted(student: nn.Module, teacher: nn.Module, cfg: TrainConfig) -> None:
    """Give ``student`` (built for ``cfg.mixer``) the weights of the teacher converted to that mixer."""
    from ..conversion import convert

    converted = convert(teacher, cfg.mixer, **cfg.mixer_options)
    load_into(student, converted.state_dict(), f"the {cfg.mixer} conversion of the teacher")


def read_record(run_dir: Path) -> Optional[dict]:
    path = Path(run_dir) / INIT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _save_record(run_dir: Path, record: dict) -> None:
    save_text(Path(run_dir) / INIT_FILE, json.dumps(record, indent=2) + "\n")


def _new_record(source: TeacherSource, cfg: TrainConfig) -> dict:
    teacher = {"source": source.where, "checkpoint": str(source.checkpoint), "sha256": source.sha256,
               "model": source.meta.get("model", cfg.model), "mixer": source.meta.get("mixer")}
    return {"teacher": teacher, "mixer": cfg.mixer, "mixer_options": cfg.mixer_options,
            "transfer": {"epochs": cfg.transfer_epochs, "done": cfg.transfer_epochs == 0}, "distill": _distill(cfg)}


def _distill(cfg: TrainConfig) -> Optional[dict]:
    return {"weight": cfg.distill_weight, "temperature": cfg.distill_temperature} if cfg.distill else None


class _Passes:
    """The train loader for the transfer stage: its sampler moves to the next epoch at each pass, so
    transfer epoch e sees the batches of fine-tuning epoch e."""

    def __init__(self, loader, sampler) -> None:
        self.loader, self.sampler, self.passes = loader, sampler, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        self.sampler.set_epoch(self.passes)
        self.passes += 1
        return iter(self.loader)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def transfer_stage(run_dir: Path, source: TeacherSource, cfg: TrainConfig, student: nn.Module, teacher: nn.Module,
                   loaders, *, resumed: bool, meta: dict, progress: bool, log) -> dict:
    """The run's start from its teacher: write (or, resuming, read) ``init.json``; unless epochs were
    already resumed, run the ``--transfer-epochs`` stage on the train loader — or load the weights a
    finished one left in ``transfer.safetensors``. Returns the record (also in ``summary.json``)."""
    record = read_record(run_dir) or _new_record(source, cfg)
    _save_record(run_dir, record)
    stage = record["transfer"]
    if resumed or not cfg.transfer_epochs:
        return record
    if stage["done"] and (run_dir / TRANSFER_WEIGHTS).is_file():
        state, _ = load_weights(run_dir / TRANSFER_WEIGHTS)
        load_into(student, state, str(run_dir / TRANSFER_WEIGHTS))
        log(f"attention transfer: finished before the interruption; its weights from {run_dir / TRANSFER_WEIGHTS}")
        return record
    record["transfer"] = _transfer(cfg, student, teacher, loaders, progress, log)
    save_weights(student, run_dir / TRANSFER_WEIGHTS, dict(meta, stage="transfer"))
    _save_record(run_dir, record)                 # after the weights: "done" means they are on disk
    return record


def _transfer(cfg: TrainConfig, student, teacher, loaders, progress: bool, log) -> dict:
    """``--transfer-epochs`` of attention transfer, and the layer MSE on validation batches before and after."""
    from ..conversion import layer_mse, transfer_attention
    from .engine import AMP_DTYPES

    train_loader, val_loader, sampler = loaders
    before = layer_mse(student, teacher, val_loader, batches=MSE_BATCHES)
    log(f"attention transfer: {cfg.transfer_epochs} epoch(s) of {len(train_loader)} steps, lr {cfg.transfer_lr:g}; "
        f"layer MSE {_mean(before.values()):.4g} at the start")
    # bf16 only: fp16 would need a grad scaler the transfer stage does not keep
    amp_dtype = AMP_DTYPES["bfloat16"] if cfg.amp and cfg.amp_dtype == "bfloat16" else None
    start = time.perf_counter()
    steps = transfer_attention(student, teacher, _Passes(train_loader, sampler), epochs=cfg.transfer_epochs,
                               lr=cfg.transfer_lr, max_grad_norm=cfg.clip_grad, amp_dtype=amp_dtype,
                               progress=progress)
    seconds = time.perf_counter() - start
    after = layer_mse(student, teacher, val_loader, batches=MSE_BATCHES)
    per_epoch = len(train_loader)
    rows = [{"stage": "transfer", "epoch": e + 1,
             "train_layer_mse": _mean(v for layer in steps.values() for v in layer[e * per_epoch:(e + 1) * per_epoch])}
            for e in range(cfg.transfer_epochs)]
    log(f"attention transfer: layer MSE {_mean(before.values()):.4g} -> {_mean(after.values()):.4g} in {seconds:.1f}s")
    return {"epochs": cfg.transfer_epochs, "done": True, "lr": cfg.transfer_lr, "seconds": seconds,
            "history": rows, "val_layer_mse_before": before, "val_layer_mse_after": after}


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton's soft-target loss: ``T² · KL(softmax(teacher/T) || softmax(student/T))``, averaged over
    the batch (the T² keeps its gradients on the task loss's scale whatever T)."""
    t = temperature
    return F.kl_div(F.log_softmax(student_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                    reduction="batchmean", log_target=True) * (t * t)


class LogitDistillation:
    """``--distill``: the fine-tuning loss ``(1 - w) · task loss + w · distill_loss(student, teacher, T)``,
    the frozen teacher's logits computed under ``no_grad`` on the same (mixed, if mixup is on) images."""

    def __init__(self, teacher: nn.Module, weight: float, temperature: float) -> None:
        self.teacher, self.weight, self.temperature = teacher, weight, temperature

    def __call__(self, task_loss: torch.Tensor, logits: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = self.teacher(images).float()
        soft = distill_loss(logits.float(), teacher_logits, self.temperature)
        return (1 - self.weight) * task_loss + self.weight * soft
