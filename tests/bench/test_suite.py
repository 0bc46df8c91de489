"""``vitmix bench --spec``: suites of cases × entries timed in alternating rounds (vitmix.bench.suite).

Sizes are tiny and no assertion reads a wall-clock time: the ratios are checked against the samples they are
computed from (timings stubbed where the value matters), each case kind is checked for what it really runs."""
import json
import re
from pathlib import Path

import pytest
import torch

from vitmix.bench import paired, suite, suite_targets
from vitmix.bench.env import machine_tag
from vitmix.bench.suite import check_spec, load_spec, run_suite
from vitmix.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "benchmarks" / "specs").glob("*.yaml"))
NANO = {"img_size": 16, "in_chans": 1, "num_classes": 10, "patch_size": 4, "embed_dim": 32, "depth": 1,
        "num_heads": 2}


def _layer_case(**extra):
    return {"name": "l", "kind": "layer", "dim": 32, "heads": 2, "tokens": [16], **extra}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_the_committed_suites_load_and_every_entry_is_one_their_cases_can_build(path):
    spec = load_spec(path)
    assert spec["cases"] and set(spec["ratios_to"]) <= set(spec["entries"])


def test_the_three_committed_suites_are_there():
    assert {p.stem for p in SPECS} >= {"small_vit_speed", "projection_floor", "kernel_attention"}


