"""The leaderboard of a comparison: ``leaderboard.md``/``.csv``/``.json``, ``runs.csv`` and three plots.

Every function here takes the per-run rows (one per entry and seed, as :mod:`vitmix.compare.runner`
writes them to ``result.json``) and aggregates them with :func:`vitmix.compare.aggregate.aggregate`.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import List, Optional, Sequence

from .._util import MissingExtra, markdown_table, pyplot, write_csv
from ..runs import save_text
from .aggregate import MEAN_KEYS, NOISE_P, aggregate, mark_noise, mean_curve


def _plt():
    return pyplot("the comparison's plots")


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))

# (key in a row, column title, format); "n" and "vs #1" appear with several seeds, the corruption
# column only when measured.
COLUMNS = (
    ("rank", "#", "{}"),
    ("entry", "entry", "{}"),
    ("top1", "top-1 %", "{:.2f}"),
    ("best_top1", "best %", "{:.2f}"),
    ("corruption_acc", "corrupted %", "{:.2f}"),
    ("n", "n", "{}"),
    ("p_vs_best", "vs #1", "{}"),
    ("params", "params", "{}"),
    ("gflops", "GFLOPs/img", "{:.4f}"),
    ("train_images_per_s", "train img/s", "{:.0f}"),
    ("latency_ms", "latency ms (b=1)", "{:.2f}"),
    ("peak_train_mb", "peak train MB", "{:.1f}"),
    ("steps", "steps", "{:.0f}"),
    ("images", "train images", "{:.0f}"),
    ("train_loop_seconds", "train s", "{:.1f}"),
    ("train_flops", "train FLOPs", "{:.3g}"),
    ("status", "status", "{}"),
)
#: One row per run in ``runs.csv``: every seed's own numbers.
RUN_COLUMNS = ("entry", "seed", "status", "top1", "best_top1", "corruption_acc", "params", "gflops",
               "train_images_per_s", "latency_ms", "peak_train_mb", "steps", "images", "train_loop_seconds",
               "train_flops", "budget", "error", "run_dir")


def _entry_rows(rows: Sequence[dict]) -> List[dict]:
    """Per-entry rows from per-run rows (rows that are already per-entry pass through)."""
    return list(rows) if rows and all("runs" in r for r in rows) else aggregate(rows)


def ranked(rows: Sequence[dict]) -> List[dict]:
    """One row per entry, best mean top-1 first (ranked 1, 2, ...), failed entries last (rank ``-``),
    with Welch's p against #1 and ``within_noise`` (:func:`vitmix.compare.aggregate.mark_noise`)."""
    entries = _entry_rows(rows)
    ok = sorted((r for r in entries if r["status"] == "ok"), key=lambda r: -r["top1"])
    failed = [r for r in entries if r["status"] != "ok"]
    return mark_noise([dict(r, rank=i + 1) for i, r in enumerate(ok)] + [dict(r, rank="-") for r in failed])


def _several_seeds(rows: Sequence[dict]) -> bool:
    return any(len(r.get("runs", ())) > 1 for r in rows)


def _columns(rows: Sequence[dict]):
    measured_corruption = any("corruption_acc" in r for r in rows)
    several = _several_seeds(rows)
    return [c for c in COLUMNS if (c[0] != "corruption_acc" or measured_corruption)
            and (c[0] not in ("n", "p_vs_best") or several)]


def _number(value, fmt: str, key: str) -> str:
    if key == "params":
        return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k"
    return fmt.format(value)


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if key == "p_vs_best":
        return _noise_cell(row)
    if key == "status":
        return _status_cell(row)
    if value is None:
        return "-"
    text = _number(value, fmt, key)
    std = row.get(f"{key}_std")
    spread = _number(std, fmt, key) if key in MEAN_KEYS and std else None
    if spread is not None and spread != _number(0, fmt, key):   # no "± 0" where the seeds agree to the digits shown
        text += f" ± {spread}"
    return text


def _noise_cell(row: dict) -> str:
    if row.get("rank") == 1:
        return "best"
    p = row.get("p_vs_best")
    if p is None:
        return "-"
    return f"≈ (p {p:.2f})" if row.get("within_noise") else f"p {p:.3f}"


def _status_cell(row: dict) -> str:
    error = row.get("error", "").replace("|", "\\|")
    if row.get("status") != "ok":
        return f"failed: {error}"
    failed = row.get("failed_seeds") or []
    if failed:
        seeds = ", ".join(str(s) for s in failed)
        return f"ok; seed {seeds} failed: {error}"
    return "ok"


