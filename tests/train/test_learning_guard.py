"""A learning regression guard that runs in seconds (issue 23, deliverable 5).

A fixed tiny problem: the bundled 8×8 digits at their native size, patch 2 (a 4×4 grid of 16 tokens, so
4 landmarks), a 2-block ViT of width 32 with 2 heads, 120 AdamW steps of 128 images drawn from the first
512 digits, validation on the last 397. CPU runs are deterministic for a seed and thread count, so the
numbers below repeat on this machine; another CPU moves them by less than the seed noise the margins
allow for.

Measured (6 seeds, mean ± std of validation top-1, %; ``_tiny_run`` below, one thread, a 2-core Intel
Xeon (AVX-512), December 5 2026, after ``newton_iters=10`` became laplacian's default):

| entry | mean ± std | per seed |
|---|---|---|
| softmax | 54.3 ± 10.7 | 49.9, 64.2, 49.6, 37.0, 62.7, 62.5 |
| soft | 76.5 ± 2.3 | 76.6, 72.8, 74.8, 77.8, 78.1, 79.1 |
| laplacian (defaults) | 77.8 ± 2.4 | 80.9, 79.3, 74.1, 77.3, 78.8, 76.3 |
| laplacian, ``newton_iters=20`` (the default before December 5) | 62.1 ± 8.1 | 69.0, 56.9, 66.2, 49.9, 71.0, 59.4 |
| laplacian, ``mean_weight=None`` (the fixed map) | 75.8 ± 3.1 | 80.9, 78.1, 72.3, 74.8, 74.3, 74.3 |
| laplacian, ``normalize=False`` (the injective map off) | 54.9 ± 2.6 | 50.1, 56.2, 55.4, 54.7, 54.9, 57.9 |
| laplacian, ``qk_scale=1.0`` (unscaled L1 distances) | 72.6 ± 3.6 | 72.8, 69.8, 77.3, 67.3, 73.6, 74.8 |

Remeasured on a 2-core AMD EPYC VM the same day, after ``soft``'s training moved to its one-call C path (the
same arithmetic to float32 rounding): softmax 54.7 ± 9.8, soft 77.5 ± 2.8 (79.6, 72.8, 76.3, 76.8, 80.6, 78.8),
laplacian 76.3 ± 2.9 (80.6, 78.8, 73.0, 74.6, 76.1, 74.6): laplacian 1.2 below soft, well inside both bounds.

The problem is chaotic in the last bits (changes that only reorder float32 sums have moved one seed by
20 points), so the guard averages 6 seeds. The bound for ``laplacian`` is a 6-seed mean ≥ 66: chance is
10, the defaults clear it by 12 points and the map switched off falls 11 short (so does the old
20-iteration inverse, by 4). The distance to ``soft`` may be at most 8 points: the defaults lead soft by
1.3 here, the fixed map trails by 0.7, the map switched off by 21.6. At head dim 16 the unscaled kernel
(``qk_scale=1.0``) still learns (72.6), so the guard does not catch it; the default ``qk_scale`` is pinned
by ``tests/mixers/test_laplacian.py``.

Why the bounds hold on any x86-64 CPU: another CPU (other GEMM kernels, another vector width) changes the
float32 rounding, and through the chaos above that is another draw of each seed's run, not a bias: both
machines above agree within the seed noise. The 6-seed mean's standard error is std/√6 ≈ 1-1.2 points, so the
floor sits ~10 standard errors below laplacian's mean and ~10 above the map-switched-off mean, and the gap
to soft (≤ 8) ~5 standard errors of a difference above the measured ones (-1.3 and 1.2).
"""
import pytest
import torch
import torch.nn.functional as F

import vitmix

SEEDS = (0, 1, 2, 3, 4, 5)
STEPS, BATCH, LR = 120, 128, 4e-3
LAPLACIAN_FLOOR = 66.0        # % validation top-1, 6-seed mean
MAX_GAP_TO_SOFT = 8.0         # points, 6-seed means


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0 - 0.3) / 0.4
    return x, torch.tensor(d.target)


def _tiny_run(digits, mixer: str, seed: int, **options) -> float:
    """Validation top-1 (%) after the guard's fixed recipe."""
    x, y = digits
    train, val = torch.arange(0, 512), torch.arange(1400, len(x))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # the numbers above are for one thread
    try:
        torch.manual_seed(seed)
        model = vitmix.create_model("vit_nano_patch4_32", mixer=mixer, mixer_options=options, img_size=8, in_chans=1,
                                    num_classes=10, patch_size=2, embed_dim=32, depth=2, num_heads=2)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        draw = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(STEPS):
            idx = train[torch.randint(0, len(train), (BATCH,), generator=draw)]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        model.eval()
        with torch.no_grad():
            return (model(x[val]).argmax(-1) == y[val]).float().mean().item() * 100
    finally:
        torch.set_num_threads(threads)


def _mean(digits, mixer: str, **options) -> float:
    return sum(_tiny_run(digits, mixer, seed, **options) for seed in SEEDS) / len(SEEDS)


@pytest.mark.slow
def test_laplacian_learns_the_tiny_problem_and_stays_near_soft(digits):
    laplacian, soft = _mean(digits, "laplacian"), _mean(digits, "soft")
    assert laplacian >= LAPLACIAN_FLOOR, f"laplacian {laplacian:.1f} % < {LAPLACIAN_FLOOR} (soft {soft:.1f} %)"
    assert soft - laplacian <= MAX_GAP_TO_SOFT, f"laplacian {laplacian:.1f} % vs soft {soft:.1f} %"


@pytest.mark.slow
def test_the_guard_catches_the_normalisation_switched_off(digits):
    """The guard can fail: the same problem with the injective map off stays below the bound."""
    assert _mean(digits, "laplacian", normalize=False) < LAPLACIAN_FLOOR
