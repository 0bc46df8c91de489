"""timm ``train.py``'s recipe flags on ``vitmix train`` (issue 49): each reaches timm's own factory with
timm's meaning, is saved in ``config.yaml`` and rebuilt alike on ``--resume``; bad values are one line."""
import json
import sys
import types

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file, save_file
from timm.data.auto_augment import RandAugment
from timm.data.random_erasing import RandomErasing
from timm.scheduler import CosineLRScheduler, PlateauLRScheduler, StepLRScheduler
from torch import nn
from torchvision.transforms import ColorJitter

import vitmix
from vitmix.cli import main
from vitmix.data import Augment, build_datasets
from vitmix.data.datasets import DatasetInfo, _transforms
from vitmix.runs import build_classifier
from vitmix.runs.distributed import key_drop_path
from vitmix.train import TrainConfig, train
from vitmix.train.runner import evaluate_checkpoint
from vitmix.train.timm_recipe import (
    check_wandb, create_optimizer, create_scheduler, resume_schedule, set_grad_checkpointing, step_epoch,
    train_augment,
)

TINY = dict(img_size=16, model_options={"depth": 2, "embed_dim": 32, "num_heads": 2}, batch_size=32,
            train_subset=128, val_subset=64, lr=3e-3)
TINY_ARGS = ["--img-size", "16", "--model-option", "depth=1", "--model-option", "embed_dim=32",
             "--model-option", "num_heads=2", "--epochs", "1", "--max-steps", "1", "--batch-size", "16"]


def _optimizer(lr=1.0, groups=1):
    return torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(1))]} for _ in range(groups)], lr=lr)


def _lrs(scheduler, optimizer, steps):
    out = []
    for step in range(1, steps + 1):
        scheduler.step_update(num_updates=step)
        out.append(optimizer.param_groups[0]["lr"])
    return out


# --- the schedule -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_steps", [None, 7])
def test_the_default_schedule_is_the_one_before_sched_existed(max_steps):
    """--sched cosine (the default) through timm's factory gives vitmix's earlier lr sequence exactly:
    a linear warm-up from lr/100 over --warmup-epochs, then cosine to --min-lr over the run's steps."""
    cfg = TrainConfig(epochs=4, warmup_epochs=1.5, min_lr=1e-3, max_steps=max_steps)
    lr, per_epoch = 0.5, 5
    total = min(per_epoch * cfg.epochs, max_steps or 10 ** 9)
    before_opt = _optimizer(lr)
    before = CosineLRScheduler(before_opt, t_initial=total, lr_min=cfg.min_lr, warmup_t=int(1.5 * per_epoch),
                               warmup_lr_init=lr * 0.01, warmup_prefix=True, t_in_epochs=False)
    now_opt = _optimizer(lr)
    now = create_scheduler(cfg, now_opt, lr, per_epoch)
    assert isinstance(now, CosineLRScheduler)
    assert _lrs(now, now_opt, 30) == _lrs(before, before_opt, 30)


def test_sched_step_decays_by_decay_rate_every_decay_epochs():
    cfg = TrainConfig(sched="step", decay_epochs=2, decay_rate=0.5, warmup_epochs=0)
    optimizer = _optimizer(0.8)
    scheduler = create_scheduler(cfg, optimizer, 0.8, steps_per_epoch=3)
    assert isinstance(scheduler, StepLRScheduler)
    lrs = _lrs(scheduler, optimizer, 12)
    assert lrs[:5] == [0.8] * 5 and lrs[5:11] == [0.4] * 6 and lrs[11] == 0.2    # steps 6 and 12 decay


def _plateau(cfg, lr=1.0):
    optimizer = _optimizer(lr, groups=2)
    return optimizer, create_scheduler(cfg, optimizer, lr, steps_per_epoch=4)


