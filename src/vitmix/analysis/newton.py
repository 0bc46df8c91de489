"""``vitmix analyze newton``: Newton–Schulz residual ‖I − AV‖ vs iterations, with and without ε.

The matrices are the landmark kernel matrices ``A = k(L_q, L_k)`` that the SOFT (Gaussian, tied,
symmetric) and LaplacianFormer (Laplacian, separate, non-symmetric) mixers invert, built from real
activations exactly as in ``vitmix analyze approx`` (``m`` landmarks by adaptive average pooling).
For ``t = 1 … iters`` we run :func:`vitmix.ops.newton_schulz_inverse` for ``t`` iterations with
``ε = 0`` and with ``ε = eps`` and report ``‖I − A V_t‖_F / √m`` (residual against the matrix the
model wants to invert) and, for ``ε > 0``, ``‖I − (A + εI) V_t‖_F / √m`` (against the matrix the
iteration actually inverts). Mean over images and heads, float32 like the mixers.
"""
from __future__ import annotations

import math
import os
from typing import List, Optional

import torch

from .._util import write_csv
from ._common import pyplot, save_figure, write_table
from .approx import kernel_inputs, pool_landmarks, real_qkv


def landmark_matrices(q, k, hw, side: int, lam: float = 4.0) -> dict:
    """``{"gaussian": A, "laplacian": A}`` landmark kernel matrices ``(B, heads, m, m)`` in float32."""
    from ..ops import gaussian_kernel, laplacian_kernel

    h, w = hw
    out = {}
    for kernel in ("gaussian", "laplacian"):
        qs, ks = kernel_inputs(kernel, q.float(), k.float())
        lq = pool_landmarks(qs, h, w, side)
        lk = lq if ks is qs else pool_landmarks(ks, h, w, side)
        out[kernel] = gaussian_kernel(lq, lk) if kernel == "gaussian" else laplacian_kernel(lq, lk, lam)
    return out


#: Newton–Schulz starts compared per kernel: SOFT's symmetric matrices have one start; the
#: non-symmetric Laplacian ones are shown from every start ``newton_schulz_inverse`` offers
STARTS = {"gaussian": ("safe",), "laplacian": ("safe", "transpose", "official")}


@torch.no_grad()
def residual_curves(mats: dict, iters: int = 30, eps: float = 0.01) -> List[dict]:
    """One row per (kernel, start, ε, iteration) with the mean normalised residuals (ε = 0 for the
    default start only)."""
    from ..ops import newton_schulz_inverse

    rows = []
    for kernel, a in mats.items():
        m = a.shape[-1]
        eye = torch.eye(m, dtype=a.dtype)
        p = a + eps * eye
        for start in STARTS.get(kernel, ("safe",)):
            for e in ((0.0, eps) if start == "safe" else (eps,)):
                for t in range(1, iters + 1):
                    v = newton_schulz_inverse(a, iters=t, eps=e, alpha=start)
                    ra = torch.linalg.matrix_norm(eye - a @ v) / math.sqrt(m)
                    rp = torch.linalg.matrix_norm(eye - p @ v) / math.sqrt(m) if e else ra
                    rows.append({"kernel": kernel, "start": start, "eps": e, "iteration": t,
                                 "residual_A": _finite_mean(ra), "residual_P": _finite_mean(rp)})
    return rows


def _finite_mean(r: torch.Tensor) -> float:
    """Mean residual; a diverged start (inf/NaN) reports inf rather than poisoning the plot with NaN."""
    return float(r.mean()) if bool(torch.isfinite(r).all()) else math.inf


