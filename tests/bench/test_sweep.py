"""`vitmix bench` end to end: files written, baseline and ratios, skips, budget, bad input."""
import csv
import json
import math

import pytest
import torch

from vitmix.bench import BenchConfig, run_sweep
from vitmix.bench.report import fit_slope, load_results, write_results
from vitmix.bench.points import point_builder
from vitmix.bench.sweep import _extrapolate, _is_oom, parse_mixer_spec, token_grid
from vitmix.bench.targets import model_kwargs, resolve_targets
from vitmix.cli import main


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _eager_l1(monkeypatch):
    # the eager L1 path (cdist) is the one FlopCounterMode sees
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_tiny_mixer_sweep_writes_every_file(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "--mixers", "soft,laplacian", "--tokens", "64,144", "--dim", "32", "--heads", "2",
               "--min-run-time", "0.01", "--max-seconds", "120", "--out", str(out), "--no-progress"])
    assert rc == 0
    for name in ("results.csv", "results.json", "results.md", "time.png", "memory.png"):
        assert (out / name).stat().st_size > 0, name
    rows = _rows(out / "results.csv")
    # softmax baseline added automatically; 3 mixers x 2 sizes x 2 passes
    assert len(rows) == 12 and {r["name"] for r in rows} == {"softmax", "soft", "laplacian"}
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert float(r["median_ms"]) > 0 and float(r["throughput"]) > 0 and float(r["gflops"]) > 0
        assert float(r["peak_mib"]) > 0 and r["memory_method"].startswith("MemTracker")
        assert float(r["speedup_vs_softmax"]) > 0
    base = [r for r in rows if r["name"] == "softmax"]
    assert all(float(r["speedup_vs_softmax"]) == 1.0 for r in base)
    assert all("num_landmarks=49" in r["options"] for r in rows if r["name"] == "soft")
    payload = json.loads((out / "results.json").read_text())
    env = payload["environment"]
    for key in ("cpu", "torch_threads", "torch", "device", "memory_method", "flop_unit"):
        assert env[key], key
    md = (out / "results.md").read_text()
    assert "speed-up vs softmax" in md and "slope" in md and "![time.png](time.png)" in md
    printed = capsys.readouterr().out
    assert "| 144 | fwd | soft |" in printed


def test_model_sweep_skips_invalid_sizes_with_a_reason(tmp_path):
    res = run_sweep(BenchConfig(kind="models", names=["vit_nano_patch4_32"], sizes=[32, 34], passes=("fwd",),
                                baseline_model="vit_tiny_patch4_32", min_run_time=0.01, measure_memory=False),
                    progress=False)
    by = {(r["name"], r["size"]): r for r in res.rows}
    assert by[("vit_nano_patch4_32", 32)]["status"] == "ok"
    assert by[("vit_nano_patch4_32", 32)]["throughput_unit"] == "images/s"
    assert by[("vit_nano_patch4_32", 32)]["tokens"] == 65
    bad = by[("vit_nano_patch4_32", 34)]
    assert bad["status"] == "skipped" and "divisible" in bad["note"]
    assert by[("vit_tiny_patch4_32", 32)]["baseline"]
    files = write_results(res, str(tmp_path), command="test")
    assert any(f.endswith("time.png") for f in files)
    again, command = load_results(str(tmp_path / "results.json"))  # e.g. to redraw the plots
    assert command == "test" and again.config == res.config
    assert [r.get("median_ms") for r in again.rows] == [r.get("median_ms") for r in res.rows]


def test_a_timm_vit_is_benchmarked_with_a_mixer():
    """`--models deit_tiny_patch16_224:mixer=laplacian`: timm's ViT with the mixer (and its options) in its blocks."""
    spec = "deit_tiny_patch16_224:mixer=laplacian:landmark_stride=2"
    config = BenchConfig(kind="models", names=["deit_tiny_patch16_224", spec], sizes=[32], passes=("fwd",),
                         baseline_model="deit_tiny_patch16_224", min_run_time=0.01, measure_memory=False,
                         measure_flops=False)
    targets = resolve_targets(config)
    assert [(t.label, t.baseline) for t in targets] == [("deit_tiny_patch16_224", True), (spec, False)]
    assert model_kwargs(targets[1]) == dict(mixer="laplacian", mixer_options={"landmark_stride": 2})
    built = point_builder("models")(targets[1], 32, config, torch.device("cpu"))
    layers = [b.attn for b in built.module.blocks]
    assert {a.mixer_name for a in layers} == {"laplacian"} and layers[0].landmark_stride == 2
    res = run_sweep(config, progress=False)
    rows = {r["name"]: r for r in res.rows}
    assert rows[spec]["status"] == "ok" and rows["deit_tiny_patch16_224"]["baseline"]


