"""The benchmark and experiment scripts never replace committed results with a quick or partial run."""
import hashlib
import json
import importlib.util
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


SCRIPTS = {"fibottention": "benchmarks", "onnx_parity": "benchmarks", "learning": "experiments/learning",
           "learning_diagnostics": "experiments/learning", "convert_recovery": "experiments/convert_recovery",
           "replace_entry": "experiments/compare", "tiny_problem": "experiments/learning",
           "knockout": "experiments/learning"}


def _load(name):
    path = ROOT / SCRIPTS[name] / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digests(folder: pathlib.Path):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fibottention_quick_run_writes_beside_not_over_committed_results(tmp_path, monkeypatch):
    """Measurements are stubbed: the test is about where the files go."""
    fib = _load("fibottention")
    committed = _digests(fib.OUT_DIR)          # every machine's folder
    assert committed
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
    """experiments/learning/learning.py plans and runs its entries with vitmix.compare's runner: a second call
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


def test_onnx_parity_resumes_and_reports_failures(tmp_path, monkeypatch):
    """benchmarks/onnx_parity.py: two sizes per model, rows of an earlier run kept (a rerun adds only what is
    missing), a failed export is a row and makes the exit status 1. Exports are stubbed here."""
    onnx_parity = _load("onnx_parity")
    ran = []

    def fake_run_one(name, size, timeout):
        ran.append((name, size))
        ok = name != "weightformer_tiny"
        row = {"model": name, "img_size": size, "ok": ok}
        return dict(row, opset=18, rel_err_b1=1e-7, rel_err_b3=2e-7, max_rel_err=2e-7) if ok else \
            dict(row, error="RuntimeError: forced")

    monkeypatch.setattr(onnx_parity, "run_one", fake_run_one)
    out = str(tmp_path / "onnx")
    assert onnx_parity.main(["--models", "vit_nano_patch4_32", "--out", out]) == 0
    assert ran == [("vit_nano_patch4_32", 32), ("vit_nano_patch4_32", 48)]
    assert onnx_parity.main(["--models", "vit_nano_patch4_32", "weightformer_tiny", "--out", out]) == 1
    assert ran[2:] == [("weightformer_tiny", 224), ("weightformer_tiny", 160)]    # nothing exported twice
    rows = json.loads((tmp_path / "onnx" / "results.json").read_text())["rows"]
    assert [(r["model"], r["img_size"], r["ok"]) for r in rows] == [
        ("vit_nano_patch4_32", 32, True), ("vit_nano_patch4_32", 48, True),
        ("weightformer_tiny", 224, False), ("weightformer_tiny", 160, False)]
    md = (tmp_path / "onnx" / "results.md").read_text()
    assert "**2 of 4 exports within the limit.**" in md and "RuntimeError: forced" in md


def test_onnx_parity_worker_exports_and_checks_a_model():
    """The worker does what `vitmix export --format onnx` does, all-zero parameters made random first."""
    import pytest

    pytest.importorskip("onnxruntime", reason="ONNX tests need the export extra: pip install 'vitmix[export]'")
    pytest.importorskip("onnxscript", reason="ONNX tests need the export extra: pip install 'vitmix[export]'")
    row = _load("onnx_parity").worker("vit_nano_patch4_32", 48)
    assert row["ok"] and row["img_size"] == 48 and 0 < row["max_rel_err"] <= 1e-4 and row["opset"] >= 18


def _tiny_grid(tmp_path):
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "tiny.yaml").write_text("model: vit_nano_patch4_32\n"
                                    "model_options: {depth: 1, embed_dim: 32, num_heads: 2}\ndata: digits\n"
                                    "img_size: 16\nepochs: 1\nbatch_size: 64\ntrain_subset: 128\nwarmup_epochs: 0\n")
    (grid / "grid.yaml").write_text("points:\n  - config: tiny.yaml\n    mixers: {softmax: 2, laplacian: 1}\n")
    return grid


def test_learning_grid_trains_every_point_and_seed_then_reads_them_back(tmp_path, monkeypatch):
    """--grid trains each config × mixer × seed once into runs/learning/grid/, tabulates mean ± std
    over the seeds and checks the goals; a second call (and --report-only) trains nothing."""
    learning = _load("learning")
    grid = _tiny_grid(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    learning.main(["--grid", str(grid), "--out", str(out)])
    runs = tmp_path / "runs" / "learning" / "grid" / "tiny"
    assert sorted(p.parent.relative_to(runs).as_posix() for p in runs.glob("*/*/summary.json")) == [
        "seed0/laplacian", "seed0/softmax", "seed1/softmax"]
    first = json.loads((out / "results.json").read_text())
    softmax = next(r for r in first["rows"] if r["entry"] == "softmax")
    finals = [json.loads((runs / f"seed{s}" / "softmax" / "summary.json").read_text())["final_val_acc"] for s in (0, 1)]
    assert softmax["n"] == 2 and abs(softmax["mean"] - sum(finals) / 2) < 1e-9
    goal = next(g for g in first["goals"] if g["goal"] == "laplacian ≥ softmax")
    laplacian = next(r for r in first["rows"] if r["entry"] == "laplacian")
    assert goal["holds"] == (laplacian["mean"] >= softmax["mean"]) and goal["complete"]
    assert "laplacian ≥ softmax" in (out / "results.md").read_text() and (out / "grid.png").is_file()

    import vitmix.compare.runner as runner

    def no_training(*_args, **_kwargs):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(runner, "train", no_training)
    for extra in ([], ["--report-only"]):
        learning.main(["--grid", str(grid / "grid.yaml"), "--out", str(out)] + extra)
        assert json.loads((out / "results.json").read_text())["rows"] == first["rows"]


def test_learning_grid_filters_and_bad_specs(tmp_path, monkeypatch):
    """--entries/--seeds train only what they name (the rest stays 'not measured'); a spec without
    points is a one-line ValueError."""
    import pytest

    learning = _load("learning")
    grid = _tiny_grid(tmp_path)
    monkeypatch.chdir(tmp_path)
    learning.main(["--grid", str(grid), "--out", str(tmp_path / "out"), "--entries", "softmax", "--seeds", "1"])
    rows = {r["entry"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["rows"]}
    assert list(rows["softmax"]["finals"]) == ["1"] and rows["laplacian"]["n"] == 0
    assert "not measured" in (tmp_path / "out" / "results.md").read_text()
    (grid / "grid.yaml").write_text("points: []\n")
    with pytest.raises(ValueError, match="points"):
        learning.main(["--grid", str(grid), "--out", str(tmp_path / "out")])


def test_learning_grid_reads_committed_values_back_without_the_runs_and_forget_retrains(tmp_path, monkeypatch):
    """Run folders are not in git: on a fresh checkout the grid reads each seed's value back from the
    committed results.json (marked †) instead of retraining it; --forget ENTRY drops an entry's
    committed values, so that it is retrained (after its defaults changed)."""
    import shutil

    import vitmix.compare.runner as runner

    learning = _load("learning")
    grid = _tiny_grid(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    only = ["--entries", "softmax", "--seeds", "1"]
    learning.main(["--grid", str(grid), "--out", str(out), *only])
    first = {r["entry"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    shutil.rmtree(tmp_path / "runs")                                        # a fresh checkout

    real_train = runner.train
    monkeypatch.setattr(runner, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    learning.main(["--grid", str(grid), "--out", str(out), *only])
    again = {r["entry"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert again["softmax"]["finals"] == first["softmax"]["finals"] and again["softmax"]["committed_seeds"] == [1]
    assert f"{first['softmax']['finals']['1']:.2f}†" in (out / "results.md").read_text()

    trained = []
    monkeypatch.setattr(runner, "train", lambda *a, **k: trained.append(1) or real_train(*a, **k))
    learning.main(["--grid", str(grid), "--out", str(out), *only, "--forget", "softmax"])
    last = {r["entry"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert trained and last["softmax"]["committed_seeds"] == [] and last["softmax"]["n"] == 1


def test_convert_recovery_measures_every_stage_then_reads_everything_back(tmp_path, monkeypatch):
    """experiments/convert_recovery/convert_recovery.py: teacher, converted students and from-scratch runs are trained
    once; a second call retrains nothing, re-measures nothing and writes the same table, also when the run folders
    are gone and only the seed files remain."""
    recovery = _load("convert_recovery")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("model: vit_nano_patch4_32\nmodel_options: {depth: 1, embed_dim: 32, num_heads: 2}\n"
                   "data: digits\nimg_size: 16\nepochs: 1\nbatch_size: 64\ntrain_subset: 256\nwarmup_epochs: 0\n")
    argv = ["--config", str(cfg), "--mixers", "laplacian", "--seeds", "0", "--ft-epochs", "2",
            "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    monkeypatch.chdir(tmp_path)
    recovery.main(argv)
    first = json.loads((tmp_path / "out" / "recovery.json").read_text())
    assert [r["entry"] for r in first["rows"]] == ["softmax (teacher)", "laplacian"]
    for row in first["rows"][1:]:
        assert row["n"] == 1 and all(0 <= row[f"{k}_mean"] <= 100 for k in (*recovery.STAGES, *recovery.SCRATCH))
    scratch_student = tmp_path / "runs" / "seed0" / "scratch-student" / "laplacian"    # 1 transfer + 2 fine-tuning
    assert len((scratch_student / "metrics.jsonl").read_text().splitlines()) == 3
    student = tmp_path / "runs" / "seed0" / "convert" / "laplacian"
    curve = [json.loads(line)["val_acc"] for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert len(curve) == 2 and first["per_seed"]["0"]["mixers"]["laplacian"]["ft_last"] == curve[-1]
    assert json.loads((student / "init.json").read_text())["transfer"]["done"]
    assert [g["mixer"] for g in first["goals"]] == ["laplacian", "laplacian"]   # soft was not run
    assert (tmp_path / "out" / "recovery.png").stat().st_size > 0
    assert "| laplacian | 1 |" in (tmp_path / "out" / "recovery.md").read_text()

    import vitmix.compare.runner as runner

    def no_work(*_args, **_kwargs):
        raise AssertionError("a finished run was retrained or re-measured")

    monkeypatch.setattr(runner, "train", no_work)
    monkeypatch.setattr(recovery, "converted_accuracy", no_work)
    recovery.main(argv)
    again = json.loads((tmp_path / "out" / "recovery.json").read_text())
    assert again["rows"] == first["rows"]
    recovery.main(argv + ["--no-teacher-budget"])     # finished teacher-budget runs are still read back
    assert json.loads((tmp_path / "out" / "recovery.json").read_text())["rows"] == first["rows"]
    scratch = tmp_path / "runs" / "seed0" / "scratch" / "laplacian"
    seed_file = tmp_path / "out" / "seed0.json"
    saved = seed_file.read_text()
    seed_file.unlink()                               # a mixer not in the seed file is measured again,
    scratch.rename(scratch.with_name("moved"))       # ... and a missing teacher-budget run left out, not trained
    recovery.main(argv + ["--no-teacher-budget"])
    assert json.loads((tmp_path / "out" / "recovery.json").read_text())["rows"][1]["scratch_mean"] is None
    scratch.with_name("moved").rename(scratch)
    recovery.main(argv)                              # without the flag, that row is incomplete: read back again
    assert json.loads(seed_file.read_text())["result"] == json.loads(saved)["result"]
    shutil.rmtree(tmp_path / "runs")                 # another machine: the committed seed files alone
    recovery.main(argv)
    assert json.loads((tmp_path / "out" / "recovery.json").read_text())["rows"] == first["rows"]
    recovery.main(argv + ["--report-only"])       # the table from the seed files alone, naming their command
    assert json.loads((tmp_path / "out" / "recovery.json").read_text())["rows"] == first["rows"]
    assert "--seeds 0 --ft-epochs 2" in (tmp_path / "out" / "recovery.md").read_text().split("`, `")[0]

    # A seed finished by another command (its seed1.json beside the table) joins the mean; a seed file
    # made with another student recipe is refused rather than averaged in.
    other = json.loads((tmp_path / "out" / "seed0.json").read_text())
    assert other["result"]["mixers"]["laplacian"] == first["per_seed"]["0"]["mixers"]["laplacian"]
    other["seed"] = 1
    (tmp_path / "out" / "seed1.json").write_text(json.dumps(other))
    recovery.main(argv)
    both = json.loads((tmp_path / "out" / "recovery.json").read_text())
    assert [r["n"] for r in both["rows"]] == [2, 2] and sorted(both["per_seed"]) == ["0", "1"]
    # A seed is completed a few mixers at a time: a command for other mixers keeps the saved rows (here a
    # "soft" row saved in seed0.json, kept when seed 0 is rerun for laplacian); a row converted from a
    # teacher other than the seed's is pointed out.
    seed0 = json.loads((tmp_path / "out" / "seed0.json").read_text())
    soft = {**seed0["result"]["mixers"]["laplacian"], "teacher": seed0["result"]["teacher"] + 1.0}
    seed0["result"]["mixers"]["soft"] = soft
    (tmp_path / "out" / "seed0.json").write_text(json.dumps(seed0))
    recovery.main(argv)
    merged = json.loads((tmp_path / "out" / "recovery.json").read_text())
    assert [(r["entry"], r["n"]) for r in merged["rows"]] == [("softmax (teacher)", 2), ("laplacian", 2), ("soft", 1)]
    assert json.loads((tmp_path / "out" / "seed0.json").read_text())["result"]["mixers"]["soft"] == soft
    assert "seed 0's soft student was converted from a teacher at" in (tmp_path / "out" / "recovery.md").read_text()
    other["students"]["epochs"] = 5
    (tmp_path / "out" / "seed1.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="seed1.json was made with student recipe"):
        recovery.main(argv)


def test_convert_recovery_records_the_distill_weight_only_when_changed():
    """A changed teacher share is part of the student recipe (seed files of another one are refused); the default
    is left out, so the seed files written before the flag existed still match."""
    from types import SimpleNamespace

    recovery = _load("convert_recovery")
    flags = dict(transfer_epochs=1, transfer_lr=1e-4, ft_epochs=1, ft_lr=5e-4, ft_warmup=0.2, no_distill=False)
    assert "distill_weight" not in recovery.recipe(SimpleNamespace(**flags, distill_weight=recovery.DISTILL_WEIGHT))
    assert recovery.recipe(SimpleNamespace(**flags, distill_weight=1.0))["distill_weight"] == 1.0


def test_convert_recovery_table_of_a_one_epoch_fine_tune_has_one_fine_tune_column(tmp_path):
    recovery = _load("convert_recovery")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("model: vit_nano_patch4_32\ndata: digits\nepochs: 3\n")
    row = {"converted": 20.0, "transfer": 70.0, "ft1": 85.0, "ft_last": 85.0, "scratch_student": 80.0, "scratch": None}
    per_seed = {0: {"teacher": 86.0, "mixers": {"laplacian": row}}}
    students = {"transfer_epochs": 1, "transfer_lr": 1e-3, "epochs": 1, "lr": 5e-4, "warmup_epochs": 0.2,
                "distill": True, "distill_weight": 1.0}
    rows = recovery.summarise(per_seed, ["laplacian"])
    env = {"cpu": "x", "torch": "y", "date_utc": "z"}
    text = recovery.report(rows, recovery.goals(rows), per_seed, students, cfg, env, "cmd")
    header = "| mixer | n | converted | after transfer | fine-tune 1 ep | from scratch, 2 ep | from scratch, 3 ep |"
    assert header in text
    assert "| laplacian | 1 | 20.00 | 70.00 | 85.00 | 80.00 | – | -1.00 |" in text
    assert "DeiT's soft α = 1, τ = 1" in text


def _train_tiny_runs(folder, mixers):
    """Two-step runs of a 2-block, 3-head nano ViT on digits, one per mixer, in ``folder/<mixer>``."""
    from vitmix.train import TrainConfig, train

    tiny = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=32, epochs=1, max_steps=2,
                model_options={"depth": 2, "embed_dim": 48, "num_heads": 3})
    for mixer in mixers:
        train(TrainConfig(**tiny, mixer=mixer, out=str(folder / mixer)), log=lambda _line: None)


def test_learning_diagnostics_reads_trained_runs_per_block_and_head(tmp_path):
    """``--runs``: the kernel statistics of trained checkpoints (no training), one row per block, one value
    per head; a run without a kernel mixer is refused by name."""
    _train_tiny_runs(tmp_path, ("laplacian", "softmax"))
    diagnostics = _load("learning_diagnostics")
    diagnostics.main(["--runs", str(tmp_path / "laplacian"), "--images", "5", "--out", str(tmp_path / "out")])
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    (row,) = rows
    assert row["mixer"] == "laplacian" and row["images"] == 5 and len(row["layers"]) == 2
    for layer in row["layers"]:
        assert len(layer["newton_residual"]) == len(layer["newton_cond"]) == 3
        assert all(0 <= r < 1 for r in layer["newton_residual"]) and all(c >= 1 for c in layer["newton_cond"])
        # what each head adds through the output projection, and the learnt mean(V) weights (initialised to 0)
        assert len(layer["attn_out"]) == len(layer["attn_over_local"]) == len(layer["mean_weight"]) == 3
        assert layer["heads_on"] == sum(r >= diagnostics.ON_SHARE for r in layer["attn_over_local"])
    assert (row["heads"], row["head_dim"]) == (3, 16) and row["final_val_acc"] is not None
    md = (tmp_path / "out" / "results.md").read_text()
    # one summary row per run, then one row per block
    assert md.count("| laplacian |") == 1 + 2 and "| 3×16 |" in md and "first 5 validation images" in md
    with pytest.raises(SystemExit, match="softmax has no kernel"):
        diagnostics.main(["--runs", str(tmp_path / "softmax"), "--out", str(tmp_path / "out2")])


@pytest.mark.parametrize("name", ["soft", "laplacian"])
def test_knockout_removes_each_part_and_restores_the_mixer(name):
    """The mixer is affine in (kernel attention + local conv) through its output linear, so the full output plus
    the output with both parts off (the bias) equals the sum of the two single knock-outs; with the attention
    replaced by its token mean, what it adds is the same for every token. Leaving the context restores the mixer
    (the C path and the conv come back)."""
    import torch
    from vitmix import mixers

    knockout = _load("knockout")
    torch.manual_seed(0)
    m = mixers.create(name, 32, num_heads=2, hw=(6, 6)).double().eval()
    with torch.no_grad():       # give the output linear a bias so that the affine identity is not trivially linear
        (m.proj if hasattr(m, "proj") else m.ff).bias.normal_()
    x = torch.randn(2, 36, 32, dtype=torch.float64)
    out = {}
    with torch.no_grad():
        for condition in knockout.CONDITIONS:
            with knockout.knocked_out([m], condition):
                out[condition] = m(x)
        with knockout.knocked_out([m], "attention off"):
            m.conv_kernel = 0
            bias_only = m(x)
        restored = m(x)
    assert torch.allclose(out["full"] + bias_only, out["attention off"] + out["local off"], atol=1e-12)
    added = out["attention→mean"] - out["attention off"]
    assert float(added.std(dim=1).max()) < 1e-12 and float(added.abs().max()) > 1e-6
    assert not torch.allclose(out["full"], out["attention off"]) and not torch.allclose(out["full"], out["local off"])
    assert m.conv_kernel == 3 and "_fused" not in m.__dict__ and "_attend" not in m.__dict__
    assert torch.allclose(restored, out["full"], atol=1e-12)


def test_knockout_reports_every_condition_of_a_trained_run(tmp_path):
    """``--runs``: one row per run with the accuracy under every condition; a run without a kernel mixer is
    refused by name."""
    _train_tiny_runs(tmp_path, ("laplacian", "softmax"))
    knockout = _load("knockout")
    knockout.main(["--runs", str(tmp_path / "laplacian"), "--images", "40", "--out", str(tmp_path / "out")])
    (row,) = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert row["mixer"] == "laplacian" and row["images"] == 40
    assert set(row["accuracy"]) == set(knockout.CONDITIONS)
    assert all(0 <= a <= 100 for a in row["accuracy"].values())
    assert "| laplacian |" in (tmp_path / "out" / "results.md").read_text()
    with pytest.raises(SystemExit, match="softmax has no kernel mixer"):
        knockout.main(["--runs", str(tmp_path / "softmax"), "--out", str(tmp_path / "out2")])


def _board_copy(tmp_path, name, keep=None, shift=0.0):
    """The committed Fashion-MNIST board's ``leaderboard.json`` in ``tmp_path/name``, optionally with only the
    ``keep`` entries, their top-1 moved by ``shift`` (a stand-in for a retrained entry)."""
    board = json.loads((ROOT / "experiments/compare/results/fashion-mnist/leaderboard.json").read_text())
    if keep:
        board["rows"] = [r for r in board["rows"] if r["entry"] in keep]
    for row in board["rows"]:
        for run in row["runs"]:
            run["top1"] += shift
    folder = tmp_path / name
    folder.mkdir()
    (folder / "leaderboard.json").write_text(json.dumps(board))
    return folder, board


def test_replace_entry_swaps_one_entrys_runs_and_reranks_the_committed_board(tmp_path):
    script = _load("replace_entry")
    board, before = _board_copy(tmp_path, "board")
    retrained, _ = _board_copy(tmp_path, "retrained", keep={"laplacian"}, shift=20.0)
    # a board written before an option existed lacks it; the retrain has it at its default: the same recipe
    for key in ("sched", "reprob"):
        before["recipe"].pop(key, None)
    (board / "leaderboard.json").write_text(json.dumps(before))
    script.main([str(board), str(retrained), "--entries", "laplacian"])
    after = {r["entry"]: r for r in json.loads((board / "leaderboard.json").read_text())["rows"]}
    old = {r["entry"]: r for r in before["rows"]}
    assert after.keys() == old.keys()
    assert after["laplacian"]["top1"] == pytest.approx(old["laplacian"]["top1"] + 20.0)
    assert after["laplacian"]["rank"] == 1 and after["linformer"]["rank"] == 2     # re-ranked from the runs
    for entry in old.keys() - {"laplacian"}:
        assert after[entry]["top1"] == pytest.approx(old[entry]["top1"])
    assert "laplacian" in json.loads((board / "retrained.json").read_text())
    assert (board / "leaderboard.md").is_file() and (board / "runs.csv").is_file()


def test_replace_entry_refuses_another_recipe_or_a_missing_entry(tmp_path):
    script = _load("replace_entry")
    board, _ = _board_copy(tmp_path, "board")
    retrained, other = _board_copy(tmp_path, "retrained", keep={"laplacian"})
    with pytest.raises(ValueError, match="has no runs of \\['soft'\\]"):
        script.main([str(board), str(retrained), "--entries", "soft"])
    other["recipe"]["lr"] = 0.001
    (retrained / "leaderboard.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="recipe keys \\['lr'\\]"):
        script.main([str(board), str(retrained), "--entries", "laplacian"])
    with pytest.raises(FileNotFoundError, match="written by `vitmix compare`"):
        script.main([str(tmp_path / "nowhere"), str(retrained), "--entries", "laplacian"])


def test_tiny_problem_runs_specs_with_a_boosted_group_and_writes_its_table(tmp_path):
    script = _load("tiny_problem")
    label, mixer, run, options = script.parse_spec("x4=laplacian:width=64,heads=4,lr=1e-3,boost=attn.+head,"
                                                    "newton_iters=20,normalize=false")
    assert (label, mixer, options) == ("x4", "laplacian", {"newton_iters": 20, "normalize": False})
    assert run == dict(script.RUN_KEYS, width=64, heads=4, lr=1e-3, boost="attn.+head")
    with pytest.raises(ValueError, match="LABEL=MIXER"):
        script.parse_spec("laplacian")
    script.main(["a=soft:steps=2", "b=laplacian:width=64,heads=4,steps=2,boost=attn.", "--seeds", "0,1",
                 "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert set(results) == {"a", "b"} and all(len(r["top1"]) == 2 for r in results.values())
    assert all(0.0 <= a <= 100.0 for r in results.values() for a in r["top1"])
    assert "| b | laplacian |" in (tmp_path / "results.md").read_text()


def test_tiny_problem_model_shape_and_batch_are_run_keys(monkeypatch):
    # depth, MLP ratio and batch shape the run (the held-out recipe's deeper model), not the mixer's options
    script = _load("tiny_problem")
    _, _, run, options = script.parse_spec("d=laplacian:depth=3,mlp=4,batch=16,steps=1")
    assert options == {} and (run["depth"], run["mlp"], run["batch"]) == (3, 4, 16)
    built, batches = {}, []
    create, loss = script.vitmix.create_model, script.F.cross_entropy
    monkeypatch.setattr(script.vitmix, "create_model", lambda *a, **k: built.setdefault("m", create(*a, **k)))
    monkeypatch.setattr(script.F, "cross_entropy", lambda logits, y: batches.append(len(y)) or loss(logits, y))
    script.tiny_run(script.digits(), "laplacian", 0, run, options)
    assert len(built["m"].blocks) == 3 and built["m"].blocks[0].mlp.fc1.out_features == 4 * 32
    assert batches == [16]


def test_learning_grid_goals_carry_the_standard_error_of_the_difference():
    """Each goal's margin comes with √(s_a²/n_a + s_b²/n_b), so a reader can tell a margin the seeds decide from
    one they do not; with a single seed of either entry there is no standard error to give."""
    import math
    import statistics

    learning = _load("learning")

    def row(entry, values):
        return {"config": "c.yaml", "shape": "s", "budget": "b", "entry": entry, "planned": len(values),
                "n": len(values), "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else None,
                "finals": {str(i): v for i, v in enumerate(values)}}

    lap, soft, softmax = row("laplacian", [70.0, 72.0, 68.0]), row("soft", [74.0, 71.0]), row("softmax", [60.0])
    goals = {g["goal"]: g for g in learning.grid_goals([lap, soft, softmax])}
    vs_soft = goals["laplacian ≥ soft − 0.5"]
    assert math.isclose(vs_soft["margin"], 70.0 - 72.5)
    assert math.isclose(vs_soft["se"], math.sqrt(2.0 ** 2 / 3 + statistics.stdev([74.0, 71.0]) ** 2 / 2))
    assert goals["laplacian ≥ softmax"]["se"] is None
    text = learning.grid_report([lap, soft, softmax], list(goals.values()), learning.Path("grid.yaml"),
                                {"cpu": "cpu", "torch": "t", "date_utc": "d"}, "cmd")
    assert f"-2.50 ± {vs_soft['se']:.2f}" in text and "| +10.00 |" in text
