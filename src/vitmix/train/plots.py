"""``curves.png``: loss and accuracy per epoch.

matplotlib is the ``plot`` extra: without it a run trains and saves as usual and only its
``curves.png`` is skipped, with one warning naming the extra.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import List

from .._util import MissingExtra, pyplot


def __getattr__(name: str):
    if name == "plt":          # `from .plots import plt` of the plotting code: imported on first use
        return pyplot("plotting")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plot_curves(history: List[dict], path: Path, title: str = "") -> None:
    """Train/val loss and accuracy per epoch into ``path`` (skipped, with a warning, without matplotlib)."""
    try:
        plt = pyplot(f"{Path(path).name}")
    except MissingExtra as err:
        warnings.warn(f"{err}; the run is saved without it", UserWarning, stacklevel=2)
        return
    from matplotlib.ticker import MaxNLocator

    epochs = [h["epoch"] for h in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    ax_loss.plot(epochs, [h["val_loss"] for h in history], "s-", label="val")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    train_acc = [h["train_acc"] for h in history]
    if all(a is not None for a in train_acc):
        ax_acc.plot(epochs, train_acc, "o-", label="train")
    ax_acc.plot(epochs, [h["val_acc"] for h in history], "s-", label="val")
    ax_acc.set(xlabel="epoch", ylabel="top-1 accuracy (%)", title="accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
