"""Train and measure each entry of a comparison: resumable, and a failing entry does not stop the rest.

Layout of a comparison directory ``OUT``::

    OUT/compare.yaml          the base recipe, the mixers and the models (a rerun must match it)
    OUT/<entry>/              the entry's ordinary `vitmix train` run directory
    OUT/<entry>/result.json   what the leaderboard shows for it, written once it is trained and measured
    OUT/leaderboard.{md,csv,json}, accuracy_vs_throughput.png, loss_curves.png

An entry with a ``result.json`` for the same recipe is read back, not retrained; one with a
checkpoint resumes; one that failed (or whose directory is corrupt) is retried and, if it fails
again, becomes a row with its error.
"""
from __future__ import annotations

import json
import shutil
import statistics
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..train.checkpoint import save_text
from ..train.config import TrainConfig
from ..train.runner import RESUME_MAY_CHANGE, load_model, train

RESULT = "result.json"
MANIFEST = "compare.yaml"
# Settings that may differ between a comparison and its rerun (where the runs go, how they run).
_RERUN_MAY_CHANGE = frozenset(RESUME_MAY_CHANGE) | {"mixer", "model", "model_options", "mixer_options"}


@dataclass
class Entry:
    """One row of the comparison: a mixer in the base model, or a whole model (``kind="model"``)."""

    label: str
    kind: str
    config: TrainConfig
    run_dir: Path


def check_names(mixers: Sequence[str], models: Sequence[str]) -> None:
    """Unknown mixer or model names are one ``ValueError`` with close matches, before any training."""
    import timm

    from ..mixers import get_mixer_class
    from ..mixers.base import close_matches
    from ..models import list_models

    for name in mixers:
        get_mixer_class(name)
    for name in models:
        if not timm.is_model(name.split(".")[0]):
            raise ValueError(f"unknown model {name!r} in --models." + close_matches(name, list_models(), n=5)
                             + " See `vitmix models`.")
    labels = list(mixers) + list(models)
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} given twice in --mixers/--models")
    if not labels:
        raise ValueError("nothing to compare: give --mixers and/or --models")


def plan_entries(base: TrainConfig, mixers: Sequence[str], models: Sequence[str], out) -> List[Entry]:
    """The entries of a comparison: each mixer in ``base.model``, then each whole model with the same
    width/depth options (``num_heads`` is dropped: attention-free models have no heads)."""
    check_names(mixers, models)
    out = Path(out)
    values = base.to_dict()
    entries = [Entry(m, "mixer", TrainConfig.from_dict({**values, "mixer": m, "out": str(out / m)}), out / m)
               for m in mixers]
    for model in models:
        options = {k: v for k, v in base.model_options.items() if k != "num_heads"}
        cfg = TrainConfig.from_dict({**values, "model": model, "mixer": None, "mixer_options": {},
                                     "model_options": options, "out": str(out / model)})
        entries.append(Entry(model, "model", cfg, out / model))
    return entries


def check_manifest(out: Path, base: TrainConfig) -> None:
    """A rerun into ``out`` must use the same recipe; otherwise the rows would not be comparable."""
    from ..train.config import load_yaml

    path = out / MANIFEST
    if not path.is_file():
        return
    try:
        saved = load_yaml(path).get("recipe", {})
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{path} is unreadable ({err}); delete it to start the comparison over") from None
    now = base.to_dict()
    changed = sorted(k for k in now if k not in _RERUN_MAY_CHANGE and k in saved and saved[k] != now[k])
    if changed:
        diffs = ", ".join(f"{k}: {saved[k]!r} -> {now[k]!r}" for k in changed)
        raise ValueError(f"{out} holds a comparison with another recipe ({diffs}); rerun with the same settings "
                         "or choose another --out")


def check_data(base: TrainConfig) -> None:
    """A missing dataset fails every entry the same way: say so once, before any training."""
    from ..data import build_datasets
    from ..train.runner import default_img_size

    build_datasets(base.data, base.img_size or default_img_size(base.model), base.data_dir, base.download,
                   augment=False)


def write_manifest(out: Path, base: TrainConfig, mixers, models) -> None:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    recipe = {k: v for k, v in base.to_dict().items() if k not in ("out", "resume", "mixer")}
    save_text(out / MANIFEST, yaml.safe_dump({"recipe": recipe, "mixers": list(mixers), "models": list(models)},
                                             sort_keys=False))


