"""``curves.png``: loss and accuracy per epoch."""
from __future__ import annotations

from pathlib import Path
from typing import List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def plot_curves(history: List[dict], path: Path, title: str = "") -> None:
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
