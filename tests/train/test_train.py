"""Training smoke tests: loss goes down, the run directory is complete, eval reloads it, resume works."""
import json
import os
import subprocess
import sys

import pytest
import torch

from vitmix.cli import main
from vitmix.train import TrainConfig, evaluate_checkpoint, train
from vitmix.train.checkpoint import load_state

TINY = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, lr=3e-3, warmup_epochs=0.2,
            model_options={"depth": 2, "embed_dim": 64, "num_heads": 2}, mixer="softmax")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    summary = train(TrainConfig(**TINY, epochs=3, out=str(out)), log=lambda *a: None)
    return out, summary


def test_loss_goes_down_and_run_directory_is_complete(run):
    out, summary = run
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 3
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.1
    for name in ("config.yaml", "metrics.jsonl", "best.safetensors", "last.safetensors", "state.pt",
                 "curves.png", "summary.json"):
        assert (out / name).is_file(), name
    assert TrainConfig.load(out / "config.yaml").model_options == TINY["model_options"]
    assert summary["best_val_acc"] == max(h["val_acc"] for h in history)
    assert set(load_state(out / "state.pt")) >= {"optimizer", "epoch", "step", "rng"}


def test_eval_reloads_the_best_checkpoint(run, capsys):
    out, summary = run
    result = evaluate_checkpoint(out)
    assert result["val_acc"] == pytest.approx(summary["best_val_acc"])
    assert main(["eval", "--checkpoint", str(out / "last.safetensors")]) == 0
    assert "top-1 " in capsys.readouterr().out


def test_cpu_runs_repeat_exactly_with_the_same_seed(tmp_path):
    cfg = dict(TINY, epochs=1, max_steps=4, seed=3)
    a = train(TrainConfig(**cfg, out=str(tmp_path / "a")), log=lambda *a: None)
    b = train(TrainConfig(**cfg, out=str(tmp_path / "b")), log=lambda *a: None)
    ma = json.loads((tmp_path / "a" / "metrics.jsonl").read_text())
    mb = json.loads((tmp_path / "b" / "metrics.jsonl").read_text())
    assert ma["train_loss"] == mb["train_loss"] and a["final_val_acc"] == b["final_val_acc"]


