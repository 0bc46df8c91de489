"""Shared pieces of the ``vitmix analyze`` subcommands: real images, models, activations, outputs."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._util import close_matches, markdown_table, table_columns, write_csv
from .._util import pyplot as _pyplot

SOURCES = ("auto", "digits", "fashion-mnist")
#: the IDX image files tried in order: the test split first (images no training run has seen)
_FASHION_STEMS = ("t10k-images-idx3-ubyte", "train-images-idx3-ubyte")


# ------------------------------------------------------------------------------------------ images
def _fashion_file(root: str) -> Optional[Path]:
    from ..data.idx import find_idx  # vitmix.data loads timm: only when images are read

    return next((p for p in (find_idx(root, stem) for stem in _FASHION_STEMS) if p), None)


def load_images(n: int = 8, size: int = 32, source: str = "auto", seed: int = 0,
                fashion_dir: Optional[str] = None) -> Tuple[torch.Tensor, str]:
    """``n`` real grey images as a ``(n, 3, size, size)`` float tensor normalised to mean 0 / std 1.

    ``source``: ``"digits"`` (scikit-learn's bundled 8×8 digits), ``"fashion-mnist"`` (28×28 IDX
    files under ``fashion_dir``, by default where Debian's ``dataset-fashion-mnist`` puts them) or ``"auto"``
    (Fashion-MNIST when present, else digits). Images are resized bilinearly to ``size``.
    Returns ``(images, description)``.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown image source {source!r}." + close_matches(source, SOURCES)
                         + f" Choose from {', '.join(SOURCES)}")
    if n <= 0 or size <= 0:
        raise ValueError(f"need a positive number of images and size, got n={n}, size={size}")
    if fashion_dir is None:
        from ..data.datasets import fashion_mnist_dir

        fashion_dir = str(fashion_mnist_dir())
    path = _fashion_file(fashion_dir)
    if source == "fashion-mnist" and path is None:
        raise FileNotFoundError(f"no Fashion-MNIST IDX files under {fashion_dir}; install the Debian package "
                                "dataset-fashion-mnist or use --source digits")
    rng = np.random.default_rng(seed)
    if source != "digits" and path is not None:
        arr = _grey_images(path).astype(np.float32) / 255.0
        desc = f"Fashion-MNIST ({path.name})"
    else:
        from sklearn.datasets import load_digits

        arr = load_digits().images.astype(np.float32) / 16.0
        desc = "scikit-learn digits (8x8)"
    idx = rng.choice(len(arr), size=min(n, len(arr)), replace=False)
    x = torch.from_numpy(arr[np.sort(idx)]).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std().clamp_min(1e-6)
    return x.expand(-1, 3, -1, -1).contiguous(), f"{desc}, {len(idx)} images resized to {size}x{size}"


def _grey_images(path: Path) -> np.ndarray:
    from ..data.idx import read_idx

    arr = read_idx(path)
    if arr.ndim != 3 or arr.dtype != np.uint8:
        raise ValueError(f"{path} holds {arr.dtype} data of shape {arr.shape}, not (N, H, W) uint8 images")
    return arr


# ------------------------------------------------------------------------------------------ models
def checkpoint_meta(checkpoint: str) -> dict:
    """The metadata of a vitmix checkpoint file or run directory (its best checkpoint); ``{}`` for a
    plain state dict (``.pt``/``.pth``), which records no architecture."""
    from ..runs import load_weights, resolve_checkpoint

    path = resolve_checkpoint(checkpoint)
    return load_weights(path)[1] if path.suffix == ".safetensors" else {}


def build_model(name: str, img_size: int, mixer: Optional[str] = None, mixer_options: Optional[dict] = None,
                checkpoint: Optional[str] = None, seed: int = 0, weights: bool = True) -> nn.Module:
    """``vitmix.create_model`` in eval mode; with ``checkpoint`` (a file or run directory) built as that
    run was — its model options, input channels (a grey-image run has one) and, for ``mixer=None``, its
    mixer — and, unless
    ``weights=False`` (a companion model that copies another's weights), with its weights."""
    from ..models import create_model

    torch.manual_seed(seed)
    meta = checkpoint_meta(checkpoint) if checkpoint else {}
    if mixer is None and meta.get("mixer"):   # "the model's own" mixer is the one the run trained
        mixer, mixer_options = meta["mixer"], dict(meta.get("mixer_options") or {}, **(mixer_options or {}))
    arch = dict(meta.get("model_options") or {}, **({"in_chans": int(meta["in_chans"])} if "in_chans" in meta else {}))
    model = create_model(name, img_size=img_size, mixer=mixer, mixer_options=mixer_options, **arch)
    if checkpoint and weights:
        from ..runs import load_into, read_state_dict, resolve_checkpoint

        # a different classifier head does not change the attention layers an analysis reads
        load_into(model, read_state_dict(resolve_checkpoint(checkpoint)), f"checkpoint {checkpoint}",
                  ignore=("head.",))
    return model.eval()


