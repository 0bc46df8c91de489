"""Every subcommand has working --help; listings show what is registered."""
import pytest

from vitmix import list_mixers
from vitmix.cli import build_parser, main


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


@pytest.mark.parametrize("command", _subcommands())
def test_help_for_every_subcommand(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert command in capsys.readouterr().out


def test_core_subcommands_exist():
    assert {"train", "eval", "models", "mixers"} <= set(_subcommands())


def test_listings(capsys):
    assert main(["mixers"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_mixers())
    assert "``" not in out and ":class:" not in out and "module docstring" not in out   # plain text
    assert "laplacian" in out and "[cost: linear in tokens]" in out
    assert main(["models", "nano"]) == 0
    assert "vit_nano_patch4_32" in capsys.readouterr().out


def test_model_patterns_take_timms_wildcards(capsys):
    import vitmix

    sizes = [f"laplacianformer_{s}" for s in ("huge", "large", "medium", "nano", "small", "tiny")]
    assert vitmix.list_models("laplacianformer_*") == sizes
    assert vitmix.list_models("laplacianformer_[ht]*") == ["laplacianformer_huge", "laplacianformer_tiny"]
    assert vitmix.list_models("*former_tin?") == ["laplacianformer_tiny", "timesformer_tiny", "weightformer_tiny"]
    assert "laplacianformer_tiny" in vitmix.list_models("former_tiny")      # no wildcard: a substring
    assert "deit_tiny_patch16_224" in vitmix.list_models("deit_*")
    assert main(["models", "laplacianformer_*"]) == 0
    assert capsys.readouterr().out.split("\n\n")[0].split() == sizes


def test_model_table(capsys):
    assert main(["models", "--table", "nano_patch4_32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| model | input | mixer | params | GMACs |"
    row = next(line for line in lines if line.startswith("| `vit_nano_patch4_32` |"))
    assert "| 32×32 | softmax | 0.81M |" in row
    assert main(["models", "--table", "timesformer_tiny_fibottention"]) == 0   # video: frames × H × W
    assert "| `timesformer_tiny_fibottention` | 8×32×32 | fibottention |" in capsys.readouterr().out
