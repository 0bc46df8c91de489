"""Every registered vitmix classifier gives the same outputs as when this file's fingerprints were
recorded (same seed, same input): refactors must not change a model silently.

The fingerprints are computed in float64 end to end: the model is built with float64 as torch's default
dtype (its initialisation draws and arithmetic are float64 too) and run on a float64 input, through the
same code paths as float32 (the C kernels, the fused Nyström C forward and Newton–Schulz have float64
instances; only WeightFormer's fused oneDNN MLP is float32-only: float64 takes the plain MLP, which
tests/models/test_weightformer.py compares that path with). So the bounds cover float64 rounding only,
and they hold on any x86-64 CPU:

- What differs between machines is the order of floating-point reductions (MKL/oneDNN GEMM and conv
  kernels block the summed dimension by vector width: AVX2, AVX-512; OpenMP splits the C kernels' sums
  by thread count; glibc's libm picks FMA or non-FMA variants) and 1-ulp libm differences. Each of those
  changes a result by a few units of float64 rounding, u = 1.1e-16, relative to the sum of |terms|.
- Through a network those perturbations are amplified by its sensitivity. In float32 (u = 6e-8) the
  worst recorded cross-CPU difference was 5.5e-4 of the mean |logit| on one logit of laplacianformer_large
  (20 blocks, Newton–Schulz inverses): an amplification below 1e4, which in float64 predicts ~1e-12.
  Measured with `python tests/models/test_fingerprints.py --compare` against the values recorded on an
  AVX-512 AMD EPYC, the largest difference over all models: 5.9e-15 with torch's, MKL's and oneDNN's
  AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2, what an
  AVX2-only CPU runs), 1.8e-15 with 2 threads instead of 1, and 2.3e-12 with the C kernels off
  (VITMIX_DISABLE_C_KERNEL=1: the PyTorch composition, other algorithms and summation orders altogether).
  The float64 initialisation and inputs are bitwise the same with AVX2 and AVX-512 kernels (float32
  torch.randn is not: its AVX2 path draws differently from the generic one, another reason for float64).
  Not covered: x86-64 CPUs without AVX2 (before 2013), where torch runs its generic kernels; emulating one
  (ATEN_CPU_CAPABILITY=default) moves the pyramids' logits by ~1e-8, from the position embedding's
  interpolation, which torch computes with float32 weights in that path.
- TOLERANCE = 1e-9 relative (of the mean |logit| for single logits and of the sum of |logits| for the
  sum, which cancels) is over 400x the largest of those, and 1e6x below what a changed model moves
  (another initialisation or a missing term changes the logits by percents).

Regenerate after an intended change (and say why in the commit):
    python tests/models/test_fingerprints.py --update
"""
import contextlib
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
TOLERANCE = 1e-9


@contextlib.contextmanager
def float64_default():
    """torch's default dtype is float64 inside (parameters are created and initialised in float64)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _input_size(model) -> int:
    size = int(model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])
    # pyramids and WeightFormer accept any multiple of 32: keep the test fast
    return 64 if type(model).__name__ in ("PyramidTransformer", "WeightFormer") else size


def fingerprint(name: str) -> dict:
    """Size, parameter count and float64 logits (their sum, absolute sum and first six) of ``name``
    built with seed 0 on a seeded float64 batch of two."""
    with float64_default():
        torch.manual_seed(0)
        model = timm.create_model(name).eval()
        size = _input_size(model)
        if hasattr(model, "example_inputs"):   # video models: a clip batch (B, C, T, H, W); sequence models: ids
            x = model.example_inputs(2, generator=torch.Generator().manual_seed(1))[0]
        else:
            x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
        assert x.dtype == torch.float64 or not x.is_floating_point()          # token ids stay integers
        assert all(p.dtype == torch.float64 for p in model.parameters())
        with torch.no_grad():
            y = model(x)
    assert y.dtype == torch.float64
    return {"size": size, "params": sum(p.numel() for p in model.parameters()), "numel": y.numel(),
            "sum": float(y.sum()), "abs_sum": float(y.abs().sum()), "head": y.flatten()[:6].tolist()}


def differences(ref: dict, now: dict) -> dict:
    """How far ``now`` is from ``ref``, each relative to its scale (see the module docstring)."""
    scale = ref["abs_sum"] / ref["numel"]
    return {"abs_sum": abs(now["abs_sum"] - ref["abs_sum"]) / ref["abs_sum"],
            "sum": abs(now["sum"] - ref["sum"]) / ref["abs_sum"],
            "head": max(abs(a - b) for a, b in zip(now["head"], ref["head"])) / scale}


@pytest.mark.parametrize("name", MODELS)
def test_model_output_is_unchanged(name):
    saved = json.loads(FILE.read_text())
    assert name in saved, f"no fingerprint for {name}: run python tests/models/test_fingerprints.py --update"
    ref, now = saved[name], fingerprint(name)
    assert (now["size"], now["params"], now["numel"]) == (ref["size"], ref["params"], ref["numel"])
    assert differences(ref, now) == pytest.approx({"abs_sum": 0, "sum": 0, "head": 0}, abs=TOLERANCE)


def test_the_bounds_see_a_one_in_a_million_change():
    """A perturbation far below any model change still fails: the test above is not vacuous."""
    ref = json.loads(FILE.read_text())["vit_nano_patch4_32"]
    moved = dict(ref, head=[ref["head"][0] * (1 + 1e-6)] + ref["head"][1:])
    assert differences(ref, moved)["head"] > TOLERANCE


if __name__ == "__main__" and "--update" in sys.argv:
    FILE.write_text(json.dumps({name: fingerprint(name) for name in MODELS}, indent=1) + "\n")
    print(f"wrote {len(MODELS)} fingerprints to {FILE}")
elif __name__ == "__main__" and "--compare" in sys.argv:   # the largest difference to the recorded values
    saved = json.loads(FILE.read_text())
    worst = {name: max(differences(saved[name], fingerprint(name)).values()) for name in MODELS}
    for name, diff in sorted(worst.items(), key=lambda item: -item[1]):
        print(f"{name:36s} {diff:.2e}")
