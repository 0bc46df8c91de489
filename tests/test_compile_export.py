"""torch.compile, torch.export and ONNX over the model registry and every mixer.

The tables of ``docs/compile-export.md`` say what works; these tests read them and check each claim
on the family's representative in a small configuration (``FAMILY_CONFIGS``) and on every mixer in
a one-block ``vit_nano_patch4_32``:

* ``yes`` — compile with ``fullgraph=True`` / export with a dynamic batch / ONNX within 1e-4, and
  match eager (forward and every parameter gradient for compile). ONNX is checked the ecosystem's
  way: plain ``torch.onnx.export(model, ..., dynamo=True)`` and the TorchScript exporter as timm's
  ``onnx_export`` calls it, after ``import vitmix`` only (no decomposition table passed);
* ``graph break: ...`` — compile with ``fullgraph=False`` and match eager;
* ``no: ...`` — still fails (a fix must update the table).

A registered model outside every family pattern, or a mixer without a row, fails
:func:`test_tables_cover_the_registry`. ``VITMIX_TEST_ALL_MODELS=1`` adds the export of every
registered model at full depth (minutes).
"""
import contextlib
import fnmatch
import functools
import os
import re

import pytest
import timm
import torch

import vitmix
from vitmix.export import export_program, onnxruntime_parity, relative_error, write_onnx
from vitmix.models import is_vitmix_model
from _families import FAMILIES, FAMILY_CONFIGS, doc_table, family_model, image_shape, model_inputs

#: what tracing raises on code it cannot capture (dynamo's Unsupported/UserError, data-dependent
#: guards, specialised dynamic dimensions): all RuntimeErrors, unlike vitmix's ValueErrors
TRACING_FAILURE = RuntimeError

MIXERS = doc_table("Every mixer inside")


def _family_of(name: str) -> str:
    """The ``models`` pattern of ``name``'s family: the longest matching one ("" if none matches)."""
    matches = [f["models"] for f in FAMILIES if fnmatch.fnmatchcase(name, f["models"])]
    return max(matches, key=len) if matches else ""


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()       # each test compiles new modules: no recompile limit, no stale guards
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------- the tables
def test_tables_cover_the_registry():
    registered = sorted(m for m in timm.list_models() if is_vitmix_model(m))
    assert [m for m in registered if not _family_of(m)] == [], "models without a row in docs/compile-export.md"
    assert {f["models"] for f in FAMILIES} == set(FAMILY_CONFIGS)
    for f in FAMILIES:
        assert _family_of(f["tested as"]) == f["models"], f
    assert sorted(r["mixer"] for r in MIXERS) == sorted(vitmix.list_mixers())
    cells = [r[c] for r in FAMILIES for c in ("torch.compile", "torch.export", "ONNX")]
    cells += [r[c] for r in MIXERS for c in ("torch.compile", "torch.export")]
    for cell in cells:      # every claim is checkable: yes, a justified graph break or a justified no
        assert re.fullmatch(r"yes|(graph break|no): .{10,}", cell), cell


# ------------------------------------------------------------------------------------ helpers
def _mixer_model(name):
    torch.manual_seed(0)
    return vitmix.create_model("vit_nano_patch4_32", mixer=name, depth=1).eval()






def _forward_backward(fn, model, args):
    """Output and every parameter gradient of a fixed weighted sum of the output."""
    model.zero_grad(set_to_none=True)
    out = fn(*args)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_matches(got, want, rtol):
    """Same output and gradients up to ``rtol`` of each tensor's largest entry (float32 rounding)."""
    (out, grads), (ref, ref_grads) = got, want
    assert relative_error(out, ref) <= rtol
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert relative_error(grads[name], ref_grads[name]) <= rtol, name


@contextlib.contextmanager
def _composed_eager(model):
    """Eager training with the landmark mixers' one-call C paths (LaplacianFormer, SOFT) off: the composed ops
    the compiled graph runs. The two agree to float32 rounding (tests/mixers/test_laplacian.py, test_soft.py),
    but the untrained pyramid's ill-conditioned landmark kernels amplify rounding to ~0.4 % of some gradients in
    either path (its stage-3 layer against float64), so a compiled graph is compared with the same arithmetic."""
    from vitmix.mixers.landmark import LandmarkMixer

    layers = [m for m in model.modules() if isinstance(m, LandmarkMixer)]
    for layer in layers:
        layer._fused = lambda *args: None
    try:
        yield
    finally:
        for layer in layers:
            del layer._fused


