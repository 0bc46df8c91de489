"""Pyramid (PVT-style) backbones of SOFT, SOFT-Norm and LaplacianFormer, registered in timm.

``soft_*`` / ``soft_norm_*`` follow the official SOFT backbone (``fudan-zvg/SOFT``,
``SoftmaxFreeVisionTransformer``):

* stage 1: a stride-4 conv stem (3×3 s2 → 3×3 s1 → 3×3 s2, each conv + BN + ReLU); stages 2–4: a
  3×3 stride-2 conv + BN + ReLU;
* a learned absolute positional embedding per stage (stored at the 224² grid, resized bilinearly,
  ``align_corners=False``, to the actual grid; the CLS slot is not resized);
* stages 1–3: **post-norm** blocks ``LN(x + Dropout_p(mixer(x)))``, ``LN(x + Dropout_p(FFN(x)))``
  with a tanh-GELU FFN of ratio 4, where ``p`` is the block's stochastic-depth rate used as plain
  element-wise dropout (as the official code does), LN eps 1e-5;
* stage 4: **pre-norm** softmax blocks with a CLS token, DropPath, exact GELU, LN eps 1e-6;
* head: ``LayerNorm(eps 1e-6)`` → CLS token → ``Linear``.

``laplacianformer_*`` (LaplacianFormer; the paper's backbone is not public) reuse this pyramid with
the ``laplacian`` mixer in **all four** stages (pooling ratios 8/4/2/1, so stage 4 uses its 49 grid
tokens as landmarks), pre-norm blocks with DropPath throughout (PVT style), CLS token in stage 4 and
optional RoPE (``rope=True``). The sizes are vitmix's own (see ``docs/soft-laplacianformer.md``).

All models take any input size the official code takes (e.g. 240², non-square too: each 3×3
stride-2 conv maps a side ``n`` to ``⌈n/2⌉``, the positional embeddings are resized to the actual
grid and the mixers handle grids that the landmark stride does not divide), expose timm's
``forward_features`` / ``forward_head`` / ``reset_classifier`` / ``forward_intermediates`` and
support ``features_only=True`` (the four stage outputs, NCHW, nominal strides 4/8/16/32).

``preset="official"`` (a model kwarg, or ``mixer_options={"preset": ...}``) gives the SOFT /
SOFT-Norm mixers the official code's behaviour (``docs/presets.md``); :func:`checkpoint_filter_fn`
loads official ``fudan-zvg/SOFT`` checkpoints through timm's pretrained path.
"""
from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from timm.layers import DropPath, Mlp, resample_abs_pos_embed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices

from ..mixers import create as create_mixer
from ..mixers import get_mixer_class, list_mixers
from ._builder import init_linear_and_norm, model_cfg, unwrap_checkpoint

__all__ = ["PyramidTransformer", "checkpoint_filter_fn", "stage_grid"]

_STAGE_STRIDES = (4, 8, 16, 32)


