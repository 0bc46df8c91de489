"""Every `vitmix analyze` subcommand end to end on small shapes: files written, numbers that make sense."""
import csv
import json

import pytest
import torch

from vitmix.cli import main


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(tmp_path, *argv):
    out = tmp_path / argv[0]
    assert main(["analyze", *argv, "--out", str(out)]) == 0
    name = argv[0]
    for suffix in (".png", ".md", ".csv", ".json"):
        assert (out / f"{name}{suffix}").stat().st_size > 0, suffix
    with open(out / f"{name}.csv") as fh:
        return list(csv.DictReader(fh)), out


def test_approx(tmp_path):
    rows, out = _run(tmp_path, "approx", "--img-size", "32", "--images", "2", "--sides", "1,2,4,8",
                     "--source", "digits")
    assert {r["kernel"] for r in rows} == {"gaussian", "laplacian"}
    for kernel in ("gaussian", "laplacian"):
        err = {int(r["landmarks"]): float(r["rel_error"]) for r in rows
               if r["kernel"] == kernel and r["inverse"] == "exact" and float(r["eps"]) == 0}
        assert err[64] < 1e-6            # m = N landmarks, exact inverse: Nyström is exact
        assert err[1] > 1e-3
        newton = {int(r["landmarks"]): float(r["rel_error"]) for r in rows
                  if r["kernel"] == kernel and r["inverse"] == "newton"}
        assert newton[64] < newton[1]    # more landmarks, smaller error
    assert "digits" in (out / "approx.md").read_text()


def test_newton(tmp_path):
    rows, out = _run(tmp_path, "newton", "--img-size", "32", "--images", "2", "--landmarks", "16",
                     "--iters", "12")
    assert {(r["kernel"], r["start"], float(r["eps"])) for r in rows} == {
        ("gaussian", "safe", 0.0), ("gaussian", "safe", 0.01), ("laplacian", "safe", 0.0),
        ("laplacian", "safe", 0.01), ("laplacian", "transpose", 0.01), ("laplacian", "official", 0.01)}
    with open(out / "newton_curves.csv") as fh:
        curves = list(csv.DictReader(fh))
    for kernel in ("gaussian", "laplacian"):
        c = [float(r["residual_P"]) for r in curves
             if r["kernel"] == kernel and float(r["eps"]) > 0 and r["start"] == "safe"]
        assert len(c) == 12 and c[-1] < c[0]  # the perturbed system converges from the default start


def test_distances(tmp_path):
    rows, out = _run(tmp_path, "distances", "--model", "vit_nano_patch4_32", "--img-size", "16", "--images", "3")
    assert len(rows) == 2 * 6  # 6 layers x (L2^2, L1)
    for r in rows:
        assert float(r["q50"]) <= float(r["q90"]) <= float(r["q99"]) <= float(r["q99.9"])
        assert float(r["mean"]) > 0 and r["excess_kurtosis"] != "nan"


def test_injectivity(tmp_path):
    rows, _ = _run(tmp_path, "injectivity", "--img-size", "32", "--images", "2")
    frac = {(r["queries"], r["variant"]): float(r["distinct_fraction"]) for r in rows}
    assert frac[("real", "injective")] > 0.9
    assert frac[("shifted", "row-normalised")] < 0.05   # the collapse the injective map prevents
    assert frac[("shifted", "injective")] > 0.5


def test_heads(tmp_path):
    rows, out = _run(tmp_path, "heads", "--img-size", "32", "--images", "2")
    assert len(rows) == 6
    for r in rows:
        assert 0 < float(r["fib_interaction_patch"]) < 0.5 and float(r["softmax_interaction"]) == 1.0
        assert 0 <= float(r["fib_head_diversity"]) <= 1
    notes = json.loads((out / "heads.json").read_text())["notes"]
    assert any("overlap" in n for n in notes)


def test_maps(tmp_path):
    rows, _ = _run(tmp_path, "maps", "--img-size", "32", "--mixers", "softmax,soft,laplacian,fibottention",
                   "--query", "3,4")
    by = {r["mixer"]: r for r in rows}
    assert set(by) == {"softmax", "soft", "laplacian", "fibottention"}
    assert all(r["status"] == "ok" for r in rows)
    assert 0.9 < float(by["softmax"]["row_sum"]) < 1.0  # the CLS column holds the rest of the weight
    assert float(by["fibottention"]["nonzero_fraction"]) < float(by["softmax"]["nonzero_fraction"])


@pytest.mark.parametrize("argv,expect", [
    (["maps", "--mixers", "softmx"], "Did you mean: softmax"),
    (["maps", "--query", "40,2", "--img-size", "32"], "outside the 8x8 patch grid"),
    (["distances", "--source", "mnist"], "Did you mean: fashion-mnist"),
    (["newton", "--landmarks", "50"], "perfect square"),
    (["newton", "--landmarks", "100", "--img-size", "32"], "larger --img-size"),
    (["approx", "--sides", "9", "--img-size", "32"], "do not fit"),
    (["distances", "--model", "vit_nano_patch4_3"], "Did you mean: vit_nano_patch4_32"),
    (["distances", "--checkpoint", "/nonexistent.safetensors"], "does not exist"),
])
def test_bad_input_is_one_line_error(argv, expect, tmp_path, capsys):
    assert main(["analyze", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def grey_run(tmp_path_factory):
    """A vitmix run on digits (one input channel) with a small architecture, at 16 px."""
    out = tmp_path_factory.mktemp("grey") / "run"
    assert main(["train", "--img-size", "16", "--model-option", "depth=2", "--model-option", "embed_dim=32",
                 "--model-option", "num_heads=2", "--epochs", "1", "--max-steps", "1", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("analysis", ["maps", "heads", "distances"])
def test_a_grey_image_run_is_analysed_as_it_was_trained(analysis, grey_run, tmp_path):
    """A run directory of vitmix's own 1-channel run: its model options, channels and size come from
    the checkpoint (it used to be built with 3 channels and the defaults, and a directory 'did not exist')."""
    rows, out = _run(tmp_path, analysis, "--checkpoint", str(grey_run), "--images", "2")
    assert rows and "16" in (out / f"{analysis}.md").read_text()


def test_a_flag_against_the_run_is_one_line(grey_run, tmp_path, capsys):
    assert main(["analyze", "maps", "--checkpoint", str(grey_run), "--img-size", "32", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--img-size 32 differs from the 16 that {grey_run} was trained with" in err


def test_distances_use_the_runs_own_mixer_by_default(tmp_path):
    """Without --mixer, 'the model's own' mixer of a run is the one it trained (its weights fit only it)."""
    run = tmp_path / "laplacian-run"
    assert main(["train", "--img-size", "16", "--mixer", "laplacian", "--model-option", "depth=1",
                 "--model-option", "embed_dim=32", "--model-option", "num_heads=2", "--epochs", "1",
                 "--max-steps", "1", "--out", str(run)]) == 0
    rows, _ = _run(tmp_path, "distances", "--checkpoint", str(run), "--images", "2")
    assert rows
