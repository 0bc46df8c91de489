"""What a ``vitmix bench --spec`` case times, one builder per case kind.

* ``layer``: one mixer layer on ``batch × (prefix + tokens) × dim`` (timm's ViT init); the entry ``floor``
  is instead the layer's own qkv and output linears, the cost no attention layer of that width can go below;
* ``op``: the token-mixing op alone (q, k, v → output, no projections): ``laplacian`` and ``soft``
  (Nyström with pooled landmarks) or ``sdpa``;
* ``model``: a model built with the entry's mixer, on a batch of images;
* ``train_step``: one AdamW step of that model (forward, loss, backward, update) on a batch.

Every builder returns a :class:`Built`: the call to time, and what it runs on (for peak memory).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

from .._util import close_matches
from .points import token_grid
from .targets import parse_mixer_spec

FLOOR = "floor"
KINDS = ("layer", "op", "model", "train_step")


@dataclass
class Built:
    """The call to time, the objects that exist before it (tracked for peak memory), and the items
    (tokens or images) one call processes."""

    call: Callable[[], object]
    holds: List[object]
    items: int
    unit: str


class Floor(nn.Module):
    """The projections every attention layer of width ``dim`` has: qkv, then the output linear."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(self.qkv(x)[..., :self.dim])


def _pooled(x: torch.Tensor, hw: Tuple[int, int], m: int) -> torch.Tensor:
    from ..ops import avg_pool_landmarks

    side = math.isqrt(m)
    return avg_pool_landmarks(x, hw, (side, side))


def _op_laplacian(q, k, v, hw, landmarks=49, **options):
    from ..ops import nystrom_attention

    return nystrom_attention(q, k, v, _pooled(q, hw, landmarks), _pooled(k, hw, landmarks), kernel="laplacian",
                             **options)


def _op_soft(q, k, v, hw, landmarks=49, **options):
    from ..ops import nystrom_attention

    lm = _pooled(q, hw, landmarks)  # SOFT ties q = k
    return nystrom_attention(q, q, v, lm, lm, kernel="gaussian", **options)


def _op_sdpa(q, k, v, hw):
    return nn.functional.scaled_dot_product_attention(q, k, v)


#: op name → (function, the options it accepts); ``landmarks`` is m, a square number of pooled landmarks
OPS: Dict[str, Tuple[Callable, Tuple[str, ...]]] = {
    "laplacian": (_op_laplacian, ("landmarks", "lam", "iters", "eps", "inverse", "normalization", "norm_eps")),
    "soft": (_op_soft, ("landmarks", "iters", "eps", "inverse")),
    "sdpa": (_op_sdpa, ()),
}


def check_entry(kind: str, spec: str) -> None:
    """``ValueError`` (with close matches) for an entry a case of ``kind`` cannot build."""
    target = parse_mixer_spec(spec)
    if kind == "op":
        if target.name not in OPS:
            raise ValueError(f"unknown op {target.name!r}." + close_matches(target.name, OPS)
                             + f" Ops: {', '.join(OPS)}")
        accepted = OPS[target.name][1]
        for key in target.options:
            if key not in accepted:
                raise ValueError(f"op {target.name!r} has no option {key!r}." + close_matches(key, accepted)
                                 + f" Options: {', '.join(accepted) or 'none'}")
        m = target.options.get("landmarks", 49)
        if not isinstance(m, int) or m < 1 or math.isqrt(m) ** 2 != m:
            raise ValueError(f"op entry {spec!r}: landmarks must be a square number (pooled to a square grid)")
        return
    if target.name == FLOOR:
        if kind != "layer" or target.options:
            raise ValueError(f"entry {spec!r}: 'floor' (the qkv + output linears) is an entry of layer cases only, "
                             "without options")
        return
    from ..mixers import get_mixer_class

    cls = get_mixer_class(target.name)  # ValueError with close matches
    for key in target.options:
        if key not in cls.option_names():
            raise ValueError(f"mixer {target.name!r} has no option {key!r}."
                             + close_matches(key, cls.option_names()) + f" Options: {', '.join(cls.option_names())}")