def stage_grid(hw: Tuple[int, int], stage: int) -> Tuple[int, int]:
    """The token grid of stage ``stage`` (0–3) for an ``H×W`` input: the stem halves each side twice
    and every later stage once more, each 3×3 stride-2 convolution (padding 1) mapping ``n`` to
    ``⌈n/2⌉`` (so 224² → 56, 28, 14, 7 and 240² → 60, 30, 15, 8)."""
    h, w = int(hw[0]), int(hw[1])
    for _ in range(stage + 2):
        h, w = -(-h // 2), -(-w // 2)
    return h, w


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
def _conv_bn_relu(in_chs: int, out_chs: int, stride: int) -> List[nn.Module]:
    return [nn.Conv2d(in_chs, out_chs, 3, stride, 1), nn.BatchNorm2d(out_chs), nn.ReLU()]


class PatchEmbed(nn.Module):
    """Stage input: the stride-4 conv stem (``stem=True``) or a 3×3 stride-2 downsampler."""

    def __init__(self, in_chs: int, dim: int, stem: bool) -> None:
        super().__init__()
        if stem:
            layers = _conv_bn_relu(in_chs, 32, 2) + _conv_bn_relu(32, 32, 1) + _conv_bn_relu(32, dim, 2)
        else:
            layers = _conv_bn_relu(in_chs, dim, 2)
        self.proj = nn.Sequential(*layers)
        self.stride = 4 if stem else 2

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class PostNormBlock(nn.Module):
    """SOFT's block (stages 1–3): ``LN(x + Dropout(mixer(x)))`` then ``LN(x + Dropout(FFN(x)))``.

    ``drop`` is the block's stochastic-depth rate, applied as element-wise dropout (official).
    """

    def __init__(self, dim: int, mixer: nn.Module, drop: float = 0.0, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.attn = mixer
        self.drop1 = nn.Dropout(drop)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=partial(nn.GELU, approximate="tanh"))
        self.drop2 = nn.Dropout(drop)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], prefix: int) -> torch.Tensor:
        x = self.norm1(x + self.drop1(self.attn(x, hw=hw, num_prefix_tokens=prefix)))
        return self.norm2(x + self.drop2(self.mlp(x)))


class PreNormBlock(nn.Module):
    """Pre-norm block: ``x + DropPath(mixer(LN(x)))`` then ``x + DropPath(MLP(LN(x)))`` (exact GELU)."""

    def __init__(self, dim: int, mixer: nn.Module, drop_path: float = 0.0, mlp_ratio: float = 4.0,
                 drop: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = mixer
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], prefix: int) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw=hw, num_prefix_tokens=prefix))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def resize_pos_embed(pos: torch.Tensor, src_hw: Tuple[int, int], dst_hw: Tuple[int, int], prefix: int) -> torch.Tensor:
    """Bilinearly resize ``pos (1, prefix + h*w, C)`` from grid ``src_hw`` to ``dst_hw`` (prefix kept,
    dtype kept): timm's ``resample_abs_pos_embed`` without antialiasing, as the official code."""
    if tuple(src_hw) == tuple(dst_hw):
        return pos
    return resample_abs_pos_embed(pos, list(dst_hw), list(src_hw), num_prefix_tokens=prefix,
                                  interpolation="bilinear", antialias=False, align_corners=False)


