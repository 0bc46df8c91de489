"""`vitmix bench --compile`: compiled vs eager columns, a compile failure as a one-line note, unchanged output
without the flag.

The tests use the ``eager`` dynamo backend (traces the graph, generates no code), tiny layers and one token
count so they stay fast; they check the structure and the ratios' consistency, never wall-clock values.
"""
import csv
import json

import pytest
import torch

from vitmix.bench import BenchConfig, run_sweep
from vitmix.bench.report import COLUMNS, COMPILE_COLUMNS, write_results
from vitmix.bench.sweep import _predicted_skip, _Sweep
from vitmix.cli import main

TINY = ["--tokens", "64", "--dim", "16", "--heads", "2", "--min-run-time", "0.01", "--no-flops", "--no-memory",
        "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_compile_adds_compiled_columns_and_ratio(tmp_path, capsys):
    rc = main(["bench", "--mixers", "laplacian", *TINY, "--compile", "--compile-backend", "eager",
               "--out", str(tmp_path)])
    assert rc == 0
    with open(tmp_path / "results.csv") as fh:
        header = next(csv.reader(fh))
    assert header == COLUMNS[:-1] + COMPILE_COLUMNS + ["note"]
    rows = _rows(tmp_path / "results.csv")
    assert {(r["name"], r["pass"]) for r in rows} == {(n, p) for n in ("softmax", "laplacian")
                                                      for p in ("fwd", "fwd+bwd")}
    for r in rows:
        assert r["status"] == "ok" and r["compile_status"] == "ok", r
        eager, compiled = float(r["median_ms"]), float(r["compiled_median_ms"])
        assert eager > 0 and compiled > 0 and float(r["compile_s"]) > 0 and int(r["graph_breaks"]) >= 0
        # a ratio of this row's own paired timings (checked exactly in test_paired_ratio_alternates_and_pairs)
        assert float(r["compiled_vs_eager"]) > 0 and float(r["compiled_vs_eager_iqr"]) >= 0
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["config"]["compile"] is True and payload["config"]["compile_backend"] == "eager"
    assert all(r["compiled_vs_eager"] > 0 for r in payload["rows"])
    md = (tmp_path / "results.md").read_text()
    assert "| compiled ms | compiled / eager | compile s |" in md and "backend='eager'" in md
    assert "compiled not slower than eager (compiled / eager ≤ 1) in" in md and "of 4 compiled rows" in md
    printed = capsys.readouterr().out
    assert "| compiled ms | compiled / eager | compile s |" in printed and "of 4 compiled rows" in printed


def test_paired_ratio_alternates_and_pairs(monkeypatch):
    """compiled / eager from rounds that time both back to back, in alternating order: with a fake clock
    whose load doubles every round, each round's ratio is still exact (a ratio of two separate timings
    would mix two loads)."""
    from vitmix.bench import paired as paired_timing

    calls, load = [], [1.0]

    def fake_time_call(fn, device, min_run_time):
        calls.append(fn.__name__)
        seconds = fn.base * load[0]
        if len(calls) % 2 == 0:
            load[0] *= 2.0                          # the machine gets busier after every round
        return type("T", (), {"median_s": seconds})()

    def eager():
        pass

    def compiled():
        pass

    eager.base, compiled.base = 2.0, 1.5
    monkeypatch.setattr(paired_timing, "time_call", fake_time_call)
    paired = paired_timing.paired_ratio(eager, compiled, "cpu", min_run_time=0.1, rounds=4)
    assert calls == ["eager", "compiled", "compiled", "eager"] * 2
    assert paired.ratio == pytest.approx(0.75, rel=1e-12) and paired.ratio_iqr == pytest.approx(0.0, abs=1e-12)


def _failing_for_laplacian(real_compile):
    """``torch.compile`` whose backend raises (two-line message) for the Laplacian layer only."""
    def backend(gm, example_inputs):
        raise RuntimeError("forced failure\nsecond line that must not reach the row")

    def fake(module, **kwargs):
        if type(module).__name__.lower().startswith("laplacian"):
            kwargs["backend"] = backend
        return real_compile(module, **kwargs)
    return fake


def test_compile_failure_is_a_one_line_note_and_the_sweep_continues(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", _failing_for_laplacian(torch.compile))
    res = run_sweep(BenchConfig(kind="mixers", names=["laplacian", "soft"], sizes=[64], dim=16, heads=2,
                                min_run_time=0.01, measure_flops=False, measure_memory=False, compile=True,
                                compile_backend="eager"), progress=False)
    by_name = {}
    for r in res.rows:
        by_name.setdefault(r["name"], []).append(r)
    assert set(by_name) == {"softmax", "laplacian", "soft"}
    for r in by_name["laplacian"]:  # eager numbers kept, the compile failure said in one line
        assert r["status"] == "ok" and r["median_ms"] > 0
        assert r["compile_status"] == "failed" and r.get("compiled_median_ms") is None
        assert "compile failed: BackendCompilerFailed (RuntimeError: forced failure)" in r["note"]
        assert "\n" not in r["note"] and "second line" not in r["note"]
    for r in by_name["softmax"] + by_name["soft"]:  # the mixers after the failure still compiled
        assert r["compile_status"] == "ok" and r["compiled_vs_eager"] > 0
    write_results(res, str(tmp_path))
    md = (tmp_path / "results.md").read_text()
    assert "- compile failed: laplacian 64 fwd, laplacian 64 fwd+bwd" in md
    assert md.count("compile failed: BackendCompilerFailed (RuntimeError: forced failure)") == 2


def test_without_compile_the_output_is_unchanged(tmp_path):
    assert main(["bench", "--mixers", "softmax", *TINY, "--passes", "fwd", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "results.csv") as fh:
        assert next(csv.reader(fh)) == COLUMNS
    payload = json.loads((tmp_path / "results.json").read_text())
    assert "compile" not in payload["config"] and "compile_backend" not in payload["config"]
    assert not any(k in r for r in payload["rows"] for k in COMPILE_COLUMNS)
    assert "compiled" not in (tmp_path / "results.md").read_text()


def test_budget_prediction_counts_the_compilation():
    hist = {"time": [(16, 0.001)], "mem": [], "compile_s": 30.0}
    for compile_, skipped in ((False, False), (True, True)):
        config = BenchConfig(kind="mixers", names=["softmax"], min_run_time=0.01, compile=compile_)
        sweep = _Sweep(config, torch.device("cpu"), None, 0.0)
        assert (_predicted_skip(sweep, hist, 32, remaining=10.0) is not None) == skipped


@pytest.mark.parametrize("argv,expect", [
    (["--compile", "--compile-backend", "inductr"], "Did you mean: inductor"),
    (["--compile-backend", "eager"], "--compile-backend is for --compile"),
])
def test_bad_compile_flags_are_one_line_errors(argv, expect, capsys, tmp_path):
    assert main(["bench", "--mixers", "softmax", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1
