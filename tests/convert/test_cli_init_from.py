"""``vitmix train --init-from RUN_OR_FILE --mixer NAME [--transfer-epochs K] [--distill]``: a run that
starts from a trained softmax model, converted, optionally attention-transferred and distilled.

The teacher is a tiny softmax ViT trained for one epoch on a subset of digits (a few seconds); each
student run is one epoch of two steps."""
import json
import types

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import vitmix
from vitmix.cli import main
from vitmix.train import TrainConfig, train
from vitmix.train import init_from
from vitmix.train.checkpoint import load_state, save_weights
from vitmix.train.runner import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

ARCH = dict(model="vit_nano_patch4_32", img_size=16, model_options={"depth": 2, "embed_dim": 64, "num_heads": 2})
#: a student run: what the teacher does not give (the architecture and data come from it)
STUDENT = dict(epochs=1, train_subset=64, batch_size=32, warmup_epochs=0.5)
STUDENT_FLAGS = ["--epochs", "1", "--train-subset", "64", "--batch-size", "32", "--warmup-epochs", "0.5"]
quiet = dict(log=lambda *a: None)


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "softmax"
    train(TrainConfig(**ARCH, mixer="softmax", data="digits", epochs=1, train_subset=128, batch_size=32, lr=3e-3,
                      warmup_epochs=0.2, out=str(out)), **quiet)
    return out


