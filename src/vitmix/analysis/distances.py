"""``vitmix analyze distances``: query–key distance distributions per layer, with tail statistics.

LaplacianFormer motivates the L1 (Laplacian) kernel by the heavy-tailed distribution of query–key
distances: a Gaussian kernel ``exp(-‖q−k‖²/2)`` of a heavy-tailed squared distance sends most
entries to ~0, a Laplacian kernel of the L1 distance decays more gently. This analysis runs real
images (digits / Fashion-MNIST) through a model — untrained, or trained via ``--checkpoint`` —
captures each attention layer's input, projects it to the layer's own ``q`` and ``k`` (raw, before
any kernel scaling) and collects, per layer, all ``‖q_i − k_j‖²₂`` and ``‖q_i − k_j‖₁`` over
images, heads and token pairs. Reported per layer: mean, std, excess kurtosis (0 for a Gaussian),
the 50/90/99/99.9 % quantiles and ``q99.9 / median``.
"""
from __future__ import annotations


from typing import List, Optional

import torch

from ._common import (
    build_model, capture_mixer_inputs, load_images, pyplot, query_key_value, save_figure, write_table,
)


def tail_stats(values: torch.Tensor) -> dict:
    """Mean, std, excess kurtosis and upper quantiles of a 1-D sample."""
    v = values.double().flatten()
    mean = v.mean()
    centred = v - mean
    var = centred.pow(2).mean()
    kurt = float(centred.pow(4).mean() / var.pow(2) - 3.0) if var > 0 else float("nan")
    qs = torch.quantile(v, torch.tensor([0.5, 0.9, 0.99, 0.999], dtype=v.dtype))
    return {"mean": float(mean), "std": float(var.sqrt()), "excess_kurtosis": kurt,
            "q50": float(qs[0]), "q90": float(qs[1]), "q99": float(qs[2]), "q99.9": float(qs[3]),
            "q99.9/median": float(qs[3] / qs[0]) if qs[0] > 0 else float("nan")}


@torch.no_grad()
def pairwise_distances(q: torch.Tensor, k: torch.Tensor, max_values: int = 400_000, seed: int = 0):
    """Flattened squared-L2 and L1 distances between all query/key pairs of ``(B, H, N, d)`` tensors.

    At most ``max_values`` pairs are kept (a fixed random subset) to bound memory.
    """
    q, k = q.double(), k.double()
    l2 = torch.cdist(q, k, p=2.0).pow(2).flatten()
    l1 = torch.cdist(q, k, p=1.0).flatten()
    if l2.numel() > max_values:
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(l2.numel(), generator=g)[:max_values]
        l2, l1 = l2[idx], l1[idx]
    return l2, l1


def run(out: str, model: str = "vit_tiny_patch4_32", img_size: int = 32, images: int = 16, source: str = "auto",
        checkpoint: Optional[str] = None, mixer: Optional[str] = None, seed: int = 0, bins: int = 80,
        command: Optional[str] = None) -> List[str]:
    """Run the analysis and write ``distances.{png,csv,json,md}`` into ``out``; return the paths."""
    imgs, desc = load_images(images, img_size, source, seed)
    net = build_model(model, img_size, mixer=mixer, checkpoint=checkpoint, seed=seed)
    layers = capture_mixer_inputs(net, imgs)
    rows, series = [], []
    for i, (name, layer, x) in enumerate(layers):
        q, k, _ = query_key_value(layer, x)
        l2, l1 = pairwise_distances(q, k, seed=seed + i)
        for metric, vals in (("L2^2", l2), ("L1", l1)):
            rows.append({"layer": i, "module": name, "distance": metric, **tail_stats(vals)})
        series.append((i, l2, l1))

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    cmap = plt.get_cmap("viridis")
    for ax, metric, idx in ((axes[0], "squared L2 distance ‖q−k‖²", 1), (axes[1], "L1 distance ‖q−k‖₁", 2)):
        for j, (i, *vals) in enumerate(series):
            v = vals[idx - 1]
            v = (v / v.median().clamp_min(1e-12)).float().numpy()
            k_ex = next(r["excess_kurtosis"] for r in rows if r["layer"] == i and r["distance"] ==
                        ("L2^2" if idx == 1 else "L1"))
            ax.hist(v, bins=bins, density=True, histtype="step", lw=1.4,
                    color=cmap(j / max(len(series) - 1, 1)), label=f"layer {i} (kurtosis {k_ex:.1f})")
        ax.set_yscale("log")
        ax.set_xlabel(f"{metric} / layer median")
        ax.set_ylabel("density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ckpt = f"checkpoint {checkpoint}" if checkpoint else "untrained weights (seed %d)" % seed
    fig.suptitle(f"query–key distances per layer: {model}, {ckpt}\n{desc}", fontsize=10)
    fig_path = save_figure(fig, out, "distances.png")
    notes = [f"model {model} at {img_size}x{img_size}, {ckpt}; images: {desc}",
             "q, k are each layer's own projections of its input (no kernel scaling); distances over all "
             "images, heads and token pairs (random subset of at most 400k pairs per layer)",
             "excess kurtosis is 0 for a Gaussian sample; larger values mean heavier tails"]
    files = write_table(rows, out, "distances", "Query–key distance statistics per layer", notes, fig_path,
                        command)
    return files + [fig_path]


__all__ = ["run", "tail_stats", "pairwise_distances"]

