"""The long-sequence cost scan (``vitmix bench --mixers ... --sequence --batch 1,2``): mixers built as sequence
layers, the crossover and growth analysis on known rows, and a tiny end-to-end run of the CLI (no timing claims:
the machine running the tests is loaded)."""
import json

import pytest

from vitmix.bench.config import BenchConfig, SweepResult
from vitmix.bench.long_sequence import crossover, goals, growth, plot, summary
from vitmix.bench.points import build_point
from vitmix.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _row(name, n, ms, mib, status="ok", note=""):
    return {"name": name, "size": n, "pass": "fwd+bwd", "status": status, "median_ms": ms, "peak_mib": mib,
            "note": note, "speedup_vs_softmax": None, "memory_vs_softmax": None}


# softmax quadratic and stopped after 4096; "lin" linear, slower up to 1024, faster from 2048 on;
# "flip" faster at 2048 but slower again at 4096
ROWS = ([_row("softmax", n, n * n / 1e5, n * n / 1e4) for n in (1024, 2048, 4096)]
        + [_row("softmax", 8192, None, None, "skipped", "predicted peak memory exceeds the limit")]
        + [_row("lin", n, n / 60, n / 10) for n in (1024, 2048, 4096, 8192)]
        + [_row("flip", 1024, 20.0, 1.0), _row("flip", 2048, 30.0, 2.0), _row("flip", 4096, 400.0, 4.0)])


def test_crossover_is_where_a_mixer_stays_faster_than_softmax():
    assert crossover(ROWS, "lin") == 2048           # 17.1 > 10.5 ms at 1024, 34.1 < 41.9 at 2048; softmax gone at 8192
    assert crossover(ROWS, "flip") is None          # slower again at the longest length where both ran
    assert crossover(ROWS, "absent") is None


def test_growth_is_the_log_log_slope_in_the_length():
    assert growth(ROWS, "lin") == pytest.approx({"time_slope": 1.0, "memory_slope": 1.0})
    assert growth(ROWS, "softmax") == pytest.approx({"time_slope": 2.0, "memory_slope": 2.0})


def test_goals_judge_soft_and_laplacian_per_batch():
    rows = [dict(r, name={"lin": "soft", "flip": "laplacian"}.get(r["name"], r["name"])) for r in ROWS]
    config = BenchConfig(kind="mixers", names=["soft", "laplacian"], passes=("fwd+bwd",), sequence=True)
    table = summary({4: SweepResult(config, rows, {})})
    soft = next(r for r in table if r["mixer"] == "soft")
    assert (soft["batch"], soft["crossover_L"], soft["longest_L"]) == (4, 2048, 8192)
    assert "memory" in next(r for r in table if r["mixer"] == "softmax")["stopped"]
    verdicts = {v["goal"]: v["holds"] for v in goals(table)}
    assert verdicts == {"soft faster than softmax from L = 2048, batch 4": True,
                        "soft memory linear in L, batch 4": True,
                        "laplacian faster than softmax from L = 2048, batch 4": False,
                        "laplacian memory linear in L, batch 4": True}


def test_every_mixer_of_the_plot_has_its_own_line_style_in_every_column(tmp_path, monkeypatch):
    """Twelve mixers, as ``--mixers all`` gives: matplotlib's 10-colour cycle drew two of them alike; each must have
    its own (colour, marker), the same one in each batch's column, with softmax the black dashed baseline."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    names = [f"mixer{i}" for i in range(11)]
    rows = [_row(name, n, 1.0 + i, 2.0 + i) for i, name in enumerate(["softmax"] + names) for n in (1024, 2048)]
    config = BenchConfig(kind="mixers", names=names, passes=("fwd+bwd",), sequence=True, sizes=(1024, 2048))
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot({1: SweepResult(config, rows, {}), 8: SweepResult(config, rows, {})}, str(tmp_path / "scan.png"))
    columns = [{line.get_label(): (line.get_color(), line.get_marker()) for line in ax.lines}
               for ax in figures[0].axes[:2]]
    styles = [tuple(map(str, style)) for name, style in columns[0].items() if name != "softmax"]
    assert len(styles) == 11 and len(set(styles)) == 11 and columns[0] == columns[1]
    assert columns[0]["softmax"][0] == "black" and (tmp_path / "scan.png").is_file()


def test_a_sequence_sweep_builds_sequence_layers():
    config = BenchConfig(kind="mixers", names=["linformer"], dim=16, heads=2, sequence=True)
    point = build_point(config, "linformer", 300, "cpu")       # sized for 300 tokens, not a grid's default
    assert point.module.sequence and point.inputs.shape == (1, 300, 16)
    assert point.call(point.inputs).shape == (1, 300, 16)


def test_the_scan_end_to_end_at_tiny_size(tmp_path, capsys):
    out = tmp_path / "scan"
    assert main(["bench", "--mixers", "soft,fibottention", "--sequence", "--tokens", "48,96", "--batch", "1,2",
                 "--dim", "16", "--heads", "2", "--passes", "fwd+bwd", "--min-run-time", "0.01", "--no-flops",
                 "--max-seconds", "120", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "batch 2 fwd+bwd soft: " in printed and ", memory slope " in printed
    for name in ("long_sequence.md", "long_sequence.json", "long_sequence.png", "batch-1/results.md",
                 "batch-2/results.json"):
        assert (out / name).is_file(), name
    report = json.loads((out / "long_sequence.json").read_text())
    rows = {(r["mixer"], r["batch"]) for r in report["summary"]}
    assert rows == {(m, b) for m in ("softmax", "soft", "fibottention") for b in (1, 2)}
    assert {v["goal"] for v in report["goals"]} >= {"soft faster than softmax from L = 2048, batch 1"}
    sweep = json.loads((out / "batch-2" / "results.json").read_text())
    assert sweep["config"]["sequence"] is True and {r["batch"] for r in sweep["rows"]} == {2}
    assert main(["bench", "--mixers", "soft", "--sequence", "--tokens", "48", "--no-progress", "--min-run-time",
                 "0.01", "--dim", "16", "--heads", "2", "--passes", "fwd", "--out", str(out)]) == 0   # refreshed


def test_several_batch_sizes_need_a_sequence_scan(capsys):
    assert main(["bench", "--mixers", "soft", "--batch", "1,8", "--out", "unused"]) == 2
    assert "several batch sizes are for --sequence scans" in capsys.readouterr().err