def _snapshot(folder):
    """Bytes and modification time of every file: the teacher must be only read."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def _history(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _student(teacher, out, **extra):
    return TrainConfig(**{**STUDENT, **extra}, init_from=str(teacher), out=str(out))


def _count_calls(monkeypatch, target: str):
    """Count the calls of ``module.attribute`` (still calling it)."""
    module_name, name = target.rsplit(".", 1)
    module = __import__(module_name, fromlist=[name])
    real, calls = getattr(module, name), []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


# --- conversion and the run ----------------------------------------------------------------------------------
def test_cli_converts_a_run_directory_trains_and_leaves_the_teacher_untouched(teacher_run, tmp_path, capsys):
    before = _snapshot(teacher_run)
    out = tmp_path / "student"
    assert main(["train", "--init-from", str(teacher_run), "--mixer", "laplacian", "-M", "landmark_stride=2",
                 *STUDENT_FLAGS, "--out", str(out)]) == 0
    assert "its attention converted to laplacian" in capsys.readouterr().out
    saved = TrainConfig.load(out / "config.yaml")         # the architecture and data are the teacher's
    assert (saved.model, saved.model_options, saved.img_size, saved.data) == (
        ARCH["model"], ARCH["model_options"], 16, "digits")
    assert saved.init_from == str(teacher_run.absolute()) and saved.mixer_options == {"landmark_stride": 2}
    model = vitmix.load_model(out)
    assert all(type(b.attn).__name__.startswith("Laplacian") for b in model.blocks)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["init_from"]["teacher"]["model"] == ARCH["model"] and summary["epochs_run"] == 1
    assert _snapshot(teacher_run) == before


def test_a_checkpoint_file_converts_and_its_metadata_gives_the_architecture(teacher_run, tmp_path):
    before = _snapshot(teacher_run)
    summary = train(_student(teacher_run / "last.safetensors", tmp_path / "s", mixer="soft_norm"), **quiet)
    assert summary["mixer"] == "soft_norm" and summary["model"] == ARCH["model"]
    assert _snapshot(teacher_run) == before


@pytest.mark.parametrize("name", ["teacher.pt", "teacher.safetensors"])
def test_a_file_without_vitmix_metadata_is_built_from_the_flags(teacher_run, tmp_path, name):
    state, _ = vitmix.runs.load_weights(teacher_run / "best.safetensors")
    if name.endswith(".pt"):
        torch.save({"model": state}, tmp_path / name)           # as state.pt holds it
    else:
        save_file(state, str(tmp_path / name))                   # as timm's released files are
    summary = train(_student(tmp_path / name, tmp_path / "s", mixer="linear", **ARCH), **quiet)
    assert summary["epochs_run"] == 1
    with pytest.raises(ValueError, match="no vitmix metadata, so the teacher is built from --model"):
        train(_student(tmp_path / name, tmp_path / "s2", mixer="linear"), **quiet)   # default depth 6
    assert not (tmp_path / "s2").exists()


def _converted(teacher_run, mixer):
    """``(teacher, fresh student state, converted student)`` as the run builds them."""
    source = init_from.find_teacher(str(teacher_run))
    cfg = init_from.teacher_config(TrainConfig(mixer=mixer, init_from=str(teacher_run)), source)
    data = types.SimpleNamespace(num_classes=source.meta["num_classes"], in_chans=source.meta["in_chans"],
                                 num_frames=None)
    teacher = init_from.load_teacher(source, cfg, data, 16, "cpu")
    student = build_model(cfg, data.num_classes, data.in_chans, 16)
    fresh = {k: v.clone() for k, v in student.state_dict().items()}
    init_from.load_converted(student, teacher, cfg)
    return teacher, fresh, student


def test_the_students_non_attention_weights_start_as_the_teachers(teacher_run):
    teacher, fresh, student = _converted(teacher_run, "laplacian")
    theirs, mine = teacher.state_dict(), student.state_dict()
    outside = [k for k in theirs if ".attn." not in k]
    assert outside and all(torch.equal(mine[k], theirs[k]) for k in outside)
    assert torch.equal(mine["blocks.0.attn.qkv.weight"], theirs["blocks.0.attn.qkv.weight"])   # carried over
    assert not torch.equal(fresh["head.weight"], mine["head.weight"])      # the test can tell a fresh model
    assert not any(p.requires_grad for p in teacher.parameters()) and not teacher.training


# --- the attention-transfer stage ----------------------------------------------------------------------------
def test_the_transfer_stage_lowers_the_layer_mse_and_is_recorded(teacher_run, tmp_path):
    out = tmp_path / "s"
    summary = train(_student(teacher_run, out, mixer="laplacian", transfer_epochs=2, transfer_lr=1e-3), **quiet)
    record = json.loads((out / init_from.INIT_FILE).read_text())
    stage = record["transfer"]
    assert stage["done"] and [row["epoch"] for row in stage["history"]] == [1, 2]
    before, after = stage["val_layer_mse_before"], stage["val_layer_mse_after"]
    assert set(before) == {"blocks.0.attn", "blocks.1.attn"}
    assert all(after[k] < before[k] for k in before)
    assert summary["init_from"] == record and (out / init_from.TRANSFER_WEIGHTS).is_file()
    assert _history(out)[0]["epoch"] == 1      # metrics.jsonl keeps one row per fine-tuning epoch


def test_resume_after_a_kill_following_the_transfer_does_not_repeat_it(teacher_run, tmp_path, monkeypatch):
    # attention dropout draws from torch's global generator, in the transfer stage and in the fine-tune
    cfg = dict(mixer="softmax", mixer_options={"attn_drop": 0.1}, transfer_epochs=1, transfer_lr=1e-3)
    train(_student(teacher_run, tmp_path / "whole", **cfg), **quiet)

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    with monkeypatch.context() as m:           # killed after the transfer stage, before the first epoch ends
        m.setattr("vitmix.train.runner.train_one_epoch", killed)
        with pytest.raises(RuntimeError, match="killed"):
            train(_student(teacher_run, tmp_path / "cut", **cfg), **quiet)
    assert not (tmp_path / "cut" / "state.pt").exists()
    calls = _count_calls(monkeypatch, "vitmix.conversion.transfer_attention")
    train(_student(teacher_run, tmp_path / "cut", **cfg, resume=True), **quiet)
    assert calls == []
    assert _history(tmp_path / "cut")[0]["train_loss"] == _history(tmp_path / "whole")[0]["train_loss"]


def test_resume_after_a_kill_during_the_transfer_runs_it_again(teacher_run, tmp_path, monkeypatch):
    cfg = dict(mixer="linear", transfer_epochs=1)
    with monkeypatch.context() as m:
        m.setattr("vitmix.conversion.transfer_attention", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
        with pytest.raises(RuntimeError, match="killed"):
            train(_student(teacher_run, tmp_path / "cut", **cfg), **quiet)
    assert not json.loads((tmp_path / "cut" / init_from.INIT_FILE).read_text())["transfer"]["done"]
    calls = _count_calls(monkeypatch, "vitmix.conversion.transfer_attention")
    train(_student(teacher_run, tmp_path / "cut", **cfg, resume=True), **quiet)
    assert calls == [1]
    assert json.loads((tmp_path / "cut" / init_from.INIT_FILE).read_text())["transfer"]["done"]


def test_a_resumed_run_rebuilds_the_teacher_for_distillation_and_skips_the_transfer(teacher_run, tmp_path,
                                                                                      monkeypatch):
    out = tmp_path / "s"
    train(_student(teacher_run, out, mixer="laplacian", transfer_epochs=1, distill=True), **quiet)
    transfers = _count_calls(monkeypatch, "vitmix.conversion.transfer_attention")
    distilled = _count_calls(monkeypatch, "vitmix.train.init_from.distill_loss")
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2"]) == 0
    assert transfers == [] and len(distilled) == 2 and len(_history(out)) == 2
    assert load_state(out / "state.pt")["epoch"] == 2


def test_resume_refuses_a_teacher_that_changed(teacher_run, tmp_path):
    import shutil

    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run, teacher)
    out = tmp_path / "s"
    train(_student(teacher, out, mixer="linear"), **quiet)
    model, meta = vitmix.load_model(teacher), vitmix.runs.load_weights(teacher / "best.safetensors")[1]
    with torch.no_grad():
        model.head.bias.add_(0.01)                # e.g. the teacher run went on and found a better epoch
    save_weights(model, teacher / "best.safetensors", meta)
    with pytest.raises(ValueError, match="changed since"):
        train(_student(teacher, out, mixer="linear", epochs=2, resume=True), **quiet)


# --- distillation --------------------------------------------------------------------------------------------
def test_the_distillation_loss_is_the_written_formula_on_one_batch():
    torch.manual_seed(0)
    teacher = nn.Linear(5, 4).requires_grad_(False)
    images, logits = torch.randn(3, 5), torch.randn(3, 4, requires_grad=True)
    task = torch.tensor(0.7)
    w, t = 0.3, 2.0
    loss = init_from.LogitDistillation(teacher, w, t)(task, logits, images)
    p_teacher = torch.softmax(teacher(images) / t, -1)
    kl = (p_teacher * (p_teacher.log() - torch.log_softmax(logits / t, -1))).sum(-1).mean()
    assert loss.item() == pytest.approx(((1 - w) * task + w * t * t * kl).item(), rel=1e-6)
    loss.backward()
    assert logits.grad is not None and teacher.weight.grad is None


def test_distillation_is_in_the_training_loss_with_mixup_and_smoothing(teacher_run, tmp_path):
    recipe = dict(mixer="linear", mixup=0.8, smoothing=0.1, max_steps=1)
    plain = train(_student(teacher_run, tmp_path / "plain", **recipe), **quiet)
    off = train(_student(teacher_run, tmp_path / "off", **recipe, distill=True, distill_weight=0.0), **quiet)
    on = train(_student(teacher_run, tmp_path / "on", **recipe, distill=True, distill_weight=0.9), **quiet)
    loss = {name: _history(tmp_path / name)[0]["train_loss"] for name in ("plain", "off", "on")}
    assert loss["off"] == loss["plain"] != loss["on"]
    assert on["init_from"]["distill"] == {"weight": 0.9, "temperature": 1.0} and plain["steps"] == off["steps"] == 1


# --- errors: one line, exit 2, nothing written -----------------------------------------------------------------
@pytest.fixture(scope="module")
def soft_teacher(teacher_run, tmp_path_factory):
    """A checkpoint whose attention has nothing to carry over (SOFT has no fused qkv)."""
    meta = json.loads(json.dumps(vitmix.runs.load_weights(teacher_run / "best.safetensors")[1]))
    model = vitmix.create_model(ARCH["model"], mixer="soft", img_size=16, num_classes=meta["num_classes"],
                                in_chans=meta["in_chans"], **ARCH["model_options"])
    path = tmp_path_factory.mktemp("soft") / "soft.safetensors"
    save_weights(model, path, dict(meta, mixer="soft", mixer_options={}))
    return path


def _no_checkpoints(tmp_path):
    (tmp_path / "empty-run").mkdir()
    (tmp_path / "empty-run" / "config.yaml").write_text("model: vit_nano_patch4_32\n")
    return tmp_path / "empty-run"


ERRORS = {
    "missing path": (lambda t, w: ["--init-from", str(w / "nope"), "--mixer", "soft"],
                     "no run directory or checkpoint"),
    "run without checkpoints": (lambda t, w: ["--init-from", str(_no_checkpoints(w)), "--mixer", "soft"],
                                "without best.safetensors or last.safetensors"),
    "transfer without init-from": (lambda t, w: ["--transfer-epochs", "1"], "--transfer-epochs needs --init-from"),
    "distill without init-from": (lambda t, w: ["--distill"], "--distill needs --init-from"),
    "negative K": (lambda t, w: ["--init-from", str(t), "--mixer", "soft", "--transfer-epochs", "-1"], ">= 0"),
    "distill weight above 1": (lambda t, w: ["--init-from", str(t), "--mixer", "soft", "--distill",
                                             "--distill-weight", "1.5"], "in [0, 1]"),
    "no mixer": (lambda t, w: ["--init-from", str(t)], "needs --mixer"),
    "another architecture": (lambda t, w: ["--init-from", str(t), "--mixer", "soft", "--img-size", "32"],
                             "differs from the teacher's 16"),
    "unknown mixer option": (lambda t, w: ["--init-from", str(t), "--mixer", "soft", "-M", "landmark=4"],
                             "has no option 'landmark'"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_input_is_a_one_line_error_with_exit_2(case, teacher_run, tmp_path, capsys):
    flags, expected = ERRORS[case]
    out = tmp_path / "student"
    assert main(["train", *flags(teacher_run, tmp_path), *STUDENT_FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitmix train: error:") and expected in err[0], err
    assert not out.exists()


def test_a_teacher_whose_attention_cannot_convert_is_a_one_line_error(soft_teacher, tmp_path, capsys):
    before = soft_teacher.read_bytes()
    out = tmp_path / "student"
    assert main(["train", "--init-from", str(soft_teacher), "--mixer", "laplacian", *STUDENT_FLAGS,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "blocks.0.attn (SoftAttention) has no fused qkv" in err[0], err
    assert not out.exists() and soft_teacher.read_bytes() == before
