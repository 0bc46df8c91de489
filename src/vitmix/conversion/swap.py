"""``vitmix.convert``: a trained softmax ViT with every attention layer swapped for a vitmix mixer.

What a layer carries over is the mixer's own business (``TokenMixer.load_attention``, overridden by
mixers with another layout); this module finds the attention layers, reads each teacher layer's
width, heads, timm options and weights, builds the mixer in its place and gives the converted model
what ``vitmix.create_model`` gives its models (token grid, layer numbers). See ``docs/convert.md``.
"""
from __future__ import annotations

import copy
import os
import re
from typing import Dict, List, Optional, Tuple, Type, Union

import torch
from timm.layers import Attention
from torch import nn

from ..mixers import TokenMixer, get_mixer_class, number_layers
from ..mixers.base import close_matches
from ..models.vit import bind_token_grid

#: a teacher layer's tensors that a mixer takes (timm ``Attention``'s names, first component)
TEACHER_LAYERS = ("qkv", "proj", "q_norm", "k_norm", "norm")
#: options that come from the teacher and must not be changed in a conversion
_SHAPE_OPTIONS = ("dim", "num_heads")
#: what convert() starts from: a model, or a vitmix run directory / checkpoint file
Source = Union[nn.Module, str, "os.PathLike[str]"]


