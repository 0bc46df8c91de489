"""benchmarks/first_call.py: the first calls in fresh processes, an empty kernel cache then the warm one."""
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "first_call.py"


def test_first_call_times_three_calls_in_two_fresh_processes_and_writes_the_table(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_script_first_call", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--model", "vit_nano_patch4_32", "--size", "32", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    calls = payload["first_calls_s"]
    assert list(calls) == ["empty cache", "warm cache"] and all(len(t) == 3 and min(t) > 0 for t in calls.values())
    assert payload["command"] == "python benchmarks/first_call.py --model vit_nano_patch4_32 --size 32 --out " \
        + str(tmp_path)
    table = (tmp_path / "results.md").read_text()
    assert "| empty cache |" in table and "| warm cache |" in table