def model_input(images: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """The grey images (three equal channels) as ``model`` takes them: their first channel for a
    one-channel model (a run on digits or Fashion-MNIST), unchanged otherwise."""
    conv = getattr(getattr(model, "patch_embed", None), "proj", None)
    channels = getattr(conv, "in_channels", images.shape[1])
    return images[:, :channels] if channels < images.shape[1] else images


def copy_matching(dst: nn.Module, src: nn.Module) -> int:
    """Copy every weight of ``src`` whose name and shape ``dst`` shares (e.g. a softmax model's into the
    same backbone with another mixer); returns how many tensors were copied."""
    own = dst.state_dict()
    shared = {k: v for k, v in src.state_dict().items() if k in own and own[k].shape == v.shape}
    dst.load_state_dict(shared, strict=False)
    return len(shared)


def mixer_layers(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(name, module)`` of every attention/mixer layer (vitmix mixers and timm ``Attention``)."""
    from ..mixers.base import TokenMixer

    out = []
    for name, m in model.named_modules():
        if isinstance(m, TokenMixer) or (type(m).__name__ == "Attention" and hasattr(m, "qkv")):
            out.append((name, m))
    if not out:
        raise ValueError(f"{type(model).__name__} has no attention layers to analyse")
    return out


@torch.no_grad()
def capture_mixer_inputs(model: nn.Module, images: torch.Tensor) -> List[Tuple[str, nn.Module, torch.Tensor]]:
    """Run ``model(images)`` and return ``(name, mixer, input x (B, N, C))`` for every mixer layer."""
    layers = mixer_layers(model)
    captured: Dict[str, torch.Tensor] = {}
    handles = []
    for name, m in layers:
        def hook(mod, args, kwargs=None, name=name):
            captured[name] = args[0].detach()

        handles.append(m.register_forward_pre_hook(hook))
    try:
        model(model_input(images, model))
    finally:
        for h in handles:
            h.remove()
    return [(n, m, captured[n]) for n, m in layers if n in captured]


def query_key_value(mixer: nn.Module, x: torch.Tensor):
    """Raw per-head ``q, k, v`` ``(B, heads, N, d)`` of ``mixer`` on input ``x`` (no kernel scaling).

    Uses a fused ``qkv`` linear (softmax, Laplacian, Fibottention, timm ``Attention``) or SOFT's tied
    ``W_q`` (k = q) and ``W_v``.
    """
    heads = int(mixer.num_heads)
    b, n, c = x.shape
    if isinstance(getattr(mixer, "qkv", None), nn.Linear):
        project = getattr(mixer, "_project_qkv", mixer.qkv)     # a layer's own projection applies its value gain
        q, k, v = project(x).reshape(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        qn, kn = getattr(mixer, "q_norm", None), getattr(mixer, "k_norm", None)
        q = qn(q) if qn is not None else q
        k = kn(k) if kn is not None else k
        return q, k, v
    if isinstance(getattr(mixer, "W_q", None), nn.Linear):
        q = mixer.W_q(x).reshape(b, n, heads, -1).transpose(1, 2)
        v = mixer.W_v(x).reshape(b, n, heads, -1).transpose(1, 2)
        return q, q, v
    raise ValueError(f"{type(mixer).__name__} exposes no qkv / W_q projection to analyse")


def grid_of(model: nn.Module) -> Tuple[int, int, int]:
    """``(prefix, H, W)`` of a ViT-style model's token sequence."""
    embed = getattr(model, "patch_embed", None)
    grid = getattr(embed, "grid_size", None)
    if grid is None:
        raise ValueError(f"{type(model).__name__} has no patch_embed.grid_size; use an isotropic ViT model")
    return int(getattr(model, "num_prefix_tokens", 0) or 0), int(grid[0]), int(grid[1])


# ----------------------------------------------------------------------------------------- outputs
@dataclass
class AnalysisResult:
    """What one analysis produced: rows of its table, the figure path and a title."""

    name: str
    title: str
    rows: List[dict]
    figure: str
    notes: List[str]
    files: List[str]


def write_table(rows: Sequence[dict], out_dir: str, stem: str, title: str, notes: Sequence[str] = (),
                figure: Optional[str] = None, command: Optional[str] = None) -> List[str]:
    """Write ``rows`` as ``<stem>.csv``, ``<stem>.json`` and a ``<stem>.md`` table (with notes)."""
    os.makedirs(out_dir, exist_ok=True)
    cols = table_columns(rows)
    csv_path = write_csv(os.path.join(out_dir, f"{stem}.csv"), rows, cols)
    json_path = os.path.join(out_dir, f"{stem}.json")
    with open(json_path, "w") as fh:
        json.dump({"title": title, "command": command, "notes": list(notes), "rows": list(rows)}, fh, indent=1,
                  default=str)
    md_path = os.path.join(out_dir, f"{stem}.md")
    lines = [f"# {title}", ""]
    if command:
        lines += ["```", command, "```", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += [markdown_rows(rows, cols), ""]
    if figure:
        lines += [f"![{os.path.basename(figure)}]({os.path.basename(figure)})", ""]
    with open(md_path, "w") as fh:
        fh.write("\n".join(lines))
    return [csv_path, json_path, md_path]


def fmt(v) -> str:
    """A table cell: floats to 4 significant digits (scientific outside 1e-3..1e4), else ``str``."""
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0:
            return "0"
        if abs(v) >= 1e4 or abs(v) < 1e-3:
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def markdown_rows(rows: Sequence[dict], cols: Optional[Sequence[str]] = None) -> str:
    """``rows`` (dicts) as a markdown table of :func:`fmt` cells; ``cols`` defaults to the first row's keys."""
    if not rows:
        return "(no rows)"
    cols = list(cols or rows[0].keys())
    return markdown_table(cols, ([fmt(r.get(c, "")) for c in cols] for r in rows))


def pyplot():
    """matplotlib's pyplot with the Agg backend (no display needed); one-line error without the ``plot`` extra."""
    return _pyplot("`vitmix analyze`")


def save_figure(fig, out_dir: str, name: str) -> str:
    """Lay ``fig`` out (``tight_layout``), write it as ``out_dir/name`` at 110 dpi, close it; return the path."""
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


__all__ = ["load_images", "build_model", "copy_matching", "mixer_layers", "capture_mixer_inputs", "query_key_value",
           "grid_of", "write_table", "markdown_rows", "pyplot", "save_figure", "AnalysisResult", "SOURCES"]
