"""Checkpoint IO, kept importable here: it lives in :mod:`vitmix.runs`, shared by every task."""
from __future__ import annotations

from ..runs.checkpoints import (  # noqa: F401  (re-exported)
    atomic_write, file_digest, load_into, load_state, load_weights, read_state_dict, save_state, save_text,
    save_weights, unwrap,
)
from ..runs.directory import remove_stray_temporaries  # noqa: F401  (re-exported)

_atomic = atomic_write   # the name older importers used

__all__ = ["file_digest", "load_into", "load_state", "load_weights", "read_state_dict", "remove_stray_temporaries",
           "save_state", "save_text", "save_weights", "unwrap"]
