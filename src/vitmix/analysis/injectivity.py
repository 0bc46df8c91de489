"""``vitmix analyze injectivity``: do distinct queries get distinct attention outputs?

LaplacianFormer replaces the usual row normalisation of kernel attention by an "injective"
normalised feature map (row-centred, column-whitened, ``+1/N``). The failure it prevents: with the
L1 kernel, a query that lies beyond every key in every coordinate has ``‖q − k_j‖₁ = Σq − Σk_j``,
so its kernel row is ``e^{−Σq/λ} · (e^{Σk_j/λ})_j`` — all such queries give *proportional* rows, and
after row normalisation *identical* ones.

For each query set we build the effective attention rows of the LaplacianFormer Nyström op
(:func:`vitmix.ops.nystrom_attention` with ``V = I``; landmarks by average pooling) and count the
fraction of distinct queries whose row differs from every other distinct query's row by more than
``tol`` (relative: ``‖r_i − r_j‖ > tol · max(‖r_i‖, ‖r_j‖)``). Variants on the same ``q``, ``k``:

- ``kernel`` — the raw Nyström kernel rows (``normalize=False``);
- ``row-normalised`` — the same rows divided by their sum (the normalisation softmax-style kernel
  attention uses, which the injective map replaces);
- ``injective`` — the mixer's default ``normalize=True``;
- ``softmax`` — ``softmax(q·k/√d)`` on the unscaled projections, for reference.

Query sets: ``real`` (the first layer's grid queries on real images) and ``shifted`` (the same
queries each moved by its own constant ``c_i·1`` beyond every key coordinate — the case above).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ._common import pyplot, save_figure, write_table
from .approx import pool_landmarks, real_qkv

VARIANTS = ("kernel", "row-normalised", "injective", "softmax")


def distinct_fraction(rows: torch.Tensor, queries: torch.Tensor, tol: float, query_tol: float = 1e-6) -> float:
    """Fraction of distinct queries whose output row is distinct from all other distinct queries' rows.

    ``rows``: ``(G, N, M)`` output rows per group (image × head); ``queries``: ``(G, N, d)``.
    Two queries are distinct when they differ by more than ``query_tol`` (relative, max-norm).
    """
    r = rows.double()
    qd = queries.double()
    qscale = qd.abs().amax(dim=(-1, -2), keepdim=True).clamp_min(1e-30)
    qdiff = (qd.unsqueeze(-2) - qd.unsqueeze(-3)).abs().amax(-1) / qscale  # (G, N, N)
    distinct_q = qdiff > query_tol
    rd = torch.cdist(r, r)                                                  # (G, N, N)
    norms = r.norm(dim=-1)
    scale = torch.maximum(norms.unsqueeze(-1), norms.unsqueeze(-2)).clamp_min(1e-300)
    collide = (rd <= tol * scale) & distinct_q
    has_distinct = distinct_q.any(-1)
    ok = has_distinct & ~collide.any(-1)
    return float(ok.sum() / has_distinct.sum().clamp_min(1))


@torch.no_grad()
def variant_rows(q: torch.Tensor, k: torch.Tensor, hw, pool: int, lam: float, raw_q: torch.Tensor,
                 raw_k: torch.Tensor) -> dict:
    """Effective ``(B, heads, N, N)`` rows of every variant for (scaled) ``q``, ``k``."""
    from ..ops import nystrom_attention

    h, w = hw
    lq = pool_landmarks(q, h, w, (h // pool, w // pool))
    lk = pool_landmarks(k, h, w, (h // pool, w // pool))
    eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], -1, -1)
    raw = nystrom_attention(q, k, eye, lq, lk, kernel="laplacian", lam=lam)
    inj = nystrom_attention(q, k, eye, lq, lk, kernel="laplacian", lam=lam, normalization="injective")
    rown = raw / raw.sum(-1, keepdim=True)
    sm = torch.softmax(raw_q @ raw_k.mT * raw_q.shape[-1] ** -0.5, dim=-1)
    return {"kernel": raw, "row-normalised": rown, "injective": inj, "softmax": sm}


def shift_beyond_keys(q: torch.Tensor, k: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Each query plus its own constant so that every coordinate exceeds every key coordinate."""
    g = torch.Generator().manual_seed(seed)
    base = (k.amax(dim=(-2, -1), keepdim=True) - q.amin(dim=(-2, -1), keepdim=True)).clamp_min(0)
    spread = q.std().item() + 1e-3
    c = base + 0.01 + spread * torch.rand(*q.shape[:-1], 1, generator=g, dtype=q.dtype)
    return q + c


