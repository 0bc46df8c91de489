"""Corruption robustness: a classifier's top-1 accuracy under the ImageNet-C corruptions of
:mod:`vitmix.data.corruptions` (Hendrycks & Dietterich, ICLR 2019), and the report files.

**Definitions.** ``clean`` is the top-1 accuracy (%) on the unmodified test images. ``per_corruption[c][s]``
is the accuracy on the same images under corruption ``c`` at severity ``s``. ``mean`` is the mean
corruption accuracy: the unweighted mean of ``per_corruption`` over every corruption and severity
evaluated. ``drop = clean - mean`` (accuracy points) and ``relative_drop = 100 · drop / clean``.
ImageNet-C's mCE divides each corruption's error by a baseline model's (AlexNet there); with no
baseline shared by every dataset here, vitmix reports the mean corruption accuracy (its error is
``100 - mean``, the unnormalised mean corruption error), and ``vitmix compare`` sets models side by
side.

>>> from vitmix.train.robustness import evaluate_corruptions, write_corruption_report   # doctest: +SKIP
>>> result = evaluate_corruptions(model, val_set, corruptions="gaussian_noise,contrast", severities=(1, 3, 5))
>>> write_corruption_report(result, "runs/my-run")      # corruptions.md/.csv/.json/.png
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import Compose, Normalize
from torchvision.transforms import functional as TF
from tqdm.auto import tqdm

from .._util import autocast, markdown_table, write_csv
from ..data.corruptions import SEVERITIES, corrupt, get_corruption, parse_corruptions, parse_severities
from .checkpoint import save_text

REPORT_FILES = ("corruptions.md", "corruptions.csv", "corruptions.json", "corruptions.png")
Stats = Tuple[Tuple[float, ...], Tuple[float, ...]]


def without_normalization(dataset: Dataset) -> Tuple[Dataset, Optional[Stats]]:
    """A shallow copy of ``dataset`` whose ``transform`` (a torchvision ``Compose``, as vitmix's
    datasets have) lacks its ``Normalize`` step, and that step's ``(mean, std)``; the dataset itself
    and ``None`` when it has no such step (its images are then taken to be in [0, 1] already).
    A ``Subset`` keeps its indices over the stripped dataset."""
    if isinstance(dataset, Subset):
        inner, stats = without_normalization(dataset.dataset)
        return Subset(inner, dataset.indices), stats
    steps = getattr(getattr(dataset, "transform", None), "transforms", None)
    norms = [t for t in steps or () if isinstance(t, Normalize)]
    if not norms:
        return dataset, None
    if len(norms) > 1:
        raise ValueError(f"the dataset's transform normalises {len(norms)} times; corruptions need one Normalize")
    stripped = copy.copy(dataset)
    stripped.transform = Compose([t for t in steps if t is not norms[0]])
    stats = tuple(tuple(torch.as_tensor(v).reshape(-1).tolist()) for v in (norms[0].mean, norms[0].std))
    return stripped, stats


def _sequential_loader(data, batch_size: Optional[int]) -> Tuple[DataLoader, Optional[Stats]]:
    """A loader over ``data`` (or a loader's dataset) in dataset order, with normalisation taken out."""
    loader = data if isinstance(data, DataLoader) else None
    dataset, stats = without_normalization(loader.dataset if loader is not None else data)
    size = batch_size or (loader.batch_size if loader is not None and loader.batch_size else 128)
    if size <= 0:
        raise ValueError(f"batch size {size} must be a positive integer")
    extra = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn) if loader is not None else {}
    return DataLoader(dataset, batch_size=size, shuffle=False, **extra), stats


class _Scorer:
    """Counts correct top-1 predictions of ``model`` on batches in [0, 1], normalised on the way in."""

    def __init__(self, model: nn.Module, device: torch.device, stats: Optional[Stats], amp_dtype):
        self.model, self.device, self.stats, self.amp_dtype = model, device, stats, amp_dtype

    @torch.inference_mode()
    def correct(self, images: torch.Tensor, targets: torch.Tensor) -> int:
        if self.stats is not None:
            images = TF.normalize(images, list(self.stats[0]), list(self.stats[1]))
        with autocast(self.device, self.amp_dtype):
            logits = self.model(images)
        return int((logits.argmax(-1) == targets).sum())