class PyramidStage(nn.Module):
    """One pyramid stage: patch embedding, positional embedding (+ optional CLS), blocks."""

    def __init__(self, in_chs: int, dim: int, blocks: Sequence[nn.Module], base_hw: Tuple[int, int],
                 stem: bool, num_prefix: int = 0, drop_rate: float = 0.0) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(in_chs, dim, stem)
        self.base_hw = tuple(base_hw)
        self.num_prefix = num_prefix
        self.pos_embed = nn.Parameter(torch.zeros(1, num_prefix + base_hw[0] * base_hw[1], dim))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList(blocks)
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor, prefix_tokens: Optional[torch.Tensor] = None):
        """``x`` (B, C_in, H, W) → tokens (B, P + h*w, C) and the grid ``(h, w)``."""
        x, hw = self.patch_embed(x)
        if prefix_tokens is not None:
            x = torch.cat([prefix_tokens.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + resize_pos_embed(self.pos_embed, self.base_hw, hw, self.num_prefix))
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(blk, x, hw, self.num_prefix, use_reentrant=False)
            else:
                x = blk(x, hw, self.num_prefix)
        return x, hw


# ---------------------------------------------------------------------------------------------
# stage mixer options (each mixer class states its per-stage defaults: ``stage_options``)
# ---------------------------------------------------------------------------------------------
def _stage_options(mixer_options, stage: int) -> dict:
    if mixer_options is None:
        return {}
    if isinstance(mixer_options, dict):
        return dict(mixer_options)
    opts = list(mixer_options)
    if len(opts) != 4:
        raise ValueError(f"mixer_options must be a dict or a list of 4 dicts (one per stage), got {len(opts)}")
    return dict(opts[stage] or {})


class _BlockConfig(NamedTuple):
    """What every stage needs to build its blocks (the model's block-level arguments)."""

    mixer: str
    mixer_options: Union[dict, Sequence[dict], None]
    kernel_stages: int
    post_norm: bool
    mlp_ratio: float
    qkv_bias: bool
    newton_iters: int
    proj_drop_rate: float

    def mixer_for(self, stage: int, stride: int) -> Tuple[str, dict]:
        """The mixer name and options of ``stage``: the kernel mixer with its per-stage defaults and
        the user's options on top, or softmax attention in the stages after ``kernel_stages``."""
        if stage >= self.kernel_stages:
            return "softmax", dict(qkv_bias=self.qkv_bias, proj_drop=self.proj_drop_rate)
        opts = dict(qkv_bias=self.qkv_bias)
        opts.update(get_mixer_class(self.mixer).stage_options(stage, stride, self.newton_iters))
        opts.update(_stage_options(self.mixer_options, stage))
        return self.mixer, opts

    def build(self, stage: int, dim: int, heads: int, stride: int, drop_rates: Sequence[float]) -> List[nn.Module]:
        """The blocks of one stage (mixer then block, in order), one per drop rate."""
        name, opts = self.mixer_for(stage, stride)
        post_norm = self.post_norm and stage < self.kernel_stages
        blocks = []
        for rate in drop_rates:
            attn = create_mixer(name, dim, heads, **opts)
            if post_norm:
                blocks.append(PostNormBlock(dim, attn, drop=rate))
            else:
                blocks.append(PreNormBlock(dim, attn, drop_path=rate, mlp_ratio=self.mlp_ratio,
                                           drop=self.proj_drop_rate))
        return blocks


def _check_arguments(img_size, global_pool: str, embed_dims, num_heads, depths, sr_ratios) -> Tuple[int, int]:
    """Validate the model arguments; return ``img_size`` as ``(H, W)``."""
    if global_pool not in ("token", "avg", ""):
        raise ValueError(f"global_pool={global_pool!r} must be 'token', 'avg' or ''")
    if not (len(embed_dims) == len(num_heads) == len(depths) == len(sr_ratios) == 4):
        raise ValueError("embed_dims, num_heads, depths and sr_ratios need one entry per stage (4)")
    img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    if len(img_size) != 2 or min(img_size) < 1:
        raise ValueError(f"img_size={img_size} must be a positive int or (H, W)")
    return img_size


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------
class PyramidTransformer(nn.Module):
    """Four-stage pyramid backbone with a kernel-attention mixer (SOFT / LaplacianFormer family).

    Args:
        img_size: training resolution; sizes the stored positional embeddings (other input sizes
            are handled by resizing them).
        in_chans, num_classes, global_pool: as timm (``global_pool`` ``"token"`` = CLS, ``"avg"``
            = mean of the stage-4 grid tokens, ``""`` = none).
        embed_dims, num_heads, depths: per stage.
        sr_ratios: per-stage landmark stride / pooling ratio (8, 4, 2, 1).
        mixer: the mixer of the kernel stages (``"soft"``, ``"soft_norm"``, ``"laplacian"`` or any
            registered mixer).
        mixer_options: options for the kernel-stage mixers (a dict for all, or a list of 4 dicts, one
            per stage); they override the per-stage defaults (stride/ratio, conv kernel, iterations).
            ``{"preset": "official"}`` selects the mixer's official behaviour.
        kernel_stages: how many leading stages use ``mixer`` (3 for SOFT, 4 for LaplacianFormer); the
            rest use softmax attention.
        post_norm: post-norm (SOFT) blocks in the kernel stages; otherwise pre-norm with DropPath.
        mlp_ratio: MLP ratio of the pre-norm blocks (the post-norm blocks use 4, as official).
        qkv_bias: bias of the query/key/value projections.
        newton_iters: Newton–Schulz iterations of the kernel mixers.
        drop_rate, pos_drop_rate, proj_drop_rate, drop_path_rate: dropout after the pooled features,
            after the positional embeddings, after the stage-4 projections, and the stochastic
            depth rate (linearly increasing over all blocks).
    """

    def __init__(
        self,
        img_size: Union[int, Tuple[int, int]] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        num_heads: Sequence[int] = (2, 4, 10, 16),
        depths: Sequence[int] = (1, 2, 3, 2),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        mixer: str = "soft",
        mixer_options: Union[dict, Sequence[dict], None] = None,
        kernel_stages: int = 3,
        post_norm: bool = True,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        newton_iters: int = 20,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        img_size = _check_arguments(img_size, global_pool, embed_dims, num_heads, depths, sr_ratios)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.embed_dims = tuple(embed_dims)
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.num_prefix_tokens = 1
        self.mixer = mixer
        self.img_size = img_size
        self.grad_checkpointing = False
        blocks = _BlockConfig(mixer, mixer_options, kernel_stages, post_norm, mlp_ratio, qkv_bias, newton_iters,
                              proj_drop_rate)
        self.feature_info = []
        self.stages = self._build_stages(in_chans, embed_dims, num_heads, depths, sr_ratios, blocks,
                                         pos_drop_rate, drop_path_rate)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims[-1]))
        self.norm = nn.LayerNorm(embed_dims[-1], eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _build_stages(self, in_chans, embed_dims, num_heads, depths, sr_ratios, blocks: "_BlockConfig",
                      pos_drop_rate: float, drop_path_rate: float) -> nn.ModuleList:
        """The four stages, built in the fixed order (each stage's blocks, then its patch embedding)
        that the random initialisation of a seeded model depends on."""
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()
        stages, cur, in_chs = [], 0, in_chans
        for i in range(4):
            stage_blocks = blocks.build(i, embed_dims[i], num_heads[i], sr_ratios[i], dpr[cur:cur + depths[i]])
            stages.append(PyramidStage(in_chs, embed_dims[i], stage_blocks, stage_grid(self.img_size, i),
                                       stem=i == 0, num_prefix=int(i == 3), drop_rate=pos_drop_rate))
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=_STAGE_STRIDES[i], module=f"stages.{i}"))
            cur += depths[i]
            in_chs = embed_dims[i]
        return nn.ModuleList(stages)

    def _init_weights(self) -> None:
        for stage in self.stages:
            trunc_normal_(stage.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        init_linear_and_norm(self)

    # -- timm API ------------------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        """Official: only the CLS token is excluded (positional embeddings are decayed)."""
        return {"cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^cls_token|^stages\.0\.(patch_embed|pos_embed)",
                    blocks=r"^stages\.(\d+)" if coarse else [(r"^stages\.(\d+)\.blocks\.(\d+)", None),
                                                           (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable
        for s in self.stages:
            s.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise ValueError(f"global_pool={global_pool!r} must be 'token', 'avg' or ''")
            self.global_pool = global_pool
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def _check_input(self, x: torch.Tensor) -> None:
        """Images of any size are accepted (a grid too small for a stage's landmarks is a
        ``ValueError`` from that stage's mixer, naming the stride)."""
        if x.dim() != 4:
            raise ValueError(f"{type(self).__name__} expects images (B, C, H, W), got a {x.dim()}-D tensor of shape "
                             f"{tuple(x.shape)}" + (" (add a batch dim with x[None])" if x.dim() == 3 else ""))

    def _run_stages(self, x: torch.Tensor, upto: int = 3):
        """Yield ``(index, tokens, hw)`` after each stage up to ``upto``."""
        b = x.shape[0]
        for i, stage in enumerate(self.stages):
            if i > upto:
                break
            prefix = self.cls_token if i == 3 else None
            tokens, hw = stage(x, prefix)
            yield i, tokens, hw
            if i < 3:
                x = tokens.transpose(1, 2).reshape(b, -1, hw[0], hw[1])

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images → normalised stage-4 tokens ``(B, 1 + h*w, C4)`` (CLS first)."""
        self._check_input(x)
        last = None
        for _, tokens, _ in self._run_stages(x):
            last = tokens
        return self.norm(last)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens:].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """Stage outputs as ``(B, C_i, H/s_i, W/s_i)`` maps (stage 4 without its CLS token).

        Args:
            indices: last ``n`` stages if int, all if ``None``, else the listed stage indices.
            norm: apply the final norm to the stage-4 output.
            stop_early: stop after the last requested stage.
            output_fmt: ``"NCHW"`` or ``"NHWC"``.
            intermediates_only: return only the list of maps.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt={output_fmt!r} must be 'NCHW' or 'NHWC'")
        self._check_input(x)
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        upto = max_index if stop_early else len(self.stages) - 1
        b = x.shape[0]
        feats, last = [], None
        for i, tokens, hw in self._run_stages(x, upto):
            last = tokens
            if i in take_indices:
                t = tokens
                if i == 3:
                    t = (self.norm(t) if norm else t)[:, 1:]
                fmap = t.reshape(b, hw[0], hw[1], -1)
                feats.append(fmap if output_fmt == "NHWC" else fmap.permute(0, 3, 1, 2).contiguous())
        if intermediates_only:
            return feats
        return self.norm(last), feats

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True):
        """Drop the stages after the last requested index (and the head/norm if asked)."""
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        self.stages = self.stages[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head or max_index < 3:
            self.reset_classifier(0, "")
        return take_indices


# ---------------------------------------------------------------------------------------------
# official checkpoint conversion
# ---------------------------------------------------------------------------------------------
def _official_key(key: str) -> str:
    """One official ``fudan-zvg/SOFT`` parameter name → the vitmix name (other names unchanged).

    Official layout: ``patch_embed{i}.proj.*``, ``pos_embed{i}``, stages 1–3
    ``block{i}.{j}.att.{mha.W_q, mha.W_v, mha.attn.Qlandmark_op, mha.attn.Qnorm_act.0, mha.attn.conv,
    mha.ff, norm1, ff1, ff2, norm2}``, stage 4 ``block4.{j}.{norm1, attn.q, attn.kv, attn.proj, norm2,
    mlp.fc1, mlp.fc2}``; ``cls_token``, ``norm`` and ``head`` keep their names.
    """
    for i in range(1, 5):
        stage = f"stages.{i - 1}"
        if key.startswith(f"patch_embed{i}."):
            return f"{stage}.patch_embed." + key[len(f"patch_embed{i}."):]
        if key == f"pos_embed{i}":
            return f"{stage}.pos_embed"
        if key.startswith(f"block{i}."):
            j, rest = key[len(f"block{i}."):].split(".", 1)
            rest = (rest.replace("att.mha.attn.", "attn.").replace("att.mha.", "attn.")
                    .replace("att.ff1.", "mlp.fc1.").replace("att.ff2.", "mlp.fc2.").replace("att.", ""))
            return f"{stage}.blocks.{j}.{rest}"
    return key


def _fit_pos_embeds(out: Dict[str, torch.Tensor], model: Optional[PyramidTransformer]) -> None:
    """Resize official positional embeddings (stored for the 224² grids, square) to the model's
    stage grids when its ``img_size`` differs, bilinearly as the official forward does."""
    if model is None:
        return
    for i, stage in enumerate(model.stages):
        key = f"stages.{i}.pos_embed"
        pos = out.get(key)
        if pos is None or pos.shape == stage.pos_embed.shape:
            continue
        side = math.isqrt(pos.shape[1] - stage.num_prefix)
        if side * side != pos.shape[1] - stage.num_prefix:
            raise ValueError(f"checkpoint {key} has {pos.shape[1]} tokens, which is not a square grid"
                             f"{' plus CLS' * stage.num_prefix}; cannot resize it to {stage.base_hw}")
        out[key] = resize_pos_embed(pos, (side, side), stage.base_hw, stage.num_prefix)


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor],
                         model: Optional[PyramidTransformer] = None) -> Dict[str, torch.Tensor]:
    """Map an official ``fudan-zvg/SOFT`` / SOFT-Norm checkpoint onto :class:`PyramidTransformer`.

    timm's ``pretrained_filter_fn`` of the ``soft_*`` / ``soft_norm_*`` models, so
    ``timm.create_model("soft_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=path))`` loads
    an official file. Accepts the official training checkpoint (EMA weights ``state_dict_ema`` first,
    as the official evaluation uses them, then ``state_dict``), DDP ``module.`` prefixes or a bare
    state dict. Names are mapped as in :func:`_official_key`; the stage-4 ``q`` and ``kv`` linears
    are concatenated into one ``qkv`` linear (``[q; k; v]``, timm's layout); positional embeddings are
    resized to the model's grids when its ``img_size`` is not 224. Already-converted dicts pass
    unchanged (apart from that resizing).
    """
    state_dict = unwrap_checkpoint(state_dict)
    if not any(k.startswith(("patch_embed1.", "block1.")) for k in state_dict):
        out = dict(state_dict)
    else:
        if model is not None:     # _create builds such a model again with preset="official" unless one was asked for
            model.official_checkpoint = True
        out = {_official_key(key): val for key, val in state_dict.items()}
        # stage-4 softmax attention: official q + kv linears → one qkv linear
        for key in [k for k in out if k.endswith((".attn.q.weight", ".attn.q.bias"))]:
            kv_key = key.replace(".attn.q.", ".attn.kv.")
            out[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat([out.pop(key), out.pop(kv_key)], dim=0)
    _fit_pos_embeds(out, model)
    return out


# ---------------------------------------------------------------------------------------------
# registrations
# ---------------------------------------------------------------------------------------------
def _cfg(**kwargs) -> dict:
    return model_cfg(first_conv="stages.0.patch_embed.proj.0", classifier="head", **kwargs)


_SIZES = ("tiny", "small", "medium", "large", "huge")
default_cfgs = generate_default_cfgs(
    {f"{family}_{size}.untrained": _cfg() for family in ("soft", "soft_norm", "laplacianformer") for size in _SIZES}
)

# Official SOFT shapes (sr_ratios 8/4/2/1 everywhere; only the stage-4 MLP ratio 4 is used).
_SOFT_ARCHS = {
    "tiny": dict(depths=(1, 2, 3, 2), embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16)),
    "small": dict(depths=(1, 3, 20, 4), embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16)),
    "medium": dict(depths=(1, 3, 29, 5), embed_dims=(64, 128, 288, 512), num_heads=(2, 4, 9, 16)),
    "large": dict(depths=(1, 3, 40, 5), embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16)),
    "huge": dict(depths=(1, 5, 49, 5), embed_dims=(64, 128, 352, 512), num_heads=(2, 4, 11, 16)),
}

