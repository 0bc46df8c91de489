"""Generic helpers with no place in one layer: error-message suggestions, autocast, tables, atomic files.

Imports only the standard library at module level (torch lazily), so every layer may use it —
``ops`` and ``mixers`` included — without breaking the layer map or slowing ``vitmix --help``.
"""
from __future__ import annotations

import contextlib
import csv
import difflib
import errno
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Union


# ----------------------------------------------------------------------------------------- errors
class MissingExtra(ImportError):
    """An optional dependency is not installed; the message is one line naming the extra that installs it
    (the CLI prints it and exits 2)."""


def pyplot(purpose: str):
    """matplotlib's pyplot with the Agg backend (no display needed), imported on first use: plotting is
    the ``plot`` extra, so a core install imports, builds and trains without it. ``purpose`` (``"the
    curves.png plot"``) names what needed it in the :class:`MissingExtra` raised when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtra(f"{purpose} needs matplotlib, which is not installed: pip install 'vitmix[plot]'") from None
    return plt


def close_matches(name: str, options: Iterable[str], n: int = 3) -> str:
    """A ``" Did you mean: a, b?"`` suffix for error messages (empty when nothing is close)."""
    matches = difflib.get_close_matches(name, list(options), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(matches)}?" if matches else ""


def plural(n: int, noun: str) -> str:
    """``"1 epoch"``, ``"3 epochs"``: a count and its noun, for log lines."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


# --------------------------------------------------------------------------------------- autocast
def autocast(device, dtype=None):
    """Mixed precision for a block of code: ``torch.autocast`` on ``device``'s type computing in
    ``dtype`` (``torch.bfloat16`` or ``torch.float16``), or a no-op context for ``None`` and
    ``torch.float32`` (full precision), so callers need no branch of their own."""
    import torch

    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


# ----------------------------------------------------------------------------------------- tables
def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: Optional[str] = None) -> str:
    """A markdown table: the header, the separator and one line per row of (already formatted) cells.

    ``align`` gives one letter per column, ``"l"`` (``---``) or ``"r"`` (``---:``); ``None`` leaves
    every column at the renderer's default (``---``).
    """
    if align is not None and len(align) != len(header):
        raise ValueError(f"align={align!r} has {len(align)} letters for {len(header)} columns")
    marks = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    lines = [_markdown_row(header), "|" + "|".join(marks) + "|"]
    lines += [_markdown_row(r) for r in rows]
    return "\n".join(lines)


def _markdown_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table_columns(rows: Iterable[dict]) -> List[str]:
    """Every key of ``rows`` in order of first appearance (rows may have different keys)."""
    cols: List[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def write_csv(path: Union[str, Path], rows: Sequence[dict], columns: Optional[Sequence[str]] = None) -> str:
    """Write ``rows`` (dicts) as a CSV file with ``columns`` (default: every key, first seen first);
    keys outside ``columns`` are left out and missing ones are empty. Returns the path."""
    cols = list(columns) if columns is not None else table_columns(rows)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


# ------------------------------------------------------------------------------------------ atomic files
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: ``errno`` values of a full disk or an exhausted quota.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def atomic_write(path: Path, write, size: Optional[int] = None) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place; ``size``:
    about how many bytes it writes. A full disk leaves nothing behind and is an ``OSError`` (ENOSPC)
    whose one-line message names the folder and the space needed (see :func:`disk_full`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())        # mkstemp makes 0600; give the file a normal file's mode
        os.replace(tmp, path)
    except Exception as err:  # torch.save reports a full disk as a RuntimeError, safetensors as its own error
        _remove(tmp)                             # first, so that the free space counts without it
        full = disk_full(path, err, size)
        if full is None:
            raise
        raise full from None
    finally:
        _remove(tmp)


def _remove(tmp: str) -> None:
    if os.path.exists(tmp):
        os.unlink(tmp)


def disk_full(path: Path, err: Exception, size: Optional[int]) -> Optional[OSError]:
    """The ``OSError`` to raise for ``err``, a failed write of ``path``, when the disk is full: an
    ENOSPC/EDQUOT error, or any error while less than ``size`` bytes are free. ``None`` otherwise.
    Its ``strerror`` is one line naming the folder and the space needed (what the CLI prints)."""
    free = shutil.disk_usage(path.parent).free
    if getattr(err, "errno", None) not in _DISK_FULL and (size is None or free >= size):
        return None
    need = f"about {_megabytes(size)} needed, {_megabytes(free)} free" if size else f"{_megabytes(free)} free"
    return OSError(errno.ENOSPC, f"no space left in {path.parent} to write {path.name} ({need}): free some space "
                                 "there and run the command again (a training run continues with --resume)")


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


# ------------------------------------------------------------------------------------------ cache
def cache_dir(*parts: str) -> Path:
    """vitmix's cache folder (``$VITMIX_CACHE_DIR``, default ``~/.cache/vitmix``), or a folder below it;
    read at each call, so a changed setting applies. Not created here."""
    return Path(os.environ.get("VITMIX_CACHE_DIR") or Path.home() / ".cache" / "vitmix", *parts)


# ------------------------------------------------------------------------------------------ machine
def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # non-Linux (no /proc): tested by making the read fail
        pass
    return platform.processor() or platform.machine()


__all__ = ["atomic_write", "autocast", "cache_dir", "close_matches", "cpu_model", "disk_full", "markdown_table",
           "plural", "table_columns", "write_csv"]