@pytest.mark.parametrize("warmup", [0.0, 1.0])
def test_sched_plateau_decays_on_its_metric_and_a_resume_replays_its_state(warmup):
    """timm does not checkpoint a plateau schedule's state (best metric, bad epochs): a resumed run's
    new scheduler, given the recorded epochs again, is where the uninterrupted one is, lr included."""
    cfg = TrainConfig(sched="plateau", patience_epochs=1, decay_rate=0.5, warmup_epochs=warmup,
                      plateau_metric="val_loss", min_lr=0.0)
    history = [{"epoch": e + 1, "val_loss": loss, "val_acc": 0.0} for e, loss in enumerate([3.0, 2.0, 2.5, 2.6, 2.7])]
    optimizer, scheduler = _plateau(cfg)
    assert isinstance(scheduler, PlateauLRScheduler) and scheduler.lr_scheduler.mode == "min"
    lrs = []
    for metrics in history:
        step_epoch(scheduler, metrics["epoch"], metrics, cfg)
        lrs.append(optimizer.param_groups[1]["lr"])
    assert lrs[-1] < lrs[1]                                     # two bad epochs after the best: decayed
    for cut in (2, 3, 4):
        resumed_opt, resumed = _plateau(cfg)
        for group in resumed_opt.param_groups:                  # what state.pt restores: the end lr
            group["lr"] = 123.0
        resume_schedule(resumed, history[:cut], step=cut * 4, cfg=cfg)
        assert resumed_opt.param_groups[1]["lr"] == lrs[cut - 1]
        for metrics in history[cut:]:
            step_epoch(resumed, metrics["epoch"], metrics, cfg)
        assert resumed_opt.param_groups[1]["lr"] == lrs[-1]
        assert resumed.lr_scheduler.state_dict() == scheduler.lr_scheduler.state_dict()


def test_a_resume_replays_the_plateau_schedule_where_it_must(monkeypatch):
    """Without the replay the resumed lr would be the starting one (and its best metric lost)."""
    cfg = TrainConfig(sched="plateau", patience_epochs=0, decay_rate=0.5, warmup_epochs=0, plateau_metric="val_loss")
    history = [{"epoch": 1, "val_loss": 1.0}, {"epoch": 2, "val_loss": 2.0}]
    optimizer, scheduler = _plateau(cfg)
    resume_schedule(scheduler, history, step=8, cfg=cfg)
    assert optimizer.param_groups[0]["lr"] == 0.5 and scheduler.lr_scheduler.best == 1.0


# --- the optimizer ----------------------------------------------------------------------------------------

def test_layer_decay_gives_timms_layer_groups_and_the_scheduler_scales_them():
    model = vitmix.create_model("vit_nano_patch4_32", num_classes=10, in_chans=1, img_size=16, depth=3)
    cfg = TrainConfig(layer_decay=0.5, warmup_epochs=0)
    optimizer = create_optimizer(cfg, model, lr=0.1)
    scales = sorted({g["lr_scale"] for g in optimizer.param_groups})
    assert scales == [0.5 ** k for k in range(4, -1, -1)]      # embeddings, 3 blocks, head
    head = next(g for g in optimizer.param_groups if any(p is model.head.weight for p in g["params"]))
    embed = next(g for g in optimizer.param_groups if any(p is model.patch_embed.proj.weight for p in g["params"]))
    assert head["lr_scale"] == 1.0 and embed["lr_scale"] == 0.5 ** 4
    create_scheduler(cfg, optimizer, 0.1, steps_per_epoch=2).step_update(num_updates=0)
    assert embed["lr"] == pytest.approx(0.1 * 0.5 ** 4) and head["lr"] == pytest.approx(0.1)
    assert {g.get("lr_scale") for g in create_optimizer(TrainConfig(), model, 0.1).param_groups} == {None}


def test_layer_decay_on_a_model_without_layer_groups_is_one_line():
    with pytest.raises(ValueError, match="--layer-decay: .* has no layer groups .*drop --layer-decay"):
        create_optimizer(TrainConfig(layer_decay=0.75), nn.Sequential(nn.Linear(2, 2)), lr=0.1)


# --- the training transforms ------------------------------------------------------------------------------

def _steps(transform):
    return list(transform.transforms)