def read_result(entry: Entry, epochs: int, corrupt: Optional[dict]) -> Optional[dict]:
    """The entry's saved row if it is complete for this request (``None`` means: do the work)."""
    path = entry.run_dir / RESULT
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if row.get("status") != "ok" or row.get("epochs") != epochs:
        return None
    if corrupt is not None and row.get("corruption_settings") != _settings(corrupt):
        return None                        # not measured, or measured with other corruptions/severities
    return row


def _settings(corrupt: dict) -> dict:
    """The corruption request as stored in ``result.json`` (JSON types, so it compares after a reload)."""
    return json.loads(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in corrupt.items()}))


def _clear_unstarted(run_dir: Path) -> None:
    """A run that died before its first checkpoint holds nothing to keep: clear it so it can restart."""
    if run_dir.is_dir() and not (run_dir / "state.pt").exists() and not any(run_dir.glob("*.safetensors")):
        shutil.rmtree(run_dir)


def train_entry(entry: Entry, log, on_epoch) -> dict:
    """Train (or resume, or read back) the entry's run; returns its ``summary.json``."""
    summary_path = entry.run_dir / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        if summary.get("epochs_run") == entry.config.epochs:
            return summary
    _clear_unstarted(entry.run_dir)
    entry.config.resume = (entry.run_dir / "state.pt").is_file()
    return train(entry.config, log=log, on_epoch=on_epoch)


def measure_model(model: nn.Module, img_size: int, in_chans: int, batch_size: int, device="cpu") -> dict:
    """Cost of a model at its input size, all measured the same way for every entry: parameters,
    forward FLOPs per image, batch-1 inference latency, training throughput (images/s of one
    forward + backward at ``batch_size``, timed with :func:`vitmix.bench.time_call`) and that step's
    peak memory."""
    from ..bench.flops import count_flops
    from ..bench.memory import peak_memory
    from ..bench.timing import time_call

    device = torch.device(device)
    model = model.to(device).eval()
    one = torch.randn(1, in_chans, img_size, img_size, device=device)
    with torch.inference_mode():
        flops = count_flops(lambda: model(one)).total
        latency = time_call(lambda: model(one), device=device, min_run_time=0.3, min_samples=5)
    batch = torch.randn(batch_size, in_chans, img_size, img_size, device=device)
    model.train()

    def step():
        model(batch).float().sum().backward()

    memory = peak_memory(step, device, track=[model, batch])
    step_time = time_call(step, device=device, min_run_time=0.5, min_samples=3)
    model.zero_grad(set_to_none=True)
    peak_mb = memory.peak_bytes / 2**20 if memory.peak_bytes is not None else None
    return {"params": sum(p.numel() for p in model.parameters()), "gflops": flops / 1e9,
            "latency_ms": latency.median_s * 1e3, "train_images_per_s": batch_size / step_time.median_s,
            "peak_train_mb": peak_mb, "memory_method": memory.method}