def test_resume_continues_and_existing_runs_are_not_overwritten(tmp_path):
    out = tmp_path / "r"
    train(TrainConfig(**TINY, epochs=1, out=str(out)), log=lambda *a: None)
    before = (out / "last.safetensors").read_bytes()
    with pytest.raises(ValueError, match="--resume"):
        train(TrainConfig(**TINY, epochs=2, out=str(out)), log=lambda *a: None)
    assert (out / "last.safetensors").read_bytes() == before  # nothing written was lost
    summary = train(TrainConfig(**TINY, epochs=2, out=str(out), resume=True), log=lambda *a: None)
    assert summary["epochs_run"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    assert main(["train", "--model", "vit_nano_patch4_3", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "Did you mean: vit_nano_patch4_32" in err and "Traceback" not in err and err.count("\n") == 1
    assert main(["train", "--img-size", "30", "--out", str(tmp_path / "y")]) == 2
    assert "not divisible" in capsys.readouterr().err
    assert main(["train", "--mixer", "softmx", "--out", str(tmp_path / "z")]) == 2
    assert "Did you mean: softmax" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "xyz")  # bad input creates no run directory


def test_mismatched_and_corrupt_checkpoints_are_clear_errors(run, tmp_path):
    out, _ = run
    from vitmix.models import create_model
    from vitmix.train.checkpoint import load_into, load_weights

    state, _ = load_weights(out / "best.safetensors")
    wider = create_model("vit_nano_patch4_32", img_size=16, in_chans=1, depth=2, embed_dim=96, num_heads=2)
    with pytest.raises(ValueError, match="does not match the model"):
        load_into(wider, state)
    corrupt = tmp_path / "bad.safetensors"
    corrupt.write_bytes((out / "best.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        evaluate_checkpoint(corrupt)
    bad_state = tmp_path / "state.pt"
    torch.save({"evil": torch.nn.Linear(2, 2)}, bad_state)  # a pickled module: refused by weights_only
    with pytest.raises(ValueError, match="not a loadable training state"):
        load_state(bad_state)
    # metadata without the image size (e.g. written by hand): named, one line, not a KeyError
    from vitmix.train.checkpoint import save_weights

    _, meta = load_weights(out / "best.safetensors")
    no_size = tmp_path / "no_size.safetensors"
    save_weights(wider, no_size, {k: v for k, v in meta.items() if k != "img_size"})
    with pytest.raises(ValueError, match=r"img_size missing"):
        evaluate_checkpoint(no_size)


def test_a_nan_abort_can_be_resumed(tmp_path, monkeypatch):
    """A run that stops on a non-finite loss keeps its last complete checkpoint and resumes from it
    (here: the loss turns NaN in epoch 2 once, then the resumed run finishes)."""
    from vitmix.train import engine

    out = tmp_path / "nan"
    cfg = dict(TINY, epochs=3, train_subset=128)
    real = engine.Recipe.__init__
    state = {"armed": True, "calls": 0}

    def nan_loss_in_epoch_2(self, *a, **k):
        real(self, *a, **k)
        loss_fn = self.loss_fn

        def loss(logits, targets):
            state["calls"] += 1
            value = loss_fn(logits, targets)
            return value * float("nan") if state["armed"] and state["calls"] == 3 else value
        self.loss_fn = loss

    monkeypatch.setattr(engine.Recipe, "__init__", nan_loss_in_epoch_2)
    with pytest.raises(FloatingPointError, match="loss became nan"):
        train(TrainConfig(**cfg, out=str(out)), log=lambda *a: None)
    assert load_state(out / "state.pt")["epoch"] == 1
    state["armed"] = False
    summary = train(TrainConfig(**cfg, out=str(out), resume=True), log=lambda *a: None)
    assert summary["epochs_run"] == 3


def test_config_file_and_flags_combine(tmp_path):
    from vitmix.cli import build_parser
    from vitmix.train.cli import config_from_args

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("epochs: 7\nlr: 0.01\nmixer_options: {fused: false}\n")
    args = build_parser().parse_args(["train", "--config", str(cfg_file), "--lr", "0.5", "-M", "fused=true"])
    cfg = config_from_args(args)
    assert (cfg.epochs, cfg.lr, cfg.mixer_options) == (7, 0.5, {"fused": True})
    cfg_file.write_text("epohcs: 7\n")
    with pytest.raises(ValueError, match="Did you mean: epochs"):
        config_from_args(build_parser().parse_args(["train", "--config", str(cfg_file)]))


def test_torchrun_two_processes_equal_one_process_with_augmentation_drop_path_and_mixup(tmp_path):
    """Regression (ranks seeded with seed + rank drew other crops, drop-path masks and mixup λ than
    one process: losses differed by ~3e-3 with the default augmentation): 2 gloo processes × batch
    32 and 1 process × batch 64 with random crops, drop path, mixup and cutmix on give the same
    losses and weights (rel 1e-5): each image's draws are keyed to (seed, epoch, index), the ranks
    split each global batch so that mixup pairs the same images, and mixup's λ is drawn alike."""
    from safetensors.torch import load_file

    common = ["-m", "vitmix.cli", "train", "--model", "vit_nano_patch4_32", "--img-size", "16", "--data", "digits",
              "--epochs", "2", "--max-steps", "10", "--train-subset", "384", "--drop-path", "0.2", "--mixup", "0.8",
              "--cutmix", "1.0", "--model-option", "depth=1", "--model-option", "embed_dim=32",
              "--model-option", "num_heads=2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          *common, "--batch-size", "32", "--out", str(tmp_path / "ddp")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    one = subprocess.run([sys.executable, *common, "--batch-size", "64", "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    assert "world=2, lr 0.002 for a global batch of 64" in ddp.stdout
    assert "world=1, lr 0.002 for a global batch of 64" in one.stdout
    m_ddp = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    m_one = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert len(m_ddp) == len(m_one) == 2
    assert m_ddp[0]["val_images"] == 360  # both ranks' validation shards are summed
    for a, b in zip(m_ddp, m_one):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    wa, wb = (load_file(str(tmp_path / run / "last.safetensors")) for run in ("ddp", "one"))
    flat_a, flat_b = (torch.cat([w[k].flatten() for k in sorted(w)]) for w in (wa, wb))
    assert ((flat_a - flat_b).norm() / flat_b.norm()).item() <= 1e-5      # observed 1e-6
    # per tensor, fp32 rounding of the two-way gradient average: Adam divides by sqrt(v), so weights
    # whose gradients are ~0 (the key bias: softmax ignores it) take steps of rounding noise, up to a
    # few % of lr (observed 1.2e-5 on an Intel AVX-512 CPU); other images or draws would differ by ~lr (2e-3)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=5e-5)


def test_train_subset_is_a_fixed_seeded_subset(tmp_path):
    summary = train(TrainConfig(**dict(TINY, epochs=1, train_subset=128), out=str(tmp_path / "s")),
                    log=lambda *a: None)
    assert summary["steps"] == 2                       # 128 images / batch 64
    with pytest.raises(ValueError, match="--train-subset 5000 must be between 1 and the 1437"):
        train(TrainConfig(**dict(TINY, epochs=1, train_subset=5000), out=str(tmp_path / "t")))
    assert not (tmp_path / "t").exists()


def test_val_subset_validates_on_a_fixed_subset(tmp_path):
    """--val-subset N: quick runs validate on N images, the same ones whatever --seed (so runs stay
    comparable), nested in larger subsets; the default keeps the whole split."""
    from vitmix.train.runner import val_subset

    lines = []
    train(TrainConfig(**dict(TINY, epochs=1, max_steps=1, val_subset=100), out=str(tmp_path / "v")), log=lines.append)
    assert "/ 100 val" in lines[0], lines[0]
    whole = list(range(360))
    small, large = val_subset(whole, 50), val_subset(whole, 100)
    assert len(small) == 50 and list(small.indices) == list(large.indices)[:50]
    assert val_subset(whole, None) is whole
    with pytest.raises(ValueError, match="--val-subset 361 must be between 1 and the 360 validation images"):
        val_subset(whole, 361)
    with pytest.raises(ValueError, match="--val-subset 0 must be a positive integer"):
        TrainConfig.from_dict({"val_subset": 0})


def test_laplacian_training_survives_a_failing_compiler(tmp_path, monkeypatch):
    """Regression (the headline mixer's training crashed with a shape error when its compiled kernel
    failed): with a C compiler that fails and an empty kernel cache, training warns once and gives
    exactly the numbers of the PyTorch path."""
    from vitmix.ops._cbuild import CKernel
    from vitmix.ops.kernel import c as _l1
    from vitmix.ops.newton import c as _ns
    from vitmix.mixers.fused import library as _layers
    from vitmix.ops.nystrom import c as _nystrom

    cfg = dict(TINY, mixer="laplacian", epochs=1, max_steps=3)
    monkeypatch.setattr(_l1, "_C_MIN_ELEMENTS", 0)
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    ref = train(TrainConfig(**cfg, out=str(tmp_path / "ref")), log=lambda *a: None)
    monkeypatch.delenv("VITMIX_DISABLE_C_KERNEL")
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path / "cache"))
    assert {_l1.L1_KERNEL, _ns.NS_KERNEL, _nystrom.NYSTROM_KERNEL, _layers.LAYERS_KERNEL} <= set(CKernel.instances)
    for kernel in CKernel.instances:      # a failing compiler fails every C kernel (training and evaluation)
        monkeypatch.setattr(kernel, "_lib", None)
        monkeypatch.setattr(kernel, "_tried", False)
    with pytest.warns(RuntimeWarning, match="could not compile the l1_kernel"):
        out = train(TrainConfig(**cfg, out=str(tmp_path / "faulty")), log=lambda *a: None)
    assert out["final_val_acc"] == ref["final_val_acc"]
    a = json.loads((tmp_path / "ref" / "metrics.jsonl").read_text())
    b = json.loads((tmp_path / "faulty" / "metrics.jsonl").read_text())
    assert a["train_loss"] == b["train_loss"]


def test_gradient_accumulation_equals_the_larger_batch(tmp_path):
    """2 micro-batches of 32 per step = 1 batch of 64: same images per step, same LR, same weights
    to fp32 rounding (the loss of each half is averaged, as the big batch's mean)."""
    from safetensors.torch import load_file

    base = dict(TINY, epochs=1, max_steps=6, train_subset=384, augment=False, mixer="softmax")
    train(TrainConfig(**dict(base, batch_size=64), out=str(tmp_path / "big")), log=lambda *a: None)
    train(TrainConfig(**dict(base, batch_size=32, accum_steps=2), out=str(tmp_path / "acc")), log=lambda *a: None)
    a, b = load_file(str(tmp_path / "big" / "last.safetensors")), load_file(str(tmp_path / "acc" / "last.safetensors"))
    for k in a:  # Adam divides by √v: rounding-level gradient differences on near-zero components move
        # those weights by a few 1e-5 (lr 3e-3, 6 steps); any real difference (other images, other
        # scaling) moves weights by ~lr per step
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4)
    ma = json.loads((tmp_path / "big" / "metrics.jsonl").read_text())
    mb = json.loads((tmp_path / "acc" / "metrics.jsonl").read_text())
    assert ma["train_loss"] == pytest.approx(mb["train_loss"], rel=1e-5)


def test_ema_fp16_channels_last_and_load_model(tmp_path):
    import vitmix

    out = tmp_path / "ema"
    train(TrainConfig(**dict(TINY, epochs=2, max_steps=6, train_subset=256), ema_decay=0.5, amp=True,
                      amp_dtype="float16", channels_last=True, out=str(out)), log=lambda *a: None)
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= h["val_acc_ema"] <= 100 for h in history)
    assert (out / "ema.safetensors").is_file()
    assert (out / "metrics.csv").read_text().splitlines()[0].startswith("train_loss,")
    assert len((out / "metrics.csv").read_text().splitlines()) == 3
    # the EMA differs from the raw weights, and load_model rebuilds either from metadata alone
    model, ema = vitmix.load_model(out / "last.safetensors"), vitmix.load_model(out / "ema.safetensors")
    assert not model.training and type(model).__name__ == "VisionTransformer"
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), ema.parameters()))
    r = evaluate_checkpoint(out / "ema.safetensors")
    assert r["val_acc"] == pytest.approx(history[-1]["val_acc_ema"])


