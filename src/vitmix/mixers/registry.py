"""Name → mixer class registry, and the timm ``attn_layer`` adapter.

A mixer registers itself with ``@register_mixer("name")`` in its own module. vitmix's mixers are
imported by ``vitmix.mixers``; other packages declare theirs as entry points of the group
``vitmix.mixers`` (``[project.entry-points."vitmix.mixers"] my_mixer = "my_pkg.my_mixer"``), which are
imported the first time a name is looked up. See ``docs/adding-a-mixer.md``.
"""
from __future__ import annotations

import warnings
from typing import Dict, List, Type

from .base import TokenMixer, close_matches

_MIXERS: Dict[str, Type[TokenMixer]] = {}
ENTRY_POINT_GROUP = "vitmix.mixers"
_plugins_loaded = False


def _load_plugins() -> None:
    """Import every module declared in the ``vitmix.mixers`` entry-point group (once); a plugin
    that fails to import is skipped with a warning naming it, so one broken package does not break
    vitmix."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # any import-time error of third-party code
            warnings.warn(f"vitmix: mixer plugin {ep.name!r} ({ep.value}) failed to load: "
                          f"{type(err).__name__}: {err}", RuntimeWarning, stacklevel=3)


def register_mixer(name: str):
    """Class decorator: register a :class:`TokenMixer` subclass under ``name``."""

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, TokenMixer)):
            raise TypeError(f"{cls!r} is not a TokenMixer subclass")
        if name in _MIXERS and _MIXERS[name] is not cls:
            raise ValueError(f"mixer name {name!r} is already registered to {_MIXERS[name].__name__}")
        _MIXERS[name] = cls
        cls.mixer_name = name
        return cls

    return decorate


def list_mixers() -> List[str]:
    """Sorted names of all registered mixers (plugins included)."""
    _load_plugins()
    return sorted(_MIXERS)


def get_mixer_class(name: str) -> Type[TokenMixer]:
    """The class registered as ``name``; ``ValueError`` listing close matches otherwise."""
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else name
    if key not in _MIXERS:
        _load_plugins()
    if key not in _MIXERS:
        raise ValueError(
            f"unknown mixer {name!r}." + close_matches(str(name), _MIXERS)
            + f" Registered mixers: {', '.join(list_mixers())}"
        )
    return _MIXERS[key]


def _check_options(cls: Type[TokenMixer], options: dict) -> None:
    valid = cls.option_names()
    switches = _bool_options(cls)
    for key, value in options.items():
        if key not in valid:
            hint = close_matches(key, valid)
            raise ValueError(f"mixer {cls.mixer_name!r} has no option {key!r}.{hint} Options: {', '.join(valid)}")
        if key in switches and not isinstance(value, bool):   # `-M fused=maybe` would be kept as a string
            raise ValueError(f"mixer {cls.mixer_name!r}: {key}={value!r} must be true or false")


def _bool_options(cls: Type[TokenMixer]) -> set:
    """The constructor options of ``cls`` (and its bases) annotated ``bool``."""
    import inspect

    return {p.name for klass in cls.__mro__ if issubclass(klass, TokenMixer)
            for p in inspect.signature(klass.__init__).parameters.values() if p.annotation in (bool, "bool")}


def create(name: str, dim: int, num_heads: int = 8, **options) -> TokenMixer:
    """Build mixer ``name`` for ``(B, N, dim)`` inputs with ``num_heads`` heads."""
    cls = get_mixer_class(name)
    _check_options(cls, options)
    return cls(dim, num_heads, **options)


def timm_attn(name: str, **options) -> Type[TokenMixer]:
    """A class with ``options`` bound, for ``VisionTransformer(attn_layer=...)``.

    timm checks ``issubclass(attn_layer, ...)``, so this returns a real subclass rather than a
    ``functools.partial``. Options passed by timm (``qkv_bias``, ``norm_layer``...) still apply;
    bound options win over timm's only for the names given here.
    """
    cls = get_mixer_class(name)
    _check_options(cls, options)
    bound = dict(options)

    def __init__(self, dim, num_heads=8, **kwargs):
        cls.__init__(self, dim, num_heads, **{**kwargs, **bound})

    # the mixer's own name: its errors start with it (``LaplacianAttention: newton_iters=0 ...``), not
    # with an internal one made of the options; those stay readable in ``bound_options``
    return type(cls.__name__, (cls,), {"__init__": __init__, "bound_options": bound,
                                       "__module__": cls.__module__, "__qualname__": cls.__qualname__})


__all__ = ["register_mixer", "list_mixers", "get_mixer_class", "create", "timm_attn"]