def _init_like_vit(module: nn.Module) -> nn.Module:
    for m in module.modules():  # timm's ViT init: trunc-normal(.02) linears, as the layer has in a model
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
    return module


def _module_call(module: nn.Module, inputs: Tuple[torch.Tensor, ...], pass_name: str) -> Callable[[], object]:
    """Forward under ``no_grad``, or forward + backward (input gradients too) leaving no gradient behind."""
    if pass_name == "fwd":
        module.eval()

        def fwd():
            with torch.no_grad():
                return module(*inputs)
        return fwd
    module.train()

    def fwd_bwd():
        module(*inputs).float().sum().backward()
        module.zero_grad(set_to_none=True)
        for x in inputs:
            x.grad = None
    return fwd_bwd


class _Op(nn.Module):
    def __init__(self, fn, hw, options):
        super().__init__()
        self.fn, self.hw, self.options = fn, hw, options

    def forward(self, q, k, v):
        return self.fn(q, k, v, self.hw, **self.options)


def build(case: dict, entry: str, tokens: int, pass_name: str, device) -> Built:
    """The call of ``entry`` in ``case`` at ``tokens`` grid tokens (layer and op cases) for ``pass_name``."""
    kind, batch = case["kind"], case.get("batch", 1)
    target = parse_mixer_spec(entry)
    if kind in ("layer", "op"):
        hw, n = token_grid(tokens), case.get("prefix", 0) + tokens
        grad = pass_name == "fwd+bwd"
        if kind == "layer":
            dim = case["dim"]
            if target.name == FLOOR:
                module = Floor(dim)
            else:
                from ..mixers import create

                module = create(target.name, dim, case["heads"], hw=hw, num_prefix_tokens=case.get("prefix", 0),
                                **{**case.get("layer_options", {}), **target.options})
            module = _init_like_vit(module).to(device)
            inputs = (torch.randn(batch, n, dim, device=device, requires_grad=grad),)
        else:
            heads, head_dim = case["heads"], case["dim"] // case["heads"]
            module = _Op(OPS[target.name][0], hw, target.options)
            shape = (batch, heads, n, head_dim)
            # q, k at the scale a trained layer feeds the kernels; v as is
            inputs = tuple((torch.randn(shape, device=device) * s).requires_grad_(grad)
                           for s in (head_dim ** -0.5, head_dim ** -0.5, 1.0))
        return Built(_module_call(module, inputs, pass_name), [module, *inputs], batch * n, "tokens/s")
    from ..models import create_model

    model = create_model(case["model"], mixer=target.name, mixer_options=target.options,
                         **case.get("model_options", {})).to(device)
    images = torch.randn(batch, *_image_shape(model, case), device=device)
    if kind == "model":
        return Built(_module_call(model, (images,), pass_name), [model, images], batch, "img/s")
    return Built(_train_step(model, images), [model, images], batch, "img/s")


def _image_shape(model: nn.Module, case: dict) -> Tuple[int, int, int]:
    options = case.get("model_options", {})
    embed = getattr(model, "patch_embed", None)
    proj = getattr(embed, "proj", None)
    chans = options.get("in_chans") or (proj.in_channels if isinstance(proj, nn.Conv2d) else 3)
    size = options.get("img_size") or getattr(embed, "img_size", None) or 224
    h, w = (size, size) if isinstance(size, int) else size
    return chans, h, w


def _train_step(model: nn.Module, images: torch.Tensor) -> Callable[[], object]:
    """One AdamW step on random labels: what a training step of the model costs."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    labels = torch.randint(0, model.num_classes, (images.shape[0],), device=images.device)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()
    return step


__all__ = ["Built", "FLOOR", "Floor", "KINDS", "OPS", "build", "check_entry"]
