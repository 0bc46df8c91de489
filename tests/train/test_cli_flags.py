"""The CLI's flags: no prefix matching, timm ``train.py`` names, and config values checked before any work
(issue 21 items 4 and 7)."""
import argparse
from pathlib import Path

import pytest

from vitmix.cli import build_parser, main
from vitmix.mixers import timm_attn
from vitmix.train.cli import TIMM_DIFFERENT, config_from_args

DIGITS_YAML = str(Path(__file__).parents[2] / "configs" / "digits.yaml")


def _parsers(parser, prog="vitmix"):
    """Every parser of the `vitmix` command tree, with its prog."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def test_no_parser_matches_a_flag_by_its_prefix():
    found = dict(_parsers(build_parser()))
    assert {"vitmix train", "vitmix generate train", "vitmix analyze maps", "vitmix bench"} <= set(found)
    assert [prog for prog, p in found.items() if p.allow_abbrev] == []


def _one_error_line(capsys, prog="vitmix train") -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: "), err
    return err[0]


def test_a_prefix_of_a_flag_is_refused_with_the_subcommand_s_error(capsys):
    """Regression: `--lr-base 1` was taken as `--lr-base-batch 1` (a 32× LR at batch 32), and an
    unknown flag printed the top-level `usage: vitmix ...`."""
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--lr-base-b", "1"])
    assert exit_info.value.code == 2
    assert "Did you mean: --lr-base-batch" in _one_error_line(capsys)
    with pytest.raises(SystemExit):
        main(["train", "--warmup", "5"])
    assert "--warmup-epochs" in _one_error_line(capsys)
    with pytest.raises(SystemExit):
        main(["generate", "train", "--bach-size", "5"])
    assert "--batch-size" in _one_error_line(capsys, "vitmix generate train")


def _config(argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


@pytest.mark.parametrize("timm_argv, vitmix_argv", [
    (["-b", "16"], ["--batch-size", "16"]),
    (["-j", "2"], ["--workers", "2"]),
    (["--grad-accum-steps", "4"], ["--accum-steps", "4"]),
    (["--model-ema"], ["--ema-decay", "0.9998"]),
    (["--model-ema", "--model-ema-decay", "0.99"], ["--ema-decay", "0.99"]),
    (["--torchcompile"], ["--compile"]),
    (["--torchcompile", "inductor"], ["--compile"]),
    (["--checkpoint-hist", "3"], ["--keep-top-k", "3"]),
    (["--dataset", "torch/cifar10", "--dataset-download"], ["--data", "cifar10", "--download"]),
    (["-d", "torch/fashion_mnist"], ["--data", "fashion-mnist"]),
    (["--dataset", "folder"], ["--data", "imagefolder"]),
    (["--no-aug"], ["--no-augment"]),
    (["--model-kwargs", "depth=2", "embed_dim=32"], ["--model-option", "depth=2", "--model-option", "embed_dim=32"]),
    (["-c", DIGITS_YAML], ["--config", DIGITS_YAML]),
])
def test_timm_flag_names_mean_what_vitmix_s_flags_mean(timm_argv, vitmix_argv):
    assert _config(timm_argv) == _config(vitmix_argv) != _config([])


@pytest.mark.parametrize("argv, names", [
    (["--drop", "0.1"], "--model-option drop_rate="),
    (["--output", "out"], "--out "),
    (["--experiment", "e"], "--out "),
    (["--lr-base", "1"], "--lr-base-batch"),
    (["--lr-base-size", "256"], "--lr-base-batch"),
    (["--warmup-lr", "1e-5"], "--warmup-epochs"),
    (["--torchcompile", "eager"], "--compile"),
])
def test_timm_flags_that_differ_are_refused_with_vitmix_s_flag(argv, names, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *argv, "--out", "never-created"])
    assert exit_info.value.code == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"vitmix train: error: {argv[0]}") and names in line
    assert argv[0] in TIMM_DIFFERENT or argv[0] == "--torchcompile"


@pytest.mark.parametrize("yaml_text, expected", [
    ('epochs: "one"\n', "config key epochs: 'one' is a string, expected an integer"),
    ('lr: "fast"\n', "config key lr: 'fast' is a string, expected a number"),
    ("img_size: big\n", "config key img_size: 'big' is a string, expected an integer"),
    ("amp: maybe\n", "config key amp: 'maybe' is a string, expected true or false"),
    ("mixer_options: fused=false\n", "mixer_options: 'fused=false' is not a mapping; write it as "
                                     "mixer_options: {fused: false}"),
    ("batch_size: 0\n", "--batch-size 0 must be a positive integer"),
    ("lr: -0.01\n", "--lr -0.01 must be > 0"),
    ("grad_accum_steps: 2\n", "unknown config key 'grad_accum_steps'. That is timm's name; vitmix's key is "
                              "accum_steps"),
    ("warmup: 2\n", "unknown config key 'warmup'. Did you mean: "),
    ("nesterov: true\n", "unknown config key 'nesterov'. The keys are the flags' names with _ for -"),
])
def test_bad_config_values_are_one_line_naming_the_key(yaml_text, expected, tmp_path, capsys):
    """Regression: a value of the wrong type was an 18-30 line TypeError traceback (or, for
    img_size, passed on to the model), and a string for mixer_options said `argument after ** must
    be a mapping`."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys)
    assert expected in line, line
    assert not (tmp_path / "run").exists()


def test_a_float_yaml_reads_as_a_string_is_taken_as_the_number(tmp_path):
    """YAML 1.1 reads `1e-3` (no dot) as a string; it means the number."""
    config = tmp_path / "c.yaml"
    config.write_text("lr: 1e-3\nwarmup_epochs: 2\n")
    cfg = _config(["--config", str(config)])
    assert cfg.lr == 0.001 and isinstance(cfg.lr, float) and cfg.warmup_epochs == 2


def test_numbers_out_of_range_name_the_flag_before_any_work(tmp_path, capsys):
    """Regression: `--lr -0.01` reached torch's `Invalid learning rate` without the flag, and
    `vitmix compare --batch-size 0` trained (and failed) entry by entry."""
    assert main(["train", "--lr", "-0.01", "--out", str(tmp_path / "r")]) == 2
    assert "--lr -0.01 must be > 0" in _one_error_line(capsys)
    assert main(["compare", "--mixers", "softmax,soft", "--batch-size", "0", "--out", str(tmp_path / "c")]) == 2
    assert "--batch-size 0 must be a positive integer" in _one_error_line(capsys, "vitmix compare")
    assert not any(tmp_path.iterdir())


def test_a_bad_bound_mixer_option_names_the_mixer_not_an_internal_class():
    """Regression: `-M newton_iters=0` said `LaplacianAttention_newton_iters0: ...`."""
    attn = timm_attn("laplacian", newton_iters=0)
    with pytest.raises(ValueError) as err:
        attn(64, 2)
    assert str(err.value).startswith("LaplacianAttention: newton_iters=0"), err.value
    assert attn.__name__ == "LaplacianAttention" and attn.bound_options == {"newton_iters": 0}
