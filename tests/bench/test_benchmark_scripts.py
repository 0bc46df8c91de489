"""The benchmark scripts never replace committed results with a quick or partial run."""
import hashlib
import json
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digests(folder: pathlib.Path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_fibottention_quick_run_writes_beside_not_over_committed_results(tmp_path, monkeypatch):
    """Measurements are stubbed: the test is about where the files go."""
    fib = _load("fibottention")
    committed = _digests(fib.OUT_DIR)
    row = {"level": "op", "N": 784, "method": "SDPA (dense)", "fwd_ms": 1.0, "fwd_bwd_ms": 2.0, "peak_fwd_bwd_mib": 3.0}
    info = {"cpu": "test", "logical_cpus": 1, "torch": "x", "torch_threads": 1, "python": "3", "c_kernel": True,
            "load_average_start": (0.0, 0.0, 0.0)}
    monkeypatch.setattr(fib, "machine", lambda: dict(info))
    monkeypatch.setattr(fib, "bench_op", lambda n, slow: [dict(row)])
    monkeypatch.setattr(fib, "bench_layer", lambda n: [dict(row, level="layer", method="softmax (SDPA)")])
    monkeypatch.setattr(fib, "goals", lambda rows: [])
    monkeypatch.chdir(tmp_path)
    fib.main(["--quick"])
    assert (tmp_path / "runs" / "fibottention-partial" / "results.json").is_file()
    assert _digests(fib.OUT_DIR) == committed


def test_learning_script_trains_through_vitmix_compare_and_reads_finished_runs_back(tmp_path, monkeypatch):
    """benchmarks/learning.py plans and runs its entries with vitmix.compare's runner: a second call
    trains nothing and writes the same table."""
    learning = _load("learning")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("model: vit_nano_patch4_32\nmodel_options: {depth: 1, embed_dim: 32, num_heads: 2}\n"
                   "data: digits\nimg_size: 16\nepochs: 1\nbatch_size: 64\ntrain_subset: 256\nwarmup_epochs: 0\n")
    monkeypatch.chdir(tmp_path)
    learning.main(["--config", str(cfg), "--mixers", "softmax", "--models", "weightformer_nano_patch4_32",
                   "--out", str(tmp_path / "out")])
    first = (tmp_path / "out" / "results.json").read_text()
    assert (tmp_path / "runs" / "learning" / "tiny" / "weightformer_nano_patch4_32" / "summary.json").is_file()

    import vitmix.compare.runner as runner

    def no_training(*_args, **_kwargs):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(runner, "train", no_training)
    learning.main(["--config", str(cfg), "--mixers", "softmax", "--models", "weightformer_nano_patch4_32",
                   "--out", str(tmp_path / "out")])
    again = (tmp_path / "out" / "results.json").read_text()
    assert _rows(again) == _rows(first) and len(_rows(first)) == 2


def _rows(results_json: str):
    return [{k: r[k] for k in ("entry", "params", "val_acc")} for r in json.loads(results_json)["rows"]]
