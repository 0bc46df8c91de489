"""The run directory of a ``vitmix train`` or ``vitmix generate train`` run: its name, the checks
before anything is written (a new run never lands on an existing one or on a folder of other
files; ``--resume`` keeps the run's ``config.yaml``), the marker of a run that stopped with a
non-finite loss, and the temporaries an interrupted atomic write leaves behind. The folder rule is
:func:`check_output_dir`, which every other command that writes a folder follows too."""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence, Type

from .checkpoints import save_text

#: Written into the run directory when the loss became non-finite (see :func:`check_replaceable`).
ABORTED = "aborted.json"
#: Config fields whose flag is not ``--`` + the field name.
_FLAGS = {"mixer_options": "--mixer-option", "model_options": "--model-option"}


def run_directory(out: Optional[str], name: str) -> Path:
    """``out``, else ``runs/<time>-<name>``."""
    if out:
        return Path(out)
    return Path("runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{name}"


def flag_of(field: str) -> str:
    """The CLI flag of config field ``field``."""
    return _FLAGS.get(field, "--" + field.replace("_", "-"))


def prepare_run_dir(cfg, config_cls: Type, may_change: Sequence[str], name: str) -> Path:
    """The run directory of ``cfg`` (``cfg.out``, else ``runs/<time>-<name>``), checked but not
    created: a new run never lands on an existing one or on a non-empty folder of other files, and a
    resume needs one whose config it keeps (``may_change``: the fields it may change, starting with
    ``out`` and ``resume``)."""
    run_dir = run_directory(cfg.out, name)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--out {run_dir} is a file; give a directory for the run")
    if cfg.resume:
        if not cfg.out:
            raise ValueError("--resume needs --out RUN_DIR: the run directory to continue")
        check_resumable(cfg, run_dir, config_cls, may_change)
    elif (run_dir / "config.yaml").exists():
        check_replaceable(run_dir)
    else:
        check_output_dir(run_dir, ("config.yaml",), "vitmix run")
    return run_dir


def check_output_dir(out: Path, markers: Sequence[str], what: str, flag: str = "--out") -> None:
    """The one rule of every command that writes a folder: it may write into a new or empty folder,
    or into one that holds its own earlier output (any of the files ``markers``, e.g. ``compare.yaml``),
    which it resumes or refreshes; a file, or a non-empty folder without a marker (files the command did
    not write), is a one-line ``ValueError`` naming the folder and the way out, and nothing is written."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out} is a file; give a directory for the {what}")
    if not out.is_dir() or any((out / name).is_file() for name in markers):
        return
    names = sorted(p.name for p in out.iterdir())
    if names:
        raise ValueError(f"{flag} {out} is a non-empty directory that holds no {what} (it has {names[0]}); "
                         "give a new or empty directory, so that no file of yours is overwritten")


def check_resumable(cfg, run_dir: Path, config_cls: Type, may_change: Sequence[str]) -> None:
    """``--resume`` continues the run in ``run_dir`` as it was configured: a field outside
    ``may_change`` that differs from the saved ``config.yaml`` is a one-line ``ValueError`` naming its flag."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise FileNotFoundError(f"--resume: {saved_path} does not exist, so {run_dir} holds no run to resume; "
                                "drop --resume to start a new run there")
    saved = config_cls.load(saved_path)
    for name in config_cls.field_names():
        mine, theirs = getattr(cfg, name), getattr(saved, name)
        if name not in may_change and mine != theirs:
            was = "unset (the model's default)" if theirs is None else repr(theirs)
            raise ValueError(f"--resume: {flag_of(name)} {mine!r} differs from the run's {was} ({saved_path}); "
                             f"a resumed run keeps its config (only {', '.join(may_change[2:])} may change): drop "
                             "the flag or train into a new --out")


def check_replaceable(run_dir: Path) -> None:
    """A new run may take the place of a run that stopped with a non-finite loss before finishing
    an epoch (nothing of it is worth keeping: the retry with a lower ``--lr`` goes to the same
    ``--out``); any other run is refused."""
    aborted = (run_dir / ABORTED).is_file()
    if aborted and not (run_dir / "state.pt").is_file():
        return
    if aborted:
        raise ValueError(f"{run_dir} holds a run that stopped with a non-finite loss and keeps the checkpoints of "
                         "its finished epochs: train the retry into another --out (or delete the directory)")
    raise ValueError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")


def clear_aborted(run_dir: Path) -> None:
    """Before a run writes into ``run_dir``: forget an earlier abort, and what an aborted run that
    finished no epoch left (its TensorBoard log, temporaries) when this run replaces it."""
    marker = run_dir / ABORTED
    if not marker.is_file():
        return
    if not (run_dir / "state.pt").is_file():
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
        remove_stray_temporaries(run_dir)
    marker.unlink()


def abort_message(run_dir: Path, err: FloatingPointError, is_main: bool = True) -> str:
    """Record a non-finite loss in ``run_dir`` (so that a retry may replace a run without a finished
    epoch) and say what the retry can do."""
    if is_main:
        save_text(run_dir / ABORTED, json.dumps({"reason": str(err)}) + "\n")
    if (run_dir / "state.pt").is_file():
        return (f"{err}; {run_dir} keeps the checkpoints of its finished epochs, so train the retry into another "
                "--out")
    return f"{err}; {run_dir} finished no epoch, so the retry may use the same --out"


@contextmanager
def recorded_abort(run_dir: Path, is_main: bool = True):
    """Around a task's epochs: a non-finite loss (``FloatingPointError``) is recorded in ``run_dir`` and
    re-raised with what the retry can do (:func:`abort_message`), so every task's retry follows one rule."""
    try:
        yield
    except FloatingPointError as err:
        raise FloatingPointError(abort_message(run_dir, err, is_main)) from None


def remove_stray_temporaries(run_dir: Path) -> int:
    """Delete the ``.NAME.*.tmp`` files an interrupted atomic write leaves behind; returns how many."""
    stray = sorted(Path(run_dir).glob(".*.tmp"))
    for path in stray:
        path.unlink()
    return len(stray)


def save_run_config(run_dir: Path, cfg, resolved: str) -> None:
    """Create ``run_dir`` and write ``config.yaml``: ``cfg`` and a ``# resolved:`` line of what was
    derived from it (e.g. ``img_size=28``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_text(run_dir / "config.yaml", cfg.to_yaml() + f"# resolved: {resolved}\n")