def _check_compile(model, claim: str, backend: str = "eager", rtol: float = 1e-5):
    args = model_inputs(model, 2)
    with _composed_eager(model):
        eager = _forward_backward(model, model, args)        # also warms up caches and lazy modules
    if claim != "yes":      # "no" or "graph break": one graph cannot hold it (the claim is still true)
        with pytest.raises(TRACING_FAILURE):
            torch.compile(model, backend=backend, fullgraph=True)(*args)
        torch._dynamo.reset()
        if claim.startswith("no"):
            return
    compiled = torch.compile(model, backend=backend, fullgraph=claim == "yes")
    _assert_matches(_forward_backward(compiled, model, args), eager, rtol)
    # a second call (the cached graph) gives the same numbers
    _assert_matches(_forward_backward(compiled, model, args), eager, rtol)


def _check_export(model, claim: str, program=None):
    args = model_inputs(model, 2)
    if claim.startswith("no"):
        with pytest.raises(TRACING_FAILURE):
            _export(model, args)
        return
    program = (program or _export(model, args)).module()
    for batch in (1, 3):
        other = model_inputs(model, batch)
        with torch.no_grad():
            # eager inference of the kernel mixers is one fused C call per layer, the trace runs the composed
            # custom ops: the same arithmetic summed in another order, then amplified by 20 Newton–Schulz
            # rounds (the float32 bound of the fused-vs-composed tests in tests/mixers; laplacianformer_*
            # measured 3.3e-5)
            assert relative_error(program(*other), model(*other)) <= 5e-5, batch


@functools.lru_cache(maxsize=None)
def _family_program(pattern: str):
    """The family's small model and its exported program, shared by the export and ONNX tests (the
    ``xdist_group`` of :data:`FAMILY_PARAMS` keeps both on one worker)."""
    model = family_model(next(f for f in FAMILIES if f["models"] == pattern))
    return model, _export(model, model_inputs(model, 2))


def _export(model, args):
    return export_program(model, args)


# ----------------------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("row", FAMILIES, ids=[r["models"] for r in FAMILIES])
def test_family_compiles_and_matches_eager(row):
    _check_compile(family_model(row), row["torch.compile"])


@pytest.mark.parametrize("row", MIXERS, ids=[r["mixer"] for r in MIXERS])
def test_mixer_in_a_timm_vit_compiles_and_matches_eager(row):
    _check_compile(_mixer_model(row["mixer"]), row["torch.compile"])


@pytest.mark.parametrize("row", [r for r in MIXERS if r["torch.compile"] == "yes"], ids=lambda r: r["mixer"])
def test_fresh_mixer_compiles_once_in_training(row):
    """What a user does: compile a new layer (empty pattern caches) and train. One graph serves every
    call: no graph break while a pattern is built, no recompilation once it is cached or while a
    counter advances (Performer's feature redraw)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    layer = vitmix.mixers.create(row["mixer"], 32, num_heads=2).train()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    x = torch.randn(2, 17, 32, requires_grad=True)
    for _ in range(3):
        compiled(x).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])
    torch._dynamo.reset()


@pytest.mark.slow
def test_inductor_fwd_bwd_matches_eager():
    """End to end with inductor (about a minute with a cold inductor cache): the custom ops' fake
    layouts, the C kernels called from generated code, fused PyTorch code around them, on a
    Laplacian ViT (L1 kernel, Newton–Schulz and their backward ops, the injective normaliser).
    Float32 with other reduction orders in the fused code, amplified through Newton–Schulz and the
    normalisation: 1e-4 of each tensor's largest entry."""
    torch.manual_seed(0)
    model = vitmix.create_model("vit_nano_patch4_32", mixer="laplacian", depth=1).eval()
    _check_compile(model, "yes", backend="inductor", rtol=1e-4)


# ------------------------------------------------------------------------------ torch.export
FAMILY_PARAMS = [pytest.param(r, id=r["models"], marks=pytest.mark.xdist_group(f"family {r['models']}"))
                 for r in FAMILIES]


