"""One leaderboard row per entry from its runs (one per seed): mean ± std, n, and whether its top-1
is within noise of the best entry.

**The noise rule.** An entry is *within noise* of the best one when both have at least two
successful seeds and Welch's t-test (unequal variances, two-sided, ``scipy.stats.ttest_ind``) on
their final top-1 over the seeds gives p > :data:`NOISE_P`. With fewer seeds no test is made.
"""
from __future__ import annotations

import math
import statistics
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

#: Welch's t-test p-value above which a difference from the best entry counts as noise.
NOISE_P = 0.05

#: Per-run numbers averaged over the seeds (each gets ``<key>_std`` beside its mean).
MEAN_KEYS = ("top1", "best_top1", "corruption_acc", "params", "gflops", "train_images_per_s", "latency_ms",
             "peak_train_mb", "steps", "images", "train_loop_seconds", "train_flops", "logged_train_images_per_s")


def mean_std(values: Sequence[Optional[float]]):
    """``(mean, sample std)`` of the values that are not ``None``; std is ``None`` below two values."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def aggregate(runs: Sequence[dict]) -> List[dict]:
    """Group per-run rows by ``entry`` (first-seen order) into one row each: the means of
    :data:`MEAN_KEYS` over the successful runs, ``<key>_std``, ``n``, the seeds, the failed seeds with
    their errors, and every run under ``"runs"``. An entry with no successful run is ``failed``."""
    groups: Dict[str, List[dict]] = {}
    for run in runs:
        groups.setdefault(run["entry"], []).append(run)
    return [_entry_row(name, group) for name, group in groups.items()]


def _entry_row(name: str, group: List[dict]) -> dict:
    ok = [r for r in group if r.get("status") == "ok"]
    failed = [r for r in group if r.get("status") != "ok"]
    row = {"entry": name, "kind": group[0].get("kind"), "status": "ok" if ok else "failed", "n": len(ok),
           "seeds": [r.get("seed") for r in ok], "failed_seeds": [r.get("seed") for r in failed],
           "runs": list(group)}
    if failed:
        row["error"] = failed[0].get("error", "")
    for key in MEAN_KEYS:
        mean, std = mean_std([r.get(key) for r in ok])
        if mean is not None:
            row[key], row[f"{key}_std"] = mean, std
    for key in ("budget", "corruption_settings", "epochs"):
        if ok and key in ok[0]:
            row[key] = ok[0][key]
    if ok and all(r.get("corruptions") for r in ok):     # {name: {severity: acc}}: the mean over seeds
        first = ok[0]["corruptions"]
        row["corruptions"] = {name: {s: mean_std([r["corruptions"][name].get(s) for r in ok])[0] for s in by_sev}
                              for name, by_sev in first.items()}
    dirs = {str(Path(r["run_dir"]).parent) if len(group) > 1 else r["run_dir"] for r in group if "run_dir" in r}
    if len(dirs) == 1:
        row["run_dir"] = dirs.pop()
    return row


def welch_p(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Two-sided p-value of Welch's t-test between two samples; ``None`` below two values in either.
    Two constant samples give 1 when their means are equal and 0 otherwise."""
    if len(a) < 2 or len(b) < 2:
        return None
    if statistics.pvariance(a) == statistics.pvariance(b) == 0:     # nothing to test against
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    from scipy.stats import ttest_ind

    with warnings.catch_warnings():       # one constant sample is fine for Welch; scipy warns about it
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return 1.0 if math.isnan(p) else p


def mark_noise(rows: Sequence[dict]) -> List[dict]:
    """Add ``p_vs_best`` (Welch's p against the best mean top-1) and ``within_noise`` to ok rows,
    which must come best first."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return list(rows)
    best = _top1s(ok[0])
    out = []
    for i, r in enumerate(rows):
        if r["status"] != "ok":
            out.append(r)
            continue
        p = None if i == 0 else welch_p(_top1s(r), best)
        out.append(dict(r, p_vs_best=p, within_noise=None if p is None else p > NOISE_P))
    return out


def _top1s(row: dict) -> List[float]:
    return [r["top1"] for r in row.get("runs", [row]) if r.get("status") == "ok" and r.get("top1") is not None]


def mean_curve(runs: Sequence[dict], x_key: str, y_key: str = "val_acc", group: str = "learning"):
    """Per-epoch ``(x, mean y, std y)`` over the runs that reached each epoch (``x`` from the first)."""
    curves = [r[group] for r in runs if r.get("status") == "ok" and r.get(group) and r[group].get(y_key)]
    length = max((len(c[y_key]) for c in curves), default=0)
    xs, means, stds = [], [], []
    for i in range(length):
        values = [c[y_key][i] for c in curves if i < len(c[y_key]) and c[y_key][i] is not None]
        if not values:
            continue
        x = next(c[x_key][i] for c in curves if i < len(c[y_key])) if x_key != "epoch" else i + 1
        mean, std = mean_std(values)
        xs.append(x)
        means.append(mean)
        stds.append(std or 0.0)
    return xs, means, stds