def run(out: str, model: str = "vit_nano_patch4_32", img_size: int = 32, images: int = 4, source: str = "auto",
        pool: int = 2, lam: float = 4.0, tol: float = 1e-4, tols: Optional[Sequence[float]] = None, seed: int = 0,
        checkpoint: Optional[str] = None, command: Optional[str] = None) -> List[str]:
    """Run the analysis and write ``injectivity.{png,csv,json,md}`` into ``out``; return the paths."""
    if not tol > 0:
        raise ValueError(f"--tol must be > 0, got {tol}")
    q, k, _, (h, w), desc = real_qkv(model, img_size, images, source, seed, checkpoint)
    if pool < 1 or h // pool < 1 or w // pool < 1:
        raise ValueError(f"--pool {pool} leaves no landmark on the {h}x{w} grid; use 1..{min(h, w)}")
    q, k = q.float(), k.float()
    d = q.shape[-1]
    qs, ks = q * d ** -0.5, k * d ** -0.5  # the laplacian mixer's default qk_scale
    sets = {"real": (qs, q), "shifted": (shift_beyond_keys(qs, ks, seed), shift_beyond_keys(q, k, seed))}
    tols = sorted(set(tols or [10.0 ** e for e in range(-7, 0)]) | {tol})
    curves, rows = {}, []
    for set_name, (qq, rq) in sets.items():
        outs = variant_rows(qq, ks, (h, w), pool, lam, rq, k)
        g_q = qq.reshape(-1, *qq.shape[-2:])
        for variant in VARIANTS:
            r = outs[variant].reshape(-1, *outs[variant].shape[-2:])
            gq = rq.reshape(-1, *rq.shape[-2:]) if variant == "softmax" else g_q
            fr = [distinct_fraction(r, gq, t) for t in tols]
            curves[(set_name, variant)] = fr
            rows.append({"queries": set_name, "variant": variant, "tol": tol,
                         "distinct_fraction": fr[tols.index(tol)]})

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    for ax, set_name in zip(axes, sets):
        for variant in VARIANTS:
            ax.plot(tols, curves[(set_name, variant)], "-o", ms=3, label=variant)
        ax.axvline(tol, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("relative tolerance for 'same output'")
        ax.set_title(f"{set_name} queries", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("fraction of distinct queries with distinct outputs")
    ck = f"checkpoint {checkpoint}" if checkpoint else "untrained weights"
    fig.suptitle(f"Laplacian Nyström attention (λ={lam:g}, pool {pool}) — first layer of {model} @ {img_size}px, "
                 f"{ck}; {desc}", fontsize=9)
    fig_path = save_figure(fig, out, "injectivity.png")
    notes = [f"q, k: first attention layer of {model} at {img_size}x{img_size} ({h}x{w} grid tokens), {ck}, scaled "
             f"by d^-1/2 as the laplacian mixer does; images: {desc}",
             "shifted: every query moved by its own constant beyond every key coordinate",
             f"distinct output: ||r_i - r_j|| > tol * max(||r_i||, ||r_j||) for every other distinct query j; "
             f"table at tol={tol:g}, curves over tol in the figure"]
    return write_table(rows, out, "injectivity", "Injectivity of Laplacian kernel attention", notes, fig_path,
                       command) + [fig_path]


__all__ = ["run", "distinct_fraction", "variant_rows", "shift_beyond_keys", "VARIANTS"]