@pytest.mark.parametrize("row", FAMILY_PARAMS)
def test_family_exports_with_a_dynamic_batch(row):
    if row["torch.export"].startswith("no"):
        _check_export(family_model(row), row["torch.export"])
    else:
        model, program = _family_program(row["models"])
        _check_export(model, row["torch.export"], program)


@pytest.mark.slow
@pytest.mark.parametrize("row", MIXERS, ids=[r["mixer"] for r in MIXERS])
def test_mixer_in_a_timm_vit_exports_with_a_dynamic_batch(row):
    _check_export(_mixer_model(row["mixer"]), row["torch.export"])


def test_linformer_lengths_are_plain_python_state():
    """The compile fix: E/F exist from construction and their length is a Python int, so no forward asks
    torch's ``is_lazy`` (which dynamo cannot trace): told its N, told nothing, or loaded."""
    x = torch.randn(2, 21, 32)
    built = vitmix.mixers.create("linformer", 32, 4, seq_len=21)
    untold = vitmix.mixers.create("linformer", 32, 4)
    untold(x)                                                          # the first 21 of its 197 columns
    loaded = vitmix.mixers.create("linformer", 32, 4)
    loaded.load_state_dict(built.state_dict())                         # takes the saved length
    for layer in (built, untold, loaded):
        assert layer(x).shape == x.shape and type(layer.max_seq_len) is int
    assert built.seq_len == loaded.seq_len == 21 and untold.seq_len is None
    torch.testing.assert_close(loaded(x), built(x), rtol=0, atol=0)


def test_exported_program_keeps_the_custom_ops():
    model = _mixer_model("laplacian")
    ep = export_program(model, model_inputs(model, 2)[0])
    targets = {str(n.target) for n in ep.graph.nodes}
    assert {"vitmix.laplacian_kernel.default", "vitmix.newton_schulz_inverse.default"} <= targets


if os.environ.get("VITMIX_TEST_ALL_MODELS"):     # opt-in: minutes (defined only then, so nothing is skipped)
    @pytest.mark.slow
    @pytest.mark.parametrize("name", sorted(m for m in timm.list_models() if is_vitmix_model(m)))
    def test_every_registered_model_exports(name):
        """Full depth; pyramids and WeightFormer at 64² (any multiple of 32 works), ViTs at their size."""
        row = next(f for f in FAMILIES if f["models"] == _family_of(name))
        small = {"img_size": 64} if row["models"] in ("soft_*", "soft_norm_*", "laplacianformer_*", "weightformer_*") \
            else {}
        torch.manual_seed(0)
        _check_export(vitmix.create_model(name, **small).eval(), row["torch.export"])


# ------------------------------------------------------------------------------------- ONNX
def _needs_onnx_packages():
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name, reason="ONNX tests need the export extra: pip install 'vitmix[export]'")


def _dynamo_onnx_export(model, args, path):
    """What a deployment pipeline calls: ``torch.onnx.export`` on the model itself (no vitmix helper, no
    decomposition table), with a dynamic batch."""
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), dynamo=True, dynamic_shapes=tuple({0: batch} for _ in args),
                          verbose=False)


