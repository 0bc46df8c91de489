"""Every CLI error a user can fix is one line on stderr, exit status 2, no traceback, and leaves
existing files as they were."""
import hashlib
import pathlib

import pytest

from vitmix.cli import main


def _tree(root: pathlib.Path):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def workspace(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.csv").write_text("earlier results\n")
    (tmp_path / "a_file").write_text("not a directory\n")
    (tmp_path / "truncated.safetensors").write_bytes(b"\x08\x00\x00")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x04\x95\x00garbage")
    return tmp_path


TINY = ["--img-size", "16", "--model-option", "depth=1", "--model-option", "embed_dim=32",
        "--model-option", "num_heads=2", "--epochs", "1"]

CASES = {
    "train: unknown model": lambda w: ["train", "--model", "vit_nanno_patch4_32", "--out", str(w / "r1")],
    "train: unknown mixer": lambda w: ["train", *TINY, "--mixer", "laplacain", "--out", str(w / "r2")],
    "train: bad mixer option value": lambda w: ["train", *TINY, "--mixer", "laplacian", "-M", "num_landmarks=abc",
                                                "--out", str(w / "r3")],
    "train: --max-steps 0": lambda w: ["train", *TINY, "--max-steps", "0", "--out", str(w / "r4")],
    "train: --out is a file": lambda w: ["train", *TINY, "--max-steps", "1", "--out", str(w / "a_file")],
    "train: no such GPU": lambda w: ["train", *TINY, "--device", "cuda:99", "--out", str(w / "r5")],
    "train: --resume without a run": lambda w: ["train", *TINY, "--resume", "--out", str(w / "bench")],
    "train: --out holds files but no run": lambda w: ["train", *TINY, "--max-steps", "1", "--out", str(w / "bench")],
    "train: negative --lr": lambda w: ["train", *TINY, "--lr", "-0.01", "--out", str(w / "r6")],
    "train: bound mixer option out of range": lambda w: ["train", *TINY, "--mixer", "laplacian", "-M", "newton_iters=0",
                                                         "--out", str(w / "r7")],
    "eval: truncated checkpoint": lambda w: ["eval", "--checkpoint", str(w / "truncated.safetensors")],
    "eval: empty checkpoint": lambda w: ["eval", "--checkpoint", str(w / "empty.safetensors")],
    "eval: missing checkpoint": lambda w: ["eval", "--checkpoint", str(w / "nope.safetensors")],
    "analyze: truncated checkpoint": lambda w: ["analyze", "maps", "--checkpoint", str(w / "truncated.safetensors"),
                                                "--out", str(w / "maps")],
    "analyze: pickle checkpoint": lambda w: ["analyze", "maps", "--checkpoint", str(w / "pickle.pt"),
                                             "--out", str(w / "maps")],
    "bench: bad mixer option value": lambda w: ["bench", "--mixers", "laplacian:num_landmarks=abc", "--tokens", "196",
                                                "--out", str(w / "bench")],
    "bench: unknown option": lambda w: ["bench", "--mixers", "soft:landmark=4", "--tokens", "196",
                                        "--out", str(w / "bench")],
    "bench: unknown mixer": lambda w: ["bench", "--mixers", "sofmax", "--tokens", "196", "--out", str(w / "bench")],
}


@pytest.mark.parametrize("case", list(CASES))
def test_cli_error_is_one_line_exit_2_and_changes_nothing(case, workspace, capsys):
    before = _tree(workspace)
    assert main(CASES[case](workspace)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitmix ") and "error:" in err[0], err
    assert "Traceback" not in err[0]
    assert _tree(workspace) == before


def test_a_closed_pipe_is_not_an_error():
    """`vitmix mixers | head`: a reader that leaves early (here: before reading anything, so the write
    fails for sure) must give neither a BrokenPipeError trace nor a failing exit status."""
    import subprocess
    import sys

    proc = subprocess.run(["bash", "-c", f"set -o pipefail; '{sys.executable}' -m vitmix.cli mixers | true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-500:]


def test_a_misspelt_model_option_suggests_the_real_one(workspace, capsys):
    """`--model-option dept=1`: timm's TypeError alone named no alternative."""
    assert main(["train", *TINY, "--model-option", "dept=1", "--out", str(workspace / "r8")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'dept'. Did you mean: depth?" in err, err


# --- issue 44 (items 9, 11): values that used to pass unchecked, and messages that named the wrong thing.
def _one_line_error(argv, workspace, capsys) -> str:
    """Run ``argv``: exit 2, one `vitmix ...: error:` line, no file changed; returns that line."""
    before = _tree(workspace)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitmix ") and "error:" in err[0], err
    assert _tree(workspace) == before
    return err[0]


CHECKED_VALUES = {   # case: (argv, what the message must say)
    "--lr inf": (lambda w: ["train", *TINY, "--lr", "inf", "--out", str(w / "v1")], "--lr inf must be a finite"),
    "--lr nan": (lambda w: ["train", *TINY, "--lr", "nan", "--out", str(w / "v2")], "--lr nan must be"),
    "--min-lr above --lr": (lambda w: ["train", *TINY, "--lr", "0.001", "--min-lr", "0.01", "--out", str(w / "v3")],
                            "--min-lr 0.01 is above --lr 0.001"),
    "-M fused=maybe": (lambda w: ["train", *TINY, "--mixer", "softmax", "-M", "fused=maybe", "--out", str(w / "v4")],
                       "fused='maybe' must be true or false"),
    "-M hw off the model's grid": (lambda w: ["train", *TINY, "--mixer", "laplacian", "-M", "hw=[3,3]",
                                              "--out", str(w / "v5")], "hw=[3, 3] disagrees with the model's token "
                                                                       "grid [4, 4]"),
    "-M norm_layer=foo": (lambda w: ["train", *TINY, "--mixer", "softmax", "-M", "norm_layer=foo", "--out",
                                     str(w / "v6")], "give layernorm or rmsnorm"),
    "--opt sgdd": (lambda w: ["train", *TINY, "--opt", "sgdd", "--out", str(w / "v7")],
                   "--opt 'sgdd' is not an optimizer timm knows. Did you mean: sgd"),
    "dense --lr inf": (lambda w: ["dense", "train", "--lr", "inf", "--out", str(w / "v8")], "finite"),
}


@pytest.mark.parametrize("case", list(CHECKED_VALUES))
def test_an_unchecked_value_is_now_a_one_line_error(case, workspace, capsys):
    argv, expected = CHECKED_VALUES[case]
    line = _one_line_error(argv(workspace), workspace, capsys)
    assert expected in line, line
    assert not any((workspace / f"v{i}").exists() for i in range(1, 9))


def test_a_model_grid_hw_and_a_named_norm_layer_are_accepted():
    """The checks refuse only what is wrong: ``hw`` equal to the patch grid, a norm layer by name."""
    import timm
    from torch import nn

    import vitmix  # noqa: F401  (registers the models)

    model = timm.create_model("vit_nano_patch4_32", img_size=16, depth=1, embed_dim=32, num_heads=2,
                              mixer="softmax", mixer_options={"hw": [4, 4], "norm_layer": "rmsnorm", "qk_norm": True,
                                                              "fused": False})
    attn = model.blocks[0].attn
    assert attn.hw == (4, 4) and isinstance(attn.q_norm, nn.RMSNorm) and attn.fused is False


def test_malformed_yaml_is_one_line_with_where(workspace, capsys):
    (workspace / "bad.yaml").write_text("lr: [1\nepochs: 2\n")
    line = _one_line_error(["train", "--config", str(workspace / "bad.yaml")], workspace, capsys)
    assert "bad.yaml is not valid YAML: expected ',' or ']', but got ':' at line 2, column 7" in line, line


def test_a_misspelt_command_suggests_the_real_one(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["trian"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert "invalid choice: 'trian'. Did you mean: train?" in err[0], err


def test_sigterm_says_how_to_resume_as_ctrl_c_does(workspace, capsys, monkeypatch):
    """A scheduler's SIGTERM ended a run silently; now it is the same interruption as Ctrl-C."""
    import os
    import signal

    from vitmix.train import runner

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the run")

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(runner, "train_one_epoch", terminated)
    out = workspace / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"vitmix train: interrupted; continue with `vitmix train --out {out} --resume`", err
    assert signal.getsignal(signal.SIGTERM) is previous
