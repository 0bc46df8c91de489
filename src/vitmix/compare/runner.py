"""Train and measure each entry of a comparison: resumable, and a failing entry does not stop the rest.

Layout of a comparison directory ``OUT``::

    OUT/compare.yaml          the base recipe, the mixers, the models, the seeds and the budget (a rerun must match)
    OUT/budget.json           the steps each entry trains for under a time or FLOP budget (measured once)
    OUT/<entry>/              the entry's ordinary `vitmix train` run directory (one seed, no --seeds)
    OUT/<entry>/seed-<s>/     ... or one per seed with --seeds
    .../result.json           what the leaderboard shows for that run, written once it is trained and measured
    OUT/leaderboard.{md,csv,json}, runs.csv, accuracy_vs_throughput.png, loss_curves.png, learning_curves.png

``OUT`` is new, empty or an earlier comparison (``compare.yaml``): a folder of other files is refused.
A run with a ``result.json`` for the same recipe and budget is read back, not retrained; one with a
checkpoint resumes; one that failed (or whose directory is corrupt) is retried and, if it fails
again, becomes a failed run of its entry (the entry's other seeds are still reported).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn
from tqdm.auto import tqdm

from .._util import plural
from ..runs import check_output_dir, load_model, save_text
from ..train.config import TrainConfig
from ..train.runner import RESUME_MAY_CHANGE, train
from .budget import (
    TRAIN_FLOPS_PER_FORWARD, Budget, BudgetError, calibrate_step_seconds, forward_flops, parse_budget, steps_for_budget,
    steps_per_epoch,
)

RESULT = "result.json"
MANIFEST = "compare.yaml"
BUDGET_FILE = "budget.json"
# Settings that may differ between a comparison and its rerun (where the runs go, how they run).
_RERUN_MAY_CHANGE = frozenset(RESUME_MAY_CHANGE) | {"mixer", "model", "model_options", "mixer_options"}


@dataclass
class Entry:
    """One row of the comparison: a mixer in the base model, or a whole model (``kind="model"``);
    ``seed`` is set on the per-seed runs of an entry (:func:`seed_runs`)."""

    label: str
    kind: str
    config: TrainConfig
    run_dir: Path
    seed: Optional[int] = None


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


def seed_runs(entry: Entry, seeds: Optional[Sequence[int]]) -> List[Entry]:
    """The entry's runs: itself (``seeds`` is ``None``: one run in ``OUT/<entry>/`` at the recipe's
    seed, as before ``--seeds`` existed), or one run per seed in ``OUT/<entry>/seed-<s>/``."""
    if seeds is None:
        return [dataclasses.replace(entry, seed=entry.config.seed)]
    runs = []
    for seed in seeds:
        run_dir = entry.run_dir / f"seed-{seed}"
        cfg = dataclasses.replace(entry.config, seed=seed, out=str(run_dir))
        runs.append(dataclasses.replace(entry, config=cfg, run_dir=run_dir, seed=seed))
    return runs


def adopt_single_seed_run(entry: Entry, seeds: Sequence[int]) -> None:
    """Reuse the run of a comparison made without ``--seeds``: ``OUT/<entry>/`` trained at seed s moves
    into ``OUT/<entry>/seed-<s>/`` when s is one of ``seeds`` (so adding seeds does not retrain it)."""
    from ..train.config import load_yaml

    config = entry.run_dir / "config.yaml"
    if not config.is_file():
        return
    seed = load_yaml(config).get("seed", 0)
    target = entry.run_dir / f"seed-{seed}"
    if seed not in seeds or target.exists():
        return
    target.mkdir()
    for path in list(entry.run_dir.iterdir()):
        if path != target and not path.name.startswith("seed-"):
            shutil.move(str(path), str(target / path.name))


def _manifest(out: Path) -> Optional[dict]:
    from ..train.config import load_yaml

    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        saved = load_yaml(path)
        saved.get("recipe", {}).items()
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{path} is unreadable ({err}); delete it to start the comparison over") from None
    return saved


def check_manifest(out: Path, base: TrainConfig, seeds: Optional[Sequence[int]] = None,
                   budget: Union[Budget, str] = "epochs") -> None:
    """A rerun into ``out`` must use the same recipe and budget; otherwise the rows would not be
    comparable. Seeds may be added (``--seeds``), not dropped: a per-seed comparison stays one."""
    saved = _manifest(out)
    if saved is None:
        return
    recipe = saved.get("recipe", {})
    may_change = _RERUN_MAY_CHANGE | ({"seed"} if seeds is not None else set())
    now = base.to_dict()
    changed = sorted(k for k in now if k not in may_change and k in recipe and recipe[k] != now[k])
    if changed:
        diffs = ", ".join(f"{k}: {recipe[k]!r} -> {now[k]!r}" for k in changed)
        raise ValueError(f"{out} holds a comparison with another recipe ({diffs}); rerun with the same settings "
                         "or choose another --out")
    saved_budget = str(saved.get("budget", "epochs"))
    if saved_budget != str(budget):
        raise ValueError(f"{out} holds a comparison made under --budget {saved_budget}, not {budget}; rerun with "
                         f"--budget {saved_budget} or choose another --out")
    if saved.get("seeds") is not None and seeds is None:
        raise ValueError(f"{out} holds a comparison over --seeds {','.join(map(str, saved['seeds']))}; "
                         "pass --seeds (the same or more) or choose another --out")


def check_data(base: TrainConfig):
    """A missing dataset fails every entry the same way: say so once, before any training. Returns
    ``(number of training images, data info)``."""
    from ..data import build_datasets, is_sequence_dataset
    from ..train.runner import default_img_size

    if is_sequence_dataset(base.data):     # its leaderboard measures image models (size, channels, corruptions)
        raise ValueError(f"vitmix compare ranks image classifiers; {base.data} holds 1-D token sequences: compare "
                         "mixers on it with `python experiments/lra/lra.py` (docs/sequences.md)")
    train_set, _, info = build_datasets(base.data, base.img_size or default_img_size(base.model), base.data_dir,
                                        base.download, augment=False, num_frames=base.num_frames)
    if base.train_subset is not None and not 0 < base.train_subset <= len(train_set):
        raise ValueError(f"--train-subset {base.train_subset} must be between 1 and the {len(train_set)} "
                         "training images")
    return base.train_subset or len(train_set), info


def write_manifest(out: Path, base: TrainConfig, mixers, models, seeds=None, budget="epochs") -> None:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    skip = ("out", "resume", "mixer") + (("seed",) if seeds is not None else ())
    recipe = {k: v for k, v in base.to_dict().items() if k not in skip}
    save_text(out / MANIFEST, yaml.safe_dump({"recipe": recipe, "mixers": list(mixers), "models": list(models),
                                              "seeds": None if seeds is None else list(seeds),
                                              "budget": str(budget)}, sort_keys=False))


# ------------------------------------------------------------------------------------------- budgets
def plan_budget(entry: Entry, budget: Budget, train_images: int, data_info) -> dict:
    """How long ``entry`` trains under ``budget``: ``epochs`` and ``max_steps`` for its config, and the
    numbers the leaderboard needs (steps per epoch, global batch; the measured cost of a step)."""
    cfg = entry.config
    per_epoch = steps_per_epoch(train_images, cfg.batch_size, cfg.accum_steps)
    batch = min(cfg.batch_size, train_images) * cfg.accum_steps      # a set below one batch is one smaller batch
    plan = {"budget": str(budget), "steps_per_epoch": per_epoch, "global_batch": batch, "epochs": cfg.epochs,
            "max_steps": cfg.max_steps}
    if budget.kind == "epochs":
        return plan
    if cfg.max_steps is not None:
        raise BudgetError(f"--max-steps and --budget {budget} both set how long each entry trains; give one")
    from ..runs import parse_device
    from ..train.runner import build_model, default_img_size

    img_size = cfg.img_size or default_img_size(cfg.model)
    model = build_model(cfg, data_info.num_classes, data_info.in_chans, img_size, data_info.num_frames)
    if budget.kind == "flops":
        flops = forward_flops(model, img_size, data_info.in_chans) * TRAIN_FLOPS_PER_FORWARD
        plan.update(train_flops_per_image=flops)
        steps = steps_for_budget(budget, entry.label, step_flops=flops * plan["global_batch"])
    else:
        seconds = calibrate_step_seconds(model, cfg, img_size, data_info.in_chans, data_info.num_classes,
                                         parse_device(cfg.device))
        from ..bench.env import load_average

        plan.update(step_seconds=seconds, calibrated_threads=torch.get_num_threads(),
                    calibrated_load_average_1m=load_average())
        steps = steps_for_budget(budget, entry.label, step_seconds=seconds)
    return dict(plan, max_steps=steps, epochs=-(-steps // per_epoch))


def plan_budgets(entries: Sequence[Entry], budget: Budget, out: Path, train_images: int, data_info,
                 log: Callable[..., None] = print) -> Dict[str, dict]:
    """Every entry's plan (:func:`plan_budget`), read back from ``OUT/budget.json`` where it was made
    before for this budget, so reruns and later seeds train the same number of steps. An entry whose
    model cannot be built gets ``{"error": ...}`` (its runs become failed rows); a budget below one
    step is a ``ValueError`` before anything trains."""
    path = out / BUDGET_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    known = saved.get("entries", {}) if saved.get("budget") == str(budget) else {}
    plans = {}
    for entry in entries:
        plan = known.get(entry.label)
        if plan is None or "error" in plan or (budget.kind == "epochs"):
            if budget.kind == "time":
                log(f"calibrating {entry.label}: timing training steps for --budget {budget}")
            try:
                plan = plan_budget(entry, budget, train_images, data_info)
            except BudgetError:
                raise
            except Exception as err:  # noqa: BLE001  (an entry that cannot be built fails alone)
                plan = {"budget": str(budget), "error": failed_row(entry, err)["error"]}
        plans[entry.label] = plan
    if budget.kind != "epochs":
        save_text(path, json.dumps({"budget": str(budget), "entries": plans}, indent=2))
    return plans


def _apply_plan(run: Entry, plan: dict) -> Entry:
    if "error" in plan:
        return run
    return dataclasses.replace(run, config=dataclasses.replace(run.config, epochs=plan["epochs"],
                                                               max_steps=plan["max_steps"]))


# ------------------------------------------------------------------------------------- one run
def read_result(entry: Entry, epochs: int, corrupt: Optional[dict], max_steps: Optional[int] = None) -> Optional[dict]:
    """The run's saved row if it is complete for this request (``None`` means: do the work)."""
    path = entry.run_dir / RESULT
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if row.get("status") != "ok" or not _complete(row.get("epochs"), row.get("steps"), epochs, max_steps):
        return None
    if corrupt is not None and row.get("corruption_settings") != _settings(corrupt):
        return None                        # not measured, or measured with other corruptions/severities
    # where it is now (an adopted run moved); rows written before --seeds existed have no seed
    return dict(row, run_dir=str(entry.run_dir), seed=row.get("seed", entry.config.seed))