@pytest.mark.slow
@pytest.mark.parametrize("row", FAMILY_PARAMS)
def test_family_onnx_matches_onnxruntime(row, tmp_path):
    """Plain ``torch.onnx.export(model, ..., dynamo=True)`` after ``import vitmix``: the ops run their export
    decompositions while it traces, so no custom op reaches the ONNX translation."""
    _needs_onnx_packages()
    model = family_model(row)
    path = tmp_path / "m.onnx"
    if row["ONNX"].startswith("no"):
        with pytest.raises(TRACING_FAILURE):
            _dynamo_onnx_export(model, model_inputs(model, 2), path)
        return
    _dynamo_onnx_export(model, model_inputs(model, 2), path)
    errors = onnxruntime_parity(path, model, image_shape(model))       # batch 1 and 3: the batch is dynamic
    assert max(errors.values()) <= 1e-4, errors


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:You are using the legacy TorchScript")
@pytest.mark.parametrize("row", FAMILY_PARAMS)
def test_family_torchscript_onnx_matches_onnxruntime(row, tmp_path):
    """The TorchScript exporter, as timm's ``onnx_export`` calls it (its default, ``dynamo=False``); the
    diffusion backbones take three inputs, which that helper cannot pass, so they go to
    ``torch.onnx.export(..., dynamo=False)`` directly."""
    _needs_onnx_packages()
    from timm.utils.onnx import onnx_export

    model = family_model(row)
    args, path = model_inputs(model, 2), tmp_path / "m.onnx"
    if len(args) == 1:
        onnx_export(model, str(path), example_input=args[0])           # checks the file with onnx.checker
    else:
        names = ["images", "t", "y"]
        torch.onnx.export(model, args, str(path), dynamo=False, input_names=names,
                          dynamic_axes={name: {0: "batch"} for name in names})
    errors = onnxruntime_parity(path, model, image_shape(model))
    assert max(errors.values()) <= 1e-4, errors


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:You are using the legacy TorchScript")
def test_torchscript_onnx_export_builds_pooling_matrices_on_a_cold_cache(tmp_path):
    """The landmark pooling matrices are cached; the first one built inside the TorchScript exporter
    must not leave an op in the traced graph (``aten::kron`` has no ONNX symbolic)."""
    _needs_onnx_packages()
    from timm.utils.onnx import onnx_export

    from vitmix.ops import nystrom

    model = _mixer_model("soft")
    nystrom._pool_matrix.cache_clear()
    nystrom._pool_matrix_as.cache_clear()
    path = tmp_path / "m.onnx"
    onnx_export(model, str(path), example_input=model_inputs(model, 2)[0])
    errors = onnxruntime_parity(path, model, image_shape(model))
    assert max(errors.values()) <= 1e-4, errors


@pytest.mark.slow
def test_write_onnx_of_an_exported_program_matches_onnxruntime(tmp_path):
    """``vitmix export``'s route: a saved ``torch.export`` program (custom ops inside) rewritten with
    ``export_decompositions()``, then converted."""
    _needs_onnx_packages()
    model = _mixer_model("laplacian")
    program = export_program(model, model_inputs(model, 2)[0])
    info = write_onnx(program, tmp_path / "m.onnx")
    assert info["inputs"] == [("images", "float32", "[batch, 3, 32, 32]")]
    errors = onnxruntime_parity(tmp_path / "m.onnx", model, image_shape(model))
    assert max(errors.values()) <= 1e-4, errors


def test_onnx_export_leaves_eager_calls_and_other_exports_alone():
    """The decompositions run only while torch.onnx traces: eager calls and torch.export keep the custom ops."""
    from vitmix.ops._common import exporting_to_onnx

    import torch.onnx  # noqa: F401 - imported or not, eager calls never take the ONNX route

    assert not exporting_to_onnx()
    model = _mixer_model("soft")
    targets = {str(n.target) for n in export_program(model, model_inputs(model, 2)[0]).graph.nodes}
    assert "vitmix.gaussian_kernel.default" in targets


@pytest.mark.parametrize("size", [(8, 8), (7, 5), (3, 3), (2, 4)])
def test_weightformer_pools_by_slices_like_adaptive_avg_pool2d(size):
    """WeightFormer's kernel predictor pools this way under torch.jit.trace (the TorchScript ONNX exporter
    has no adaptive pooling to a size that does not divide the input)."""
    import torch.nn.functional as F

    from vitmix.models._blocks import _adaptive_avg_pool_by_slices

    x = torch.randn(2, 4, *size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_adaptive_avg_pool_by_slices(x, 3), F.adaptive_avg_pool2d(x, 3), rtol=1e-6, atol=1e-7)


@functools.lru_cache(maxsize=None)
def _saved_program(folder: str):
    """A ``.pt2`` file with vitmix custom ops (SOFT: Gaussian kernel, Newton–Schulz), an input and the
    eager output for it."""
    model = _mixer_model("soft")
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    torch.export.save(export_program(model, x[:2]), os.path.join(folder, "soft.pt2"))
    with torch.no_grad():
        return x, model(x)


