"""A learning regression guard that runs in seconds: ``laplacian`` must learn a fixed tiny problem about as
well as ``soft``, with 2 heads and with 4, and the guard must fail when the injective normalisation is switched
off (2 heads) or the Newton–Schulz steps go back to 20 (4 heads).

The problem: the bundled 8×8 digits at their native size, patch 2 (a 4×4 grid of 16 tokens, so 4
landmarks), a 2-block ViT of width 32 with 2 heads, 120 AdamW steps of 128 images drawn from the first 512
digits, validation on the last 397, one thread. A CPU run is deterministic for a seed and a thread count,
but the problem is chaotic in the last bits (a change that only reorders float32 sums can move one seed by
20 points), so every bound is on a 6-seed mean.

Why the bounds hold with margin: chance is 10 %. With the defaults ``laplacian``'s 6-seed mean sits about
10 points above ``LAPLACIAN_FLOOR`` and within about 1.5 points of ``soft`` (either side, depending on the
CPU), far inside ``MAX_GAP_TO_SOFT``; with the map switched off it falls about 11 points below the floor
and over 20 behind ``soft``, which the second test checks, so the guard is known to be able to fail. The
per-seed measurements on two CPUs, and the ablations the guard does and does not catch, are in
``docs/soft-laplacianformer.md`` ("The learning guard in the suite").

Why the bounds hold on any x86-64 CPU: another CPU (other GEMM kernels, another vector width) changes the
float32 rounding, and through the chaos above that is another draw of each seed's run, not a bias: both
machines above agree within the seed noise. The 6-seed mean's standard error is std/√6 ≈ 1-1.2 points, so the
floor sits ~10 standard errors below laplacian's mean and ~10 above the map-switched-off mean, and the gap
to soft (≤ 8) ~5 standard errors of a difference above the measured ones (-1.3 and 1.2).

The four-head problem (issue 45) is the same recipe at width 64 with 4 heads of 16: the head dim of the two-head
problem, twice the heads, as the learning grid adds heads at a fixed width. It is validated against the grid: 20
Newton–Schulz steps, which trailed ``soft`` at 4 heads on the grid's 128×4 point while 10 steps lead it there, give
a 6-seed mean about 12 points below ``soft`` and 6 below ``FOUR_HEAD_FLOOR``; the defaults sit about 6 above it,
within about a point of ``soft``. With per-seed standard deviations of 2-2.5 points both margins are ~6 standard
errors of a 6-seed mean, for the same reason as above on any x86-64 CPU. The measurements are in
``docs/soft-laplacianformer.md`` ("The learning guard in the suite").
"""
import importlib.util
import pathlib

import pytest
import torch

SEEDS = (0, 1, 2, 3, 4, 5)
STEPS, LR = 120, 4e-3          # AdamW steps of 128 images, and their learning rate
LAPLACIAN_FLOOR = 66.0        # % validation top-1, 6-seed mean
MAX_GAP_TO_SOFT = 8.0         # points, 6-seed means
FOUR_HEAD_FLOOR = 75.0        # % validation top-1, 6-seed mean, width 64 with 4 heads (FOUR_HEADS)


def _tiny_problem():
    """``experiments/learning/tiny_problem.py``: the problem's one definition (the experiment asks the same
    problem other questions: learning rates, shapes, per-group factors)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "learning" / "tiny_problem.py"
    spec = importlib.util.spec_from_file_location("tiny_problem", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = _tiny_problem()


@pytest.fixture(scope="module")
def digits():
    return TINY.digits()


def _tiny_run(digits, mixer: str, seed: int, width: int = 32, heads: int = 2, **options) -> float:
    """Validation top-1 (%) after the guard's fixed recipe, with ``heads`` heads of ``width // heads``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # the measured means are for one thread
    try:
        run = dict(TINY.RUN_KEYS, width=width, heads=heads, lr=LR, steps=STEPS)
        return TINY.tiny_run(digits, mixer, seed, run, options)
    finally:
        torch.set_num_threads(threads)


def _mean(digits, mixer: str, **options) -> float:
    return sum(_tiny_run(digits, mixer, seed, **options) for seed in SEEDS) / len(SEEDS)


#: the four-head problem: width 64, 4 heads of 16 (the two-head problem's head dim, twice its heads)
FOUR_HEADS = dict(width=64, heads=4)


@pytest.mark.slow
def test_laplacian_learns_the_tiny_problem_and_stays_near_soft(digits):
    laplacian, soft = _mean(digits, "laplacian"), _mean(digits, "soft")
    assert laplacian >= LAPLACIAN_FLOOR, f"laplacian {laplacian:.1f} % < {LAPLACIAN_FLOOR} (soft {soft:.1f} %)"
    assert soft - laplacian <= MAX_GAP_TO_SOFT, f"laplacian {laplacian:.1f} % vs soft {soft:.1f} %"


@pytest.mark.slow
def test_the_guard_catches_the_normalisation_switched_off(digits):
    """The guard can fail: the same problem with the injective map off stays below the bound."""
    assert _mean(digits, "laplacian", normalize=False) < LAPLACIAN_FLOOR


@pytest.mark.slow
def test_laplacian_learns_the_tiny_problem_with_four_heads(digits):
    """At 4 heads a default that loses its learning as heads are added falls below the four-head floor."""
    laplacian = _mean(digits, "laplacian", **FOUR_HEADS)
    assert laplacian >= FOUR_HEAD_FLOOR, f"laplacian with 4 heads {laplacian:.1f} % < {FOUR_HEAD_FLOOR}"


@pytest.mark.slow
def test_the_four_head_guard_catches_twenty_newton_steps(digits):
    """The four-head guard can fail: 20 Newton–Schulz steps, the default that lost to ``soft`` at 4 heads on
    the learning grid, stay below its floor."""
    assert _mean(digits, "laplacian", newton_iters=20, **FOUR_HEADS) < FOUR_HEAD_FLOOR
