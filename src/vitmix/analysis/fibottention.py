"""Fibottention analysis: how sparse each head is, how much heads overlap, how diverse they are.

Three groups of helpers, used by ``vitmix analyze heads``:

- **interaction fraction** — the share of token pairs each head computes, per head and layer,
  over the patch block only (the paper's "~2 %") and with the prefix (CLS) row and column:
  :func:`interaction_fractions` (offset sets) and :func:`model_interaction_table` (a model).
- **overlap between heads' offset sets** — :func:`offset_overlap` (Jaccard of offset sets, or of
  the token pairs they cover); Wythoff rows are disjoint, so the default variant has zero overlap.
- **head diversity on real activations** — :func:`capture_head_outputs` records every attention
  layer's per-head outputs (the input of its output projection) for a batch;
  :func:`head_similarity` turns one layer's ``(B, N, H, d)`` outputs into an ``(H, H)`` matrix of
  linear CKA or cosine similarity; :func:`model_head_diversity` does both for a whole model
  (diversity = 1 − mean off-diagonal similarity). Works for any timm-style attention that has a
  ``proj`` linear layer (softmax, every vitmix mixer, timm ``Attention``), so Fibottention can be
  compared with dense ViTs.

All functions return plain Python numbers / small tensors; nothing here needs a GPU.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..ops.fibonacci import check_offsets, interaction_fraction

__all__ = [
    "interaction_fractions", "fibottention_layers", "model_interaction_table", "offset_overlap",
    "capture_head_outputs", "head_similarity", "model_head_diversity",
]


def interaction_fractions(offsets: Sequence[Sequence[int]], num_tokens: int, num_prefix_tokens: int = 1) -> Dict:
    """Interaction fraction of each head of one layer.

    Args:
        offsets: per-head offset sets (e.g. from :func:`vitmix.ops.fibonacci.fibonacci_offsets`).
        num_tokens: patch tokens ``N``.
        num_prefix_tokens: CLS/register tokens counted in the "with prefix" figure.

    Returns:
        ``{"patch": [H floats], "with_prefix": [H floats], "patch_mean": float,
        "with_prefix_mean": float}`` — fractions of the ``N × N`` patch block and of the full
        ``(P+N) × (P+N)`` matrix that each head computes (0..1).
    """
    patch = interaction_fraction(offsets, num_tokens, 0)
    full = interaction_fraction(offsets, num_tokens, num_prefix_tokens)
    return {"patch": patch, "with_prefix": full, "patch_mean": sum(patch) / len(patch),
            "with_prefix_mean": sum(full) / len(full)}


def fibottention_layers(model: nn.Module) -> List[nn.Module]:
    """The Fibottention mixers inside ``model``, in module (= block) order."""
    from ..mixers.fibottention import FibottentionAttention

    return [m for m in model.modules() if isinstance(m, FibottentionAttention)]


def model_interaction_table(model: nn.Module, num_tokens: int,
                            num_prefix_tokens: Optional[int] = None) -> List[Dict]:
    """One row per (layer, head) of every Fibottention layer of ``model`` at ``num_tokens`` patches.

    ``num_prefix_tokens`` defaults to ``model.num_prefix_tokens`` (1 for a CLS ViT). Rows:
    ``{"layer", "head", "offsets", "patch_fraction", "with_prefix_fraction"}``; layers are the
    mixers' ``layer_idx`` (see :func:`vitmix.mixers.fibottention.assign_layer_indices`).
    """
    if num_prefix_tokens is None:
        num_prefix_tokens = int(getattr(model, "num_prefix_tokens", 1))
    rows = []
    for pos, layer in enumerate(fibottention_layers(model)):
        offsets = layer.head_offsets(num_tokens)
        fr = interaction_fractions(offsets, num_tokens, num_prefix_tokens)
        idx = layer.layer_idx if layer.layer_idx is not None else pos
        for h, offs in enumerate(offsets):
            rows.append({"layer": idx, "head": h, "offsets": tuple(offs), "patch_fraction": fr["patch"][h],
                         "with_prefix_fraction": fr["with_prefix"][h]})
    return rows


def offset_overlap(offsets: Sequence[Sequence[int]], num_tokens: Optional[int] = None,
                   by: str = "offsets") -> torch.Tensor:
    """``(H, H)`` Jaccard overlap between the heads of one layer (diagonal = 1).

    ``by="offsets"``: ``|F_a ∩ F_b| / |F_a ∪ F_b|`` of the offset sets. ``by="pairs"``: the same
    over the token pairs they cover (an offset ``d`` covers ``2(N - d)`` pairs, ``N`` for ``d = 0``),
    which needs ``num_tokens`` and weights short offsets more.
    """
    if by not in ("offsets", "pairs"):
        raise ValueError(f"by must be 'offsets' or 'pairs', got {by!r}")
    if by == "pairs":
        if num_tokens is None:
            raise ValueError("offset_overlap(by='pairs') needs num_tokens")
        sets = [set(o) for o in check_offsets(offsets, num_tokens)]

        def weight(ds):
            return float(sum(num_tokens if d == 0 else 2 * (num_tokens - d) for d in ds))
    else:
        sets = [set(int(d) for d in o) for o in offsets]

        def weight(ds):
            return float(len(ds))
    h = len(sets)
    out = torch.ones(h, h, dtype=torch.float64)
    for a in range(h):
        for b in range(a + 1, h):
            union = weight(sets[a] | sets[b])
            out[a, b] = out[b, a] = weight(sets[a] & sets[b]) / union if union else 1.0
    return out


def _heads_of(module: nn.Module) -> int:
    for name in ("num_heads", "heads"):
        if isinstance(getattr(module, name, None), int):
            return getattr(module, name)
    raise ValueError(f"cannot tell the number of heads of {type(module).__name__}")


@torch.no_grad()
def capture_head_outputs(model: nn.Module, x: torch.Tensor,
                         layers: Optional[Sequence[nn.Module]] = None) -> List[torch.Tensor]:
    """Run ``model(x)`` once and return each attention layer's per-head outputs ``(B, N, H, d)``.

    The per-head output is the input of the layer's output projection ``proj`` (concatenated heads,
    before projection), recorded with a forward pre-hook. ``layers`` defaults to every module that
    has a ``proj`` ``nn.Linear`` and a ``num_heads`` attribute (timm ``Attention`` and vitmix mixers),
    in module order. Runs in eval mode and restores the previous mode.
    """
    if layers is None:
        layers = [m for m in model.modules()
                  if isinstance(getattr(m, "proj", None), nn.Linear) and isinstance(getattr(m, "num_heads", None), int)]
    if not layers:
        raise ValueError("no attention layers with a `proj` Linear and `num_heads` found in the model")
    captured: List[Optional[torch.Tensor]] = [None] * len(layers)
    handles = []
    for i, layer in enumerate(layers):
        heads = _heads_of(layer)

        def hook(mod, args, i=i, heads=heads):
            t = args[0]
            captured[i] = t.detach().reshape(*t.shape[:-1], heads, t.shape[-1] // heads).float().cpu()

        handles.append(layer.proj.register_forward_pre_hook(hook))
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        model.train(was_training)
        for hd in handles:
            hd.remove()
    return [c for c in captured if c is not None]


def head_similarity(head_out: torch.Tensor, measure: str = "cka") -> torch.Tensor:
    """``(H, H)`` similarity between the heads of one layer from outputs ``(B, N, H, d)``.

    ``measure="cka"``: linear CKA (Kornblith et al. 2019) between the heads' ``(B·N, d)`` feature
    matrices, centred over samples: ``‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)``, invariant to rotations and
    scale of each head's features. ``measure="cosine"``: cosine similarity of the flattened
    ``B·N·d`` outputs. Computed in float64; a constant (all-zero) head gets similarity 0 to others.
    """
    if head_out.dim() != 4:
        raise ValueError(f"head outputs must be (B, N, H, d), got shape {tuple(head_out.shape)}")
    b, n, h, d = head_out.shape
    feats = head_out.detach().to(torch.float64).permute(2, 0, 1, 3).reshape(h, b * n, d)
    if measure == "cka":
        feats = feats - feats.mean(dim=1, keepdim=True)
        cross = torch.einsum("asd,bse->abde", feats, feats)  # (H, H, d, d) = X_aᵀ X_b
        hsic = cross.pow(2).sum(dim=(-1, -2))
        norms = hsic.diagonal().sqrt()
        denom = norms[:, None] * norms[None, :]
        sim = torch.where(denom > 0, hsic / denom.clamp_min(1e-300), torch.zeros_like(hsic))
    elif measure == "cosine":
        flat = feats.reshape(h, -1)
        norms = flat.norm(dim=1)
        denom = norms[:, None] * norms[None, :]
        sim = torch.where(denom > 0, (flat @ flat.T) / denom.clamp_min(1e-300), torch.zeros(h, h, dtype=flat.dtype))
    else:
        raise ValueError(f"unknown similarity measure {measure!r}; choose 'cka' or 'cosine'")
    sim = (sim + sim.T) / 2  # exactly symmetric despite rounding
    sim.diagonal().fill_(1.0)
    return sim


def _mean_off_diagonal(sim: torch.Tensor) -> float:
    h = sim.shape[0]
    if h < 2:
        return float("nan")
    return float((sim.sum() - sim.diagonal().sum()) / (h * (h - 1)))


def model_head_diversity(model: nn.Module, x: torch.Tensor, measure: str = "cka") -> List[Dict]:
    """Head similarity and diversity of every attention layer of ``model`` on the batch ``x``.

    Returns one dict per layer: ``{"layer": i, "similarity": (H, H) tensor, "mean_similarity":
    float, "diversity": 1 - mean_similarity}`` (mean over distinct head pairs). Higher diversity
    means the heads produce less redundant features.
    """
    out = []
    for i, heads in enumerate(capture_head_outputs(model, x)):
        sim = head_similarity(heads, measure)
        mean = _mean_off_diagonal(sim)
        out.append({"layer": i, "similarity": sim, "mean_similarity": mean, "diversity": 1.0 - mean})
    return out