def test_aa_reprob_remode_reach_timms_transform_and_run_on_grey_images():
    cfg = TrainConfig(aa="rand-m9-mstd0.5-inc1", reprob=0.25, remode="rand")
    train_set, val_set, _ = build_datasets("digits", 16, augment=train_augment(cfg))
    steps = _steps(train_set.transform)
    randaug = next(s for s in steps if isinstance(s, RandAugment))
    erase = next(s for s in steps if isinstance(s, RandomErasing))
    assert randaug.num_layers == 2 and {op.magnitude for op in randaug.ops} == {9}
    assert {op.magnitude_std for op in randaug.ops} == {0.5}
    assert (erase.probability, erase.mode) == (0.25, "rand")
    assert not any(isinstance(s, (RandAugment, RandomErasing)) for s in _steps(val_set.transform))
    torch.manual_seed(0)
    for i in range(40):                                        # one channel throughout
        assert train_set[i][0].shape == (1, 16, 16)


def test_color_jitter_overrides_the_datasets_default():
    info = DatasetInfo("rgb", 2, 3, 64, (0.5,) * 3, (0.5,) * 3)
    jitters = {}
    for given in (None, 0.2, 0.0):
        train_tf, _ = _transforms(info, 32, Augment(color_jitter=given))
        jitters[given] = next((s for s in _steps(train_tf) if isinstance(s, ColorJitter)), None)
    assert jitters[None].brightness == (0.6, 1.4)               # the dataset's default (colour, above 32 px)
    assert jitters[0.2].brightness == (0.8, 1.2)
    assert jitters[0.0] is None
    small, _ = _transforms(DatasetInfo("grey", 2, 1, 8, (0.5,), (0.5,)), 16, Augment(color_jitter=0.3))
    assert next(s for s in _steps(small) if isinstance(s, ColorJitter)).contrast == (0.7, 1.3)


def test_randaugment_posterize_to_zero_bits_gives_black_not_a_crash():
    """Pillow 13 refuses posterize(0 bits), which timm's rand-m9-mstd0.5-inc1 asks for now and then:
    a DeiT-recipe run stopped at a random step."""
    train_tf, _ = _transforms(DatasetInfo("rgb", 2, 3, 64, (0.5,) * 3, (0.5,) * 3), 32,
                              Augment(auto_augment="rand-m9-mstd0.5-inc1"))
    randaug = next(s for s in _steps(train_tf) if isinstance(s, RandAugment))
    posterize = next(op for op in randaug.ops if op.name == "PosterizeIncreasing")
    img = Image.fromarray(np.full((8, 8, 3), 200, np.uint8))
    assert np.asarray(posterize.aug_fn(img, 0)).max() == 0
    assert np.asarray(posterize.aug_fn(img, 1)).max() == 128


@pytest.mark.parametrize("policy", ["rand-m9x", "foo", "randm9"])
def test_a_malformed_aa_policy_is_one_line_before_any_work(policy):
    with pytest.raises(ValueError, match=r"--aa .* is not a timm auto-augment policy .* rand-m9-mstd0.5-inc1"):
        TrainConfig.from_dict({"aa": policy})


# --- the model: grad checkpointing, weights, classes, input size ------------------------------------------

def test_grad_checkpointing_is_timms_and_keeps_keyed_drop_path_exact():
    """Checkpointing runs each block's forward again in the backward pass: drop path keyed by its
    module (not by a call counter) draws the same masks, so the gradients are those without it."""
    def grads(checkpointing):
        torch.manual_seed(0)
        model = vitmix.create_model("vit_nano_patch4_32", num_classes=10, in_chans=1, img_size=16, depth=3,
                                    drop_path_rate=0.5)
        keys = key_drop_path(model, seed=0, by_module=checkpointing)
        if checkpointing:
            set_grad_checkpointing(model, "vit_nano_patch4_32")
            assert model.grad_checkpointing
        keys.start(0, np.arange(8))
        model.train()(torch.randn(8, 1, 16, 16, generator=torch.Generator().manual_seed(1))).square().sum().backward()
        return [p.grad for p in model.parameters()]

    for plain, checkpointed in zip(grads(False), grads(True)):
        torch.testing.assert_close(plain, checkpointed)


