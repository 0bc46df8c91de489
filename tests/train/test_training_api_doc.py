"""docs/training-api.md: its example runs as written (in a temporary folder) and does what the page says."""
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "training-api.md"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_python_training_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    summary, seen, model = namespace["summary"], namespace["seen"], namespace["model"]
    assert [m["epoch"] for m in seen] == [1, 2] and summary["epochs_run"] == 2
    assert summary["best_val_acc"] == max(m["val_acc"] for m in seen)
    assert (tmp_path / summary["run_dir"]).resolve() == (tmp_path / "runs" / "api-demo").resolve()
    assert (tmp_path / "runs" / "api-demo" / "best.safetensors").is_file()
    assert {b.attn.mixer_name for b in model.blocks} == {"laplacian"} and len(model.blocks) == 2
    assert not model.training and str(summary["best_val_acc"]) in capsys.readouterr().out
