"""``vitmix analyze heads``: Fibottention's sparsity, head overlap and head diversity vs softmax.

Two copies of one backbone (default ``vit_nano_patch4_32`` at 64×64) with identical weights — one
with softmax attention, one with the ``fibottention`` mixer — see the same real images. Reported:

- **interaction fraction** per layer: the share of token pairs each head computes (patch block,
  and with the CLS row/column), from :func:`vitmix.analysis.fibottention.model_interaction_table`;
  softmax computes all of them (1.0);
- **offset overlap**: Jaccard overlap of the heads' offset sets (and of the token pairs they
  cover), first layer, from :func:`~vitmix.analysis.fibottention.offset_overlap`;
- **head-output diversity** per layer: 1 − mean pairwise linear CKA of the heads' outputs, from
  :func:`~vitmix.analysis.fibottention.model_head_diversity`, for both models.
"""
from __future__ import annotations

from typing import List, Optional

from ._common import (
    build_model, copy_matching, grid_of, load_images, model_input, pyplot, save_figure, write_table,
)


def run(out: str, model: str = "vit_nano_patch4_32", img_size: int = 64, images: int = 8, source: str = "auto",
        measure: str = "cka", seed: int = 0, checkpoint: Optional[str] = None, mixer_options: Optional[dict] = None,
        command: Optional[str] = None) -> List[str]:
    """Run the analysis and write ``heads.{png,csv,json,md}`` into ``out``; return the paths."""
    from . import fibottention as fa

    imgs, desc = load_images(images, img_size, source, seed)
    soft = build_model(model, img_size, mixer="softmax", checkpoint=checkpoint, seed=seed)
    fib = build_model(model, img_size, mixer="fibottention", mixer_options=mixer_options, seed=seed,
                      checkpoint=checkpoint, weights=False)
    copy_matching(fib, soft)
    imgs = model_input(imgs, soft)
    prefix, gh, gw = grid_of(fib)
    n = gh * gw
    table = fa.model_interaction_table(fib, n, prefix)
    if not table:
        raise ValueError(f"model {model!r} built with mixer='fibottention' has no Fibottention layers")
    rows = _layer_rows(table, fa.model_head_diversity(fib, imgs, measure), fa.model_head_diversity(soft, imgs, measure))
    overlap = _first_layer_overlap(fa.fibottention_layers(fib)[0], n)
    ck = f"checkpoint {checkpoint}" if checkpoint else "untrained, shared weights"
    fig_path = _figure(rows, overlap, n, measure, f"{model} @ {img_size}px ({gh}x{gw} patches), {ck}; {desc}", out)
    notes = [f"model {model} at {img_size}x{img_size} ({n} patches + {prefix} prefix), {ck}; images: {desc}",
             f"first-layer offset overlap (Jaccard, mean over head pairs): offset sets {overlap['sets']:.4f}, "
             f"covered token pairs {overlap['pairs']:.4f}",
             f"head diversity = 1 - mean off-diagonal linear {measure.upper()} of the heads' outputs"]
    files = write_table(rows, out, "heads", "Fibottention heads vs softmax", notes, fig_path, command)
    return files + [fig_path]


def _layer_rows(table: List[dict], div_fib: List[dict], div_soft: List[dict]) -> List[dict]:
    """Per layer: Fibottention's mean interaction fractions over heads and both models' head diversity."""
    rows = []
    for pos, layer in enumerate(sorted({r["layer"] for r in table})):
        lr = [r for r in table if r["layer"] == layer]
        rows.append({
            "layer": layer,
            "fib_interaction_patch": sum(r["patch_fraction"] for r in lr) / len(lr),
            "fib_interaction_with_cls": sum(r["with_prefix_fraction"] for r in lr) / len(lr),
            "softmax_interaction": 1.0,
            "fib_head_diversity": div_fib[pos]["diversity"] if pos < len(div_fib) else float("nan"),
            "softmax_head_diversity": div_soft[pos]["diversity"] if pos < len(div_soft) else float("nan"),
        })
    return rows


def _first_layer_overlap(layer, n: int) -> dict:
    """Head-by-head Jaccard overlap of one layer's offset sets and covered token pairs, and the mean
    of each over head pairs (the diagonal left out)."""
    from . import fibottention as fa

    offsets = layer.head_offsets(n)
    by_pairs = fa.offset_overlap(offsets, n, by="pairs")
    overlap = fa.offset_overlap(offsets)
    h = overlap.shape[0]

    def off_diagonal_mean(m):
        return float((m.sum() - m.diagonal().sum()) / max(h * (h - 1), 1))

    return {"matrix": by_pairs, "heads": h, "sets": off_diagonal_mean(overlap), "pairs": off_diagonal_mean(by_pairs)}


def _figure(rows: List[dict], overlap: dict, n: int, measure: str, title: str, out: str) -> str:
    """Interaction fraction, first-layer head overlap and head diversity side by side; returns the path."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    layers = [r["layer"] for r in rows]
    ax = axes[0]
    ax.plot(layers, [r["fib_interaction_patch"] for r in rows], "o-", label="fibottention (patch block)")
    ax.plot(layers, [r["fib_interaction_with_cls"] for r in rows], "s--", label="fibottention (with CLS)")
    ax.plot(layers, [1.0] * len(layers), "k:", label="softmax")
    ax.set(yscale="log", xlabel="layer", ylabel="fraction of token pairs computed (mean over heads)",
           title=f"interaction fraction, N={n}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax, h = axes[1], overlap["heads"]
    im = ax.imshow(overlap["matrix"].numpy(), vmin=0, vmax=1, cmap="viridis")
    ax.set_title(f"layer {layers[0]} head overlap (Jaccard of covered pairs)\nmean off-diagonal "
                 f"{overlap['pairs']:.3f}; offset sets {overlap['sets']:.3f}", fontsize=9)
    ax.set(xticks=range(h), yticks=range(h), xlabel="head", ylabel="head")
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax = axes[2]
    ax.plot(layers, [r["fib_head_diversity"] for r in rows], "o-", label="fibottention")
    ax.plot(layers, [r["softmax_head_diversity"] for r in rows], "s--", label="softmax")
    ax.set(xlabel="layer", ylabel=f"head diversity (1 − mean pairwise {measure.upper()})",
           title="head-output diversity on real images")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, out, "heads.png")


__all__ = ["run"]