def _history(run_dir: Path) -> List[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def remeasure_entry(entry: Entry, row: dict) -> dict:
    """Measure a finished entry's costs again (e.g. on a quiet machine); accuracy columns are kept."""
    from ..train.checkpoint import load_weights

    checkpoint = entry.run_dir / "last.safetensors"
    _, meta = load_weights(checkpoint)
    model = load_model(checkpoint, device=entry.config.device)
    row = dict(row, **measure_model(model, int(meta["img_size"]), int(meta["in_chans"]), entry.config.batch_size,
                                    next(model.parameters()).device))
    save_text(entry.run_dir / RESULT, json.dumps(row, indent=2))
    return row


def finish_entry(entry: Entry, summary: dict, corrupt: Optional[dict]) -> dict:
    """Measure the trained entry (and its corruption accuracy when asked) and write its ``result.json``."""
    from ..train.checkpoint import load_weights

    checkpoint = entry.run_dir / "last.safetensors"
    _, meta = load_weights(checkpoint)
    model = load_model(checkpoint, device=entry.config.device)
    device = next(model.parameters()).device
    img_size, in_chans = int(meta["img_size"]), int(meta["in_chans"])
    history = _history(entry.run_dir)
    row = {"entry": entry.label, "kind": entry.kind, "status": "ok", "epochs": summary["epochs_run"],
           "top1": summary["final_val_acc"], "best_top1": summary["best_val_acc"],
           "logged_train_images_per_s": statistics.median(h["images_per_s"] for h in history),
           "train_seconds": summary["train_seconds"], "run_dir": str(entry.run_dir),
           "curves": {k: [h.get(k) for h in history] for k in ("train_loss", "val_loss", "val_acc")}}
    row.update(measure_model(model, img_size, in_chans, entry.config.batch_size, device))
    if corrupt is not None:
        row.update(_corruption_columns(model, entry, img_size, corrupt))
    save_text(entry.run_dir / RESULT, json.dumps(row, indent=2))
    return row


def _corruption_columns(model, entry: Entry, img_size: int, corrupt: dict) -> dict:
    from ..data import build_datasets
    from ..train.robustness import evaluate_corruptions, write_corruption_report

    cfg, options = entry.config, dict(corrupt)
    _, val_set, _ = build_datasets(cfg.data, img_size, cfg.data_dir, augment=False)
    images = options.pop("images", None)
    if images is not None and images < len(val_set):   # a fixed seeded subset: every entry sees the same images
        order = torch.randperm(len(val_set), generator=torch.Generator().manual_seed(options.get("seed", 0)))
        val_set = torch.utils.data.Subset(val_set, sorted(order[:images].tolist()))
    result = evaluate_corruptions(model, val_set, device=next(model.parameters()).device, progress=False, **options)
    write_corruption_report(result, entry.run_dir)
    return {"corruption_acc": result["mean"], "corruption_clean_acc": result["clean"],
            "corruption_settings": _settings(corrupt), "corruptions": result["per_corruption"]}


def failed_row(entry: Entry, err: BaseException) -> dict:
    """A table row for an entry that could not be trained or measured (the error, not a crash)."""
    last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    message = " ".join(str(err).split()) or type(err).__name__
    return {"entry": entry.label, "kind": entry.kind, "status": "failed",
            "error": f"{type(err).__name__}: {message[:300]}{where}", "run_dir": str(entry.run_dir)}


def run_compare(base: TrainConfig, mixers: Sequence[str] = (), models: Sequence[str] = (), out="runs/compare",
                corruptions: Optional[dict] = None, log: Callable[..., None] = print,
                remeasure: bool = False) -> List[dict]:
    """Train and measure every entry, then write the leaderboard and plots into ``out``.

    Args:
        base: the one recipe (model, data, epochs, seed, ...) every entry shares.
        mixers: mixers to put in ``base.model``; ``models``: whole models trained with the same recipe.
        corruptions: keyword arguments for :func:`vitmix.train.robustness.evaluate_corruptions`
            (``corruptions``, ``severities``, ``seed``) to add a corruption-accuracy column; ``None``: no column.
        remeasure: measure the cost columns of finished entries again (accuracy columns are kept).
    Returns the leaderboard rows, best first (failed entries last, with their error).
    """
    from .leaderboard import write_leaderboard

    out = Path(out)
    entries = plan_entries(base, mixers, models, out)
    check_manifest(out, base)
    check_data(base)
    write_manifest(out, base, mixers, models)
    rows = []
    bar = tqdm(total=len(entries) * base.epochs, desc="compare", unit="epoch", dynamic_ncols=True)
    try:
        for entry in entries:
            rows.append(_run_entry(entry, base.epochs, corruptions, bar, remeasure))
    finally:
        bar.close()
    paths = write_leaderboard(rows, out, base)
    log(f"leaderboard: {', '.join(str(p) for p in paths)}")
    return sorted(rows, key=_rank_key)


def _run_entry(entry: Entry, epochs: int, corruptions: Optional[dict], bar, remeasure: bool = False) -> dict:
    bar.set_postfix_str(entry.label)
    row = read_result(entry, epochs, corruptions)
    done = bar.n
    if row is not None and remeasure:
        row = remeasure_entry(entry, row)
    elif row is None:
        try:
            summary = train_entry(entry, log=_quiet, on_epoch=lambda _m: bar.update())
            row = finish_entry(entry, summary, corruptions)
            bar.write(f"{entry.label}: top-1 {row['top1']:.2f}% after {row['epochs']} epochs ({entry.run_dir})")
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001  (any failure becomes a row, the others still run)
            row = failed_row(entry, err)
            bar.write(f"{entry.label}: failed: {row['error']}")
    bar.update(done + epochs - bar.n)
    return row


def _quiet(*_args, **_kwargs) -> None:
    """Each run's own epoch lines would interleave with the comparison's bar; its files keep them."""


def _rank_key(row: dict):
    return (row["status"] != "ok", -(row.get("top1") or 0.0))
