"""``vitmix analyze approx``: Nyström approximation error vs number of landmarks, Gaussian vs Laplacian.

Real activations: images (Fashion-MNIST when installed, else scikit-learn digits) go through a
model's patch embedding to the input of its first attention layer, which projects them to its own
``q``, ``k``, ``v`` (untrained weights unless ``--checkpoint``). Prefix (CLS) tokens are dropped so
landmarks tile the patch grid. Each kernel is evaluated the way its mixer does it:

- **Gaussian** (SOFT): keys tied to queries (``K = Q``), ``Q`` scaled by ``d^(-1/4)``;
- **Laplacian** (LaplacianFormer): separate ``Q``, ``K`` scaled by ``d^(-1/2)``, ``λ = lam``.

Landmarks are adaptive average pools of the (scaled) query/key grid to ``s×s`` cells (``m = s²``).
The error is the relative Frobenius error ``‖Y_nys − Y‖_F / ‖Y‖_F`` of the attention output
against the exact kernel attention ``Y = k(Q, K)·V``, for the Newton–Schulz inverse (the mixers'
default, ``iters`` iterations, ``ε = eps``), the exact inverse of ``W + εI`` and the exact inverse
without perturbation (pure Nyström). Normalisation is off in both, so only the kernel
approximation is measured. Everything runs in float64 so that the curves show the approximation,
not float32 rounding (``W`` is badly conditioned for large ``m``: its float32 exact inverse without
``ε`` is useless).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ._common import (
    build_model, capture_mixer_inputs, grid_of, load_images, pyplot, query_key_value, save_figure, write_table,
)

VARIANTS = (("newton", "eps"), ("exact", "eps"), ("exact", "zero"))


def pool_landmarks(t: torch.Tensor, h: int, w: int, side) -> torch.Tensor:
    """Adaptive average pooling of grid tokens ``(B, H_, N, d)`` to ``side`` (int or (mh, mw)) cells."""
    b, nh, n, d = t.shape
    g = t.reshape(b * nh, h, w, d).permute(0, 3, 1, 2)
    g = F.adaptive_avg_pool2d(g, side)
    return g.flatten(2).transpose(1, 2).reshape(b, nh, -1, d)


def real_qkv(model: str, img_size: int, images: int, source: str, seed: int, checkpoint: Optional[str]):
    """Grid ``q, k, v`` (B, heads, H*W, d) of the first attention layer on real images, and ``(H, W)``."""
    imgs, desc = load_images(images, img_size, source, seed)
    net = build_model(model, img_size, mixer="softmax", checkpoint=checkpoint, seed=seed)
    prefix, h, w = grid_of(net)
    _, layer, x = capture_mixer_inputs(net, imgs)[0]
    with torch.no_grad():
        q, k, v = query_key_value(layer, x)
    return q[:, :, prefix:].double(), k[:, :, prefix:].double(), v[:, :, prefix:].double(), (h, w), desc


def kernel_inputs(kernel: str, q: torch.Tensor, k: torch.Tensor):
    """``q, k`` scaled (and tied) the way the corresponding mixer does it."""
    d = q.shape[-1]
    if kernel == "gaussian":
        qs = q * d ** -0.25
        return qs, qs
    return q * d ** -0.5, k * d ** -0.5


@torch.no_grad()
def approximation_errors(q, k, v, hw, sides: Sequence[int], lam: float = 4.0, iters: int = 20, eps: float = 0.01,
                         kernels: Sequence[str] = ("gaussian", "laplacian")) -> List[dict]:
    """Rows ``{kernel, landmarks, inverse, eps, rel_error}`` for every landmark grid side in ``sides``."""
    from ..ops import kernel_attention_reference, nystrom_attention

    h, w = hw
    rows = []
    for kernel in kernels:
        qs, ks = kernel_inputs(kernel, q, k)
        exact = kernel_attention_reference(qs, ks, v, kernel=kernel, lam=lam)
        denom = exact.norm().clamp_min(1e-30)
        for side in sides:
            if side > min(h, w):
                continue
            lq = pool_landmarks(qs, h, w, side)
            lk = lq if ks is qs else pool_landmarks(ks, h, w, side)
            for inverse, which in VARIANTS:
                e = eps if which == "eps" else 0.0
                y = nystrom_attention(qs, ks, v, lq, lk, kernel=kernel, lam=lam, iters=iters, eps=e, inverse=inverse)
                err = float((y - exact).norm() / denom)
                rows.append({"kernel": kernel, "landmarks": side * side, "inverse": inverse, "eps": e,
                             "rel_error": err if math.isfinite(err) else float("nan")})
    return rows


def run(out: str, model: str = "vit_nano_patch4_32", img_size: int = 64, images: int = 4, source: str = "auto",
        sides: Optional[Sequence[int]] = None, lam: float = 4.0, iters: int = 20, eps: float = 0.01, seed: int = 0,
        checkpoint: Optional[str] = None, command: Optional[str] = None) -> List[str]:
    """Run the analysis and write ``approx.{png,csv,json,md}`` into ``out``; return the paths."""
    q, k, v, (h, w), desc = real_qkv(model, img_size, images, source, seed, checkpoint)
    if sides is None:
        top = min(h, w)
        sides = sorted({s for s in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32) if s <= top} | {top})
    bad = [s for s in sides if s < 1 or s > min(h, w)]
    if bad:
        raise ValueError(f"landmark grid sides {bad} do not fit the {h}x{w} patch grid; use 1..{min(h, w)}")
    rows = approximation_errors(q, k, v, (h, w), sides, lam, iters, eps)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.8))
    colors = {"gaussian": "tab:blue", "laplacian": "tab:red"}
    styles = {("newton", "eps"): ("-", "o", f"Newton–Schulz ({iters} it., ε={eps:g})"),
              ("exact", "eps"): ("--", "s", f"exact inverse, ε={eps:g}"),
              ("exact", "zero"): (":", "^", "exact inverse, ε=0")}
    for kernel in ("gaussian", "laplacian"):
        for (inverse, which), (ls, mk, lab) in styles.items():
            pts = [(r["landmarks"], r["rel_error"]) for r in rows if r["kernel"] == kernel and
                   r["inverse"] == inverse and (r["eps"] == 0.0) == (which == "zero")]
            pts = [(m, e) for m, e in pts if e == e and e > 0]
            if pts:
                ax.plot(*zip(*pts), ls=ls, marker=mk, color=colors[kernel], label=f"{kernel}: {lab}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"landmarks m (of N = {h * w} tokens)")
    ax.set_ylabel("relative Frobenius error of the output")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ck = f"checkpoint {checkpoint}" if checkpoint else "untrained weights"
    ax.set_title(f"Nyström error vs landmarks — first layer of {model} @ {img_size}px, {ck}\n{desc}", fontsize=8)
    fig_path = save_figure(fig, out, "approx.png")
    notes = [f"activations: first attention layer of {model} at {img_size}x{img_size} ({h}x{w} patch tokens, "
             f"prefix dropped), {ck}; images: {desc}",
             f"gaussian: K = Q scaled by d^-1/4 (SOFT); laplacian: separate Q, K scaled by d^-1/2, lambda={lam:g}",
             "landmarks: adaptive average pooling of the scaled q / k grid; no normalisation; float64; "
             "error = ||Y_nystrom - Y_exact||_F / ||Y_exact||_F"]
    return write_table(rows, out, "approx", "Nyström approximation error vs landmarks", notes, fig_path,
                       command) + [fig_path]


__all__ = ["run", "approximation_errors", "pool_landmarks", "real_qkv", "kernel_inputs"]