def test_alternating_rounds_reverse_the_order_every_other_round(monkeypatch):
    order, times = [], iter([1.0, 2.0, 4.0, 2.0, 3.0, 3.0])

    def fake_time_call(fn, device, min_run_time):
        order.append(fn())
        return type("T", (), {"median_s": next(times)})()

    monkeypatch.setattr(paired, "time_call", fake_time_call)
    samples = paired.alternating_rounds({"a": lambda: "a", "b": lambda: "b"}, "cpu", 0.1, rounds=3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert samples == {"a": [1.0, 2.0, 3.0], "b": [2.0, 4.0, 3.0]}
    assert paired.round_ratios(samples["b"], samples["a"]) == [2.0, 2.0, 1.0]


def test_ratios_are_median_and_range_of_the_per_round_ratios(monkeypatch):
    samples = {"softmax": [1.0, 2.0, 4.0], "soft": [2.0, 2.0, 2.0], "floor": [0.5, 0.5, 1.0]}
    monkeypatch.setattr(suite, "alternating_rounds", lambda calls, device, t, rounds: {e: samples[e] for e in calls})
    spec = check_spec({"entries": list(samples), "ratios_to": ["softmax", "floor"], "rounds": 3,
                       "cases": [_layer_case()]})
    rows = {r["entry"]: r for r in run_suite(spec, log=lambda _: None)["rows"]}
    soft = rows["soft"]
    assert soft["median_ms"] == pytest.approx(2000.0) and soft["round_ms"] == [2000.0, 2000.0, 2000.0]
    assert (soft["vs_softmax"], soft["vs_softmax_min"], soft["vs_softmax_max"]) == (1.0, 0.5, 2.0)
    assert (soft["vs_floor"], soft["vs_floor_min"], soft["vs_floor_max"]) == (4.0, 2.0, 4.0)
    assert rows["softmax"]["vs_softmax"] == 1.0 and rows["floor"]["vs_floor"] == 1.0
    assert soft["throughput"] == pytest.approx(16 / 2.0) and soft["throughput_unit"] == "tokens/s"


def test_floor_is_the_softmax_layers_own_qkv_and_output_linears():
    case = _layer_case(layer_options={"qkv_bias": True})
    floor = suite_targets.build(case, "floor", 16, "fwd+bwd", "cpu").holds[0]
    layer = suite_targets.build(case, "softmax", 16, "fwd+bwd", "cpu").holds[0]
    shapes = sorted(tuple(p.shape) for p in floor.parameters())
    assert shapes == sorted(tuple(p.shape) for n, p in layer.named_parameters() if n.split(".")[0] in ("qkv", "proj"))
    assert floor(torch.zeros(1, 4, 32)).shape == (1, 4, 32)


def test_a_layer_point_runs_forward_and_backward_and_leaves_no_gradient_behind():
    built = suite_targets.build(_layer_case(prefix=1), "laplacian", 16, "fwd+bwd", "cpu")
    module, x = built.holds
    assert x.shape == (1, 17, 32) and x.requires_grad and module.training
    seen = []
    hook = module.register_full_backward_hook(lambda *_: seen.append(True))
    built.call()
    hook.remove()
    assert seen and x.grad is None and all(p.grad is None for p in module.parameters())
    assert built.items == 17


def test_an_op_point_is_the_nystrom_op_with_the_entrys_options():
    from vitmix.ops import avg_pool_landmarks, nystrom_attention

    case = {"kind": "op", "dim": 32, "heads": 2, "batch": 1, "tokens": [36]}
    built = suite_targets.build(case, "laplacian:landmarks=4:lam=2.0:iters=5", 36, "fwd", "cpu")
    op, q, k, v = built.holds
    assert q.shape == (1, 2, 36, 16) and not q.requires_grad
    lq, lk = (avg_pool_landmarks(t, (6, 6), (2, 2)) for t in (q, k))
    want = nystrom_attention(q, k, v, lq, lk, kernel="laplacian", lam=2.0, iters=5)
    torch.testing.assert_close(built.call(), want)
    sdpa = suite_targets.build(case, "sdpa", 36, "fwd", "cpu")
    torch.testing.assert_close(sdpa.call(), torch.nn.functional.scaled_dot_product_attention(*sdpa.holds[1:]))


def test_a_train_step_point_updates_the_model_and_a_model_point_only_runs_it():
    case = {"kind": "train_step", "model": "vit_nano_patch4_32", "model_options": NANO, "batch": 4}
    built = suite_targets.build(case, "soft", None, "train step", "cpu")
    model, images = built.holds
    assert images.shape == (4, 1, 16, 16) and built.unit == "img/s" and built.items == 4
    assert model.blocks[0].attn.mixer_name == "soft"
    before = [p.detach().clone() for p in model.parameters()]
    built.call()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    fwd = suite_targets.build(dict(case, kind="model"), "softmax", None, "fwd", "cpu")
    before = [p.detach().clone() for p in fwd.holds[0].parameters()]
    assert fwd.call().shape == (4, 10) and not fwd.holds[0].training
    assert all(torch.equal(a, p) for a, p in zip(before, fwd.holds[0].parameters()))


def test_a_point_that_fails_is_a_row_and_the_rest_still_runs(monkeypatch):
    real = suite_targets.build

    def build(case, entry, tokens, pass_name, device):
        if tokens == 16:
            raise RuntimeError("CPU out of memory\nmore")
        return real(case, entry, tokens, pass_name, device)

    monkeypatch.setattr(suite, "build", build)
    spec = check_spec({"entries": ["softmax"], "min_run_time": 0.01, "cases": [_layer_case(tokens=[16, 4])]})
    rows = run_suite(spec, log=lambda _: None)["rows"]
    assert [(r["N"], r["status"]) for r in rows] == [(16, "error"), (4, "ok")]
    assert rows[0]["note"] == "RuntimeError: CPU out of memory"


@pytest.mark.parametrize("change, message", [
    ({"entries": ["softmax", "sofft"]}, "Did you mean: soft"),
    ({"entries": ["softmax", "soft:num_landmark=4"]}, "Did you mean: num_landmarks"),
    ({"ratios_to": ["sdpa"]}, "not an entry"),
    ({"round": 3}, "Did you mean: rounds"),
    ({"rounds": 0}, "rounds must be a positive integer"),
    ({"rounds": 2.5}, "rounds must be a positive integer"),
    ({"min_run_time": -1}, "min_run_time must be a positive number"),
    ({"cases": [{**_layer_case(), "kind": "op", "prefix": 1}]}, "'prefix' is for layer cases, not op"),
    ({"cases": [{"kind": "train_step", "model": "vit_nano_patch4_32", "passes": ["fwd"]}]},
     "'passes' is for layer and op and model cases, not train_step"),
    ({"cases": [{"kind": "model", "model": "vit_nano_patch4_32", "tokens": [4]}]}, "'tokens' is for layer and op"),
    ({"cases": [_layer_case(kind="layr")]}, "Did you mean: layer"),
    ({"cases": [_layer_case(token=[4])]}, "Did you mean: tokens"),
    ({"cases": [{"name": "x", "kind": "model"}]}, "a model case needs 'model'"),
    ({"cases": [_layer_case(dim=30, heads=4)]}, "not divisible"),
    ({"cases": [_layer_case(passes=["bwd"])]}, "passes must be a list of fwd, fwd+bwd"),
    ({"cases": [_layer_case(), _layer_case()]}, "case names repeat"),
    ({"entries": ["softmax", "floor"], "cases": [{**_layer_case(), "kind": "op"}]}, "unknown op 'softmax'"),
    ({"entries": ["sdpa", "floor"], "cases": [{**_layer_case(), "kind": "op"}]}, "unknown op 'floor'"),
    ({"entries": ["laplacian:landmarks=5"], "cases": [{**_layer_case(), "kind": "op"}]}, "square number"),
    ({"entries": ["floor"], "cases": [{"kind": "model", "model": "vit_nano_patch4_32"}]}, "layer cases only"),
])
def test_a_bad_spec_is_one_actionable_value_error(change, message):
    spec = {"entries": ["softmax", "soft"], "cases": [_layer_case()], **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        check_spec(spec)


def test_bench_spec_writes_the_suite_under_the_machine(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text("title: tiny suite\nentries: [softmax, floor]\nrounds: 2\nmin_run_time: 0.01\n"
                    "cases:\n  - {name: l, kind: layer, dim: 16, heads: 2, tokens: [9], memory: true, profile: 1}\n")
    assert main(["bench", "--spec", str(spec), "--out", str(tmp_path / "out" / "{machine}"), "--threads", "1"]) == 0
    out = tmp_path / "out" / machine_tag()
    assert sorted(p.name for p in out.iterdir()) == ["profile.md", "results.csv", "results.json", "results.md"]
    payload = json.loads((out / "results.json").read_text())
    assert payload["command"].startswith("vitmix bench --spec") and payload["spec"]["threads"] == 1
    assert [(r["entry"], len(r["round_ms"])) for r in payload["rows"]] == [("softmax", 2), ("floor", 2)]
    assert all(r["peak_mib"] is not None for r in payload["rows"])
    md = (out / "results.md").read_text()
    assert md.startswith("# tiny suite") and "| l | 9 | 1 | fwd+bwd | floor |" in md and "× softmax" in md
    assert "round_ms" not in (out / "results.csv").read_text().splitlines()[0]
    assert "## l, floor, N = 9, fwd+bwd (1 calls profiled)" in (out / "profile.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--spec", "missing.yaml"], "missing.yaml does not exist"),
    (["--spec", "{spec}", "--tokens", "16"], "--tokens is for --mixers/--models sweeps"),
    (["--spec", "{spec}", "--min-run-time", "1"], "--min-run-time is for --mixers/--models sweeps"),
    (["--spec", "{spec}", "--dim", "64"], "--dim is for --mixers/--models sweeps"),
    (["--spec", "{spec}", "--compile"], "--compile is for --mixers/--models sweeps"),
    (["--spec", "{spec}", "--seed", "3"], "--seed is for --mixers/--models sweeps"),
])
def test_bench_spec_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    spec = tmp_path / "s.yaml"
    spec.write_text("entries: [softmax]\ncases: [{name: l, kind: layer, dim: 16, heads: 2, tokens: [4]}]\n")
    argv = [a.replace("{spec}", str(spec)) for a in argv]
    assert main(["bench", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_bench_spec_refuses_a_folder_of_the_users_files_before_running(tmp_path, capsys, monkeypatch):
    """The --out rule of every command that writes a folder: a folder holding files a suite did not write is
    refused in one line before any timing, and nothing in it changes; a suite's own earlier folder is refreshed."""
    from vitmix.bench import suite

    spec = tmp_path / "s.yaml"
    spec.write_text("entries: [softmax]\nrounds: 1\nmin_run_time: 0.01\n"
                    "cases: [{name: l, kind: layer, dim: 16, heads: 2, tokens: [4]}]\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    ran = []
    real = suite.run_suite
    monkeypatch.setattr(suite, "run_suite", lambda *a, **k: ran.append(1) or real(*a, **k))
    assert main(["bench", "--spec", str(spec), "--out", str(mine), "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds no vitmix bench results" in err and len(err.strip().splitlines()) == 1 and not ran
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    again = tmp_path / "again"
    assert main(["bench", "--spec", str(spec), "--out", str(again), "--threads", "1"]) == 0
    assert main(["bench", "--spec", str(spec), "--out", str(again), "--threads", "1"]) == 0 and len(ran) == 2
