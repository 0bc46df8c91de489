"""Paired timing: how much slower one call is than another, measured in alternating rounds so that
both see the same machine load (the compiled / eager ratio of ``vitmix bench --compile``)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from .timing import time_call

@dataclass
class PairedRatio:
    """``ratio``: median over rounds of (B time / A time); ``ratio_iqr``: its inter-quartile range over the
    rounds (the run-to-run noise of the ratio); ``compiled_s``: median B time."""

    ratio: float
    ratio_iqr: float
    compiled_s: float


def paired_ratio(a: Callable[[], object], b: Callable[[], object], device, min_run_time: float,
                 rounds: int = 6) -> PairedRatio:
    """How much slower ``b`` is than ``a``, measured fairly on a shared machine: ``rounds`` rounds, each
    timing both (in alternating order, A B then B A), one ratio per round. Timing one after the other
    minutes apart would compare two different machine loads."""
    ratios, b_times = [], []
    budget = max(min_run_time / (2 * rounds), 0.02)
    for r in range(rounds):
        order = (a, b) if r % 2 == 0 else (b, a)
        t = {id(f): time_call(f, device, min_run_time=budget).median_s for f in order}
        ratios.append(t[id(b)] / t[id(a)])
        b_times.append(t[id(b)])
    q = statistics.quantiles(ratios, n=4)
    return PairedRatio(statistics.median(ratios), q[2] - q[0], statistics.median(b_times))


__all__ = ["PairedRatio", "paired_ratio"]
