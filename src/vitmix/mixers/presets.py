"""Named option presets: one ``preset=`` switch per method instead of a handful of reproduction flags.

A class that supports presets lists them in a ``presets`` table, ``{name: {option: value}}``, in
which every preset names the same options. Those options take :data:`FROM_PRESET` as their
default; :func:`resolve_preset` replaces each option still at that marker by the chosen preset's
value, while an option passed explicitly keeps the caller's value (so ``preset="official"`` plus
``newton_alpha="safe"`` is "the official code, but with the safe Newton start"). ``"default"`` is
vitmix's own choice, ``"official"`` the official code's behaviour; see ``docs/presets.md``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from .._util import close_matches

__all__ = ["FROM_PRESET", "DEFAULT_PRESET", "resolve_preset"]

#: name of the preset used when none is given
DEFAULT_PRESET = "default"


class _FromPreset:
    """Marker default of an option whose value comes from the ``preset`` (shown as ``<preset>``)."""

    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<preset>"

    def __reduce__(self):
        return (_FromPreset, ())


#: the default of every preset-controlled option: "take the value from the preset"
FROM_PRESET = _FromPreset()


def resolve_preset(owner: str, presets: Mapping[str, Mapping[str, Any]], preset: str, **options) -> Dict[str, Any]:
    """The values of the preset-controlled ``options``: the preset's value where an option is still
    :data:`FROM_PRESET`, the given value otherwise.

    Args:
        owner: class name used in error messages.
        presets: ``{preset name: {option: value}}``; every preset must define each option given.
        preset: the chosen preset name.
        options: the constructor's values of the preset-controlled options.

    Raises:
        ValueError: unknown preset name (with close matches and the list of presets).
    """
    if not isinstance(preset, str) or preset not in presets:
        names = list(presets)
        raise ValueError(f"{owner}: unknown preset {preset!r}." + close_matches(str(preset), names)
                         + f" Presets: {', '.join(names)}")
    table = presets[preset]
    return {name: table[name] if value is FROM_PRESET else value for name, value in options.items()}
