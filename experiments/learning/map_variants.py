"""Variants of `laplacian`'s injective map and bandwidth, screened on the tiny problem (issue 45).

The map's spec is uncertain on one point (which axis the Nyström matrix is centred over) and `laplacian` keeps
one fixed bandwidth λ in every head; these variants test both. They form the full ``N×N`` matrix (the tiny
problem has 16 tokens), so they are screening tools, not mixers for the library. Registered as the mixer
``laplacian_map`` with these options on top of `laplacian`'s:

* ``center``: ``"rows"`` (the library's map: each query's row centred over the keys), ``"queries"`` (each key's
  column centred over the queries, as one secondary summary's pseudocode writes it) or ``"none"``;
* ``whiten``: ``"cols"`` (the library's: each key's column divided by its std over the queries), ``"rows"``
  (each query's row by its std over the keys) or ``"none"``;
* ``learn_lam``: a learnt per-head bandwidth ``λ_h = exp(g·p_h)``, started at the fixed λ; the gain ``lam_gain``
  (default 10) lets Adam move ``log λ`` ten times faster than an ordinary weight;
* ``gate_gain``: a learnt per-head gate ``exp(g·p_h)`` on the whitened part, started at 1 (``p_h = 0``), with that
  gain ``g`` (0, the default: no gate). The library's ``temperature="head"`` is this gate at gain 1, which Adam
  can move by a factor of at most ``e^(lr·steps)``: about 1.1 over the tiny problem's 120 steps at lr 1e-3;
* ``kernel``: ``"l1"`` (the library's ``exp(-‖q - k‖₁ / λ)``) or ``"gauss"`` (SOFT's ``exp(-‖q - k‖² / (2√d))`` on
  the unscaled ``q``, ``k``), to tell the kernel's part from the map's;
* ``tie``: ``False`` (the library's separate keys) or ``True``: the keys are the queries and the landmark keys the
  landmark queries, as in SOFT (the symmetric landmark matrix Newton–Schulz inverts fully).

``center="rows", whiten="cols"`` is the library's map computed densely (the check that the screen measures the
variants and not the dense path). Runs the tiny problem with any of them:

    python experiments/learning/map_variants.py --seeds 0,1,2 --out /tmp/map-variants \\
        "dense map=laplacian_map:width=64,heads=4,lr=1e-3" \\
        "centred over queries=laplacian_map:width=64,heads=4,lr=1e-3,center=queries"

With ``train`` as its first argument the script is ``vitmix train`` with ``laplacian_map`` registered, to screen
a variant on a grid point (the dense map costs N² memory per head, fine at the grid's 197 tokens):

    python experiments/learning/map_variants.py train --config configs/grid/fmnist196-w128h4d5-check.yaml \
        --mixer laplacian_map --mixer-option tie=true --seed 0 --out runs/learning/screen/tied

The commands of the committed screens are in their ``results.md``.
"""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import torch
from torch import nn

from vitmix.mixers.laplacian import LaplacianAttention
from vitmix.mixers.registry import register_mixer
from vitmix.ops import newton_schulz_inverse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_problem  # noqa: E402  (the tiny problem's runner, beside this file)


@register_mixer("laplacian_map")
class LaplacianMapVariant(LaplacianAttention):
    """`laplacian` with the map's centring and whitening axes and a learnt per-head λ as options (dense map)."""

    def __init__(self, dim, num_heads=8, *args, center="rows", whiten="cols", learn_lam=False, lam_gain=10.0,
                 gate_gain=0.0, kernel="l1", tie=False, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        center, whiten = center or "none", whiten or "none"          # the tiny problem's specs read "none" as None
        if center not in ("rows", "queries", "none") or whiten not in ("cols", "rows", "none"):
            raise ValueError(f"center={center!r} / whiten={whiten!r}: see the module docstring for the choices")
        if kernel not in ("l1", "gauss"):
            raise ValueError(f"kernel={kernel!r}: 'l1' or 'gauss'")
        self.center, self.whiten, self.lam_gain = center, whiten, float(lam_gain)
        start = math.log(self.lam / self.qk_scale) / self.lam_gain     # λ acts on unscaled q, k: λ / qk_scale
        self.log_lam = nn.Parameter(torch.full((self.num_heads,), start)) if learn_lam else None
        self.gate_gain = float(gate_gain)
        self.kernel_kind, self.tie = kernel, bool(tie)
        self.log_gate = nn.Parameter(torch.zeros(self.num_heads)) if self.gate_gain else None

    def _fused(self, x, grid):
        return None             # always the composed path, which calls _attend below

    def kernel_matrix(self, a, b, lam):
        """The kernel between the rows of unscaled ``a`` and ``b`` (λ: the L1 kernel's bandwidth on them)."""
        if self.kernel_kind == "gauss":
            return torch.exp(-torch.cdist(a, b).square() / (2 * math.sqrt(a.shape[-1])))
        return torch.exp(-torch.cdist(a, b, p=1) / lam)

    def _attend(self, q, k, v, lq, lk):
        n = v.shape[-2]
        lam = (self.log_lam * self.lam_gain).exp().view(-1, 1, 1) if self.log_lam is not None \
            else self.lam / self.qk_scale

        if self.tie:
            k, lk = q, lq
        kernel = functools.partial(self.kernel_matrix, lam=lam)

        # the library's Newton–Schulz op: the same forward and its implicit backward -Vᵀ(dL/dV)Vᵀ
        inverse = newton_schulz_inverse(kernel(lq, lk), iters=self.newton_iters, eps=self.newton_eps,
                                        symmetric=False, alpha=self.newton_alpha)
        g = kernel(q, lk) @ inverse @ kernel(k, lq).mT                  # (B, heads, N, N), the Nyström matrix
        axis = {"rows": -1, "queries": -2}
        r = g - g.mean(axis[self.center], keepdim=True) if self.center in axis else g
        var = r.var(dim={"cols": -2, "rows": -1}[self.whiten], correction=0, keepdim=True) \
            if self.whiten != "none" else torch.zeros(())
        z = r / torch.sqrt(var + self.norm_eps) / n                      # the "tokens" contrast scale
        if self.log_gate is not None:
            z = z * (self.log_gate * self.gate_gain).exp().view(-1, 1, 1)
        weight = self.mean_weight.view(-1, 1, 1) if self.mean_weight is not None else 1.0
        return z @ v + weight * v.mean(-2, keepdim=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:      # `vitmix train` with `laplacian_map` registered: a screen on a grid point
        from vitmix.cli import main
        sys.exit(main(sys.argv[1:]))
    tiny_problem.main(script="experiments/learning/map_variants.py")
