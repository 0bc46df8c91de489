"""Paired timing: how much slower one call is than another, measured in alternating rounds so that
every call sees the same machine load (the compiled / eager ratio of ``vitmix bench --compile``, and the
ratios of a ``vitmix bench --spec`` suite)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping

from .timing import time_call


@dataclass
class PairedRatio:
    """``ratio``: median over rounds of (B time / A time); ``ratio_iqr``: its inter-quartile range over the
    rounds (the run-to-run noise of the ratio); ``compiled_s``: median B time."""

    ratio: float
    ratio_iqr: float
    compiled_s: float


def alternating_rounds(calls: Mapping[str, Callable[[], object]], device, min_run_time: float,
                       rounds: int) -> Dict[str, List[float]]:
    """Median seconds of every call in each of ``rounds`` rounds (``min_run_time`` of timing per call and
    round). Each round times every call once, in the given order and then reversed in the next round, so a
    change of machine load during the run hits all calls alike and the per-round ratios stay fair."""
    names = list(calls)
    samples: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            samples[name].append(time_call(calls[name], device, min_run_time=min_run_time).median_s)
    return samples


def round_ratios(times: List[float], reference: List[float]) -> List[float]:
    """One ratio per round: ``times[r] / reference[r]`` (both from the same :func:`alternating_rounds`)."""
    return [t / ref for t, ref in zip(times, reference)]


def paired_ratio(a: Callable[[], object], b: Callable[[], object], device, min_run_time: float,
                 rounds: int = 6) -> PairedRatio:
    """How much slower ``b`` is than ``a``, measured fairly on a shared machine: ``rounds`` rounds, each
    timing both (in alternating order, A B then B A), one ratio per round. Timing one after the other
    minutes apart would compare two different machine loads."""
    budget = max(min_run_time / (2 * rounds), 0.02)
    times = alternating_rounds({"a": a, "b": b}, device, budget, rounds)
    ratios = round_ratios(times["b"], times["a"])
    q = statistics.quantiles(ratios, n=4)
    return PairedRatio(statistics.median(ratios), q[2] - q[0], statistics.median(times["b"]))


__all__ = ["PairedRatio", "alternating_rounds", "paired_ratio", "round_ratios"]