def evaluate_corruptions(model: nn.Module, data: Union[Dataset, DataLoader], *,
                         corruptions: Union[None, str, Sequence[str]] = None,
                         severities: Union[str, Sequence[int]] = SEVERITIES, seed: int = 0,
                         device: Union[None, str, torch.device] = None, batch_size: Optional[int] = None,
                         amp: bool = False, progress: bool = True) -> dict:
    """Top-1 accuracy of ``model`` on ``data``, clean and under each corruption and severity.

    Args:
        model: a classifier; put in eval mode (and moved to ``device`` when one is given).
        data: a dataset or loader of ``(image, label)``, e.g. a vitmix validation set. Its images
            are corrupted in [0, 1]: a ``Normalize`` step in its transform is moved after the
            corruption. A loader lends its dataset, batch size, workers and collate function; the
            images are always visited in dataset order, since each image's random stream is keyed
            by its index (so results do not depend on the batch size).
        corruptions: ``None``/``"all"``, ``"a,b"`` or a list of names (``list_corruptions()``).
        severities: a subset of 1..5 (``"1,3,5"`` or a sequence).
        seed: the seed of every corruption's random streams.
        device: where to evaluate (default: where the model's parameters are).
        batch_size: default: the loader's, else 128.
        amp: bf16 autocast.
        progress: a tqdm bar over (batch, corruption, severity).

    Returns a dict: ``clean``, ``mean``, ``drop``, ``relative_drop`` (definitions in the module
    docstring), ``per_corruption`` ``{name: {severity: acc}}``, ``corruption_mean`` ``{name: acc}``,
    ``severity_mean`` ``{severity: acc}``, and ``corruptions``, ``severities``, ``seed``, ``images``,
    ``image_size`` and ``parameters`` (each corruption's parameters at that image size).
    Unknown names and bad severities are a ``ValueError`` before any image is read.
    """
    names, sevs = parse_corruptions(corruptions), parse_severities(severities)
    loader, stats = _sequential_loader(data, batch_size)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    scorer = _Scorer(model.to(device).eval(), device, stats, torch.bfloat16 if amp else None)
    pairs = [(name, s) for name in names for s in sevs]
    correct, clean, seen, size = dict.fromkeys(pairs, 0), 0, 0, None
    quiet = not progress or os.environ.get("TQDM_DISABLE", "") not in ("", "0")      # as the training bars
    bar = tqdm(total=len(loader) * (1 + len(pairs)), desc="corruptions", disable=quiet, dynamic_ncols=True)
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        indices = range(seen, seen + images.shape[0])
        clean += scorer.correct(_check_unit_range(images), targets)
        bar.update()
        for name, s in pairs:
            bar.set_postfix_str(f"{name} {s}", refresh=False)
            correct[name, s] += scorer.correct(corrupt(images, name, s, seed=seed, indices=indices), targets)
            bar.update()
        seen, size = seen + images.shape[0], tuple(images.shape[-2:])
    bar.close()
    if not seen:
        raise ValueError("the dataset is empty: no image to evaluate")
    accuracy = {pair: 100.0 * n / seen for pair, n in correct.items()}
    return _summarise(100.0 * clean / seen, accuracy, names, sevs, seed, seen, size)


def _check_unit_range(images: torch.Tensor) -> torch.Tensor:
    if images.min() < 0 or images.max() > 1:
        raise ValueError("the dataset's images are not in [0, 1]: give it without normalisation, or with a "
                         "torchvision Normalize as the transform's step that evaluate_corruptions can move")
    return images


def _summarise(clean: float, accuracy: dict, names, sevs, seed: int, images: int, size) -> dict:
    """The result dict of :func:`evaluate_corruptions` from the accuracies per (name, severity)."""
    per = {name: {s: accuracy[name, s] for s in sevs} for name in names}
    mean = sum(accuracy.values()) / len(accuracy)
    return {
        "clean": clean, "mean": mean, "drop": clean - mean,
        "relative_drop": 100.0 * (clean - mean) / clean if clean > 0 else None,
        "per_corruption": per,
        "corruption_mean": {name: sum(per[name].values()) / len(sevs) for name in names},
        "severity_mean": {s: sum(per[name][s] for name in names) / len(names) for s in sevs},
        "corruptions": list(names), "severities": list(sevs), "seed": seed, "images": images,
        "image_size": list(size),
        "parameters": {name: {s: get_corruption(name).parameters(s, min(size)) for s in sevs} for name in names},
    }


def evaluate_checkpoint_corruptions(checkpoint, *, data: Optional[str] = None, data_dir: Optional[str] = None,
                                    device: Optional[str] = None, **options) -> dict:
    """:func:`evaluate_corruptions` for a vitmix checkpoint file or run directory on the validation
    split of ``data`` (default: the dataset it was trained on); ``options`` are passed on. The result
    also names the ``checkpoint``, ``model``, ``mixer`` and ``data``."""
    from ..data import build_datasets
    from .runner import _load_checkpoint

    names = parse_corruptions(options.pop("corruptions", None))       # bad names fail before loading
    sevs = parse_severities(options.pop("severities", SEVERITIES))
    model, meta, path = _load_checkpoint(checkpoint, device)
    if meta.get("num_frames") is not None:
        raise ValueError(f"--corruptions perturbs images; {path} is a video model (clips of {meta['num_frames']} "
                         "frames): evaluate it without --corruptions")
    if "sequence" in meta:
        raise ValueError(f"--corruptions perturbs images; {path} is a sequence model ({meta['model']} on "
                         f"{meta.get('data')}): evaluate it without --corruptions")
    data = data or meta.get("data")
    _, val_set, info = build_datasets(data, int(meta["img_size"]), data_dir, augment=False)
    if info.num_classes > meta["num_classes"] or info.in_chans != meta["in_chans"]:   # --num-classes: more
        raise ValueError(f"{path} was trained for {meta['num_classes']} classes / {meta['in_chans']} channels, "
                         f"but {data} has {info.num_classes} / {info.in_chans}")
    result = evaluate_corruptions(model, val_set, corruptions=names, severities=sevs, **options)
    result.update(checkpoint=str(path), model=meta["model"], mixer=meta.get("mixer"), data=data)
    return result