def test_grad_checkpointing_on_a_model_without_it_is_one_line():
    with pytest.raises(ValueError, match="--grad-checkpointing: seq .* has no set_grad_checkpointing"):
        set_grad_checkpointing(nn.Sequential(nn.Linear(2, 2)), "seq")


def _timm_file(tmp_path, name="deit_tiny_patch16_224", **kwargs):
    model = vitmix.create_model(name, **kwargs)
    path = tmp_path / f"{name}.safetensors"
    save_file(model.state_dict(), str(path))
    return model, path


def test_pretrained_loads_timms_weights_from_a_local_file_fitted_to_the_data(tmp_path):
    teacher, path = _timm_file(tmp_path, depth=1)              # DeiT layout: 1000 classes, 3 channels, 224 px
    model = build_classifier("deit_tiny_patch16_224", 10, 1, 32, model_options={"depth": 1}, pretrained=True,
                             pretrained_file=str(path), mixer="laplacian")
    assert torch.equal(model.blocks[0].mlp.fc1.weight, teacher.blocks[0].mlp.fc1.weight)
    torch.testing.assert_close(model.patch_embed.proj.weight[:, 0], teacher.patch_embed.proj.weight.sum(1))
    assert model.head.out_features == 10 and type(model.blocks[0].attn).__name__ == "LaplacianAttention"


def test_pretrained_without_weights_is_one_line_naming_pretrained_path():
    with pytest.raises(ValueError, match="--pretrained: no pretrained weights of vit_nano_patch4_32 .*-path FILE"):
        build_classifier("vit_nano_patch4_32", 10, 1, 16, pretrained=True)


def test_pretrained_and_initial_checkpoint_runs_start_from_their_weights_and_resume_from_their_own(tmp_path):
    _, path = _timm_file(tmp_path, name="vit_nano_patch4_32", num_classes=10, in_chans=1, img_size=16, depth=2,
                         embed_dim=32, num_heads=2)
    common = dict(TINY, epochs=1, max_steps=1, lr=1e-9, warmup_epochs=0, min_lr=0.0)
    for name, extra in (("pre", dict(pretrained=True, pretrained_path=str(path))),
                        ("init", dict(initial_checkpoint=str(path)))):
        train(TrainConfig(out=str(tmp_path / name), **common, **extra), log=lambda *a: None)
        trained = load_file(str(tmp_path / name / "last.safetensors"))
        torch.testing.assert_close(trained["blocks.1.mlp.fc2.weight"], load_file(str(path))["blocks.1.mlp.fc2.weight"],
                                   atol=1e-6, rtol=0)          # lr 1e-9: one step moves nothing visible
    path.unlink()              # a resume reads the run's own weights, not the start file
    train(TrainConfig.from_dict(dict(yaml.safe_load((tmp_path / "init" / "config.yaml").read_text()),
                                     resume=True, epochs=2, max_steps=2)), log=lambda *a: None)


def test_initial_checkpoint_of_another_architecture_is_one_line(tmp_path):
    _, path = _timm_file(tmp_path, name="vit_nano_patch4_32", num_classes=3, in_chans=1, img_size=16)
    with pytest.raises(ValueError, match="--initial-checkpoint .* does not match the model: .*Build the model"):
        train(TrainConfig(out=str(tmp_path / "r"), initial_checkpoint=str(path), **TINY, epochs=1, max_steps=1),
              log=lambda *a: None)
    assert not (tmp_path / "r").exists()


