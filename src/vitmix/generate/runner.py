"""The jobs behind ``vitmix generate``: :func:`train_generator`, :func:`sample_grid`, :func:`measure_checkpoint_fd`.

A run directory holds ``config.yaml``, ``last.safetensors`` (model) and ``ema.safetensors`` (EMA weights,
used for samples when present), ``metrics.jsonl`` (one line per epoch), ``samples/epoch-NNN.png`` (one
row per class), ``state.pt`` (everything ``--resume`` needs, written last, with the digests of the
files of its epoch), and at the end ``fd_classifier.safetensors``, ``fd.json`` and ``summary.json``.
Images are handled in [−1, 1] (the dataset's normalisation undone, then rescaled).

The FD step costs what the run does: by default its sample count and its classifier's training set
follow the images the run trained on (:func:`default_fd_samples`, :func:`default_classifier_images`),
and classifiers are cached by the digest of their training images in ``VITMIX_CACHE_DIR/fd``.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .._util import cache_dir, close_matches, plural
from ..data import build_datasets
from ..models import create_model, is_vitmix_model, list_models
from ..models.dit import GENERATION, model_task
from ..runs import (
    EMA_FIRST, Trainable, atomic_write, check_subset, checked_step, clear_aborted, load_into, load_weights, model_meta,
    parse_device, prepare_run_dir as _prepare_run_dir, recorded_abort, resolve_checkpoint, resume_run, save_manifest,
    save_metrics, save_run_config, save_text, save_weights, seeded_subset,
)
from .config import GenerateConfig
from ..models.diffusion import PREDICTIONS, SCHEDULES, GaussianDiffusion
from .fd import FD_LABEL, FeatureNet, features, frechet_distance, gaussian_stats, train_feature_net

#: what ``--resume`` may change (anything else would make a different run)
RESUME_MAY_CHANGE = ("out", "resume", "device", "epochs", "max_steps", "fd_samples", "fd_classifier_subset")
#: the files of one epoch's checkpoint set, recorded (with digests) in ``state.pt``
CHECKPOINT_FILES = ("last.safetensors", "ema.safetensors", "metrics.jsonl")
FD_CLASSIFIER = "fd_classifier.safetensors"
#: the most samples the default FD draws, and the fewest images its classifier trains on (a poorer feature
#: space with fewer: 66.6 % Fashion-MNIST val accuracy on 1,000 images, 87.8 % on all 60,000)
FD_MAX_SAMPLES, FD_MIN_CLASSIFIER_IMAGES = 1000, 1000
#: what the cached classifier is a function of, besides its training images (bump when FeatureNet changes)
FD_RECIPE = f"FeatureNet(32,64,128) adam lr=2e-3 bs=128 epochs=2 seed=0 torch={torch.__version__}"


def _progress(**kwargs):
    from tqdm.auto import tqdm

    return lambda items: tqdm(items, leave=False, dynamic_ncols=True, **kwargs)


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------
def generative_models() -> List[str]:
    """The registered diffusion backbones (``dit_*``, ``weightformer_dit_*``)."""
    return [m for m in list_models() if is_vitmix_model(m) and model_task(m) == GENERATION]


def check_model(name: str) -> None:
    """``name`` must be a registered diffusion backbone: one-line ``ValueError`` with close matches."""
    known = generative_models()
    if name.split(".")[0] in known:
        return
    if name.split(".")[0] in list_models():
        raise ValueError(f"{name!r} is a classifier; `vitmix generate` needs a diffusion backbone: "
                         f"{', '.join(known)}")
    raise ValueError(f"unknown model {name!r}." + close_matches(name, known, n=3)
                     + f" Diffusion backbones: {', '.join(known)}")


def check_config(cfg: GenerateConfig) -> None:
    """Numbers out of range and unknown names are one-line ``ValueError``s naming the flag."""
    check_model(cfg.model)
    for name in ("epochs", "batch_size", "timesteps", "sample_steps", "grid_per_class", "train_subset", "max_steps"):
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be a positive integer")
    if cfg.fd_samples is not None and (cfg.fd_samples < 0 or cfg.fd_samples == 1):
        raise ValueError(f"--fd-samples {cfg.fd_samples} must be 0 (no FD) or at least 2")
    if cfg.fd_classifier_subset is not None and cfg.fd_classifier_subset <= 0:
        raise ValueError(f"--fd-classifier-subset {cfg.fd_classifier_subset} must be a positive integer")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"--schedule {cfg.schedule!r}: choose {' or '.join(SCHEDULES)}")
    if cfg.prediction not in PREDICTIONS:
        raise ValueError(f"--prediction {cfg.prediction!r}: choose {' or '.join(PREDICTIONS)}")
    if cfg.sample_steps > cfg.timesteps:
        raise ValueError(f"--sample-steps {cfg.sample_steps} exceeds --timesteps {cfg.timesteps}")
    if cfg.ema_decay is not None and not 0.0 < cfg.ema_decay < 1.0:
        raise ValueError(f"--ema-decay {cfg.ema_decay} must be between 0 and 1 (e.g. 0.999)")
    if cfg.guidance < 0 or cfg.eta < 0 or cfg.lr <= 0:
        raise ValueError("--guidance and --eta must be >= 0 and --lr > 0")


def parse_classes(text: Optional[str], num_classes: int) -> List[int]:
    """``"0,3,7"`` → ``[0, 3, 7]`` (``None`` or ``"all"``: every class); bad input is a one-line error."""
    if text is None or text.strip() == "all":
        return list(range(num_classes))
    try:
        classes = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--classes {text!r}: give class indices separated by commas, e.g. 0,1,2") from None
    bad = [c for c in classes if not 0 <= c < num_classes]
    if not classes or bad:
        raise ValueError(f"--classes {text!r}: classes are 0..{num_classes - 1}"
                         + (f" ({bad[0]} is not)" if bad else ""))
    return classes


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def _as_tensors(dataset, info) -> Tuple[Tensor, Tensor]:
    """A vitmix dataset as ``(images in [−1, 1], labels)`` tensors (its normalisation undone)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=1000, shuffle=False)
    xs, ys = zip(*loader)
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    return (torch.cat(xs) * std + mean) * 2 - 1, torch.cat(ys)