def test_compile_failure_falls_back_to_eager_with_the_same_results(tmp_path, monkeypatch):
    """--compile: a compiler that raises at the first forward (no C++ compiler, unsupported op)
    warns once and training continues eagerly, ending exactly where an eager run ends."""
    from safetensors.torch import load_file

    calls = []

    def broken_compile(module, **options):
        def run(*args, **kwargs):
            calls.append(1)
            raise RuntimeError("InductorError: no working C++ compiler found\nsecond line")
        return run

    base = dict(TINY, epochs=1, max_steps=3)
    train(TrainConfig(**base, out=str(tmp_path / "eager")), log=lambda *a: None)
    monkeypatch.setattr(torch, "compile", broken_compile)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*InductorError: no working C"):
        train(TrainConfig(**base, compile=True, out=str(tmp_path / "compiled")), log=lambda *a: None)
    assert len(calls) == 1                      # tried once, then eager for good
    a, b = (load_file(str(tmp_path / run / "last.safetensors")) for run in ("eager", "compiled"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_compile_runs_through_dynamo(tmp_path, monkeypatch):
    """The working path: the model really runs through torch.compile (the 'eager' backend keeps the
    test fast; inductor is what users get) and checkpoints carry the plain model's keys."""
    from vitmix.train.compiled import CompiledWithFallback

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **o: compile_(module, backend="eager"))
    out = tmp_path / "c"
    train(TrainConfig(**dict(TINY, epochs=1, max_steps=2), compile=True, out=str(out)), log=lambda *a: None)
    model = CompiledWithFallback(torch.nn.Linear(2, 2))
    assert not model.eager and set(model.state_dict()) == {"module.weight", "module.bias"}
    assert "blocks.0.attn.qkv.weight" in load_state(out / "state.pt")["model"]


def test_keep_top_k_keeps_the_best_epochs(tmp_path):
    out = tmp_path / "topk"
    summary = train(TrainConfig(**dict(TINY, epochs=4, train_subset=128, lr=1e-2), keep_top_k=2, out=str(out)),
                    log=lambda *a: None)
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    best = sorted(history, key=lambda h: (-h["val_acc"], h["epoch"]))[:2]
    expected = sorted(f"epoch-{h['epoch']:03d}.safetensors" for h in best)
    assert sorted(p.name for p in (out / "top").iterdir()) == expected
    assert summary["epochs_run"] == 4
    assert set(load_state(out / "state.pt")["files"]) >= {f"top/epoch-{h['epoch']:03d}.safetensors" for h in best}


def test_tensorboard_logs_every_epoch_metric_or_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util
    import types

    from vitmix.train import runner

    logged = []

    class Writer:  # stands in for torch.utils.tensorboard.SummaryWriter (the package is optional)
        def __init__(self, logdir):
            logged.append(("dir", logdir))

        def add_scalar(self, key, value, step):
            logged.append((key, step))

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "tensorboard" else find_spec(name, *a))
    out = tmp_path / "tb"
    train(TrainConfig(**dict(TINY, epochs=2, max_steps=4, train_subset=128), tensorboard=True, out=str(out)),
          log=lambda *a: None)
    assert logged[0] == ("dir", str(out / "tensorboard"))
    assert {("val_acc", 1), ("val_acc", 2), ("train_loss", 2), ("lr", 1)} <= set(logged)

    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else find_spec(name, *a))
    with pytest.raises(ValueError, match="pip install tensorboard"):
        runner.check_numbers(TrainConfig(tensorboard=True))


def test_atomic_writes_get_a_normal_file_mode(tmp_path):
    """Checkpoints and reports are renamed from a mkstemp file (mode 0600): they must end up readable
    like any file the user creates (0666 minus the umask), e.g. for a shared results folder."""
    from vitmix.train.checkpoint import save_text

    old = os.umask(0o022)
    try:
        save_text(tmp_path / "a.txt", "x")
        assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_a_generation_model_is_refused_before_the_run_directory_exists(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "dit_nano_patch2", "--data", "digits", "--img-size", "16",
                 "--out", str(out)]) == 2
    assert "vitmix generate train --model dit_nano_patch2" in capsys.readouterr().err
    assert not out.exists()