# --- the report ---------------------------------------------------------------------------------------------

def corruption_table(result: dict) -> str:
    """Markdown table: one row per corruption, one column per severity, then the row's mean; a last
    row of means per severity (its mean is the mean corruption accuracy)."""
    sevs = result["severities"]
    rows = [[name, *(f"{result['per_corruption'][name][s]:.2f}" for s in sevs),
             f"{result['corruption_mean'][name]:.2f}"] for name in result["corruptions"]]
    rows.append(["**mean**", *(f"{result['severity_mean'][s]:.2f}" for s in sevs), f"**{result['mean']:.2f}**"])
    return markdown_table(["corruption", *(f"severity {s}" for s in sevs), "mean"], rows, "l" + "r" * (len(sevs) + 1))


def corruption_summary(result: dict) -> str:
    """One line: clean and mean corruption accuracy, and the drop."""
    relative = f", {result['relative_drop']:.1f}% of clean" if result["relative_drop"] is not None else ""
    return (f"clean accuracy {result['clean']:.2f}%, mean corruption accuracy {result['mean']:.2f}% over "
            f"{len(result['corruptions'])} corruptions × severities {','.join(map(str, result['severities']))} "
            f"(drop {result['drop']:.2f} points{relative}); {result['images']} images, seed {result['seed']}")


def write_corruption_report(result: dict, out_dir) -> Dict[str, Path]:
    """Write ``corruptions.md`` (summary and table), ``corruptions.csv`` (one row per corruption and
    severity; the clean accuracy as corruption ``clean``, severity 0), ``corruptions.json`` (the
    result) and ``corruptions.png`` (accuracy against severity, one line per corruption, the clean
    accuracy dashed) into ``out_dir``; returns their paths by file name."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"report directory {out} is a file; give a directory")
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in REPORT_FILES}
    save_text(paths["corruptions.md"], _markdown(result))
    rows = [{"corruption": "clean", "severity": 0, "accuracy": result["clean"]}]
    rows += [{"corruption": name, "severity": s, "accuracy": acc}
             for name, by_severity in result["per_corruption"].items() for s, acc in by_severity.items()]
    write_csv(paths["corruptions.csv"], rows, ["corruption", "severity", "accuracy"])
    save_text(paths["corruptions.json"], json.dumps(result, indent=2) + "\n")
    plot_corruptions(result, paths["corruptions.png"])
    return paths


def _markdown(result: dict) -> str:
    who = (f"`{result['model']}` (mixer {result.get('mixer') or 'default'}) on {result['data']}, "
           f"checkpoint `{result['checkpoint']}`\n\n" if "checkpoint" in result else "")
    return (f"# Corruption robustness\n\n{who}{corruption_summary(result)}.\n\n"
            "Top-1 accuracy (%) on the validation images under each corruption (vitmix.data.corruptions; "
            "parameters in corruptions.json). The mean is over every corruption and severity shown.\n\n"
            f"{corruption_table(result)}\n")


def plot_corruptions(result: dict, path) -> None:
    """Accuracy against severity, one line per corruption, the mean bold, the clean accuracy dashed."""
    from .plots import plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    sevs = result["severities"]
    colours = plt.cm.tab20.colors                       # distinct colours for up to 20 corruptions
    for i, name in enumerate(result["corruptions"]):
        ax.plot(sevs, [result["per_corruption"][name][s] for s in sevs], "o-", lw=1, ms=3, label=name,
                color=colours[i % len(colours)])
    ax.plot(sevs, [result["severity_mean"][s] for s in sevs], "k-", lw=2.5, label="mean")
    ax.axhline(result["clean"], color="k", ls="--", lw=1.2, label=f"clean ({result['clean']:.1f}%)")
    who = f"{result['model']} ({result.get('mixer') or 'default'}): " if "model" in result else ""
    ax.set(xlabel="severity", ylabel="top-1 accuracy (%)", xticks=sevs, title=f"{who}accuracy under corruption")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_report_dir(checkpoint) -> Path:
    """Where ``vitmix eval --corruptions`` writes: the run directory given, or the checkpoint's folder."""
    path = Path(checkpoint)
    return path if path.is_dir() else path.parent
