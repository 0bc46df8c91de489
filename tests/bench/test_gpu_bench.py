"""The CUDA side of vitmix.bench and benchmarks/gpu.py, as far as a CPU machine can check it.

The CUDA timing, memory and environment code is driven through fakes of the ``torch.cuda`` functions it
calls (events, synchronize, the memory counters, the device queries); the no-GPU error paths run for
real; gpu.py's plan, goals and writer run on synthetic rows, and its builders measure tiny CPU shapes.
"""
import importlib.util
import json
import pathlib
import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from vitmix.bench import env as bench_env
from vitmix.bench import memory as bench_memory
from vitmix.bench import timing as bench_timing

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gpu():
    """benchmarks/gpu.py as a module (registered in sys.modules: its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location("bench_script_gpu", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


# ------------------------------------------------------------------------------- fakes of torch.cuda
class FakeClock:
    """``time.perf_counter`` that only the fake GPU work advances."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def fake_cuda(monkeypatch, durations, clock=None):
    """Fake ``torch.cuda.Event`` / ``synchronize``: the k-th recorded event pair spans ``durations[k]``
    seconds. Returns the log of calls (``"sync"``, ``"record"``)."""
    log = []
    spans = iter(durations)

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            log.append("record")
            self.t = len([x for x in log if x == "record"])

        def elapsed_time(self, end):
            assert log[-1] == "sync", "elapsed_time read before a synchronize"
            return next(spans) * 1e3  # milliseconds, like CUDA

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    return log


def test_cuda_timing_is_event_median_after_synchronised_warmup(monkeypatch):
    durations = [0.004, 0.002, 0.003, 0.010, 0.001]
    log = fake_cuda(monkeypatch, durations)
    res = bench_timing.time_call(lambda: log.append("call"), "cuda", min_run_time=0.0, min_samples=5)
    assert res.method == "CUDA events"
    assert res.samples == durations and res.median_s == 0.003
    # two warm-up calls (the first one compiles), each between synchronizes; then five timed calls, each
    # between two recorded events and read after a synchronize
    assert log == ["sync", "call", "sync"] * 2 + ["record", "call", "record", "sync"] * 5


def test_cuda_timing_of_a_call_longer_than_the_cap_is_the_last_warmup_call(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_timing.time, "perf_counter", clock)
    fake_cuda(monkeypatch, [])
    steps = iter([9.0, 5.0])  # the first call compiles (9 s), the second is the real cost (5 s)

    def slow():
        clock.now += next(steps)

    res = bench_timing.time_call(slow, "cuda", long_call_s=2.0)
    assert res.samples == [5.0] and res.median_s == 5.0 and "warm-up" in res.method


def test_cuda_timing_stops_sampling_at_max_seconds(monkeypatch):
    fake_cuda(monkeypatch, [0.6, 0.7, 0.5, 0.4])
    res = bench_timing.time_call(lambda: None, "cuda", min_run_time=100.0, min_samples=3, max_seconds=1.0)
    assert res.samples == [0.6, 0.7]  # 1.3 s of samples >= 1 s: no third one


def test_cuda_peak_memory_is_max_allocated_minus_the_baseline(monkeypatch):
    log = []
    state = {"allocated": 3000, "peak": 3000}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: log.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: log.append("max") or state["peak"])

    def call():
        log.append("call")
        state["peak"] = 3000 + 4096  # the inputs (3000 bytes, allocated before) are not counted

    res = bench_memory.peak_memory(call, "cuda")
    assert res.peak_bytes == 4096 and res.method == bench_memory.CUDA_METHOD
    assert log == ["sync", "reset", "call", "sync", "max"]