def find_attention_layers(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(qualified name, module)`` of each attention layer of ``model`` in module order: timm
    ``Attention`` modules and vitmix mixers (nothing inside one of them is searched)."""
    found: List[Tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(child, (Attention, TokenMixer)):
                found.append((path, child))
            else:
                visit(path, child)

    visit("", model)
    return found


def _teacher_shape(name: str, attn: nn.Module) -> Tuple[int, int]:
    """``(dim, num_heads)`` of an attention layer whose q/k/v and output can be carried over."""
    qkv, proj = getattr(attn, "qkv", None), getattr(attn, "proj", None)
    if not (isinstance(qkv, nn.Linear) and isinstance(proj, nn.Linear)):
        raise ValueError(f"{name} ({type(attn).__name__}) has no fused qkv and proj linears to carry over; only "
                         f"softmax-style layers (timm Attention, vitmix softmax/linear/... mixers) convert")
    dim, heads = qkv.in_features, int(attn.num_heads)
    if qkv.out_features != 3 * dim or proj.in_features != dim or proj.out_features != dim:
        raise ValueError(f"{name}: qkv {qkv.in_features}->{qkv.out_features} / proj {proj.in_features}->"
                         f"{proj.out_features} is not the dim -> 3*dim, dim -> dim layout a mixer takes "
                         f"(attn_head_dim / dim_out layers do not convert)")
    if getattr(attn, "gate", None) is not None:
        raise ValueError(f"{name}: a gated attention layer (timm gated=True) has no counterpart in vitmix mixers")
    return dim, heads


def _is_norm(module: Optional[nn.Module]) -> bool:
    return isinstance(module, nn.Module) and not isinstance(module, nn.Identity)


def _norm_layer_like(attn: nn.Module):
    """A ``norm_layer`` building copies of the teacher's own norms (class, eps and all), chosen by size,
    so a converted ``q_norm``/``k_norm``/``norm`` computes exactly as the teacher's."""
    templates = [m for m in (getattr(attn, "q_norm", None), getattr(attn, "norm", None)) if _is_norm(m)]

    def build(size: int) -> nn.Module:
        for template in templates:
            if tuple(getattr(template, "normalized_shape", ())) == (size,):
                return copy.deepcopy(template)
        return type(templates[0])(size)

    return build


def teacher_options(attn: nn.Module) -> dict:
    """timm's ``Attention`` options as the trained layer ``attn`` has them (biases, norms, dropouts)."""
    qk_norm, scale_norm = _is_norm(getattr(attn, "q_norm", None)), _is_norm(getattr(attn, "norm", None))
    options = dict(qkv_bias=attn.qkv.bias is not None, proj_bias=attn.proj.bias is not None,
                   qk_norm=qk_norm, scale_norm=scale_norm)
    for key in ("attn_drop", "proj_drop"):
        drop = getattr(attn, key, None)
        options[key] = float(drop.p) if isinstance(drop, nn.Dropout) else 0.0
    if qk_norm or scale_norm:
        options["norm_layer"] = _norm_layer_like(attn)
    return options


def teacher_state(attn: nn.Module) -> Dict[str, torch.Tensor]:
    """The trained layer's tensors a mixer takes, under timm ``Attention``'s names (``qkv.weight`` ...)."""
    return {k: v for k, v in attn.state_dict().items() if k.split(".")[0] in TEACHER_LAYERS}


def _model_grid(model: nn.Module) -> Optional[Tuple[Tuple[int, int], int]]:
    """``(hw, prefix)`` of a fixed-size ViT (``None`` for other models and ``dynamic_img_size`` ones)."""
    vit = getattr(model, "model", model)
    embed = getattr(vit, "patch_embed", None)
    if embed is None or not hasattr(embed, "grid_size") or getattr(vit, "dynamic_img_size", False):
        return None
    if getattr(vit, "binds_own_token_grid", False):      # video models: their own grid in space and time
        return None
    return tuple(int(s) for s in embed.grid_size), int(getattr(vit, "num_prefix_tokens", 1))


def _check_options(cls: Type[TokenMixer], mixer: str, options: dict, name: str, dim: int, heads: int) -> dict:
    """``options`` without ``dim``/``num_heads`` (which must equal the teacher's), or a ``ValueError``."""
    teacher = dict(dim=dim, num_heads=heads)
    for key in _SHAPE_OPTIONS:
        if key in options and options[key] != teacher[key]:
            raise ValueError(f"{name}: {mixer} {key}={options[key]} does not fit the teacher layer's "
                             f"{key}={teacher[key]} (head dim {dim // heads}); q/k/v carry over per head, so a "
                             f"converted layer keeps the teacher's width and heads: drop {key}")
    valid = cls.option_names()
    for key in options:
        if key not in valid and key not in _SHAPE_OPTIONS:
            raise ValueError(f"mixer {mixer!r} has no option {key!r}." + close_matches(key, valid)
                             + f" Options: {', '.join(valid)}")
    return {k: v for k, v in options.items() if k not in _SHAPE_OPTIONS}


def convert_layer(name: str, attn: nn.Module, mixer: str, options: dict,
                  grid: Optional[Tuple[Tuple[int, int], int]] = None) -> TokenMixer:
    """Mixer ``mixer`` built in place of the trained attention layer ``attn`` (called ``name`` in its
    model): the teacher's width, heads and timm options, ``options`` on top, its weights taken by the
    mixer's ``load_attention``; built for the model's token ``grid`` when it has a fixed one."""
    cls = get_mixer_class(mixer)
    dim, heads = _teacher_shape(name, attn)
    own = _check_options(cls, mixer, options, name, dim, heads)
    kwargs = dict(teacher_options(attn), **own)
    if grid is not None and "hw" not in own:      # built for its grid: Linformer's E/F get exactly N columns
        kwargs.update(hw=grid[0], num_prefix_tokens=grid[1])
    weight = attn.qkv.weight
    try:
        layer = cls(dim, heads, **kwargs)
        layer.load_attention(teacher_state(attn))
    except ValueError as err:
        raise ValueError(f"{name}: cannot convert to {mixer}: {err}") from None
    return layer.to(device=weight.device, dtype=weight.dtype).train(attn.training)


def _probe(model: nn.Module, layers: List[Tuple[str, TokenMixer]], mixer: str, grid) -> None:
    """One forward of each converted layer at the model's token grid, so that options that do not fit it
    (a landmark stride, a sequence length) fail now, naming the layer, not in the first batch."""
    (h, w), prefix = grid
    gen = torch.Generator().manual_seed(0)
    for name, layer in layers:
        weight = next(layer.parameters())
        x = torch.randn(1, prefix + h * w, layer.dim, generator=gen).to(weight)
        was_training = layer.training
        try:
            with torch.no_grad():
                layer.eval()(x)     # eval: a training forward would count towards Performer's redraw
        except ValueError as err:
            raise ValueError(f"{name}: {mixer} does not fit the teacher's {h}x{w} token grid "
                             f"(+{prefix} prefix): {err}") from None
        finally:
            layer.train(was_training)


def _teacher(source: Source) -> nn.Module:
    if isinstance(source, nn.Module):
        return source
    if isinstance(source, (str, os.PathLike)):
        import vitmix

        return vitmix.load_model(source)      # a vitmix run directory or checkpoint; the file is only read
    raise TypeError(f"convert() takes a model, a run directory or a checkpoint file, got {type(source).__name__}")


def convert(model: Source, mixer: str, *, inplace: bool = False, **mixer_options) -> nn.Module:
    """``model`` with every attention layer replaced by mixer ``mixer``, starting from the trained weights.

    ``model``: a timm ``VisionTransformer``/DeiT (e.g. ``timm.create_model(name, pretrained=True,
    pretrained_cfg_overlay=dict(file=...))``), a model of ``vitmix.create_model`` (any mixer whose layers
    have timm's ``qkv``/``proj``), or a vitmix run directory / checkpoint file (read with
    ``vitmix.load_model``, never written). Each layer keeps the teacher's width, heads, timm options
    (biases, q/k norms, dropouts) and q/k/v and output weights; the mixer's own parameters start as
    close to the teacher as its method allows (``TokenMixer.load_attention``; per mixer in
    ``docs/convert.md``). Everything else — embeddings, norms, MLPs, head — is the teacher's, tensor
    for tensor. The converted model gets its token grid and layer numbers as ``vitmix.create_model``
    gives them, and each layer is run once at that grid, so options that do not fit the teacher fail
    here with a one-line ``ValueError`` naming the layer.

    Args:
        model: the teacher (a module, or a path as above).
        mixer: a registered mixer name (``vitmix mixers``).
        inplace: replace the layers of ``model`` itself; by default a copy is converted and the teacher
            stays usable (e.g. for :func:`~vitmix.conversion.transfer_attention`).
        **mixer_options: the mixer's own options (``landmark_stride=2``, ``k=64`` ...).
    Returns:
        the converted model, in the teacher's train/eval mode, device and dtype.

    >>> student = vitmix.convert(timm.create_model("deit_tiny_patch16_224"), "laplacian")  # doctest: +SKIP
    """
    teacher = _teacher(model)
    layers = find_attention_layers(teacher)
    if not layers:
        raise ValueError(f"{type(teacher).__name__} has no attention layers to convert (timm Attention or "
                         f"vitmix mixers); convert takes a ViT/DeiT")
    student = teacher if inplace or not isinstance(model, nn.Module) else copy.deepcopy(teacher)
    grid = _model_grid(student)
    converted = []
    for name, _ in layers:
        layer = convert_layer(name, student.get_submodule(name), mixer, mixer_options, grid)
        student.set_submodule(name, layer)
        converted.append((name, layer))
    bind_token_grid(student)
    number_layers(student)
    if grid is not None:
        _probe(student, converted, mixer, grid)
    return student


def load_error(err: RuntimeError) -> str:
    """The first ``size mismatch`` / missing / unexpected key of torch's multi-line load error, on one line."""
    text = str(err)
    found = re.search(r"size mismatch for ([^:]+): copying a param with shape (torch\.Size\(\[[^\]]*\]\)) from "
                      r"checkpoint, the shape in current model is (torch\.Size\(\[[^\]]*\]\))", text)
    if found:
        return f"{found.group(1)} is {found.group(2)[11:-1]} in the file, {found.group(3)[11:-1]} in the model"
    found = re.search(r"(Missing key\(s\)|Unexpected key\(s\)) in state_dict: \"([^\"]+)\"", text)
    if found:
        return f"{found.group(1).lower()} {found.group(2)}"
    return text.splitlines()[0] if text else type(err).__name__


def load_timm_checkpoint(name: str, file: Union[str, "os.PathLike[str]"], **model_kwargs) -> nn.Module:
    """timm model ``name`` with the weights of a local checkpoint ``file`` (timm's own loading:
    ``pretrained_cfg_overlay=dict(file=...)``, so timm's checkpoint filter adapts position embeddings
    and the like), the file only read. A file whose tensors do not fit the model is a one-line
    ``ValueError`` naming the first tensor that does not.

    >>> teacher = load_timm_checkpoint("deit_tiny_patch16_224", "deit_tiny.safetensors")  # doctest: +SKIP
    """
    path = os.fspath(file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    import timm

    try:
        return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), **model_kwargs)
    except RuntimeError as err:
        raise ValueError(f"{path} does not match {name}: {load_error(err)}; build the model the "
                         f"checkpoint was trained as (num_classes, img_size, ...)") from None