def test_budget_exceeded_stops_cleanly_and_writes_partial_results(tmp_path):
    rc = main(["bench", "--mixers", "softmax", "--tokens", "64,256,1024,4096", "--dim", "32", "--heads", "2",
               "--passes", "fwd", "--min-run-time", "0.4", "--max-seconds", "0.3", "--no-memory", "--no-flops",
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    rows = _rows(tmp_path / "results.csv")
    assert rows[0]["status"] == "ok"
    assert [r["status"] for r in rows[1:]] == ["not run"] * 3
    assert "budget" in rows[-1]["note"]
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["stopped_early"] is True
    assert "stopped early" in (tmp_path / "results.md").read_text()


def test_points_predicted_not_to_fit_in_memory_are_skipped():
    res = run_sweep(BenchConfig(kind="mixers", names=["softmax:fused=false"], sizes=[64, 256, 1024], dim=32,
                                heads=2, passes=("fwd+bwd",), min_run_time=0.01, measure_flops=False,
                                max_memory_gb=1.5 / 1024), progress=False)  # 1.5 MiB
    rows = [r for r in res.rows if r["name"] == "softmax:fused=false"]
    assert rows[0]["status"] == "ok" and rows[0]["peak_mib"] < 1.5
    assert rows[1]["status"] == "skipped" and "predicted peak memory" in rows[1]["note"]
    assert rows[2]["status"] == "skipped"


@pytest.mark.parametrize("argv,expect", [
    (["--mixers", "sotf"], "Did you mean: soft"),
    (["--mixers", "soft:num_landmark=16"], "Did you mean: num_landmarks"),
    (["--mixers", "soft:16"], "key=value"),
    (["--models", "vit_nano_patch4_3"], "Did you mean: vit_nano_patch4_32"),
    (["--models", "deit_tiny_patch16_224:mixer=laplacain"], "Did you mean: laplacian"),
    (["--models", "deit_tiny_patch16_224:mixer=soft:num_landmark=4"], "Did you mean: num_landmarks"),
    (["--models", "deit_tiny_patch16_224:landmark_stride=2"], "need the mixer they are for"),
    (["--mixers", "soft", "--dtype", "bf61"], "Did you mean: bf16"),
    (["--mixers", "soft", "--passes", "fwd+bw"], "Did you mean: fwd+bwd"),
    (["--mixers", "soft", "--dim", "30", "--heads", "4"], "not divisible"),
    (["--mixers", "soft", "--sizes", "224"], "--sizes is for --models"),
])
def test_bad_input_is_one_line_error(argv, expect, capsys, tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1


def test_helpers():
    t = parse_mixer_spec("softmax:fused=false:qkv_bias=1")
    assert t.name == "softmax" and t.options == {"fused": False, "qkv_bias": 1}
    assert token_grid(196) == (14, 14) and token_grid(200) == (10, 20) and token_grid(13) == (1, 13)
    assert fit_slope([1, 2, 4, 8], [3, 12, 48, 192]) == pytest.approx(2.0)
    assert fit_slope([5], [1]) is None
    assert _is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert not _is_oom(RuntimeError("shape mismatch"))
    assert math.isfinite(fit_slope([1, 10], [1, 10]))
    assert _extrapolate([(1, 1.0), (2, 2.0)], 4) == pytest.approx(4.0)       # linear stays linear
    assert _extrapolate([(1, 1.0), (2, 64.0)], 4) == pytest.approx(16.0)     # a slow outlier is capped
    assert _extrapolate([(2, 3.0)], 4) == pytest.approx(12.0)                # one point: quadratic
    assert _extrapolate([], 4) is None


def test_bf16_autocast_sweep_runs_every_mixer():
    res = run_sweep(BenchConfig(kind="mixers", names=["all"], sizes=[64], dim=32, heads=2, dtype="bf16",
                                min_run_time=0.01, measure_memory=False), progress=False)
    assert {r["name"] for r in res.rows} >= {"softmax", "soft", "laplacian", "fibottention"}
    bad = [(r["name"], r["pass"], r["note"]) for r in res.rows if r["status"] != "ok"]
    assert not bad and all(r["dtype"] == "bf16" and r["gflops"] > 0 for r in res.rows)


def test_a_layer_is_built_with_its_class_bench_options(monkeypatch):
    """The bench reads ``bench_options`` from the mixer class (no table of mixer names in the bench); the
    spec's options win, and a mixer without any gets TokenMixer's empty default."""
    from vitmix import mixers
    from vitmix.bench.points import layer_options
    from vitmix.mixers import registry

    assert dict(mixers.TokenMixer.bench_options) == {}
    for name in ("soft", "soft_norm", "laplacian"):
        assert layer_options(parse_mixer_spec(name)) == {"num_landmarks": 49}
    assert layer_options(parse_mixer_spec("laplacian:num_landmarks=auto")) == {"num_landmarks": "auto"}
    assert layer_options(parse_mixer_spec("softmax")) == {}

    class Widened(mixers.get_mixer_class("softmax")):
        bench_options = {"fused": False}

    monkeypatch.setitem(registry._MIXERS, "widened_softmax", Widened)
    monkeypatch.setattr(Widened, "mixer_name", "widened_softmax", raising=False)
    assert layer_options(parse_mixer_spec("widened_softmax")) == {"fused": False}
    assert layer_options(parse_mixer_spec("widened_softmax:fused=true")) == {"fused": True}