def test_cuda_environment_names_gpu_driver_and_capability(monkeypatch):
    props = types.SimpleNamespace(major=9, minor=0, total_memory=141 * 2 ** 30, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ran = types.SimpleNamespace(stdout="570.86.15\n")
    monkeypatch.setattr(bench_env.subprocess, "run", lambda *a, **k: ran)
    env = bench_env.environment("cuda")
    assert env["device_name"] == env["gpu"] == "NVIDIA H200" and env["timing_method"] == "CUDA events"
    assert (env["gpu_capability"], env["gpu_memory_gib"], env["gpu_sm_count"], env["driver"]) == \
        ("9.0", 141.0, 132, "570.86.15")
    from vitmix.bench.report import gpu_lines

    assert gpu_lines(env)[0].startswith("- GPU: NVIDIA H200 (compute capability 9.0, 141.0 GiB, 132 SMs), driver 570")
    assert gpu_lines(bench_env.environment("cpu")) == []


def test_driver_version_without_nvidia_smi_is_none(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(bench_env.subprocess, "run", missing)
    assert bench_env.driver_version() is None


# ------------------------------------------------------------------------------- no GPU: real errors
def test_bench_device_cuda_without_gpu_is_a_one_line_error(monkeypatch, capsys):
    from vitmix.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--mixers", "soft", "--tokens", "64", "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA device is visible" in err and err.startswith("vitmix bench: error:")


def test_cuda_index_beyond_the_visible_devices_is_rejected(monkeypatch):
    from vitmix.bench.sweep import BenchConfig, validate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="only 1 CUDA device"):
        validate(BenchConfig(kind="mixers", names=["soft"], device="cuda:3"))
    validate(BenchConfig(kind="mixers", names=["soft"], device="cuda:0", dtype="fp16"))  # fp16 is a dtype now


def test_gpu_script_without_gpu_exits_2_with_one_line(gpu, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA device is visible" in err and "--dry-run" in err


# ------------------------------------------------------------------------------------------ dry run
def _listed(out: str):
    """The numbered entry lines of a dry run."""
    return [line for line in out.splitlines() if re.match(r"\s*\d+  (op|kernel|layer|model) ", line)]


def test_dry_run_lists_every_measurement_and_their_count(gpu, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the dry run needs no GPU
    assert gpu.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    listed = _listed(out)
    # bf16 × (4 sizes × (8 ops × 2 passes + 2 kernels + 4 layers × 2 passes) + 2 images × 4 models × 1 pass)
    assert len(listed) == 4 * (8 * 2 + 2 + 4 * 2) + 2 * 4 == 112
    assert "112 measurements (expected 112" in out
    assert len({line.split(None, 1)[1] for line in listed}) == 112  # no entry twice
    assert any("op     softmax_cudnn          12×64    bf16 fwd+bwd N=65536" in line for line in listed)
    assert any("model  pvt_v2_b1              batch 32 bf16 fwd+bwd 448²" in line for line in listed)
    assert listed[0].split()[1:] == ["op", "softmax", "6×64", "bf16", "fwd", "N=1024"]
    # what the goals read runs first: ops, kernels and models before any layer
    sections = [line.split()[1] for line in listed]
    assert sections.index("layer") > max(i for i, s in enumerate(sections) if s == "model")
    assert "laplacian op ≥ 35× SDPA at N=65536" in out and "laplacian op ≥ 25× cuDNN SDPA at N=65536" in out


def test_quick_dry_run_is_a_few_sizes(gpu, capsys):
    assert gpu.main(["--dry-run", "--quick", "--dtypes", "bf16", "fp32"]) == 0
    out = capsys.readouterr().out
    # 2 dtypes × (2 sizes × 26 + 1 image × 4 models)
    assert len(_listed(out)) == 2 * (2 * 26 + 4) == 112 == gpu.expected_count(2, 1, 2)


def test_op_rows_run_the_mixers_default_newton_settings(gpu):
    """The op rows measure what the layers run: the Newton–Schulz settings come from the mixer classes."""
    from vitmix.mixers import get_mixer_class

    lap, soft = gpu.mixer_op_settings("laplacian"), gpu.mixer_op_settings("soft")
    layer = get_mixer_class("laplacian")(64, 2)
    assert (lap["iters"], lap["alpha"], lap["eps"], lap["lam"], lap["norm_eps"]) == \
        (layer.newton_iters, layer.newton_alpha, layer.newton_eps, layer.lam, layer.norm_eps) == (10, "transpose",
                                                                                                   0.01, 4.0, 1e-3)
    layer = get_mixer_class("soft")(64, 2)
    assert (soft["iters"], soft["alpha"], soft["eps"]) == (layer.newton_iters, layer.newton_alpha, layer.newton_eps)
    assert soft["alpha"] == "safe" and "lam" not in soft


def test_device_other_than_cuda_or_cpu_is_refused(gpu, capsys):
    with pytest.raises(SystemExit):
        gpu.main(["--device", "mps"])
    assert "--device must be cuda, cuda:i or cpu" in capsys.readouterr().err


# --------------------------------------------------------------------------------- goals (synthetic)
def _row(section, name, size, dim=384, heads=6, ms=1.0, peak=None, dtype="bf16", pass_name="fwd+bwd", **extra):
    return dict(section=section, name=name, size=size, dim=dim, heads=heads, dtype=dtype, pass_name=pass_name,
                batch=1, status="ok", median_ms=ms, peak_mib=peak, note="", **extra)


#: an H100 SXM as torch describes it: 132 SMs, compute capability 9.0, 1980 MHz boost clock
H100 = {"gpu_sm_count": 132, "gpu_capability": "9.0", "gpu_clock_mhz": 1980.0}


def test_goals_pass_fail_and_not_measured(gpu):
    rate = gpu.fp32_issue_rate(H100)
    rows = [_row("op", "softmax", 16384, ms=50.0, sdpa_backend="flash"), _row("op", "laplacian", 16384, ms=5.0),
            _row("op", "softmax_cudnn", 16384, ms=40.0, sdpa_backend="cudnn"),
            _row("op", "softmax", 65536, ms=800.0), _row("op", "laplacian", 65536, ms=40.0),
            _row("op", "softmax", 16384, ms=20.0, pass_name="fwd"), _row("op", "laplacian", 16384, ms=2.0,
                                                                          pass_name="fwd"),
            _row("op", "fibottention", 16384, 768, 12, ms=1.0),  # no 12-head softmax row: not measured
            # 1e9 FP32 ops in 0.05 ms: 2e13 op/s of the H100's 3.345e13
            _row("kernel", "laplacian_kernel", 4096, ms=1.0, pass_name="fwd", io_mib=10.0, gbs=1.0, fp32_ops=1e6),
            _row("kernel", "laplacian_kernel", 65536, ms=0.05, pass_name="fwd", io_mib=50.0, gbs=1000.0,
                 fp32_ops=1e9),
            _row("model", "pvt_v2_b1", 224, 0, 0, ms=100.0, throughput=320.0),
            _row("model", "laplacianformer_tiny", 224, 0, 0, ms=80.0, throughput=400.0)]
    rows += [_row("op", "laplacian", n, peak=n / 100) for n in (1024, 4096, 16384)]            # linear
    rows += [_row("op", "fibottention", n, 768, 12, peak=(n / 100) ** 2) for n in (1024, 4096)]  # 2 sizes only
    goals = {g["goal"].split(" (")[0].replace(", forward + backward", ""): g for g in gpu.evaluate_goals(rows, rate)}
    got = {k: (g["status"], g["measured"]) for k, g in goals.items()}
    assert got["laplacian op ≥ 8× SDPA at N=16384"] == ("PASS", 10.0)
    assert got["laplacian op ≥ 35× SDPA at N=65536"] == ("FAIL", 20.0)
    assert got["laplacian op ≥ 6× cuDNN SDPA at N=16384"] == ("PASS", 8.0)
    assert got["laplacian op ≥ 25× cuDNN SDPA at N=65536"] == ("NOT MEASURED", None)
    assert got["laplacian op ≥ 6× SDPA at N=16384, forward only"] == ("PASS", 10.0)
    assert got["laplacian op ≥ 35× SDPA at N=65536, forward only"] == ("NOT MEASURED", None)
    assert got["fibottention op ≥ 3× SDPA at N=16384"] == ("NOT MEASURED", None)
    issue = got["Laplacian kernel-matrix kernel at ≥ 50% of the FP32 issue rate"]
    assert issue[0] == "PASS" and issue[1] == pytest.approx(2e13 / (132 * 128 * 1980e6), rel=1e-12)
    assert got["laplacian op peak memory linear in N"] == ("PASS", pytest.approx(1.0, abs=1e-12))
    assert got["fibottention op peak memory linear in N"][0] == "NOT MEASURED"  # a slope needs 3 sizes
    assert got["laplacianformer_tiny trains faster than pvt_v2_b1 at 224²"] == ("PASS", 1.25)
    assert got["laplacianformer_tiny trains faster than pvt_v2_b1 at 448²"] == ("NOT MEASURED", None)
    assert "SDPA (flash) 50 ms / laplacian 5 ms" in goals["laplacian op ≥ 8× SDPA at N=16384"]["detail"]
    # without an SM clock (a torch without clock_rate) the issue-rate goal is not measured, never guessed
    no_clock = gpu.evaluate_goals(rows, gpu.fp32_issue_rate(dict(H100, gpu_clock_mhz=None)))
    assert [g["status"] for g in no_clock if "issue rate" in g["goal"]] == ["NOT MEASURED"]


def test_floors_are_the_issue_43_arithmetic(gpu):
    """On an H100 the Laplacian op's forward + backward needs ~0.18 ms of FP32 issue at 16k, SDPA-flash ~4.8 ms."""
    rows = [_row("op", "laplacian", 16384, ms=0.55)]
    got = {(f["op"], f["size"], f["pass_name"]): f for f in gpu.floors(rows, gpu.fp32_issue_rate(H100))}
    assert got["laplacian", 16384, "fwd+bwd"]["floor_ms"] == pytest.approx(0.184, abs=5e-4)
    assert got["laplacian", 65536, "fwd+bwd"]["floor_ms"] == pytest.approx(0.737, abs=5e-4)
    assert got["laplacian", 16384, "fwd+bwd"]["measured_ms"] == 0.55
    assert got["softmax", 16384, "fwd+bwd"]["floor_ms"] == pytest.approx(4.81, abs=0.01)
    assert got["softmax", 65536, "fwd+bwd"]["floor_ms"] == pytest.approx(77.0, abs=0.1)
    assert got["softmax_cudnn", 16384, "fwd+bwd"]["floor_ms"] < got["softmax", 16384, "fwd+bwd"]["floor_ms"]
    assert got["softmax", 16384, "fwd"]["measured_ms"] is None
    assert gpu.fp32_issue_rate(dict(H100, gpu_capability="8.0", gpu_sm_count=108, gpu_clock_mhz=1410.0)) == \
        108 * 64 * 1410e6  # A100: 64 FP32 lanes per SM


def test_quadratic_memory_fails_the_linear_goal(gpu):
    rows = [_row("op", "fibottention", n, 768, 12, peak=(n / 100) ** 2) for n in (1024, 2048, 4096)]
    goal = next(g for g in gpu.evaluate_goals(rows, None) if g["goal"].startswith("fibottention op peak memory"))
    assert goal["status"] == "FAIL" and goal["measured"] == pytest.approx(2.0, abs=1e-12)


# ------------------------------------------------------------------------------- run_entry outcomes
def test_oom_cap_budget_and_errors_become_rows(gpu, monkeypatch):
    e = gpu.Entry("op", "softmax", 1024, 384, 6, "bf16", "fwd+bwd")
    bigger = gpu.Entry("op", "softmax", 2048, 384, 6, "bf16", "fwd+bwd")
    budget = gpu.Budget(seconds=100.0, call_cap_s=2.0, min_run_time=0.01)

    def oom(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setattr(gpu, "measure_entry", oom)
    assert gpu.run_entry(e, "cpu", budget)["status"] == "OOM"
    assert gpu.run_entry(bigger, "cpu", budget) | {} == dict(gpu._row(bigger), status="skipped",
                                                             note="OOM at a smaller size (1024)")

    def broken(*args):
        raise RuntimeError("an illegal memory access\nsecond line")

    monkeypatch.setattr(gpu, "measure_entry", broken)
    row = gpu.run_entry(gpu.Entry("op", "soft", 1024, 384, 6, "bf16", "fwd"), "cpu", budget)
    assert (row["status"], row["note"]) == ("error", "RuntimeError: an illegal memory access")

    monkeypatch.setattr(gpu, "measure_entry", lambda e, *a: dict(gpu._row(e), status="ok", median_ms=3000.0,
                                                                 capped=True))
    slow = gpu.Entry("layer", "soft", 1024, 384, 6, "fp32", "fwd")
    assert gpu.run_entry(slow, "cpu", budget)["note"] == "timed once (slower than the call cap)"
    assert gpu.run_entry(gpu.Entry("layer", "soft", 2048, 384, 6, "fp32", "fwd"), "cpu", budget)["status"] == "skipped"
    spent = gpu.Budget(seconds=-1.0, call_cap_s=2.0, min_run_time=0.01)
    assert gpu.run_entry(e, "cpu", spent)["status"] == "not run"


# ------------------------------------------------------------------------------- real measurements
def test_builders_measure_tiny_cpu_shapes(gpu):
    """The same code that runs on the GPU, on CPU tensors: every section yields a complete row."""
    cap, rows = 5.0, []
    for e in (gpu.Entry("op", "laplacian", 64, 32, 2, "bf16", "fwd+bwd"),
              gpu.Entry("op", "softmax", 64, 32, 2, "fp32", "fwd"),
              gpu.Entry("op", "fibottention", 64, 32, 2, "fp32", "fwd+bwd"),
              gpu.Entry("layer", "soft", 64, 32, 2, "bf16", "fwd+bwd"),
              gpu.Entry("model", "deit_tiny_patch16_224", 32, 0, 0, "fp32", "fwd", 2)):
        rows.append(gpu.measure_entry(e, "cpu", cap, min_run_time=0.01))
    for r in rows:
        assert r["status"] == "ok" and r["median_ms"] > 0 and r["tflops"] > 0 and r["peak_mib"] is not None
    assert rows[1]["sdpa_backend"] == "flash (CPU)"
    assert rows[-1]["throughput_unit"] == "images/s" and rows[-1]["throughput"] == pytest.approx(
        2 / (rows[-1]["median_ms"] / 1e3))
    kernel = gpu.measure_entry(gpu.Entry("kernel", "laplacian_kernel", 64, 32, 2, "bf16", "fwd"), "cpu", cap, 0.01)
    # bf16 q (1×2×64×16) and landmarks (1×2×49×16), float32 output (1×2×64×49)
    assert kernel["io_mib"] * 2 ** 20 == 2 * (64 * 16 * 2 + 49 * 16 * 2 + 64 * 49 * 4)
    assert kernel["gbs"] == pytest.approx(kernel["io_mib"] * 2 ** 20 / (kernel["median_ms"] / 1e3) / 1e9)


def test_cudnn_row_on_cpu_is_skipped_with_the_reason(gpu):
    budget = gpu.Budget(seconds=60.0, call_cap_s=2.0, min_run_time=0.01)
    row = gpu.run_entry(gpu.Entry("op", "softmax_cudnn", 64, 32, 2, "bf16", "fwd"), "cpu", budget)
    assert (row["status"], row["note"]) == ("skipped", "cuDNN attention needs a CUDA device")


def test_model_without_an_image_size_option_is_built_as_it_is():
    """timm's pvt_v2_b1 (the goal's baseline) has no ``img_size``: it takes any image size as built;
    other build errors still propagate."""
    from vitmix.bench.sweep import BenchConfig, build_point

    point = build_point(BenchConfig(kind="models", names=["pvt_v2_b1"], batch=1), "pvt_v2_b1", 64, "cpu")
    assert type(point.module).__name__ == "PyramidVisionTransformerV2" and point.inputs.shape == (1, 3, 64, 64)
    with pytest.raises(ValueError, match="pvt_v2_b1x"):
        build_point(BenchConfig(kind="models", names=["pvt_v2_b1x"]), "pvt_v2_b1x", 64, "cpu")


def test_sdpa_backend_names_the_kernel_that_ran():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vitmix.bench.sdpa import sdpa_backend

    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    assert sdpa_backend(lambda: F.scaled_dot_product_attention(q, q, q)) == "flash (CPU)"
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_backend(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward()) == "math"
    assert sdpa_backend(lambda: q @ q.transpose(-1, -2)) == "none"


def test_layer_call_leaves_no_gradients_behind():
    """Between two timed forward + backward calls nothing is left allocated: the memory baseline is the
    parameters and the input, on CPU and CUDA alike."""
    from vitmix.bench.sweep import BenchConfig, build_point, point_call

    config = BenchConfig(kind="mixers", names=["soft"], dim=32, heads=2)
    point = build_point(config, "soft", 64, "cpu")
    point_call(point, "fwd+bwd", "cpu", "fp32")()
    assert all(p.grad is None for p in point.module.parameters())


# ------------------------------------------------------------------------------------------- writer
def test_writer_makes_table_csv_json_and_png(gpu, tmp_path):
    rows = [_row("op", "softmax", n, ms=n / 100, peak=n / 1000, sdpa_backend="flash") for n in (1024, 4096)]
    rows += [_row("op", "laplacian", n, ms=n / 1000, peak=n / 500) for n in (1024, 4096)]
    rows += [_row("kernel", "laplacian_kernel", 1024, ms=0.01, pass_name="fwd", io_mib=1.0, gbs=104.9, tflops=0.1,
                  fp32_ops=1.6e8),
             dict(_row("op", "softmax", 65536), status="OOM", note="out of memory", median_ms=None),
             _row("model", "weightformer_tiny", 224, 0, 0, ms=5.0, throughput=6400.0, throughput_unit="images/s")]
    gpu.add_ratios(rows)
    assert rows[2]["speedup_vs_baseline"] == pytest.approx(10.0)
    result = {"environment": {"gpu": "Fake GPU 1", "device_name": "Fake GPU 1"}, "bandwidth_gbs": 4000.0,
              "fp32_issue_rate": 3.2e13, "rows": rows, "elapsed_s": 1.0, "goals": gpu.evaluate_goals(rows, 3.2e13),
              "command": "x",
              "warnings": ["vitmix: sparse_diagonal_attention runs the PyTorch path instead of Triton: fp32"]}
    paths = gpu.write_outputs(result, tmp_path / gpu.slug("Fake GPU 1"))
    folder = tmp_path / "fake-gpu-1"
    assert sorted(p.name for p in paths) == ["results.csv", "results.json", "results.md", "time_vs_n.png"]
    assert (folder / "time_vs_n.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((folder / "results.csv").read_text().strip().splitlines()) == 1 + len(rows)
    assert json.loads((folder / "results.json").read_text())["rows"][5]["status"] == "OOM"
    md = (folder / "results.md").read_text()
    assert "| NOT MEASURED |" in md and "OOM; out of memory" in md and "SDPA: flash" in md
    assert "- vitmix: sparse_diagonal_attention runs the PyTorch path instead of Triton: fp32" in md
    assert "| 50% of FP32 issue; 105 GB/s (3% of copy); 0.1 TFLOP/s |" in md
    assert "## Floors (arithmetic, not measured)" in md and "bound by CUDA-core issue" in md
    assert "| laplacian | 16384 | fwd+bwd | 0.193 |" in md   # 20 × 16384 × 49 × 64 × 6 / 3.2e13 s
    assert "| 10.00× |" in md and "| 6,400 images/s |" in md


def test_writer_without_matplotlib_writes_the_tables(gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib raises ImportError
    rows = [_row("op", "softmax", 1024, ms=1.0), _row("op", "laplacian", 1024, ms=0.5)]
    result = {"environment": {"gpu": "Fake GPU 1"}, "bandwidth_gbs": None, "rows": rows, "elapsed_s": 1.0,
              "goals": gpu.evaluate_goals(rows, None), "command": "x", "warnings": []}
    paths = gpu.write_outputs(result, tmp_path)
    assert sorted(p.name for p in paths) == ["results.csv", "results.json", "results.md"]
    assert "no time_vs_n.png" in capsys.readouterr().err


def test_main_measures_writes_and_prints_goals(gpu, monkeypatch, tmp_path, capsys):
    """The whole flow of a run with the device check pointed at the CPU and a two-entry plan."""
    entries = [gpu.Entry("op", "softmax", 64, 32, 2, "bf16", "fwd+bwd"),
               gpu.Entry("op", "laplacian", 64, 32, 2, "bf16", "fwd+bwd")]
    monkeypatch.setattr(gpu, "parse_device", lambda *args, **kwargs: torch.device("cpu"))
    monkeypatch.setattr(gpu, "plan", lambda *args: entries)
    real_bandwidth = gpu.measure_bandwidth
    monkeypatch.setattr(gpu, "measure_bandwidth", lambda device, nbytes: real_bandwidth(device, 2 ** 20, 0.01))
    assert gpu.main(["--min-run-time", "0.01", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[2/2] op     laplacian" in out
    assert "NOT MEASURED laplacian op ≥ 8× SDPA at N=16384, forward + backward" in out
    result = json.loads((tmp_path / "results.json").read_text())
    assert [r["status"] for r in result["rows"]] == ["ok", "ok"] and result["bandwidth_gbs"] > 0
    assert result["command"].startswith("python benchmarks/gpu.py --min-run-time 0.01")
    assert result["rows"][1]["speedup_vs_baseline"] == pytest.approx(
        result["rows"][0]["median_ms"] / result["rows"][1]["median_ms"])
