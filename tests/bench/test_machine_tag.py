"""Timing results are filed under the machine that measured them (``vitmix.bench.env.machine_tag``), so a run
on one machine never replaces another machine's table."""
import pytest

from vitmix.bench.env import environment, machine_tag
from vitmix.cli import main

AMD = {"device": "cpu", "cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.14.1+cu130"}


@pytest.mark.parametrize("env, tag", [
    (AMD, "cpu-amd-epyc-2c-torch2.14"),
    (dict(AMD, cpu="Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", cpu_count=16),
     "cpu-intel-xeon-platinum-8480-16c-torch2.14"),
    (dict(AMD, cpu="AMD EPYC 7B13 64-Core Processor", torch="2.11.0"), "cpu-amd-epyc-7b13-2c-torch2.11"),
    (dict(AMD, device="cuda:0", device_name="NVIDIA H100 80GB HBM3", torch="2.11.0+cu128"),
     "gpu-h100-80gb-hbm3-torch2.11"),
    (dict(AMD, cpu="(R)"), "cpu-unknown-2c-torch2.14"),
])
def test_machine_tag_names_the_device_and_torch_release(env, tag):
    assert machine_tag(env) == tag


def test_machine_tag_of_this_machine_matches_its_environment():
    env = environment()
    tag = machine_tag()
    assert tag == machine_tag(env) and tag.startswith("cpu-") and f"-{env['cpu_count']}c-torch" in tag
    assert all(c.isalnum() or c in "-." for c in tag)


def test_bench_out_with_machine_placeholder_writes_under_the_machine(tmp_path):
    """``--out DIR/{machine}``: two machines' sweeps land in two folders."""
    args = ["bench", "--mixers", "softmax", "--tokens", "16", "--dim", "16", "--heads", "2", "--passes", "fwd",
            "--min-run-time", "0.01", "--no-flops", "--no-memory", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "{machine}")]) == 0
    assert (tmp_path / machine_tag() / "results.md").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [machine_tag()]


def test_every_timing_command_of_the_benchmarks_index_files_under_the_machine():
    """benchmarks/README.md's ``vitmix bench`` commands (sweeps and --spec suites) write under ``{machine}``."""
    import re
    from pathlib import Path

    index = (Path(__file__).resolve().parents[2] / "benchmarks" / "README.md").read_text()
    outs = re.findall(r"`vitmix bench [^`]*--out '([^']+)'[^`]*`", index)
    assert len(outs) >= 7
    assert [o for o in outs if not o.endswith("/{machine}")] == []
