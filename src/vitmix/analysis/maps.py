"""``vitmix analyze maps``: one query's attention map for every mixer, on one real image, in one figure.

Every mixer is put into the same backbone (default ``vit_nano_patch4_32`` at 64×64, a 16×16 patch
grid); all weights whose names and shapes match are copied from the softmax model, so the maps
differ only by how each mixer turns the same inputs into token weights. The maps come from each
mixer's ``attention_map(x)`` (the effective ``(B, heads, N, N)`` weights; kernel mixers are
unnormalised and may be negative) at the first block, for the query patch ``--query row,col``.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from ._common import (
    build_model, capture_mixer_inputs, copy_matching, grid_of, load_images, pyplot, save_figure, write_table,
)


def mixers_with_maps(names: Optional[Sequence[str]] = None) -> List[str]:
    """Registered mixers that implement ``attention_map`` (or check the given names)."""
    from ..mixers import get_mixer_class, list_mixers
    from ..mixers.base import TokenMixer

    chosen = list(names) if names else list_mixers()
    out = []
    for n in chosen:
        cls = get_mixer_class(n)  # ValueError with close matches
        if cls.attention_map is TokenMixer.attention_map:
            if names:
                raise ValueError(f"mixer {n!r} has no attention_map(); choose from "
                                 + ", ".join(mixers_with_maps()))
            continue
        out.append(cls.mixer_name)
    if "softmax" in out:
        out.remove("softmax")
    return ["softmax"] + out


def map_stats(row: torch.Tensor, h: int, w: int, qr: int, qc: int) -> dict:
    """Summary numbers of one query's ``(heads, H*W)`` weight rows (averaged over heads)."""
    r = row.double()
    total = r.sum(-1)
    mass = r.abs()
    p = mass / mass.sum(-1, keepdim=True).clamp_min(1e-300)
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1) / math.log(h * w)
    grid = mass.reshape(-1, h, w)
    near = grid[:, max(qr - 1, 0): qr + 2, max(qc - 1, 0): qc + 2].sum((-1, -2)) / mass.sum(-1).clamp_min(1e-300)
    neg = (r.clamp_max(0).abs().sum(-1) / mass.sum(-1).clamp_min(1e-300))
    return {"row_sum": float(total.mean()), "normalised_entropy": float(entropy.mean()),
            "mass_in_3x3": float(near.mean()), "negative_mass": float(neg.mean()),
            "nonzero_fraction": float((mass > 1e-12).double().mean())}


def run(out: str, mixers: Optional[Sequence[str]] = None, model: str = "vit_nano_patch4_32", img_size: int = 64,
        image_index: int = 0, query: Optional[Tuple[int, int]] = None, source: str = "auto", seed: int = 0,
        checkpoint: Optional[str] = None, command: Optional[str] = None) -> List[str]:
    """Draw the maps and write ``maps.{png,csv,json,md}`` into ``out``; return the paths."""
    names = mixers_with_maps(mixers)
    imgs, desc = load_images(image_index + 1, img_size, source, seed)
    img = imgs[image_index: image_index + 1]
    base = build_model(model, img_size, mixer="softmax", checkpoint=checkpoint, seed=seed)
    prefix, gh, gw = grid_of(base)
    qr, qc = query if query is not None else (gh // 2, gw // 2)
    if not (0 <= qr < gh and 0 <= qc < gw):
        raise ValueError(f"query {qr},{qc} is outside the {gh}x{gw} patch grid; use 0..{gh - 1},0..{gw - 1}")
    maps, rows, notes = [], [], []
    for name in names:
        try:
            companion = build_model(model, img_size, mixer=name, seed=seed, checkpoint=checkpoint, weights=False)
            row = _query_row(companion, base, img, (prefix, gh, gw), qr, qc)
        except (ValueError, NotImplementedError, RuntimeError) as err:
            notes.append(f"{name}: skipped ({str(err).splitlines()[0][:160]})")
            rows.append({"mixer": name, "status": "skipped"})
            continue
        maps.append((name, row))
        rows.append({"mixer": name, "status": "ok", **map_stats(row, gh, gw, qr, qc)})
    ck = f"checkpoint {checkpoint}" if checkpoint else "untrained, shared weights"
    title = f"attention of query patch ({qr},{qc}), first block of {model} @ {img_size}px, {ck}\n{desc}"
    fig_path = _figure(maps, img, (gh, gw), (qr, qc), img_size / gw, title, out)
    notes = [f"model {model} at {img_size}x{img_size} ({gh}x{gw} patches + {prefix} prefix), query patch "
             f"({qr},{qc}), {ck}; image: {desc}",
             "each panel uses its own colour scale; kernel mixers' weights are unnormalised",
             "normalised_entropy: entropy of |weights| / log(N) (1 = uniform); mass_in_3x3: share of |weight| "
             "on the query's 3x3 neighbourhood"] + notes
    files = write_table(rows, out, "maps", "Attention maps of one query, per mixer", notes, fig_path, command)
    return files + [fig_path]


def _query_row(net: torch.nn.Module, base: torch.nn.Module, img: torch.Tensor, grid, qr: int, qc: int):
    """The first block's ``(heads, H*W)`` weights of query patch ``(qr, qc)`` in ``net``, given the
    weights ``base`` shares with it."""
    prefix, gh, gw = grid
    copy_matching(net, base)
    _, layer, x = capture_mixer_inputs(net, img)[0]
    att = layer.attention_map(x, hw=(gh, gw), num_prefix_tokens=prefix)
    return att[0, :, prefix + qr * gw + qc, prefix:].float()


def _figure(maps, img: torch.Tensor, hw, query, patch: float, title: str, out: str) -> str:
    """A row per mixer: the image with the query marked, the mean map and one map per head."""
    plt = pyplot()
    (gh, gw), (qr, qc) = hw, query
    ncols = 2 + max(r.shape[0] for _, r in maps)
    fig, axes = plt.subplots(len(maps), ncols, figsize=(2.1 * ncols, 2.2 * len(maps) + 0.6), squeeze=False)
    for i, (name, row) in enumerate(maps):
        ax = axes[i, 0]
        ax.imshow(img[0, 0].numpy(), cmap="gray")
        ax.add_patch(plt.Rectangle((qc * patch - 0.5, qr * patch - 0.5), patch, patch, fill=False, ec="red", lw=1.5))
        ax.set_ylabel(name, fontsize=10)
        panels = [("mean of heads", row.mean(0))] + [(f"head {h}", row[h]) for h in range(row.shape[0])]
        for j, (panel_title, m) in enumerate(panels):
            a = axes[i, 1 + j]
            a.imshow(m.reshape(gh, gw).numpy(), cmap="magma")
            a.plot([qc], [qr], marker="+", color="cyan", ms=8)
            if i == 0:
                a.set_title(panel_title, fontsize=9)
        for j in range(1 + len(panels), ncols):
            axes[i, j].axis("off")
        for a in axes[i]:
            a.set_xticks([])
            a.set_yticks([])
    axes[0, 0].set_title("image + query", fontsize=9)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, out, "maps.png")


__all__ = ["run", "mixers_with_maps", "map_stats"]
