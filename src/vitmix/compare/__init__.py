"""``vitmix compare``: train one model with each of several mixers (and whole models) on the same
data, recipe and seed, measure each, and rank them in a leaderboard with plots.

>>> from vitmix.compare import run_compare                     # doctest: +SKIP
>>> rows = run_compare(TrainConfig(model="vit_nano_patch4_32", data="digits"),
...                    mixers=["softmax", "laplacian"], out="runs/compare/digits",
...                    seeds=[0, 1, 2], budget="flops=1e12")

The package is light to import (the CLI lists it); the work lives in :mod:`vitmix.compare.runner`
(training, resuming, measuring), :mod:`vitmix.compare.budget` (``--seeds``, ``--budget`` → steps),
:mod:`vitmix.compare.aggregate` (mean ± std over seeds, the noise test) and
:mod:`vitmix.compare.leaderboard` (tables and plots).
"""
from __future__ import annotations

from .._lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, {
    "run_compare": ".runner:run_compare", "plan_entries": ".runner:plan_entries", "Entry": ".runner:Entry",
    "measure_model": ".runner:measure_model", "write_leaderboard": ".leaderboard:write_leaderboard",
    "Budget": ".budget:Budget", "parse_budget": ".budget:parse_budget", "parse_seeds": ".budget:parse_seeds",
})
__all__ = ["Budget", "Entry", "measure_model", "parse_budget", "parse_seeds", "plan_entries", "run_compare",
           "write_leaderboard"]