def load_images(data: str, img_size: Optional[int], data_dir: Optional[str] = None, download: bool = False):
    """``(train_x, train_y, val_x, val_y, info, img_size)``; ``img_size=None``: the native size."""
    train, val, info = build_datasets(data, img_size or 32, data_dir, download, augment=False)
    if img_size is None and info.native_size != 32:
        img_size = info.native_size
        train, val, info = build_datasets(data, img_size, data_dir, download, augment=False)
    return (*_as_tensors(train, info), *_as_tensors(val, info), info, img_size or 32)


def _subset(x: Tensor, y: Tensor, size: Optional[int], seed: int, flag: str = "--train-subset"
            ) -> Tuple[Tensor, Tensor]:
    """A fixed random subset of ``size`` images (all for ``None``); the first ``size`` of one seeded
    permutation, so smaller subsets of the same seed are nested in larger ones."""
    idx = seeded_subset(len(x), size, seed, flag)
    return (x, y) if idx is None else (x[idx], y[idx])


# ----------------------------------------------------------------------------------------------
# model, samples, grids
# ----------------------------------------------------------------------------------------------
def build_generator(meta: dict) -> nn.Module:
    """The diffusion backbone described by a checkpoint's (or a config's) metadata."""
    return create_model(meta["model"], mixer=meta.get("mixer"), mixer_options=meta.get("mixer_options") or None,
                        num_classes=meta["num_classes"], in_chans=meta["in_chans"], img_size=meta["img_size"],
                        **(meta.get("model_options") or {}))


def generate(model: nn.Module, diffusion: GaussianDiffusion, labels: Sequence[int], img_size: int, steps: int,
             guidance: float, eta: float, seed: int, batch_size: int = 250, progress=None) -> Tensor:
    """Samples in [−1, 1] for ``labels`` (a function of ``seed``), ``batch_size`` at a time."""
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(list(labels), dtype=torch.long)
    shape = (model.in_chans, img_size, img_size)
    return torch.cat([diffusion.sample(model, labels[i:i + batch_size], shape, steps, guidance, eta,
                                       model.null_class, generator=gen, device=device, progress=progress).cpu()
                      for i in range(0, len(labels), batch_size)])