@pytest.mark.parametrize("imports", ["import torch, vitmix", "import vitmix, torch"])
def test_torch_export_load_needs_only_import_vitmix(imports, tmp_path_factory):
    """The pt2 round trip in a fresh process that imports vitmix and nothing else of it: the ops are
    registered as soon as both vitmix and torch are loaded, in either order."""
    import subprocess
    import sys

    folder = str(tmp_path_factory.getbasetemp() / "pt2")
    os.makedirs(folder, exist_ok=True)
    x, want = _saved_program(folder)
    torch.save(x, os.path.join(folder, "x.pt"))
    code = (f"{imports}; import os; d = {folder!r}\n"
            "program = torch.export.load(os.path.join(d, 'soft.pt2')).module()\n"
            "with torch.no_grad():\n"
            "    torch.save(program(torch.load(os.path.join(d, 'x.pt'))), os.path.join(d, 'out.pt'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert relative_error(torch.load(os.path.join(folder, "out.pt")), want) <= 1e-5


def test_onnx_refuses_the_cholesky_start_with_a_named_option(tmp_path):
    pytest.importorskip("onnxscript", reason="ONNX tests need the export extra: pip install 'vitmix[export]'")
    torch.manual_seed(0)
    model = vitmix.create_model("vit_nano_patch4_32", mixer="laplacian", depth=1,
                                mixer_options={"newton_alpha": "safe"}).eval()
    with pytest.raises(ValueError, match="newton_alpha='transpose'"):
        write_onnx(export_program(model, model_inputs(model, 2)[0]), tmp_path / "m.onnx")


@pytest.mark.slow
def test_plain_torch_onnx_export_names_the_option_for_the_cholesky_start(tmp_path):
    """The same refusal through plain torch.onnx.export (its strict fallback capture included): the
    ValueError is the cause of torch.onnx's error, not a missing ONNX function for a vitmix op."""
    _needs_onnx_packages()
    torch.manual_seed(0)
    model = vitmix.create_model("vit_nano_patch4_32", mixer="laplacian", depth=1,
                                mixer_options={"newton_alpha": "safe"}).eval()
    with pytest.raises(TRACING_FAILURE) as failure:
        _dynamo_onnx_export(model, model_inputs(model, 2), tmp_path / "m.onnx")
    chain, error = [], failure.value
    while error is not None:
        chain.append(error)
        error = error.__cause__
    assert any(isinstance(e, ValueError) and "newton_alpha='transpose'" in str(e) for e in chain), chain


# -------------------------------------------------------------------------------------- CLI
def test_cli_pt2_round_trip(tmp_path, capsys):
    from vitmix.cli import main

    out = tmp_path / "nano.pt2"
    assert main(["export", "--model", "vit_nano_patch4_32", "--format", "pt2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.is_file() and "input  images: float32 [batch, 3, 32, 32]" in text and ": ok" in text


@pytest.mark.parametrize("argv,message", [
    (["--format", "torchscript"], "unsupported export format 'torchscript'; use --format onnx or --format pt2"),
    (["--format", "onxx"], "Did you mean: onnx?"),
    (["--format", "pt2", "--opset", "17"], "--opset applies to --format onnx only"),
    (["--checkpoint", "missing.safetensors", "--format", "pt2"], "does not exist"),
])
def test_cli_bad_options_are_one_line_errors(argv, message, capsys):
    from vitmix.cli import main

    assert main(["export", "--model", "vit_nano_patch4_32", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_missing_onnx_package_names_the_pip_install(monkeypatch, capsys):
    import importlib.util

    from vitmix.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    assert main(["export", "--model", "vit_nano_patch4_32", "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "onnxscript" in err and "pip install 'vitmix[export]'" in err and len(err.splitlines()) == 1


def test_cli_exports_a_vitmix_checkpoint_with_its_own_weights(tmp_path, capsys):
    from vitmix.cli import main
    from vitmix.train.checkpoint import save_weights

    torch.manual_seed(123)
    trained = vitmix.create_model("vit_nano_patch4_32", mixer="fibottention", depth=1).eval()
    ckpt = tmp_path / "best.safetensors"
    save_weights(trained, ckpt, {"model": "vit_nano_patch4_32", "mixer": "fibottention", "num_classes": 10,
                                 "in_chans": 3, "img_size": 32, "model_options": {"depth": 1}})
    out = tmp_path / "m.pt2"
    argv = ["export", "--model", "vit_nano_patch4_32", "--checkpoint", str(tmp_path), "--format", "pt2"]
    assert main([*argv, "--out", str(out)]) == 0
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(str(out)).module()(x), trained(x), rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert main(["export", "--model", "vit_tiny_patch4_32", "--checkpoint", str(ckpt), "--format", "pt2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds vit_nano_patch4_32 (mixer=fibottention)" in err and "--model vit_nano_patch4_32" in err