def _complete(epochs_run, steps_run, epochs: int, max_steps: Optional[int]) -> bool:
    """The trainer's own stopping rule: all ``epochs`` ran, or ``max_steps`` steps were taken."""
    return epochs_run == epochs or (max_steps is not None and steps_run is not None and steps_run >= max_steps)


def _settings(corrupt: dict) -> dict:
    """The corruption request as stored in ``result.json`` (JSON types, so it compares after a reload)."""
    return json.loads(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in corrupt.items()}))


def _clear_unstarted(run_dir: Path) -> None:
    """A run that died before its first checkpoint holds nothing to keep: clear it so it can restart.
    A folder with sub-folders (e.g. per-seed runs) is never a run that died early, so it is kept."""
    if (run_dir.is_dir() and not (run_dir / "state.pt").exists() and not any(run_dir.glob("*.safetensors"))
            and not any(p.is_dir() for p in run_dir.iterdir())):
        shutil.rmtree(run_dir)


def train_entry(entry: Entry, log, on_epoch) -> dict:
    """Train (or resume, or read back) the entry's run; returns its ``summary.json``."""
    summary_path = entry.run_dir / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        if _complete(summary.get("epochs_run"), summary.get("steps"), entry.config.epochs, entry.config.max_steps):
            return summary
    _clear_unstarted(entry.run_dir)
    entry.config.resume = (entry.run_dir / "state.pt").is_file()
    return train(entry.config, log=log, on_epoch=on_epoch)