def test_num_classes_and_input_size_set_the_model(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "r"), **dict(TINY, img_size=None), input_size=(1, 16, 16),  # as Python has it
                      num_classes=12, epochs=1, max_steps=1, mixup=0.5)
    train(cfg, log=lambda *a: None)
    weights = load_file(str(tmp_path / "r" / "last.safetensors"))
    assert weights["head.weight"].shape[0] == 12 and weights["patch_embed.proj.weight"].shape[1] == 1
    assert weights["pos_embed"].shape[1] == 1 + (16 // 4) ** 2
    saved = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert saved["input_size"] == [1, 16, 16] and saved["num_classes"] == 12
    assert vitmix.load_model(str(tmp_path / "r")).num_classes == 12
    assert evaluate_checkpoint(str(tmp_path / "r"))["val_images"] == 360    # 12 outputs for 10 classes


@pytest.mark.parametrize("values, message", [
    ({"num_classes": 5}, "--num-classes 5 is below the 10 classes of --data digits"),
    ({"input_size": [3, 16, 16]}, "--input-size 3 16 16: --data digits has 1 channel; use --input-size 1 16 16"),
])
def test_num_classes_and_input_size_that_do_not_fit_the_data_are_one_line(tmp_path, values, message):
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(out=str(tmp_path / "r"), **dict(TINY, img_size=None), **values, epochs=1, max_steps=1),
              log=lambda *a: None)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("values, message", [
    ({"input_size": [1, 16, 32]}, "vitmix trains on square images; use --input-size 1 16 16"),
    ({"input_size": [1, 16]}, "three positive integers C H W"),
    ({"input_size": [1, 16, 16], "img_size": 32}, "--img-size 32 differs from --input-size 1 16 16"),
    ({"sched": "cosin"}, "--sched 'cosin' is not one of cosine, step, plateau. Did you mean: cosine?"),
    ({"remode": "zeros"}, "--remode 'zeros' is not one of pixel, const, rand"),
    ({"reprob": 1.5}, r"--reprob 1.5 must be in \[0, 1\]"),
    ({"layer_decay": 0}, r"--layer-decay 0 must be in \(0, 1\]"),
    ({"pretrained_path": "w.safetensors"}, "--pretrained-path FILE gives the weights of --pretrained"),
    ({"aa": "rand-m9", "augment": False}, "--aa is training augmentation, which --no-augment turns off"),
    ({"pretrained": True, "init_from": "run"}, "--pretrained and --init-from both give the starting weights"),
])
def test_recipe_values_that_cannot_work_are_one_line(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(values)


# --- wandb ------------------------------------------------------------------------------------------------

def test_log_wandb_without_wandb_says_pip_install_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)           # import wandb -> ImportError
    with pytest.raises(ValueError, match="--log-wandb needs the wandb package: pip install wandb"):
        train(TrainConfig(out=str(tmp_path / "r"), log_wandb=True, **TINY, epochs=1, max_steps=1),
              log=lambda *a: None)
    assert not (tmp_path / "r").exists()
    check_wandb(TrainConfig())                                 # off: nothing is imported


def test_log_wandb_logs_each_epochs_metrics(tmp_path, monkeypatch):
    calls = {"log": [], "finished": False}

    class Run:
        def log(self, values, step):
            calls["log"].append((step, values))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    train(TrainConfig(out=str(tmp_path / "r"), log_wandb=True, wandb_project="p", **TINY, epochs=2),
          log=lambda *a: None)
    assert calls["init"]["project"] == "p" and calls["init"]["name"] == "r"
    assert calls["init"]["config"]["log_wandb"] is True and calls["finished"]
    history = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [step for step, _ in calls["log"]] == [1, 2]
    assert [values["val_acc"] for _, values in calls["log"]] == [h["val_acc"] for h in history]