# LaplacianFormer: vitmix's sizing (the paper's table is not public). SOFT's widths, heads (head dim
# 32) and depths, except Huge, whose stage 3 is cut from 49 to 41 blocks so that it costs 15.6 G MACs
# at 224² (the paper's 15.5 G), counted as SOFT's README counts (see docs/soft-laplacianformer.md).
_LAPLACIAN_ARCHS = dict(_SOFT_ARCHS, huge=dict(depths=(1, 5, 41, 5), embed_dims=(64, 128, 352, 512),
                                             num_heads=(2, 4, 11, 16)))


def _with_option(mixer_options, key: str, value):
    """``mixer_options`` (one dict or one per stage) with ``key=value`` added to every stage's dict."""
    if isinstance(mixer_options, (list, tuple)):
        return [dict(o or {}, **{key: value}) for o in mixer_options]
    return dict(mixer_options or {}, **{key: value})


def _check_preset(variant: str, mixer: str, preset: str) -> None:
    """``preset=`` needs a mixer that defines presets (LaplacianFormer has no official model code)."""
    if getattr(get_mixer_class(mixer), "presets", None) is None:
        having = [n for n in list_mixers() if getattr(get_mixer_class(n), "presets", None) is not None]
        raise ValueError(f"{variant}: preset={preset!r} selects a mixer's reproduction of its official code, but "
                         f"mixer {mixer!r} has no presets (mixers with presets: {', '.join(having)}); drop preset=")


