"""The YAML config and CLI flags every task shares: a run config is a dataclass whose fields are
its flags (:class:`YamlConfig`), written to ``config.yaml``; :func:`add_field_flags` adds one flag per
field and :func:`config_from_args` reads them back over ``--config`` (or, with ``--resume``, the
run's own ``config.yaml``)."""
from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import yaml

from .._util import close_matches


class YamlConfig:
    """What a run config dataclass shares: field names (= CLI flags), dict/YAML round trips, and a
    close-match error for unknown keys. Subclassed by :class:`TrainConfig` and ``vitmix generate``'s."""

    @classmethod
    def field_names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def load(cls, path: Path) -> "YamlConfig":
        return cls.from_dict(load_yaml(path))

    @classmethod
    def from_dict(cls, values: dict) -> "YamlConfig":
        """The config of ``values`` (a YAML mapping or the CLI's flags): an unknown key, a value of the
        wrong type or out of range is a one-line ``ValueError`` naming the key."""
        unknown = set(values) - set(cls.field_names())
        if unknown:
            bad = sorted(unknown)[0]
            raise ValueError(f"unknown config key {bad!r}." + _key_hint(bad, cls.field_names()))
        hints = typing.get_type_hints(cls)
        config = cls(**{key: checked_value(key, value, hints[key]) for key, value in values.items()})
        config.check_values()
        return config

    def check_values(self) -> None:
        """Raise a one-line ``ValueError`` for a value out of range (none by default)."""


#: timm ``train.py`` names of config keys that vitmix spells differently (the same meaning).
TIMM_KEYS = {"grad_accum_steps": "accum_steps", "model_ema_decay": "ema_decay", "torchcompile": "compile",
             "checkpoint_hist": "keep_top_k", "dataset": "data", "dataset_download": "download",
             "model_kwargs": "model_options", "no_aug": "augment (false)"}


def _key_hint(key: str, names) -> str:
    if key.replace("-", "_") in TIMM_KEYS:
        return f" That is timm's name; vitmix's key is {TIMM_KEYS[key.replace('-', '_')]}."
    return close_matches(key, names) or " The keys are the flags' names with _ for - (see --help)."


_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
               list: "a list"}


def checked_value(key: str, value, hint):
    """``value`` for config key ``key`` of annotated type ``hint``, or a one-line ``ValueError``
    naming the key, the value and the type expected. A float written as ``1e-3`` is a string to
    YAML 1.1 (it wants ``1.0e-3``), so strings that spell a number are read as one."""
    args = typing.get_args(hint)
    if type(None) in args:                        # Optional[X]
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    kind = typing.get_origin(hint) or hint
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if kind is Any or _is_kind(value, kind):
        return value
    expected = "true or false" if kind is bool else _KIND_NAMES.get(kind, getattr(kind, "__name__", str(kind)))
    if kind is dict:
        raise ValueError(f"config key {key}: {value!r} is not a mapping; write it as "
                         f"{key}: {_as_mapping(value)}")
    raise ValueError(f"config key {key}: {value!r} is {_kind_of(value)}, expected {expected}")


