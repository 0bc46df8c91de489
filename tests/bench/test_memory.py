"""The peak-memory probe: exact on a known allocation, and it tells linear from quadratic growth."""
import pytest
import torch

from vitmix.bench.memory import CPU_METHOD, peak_memory


@pytest.fixture(autouse=True)
def _eager_l1_one_thread(monkeypatch):
    # the eager L1 path (cdist) is the one FlopCounterMode sees; one thread keeps tiny shapes fast on a
    # shared machine
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_probe_measures_a_known_allocation():
    def fn():
        a = torch.empty(1024, 1024)  # 4 MiB
        b = torch.empty(256, 1024)   # +1 MiB while a is alive
        del a, b

    res = peak_memory(fn, "cpu")
    assert res.method == CPU_METHOD
    assert res.peak_bytes == 5 * 2 ** 20


def test_probe_excludes_what_existed_before():
    w = torch.nn.Linear(512, 512)
    x = torch.randn(8, 512)
    res = peak_memory(lambda: w(x), "cpu", [w, x])
    assert res.peak_bytes == 8 * 512 * 4  # only the output


def _fwd_bwd_peak(spec: str, n: int) -> float:
    from vitmix.bench.points import build_point, point_call
    from vitmix.bench.sweep import BenchConfig

    config = BenchConfig(kind="mixers", names=[spec], dim=64, heads=4)
    point = build_point(config, spec, n, torch.device("cpu"))
    assert point.module.hw == (int(n ** 0.5), int(n ** 0.5))
    fn = point_call(point, "fwd+bwd", torch.device("cpu"), "fp32")
    return peak_memory(fn, "cpu", [point.module, point.inputs]).peak_bytes


@pytest.mark.parametrize("spec,quadratic", [("softmax:fused=false", True), ("soft", False), ("laplacian", False)])
def test_linear_vs_quadratic_memory_growth(spec, quadratic):
    # forward+backward peak memory from N to 4N (24x24 -> 48x48 token grids), as vitmix bench measures it
    ratio = _fwd_bwd_peak(spec, 2304) / _fwd_bwd_peak(spec, 576)
    if quadratic:
        assert ratio > 10, ratio
    else:
        assert ratio < 5, ratio


def test_torch_without_mem_tracker_reports_unavailable(monkeypatch):
    """Fault injection: a torch build without torch.distributed -> the probe says so instead of failing."""
    import sys

    from vitmix.bench.memory import memory_method

    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)   # import raises ImportError
    assert memory_method("cpu") == "unavailable"
    res = peak_memory(lambda: torch.empty(10), "cpu")
    assert res.peak_bytes is None and res.method == "unavailable"


def test_environment_without_proc_cpuinfo_or_load_average(monkeypatch):
    """Fault injection: no /proc/cpuinfo and no getloadavg (non-Linux) -> platform fallbacks, no crash."""
    import builtins
    import os
    import platform

    from vitmix.bench.env import cpu_model, environment

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise OSError("no /proc here")
        return real_open(path, *args, **kwargs)

    def no_load():
        raise OSError("no load average")

    from vitmix.bench.sweep import _available_bytes

    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(os, "getloadavg", no_load)
    assert cpu_model() == (platform.processor() or platform.machine())
    env = environment()
    assert env["load_average_1m"] is None and env["cpu"] == cpu_model()
    assert _available_bytes(torch.device("cpu")) is None      # the sweep's memory-fit check is skipped