def _asks_for_preset(mixer_options) -> bool:
    options = mixer_options if isinstance(mixer_options, (list, tuple)) else [mixer_options]
    return any("preset" in (o or {}) for o in options)


def _create(variant: str, pretrained: bool, arch: dict, defaults: dict, mixer=None, mixer_options=None,
            rope: Optional[bool] = None, preset: Optional[str] = None, **kwargs) -> PyramidTransformer:
    """Build ``variant``. An official ``fudan-zvg/SOFT`` checkpoint (recognised by the checkpoint filter)
    loaded without a preset is built again with ``preset="official"``, so that it computes as the
    official model (the default landmarks differ), and one warning line says how to keep the defaults."""
    model = _build(variant, pretrained, arch, defaults, mixer, mixer_options, rope, preset, **kwargs)
    chosen = mixer or defaults["mixer"]
    official = getattr(getattr(model, "model", model), "official_checkpoint", False)    # features_only: .model
    if (official and preset is None and not _asks_for_preset(mixer_options)
            and getattr(get_mixer_class(chosen), "presets", None) is not None):
        warnings.warn(f"{variant}: an official fudan-zvg/SOFT checkpoint, so the {chosen} mixers use "
                      f"preset='official' (the official model's landmarks and inverse); pass preset='default' "
                      f"for vitmix's defaults", UserWarning, stacklevel=3)
        model = _build(variant, pretrained, arch, defaults, mixer, mixer_options, rope, "official", **kwargs)
    return model


