"""The leaderboard of a comparison: ``leaderboard.md``/``.csv``/``.json`` and two plots."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .._util import markdown_table, write_csv  # noqa: E402
from ..train.checkpoint import save_text  # noqa: E402

# (key in a row, column title, format); the corruption column appears only when measured.
COLUMNS = (
    ("rank", "#", "{}"),
    ("entry", "entry", "{}"),
    ("top1", "top-1 %", "{:.2f}"),
    ("best_top1", "best %", "{:.2f}"),
    ("corruption_acc", "corrupted %", "{:.2f}"),
    ("params", "params", "{}"),
    ("gflops", "GFLOPs/img", "{:.4f}"),
    ("train_images_per_s", "train img/s", "{:.0f}"),
    ("latency_ms", "latency ms (b=1)", "{:.2f}"),
    ("peak_train_mb", "peak train MB", "{:.1f}"),
    ("status", "status", "{}"),
)


def _ranked(rows: Sequence[dict]) -> List[dict]:
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["top1"])
    failed = [r for r in rows if r["status"] != "ok"]
    return [dict(r, rank=i + 1) for i, r in enumerate(ok)] + [dict(r, rank="-") for r in failed]


def _columns(rows: Sequence[dict]):
    measured_corruption = any("corruption_acc" in r for r in rows)
    return [c for c in COLUMNS if c[0] != "corruption_acc" or measured_corruption]


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key == "params":
        return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k"
    if key == "status" and value != "ok":
        return f"failed: {row.get('error', '')}".replace("|", "\\|")
    return fmt.format(value)


def markdown(rows: Sequence[dict], title: str, notes: Sequence[str] = ()) -> str:
    """The leaderboard as a markdown table (best top-1 first, failed entries last with their error)."""
    cols = _columns(rows)
    table = markdown_table([c[1] for c in cols], [[_cell(r, key, fmt) for key, _, fmt in cols] for r in _ranked(rows)])
    return "\n".join([f"# {title}", "", *notes, "", table]) + "\n"


def write_csv_table(rows: Sequence[dict], path: Path) -> Path:
    """The leaderboard as CSV with raw numbers (no unit formatting), one row per entry."""
    write_csv(path, _ranked(rows), [c[0] for c in _columns(rows)] + ["error", "run_dir"])
    return path


def _colors(rows: Sequence[dict]) -> dict:
    """One distinct colour per entry, the same in every plot (tab20: distinct up to 20 entries)."""
    cmap = plt.get_cmap("tab20")
    return {r["entry"]: cmap(i % 20) for i, r in enumerate(rows)}


def plot_accuracy_vs_throughput(rows: Sequence[dict], path: Path) -> Optional[Path]:
    """Top-1 against training throughput, one labelled point per entry that trained."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(7, 5))
    colors = _colors(rows)
    for r in ok:
        ax.scatter(r["train_images_per_s"], r["top1"], s=40, color=colors[r["entry"]])
        ax.annotate(r["entry"], (r["train_images_per_s"], r["top1"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    ax.set(xlabel="training throughput (images/s)", ylabel="top-1 accuracy (%)", title="accuracy vs throughput")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loss_curves(rows: Sequence[dict], path: Path) -> Optional[Path]:
    """Training and validation loss per epoch of every entry, on one chart each."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = _colors(rows)
    for key, ax, title in zip(("train_loss", "val_loss", "val_acc"), axes,
                              ("training loss", "validation loss", "validation top-1 (%)")):
        for r in ok:
            values = r["curves"][key]
            ax.plot(range(1, len(values) + 1), values, "o-", ms=3, label=r["entry"], color=colors[r["entry"]])
        ax.set(xlabel="epoch", title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_leaderboard(rows: Sequence[dict], out, base=None, environment: Optional[dict] = None) -> List[Path]:
    """Write ``leaderboard.md``, ``.csv``, ``.json`` and the two plots into ``out``; returns the paths."""
    from ..bench.env import environment as machine

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment or machine()
    recipe = base.to_dict() if base is not None else {}
    notes = ([f"Model `{recipe.get('model')}` on `{recipe.get('data')}`, {recipe.get('epochs')} epochs, seed "
             f"{recipe.get('seed')}, the same recipe for every entry (`compare.yaml`).",
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
    paths = [out / "leaderboard.md", out / "leaderboard.csv", out / "leaderboard.json"]
    save_text(paths[0], markdown(rows, title, notes))
    write_csv_table(rows, paths[1])
    save_text(paths[2], json.dumps({"recipe": recipe, "environment": env, "rows": _ranked(rows)}, indent=2))
    for plot, name in ((plot_accuracy_vs_throughput, "accuracy_vs_throughput.png"),
                       (plot_loss_curves, "loss_curves.png")):
        written = plot(rows, out / name)
        if written is not None:
            paths.append(written)
    return paths
