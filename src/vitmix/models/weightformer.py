"""WeightFormer: global visual modelling without attention, by dynamically predicted weights.

"Linear-Time Global Visual Modeling without Explicit Attention" (He, Han, Huang; arXiv 2605.01711),
official code LeapLabTHU/WeightFormer (``model/wfm.py``). Re-implemented here as a resolution-free
timm model; see ``docs/weightformer.md`` for the design choices and the differences to the official
code.

Architecture (isotropic, no attention, no position embedding, no CLS token)::

    patch-16 conv stem → LayerNorm → 17 blocks → LayerNorm → mean over tokens → Linear

Block ℓ is *dynamic* iff ``(ℓ + 2) % 3 == 0`` (ℓ = 1, 4, 7, 10, 13, 16), otherwise *static*:

* static:  ``x = x + DWConv3x3(x)``;               ``x = x + DropPath(MLP(LN2(x)))``
* dynamic: ``x = LN1(x)`` (overwrites the residual stream, official; ``norm_residual=False`` gives
  the pre-norm ``x = x + DynDWConv(LN1(x))`` instead); ``x = x + DynDWConv(x)``;
  ``x = x + DropPath(MLP(LN2(x)))`` with the MLP's first layer a :class:`DynamicLinear`.

Tokens stay ``(B, N, C)`` throughout; the depthwise convolutions read them through a channels-last
``(B, C, H, W)`` view, so no NCHW copies are made and the grid may be any ``H × W``.

Dense features (``docs/dense-features.md``): ``forward_intermediates`` gives any blocks' outputs as
``(B, C, H/p, W/p)`` maps, ``feature_info`` lists every block (stride ``p``), and
``features_only=True`` wraps the model in timm's ``FeatureGetterNet`` (last 3 blocks by default).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Dict, List, Optional, Set, Tuple, Union

import torch
from timm.layers import DropPath, PatchEmbed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import Tensor, nn

from ..mixers.presets import DEFAULT_PRESET, FROM_PRESET, resolve_preset
from ._blocks import (  # noqa: F401  (DynamicDepthwiseConv, DynamicLinear, is_dynamic_block: public here too)
    DynamicDepthwiseConv, DynamicLinear, WeightFormerMlp, check_tokens, grid_view, is_dynamic_block, to_tokens,
)
from ._builder import init_linear_and_norm, model_cfg, unwrap_checkpoint

__all__ = [
    "DynamicDepthwiseConv", "DynamicLinear", "WeightFormer", "WeightFormerBlock", "checkpoint_filter_fn",
    "is_dynamic_block",
]


class WeightFormerBlock(nn.Module):
    """One WeightFormer block, static or dynamic (see the module docstring for the equations).

    Args:
        dim: channels C. mlp_ratio: hidden width ratio of the MLP (4).
        dynamic: dynamic block (LN1 + :class:`DynamicDepthwiseConv` + :class:`DynamicLinear`).
        drop_path: stochastic depth on the MLP branch (the official code has none on the conv branch).
        proj_drop: dropout inside the MLP.
        norm_residual: dynamic blocks only — ``True`` (official) overwrites the residual stream with
            ``LN1(x)``; ``False`` uses the standard pre-norm branch ``x + DynDWConv(LN1(x))``.
        odd_pool, linear_path: passed to :class:`DynamicLinear`.

    ``forward(x (B, N, C), hw=(H, W))``; ``hw`` defaults to a square grid.
    """

    def __init__(self, dim: int, mlp_ratio: float = 4.0, dynamic: bool = False, drop_path: float = 0.0,
                 proj_drop: float = 0.0, norm_layer: Callable = partial(nn.LayerNorm, eps=1e-6),
                 act_layer: Callable = nn.GELU, norm_residual: bool = True, odd_pool: str = "ceil",
                 linear_path: str = "auto"):
        super().__init__()
        self.dynamic, self.norm_residual = dynamic, norm_residual
        if dynamic:
            self.norm1 = norm_layer(dim)
            self.dwconv = DynamicDepthwiseConv(dim, 3)
        else:
            self.norm1 = nn.Identity()
            self.dwconv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm2 = norm_layer(dim)
        self.mlp = WeightFormerMlp(dim, int(dim * mlp_ratio), dynamic, act_layer, proj_drop, odd_pool, linear_path)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor, hw: Optional[Tuple[int, int]] = None) -> Tensor:
        hw = check_tokens(x, hw)
        if self.dynamic and self.norm_residual:
            x = self.norm1(x)
            x = x + to_tokens(self.dwconv(grid_view(x, hw)))
        else:  # static blocks: norm1 is the identity
            x = x + to_tokens(self.dwconv(grid_view(self.norm1(x), hw)))
        return x + self.drop_path(self.mlp(self.norm2(x), hw))


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------
class WeightFormer(nn.Module):
    """WeightFormer backbone + classifier, a timm-style model for any input size divisible by the patch.

    Args:
        img_size: nominal input size (used for the default cfg and ``feature_info``; inputs of any
            size divisible by ``patch_size`` are accepted, square or not).
        patch_size: stem patch (16 for the ImageNet models).
        in_chans, num_classes: input channels and classes (``num_classes=0`` → no head).
        global_pool: ``"avg"`` (mean over tokens, official) or ``""`` (return tokens from the head).
        embed_dim, depth, mlp_ratio: width C, number of blocks (17), MLP ratio (4).
        drop_rate: dropout before the classifier. proj_drop_rate: dropout inside the MLPs (official 0).
        drop_path_rate: stochastic depth, linearly increasing over the blocks (MLP branch only).
        dynamic_every: block ℓ is dynamic iff ``(ℓ + 2) % dynamic_every == 0`` (official 3).
        norm_residual: official LayerNorm-overwrites-residual in dynamic blocks (default ``True``).
        preset: ``"default"`` or ``"official"`` (the official code's numerics where vitmix departs
            from them; values in :attr:`presets`, see ``docs/presets.md``). It sets ``odd_pool``
            unless that is passed explicitly.
        odd_pool: ``"ceil"`` (default preset) or ``"floor"`` (official preset) 2×2 pooling of odd
            grids in :class:`DynamicLinear`; identical on even grids (an ablation / reproduction
            switch: prefer ``preset``).
        linear_path: evaluation path of :class:`DynamicLinear` (``"auto"``).
        norm_layer, act_layer: LayerNorm (eps 1e-6) and GELU by default.
        mixer, mixer_options: accepted for API symmetry with vitmix's other models; WeightFormer has
            no attention to replace, so anything but ``None`` raises ``ValueError``.
    """

    #: option values of each ``preset``: the official code drops the last row/column of odd grids
    presets = {"default": dict(odd_pool="ceil"), "official": dict(odd_pool="floor")}

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = "avg", embed_dim: int = 192, depth: int = 17,
                 mlp_ratio: float = 4.0, drop_rate: float = 0.0, proj_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, dynamic_every: int = 3, norm_residual: bool = True,
                 preset: str = DEFAULT_PRESET, odd_pool: str = FROM_PRESET, linear_path: str = "auto",
                 norm_layer: Optional[Callable] = None, act_layer: Optional[Callable] = None, mixer=None,
                 mixer_options=None):
        super().__init__()
        if mixer is not None or mixer_options:
            raise ValueError("WeightFormer has no attention layer, so mixer=/mixer_options= cannot be used; "
                             "build it without them (or use a ViT such as vit_nano_patch4_32 to swap mixers)")
        if global_pool not in ("avg", ""):
            raise ValueError(f"global_pool must be 'avg' or '', got {global_pool!r}")
        odd_pool = resolve_preset("WeightFormer", self.presets, preset, odd_pool=odd_pool)["odd_pool"]
        self.preset = preset
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        act_layer = act_layer or nn.GELU
        self.num_classes, self.global_pool, self.in_chans = num_classes, global_pool, in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.patch_size = patch_size
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim, flatten=False, output_fmt="NHWC",
                                      strict_img_size=False)
        self.init_norm = norm_layer(embed_dim)
        dpr = [drop_path_rate * i / (depth - 1) if depth > 1 else 0.0 for i in range(depth)]  # linear decay rule
        self.blocks = nn.ModuleList([
            WeightFormerBlock(embed_dim, mlp_ratio, dynamic=is_dynamic_block(i, dynamic_every), drop_path=dpr[i],
                              proj_drop=proj_drop_rate, norm_layer=norm_layer, act_layer=act_layer,
                              norm_residual=norm_residual, odd_pool=odd_pool, linear_path=linear_path)
            for i in range(depth)])
        self.norm = norm_layer(embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        self.init_weights()

    def init_weights(self) -> None:
        """The official initialisation: every ``nn.Linear`` (head included) truncated normal std 0.02
        with zero bias, LayerNorms ones/zeros, dynamic-layer parameters as in their
        ``reset_parameters``; convolutions (stem, static DW convs, kernel predictors) keep PyTorch's
        default init."""
        init_linear_and_norm(self)
        for m in self.modules():
            if isinstance(m, (DynamicLinear, DynamicDepthwiseConv)):
                m.reset_parameters()

    # -- timm API ---------------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """Names of all 1-D parameters (biases, LayerNorm affine, dynamic-layer biases): the official
        recipe decays only matrices and kernels."""
        return {name for name, p in self.named_parameters() if p.ndim <= 1}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict:
        return dict(stem=r"^patch_embed|^init_norm", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the head with a fresh ``Linear(embed_dim, num_classes)`` (``0`` → identity)."""
        if global_pool is not None:
            if global_pool not in ("avg", ""):
                raise ValueError(f"global_pool must be 'avg' or '', got {global_pool!r}")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 4:
            raise ValueError(f"WeightFormer expects images (B, {self.in_chans}, H, W), got a {x.dim()}-D tensor "
                             f"of shape {tuple(x.shape)}" + (" (add a batch dim with x[None])" if x.dim() == 3 else ""))
        if x.shape[1] != self.in_chans:
            hint = ("; it looks channels-last (B, H, W, C): pass x.permute(0, 3, 1, 2)"
                    if x.shape[-1] == self.in_chans else "")
            raise ValueError(f"WeightFormer expects (B, {self.in_chans}, H, W) images, got shape "
                             f"{tuple(x.shape)}{hint}")
        H, W = x.shape[2:]
        p = self.patch_size
        if H % p or W % p or H == 0 or W == 0:
            raise ValueError(f"image size {H}x{W} is not a positive multiple of the patch size {p}; "
                             f"resize or crop to e.g. {max(p, H // p * p)}x{max(p, W // p * p)}")

    def forward_tokens(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Stem + blocks: ``(B, N, C)`` tokens (before the final norm) and the grid ``(H, W)``."""
        self._check_input(x)
        x = self.patch_embed(x)  # B, H, W, C
        hw = (x.shape[1], x.shape[2])
        x = self.init_norm(x.reshape(x.shape[0], hw[0] * hw[1], x.shape[3]))
        for blk in self.blocks:
            if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw)
        return x, hw

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``(B, in_chans, H, W)`` → normalised tokens ``(B, H/p · W/p, C)`` (row-major grid).

        Unlike the official ``forward_features`` (which returns the pooled vector) this follows timm:
        pooling happens in :meth:`forward_head`.
        """
        x, _ = self.forward_tokens(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Mean over tokens (``global_pool="avg"``), dropout and the linear head."""
        if self.global_pool == "avg":
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """Block outputs as dense maps, timm's ``forward_intermediates`` (as ``VisionTransformer``'s).

        Every block keeps the stem's grid, so all maps have stride ``patch_size`` and ``embed_dim``
        channels; the grid is ``H/p × W/p`` for any (non-square) input.

        Args:
            indices: the last ``n`` blocks if int, all blocks if ``None``, else the listed block indices.
            norm: apply the final LayerNorm to every returned map.
            stop_early: stop after the last requested block (the returned final features are then
                that block's, normalised).
            output_fmt: ``"NCHW"``, ``"NHWC"`` or ``"NLC"`` (tokens ``(B, H·W, C)``, row-major).
            intermediates_only: return only the list of maps.

        Returns:
            ``(forward_features(x), maps)``, or ``maps`` when ``intermediates_only``.
        """
        if output_fmt not in ("NCHW", "NHWC", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r} must be 'NCHW', 'NHWC' or 'NLC'")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self._check_input(x)
        x = self.patch_embed(x)  # B, H, W, C
        B, H, W, C = x.shape
        x = self.init_norm(x.reshape(B, H * W, C))
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        maps = []
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(blk, x, (H, W), use_reentrant=False)
            else:
                x = blk(x, (H, W))
            if i in take_indices:
                maps.append(_format_map(self.norm(x) if norm else x, (H, W), output_fmt))
        if intermediates_only:
            return maps
        return self.norm(x), maps

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last requested index (and the final norm / head if asked), as
        timm's ``features_only=True`` does; returns the kept indices."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


def _format_map(tokens: Tensor, hw: Tuple[int, int], output_fmt: str) -> Tensor:
    """``(B, H·W, C)`` tokens in ``output_fmt`` (``NLC`` unchanged, ``NHWC`` a view, ``NCHW`` contiguous)."""
    if output_fmt == "NLC":
        return tokens
    fmap = tokens.reshape(tokens.shape[0], hw[0], hw[1], tokens.shape[-1])
    return fmap if output_fmt == "NHWC" else fmap.permute(0, 3, 1, 2).contiguous()


# ----------------------------------------------------------------------------------------------
# official checkpoints
# ----------------------------------------------------------------------------------------------
_OFFICIAL_RENAMES = (
    (".dwc.wfm.", ".dwconv.predictor."), (".dwc.w", ".dwconv.weight"), (".dwc.b", ".dwconv.bias"),
    (".dwc.", ".dwconv."),
    (".linear1.wfm.", ".mlp.fc1.predictor."), (".linear1.w1", ".mlp.fc1.expand_in"),
    (".linear1.w2", ".mlp.fc1.expand_out"), (".linear1.w", ".mlp.fc1.weight"), (".linear1.b", ".mlp.fc1.bias"),
    (".linear1.", ".mlp.fc1."), (".linear2.", ".mlp.fc2."),
)


def checkpoint_filter_fn(state_dict: Dict[str, Tensor], model: Optional[WeightFormer] = None) -> Dict[str, Tensor]:
    """Convert an official LeapLabTHU/WeightFormer state dict (``blocks.1.linear1.w1`` ...) to vitmix
    names (``blocks.1.mlp.fc1.expand_in`` ...); timm's ``pretrained_filter_fn`` of the models.

    Accepts the official training checkpoint (weights under ``"model"``), a Hugging Face hub state
    dict (same names) or a bare state dict; shapes are the official ones (``DynLinear.w`` is
    ``(in, out)`` in both). Already-converted dicts pass unchanged."""
    state_dict = unwrap_checkpoint(state_dict)
    out = {}
    for key, value in state_dict.items():
        if key.startswith("blocks."):
            for old, new in _OFFICIAL_RENAMES:
                # exact-suffix renames for the raw parameters (".dwc.w" must not match ".dwc.wfm.")
                if old.endswith(".") and old in key:
                    key = key.replace(old, new)
                    break
                if key.endswith(old):
                    key = key[: -len(old)] + new
                    break
        out[key] = value
    return out


# ----------------------------------------------------------------------------------------------
# registered models
# ----------------------------------------------------------------------------------------------
_WF_CFG = dict(crop_pct=0.875, crop_mode="squash")  # official eval: square resize to 256, centre crop 224

default_cfgs = generate_default_cfgs({
    "weightformer_tiny.untrained": model_cfg(**_WF_CFG),
    "weightformer_small.untrained": model_cfg(**_WF_CFG),
    "weightformer_base.untrained": model_cfg(input_size=(3, 448, 448), **_WF_CFG),
    "weightformer_nano_patch4_32.untrained": model_cfg(
        input_size=(3, 32, 32), num_classes=10, crop_pct=1.0, interpolation="bilinear",
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
})


def _create_weightformer(variant: str, pretrained: bool = False, **kwargs) -> WeightFormer:
    if kwargs.get("mixer") is not None or kwargs.get("mixer_options"):
        raise ValueError(f"{variant} has no attention layer, so mixer=/mixer_options= cannot be used; "
                         "build it without them (WeightFormer mixes tokens with dynamic weights)")
    kwargs.pop("mixer", None)
    kwargs.pop("mixer_options", None)
    # features_only=True: timm's FeatureGetterNet over forward_intermediates, the last 3 blocks by
    # default (as timm's isotropic ViTs), every map at stride patch_size
    return build_model_with_cfg(WeightFormer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
                                feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs)


@register_model
def weightformer_tiny(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-T: C=192, 17 blocks (6 dynamic), patch 16, 224² — 7,074,184 params (1000 classes)."""
    args = dict(img_size=224, patch_size=16, embed_dim=192, depth=17, mlp_ratio=4.0)
    return _create_weightformer("weightformer_tiny", pretrained, **dict(args, **kwargs))


@register_model
def weightformer_small(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-S: C=384, 17 blocks (6 dynamic), patch 16, 224² — 27,492,136 params.

    The official recipe trains it with ``drop_path_rate=0.2``."""
    args = dict(img_size=224, patch_size=16, embed_dim=384, depth=17, mlp_ratio=4.0)
    return _create_weightformer("weightformer_small", pretrained, **dict(args, **kwargs))


@register_model
def weightformer_base(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-B: the S architecture (C=384, 17 blocks) at 448², as in the official code —
    27,492,136 params. The official recipe trains it with ``drop_path_rate=0.2``."""
    args = dict(img_size=448, patch_size=16, embed_dim=384, depth=17, mlp_ratio=4.0)
    return _create_weightformer("weightformer_base", pretrained, **dict(args, **kwargs))


@register_model
def weightformer_nano_patch4_32(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-Nano for 32×32 images (digits, CIFAR): patch 4 (8×8 grid), C=128, 8 blocks
    (dynamic at 1, 4, 7), MLP ratio 4, 10 classes — vitmix's own small configuration."""
    args = dict(img_size=32, patch_size=4, embed_dim=128, depth=8, mlp_ratio=4.0, num_classes=10)
    return _create_weightformer("weightformer_nano_patch4_32", pretrained, **dict(args, **kwargs))


# WeightFormer-Nano for dense prediction on a CPU (fashion-scenes at 128²–256², docs/dense.md): a quarter
# of Tiny's width, 6 blocks (dynamic at 1 and 4), patch 8 so a 128² scene is a 16×16 grid. vitmix's sizing.
default_cfgs.update(generate_default_cfgs({"weightformer_nano.untrained": model_cfg(
    input_size=(3, 128, 128), num_classes=10, **_WF_CFG)}))


@register_model
def weightformer_nano(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-Nano: C=48, 6 blocks (dynamic at 1, 4), patch 8, 128², 10 classes (dense backbone)."""
    args = dict(img_size=128, patch_size=8, embed_dim=48, depth=6, mlp_ratio=4.0, num_classes=10)
    return _create_weightformer("weightformer_nano", pretrained, **dict(args, **kwargs))