def save_grid(images: Tensor, path: Path, per_row: int) -> Path:
    """Images in [−1, 1] as one PNG grid (``per_row`` images a row), written atomically; images smaller
    than 32 px are enlarged (nearest neighbour) so that a grid of 8×8 digits stays readable."""
    import torchvision
    from PIL import Image

    scale = max(1, 32 // images.shape[-1])
    images = ((images.clamp(-1, 1) + 1) / 2).repeat_interleave(scale, -1).repeat_interleave(scale, -2)
    grid = torchvision.utils.make_grid(images, nrow=per_row, padding=2, pad_value=1.0)  # grey → 3 channels
    array = (grid * 255).round().byte().permute(1, 2, 0).numpy()
    if images.shape[1] == 1:
        array = array[..., 0]  # back to one grey channel
    atomic_write(Path(path), lambda tmp: Image.fromarray(array).save(tmp, format="PNG"))
    return Path(path)


# ----------------------------------------------------------------------------------------------
# run directory, checkpoints, resume
# ----------------------------------------------------------------------------------------------
def prepare_run_dir(cfg: GenerateConfig) -> Path:
    """The run directory: a new run never lands on an existing one or on a folder of other files;
    ``--resume`` keeps its config (see :func:`vitmix.runs.prepare_run_dir`)."""
    return _prepare_run_dir(cfg, GenerateConfig, RESUME_MAY_CHANGE,
                            f"generate-{cfg.model}-{cfg.mixer or 'default'}-{cfg.data}")


def _meta(cfg: GenerateConfig, info, img_size: int, epoch: int) -> dict:
    """What a checkpoint records to rebuild its model and sampler."""
    return {**model_meta(cfg), "img_size": img_size, "in_chans": info.in_chans,
            "num_classes": info.num_classes, "classes": list(info.classes), "data": cfg.data,
            "task": GENERATION, "timesteps": cfg.timesteps, "schedule": cfg.schedule,
            "prediction": cfg.prediction, "sample_steps": cfg.sample_steps, "guidance": cfg.guidance,
            "eta": cfg.eta, "epoch": epoch}


def _save_epoch(run_dir: Path, model, ema, optimizer, history: list, step: int, meta: dict) -> None:
    """One checkpoint set; ``state.pt`` goes last and records the digests of the others."""
    _save_weights(run_dir, model, ema, meta)
    save_metrics(run_dir, history)
    save_manifest(run_dir, Trainable(model, optimizer, ema=ema), meta["epoch"], step, history, CHECKPOINT_FILES)


def _save_weights(run_dir: Path, model, ema, meta: dict) -> None:
    save_weights(model, run_dir / "last.safetensors", meta)
    if ema is not None:
        save_weights(ema.module, run_dir / "ema.safetensors", meta)


def _resume(run_dir: Path, model, ema, optimizer, log, meta_for) -> Tuple[int, int, list]:
    """Load the last complete checkpoint set: ``(epoch, step, history)``; ``meta_for(epoch)`` is the
    metadata to rewrite weights that a run killed while saving left newer than ``state.pt``."""
    done = resume_run(run_dir, Trainable(model, optimizer, ema=ema), log,
                      lambda history: _save_weights(run_dir, model, ema, meta_for(len(history))))
    return done.epoch, done.step, done.history


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------
def _train_epoch(model, ema, optimizer, diffusion, data: Tuple[Tensor, Tensor], cfg: GenerateConfig, epoch: int,
                 step: int, device) -> Tuple[dict, int]:
    """One pass over the training images in an order fixed by (seed, epoch); returns ``(metrics, step)``."""
    x, y = data
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch))
    bs = cfg.batch_size
    starts = list(range(0, max(len(x) - bs, 0) + 1, bs))  # whole batches only (one short batch if bs > N)
    total, seen, t0 = 0.0, 0, time.perf_counter()
    model.train()
    for start in _progress(desc=f"epoch {epoch + 1}/{cfg.epochs}")(starts):
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break
        idx = order[start:start + bs]
        loss = diffusion.training_loss(model, x[idx].to(device), y[idx].to(device))
        checked_step(loss, model, optimizer, cfg.clip_grad, step, hint="lower --lr or set --clip-grad")
        step += 1
        if ema is not None:
            ema.update(model, step=step)
        total, seen = total + loss.item() * len(idx), seen + len(idx)
    seconds = time.perf_counter() - t0
    return {"epoch": epoch + 1, "step": step, "train_loss": total / max(seen, 1),
            "images_per_s": seen / max(seconds, 1e-9), "epoch_seconds": seconds}, step