def _is_kind(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _kind_of(value) -> str:
    return "null" if value is None else _KIND_NAMES.get(type(value), f"a {type(value).__name__}")


def _as_mapping(value) -> str:
    """The YAML mapping a ``KEY=VALUE[,KEY=VALUE]`` string (the ``-M`` form) stands for."""
    pairs = [p.split("=", 1) for p in str(value).split(",") if "=" in p]
    if not pairs:
        return "{KEY: VALUE, ...}"
    return "{" + ", ".join(f"{k.strip()}: {v.strip()}" for k, v in pairs) + "}"


def load_yaml(path) -> dict:
    """Read a YAML mapping, with a clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of config keys, got {type(values).__name__}")
    return values


def _yaml_problem(err: "yaml.YAMLError") -> str:
    """PyYAML's multi-line report (context, problem, a caret drawing) as one line: the problem and where."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(err, 'problem', None) or str(err).splitlines()[0]}{where}"


def parse_key_values(items) -> Dict[str, Any]:
    """``["num_landmarks=16", "lam=4"]`` → ``{"num_landmarks": 16, "lam": 4}`` (values parsed as YAML)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return out


#: Optional fields for which a flag of 0 means off (``--clip-grad 0``, ``--ema-decay 0``).
OFF_WHEN_ZERO = ("clip_grad", "ema_decay")


def add_field_flags(p: argparse.ArgumentParser, config_cls, helps: Mapping[str, str], ints: Sequence[str] = (),
                    floats: Sequence[str] = (), exclude: Sequence[str] = (),
                    aliases: Optional[Mapping[str, Sequence[str]]] = None) -> None:
    """One flag per field of ``config_cls`` (``--batch-size`` for ``batch_size``; not those in
    ``exclude``), typed by its default or by ``ints``/``floats`` (for a default of ``None``); a boolean
    on by default gets ``--no-FLAG``. The dict fields are the repeatable ``-M``/``--mixer-option`` and
    ``--model-option`` KEY=VALUE. ``helps``: a field's help (its default is added unless it says one);
    ``aliases``: more names of a field's flag."""
    defaults = config_cls()
    for f in dataclasses.fields(config_cls):
        if f.name in ("mixer_options", "model_options", "data_options") or f.name in exclude:
            continue
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        names = (flag, *(aliases or {}).get(f.name, ()))
        if isinstance(default, bool):
            if default:   # on by default: the flag turns it off
                p.add_argument("--no-" + flag[2:], *names[1:], dest=f.name, action="store_false", default=None,
                               help=helps.get(f.name))
            else:
                p.add_argument(*names, action="store_true", default=None, help=helps.get(f.name))
            continue
        kind = {int: int, float: float}.get(type(default), str)
        kind = int if f.name in ints else float if f.name in floats else kind
        text = helps.get(f.name, f.name.replace("_", " "))
        p.add_argument(*names, type=kind, default=None, metavar=f.name.upper(),
                       help=text if "(default:" in text else f"{text} (default: {default})")
    p.add_argument("--mixer-option", "-M", action="append", metavar="KEY=VALUE",
                   help="mixer option, repeatable (e.g. -M num_landmarks=16)")
    p.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                   help="model constructor option, repeatable (e.g. --model-option depth=4)")
    if "data_options" in config_cls.field_names() and "data_options" not in exclude:
        p.add_argument("--data-option", action="append", metavar="KEY=VALUE",
                       help="sequence data option, repeatable: train_size, val_size, seed and the generator's "
                            "options (e.g. --data-option train_size=512 --data-option max_len=200)")


def config_from_args(args: argparse.Namespace, config_cls,
                     adjust: Optional[Callable[[dict, argparse.Namespace], None]] = None):
    """The run's config: ``--config`` overlaid by the flags given. With ``--resume`` the base is the
    run's own ``config.yaml``, so ``--out RUN --resume`` needs no other flag (and a flag that would
    change the run is refused by :func:`vitmix.runs.prepare_run_dir`). ``config_cls``: a
    :class:`YamlConfig` dataclass whose fields are the flags; ``adjust(values, args)`` may rewrite the
    values before they are checked; an optional field of :data:`OFF_WHEN_ZERO` given as 0 means off."""
    from ..configs import resolve_config

    resume, out = getattr(args, "resume", None), getattr(args, "out", None)
    saved = Path(out or "", "config.yaml")
    values = load_yaml(saved) if resume and out and saved.is_file() else {}
    values.update(load_yaml(resolve_config(args.config)) if args.config else {})
    for name in config_cls.field_names():
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.mixer_option:
        values["mixer_options"] = {**values.get("mixer_options", {}), **parse_key_values(args.mixer_option)}
    if args.model_option:
        values["model_options"] = {**values.get("model_options", {}), **parse_key_values(args.model_option)}
    if getattr(args, "data_option", None):
        values["data_options"] = {**values.get("data_options", {}), **parse_key_values(args.data_option)}
    if adjust is not None:
        adjust(values, args)
    for name in OFF_WHEN_ZERO:
        if values.get(name) == 0:
            values[name] = None
    return config_cls.from_dict(values)