def run(out: str, model: str = "vit_nano_patch4_32", img_size: int = 64, images: int = 4, source: str = "auto",
        landmarks: int = 49, iters: int = 30, eps: float = 0.01, lam: float = 4.0, seed: int = 0,
        checkpoint: Optional[str] = None, command: Optional[str] = None) -> List[str]:
    """Run the analysis and write ``newton.{png,csv,json,md}`` into ``out``; return the paths."""
    side = math.isqrt(landmarks)
    if landmarks < 1 or side * side != landmarks:
        raise ValueError(f"--landmarks {landmarks} must be a perfect square (e.g. 16, 49, 64)")
    if iters < 1:
        raise ValueError(f"--iters must be >= 1, got {iters}")
    q, k, _, (h, w), desc = real_qkv(model, img_size, images, source, seed, checkpoint)
    if side > min(h, w):
        raise ValueError(f"{landmarks} landmarks need a grid of at least {side}x{side}; the model has {h}x{w} "
                         f"patches (use fewer landmarks or a larger --img-size)")
    mats = landmark_matrices(q, k, (h, w), side, lam)
    rows = residual_curves(mats, iters, eps)
    ck = f"checkpoint {checkpoint}" if checkpoint else "untrained weights"
    fig_path = _figure(rows, eps, landmarks, f"first layer of {model} @ {img_size}px, {ck}; {desc}", out)
    notes = [f"landmark kernels A (m={landmarks}) from the first attention layer of {model} at {img_size}x{img_size}, "
             f"{ck}; images: {desc}",
             "gaussian: tied, symmetric (SOFT); laplacian: separate q/k landmarks, non-symmetric (LaplacianFormer)",
             "start: newton_alpha of vitmix.ops.newton_schulz_inverse ('safe': alpha*P for symmetric matrices, the "
             "scaled identity where the symmetric part is positive definite, else alpha*P^T; 'transpose': alpha*P^T; "
             "'official': the authors' CUDA, alpha*P); inf = diverged",
             "residuals are ||I - A V_t||_F / sqrt(m), mean over images and heads; the full curves are in "
             "newton_curves.csv"]
    title = "Newton–Schulz convergence on landmark kernels"
    files = write_table(_summary(mats, rows, iters, eps), out, "newton", title, notes, fig_path, command)
    curve_path = write_csv(os.path.join(out, "newton_curves.csv"), rows)
    return files + [curve_path, fig_path]


def _summary(mats: dict, rows: List[dict], iters: int, eps: float) -> List[dict]:
    """Per kernel, start and ε: the median condition numbers and the residuals after 5, 10, 20 and ``iters`` steps."""
    summary = []
    for kernel, a in mats.items():
        ad = a.double()
        cond = torch.linalg.cond(ad).median()
        cond_p = torch.linalg.cond(ad + eps * torch.eye(a.shape[-1], dtype=ad.dtype)).median()
        for start, e in sorted({(t["start"], t["eps"]) for t in rows if t["kernel"] == kernel},
                               key=lambda se: (STARTS[kernel].index(se[0]), se[1])):
            sel = [t for t in rows if t["kernel"] == kernel and t["eps"] == e and t["start"] == start]
            r = {t["iteration"]: t["residual_A"] for t in sel}
            rp = {t["iteration"]: t["residual_P"] for t in sel}
            summary.append({"kernel": kernel, "start": start, "eps": e, "median_cond_A": float(cond),
                            "median_cond_A+epsI": float(cond_p),
                            **{f"res_A@{t}": r[t] for t in (5, 10, 20, iters) if t in r},
                            "res_P@20": rp.get(20, math.nan), f"res_P@{iters}": rp[iters]})
    return summary


def _figure(rows: List[dict], eps: float, landmarks: int, title: str, out: str) -> str:
    """The residual curves, a panel per kernel and a line per start; returns the path."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = {"safe": "tab:orange", "transpose": "tab:green", "official": "tab:red"}
    for ax, kernel in zip(axes, ("gaussian", "laplacian")):
        pts = [(t["iteration"], t["residual_A"]) for t in rows if t["kernel"] == kernel and t["eps"] == 0.0]
        ax.plot(*zip(*pts), "-o", ms=3, color="tab:blue", label="‖I − AV‖, ε=0")
        for start in STARTS[kernel]:
            pp = [(t["iteration"], t["residual_P"]) for t in rows
                  if t["kernel"] == kernel and t["eps"] == eps and t["start"] == start]
            ax.plot(*zip(*pp), "--", color=colors[start], label=f"‖I − (A+εI)V‖, ε={eps:g}, start {start!r}")
        ax.set_yscale("log")
        ax.set_xlabel("Newton–Schulz iterations")
        ax.set_title(f"{kernel} landmark kernel, m={landmarks}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("‖I − ·V‖_F / √m (mean over images, heads)")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, out, "newton.png")


__all__ = ["run", "landmark_matrices", "residual_curves"]