def markdown(rows: Sequence[dict], title: str, notes: Sequence[str] = ()) -> str:
    """The leaderboard as a markdown table (best mean top-1 first, failed entries last with their error)."""
    entries = ranked(rows)
    cols = _columns(entries)
    table = markdown_table([c[1] for c in cols], [[_cell(r, key, fmt) for key, _, fmt in cols] for r in entries])
    return "\n".join([f"# {title}", "", *notes, "", table]) + "\n"


def write_csv_table(rows: Sequence[dict], path: Path) -> Path:
    """The leaderboard as CSV with raw numbers (no unit formatting), one row per entry: each mean
    followed by its ``_std`` over the seeds; ``runs.csv`` (:func:`write_runs_csv`) has every seed's."""
    entries = ranked(rows)
    columns = []
    for key, _, _ in _columns(entries):
        columns += [key, f"{key}_std"] if key in MEAN_KEYS else [key]
    columns += [c for c in ("n", "within_noise", "error", "run_dir") if c not in columns]
    write_csv(path, entries, columns)
    return path


def write_runs_csv(rows: Sequence[dict], path: Path) -> Path:
    """One CSV row per run (entry and seed) with that run's own numbers."""
    write_csv(path, [run for r in ranked(rows) for run in r["runs"]], RUN_COLUMNS)
    return path


def _colors(rows: Sequence[dict]) -> dict:
    """One distinct colour per entry, the same in every plot (tab10 up to 10 entries, else tab20)."""
    size = 10 if len(rows) <= 10 else 20
    cmap = _plt().get_cmap(f"tab{size}")
    return {r["entry"]: cmap(i % size) for i, r in enumerate(rows)}