def measure_model(model: nn.Module, img_size: int, in_chans: int, batch_size: int, device="cpu") -> dict:
    """Cost of a model at its input size, all measured the same way for every entry: parameters,
    forward FLOPs per image, batch-1 inference latency, training throughput (images/s of one
    forward + backward at ``batch_size``, timed with :func:`vitmix.bench.time_call`) and that step's
    peak memory."""
    from ..bench.memory import peak_memory
    from ..bench.timing import time_call

    device = torch.device(device)
    model = model.to(device).eval()
    one = torch.randn(1, in_chans, img_size, img_size, device=device)
    flops = forward_flops(model, img_size, in_chans, device)
    with torch.inference_mode():
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


def budget_used(row: dict, plan: dict, history: Sequence[dict], steps: int) -> dict:
    """What the run actually used: optimizer steps, training images, seconds of its training loops
    (validation and checkpoints excluded) and training FLOPs (3 × forward per image), and its
    learning curve against images and FLOPs (the cumulative amounts at the end of each epoch)."""
    flops_per_image = TRAIN_FLOPS_PER_FORWARD * row["gflops"] * 1e9
    batch, per_epoch = plan["global_batch"], plan["steps_per_epoch"]
    images = [min((i + 1) * per_epoch, steps) * batch for i in range(len(history))]
    return {"budget": plan["budget"], "steps": steps, "images": steps * batch,
            "train_loop_seconds": sum(h["epoch_seconds"] for h in history),
            "train_flops": steps * batch * flops_per_image,
            "learning": {"images": images, "flops": [n * flops_per_image for n in images],
                         "val_acc": [h["val_acc"] for h in history]}}


