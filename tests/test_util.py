"""vitmix._util: the one autocast helper, the one table writer, the close-match suggestions and the cache folder."""
import csv
import time
from pathlib import Path

import pytest
import torch

from vitmix._util import autocast, cache_dir, close_matches, markdown_table, table_columns, write_csv
from vitmix.bench.timing import time_call


def test_autocast_is_a_no_op_in_full_precision_and_casts_otherwise():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    for full in (None, torch.float32):
        with autocast("cpu", full):
            assert not torch.is_autocast_enabled("cpu")
            assert (a @ b).dtype == torch.float32
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_markdown_table_lines_and_alignment():
    text = markdown_table(["op", "N", "ms"], [["sdpa", 64, "1.50"], ["soft", 4096, "2.25"]], align="lrr")
    assert text.splitlines() == ["| op | N | ms |", "|---|---:|---:|", "| sdpa | 64 | 1.50 |", "| soft | 4096 | 2.25 |"]
    assert markdown_table(["a", "b"], []).splitlines() == ["| a | b |", "|---|---|"]
    with pytest.raises(ValueError, match="2 letters for 3 columns"):
        markdown_table(["a", "b", "c"], [], align="lr")


def test_write_csv_takes_every_key_in_first_seen_order(tmp_path):
    rows = [{"b": 1, "a": 2.5}, {"a": 3, "c": None, "d": "x"}]
    assert table_columns(rows) == ["b", "a", "c", "d"]
    path = write_csv(tmp_path / "t.csv", rows)
    with open(path, newline="") as fh:
        assert list(csv.reader(fh)) == [["b", "a", "c", "d"], ["1", "2.5", "", ""], ["", "3", "", "x"]]
    write_csv(tmp_path / "u.csv", rows, ["a", "d"])               # a fixed column list drops the others
    assert (tmp_path / "u.csv").read_text().splitlines() == ["a,d", "2.5,", "3,x"]


def test_close_matches_suggests_or_stays_silent():
    assert close_matches("laplacain", ["laplacian", "softmax"]) == " Did you mean: laplacian?"
    assert close_matches("zzz", ["laplacian", "softmax"]) == ""
    from vitmix.mixers.base import close_matches as from_mixers

    assert from_mixers is close_matches                            # one helper, re-exported for the mixers


def _sleeper(seconds):
    calls = []

    def fn():
        calls.append(1)
        time.sleep(seconds)
    return fn, calls


def test_time_call_sample_counts_for_slow_calls():
    """The counts, not the times: one-call samples (min_run_time=0), cut short by max_seconds, or the
    warm-up call alone once it takes long_call_s."""
    fn, _ = _sleeper(0.002)
    res = time_call(fn, min_run_time=0.0, min_samples=4)
    assert len(res.samples) == 4 and res.warmup_s >= 0.002
    res = time_call(fn, min_run_time=0.0, min_samples=4, max_seconds=0.0)   # the budget is spent after one
    assert len(res.samples) == 1
    fn, calls = _sleeper(0.02)
    res = time_call(fn, min_run_time=0.0, min_samples=4, long_call_s=0.01)
    assert res.samples == [res.warmup_s] == [res.median_s] and len(calls) == 1 and "warm-up" in res.method


def test_cache_dir_follows_the_environment_at_each_call(tmp_path, monkeypatch):
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path))
    assert cache_dir("datasets") == tmp_path / "datasets"
    monkeypatch.delenv("VITMIX_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "vitmix" and not (tmp_path / "datasets").exists()


def test_plural_says_one_epoch_not_one_epochs():
    from vitmix._util import plural

    assert [plural(n, "epoch") for n in (0, 1, 2)] == ["0 epochs", "1 epoch", "2 epochs"]
