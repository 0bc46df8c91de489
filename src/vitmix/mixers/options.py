"""Checks of mixer option values shared by several mixers (one-line ``ValueError`` naming the option)."""
from __future__ import annotations

import warnings
from typing import Optional

from torch import nn

#: ``norm_layer`` by name (a mixer option from the CLI or YAML is text; timm passes a class)
NORM_LAYERS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}


def check_choice(name: str, value, choices) -> None:
    """``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def reject_unsupported(name: str, qk_norm: bool = False, scale_norm: bool = False,
                       attn_drop: float = 0.0) -> None:
    """Raise for timm options a kernel mixer cannot honour (accepted only at their defaults)."""
    if scale_norm:
        raise ValueError(f"{name} does not support scale_norm=True; leave it False")
    if qk_norm:
        raise ValueError(f"{name} does not support qk_norm=True; leave it False")
    if attn_drop:
        raise ValueError(
            f"{name} never forms an attention matrix, so attn_drop={attn_drop} cannot apply; use "
            f"proj_drop or drop_path instead"
        )


def check_newton(name: str, iters, eps, inverse: str, default_iters: int = 20) -> None:
    """Newton–Schulz options: ``iters >= 1`` with ``inverse="newton"``, ``eps >= 0``; the messages name the
    mixer's own default iteration count."""
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"{name}: newton_iters={iters!r} must be an int >= 1 (default {default_iters})")
    if iters == 0 and inverse == "newton":
        raise ValueError(f"{name}: newton_iters=0 with inverse='newton' would return the start matrix, not "
                         f"an inverse; use newton_iters >= 1 (default {default_iters}) or inverse='exact'")
    if not float(eps) >= 0:
        raise ValueError(f"{name}: newton_eps={eps!r} must be >= 0 (default 0.01)")


def stride_option(name: str, landmark_stride: Optional[int], deprecated: dict, default: int) -> int:
    """The landmark stride, accepting the old per-method names (``sr_ratio``, ``pool_ratio``) with a warning."""
    given = {k: v for k, v in deprecated.items() if v is not None}
    for old, value in given.items():
        warnings.warn(f"{name}: {old}= is deprecated, use landmark_stride={value}", DeprecationWarning,
                      stacklevel=4)
        if landmark_stride is not None and int(landmark_stride) != int(value):
            raise ValueError(f"{name}: landmark_stride={landmark_stride} and {old}={value} disagree; "
                             f"pass landmark_stride only")
        landmark_stride = value
    stride = int(default if landmark_stride is None else landmark_stride)
    if stride < 1:
        raise ValueError(f"{name}: landmark_stride={stride} must be >= 1")
    return stride


def norm_layer_class(value):
    """``norm_layer`` as a class: ``None`` and classes (timm passes its own) as given, a name of
    :data:`NORM_LAYERS` as its class; anything else is a ``ValueError`` listing the names, since the
    layer would otherwise be called only with ``qk_norm``/``scale_norm`` and fail there."""
    if value is None or callable(value):
        return value
    key = str(value).lower().replace("_", "")
    if key not in NORM_LAYERS:
        raise ValueError(f"norm_layer={value!r} is not a norm layer: give {' or '.join(NORM_LAYERS)} "
                         "(it normalises q/k with qk_norm=True and the output with scale_norm=True)")
    return NORM_LAYERS[key]


def positive_int(value, name: str, minimum: int) -> int:
    """``value`` when it is an int ``>= minimum`` (not a bool), else a one-line ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return value


__all__ = ["NORM_LAYERS", "check_choice", "check_newton", "norm_layer_class", "positive_int", "reject_unsupported",
           "stride_option"]