def _ok_runs(row: dict) -> List[dict]:
    return [r for r in row.get("runs", [row]) if r.get("status") == "ok"]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def plot_accuracy_vs_throughput(rows: Sequence[dict], path: Path) -> Optional[Path]:
    """Top-1 against training throughput: each seed a faint point, each entry its mean with ± std bars."""
    entries = ranked(rows)
    ok = [r for r in entries if r["status"] == "ok"]
    if not ok:
        return None
    fig, ax = _plt().subplots(figsize=(7, 5))
    colors = _colors(entries)
    for r in ok:
        color = colors[r["entry"]]
        runs = _ok_runs(r)
        if len(runs) > 1:
            ax.scatter([x["train_images_per_s"] for x in runs], [x["top1"] for x in runs], s=14, alpha=0.35,
                       color=color)
        ax.errorbar(r["train_images_per_s"], r["top1"], yerr=r.get("top1_std"), xerr=r.get("train_images_per_s_std"),
                    fmt="o", ms=6, capsize=3, color=color)
        ax.annotate(r["entry"], (r["train_images_per_s"], r["top1"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    seeds = " (mean ± std over seeds; faint: each seed)" if _several_seeds(ok) else ""
    ax.set(xlabel="training throughput (images/s)", ylabel="top-1 accuracy (%)",
           title="accuracy vs throughput" + seeds)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_loss_curves(rows: Sequence[dict], path: Path) -> Optional[Path]:
    """Training loss, validation loss and top-1 per epoch of every entry (mean over seeds, ± std bars)."""
    entries = ranked(rows)
    ok = [r for r in entries if r["status"] == "ok"]
    if not ok:
        return None
    fig, axes = _plt().subplots(1, 3, figsize=(15, 4.5))
    colors = _colors(entries)
    for key, ax, title in zip(("train_loss", "val_loss", "val_acc"), axes,
                              ("training loss", "validation loss", "validation top-1 (%)")):
        for r in ok:
            xs, means, stds = mean_curve(_ok_runs(r), "epoch", key, group="curves")
            ax.errorbar(xs, means, yerr=stds if any(stds) else None, fmt="o-", ms=3, capsize=2, label=r["entry"],
                        color=colors[r["entry"]])
        ax.set(xlabel="epoch", title=title)
        _integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def plot_learning_curves(rows: Sequence[dict], path: Path) -> Optional[Path]:
    """Validation top-1 at the end of each epoch against the training images and the training FLOPs
    used so far, every entry in both panels (mean over seeds, ± std bars)."""
    entries = ranked(rows)
    ok = [r for r in entries if r["status"] == "ok" and any(x.get("learning") for x in _ok_runs(r))]
    if not ok:
        return None
    fig, axes = _plt().subplots(1, 2, figsize=(13, 4.8))
    colors = _colors(entries)
    for ax, x_key, label in zip(axes, ("images", "flops"),
                                ("training images seen", "training FLOPs (3 × forward per image)")):
        for r in ok:
            xs, means, stds = mean_curve(_ok_runs(r), x_key)
            ax.errorbar(xs, means, yerr=stds if any(stds) else None, fmt="o-", ms=3, capsize=2, label=r["entry"],
                        color=colors[r["entry"]])
        ax.set(xlabel=label, ylabel="validation top-1 (%)", xscale="log")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_title("accuracy vs training images")
    axes[1].set_title("accuracy vs training compute")
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def _budget_note(budget: str, recipe: dict) -> str:
    if budget.startswith("flops="):
        return (f"Budget `--budget {budget}`: each entry trains floor(N / (3 × forward FLOPs per image × batch)) "
                "optimizer steps, with the LR schedule laid over them, so every entry uses the same training FLOPs "
                "(within one step); steps, train images and train FLOPs say what each used.")
    if budget.startswith("time="):
        return (f"Budget `--budget {budget}`: each entry's seconds per training step were measured once, before "
                "any training (`budget.json`), and the budget converted to that many steps (schedule laid over "
                "them); train s is the time its training loops then took (validation excluded).")
    return (f"Budget `--budget epochs`: {recipe.get('epochs')} epochs for every entry; steps, train images, train s "
            "(training loops, validation excluded) and train FLOPs (3 × forward per image) say what each used.")


def _seed_note(seeds: Optional[Sequence[int]]) -> List[str]:
    if not seeds or len(seeds) < 2:
        return []
    return [f"Seeds {', '.join(map(str, seeds))} (each seed also draws its own --train-subset and shuffle): "
            "numbers are mean ± sample std over the n seeds that trained; vs #1 is Welch's t-test on top-1 "
            f"against the best entry, `≈` marking p > {NOISE_P} (within noise; needs n ≥ 2 on both sides). "
            "Every seed's numbers: `runs.csv` and `leaderboard.json`."]


def write_leaderboard(rows: Sequence[dict], out, base=None, environment: Optional[dict] = None,
                      seeds: Optional[Sequence[int]] = None, budget: str = "epochs") -> List[Path]:
    """Write ``leaderboard.md``, ``.csv``, ``.json``, ``runs.csv`` and the plots into ``out``; returns the paths."""
    from ..bench.env import environment as machine

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment or machine()
    recipe = base.to_dict() if base is not None else {}
    seed_text = f"seeds {', '.join(map(str, seeds))}" if seeds else f"seed {recipe.get('seed')}"
    notes = ([f"Model `{recipe.get('model')}` on `{recipe.get('data')}`, {seed_text}, the same recipe for every "
              "entry (`compare.yaml`).", _budget_note(budget, recipe), *_seed_note(seeds),
              f"{env['device_name']}, {env['torch_threads']} threads, 1-min load {env['load_average_1m']}, torch "
              f"{env['torch']}, {env['date_utc']}. Train img/s (one forward + backward at the training batch size) "
              "and batch-1 latency are medians of timed calls on this machine under that load; FLOPs are forward "
              "FLOPs per image (1 multiply-accumulate = 2); peak train MB is that training step's peak memory."]
             if recipe else [])
    settings = next((r["corruption_settings"] for r in rows if r.get("corruption_settings")), None)
    if settings:
        names = settings["corruptions"]
        notes.append(f"corrupted %: mean top-1 over {len(names)} corruptions ({', '.join(names)}) at severities "
                     f"{', '.join(map(str, settings['severities']))} on "
                     f"{settings.get('images') or 'all'} validation images, seed {settings['seed']} "
                     "(`vitmix eval --corruptions`; each entry's table in its run directory).")
    title = "Leaderboard" + (f": {recipe.get('model')} on {recipe.get('data')}" if recipe else "")
    paths = [out / "leaderboard.md", out / "leaderboard.csv", out / "leaderboard.json", out / "runs.csv"]
    save_text(paths[0], markdown(rows, title, notes))
    write_csv_table(rows, paths[1])
    save_text(paths[2], json.dumps({"recipe": recipe, "environment": env, "budget": budget,
                                    "seeds": None if seeds is None else list(seeds), "noise_p": NOISE_P,
                                    "rows": ranked(rows)}, indent=2))
    write_runs_csv(rows, paths[3])
    try:
        for plot, name in ((plot_accuracy_vs_throughput, "accuracy_vs_throughput.png"),
                           (plot_loss_curves, "loss_curves.png"), (plot_learning_curves, "learning_curves.png")):
            written = plot(rows, out / name)
            if written is not None:
                paths.append(written)
    except MissingExtra as err:        # the tables are the result; the plots need the `plot` extra
        warnings.warn(f"{err}; the leaderboard is written without its plots", UserWarning, stacklevel=2)
    return paths