# --- resume -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sched", ["step", "plateau"])
def test_a_resumed_run_rebuilds_every_recipe_flag_and_ends_identical(tmp_path, sched):
    """Two epochs, then --resume to three, end with the weights and lrs of three uninterrupted epochs:
    the transforms, layer groups, schedule (a plateau one replayed), classes and checkpointing are rebuilt
    from config.yaml."""
    recipe = dict(TINY, img_size=None, input_size=[1, 16, 16], aa="rand-m7-mstd0.5-inc1", reprob=0.25,
                  remode="pixel", sched=sched, decay_epochs=1, decay_rate=0.5, patience_epochs=0,
                  plateau_metric="val_loss", layer_decay=0.75, grad_checkpointing=True, drop_path=0.2,
                  num_classes=11, warmup_epochs=0.5)
    train(TrainConfig(out=str(tmp_path / "whole"), epochs=3, **recipe), log=lambda *a: None)
    train(TrainConfig(out=str(tmp_path / "cut"), epochs=2, **recipe), log=lambda *a: None)
    assert main(["train", "--out", str(tmp_path / "cut"), "--resume", "--epochs", "3"]) == 0
    whole, cut = (load_file(str(tmp_path / run / "last.safetensors")) for run in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
    lrs = [[json.loads(line)["lr"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
           for run in ("whole", "cut")]
    assert lrs[0] == lrs[1] and len(set(lrs[0])) == (3 if sched == "step" else 2)   # plateau: warm-up, peak
    if sched == "step":        # metrics' lr is the peak (the head's), not the embeddings' 0.75^3 of it
        assert lrs[0][-1] == pytest.approx(3e-3 * 0.5 ** 2)     # 2 warm-up steps, then a decay every 4


# --- the CLI ----------------------------------------------------------------------------------------------

def test_the_flags_map_onto_the_config_and_the_help_names_init_from_ids(capsys):
    from vitmix.train.cli import add_parser, config_from_args
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    args = sub.choices["train"].parse_args(
        ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--remode", "const", "--color-jitter", "0.3",
         "--sched", "step", "--decay-epochs", "30", "--decay-rate", "0.2", "--layer-decay", "0.65",
         "--grad-checkpointing", "--pretrained", "--initial-checkpoint", __file__, "--num-classes", "12",
         "--input-size", "3", "32", "32", "--log-wandb"])
    cfg = config_from_args(args)
    assert (cfg.aa, cfg.reprob, cfg.remode, cfg.color_jitter) == ("rand-m9-mstd0.5-inc1", 0.25, "const", 0.3)
    assert (cfg.sched, cfg.decay_epochs, cfg.decay_rate, cfg.layer_decay) == ("step", 30.0, 0.2, 0.65)
    assert cfg.grad_checkpointing and cfg.pretrained and cfg.log_wandb and cfg.initial_checkpoint == __file__
    assert (cfg.num_classes, cfg.input_size) == (12, [3, 32, 32])
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("timm model's weights file", "hf-hub:ORG/NAME", "local-dir:DIR"):
        assert words in text


@pytest.mark.parametrize("flags", [["--aa", "rand-m9x"], ["--layer-decay", "0.7", "--model", "timesformer_tiny"],
                                   ["--sched", "linear"], ["--input-size", "1", "16", "24"],
                                   ["--initial-checkpoint", "missing.safetensors"]])
def test_cli_recipe_errors_are_one_line_exit_2(tmp_path, capsys, flags, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY_ARGS, *flags, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "r").exists()


# --- the shipped DeiT recipe ------------------------------------------------------------------------------

def test_the_deit_imagenet_recipe_runs_on_a_tiny_imagefolder(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 2)):
        for label in ("cat", "dog"):
            folder = tmp_path / "data" / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    out = tmp_path / "run"
    assert main(["train", "--config", "deit-imagenet", "--data-dir", str(tmp_path / "data"), "--img-size", "32",
                 "--epochs", "1", "--max-steps", "2", "--batch-size", "4", "--model-option", "depth=1",
                 "--out", str(out)]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["model"], saved["data"], saved["aa"], saved["reprob"]) == (
        "deit_tiny_patch16_224", "imagefolder", "rand-m9-mstd0.5-inc1", 0.25)
    assert (saved["mixup"], saved["cutmix"], saved["smoothing"], saved["drop_path"]) == (0.8, 1.0, 0.1, 0.1)
    assert (saved["lr"], saved["lr_base_batch"], saved["weight_decay"], saved["warmup_epochs"], saved["sched"]) == (
        5e-4, 512, 0.05, 5, "cosine")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["model"] == "deit_tiny_patch16_224"
