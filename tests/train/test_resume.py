"""Resume is exact and nothing is lost: SIGKILL at any point (mid-epoch, inside a checkpoint write,
between the files of a set), then ``--resume``, ends bit-identical to an uninterrupted run."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from vitmix.train import TrainConfig, train
from vitmix.train.checkpoint import load_state

ARGS = ["--img-size", "16", "--epochs", "3", "--batch-size", "64", "--train-subset", "512", "--lr", "3e-3",
        "--ema-decay", "0.9",   # the EMA weights are part of the exact state
        "--model-option", "depth=1", "--model-option", "embed_dim=32", "--model-option", "num_heads=2"]

# Runs `vitmix train ARGS...` and SIGKILLs itself at the N-th event of one kind:
#   step            after the N-th optimizer step (mid-epoch)
#   before_replace  inside an atomic write: the temporary file is complete, not yet renamed
#   after_replace   right after the N-th file of a checkpoint set is renamed into place
DRIVER = r"""
import os, signal, sys
import torch
torch.set_num_threads(1)
from timm.scheduler import CosineLRScheduler
from vitmix.cli import main
kind, n = sys.argv[1], int(sys.argv[2])
count = [0]
def hit():
    count[0] += 1
    if count[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
if kind == "step":
    step_update = CosineLRScheduler.step_update
    def counted(self, *a, **k):
        hit()
        return step_update(self, *a, **k)
    CosineLRScheduler.step_update = counted
elif kind in ("before_replace", "after_replace"):
    replace = os.replace
    def counted(src, dst):
        if kind == "before_replace":
            hit()
        replace(src, dst)
        if kind == "after_replace":
            hit()
    os.replace = counted
sys.exit(main(["train"] + sys.argv[3:]))
"""


def _train(out, *extra, kill=("none", 0)):
    env = dict(os.environ, TQDM_DISABLE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", DRIVER, kill[0], str(kill[1]), *ARGS, "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_sigkill_anywhere_then_resume_is_bit_identical(tmp_path):
    ref = _train(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-2000:]

    out = tmp_path / "killed"
    # 8 steps per epoch; a resumed process first rewrites config.yaml (its replace #1), then per
    # epoch: best (when better), metrics.jsonl, metrics.csv, ema, last, state.pt (the manifest, last)
    plan = [("step", 3),              # mid-epoch 1, before any checkpoint: restart from scratch
            ("before_replace", 3),    # inside a write of epoch 1: a stray temporary file
            ("after_replace", 7),     # right after epoch 1's state.pt: a complete set
            ("after_replace", 3),     # between the files of epoch 2's set: a partial set
            ("before_replace", 2),    # inside a write again
            ("step", 12)]             # mid-epoch 3
    warnings = []
    for i, kill in enumerate(plan):
        proc = _train(out, *(["--resume"] if i else []), kill=kill)
        assert proc.returncode == -9, (kill, proc.returncode, proc.stderr[-2000:])
        warnings += [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    final = _train(out, "--resume")
    assert final.returncode == 0, final.stderr[-2000:]
    warnings += [line for line in final.stdout.splitlines() if line.startswith("warning:")]

    for name in ("last.safetensors", "ema.safetensors"):
        a, b = load_file(str(tmp_path / "ref" / name)), load_file(str(out / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert (tmp_path / "ref" / "metrics.jsonl").read_text().count("\n") == 3
    def strip(text):  # everything but the timings
        return [{k: v for k, v in json.loads(line).items() if k not in ("epoch_seconds", "val_seconds", "images_per_s")}
                for line in text.splitlines()]

    assert strip((out / "metrics.jsonl").read_text()) == strip((tmp_path / "ref" / "metrics.jsonl").read_text())
    assert not list(out.glob(".*.tmp"))
    # the interrupted writes were noticed, each in one line
    assert any("partial checkpoint set" in w for w in warnings)
    assert any("temporary file" in w for w in warnings)


TINY = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, epochs=1, max_steps=2,
            model_options={"depth": 1, "embed_dim": 32, "num_heads": 2})


def test_resume_refuses_a_changed_run_and_keeps_its_files(tmp_path):
    out = tmp_path / "r"
    train(TrainConfig(**TINY, out=str(out)), log=lambda *a: None)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for change, flag in [({"mixer": "fibottention"}, "--mixer"), ({"lr": 1e-3}, "--lr"),
                         ({"model_options": {**TINY["model_options"], "depth": 2}}, "--model-option"),
                         ({"data": "fashion-mnist"}, "--data")]:
        with pytest.raises(ValueError, match=f"^--resume: {flag} .* differs from the run's"):
            train(TrainConfig(**{**TINY, **change}, out=str(out), resume=True), log=lambda *a: None)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    with pytest.raises(ValueError, match="--resume needs --out"):
        train(TrainConfig(**TINY, resume=True), log=lambda *a: None)
    with pytest.raises(FileNotFoundError, match="holds no run to resume"):
        train(TrainConfig(**TINY, out=str(tmp_path / "empty"), resume=True), log=lambda *a: None)


def test_cli_resume_reads_the_run_config(tmp_path, capsys):
    from vitmix.cli import main

    out = tmp_path / "r"
    assert main(["train", "--img-size", "16", "--mixer", "softmax", "--max-steps", "2", "--epochs", "1",
                 "--model-option", "depth=1", "--model-option", "embed_dim=32", "--model-option", "num_heads=2",
                 "--out", str(out)]) == 0
    # nothing but --out and --resume: the run's own config (mixer, model options) is used; a longer
    # schedule is allowed
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2", "--max-steps", "4"]) == 0
    assert load_state(out / "state.pt")["step"] == 4
    assert "mixer=softmax" in capsys.readouterr().out
    assert main(["train", "--out", str(out), "--resume", "--mixer", "laplacian"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mixer 'laplacian' differs from the run's 'softmax'" in err[0]


def _checkpoint_run(out, epochs=2, **extra):
    cfg = TrainConfig(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, epochs=epochs,
                      warmup_epochs=0, model_options={"depth": 1, "embed_dim": 32, "num_heads": 2},
                      train_subset=128, out=str(out), **extra)
    train(cfg, log=lambda *a: None)
    return cfg


def _resume_logs(cfg):
    lines = []
    cfg.resume = True
    train(cfg, log=lines.append)
    return " ".join(map(str, lines))


def _intact(out):
    from vitmix.runs import file_digest

    return {name: file_digest(out / name) == digest for name, digest in load_state(out / "state.pt")["files"].items()}


@pytest.mark.parametrize("keep_top_k", [1, 2])
def test_resume_restores_a_truncated_best_from_the_set(tmp_path, capsys, keep_top_k):
    """Regression (issue 44 item 3): resume said "ignoring the partial checkpoint set", exit 0, and
    left best.safetensors truncated, so `vitmix eval RUN` then failed. Its weights are in the set
    (last.safetensors of a best last epoch, or top/ with --keep-top-k)."""
    from vitmix.cli import main

    out = tmp_path / "run"
    cfg = _checkpoint_run(out, epochs=1 if keep_top_k == 1 else 2, keep_top_k=keep_top_k, ema_decay=0.9)
    for name in ("best.safetensors", "ema.safetensors", "metrics.csv"):
        (out / name).write_bytes((out / name).read_bytes()[:100])
    logs = _resume_logs(cfg)
    assert "restored best.safetensors of epoch" in logs
    assert all(_intact(out).values()), _intact(out)
    assert main(["eval", str(out)]) == 0


def test_resume_removes_a_best_whose_weights_are_lost(tmp_path, monkeypatch):
    """Epoch 1 is the best (forced), epoch 2 the last, no top/ copies: a truncated best has no twin in
    the set, so it is removed with a warning and eval falls back to last.safetensors."""
    from vitmix.cli import main
    from vitmix.train import runner

    real, accuracy = runner._validate, iter([60.0, 40.0])

    def validate(*args, **kwargs):
        return dict(real(*args, **kwargs), val_acc=next(accuracy))

    monkeypatch.setattr(runner, "_validate", validate)
    out = tmp_path / "run"
    cfg = _checkpoint_run(out)
    monkeypatch.undo()
    (out / "best.safetensors").write_bytes(b"")
    logs = _resume_logs(cfg)
    assert f"{out / 'best.safetensors'} was not the one of epoch 2's set and no other file holds its contents: " \
           "removed it" in logs
    assert not (out / "best.safetensors").exists()
    assert main(["eval", str(out)]) == 0
