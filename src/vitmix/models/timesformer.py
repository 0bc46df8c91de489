"""TimeSformer-style video transformers (divided space–time attention) with any vitmix mixer.

Bertasius et al., "Is Space-Time Attention All You Need for Video Understanding?" (ICML 2021),
divided attention: each block first mixes every spatial location across the ``T`` frames
(temporal attention, a 1-D sequence of ``T`` tokens, no CLS), then the patches of each frame with
that frame's copy of the CLS token (spatial attention; the ``T`` CLS outputs are averaged), then
an MLP. Built from timm parts: ``PatchEmbed`` (per frame), ``Mlp``, ``DropPath``,
``trunc_normal_``, ``LayerNorm``; each attention is a vitmix mixer class (``timm_attn``), chosen by
``mixer`` / ``mixer_options`` for space and ``time_mixer`` / ``time_mixer_options`` for time (the
temporal ones default to the spatial ones). Every mixer call is given its grid explicitly —
``(1, T)`` without prefix for time, the patch grid after one CLS token for space — so a model-wide
``set_token_grid`` cannot confuse the two.

Input ``(B, C, T, H, W)``; the patch tokens are laid out frame by frame (``t·N + n``).
``timesformer_*_fibottention`` use Fibottention in both attentions with the ``"modified"``
Wythoff variant of the paper's video code (more local offsets, offset 0 in one head), whose
windows are clipped to the ``T`` frames (see :func:`vitmix.ops.fibonacci.head_offsets`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from timm.layers import DropPath, Mlp, PatchEmbed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from ..mixers import number_layers
from ._builder import init_linear_and_norm, mixer_attn_layer, model_cfg

__all__ = ["TimeSformer", "DividedSpaceTimeBlock", "is_video_model"]

# timm checks a 3-entry input_size (C, H, W); the frame count is the model's num_frames
_CLIP = dict(input_size=(3, 32, 32), num_classes=4, crop_pct=1.0, interpolation="bilinear",
             mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

default_cfgs = generate_default_cfgs({
    "timesformer_tiny.untrained": model_cfg(**_CLIP),
    "timesformer_tiny_fibottention.untrained": model_cfg(**_CLIP),
})


def sincos_table(length: int, dim: int) -> torch.Tensor:
    """The Transformer's 1-D sin-cos position table ``(length, dim)``: ``sin(t·ω_i)`` in the first half of the
    channels, ``cos(t·ω_i)`` in the second, ``ω_i = 10000^(-i / (dim/2))``; odd ``dim`` gets a zero last channel."""
    half = dim // 2
    omega = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / max(half, 1))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None]
    table = torch.cat([angles.sin(), angles.cos(), torch.zeros(length, dim - 2 * half, dtype=torch.float64)], dim=1)
    return table.float()


def _temporal_options(mixer: Optional[str], mixer_options: Optional[dict], time_mixer: Optional[str],
                      time_mixer_options: Optional[dict]) -> dict:
    """The temporal mixer's options: given ones, else the spatial mixer's when it is the same mixer. Mixers
    that pool 2-D landmark cells (soft, soft_norm, laplacian: ``landmark_stride`` 2 by default) get stride 1
    unless it is given: a ``1×T`` grid has no 2×2 cells, so every frame is its own landmark."""
    from ..mixers import get_mixer_class

    if time_mixer_options is None and time_mixer in (None, mixer):
        time_mixer_options = mixer_options
    options = dict(time_mixer_options or {})
    if "landmark_stride" in get_mixer_class(time_mixer or mixer or "softmax").option_names():
        options.setdefault("landmark_stride", 1)
    return options


class DividedSpaceTimeBlock(nn.Module):
    """One TimeSformer block: temporal attention (+ ``temporal_fc``), spatial attention, MLP, each a
    pre-norm residual branch. ``x``: ``(B, 1 + T·N, C)`` with the CLS token first."""

    def __init__(self, dim: int, num_heads: int, num_frames: int, grid: Tuple[int, int], *, space_attn: type,
                 time_attn: type, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop_path: float = 0.0,
                 proj_drop: float = 0.0, norm_layer: type = nn.LayerNorm):
        super().__init__()
        self.num_frames, self.grid = num_frames, tuple(grid)
        self.temporal_norm1 = norm_layer(dim)
        # grids fixed at construction (and passed per call): Linformer builds its projections for them
        self.temporal_attn = time_attn(dim, num_heads, qkv_bias=qkv_bias, proj_drop=proj_drop,
                                       hw=(1, num_frames), num_prefix_tokens=0)
        self.temporal_fc = nn.Linear(dim, dim)
        self.norm1 = norm_layer(dim)
        self.attn = space_attn(dim, num_heads, qkv_bias=qkv_bias, proj_drop=proj_drop, hw=self.grid,
                               num_prefix_tokens=1)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)

    def temporal(self, patches: torch.Tensor) -> torch.Tensor:
        """``(B, T·N, C)`` → the temporal branch: each location's ``T`` tokens mixed with each other."""
        b, _, c = patches.shape
        t, n = self.num_frames, self.grid[0] * self.grid[1]
        seq = patches.reshape(b, t, n, c).transpose(1, 2).reshape(b * n, t, c)
        out = self.temporal_attn(self.temporal_norm1(seq), hw=(1, t), num_prefix_tokens=0)
        return self.temporal_fc(out).reshape(b, n, t, c).transpose(1, 2).reshape(b, t * n, c)

    def spatial(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 1 + T·N, C)`` → the spatial branch: per frame, its patches and a copy of the CLS token;
        the frames' CLS outputs are averaged into one."""
        b, _, c = x.shape
        t, n = self.num_frames, self.grid[0] * self.grid[1]
        cls = x[:, :1].expand(b, t, c).reshape(b * t, 1, c)
        frames = torch.cat([cls, x[:, 1:].reshape(b * t, n, c)], dim=1)
        out = self.attn(self.norm1(frames), hw=self.grid, num_prefix_tokens=1)
        cls_out = out[:, 0].reshape(b, t, c).mean(dim=1, keepdim=True)
        return torch.cat([cls_out, out[:, 1:].reshape(b, t * n, c)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x[:, 1:] + self.drop_path(self.temporal(x[:, 1:]))
        x = torch.cat([x[:, :1], patches], dim=1)
        x = x + self.drop_path(self.spatial(x))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class TimeSformer(nn.Module):
    """Divided space–time video transformer on clips ``(B, C, T, H, W)`` (module docstring).

    Args:
        img_size, patch_size, in_chans, num_frames: the clip geometry (``H = W = img_size``, or a pair).
        num_classes, embed_dim, depth, num_heads, mlp_ratio, qkv_bias, drop_rate, drop_path_rate: as in
            timm's ``VisionTransformer``.
        mixer, mixer_options: the spatial attention (a vitmix mixer name; default ``"softmax"``).
        time_mixer, time_mixer_options: the temporal attention (default: the spatial mixer and options).
        global_pool: ``"token"`` (the CLS token, as TimeSformer) or ``"avg"`` (mean of the patch tokens).
        time_embed_init: ``"sincos"`` (default): the learned time embedding starts as the 1-D sin-cos
            table, ``"zeros"``: at 0, as in the TimeSformer code (which starts from ImageNet weights). It is
            the only thing that tells frames apart — both attentions and the CLS average are equivariant
            to the frame order — so from scratch a tiny start leaves the model blind to the direction of
            time for long (``docs/video.md`` has the measurement).
    """

    #: the blocks give every mixer its own grid; ``vitmix.create_model`` must not set one model-wide grid
    binds_own_token_grid = True

    def __init__(self, img_size=32, patch_size=4, in_chans=3, num_frames=8, num_classes=4, embed_dim=192,
                 depth=4, num_heads=3, mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0, drop_path_rate=0.0,
                 mixer: Optional[str] = None, mixer_options: Optional[dict] = None, time_mixer: Optional[str] = None,
                 time_mixer_options: Optional[dict] = None, global_pool: str = "token",
                 time_embed_init: str = "sincos"):
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool={global_pool!r}: choose 'token' or 'avg'")
        if time_embed_init not in ("sincos", "zeros"):
            raise ValueError(f"time_embed_init={time_embed_init!r}: choose 'sincos' or 'zeros'")
        self.time_embed_init = time_embed_init
        if int(num_frames) < 1:
            raise ValueError(f"num_frames={num_frames} must be a positive integer")
        self.num_classes, self.num_frames, self.global_pool = num_classes, int(num_frames), global_pool
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.in_chans, self.img_size = in_chans, tuple(self.patch_embed.img_size)
        grid, n = tuple(self.patch_embed.grid_size), self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + n, embed_dim))
        self.time_embed = nn.Parameter(torch.zeros(1, self.num_frames, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        space = mixer_attn_layer(mixer, mixer_options)
        time = mixer_attn_layer(time_mixer or mixer, _temporal_options(mixer, mixer_options, time_mixer,
                                                                       time_mixer_options))
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.Sequential(*[
            DividedSpaceTimeBlock(embed_dim, num_heads, self.num_frames, grid, space_attn=space, time_attn=time,
                                  mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop_path=rates[i], proj_drop=drop_rate)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        """ViT init (truncated normal 0.02 for the linears and embeddings); the ``temporal_fc`` of every
        block after the first starts at 0, as in the TimeSformer code; ``time_embed`` per
        ``time_embed_init`` (see the class docstring)."""
        init_linear_and_norm(self)
        if self.time_embed_init == "sincos":
            with torch.no_grad():
                self.time_embed.copy_(sincos_table(self.num_frames, self.embed_dim)[None])
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        for block in list(self.blocks)[1:]:
            nn.init.zeros_(block.temporal_fc.weight)
            nn.init.zeros_(block.temporal_fc.bias)

    @torch.jit.ignore
    def no_weight_decay(self):
        return {"pos_embed", "cls_token", "time_embed"}

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def example_inputs(self, batch_size: int = 1, generator: Optional[torch.Generator] = None):
        """One random clip batch ``(B, C, T, H, W)`` for this model (listing, export, compile tests)."""
        return (torch.randn(batch_size, self.in_chans, self.num_frames, *self.img_size, generator=generator),)

    def _check_clip(self, x: torch.Tensor) -> None:
        want = (self.in_chans, self.num_frames, *self.img_size)
        if x.dim() != 5 or tuple(x.shape[1:]) != want:
            raise ValueError(f"{type(self).__name__} expects clips (B, C, T, H, W) = (B, {', '.join(map(str, want))}), "
                             f"got {tuple(x.shape)}")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Clips ``(B, C, T, H, W)`` → normed tokens ``(B, 1 + T·N, C)`` (CLS first, then frame by frame)."""
        self._check_clip(x)
        b, _, t = x.shape[:3]
        tokens = self.patch_embed(x.transpose(1, 2).flatten(0, 1))                  # (B·T, N, C)
        tokens = tokens + self.pos_embed[:, 1:]
        n = tokens.shape[1]
        tokens = tokens.reshape(b, t, n, -1) + self.time_embed[:, :, None]
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(b, -1, -1)
        x = self.pos_drop(torch.cat([cls, tokens.reshape(b, t * n, -1)], dim=1))
        return self.norm(self.blocks(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0] if self.global_pool == "token" else x[:, 1:].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _create(variant: str, pretrained: bool, **kwargs) -> TimeSformer:
    if pretrained:
        raise ValueError(f"{variant} has no pretrained weights; train one with "
                         "`vitmix train --data moving-fashion-mnist`")
    return number_layers(build_model_with_cfg(TimeSformer, variant, pretrained, **kwargs))


def _video(fn):
    """Mark a model function as taking clips ``(B, C, T, H, W)`` (read by :func:`is_video_model`)."""
    fn.video = True
    return fn


def is_video_model(name: str) -> bool:
    """True for registered models whose input is a clip ``(B, C, T, H, W)`` (``timesformer_*``)."""
    import timm

    try:
        fn = timm.models.model_entrypoint(name.split(".")[0])
    except (KeyError, RuntimeError):       # unknown name: create_model reports it
        return False
    return getattr(fn, "video", False)


_TINY = dict(img_size=32, patch_size=8, num_frames=8, embed_dim=192, depth=4, num_heads=3, mlp_ratio=2.0,
             num_classes=4)


@register_model
@_video
def timesformer_tiny(pretrained=False, **kwargs) -> TimeSformer:
    """TimeSformer, divided space–time, 8 frames of 32×32 in 8×8 patches (16 per frame), dim 192, depth 4,
    3 heads, softmax attention by default (``mixer=`` / ``time_mixer=`` change it)."""
    return _create("timesformer_tiny", pretrained, **dict(_TINY, **kwargs))


@register_model
@_video
def timesformer_tiny_fibottention(pretrained=False, mixer=None, mixer_options=None, **kwargs) -> TimeSformer:
    """``timesformer_tiny`` with Fibottention (``variant="modified"``, the paper's video setting) in the
    temporal and the spatial attention; ``mixer_options`` override its options for both."""
    if mixer not in (None, "fibottention"):
        raise ValueError(f"timesformer_tiny_fibottention always uses the 'fibottention' mixer (got mixer={mixer!r}); "
                         f"build timesformer_tiny with mixer={mixer!r} instead")
    options = dict({"variant": "modified"}, **(mixer_options or {}))
    kwargs.setdefault("time_mixer", "fibottention")
    return _create("timesformer_tiny_fibottention", pretrained, mixer="fibottention", mixer_options=options,
                   **dict(_TINY, **kwargs))
