"""Shared pieces of the ``vitmix analyze`` subcommands: real images, models, activations, outputs."""
from __future__ import annotations

import csv
import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
SOURCES = ("auto", "digits", "fashion-mnist")


# ------------------------------------------------------------------------------------------ images
def _read_idx_images(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if int.from_bytes(data[:4], "big") != 0x00000803:
        raise ValueError(f"{path} is not an IDX image file (bad magic number)")
    n, h, w = (int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(3))
    return np.frombuffer(data, dtype=np.uint8, offset=16)[: n * h * w].reshape(n, h, w)


def _fashion_file(root: str) -> Optional[Path]:
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte", "train-images-idx3-ubyte.gz",
                 "train-images-idx3-ubyte"):
        p = Path(root) / name
        if p.is_file():
            return p
    return None


def load_images(n: int = 8, size: int = 32, source: str = "auto", seed: int = 0,
                fashion_dir: str = FASHION_DIR) -> Tuple[torch.Tensor, str]:
    """``n`` real grey images as a ``(n, 3, size, size)`` float tensor normalised to mean 0 / std 1.

    ``source``: ``"digits"`` (scikit-learn's bundled 8×8 digits), ``"fashion-mnist"`` (28×28 IDX
    files under ``fashion_dir``, Debian package ``dataset-fashion-mnist``) or ``"auto"``
    (Fashion-MNIST when present, else digits). Images are resized bilinearly to ``size``.
    Returns ``(images, description)``.
    """
    if source not in SOURCES:
        from ..mixers.base import close_matches

        raise ValueError(f"unknown image source {source!r}." + close_matches(source, SOURCES)
                         + f" Choose from {', '.join(SOURCES)}")
    if n <= 0 or size <= 0:
        raise ValueError(f"need a positive number of images and size, got n={n}, size={size}")
    path = _fashion_file(fashion_dir)
    if source == "fashion-mnist" and path is None:
        raise FileNotFoundError(f"no Fashion-MNIST IDX files under {fashion_dir}; install the Debian package "
                                "dataset-fashion-mnist or use --source digits")
    rng = np.random.default_rng(seed)
    if source != "digits" and path is not None:
        arr = _read_idx_images(path).astype(np.float32) / 255.0
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


# ------------------------------------------------------------------------------------------ models
def build_model(name: str, img_size: int, mixer: Optional[str] = None, mixer_options: Optional[dict] = None,
                checkpoint: Optional[str] = None, seed: int = 0) -> nn.Module:
    """``vitmix.create_model`` in eval mode, optionally with weights from ``checkpoint``."""
    from ..models import create_model

    torch.manual_seed(seed)
    model = create_model(name, img_size=img_size, mixer=mixer, mixer_options=mixer_options)
    if checkpoint:
        state = load_checkpoint_state(checkpoint)
        own = model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        shapes = sorted(k for k in own if k in state and own[k].shape != state[k].shape)
        # a different classifier head does not change the attention layers this analysis reads
        bad = [k for k in missing + unexpected + shapes if not k.startswith("head.")]
        if bad:
            raise ValueError(f"checkpoint {checkpoint} does not match model {name!r}: {len(missing)} missing, "
                             f"{len(unexpected)} unexpected, {len(shapes)} differently shaped keys (e.g. {bad[0]}); "
                             "pass the --model (and --img-size) the checkpoint was trained with")
        model.load_state_dict({k: v for k, v in state.items() if k in own and k not in shapes}, strict=False)
    return model.eval()


def load_checkpoint_state(path: str) -> Dict[str, torch.Tensor]:
    """A state dict from a vitmix safetensors checkpoint or a torch ``.pt/.pth`` file (read with
    ``weights_only=True``); unreadable files are a one-line ``ValueError``."""
    from ..train.checkpoint import load_state, load_weights

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if p.suffix == ".safetensors":
        return load_weights(p)[0]
    obj = load_state(p)
    for key in ("model", "state_dict", "model_state_dict", "model_state"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds no state dict")
    return {k.removeprefix("module."): v for k, v in obj.items() if isinstance(v, torch.Tensor)}


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
        model(images)
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
        q, k, v = mixer.qkv(x).reshape(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
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
    cols: List[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    csv_path = os.path.join(out_dir, f"{stem}.csv")
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)
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
    if not rows:
        return "(no rows)"
    cols = list(cols or rows[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


__all__ = ["load_images", "build_model", "load_checkpoint_state", "mixer_layers", "capture_mixer_inputs",
           "query_key_value", "grid_of", "write_table", "markdown_rows", "pyplot", "AnalysisResult", "SOURCES"]
