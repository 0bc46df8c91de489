"""Every registered vitmix model gives the same outputs as when this file's fingerprints were
recorded (same seed, same input): refactors must not change a model silently.

Regenerate after an intended change (and say why in the commit):
    python tests/models/test_fingerprints.py --update
"""
import json
import pathlib
import sys

import pytest
import timm
import torch

import vitmix  # noqa: F401  (registers the models)
from vitmix.models import is_vitmix_model, model_task

FILE = pathlib.Path(__file__).with_name("fingerprints.json")
# Classifiers only: the diffusion backbones (model_task == "generation": dit_*, weightformer_dit_*) take
# model(x, t, y) and output exactly 0 at their adaLN-Zero init, so a fingerprint of them would pin nothing;
# tests/generate/test_dit.py checks them (closed-form parameter counts, block references, zero init).
MODELS = sorted(m for m in timm.list_models() if is_vitmix_model(m) and model_task(m) == "classification")


def _input_size(model) -> int:
    size = int(model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])
    # pyramids and WeightFormer accept any multiple of 32: keep the test fast
    return 64 if type(model).__name__ in ("PyramidTransformer", "WeightFormer") else size


def fingerprint(name: str) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    size = _input_size(model)
    if hasattr(model, "example_inputs"):   # video models (timesformer_*): a clip batch (B, C, T, H, W)
        x = model.example_inputs(2, generator=torch.Generator().manual_seed(1))[0]
    else:
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model(x).double()
    return {"size": size, "params": sum(p.numel() for p in model.parameters()), "numel": y.numel(),
            "sum": float(y.sum()), "abs_sum": float(y.abs().sum()), "head": y.flatten()[:6].tolist()}


@pytest.mark.parametrize("name", MODELS)
def test_model_output_is_unchanged(name):
    saved = json.loads(FILE.read_text())
    assert name in saved, f"no fingerprint for {name}: run python tests/models/test_fingerprints.py --update"
    ref, now = saved[name], fingerprint(name)
    assert now["size"] == ref["size"] and now["params"] == ref["params"]
    # fp32 forward with other reduction orders (threads, the C kernels or their PyTorch fallbacks
    # after another test forced one): ~1e-6 relative per layer, amplified through 20+ blocks and
    # Newton–Schulz (observed: 3e-7 of the absolute sum in laplacianformer_small); the sum of logits
    # cancels, so it is compared on the scale of the absolute sum. A changed model moves these by
    # orders of magnitude more. Another CPU (AVX-512 vs AVX2 GEMM kernels) rounds differently again:
    # observed 1.7e-4 of the mean |logit| on one logit of laplacianformer_large (20 blocks, 4 stages), and
    # on an AVX-512 VM 2.2e-5 of the absolute sum on the sum and 5.5e-4 of the mean |logit| on one logit of
    # laplacianformer_large/huge with the recorded code. The bounds below are ~2-4x those; a changed
    # model (another init, a missing term) moves the logits by tens of percent.
    scale = ref["abs_sum"] / ref["numel"]
    assert now["abs_sum"] == pytest.approx(ref["abs_sum"], rel=1e-4)
    assert abs(now["sum"] - ref["sum"]) <= 5e-5 * ref["abs_sum"]
    assert now["head"] == pytest.approx(ref["head"], rel=1e-4, abs=2e-3 * scale)


if __name__ == "__main__" and "--update" in sys.argv:
    FILE.write_text(json.dumps({name: fingerprint(name) for name in MODELS}, indent=1) + "\n")
    print(f"wrote {len(MODELS)} fingerprints to {FILE}")