def _epoch_grid(sampler, diffusion, cfg: GenerateConfig, img_size: int, path: Path) -> float:
    """The epoch's PNG grid (``grid_per_class`` samples of every class, one row each, fixed noise);
    returns the seconds it took."""
    t0 = time.perf_counter()
    labels = torch.arange(sampler.num_classes).repeat_interleave(cfg.grid_per_class)
    images = generate(sampler, diffusion, labels.tolist(), img_size, cfg.sample_steps, cfg.guidance, cfg.eta,
                      cfg.seed, progress=_progress(desc="samples"))
    save_grid(images, path, cfg.grid_per_class)
    return time.perf_counter() - t0


def train_generator(cfg: GenerateConfig, log=print) -> dict:
    """Train ``cfg.model`` as a class-conditional diffusion model on ``cfg.data``; returns the summary.

    Bad input (model, numbers, data, run directory) fails before anything is written."""
    check_config(cfg)
    run_dir = prepare_run_dir(cfg)  # only checks: nothing is written before the model is built
    torch.manual_seed(cfg.seed)
    device = parse_device(cfg.device)
    train_x, train_y, val_x, val_y, info, img_size = load_images(cfg.data, cfg.img_size, cfg.data_dir, cfg.download)
    data = _subset(train_x, train_y, cfg.train_subset, cfg.seed)
    check_subset(cfg.fd_classifier_subset, len(train_x), "--fd-classifier-subset")  # fail before training
    model = build_generator(_meta(cfg, info, img_size, 0)).to(device)
    diffusion = GaussianDiffusion(cfg.timesteps, cfg.schedule, cfg.prediction)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ema = None
    if cfg.ema_decay:
        from timm.utils import ModelEmaV3

        # warm-up as in diffusers' EMA: decay min(ema_decay, 1 - (1 + step)^(-2/3)), so that a short run's
        # EMA is not still the zero-output initial model (0.999 alone needs thousands of steps)
        ema = ModelEmaV3(model, decay=cfg.ema_decay, use_warmup=True)
    start, step, history = 0, 0, []
    if cfg.resume:
        start, step, history = _resume(run_dir, model, ema, optimizer, log, lambda e: _meta(cfg, info, img_size, e))
    clear_aborted(run_dir)
    save_run_config(run_dir, cfg, f"img_size={img_size}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"vitmix generate: {cfg.model} (mixer={cfg.mixer or 'default'}, {n_params / 1e6:.2f}M params) on {cfg.data} "
        f"({len(data[0])} images, {img_size}px) for {plural(cfg.epochs, 'epoch')}, {cfg.schedule} "
        f"{cfg.prediction}-DDPM T={cfg.timesteps}, device={device}; run dir {run_dir}")
    sampler = ema.module if ema is not None else model
    with recorded_abort(run_dir):
        for epoch in range(start, cfg.epochs):
            if cfg.max_steps is not None and step >= cfg.max_steps:
                break
            metrics, step = _train_epoch(model, ema, optimizer, diffusion, data, cfg, epoch, step, device)
            metrics["grid_seconds"] = _epoch_grid(sampler, diffusion, cfg, img_size,
                                                  run_dir / "samples" / f"epoch-{epoch + 1:03d}.png")
            history.append(metrics)
            _save_epoch(run_dir, model, ema, optimizer, history, step, _meta(cfg, info, img_size, epoch + 1))
            log(f"epoch {epoch + 1:>3}/{cfg.epochs}: loss {metrics['train_loss']:.4f}, "
                f"{metrics['images_per_s']:.0f} img/s, samples/epoch-{epoch + 1:03d}.png")
    summary = {"run_dir": str(run_dir), "model": cfg.model, "mixer": cfg.mixer, "data": cfg.data, "params": n_params,
               "img_size": img_size, "epochs_run": len(history), "steps": step,
               "final_train_loss": history[-1]["train_loss"] if history else None,
               "train_seconds": sum(h["epoch_seconds"] for h in history)}
    skipped = _fd_skipped(cfg, history)
    if skipped is None:
        images_seen = step * min(cfg.batch_size, len(data[0]))  # whole batches (one short one if bs > N)
        result = fd_step(cfg, run_dir, sampler, diffusion, (train_x, train_y), (val_x, val_y), images_seen, log)
        save_text(run_dir / "fd.json", json.dumps(result, indent=2))
        summary.update(result)
    save_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    log(_final_line(summary, skipped))
    return summary


