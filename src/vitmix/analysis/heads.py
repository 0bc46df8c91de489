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

import os
from typing import List, Optional


from ._common import build_model, grid_of, load_images, pyplot, write_table


def run(out: str, model: str = "vit_nano_patch4_32", img_size: int = 64, images: int = 8, source: str = "auto",
        measure: str = "cka", seed: int = 0, checkpoint: Optional[str] = None, mixer_options: Optional[dict] = None,
        command: Optional[str] = None) -> List[str]:
    """Run the analysis and write ``heads.{png,csv,json,md}`` into ``out``; return the paths."""
    from . import fibottention as fa

    imgs, desc = load_images(images, img_size, source, seed)
    soft = build_model(model, img_size, mixer="softmax", checkpoint=checkpoint, seed=seed)
    fib = build_model(model, img_size, mixer="fibottention", mixer_options=mixer_options, seed=seed)
    own = fib.state_dict()
    fib.load_state_dict({k: v for k, v in soft.state_dict().items() if k in own and own[k].shape == v.shape},
                        strict=False)
    prefix, gh, gw = grid_of(fib)
    n = gh * gw
    table = fa.model_interaction_table(fib, n, prefix)
    if not table:
        raise ValueError(f"model {model!r} built with mixer='fibottention' has no Fibottention layers")
    layers = sorted({r["layer"] for r in table})
    div_fib = fa.model_head_diversity(fib, imgs, measure)
    div_soft = fa.model_head_diversity(soft, imgs, measure)
    first = fa.fibottention_layers(fib)[0]
    offsets = first.head_offsets(n)
    overlap = fa.offset_overlap(offsets)
    overlap_pairs = fa.offset_overlap(offsets, n, by="pairs")
    h = overlap.shape[0]
    off_diag = (overlap.sum() - overlap.diagonal().sum()) / max(h * (h - 1), 1)
    off_diag_pairs = (overlap_pairs.sum() - overlap_pairs.diagonal().sum()) / max(h * (h - 1), 1)

    rows = []
    for pos, layer in enumerate(layers):
        lr = [r for r in table if r["layer"] == layer]
        rows.append({
            "layer": layer,
            "fib_interaction_patch": sum(r["patch_fraction"] for r in lr) / len(lr),
            "fib_interaction_with_cls": sum(r["with_prefix_fraction"] for r in lr) / len(lr),
            "softmax_interaction": 1.0,
            "fib_head_diversity": div_fib[pos]["diversity"] if pos < len(div_fib) else float("nan"),
            "softmax_head_diversity": div_soft[pos]["diversity"] if pos < len(div_soft) else float("nan"),
        })

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    ax = axes[0]
    ax.plot(layers, [r["fib_interaction_patch"] for r in rows], "o-", label="fibottention (patch block)")
    ax.plot(layers, [r["fib_interaction_with_cls"] for r in rows], "s--", label="fibottention (with CLS)")
    ax.plot(layers, [1.0] * len(layers), "k:", label="softmax")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of token pairs computed (mean over heads)")
    ax.set_title(f"interaction fraction, N={n}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax = axes[1]
    im = ax.imshow(overlap_pairs.numpy(), vmin=0, vmax=1, cmap="viridis")
    ax.set_title(f"layer {layers[0]} head overlap (Jaccard of covered pairs)\nmean off-diagonal "
                 f"{float(off_diag_pairs):.3f}; offset sets {float(off_diag):.3f}", fontsize=9)
    ax.set_xticks(range(h))
    ax.set_yticks(range(h))
    ax.set_xlabel("head")
    ax.set_ylabel("head")
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax = axes[2]
    ax.plot(layers, [r["fib_head_diversity"] for r in rows], "o-", label="fibottention")
    ax.plot(layers, [r["softmax_head_diversity"] for r in rows], "s--", label="softmax")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"head diversity (1 − mean pairwise {measure.upper()})")
    ax.set_title("head-output diversity on real images")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ck = f"checkpoint {checkpoint}" if checkpoint else "untrained, shared weights"
    fig.suptitle(f"{model} @ {img_size}px ({gh}x{gw} patches), {ck}; {desc}", fontsize=9)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    fig_path = os.path.join(out, "heads.png")
    fig.savefig(fig_path, dpi=110)
    plt.close(fig)
    notes = [f"model {model} at {img_size}x{img_size} ({n} patches + {prefix} prefix), {ck}; images: {desc}",
             f"first-layer offset overlap (Jaccard, mean over head pairs): offset sets {float(off_diag):.4f}, "
             f"covered token pairs {float(off_diag_pairs):.4f}",
             f"head diversity = 1 - mean off-diagonal linear {measure.upper()} of the heads' outputs"]
    files = write_table(rows, out, "heads", "Fibottention heads vs softmax", notes, fig_path, command)
    return files + [fig_path]


__all__ = ["run"]