def _add_budget_used(entry: Entry, row: dict, plan: dict) -> dict:
    """A ``result.json`` written before the budget columns existed gets them from its run's files."""
    try:
        steps = json.loads((entry.run_dir / "summary.json").read_text())["steps"]
        row = dict(row, **budget_used(row, plan, _history(entry.run_dir), steps))
    except (OSError, ValueError, KeyError, TypeError):
        return row                                     # shown without them ("-")
    save_text(entry.run_dir / RESULT, json.dumps(row, indent=2))
    return row


def remeasure_entry(entry: Entry, row: dict) -> dict:
    """Measure a finished entry's costs again (e.g. on a quiet machine); accuracy columns are kept."""
    from ..runs import load_weights

    checkpoint = entry.run_dir / "last.safetensors"
    _, meta = load_weights(checkpoint)
    model = load_model(checkpoint, device=entry.config.device)
    row = dict(row, **measure_model(model, int(meta["img_size"]), int(meta["in_chans"]), entry.config.batch_size,
                                    next(model.parameters()).device))
    save_text(entry.run_dir / RESULT, json.dumps(row, indent=2))
    return row


def finish_entry(entry: Entry, summary: dict, corrupt: Optional[dict], plan: Optional[dict] = None) -> dict:
    """Measure the trained run (and its corruption accuracy when asked) and write its ``result.json``."""
    from ..runs import load_weights

    checkpoint = entry.run_dir / "last.safetensors"
    _, meta = load_weights(checkpoint)
    model = load_model(checkpoint, device=entry.config.device)
    device = next(model.parameters()).device
    img_size, in_chans = int(meta["img_size"]), int(meta["in_chans"])
    history = _history(entry.run_dir)
    row = {"entry": entry.label, "kind": entry.kind, "seed": entry.config.seed, "status": "ok",
           "epochs": summary["epochs_run"], "top1": summary["final_val_acc"], "best_top1": summary["best_val_acc"],
           "logged_train_images_per_s": statistics.median(h["images_per_s"] for h in history),
           "train_seconds": summary["train_seconds"], "run_dir": str(entry.run_dir),
           "curves": {k: [h.get(k) for h in history] for k in ("train_loss", "val_loss", "val_acc")}}
    row.update(measure_model(model, img_size, in_chans, entry.config.batch_size, device))
    if plan is not None:
        row.update(budget_used(row, plan, history, summary["steps"]))
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