def _build(variant: str, pretrained: bool, arch: dict, defaults: dict, mixer, mixer_options, rope, preset,
           **kwargs) -> PyramidTransformer:
    args = dict(arch, **defaults)
    if mixer is not None:
        args["mixer"] = mixer
    if rope is not None:
        mixer_options = _with_option(mixer_options, "rope", rope)
    if preset is not None:
        _check_preset(variant, args["mixer"], preset)
        mixer_options = _with_option(mixer_options, "preset", preset)
    if mixer_options is not None:
        args["mixer_options"] = mixer_options
    args.update(kwargs)
    return build_model_with_cfg(
        PyramidTransformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter"), **args,
    )


def _soft(variant, size, pretrained, **kwargs):
    return _create(variant, pretrained, _SOFT_ARCHS[size], dict(mixer="soft"), **kwargs)


def _soft_norm(variant, size, pretrained, **kwargs):
    return _create(variant, pretrained, _SOFT_ARCHS[size], dict(mixer="soft_norm"), **kwargs)


def _laplacian(variant, size, pretrained, **kwargs):
    defaults = dict(mixer="laplacian", kernel_stages=4, post_norm=False)
    return _create(variant, pretrained, _LAPLACIAN_ARCHS[size], defaults, **kwargs)


@register_model
def soft_tiny(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Tiny (official shapes, 13.07M params)."""
    return _soft("soft_tiny", "tiny", pretrained, **kwargs)


@register_model
def soft_small(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Small as registered officially (depths 1/3/20/4, ≈38.9M; the README's 24M does not match)."""
    return _soft("soft_small", "small", pretrained, **kwargs)


@register_model
def soft_medium(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Medium (official shapes, 45.8M params)."""
    return _soft("soft_medium", "medium", pretrained, **kwargs)


@register_model
def soft_large(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Large (official shapes, 64.7M params)."""
    return _soft("soft_large", "large", pretrained, **kwargs)


@register_model
def soft_huge(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Huge (official shapes, 87.1M params)."""
    return _soft("soft_huge", "huge", pretrained, **kwargs)


@register_model
def soft_norm_tiny(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Norm-Tiny: SOFT-Tiny with the symmetric-normalised ``soft_norm`` mixer."""
    return _soft_norm("soft_norm_tiny", "tiny", pretrained, **kwargs)


@register_model
def soft_norm_small(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Norm-Small (shapes of ``soft_small``)."""
    return _soft_norm("soft_norm_small", "small", pretrained, **kwargs)


@register_model
def soft_norm_medium(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Norm-Medium (shapes of ``soft_medium``)."""
    return _soft_norm("soft_norm_medium", "medium", pretrained, **kwargs)


@register_model
def soft_norm_large(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Norm-Large (shapes of ``soft_large``)."""
    return _soft_norm("soft_norm_large", "large", pretrained, **kwargs)


@register_model
def soft_norm_huge(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Norm-Huge (shapes of ``soft_huge``)."""
    return _soft_norm("soft_norm_huge", "huge", pretrained, **kwargs)


@register_model
def laplacianformer_tiny(pretrained=False, **kwargs) -> PyramidTransformer:
    """LaplacianFormer-Tiny (vitmix sizing; ``rope=True`` adds 2-D RoPE in every stage)."""
    return _laplacian("laplacianformer_tiny", "tiny", pretrained, **kwargs)


@register_model
def laplacianformer_small(pretrained=False, **kwargs) -> PyramidTransformer:
    """LaplacianFormer-Small (vitmix sizing)."""
    return _laplacian("laplacianformer_small", "small", pretrained, **kwargs)


@register_model
def laplacianformer_medium(pretrained=False, **kwargs) -> PyramidTransformer:
    """LaplacianFormer-Medium (vitmix sizing)."""
    return _laplacian("laplacianformer_medium", "medium", pretrained, **kwargs)


@register_model
def laplacianformer_large(pretrained=False, **kwargs) -> PyramidTransformer:
    """LaplacianFormer-Large (vitmix sizing)."""
    return _laplacian("laplacianformer_large", "large", pretrained, **kwargs)


@register_model
def laplacianformer_huge(pretrained=False, **kwargs) -> PyramidTransformer:
    """LaplacianFormer-Huge (vitmix sizing: ≈15.5 G MACs at 224², as the paper reports)."""
    return _laplacian("laplacianformer_huge", "huge", pretrained, **kwargs)


# Nano pyramids for dense prediction on a CPU (fashion-scenes at 128²–256², docs/dense.md): a quarter
# of Tiny's widths, head dim 16, one block per stage and two in stage 3. vitmix's own sizing.
_NANO_ARCH = dict(depths=(1, 1, 2, 1), embed_dims=(16, 32, 80, 128), num_heads=(1, 2, 5, 8))
_NANO_CFG = dict(input_size=(3, 128, 128), num_classes=10)
default_cfgs.update(generate_default_cfgs(
    {f"{family}_nano.untrained": _cfg(**_NANO_CFG) for family in ("soft", "soft_norm", "laplacianformer")}))


@register_model
def soft_nano(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Nano (vitmix sizing for dense tasks: widths 16/32/80/128, depths 1/1/2/1, 10 classes)."""
    return _create("soft_nano", pretrained, _NANO_ARCH, dict(mixer="soft"), **kwargs)


@register_model
def soft_norm_nano(pretrained=False, **kwargs) -> PyramidTransformer:
    """SOFT-Norm-Nano (``soft_nano``'s shapes with the normalised SOFT mixer)."""
    return _create("soft_norm_nano", pretrained, _NANO_ARCH, dict(mixer="soft_norm"), **kwargs)


@register_model
def laplacianformer_nano(pretrained=False, **kwargs) -> PyramidTransformer:
    """LaplacianFormer-Nano (``soft_nano``'s shapes, the Laplacian mixer in all four stages)."""
    defaults = dict(mixer="laplacian", kernel_stages=4, post_norm=False)
    return _create("laplacianformer_nano", pretrained, _NANO_ARCH, defaults, **kwargs)