def _fd_skipped(cfg: GenerateConfig, history: list) -> Optional[str]:
    """Why the run measures no FD (``None``: it does)."""
    if cfg.fd_samples == 0:
        return "--fd-samples 0"
    return None if history else "no epoch was trained"


def _final_line(summary: dict, fd_skipped: Optional[str]) -> str:
    """The run's last line: what was trained, its FD (or why there is none) and where it is."""
    loss = summary["final_train_loss"]
    trained = (f"{plural(summary['epochs_run'], 'epoch')}, {plural(summary['steps'], 'step')} in "
               f"{summary['train_seconds']:.0f} s" + (f", final loss {loss:.4f}" if loss is not None else ""))
    if fd_skipped is not None:
        fd = f"FD skipped ({fd_skipped})"
    else:
        fd = (f"{FD_LABEL} {summary['fd']:.3f} over {summary['fd_samples']} samples (real-vs-real floor "
              f"{summary['fd_real_floor']:.3f}) in {summary['fd_seconds']:.0f} s")
    return f"done: {trained}; {fd}; run dir {summary['run_dir']}"


# ----------------------------------------------------------------------------------------------
# FD (classifier features)
# ----------------------------------------------------------------------------------------------
def default_fd_samples(images_seen: int, sample_steps: int) -> int:
    """The FD's sample count when ``--fd-samples`` is not given: the images the run trained on (counted
    with repeats) divided by the DDIM steps, between 2 and :data:`FD_MAX_SAMPLES`. A guided sample costs
    2 forward passes a step and a training image about 3 (forward and backward), so the FD's sampling
    costs at most about 2/3 of the training: a full run gets 1000 samples, a smoke run a few."""
    return max(2, min(FD_MAX_SAMPLES, images_seen // sample_steps))


def default_classifier_images(run_images: int, available: int) -> int:
    """The FD classifier's training images when ``--fd-classifier-subset`` is not given: as many as the
    run trained on (distinct images), at least :data:`FD_MIN_CLASSIFIER_IMAGES`, at most all."""
    return min(available, max(run_images, FD_MIN_CLASSIFIER_IMAGES))


def fd_step(cfg: GenerateConfig, run_dir: Path, sampler, diffusion, train: Tuple[Tensor, Tensor],
            val: Tuple[Tensor, Tensor], images_seen: int, log=print) -> dict:
    """The end-of-run FD, sized to the run (see :func:`default_fd_samples` and
    :func:`default_classifier_images`); returns what ``fd.json`` records."""
    t0 = time.perf_counter()
    run_images = min(images_seen, cfg.train_subset or len(train[0]))
    images = cfg.fd_classifier_subset or default_classifier_images(run_images, len(train[0]))
    samples = cfg.fd_samples or default_fd_samples(images_seen, cfg.sample_steps)
    net, acc = fd_classifier(train, val, cfg.data, val[0].shape[-1], images, run_dir / FD_CLASSIFIER, log)
    result = measure_fd(net, sampler, diffusion, (train[0], val[0]), samples, cfg.sample_steps, cfg.guidance,
                        cfg.eta, cfg.seed)
    result.update(fd_classifier_val_acc=acc, fd_classifier_images=images, fd_seconds=time.perf_counter() - t0)
    log(f"{FD_LABEL}: {result['fd']:.3f} over {result['fd_samples']} samples (real-vs-real floor "
        f"{result['fd_real_floor']:.3f}); class agreement {result['class_agreement']:.1f}%; classifier "
        f"(trained on {images} images) val acc {acc:.2f}%")
    return result


def _fd_cache_dir() -> Path:
    return cache_dir("fd")


def _classifier_key(x: Tensor, y: Tensor, num_classes: int) -> str:
    """A digest of everything a trained FD classifier is a function of (its training is seeded)."""
    h = hashlib.sha256(f"{FD_RECIPE} shape={tuple(x.shape)} classes={num_classes}".encode())
    h.update(x.contiguous().numpy().tobytes())
    h.update(y.contiguous().numpy().tobytes())
    return h.hexdigest()


def _saved_key(path: Path) -> Optional[str]:
    """The key a saved FD classifier records (``None``: missing, unreadable or of an older version)."""
    try:
        return load_weights(path)[1].get("key") if path.is_file() else None
    except ValueError:  # truncated or corrupt: trained again and rewritten
        return None


def load_fd_classifier(path, data: Optional[str] = None, img_size: Optional[int] = None
                       ) -> Tuple[FeatureNet, float, dict]:
    """``(net, val_acc, meta)`` of a saved FD classifier; with ``data``, it must be one of ``data`` at
    ``img_size``."""
    state, meta = load_weights(path)
    if meta.get("task") != "fd-classifier":
        raise ValueError(f"{path} is not an FD classifier (no fd-classifier metadata); remove it or pass another")
    if data is not None and (meta.get("data"), meta.get("img_size")) != (data, img_size):
        raise ValueError(f"{path} is the FD classifier of {meta.get('data')} at {meta.get('img_size')}px, "
                         f"not of {data} at {img_size}px; remove it or pass another")
    net = FeatureNet(int(meta["in_chans"]), int(meta["num_classes"]))
    load_into(net, state, str(path))
    return net.eval(), float(meta["val_acc"]), meta


def fd_classifier(train: Tuple[Tensor, Tensor], val: Tuple[Tensor, Tensor], data: str, img_size: int,
                  images: int, keep: Optional[Path] = None, log=print) -> Tuple[FeatureNet, float]:
    """The FD feature network of (``data``, ``img_size``) trained on a fixed subset of ``images`` training
    images (seed 0, whatever the run's seed, so that runs with the same ``images`` share it): taken from
    ``keep`` or the cache when one of them holds it, else trained (seeded) and saved to both."""
    num_classes = int(train[1].max()) + 1
    x, y = _subset(*train, images, seed=0, flag="--fd-classifier-subset")
    key = _classifier_key(x, y, num_classes)
    cached = _fd_cache_dir() / f"{key[:32]}.safetensors"
    for path in (keep, cached):
        if path is not None and _saved_key(path) == key:  # the same images: the same network, whatever its name
            net, acc, meta = load_fd_classifier(path)
            if keep is not None and path != keep:
                save_weights(net, keep, dict(meta, data=data, img_size=img_size))
            return net, acc
    log(f"training the FD feature classifier on {len(x)} of the {len(train[0])} {data} training images "
        f"(cached in {cached})")
    net, acc = train_feature_net(x, y, num_classes, val=val, progress=_progress(desc="FD classifier"))
    meta = {"task": "fd-classifier", "data": data, "img_size": img_size, "in_chans": x.shape[1],
            "num_classes": num_classes, "val_acc": acc, "train_images": len(x), "key": key}
    if keep is not None:
        save_weights(net, keep, meta)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        save_weights(net, cached, meta)
    except OSError as err:  # a read-only cache costs the next run a retraining, nothing else
        log(f"warning: could not cache the FD classifier in {cached} ({err})")
    return net, acc


def measure_fd(net: FeatureNet, model, diffusion, real: Tuple[Tensor, Tensor], samples: int, steps: int,
               guidance: float, eta: float, seed: int) -> dict:
    """FD between ``samples`` generated images (classes balanced) and as many validation images, the
    same distance between those validation images and training images (the real-vs-real floor), and
    ``class_agreement``: the % of samples the classifier assigns to the class they were generated for.

    ``real`` is ``(train_x, val_x)``; ``samples`` is capped at the validation set's size."""
    train_x, val_x = real
    n = min(samples, len(val_x), len(train_x))
    gen = torch.Generator().manual_seed(seed)
    val_pick = val_x[torch.randperm(len(val_x), generator=gen)[:n]]
    train_pick = train_x[torch.randperm(len(train_x), generator=gen)[:n]]
    labels = [i % model.num_classes for i in range(n)]
    fake = features(net, generate(model, diffusion, labels, val_x.shape[-1], steps, guidance, eta, seed + 1,
                                  progress=_progress(desc="FD samples")))
    real = gaussian_stats(features(net, val_pick))
    with torch.no_grad():  # how often the classifier sees the class a sample was generated for
        agreement = (net.head(fake).argmax(1) == torch.tensor(labels)).double().mean().item() * 100
    return {"fd": frechet_distance(*real, *gaussian_stats(fake)),
            "fd_real_floor": frechet_distance(*real, *gaussian_stats(features(net, train_pick))),
            "fd_samples": n, "fd_sample_steps": steps, "fd_guidance": guidance, "class_agreement": agreement}


# ----------------------------------------------------------------------------------------------
# checkpoints: sample, FD
# ----------------------------------------------------------------------------------------------
def load_generator(checkpoint, device: Optional[str] = None):
    """``(model, meta, diffusion)`` of a ``vitmix generate`` checkpoint file or run directory."""
    path = resolve_checkpoint(checkpoint, EMA_FIRST)
    state, meta = load_weights(path)
    if meta.get("task") != GENERATION:
        raise ValueError(f"{path} is not a `vitmix generate train` checkpoint (no generation metadata)")
    model = build_generator(meta)
    load_into(model, state, str(path))
    diffusion = GaussianDiffusion(meta["timesteps"], meta["schedule"], meta["prediction"])
    return model.to(parse_device(device)).eval(), meta, diffusion


def sample_grid(checkpoint, out, classes: Optional[str] = None, n: int = 8, steps: Optional[int] = None,
                guidance: Optional[float] = None, eta: Optional[float] = None, seed: int = 0,
                device: Optional[str] = None) -> Path:
    """A PNG grid of ``n`` samples of each class in ``classes`` (one row each); sampler settings default
    to the run's."""
    if n <= 0:
        raise ValueError(f"--n {n} must be a positive integer")
    if Path(out).is_dir():
        raise ValueError(f"--out {out} is a directory; give a .png file name")
    model, meta, diffusion = load_generator(checkpoint, device)
    picked = parse_classes(classes, meta["num_classes"])
    labels = [c for c in picked for _ in range(n)]
    images = generate(model, diffusion, labels, meta["img_size"], steps or meta["sample_steps"],
                      meta["guidance"] if guidance is None else guidance, meta["eta"] if eta is None else eta,
                      seed, progress=_progress(desc="sampling"))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return save_grid(images, Path(out), n)


def measure_checkpoint_fd(checkpoint, samples: int = 1000, steps: Optional[int] = None,
                          guidance: Optional[float] = None, classifier: Optional[str] = None,
                          data_dir: Optional[str] = None, seed: int = 0, device: Optional[str] = None,
                          classifier_subset: Optional[int] = None, log=print) -> dict:
    """FD (classifier features) of a checkpoint against its dataset's validation images. The classifier
    is the file ``classifier``, else the run directory's; a missing one is trained there on
    ``classifier_subset`` images (default: all). Without ``classifier``, a ``classifier_subset`` asks for
    the (cached) classifier of that many images, leaving the run's own alone."""
    if samples < 2:
        raise ValueError(f"--samples {samples} must be at least 2")
    if classifier_subset is not None and classifier_subset <= 0:
        raise ValueError(f"--classifier-subset {classifier_subset} must be a positive integer")
    model, meta, diffusion = load_generator(checkpoint, device)
    train_x, train_y, val_x, val_y, _, _ = load_images(meta["data"], meta["img_size"], data_dir)
    check_subset(classifier_subset, len(train_x), "--classifier-subset")
    target = Path(classifier) if classifier else resolve_checkpoint(checkpoint, EMA_FIRST).parent / FD_CLASSIFIER
    if target.is_file() and (classifier or classifier_subset is None):
        net, acc, saved = load_fd_classifier(target, meta["data"], meta["img_size"])
        images = saved.get("train_images")
    else:
        images = classifier_subset or len(train_x)
        net, acc = fd_classifier((train_x, train_y), (val_x, val_y), meta["data"], meta["img_size"], images,
                                 keep=None if target.is_file() else target, log=log)
    steps, guidance = steps or meta["sample_steps"], meta["guidance"] if guidance is None else guidance
    result = measure_fd(net, model, diffusion, (train_x, val_x), samples, steps, guidance, meta["eta"], seed)
    return dict(result, fd_classifier_val_acc=acc, fd_classifier_images=images,
                checkpoint=str(resolve_checkpoint(checkpoint, EMA_FIRST)))