def failed_row(entry: Entry, err: Union[BaseException, str]) -> dict:
    """A table row for a run that could not be trained or measured (the error, not a crash)."""
    if isinstance(err, str):
        error = err
    else:
        last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
        where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        message = " ".join(str(err).split()) or type(err).__name__
        error = f"{type(err).__name__}: {message[:300]}{where}"
    return {"entry": entry.label, "kind": entry.kind, "seed": entry.seed, "status": "failed", "error": error,
            "run_dir": str(entry.run_dir)}


# ------------------------------------------------------------------------------------ the comparison
def run_compare(base: TrainConfig, mixers: Sequence[str] = (), models: Sequence[str] = (), out="runs/compare",
                corruptions: Optional[dict] = None, log: Callable[..., None] = print,
                remeasure: bool = False, seeds: Optional[Sequence[int]] = None,
                budget: Union[Budget, str] = "epochs") -> List[dict]:
    """Train and measure every entry (once per seed), then write the leaderboard and plots into ``out``.

    Args:
        base: the one recipe (model, data, epochs, seed, ...) every entry shares.
        mixers: mixers to put in ``base.model``; ``models``: whole models trained with the same recipe.
        corruptions: keyword arguments for :func:`vitmix.train.robustness.evaluate_corruptions`
            (``corruptions``, ``severities``, ``seed``) to add a corruption-accuracy column; ``None``: no column.
        remeasure: measure the cost columns of finished entries again (accuracy columns are kept).
        seeds: train every entry once per seed (runs in ``OUT/<entry>/seed-<s>/``); ``None``: once at
            ``base.seed`` in ``OUT/<entry>/``.
        budget: ``"epochs"``, ``"time=SECONDS"`` or ``"flops=N"`` (or a :class:`~vitmix.compare.budget.Budget`).
    Returns the leaderboard's rows, one per entry (mean over its seeds), best first, failed entries last.
    """
    from .leaderboard import ranked, write_leaderboard

    out, budget = Path(out), budget if isinstance(budget, Budget) else parse_budget(budget)
    check_output_dir(out, (MANIFEST,), "vitmix comparison")
    entries = plan_entries(base, mixers, models, out)
    check_manifest(out, base, seeds, budget)
    train_images, data_info = check_data(base)
    plans = plan_budgets(entries, budget, out, train_images, data_info, log)
    write_manifest(out, base, mixers, models, seeds, budget)
    if seeds is not None:
        for entry in entries:
            adopt_single_seed_run(entry, seeds)
    runs = [(_apply_plan(run, plans[e.label]), plans[e.label]) for e in entries for run in seed_runs(e, seeds)]
    rows = []
    bar = tqdm(total=sum(plan.get("epochs", 0) for _, plan in runs), desc="compare", unit="epoch",
               dynamic_ncols=True)
    try:
        for run, plan in runs:
            rows.append(_run_entry(run, plan, corruptions, bar, remeasure))
    finally:
        bar.close()
    paths = write_leaderboard(rows, out, base, seeds=seeds, budget=str(budget))
    log(f"leaderboard: {', '.join(str(p) for p in paths)}")
    return ranked(rows)


def _run_entry(entry: Entry, plan: dict, corruptions: Optional[dict], bar, remeasure: bool = False) -> dict:
    name = entry.label if entry.seed is None else f"{entry.label} (seed {entry.seed})"
    bar.set_postfix_str(name)
    if "error" in plan:
        return failed_row(entry, plan["error"])
    epochs = entry.config.epochs
    row = read_result(entry, epochs, corruptions, entry.config.max_steps)
    done = bar.n
    if row is not None and "learning" not in row:
        row = _add_budget_used(entry, row, plan)
    if row is not None and remeasure:
        row = remeasure_entry(entry, row)
    elif row is None:
        try:
            summary = train_entry(entry, log=_quiet, on_epoch=lambda _m: bar.update())
            row = finish_entry(entry, summary, corruptions, plan)
            bar.write(f"{name}: top-1 {row['top1']:.2f}% after {plural(row['epochs'], 'epoch')} ({entry.run_dir})")
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001  (any failure becomes a row, the others still run)
            row = failed_row(entry, err)
            bar.write(f"{name}: failed: {row['error']}")
    bar.update(done + epochs - bar.n)
    return row


def _quiet(*_args, **_kwargs) -> None:
    """Each run's own epoch lines would interleave with the comparison's bar; its files keep them."""
