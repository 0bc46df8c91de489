"""A learning regression guard that runs in seconds (issue 23, deliverable 5).

A fixed tiny problem: the bundled 8×8 digits at their native size, patch 2 (a 4×4 grid of 16 tokens, so
4 landmarks), a 2-block ViT of width 32 with 2 heads, 120 AdamW steps of 128 images drawn from the first
512 digits, validation on the last 397. CPU runs are deterministic for a seed and thread count, so the
numbers below repeat on this machine; another CPU moves them by less than the seed noise the margins
allow for.

Measured (6 seeds, mean ± std of validation top-1, %; ``_tiny_run`` below, one thread, AMD EPYC (AVX2),
December 3 2026; the laplacian rows again after ``mean_weight=0.0`` became the default):

| entry | mean ± std | per seed |
|---|---|---|
| softmax | 53.9 ± 11.3 | 50.1, 64.5, 49.1, 35.0, 62.5, 62.5 |
| soft | 77.2 ± 3.4 | 76.6, 74.6, 73.6, 82.4, 75.6, 80.6 |
| laplacian (defaults) | 64.9 ± 7.5 | 71.3, 66.5, 66.2, 50.1, 67.0, 68.5 |
| laplacian, ``mean_weight=None`` (the fixed map) | 56.2 ± 8.8 | 48.9, 46.3, 68.5, 51.1, 63.5, 58.7 |
| laplacian, ``normalize=False`` (the injective map off) | 37.8 ± 12.0 | 45.3, 33.2, 38.3, 28.0, 57.2, 24.9 |

The problem is chaotic in the last bits: changes that only reorder float32 sums moved laplacian's
seed 0 from 70.3 to 48.9 % (its 3-seed mean from 62.6 to 54.6), so the guard averages 6 seeds. The
bound for ``laplacian`` is a 6-seed mean ≥ 50: chance is 10, the defaults clear it by 15 points (the
fixed map by 6) and the map switched off falls 12 short. The distance to ``soft`` may be at most 25
points: on 4 landmarks laplacian trails soft by 12 here (the fixed map by 21; at the demo's 16 and at
49 landmarks it catches up, see ``benchmarks/results/learning/``), and the map switched off widens the
gap to 39. The default
``qk_scale`` itself is pinned by ``tests/mixers/test_laplacian.py``.
"""
import pytest
import torch
import torch.nn.functional as F

import vitmix

SEEDS = (0, 1, 2, 3, 4, 5)
STEPS, BATCH, LR = 120, 128, 4e-3
LAPLACIAN_FLOOR = 50.0        # % validation top-1, 6-seed mean
MAX_GAP_TO_SOFT = 25.0        # points, 6-seed means


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
