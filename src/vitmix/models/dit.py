"""DiT: class-conditional diffusion transformers with any vitmix mixer, and WeightFormer-DiT.

"Scalable Diffusion Models with Transformers" (Peebles & Xie, ICCV 2023; official code
facebookresearch/DiT ``models.py``), re-implemented from timm parts for small images:

    x_t (B, C, H, W) ─ PatchEmbed(p) ─ + fixed 2-D sin-cos position embedding ─┐
    t ─ sinusoid(256) ─ Linear ─ SiLU ─ Linear ─┐                                │
    y ─ Embedding(classes + 1 null) ────────────┴─ c = t_emb + y_emb             │
                                                   │                             │
    depth × adaLN-Zero block(tokens, c) ◄──────────┴─────────────────────────────┘
    final adaLN layer ─ Linear(p·p·C) ─ unpatchify ─ (B, C, H, W): the predicted noise (or velocity)

An adaLN-Zero block regresses shift/scale/gate of both branches from ``c`` (``SiLU → Linear(6D)``):
``x += gate₁ · Mix(modulate(LN(x), shift₁, scale₁))``; ``x += gate₂ · MLP(modulate(LN(x), shift₂, scale₂))``
with affine-free LayerNorms (eps 1e-6), tanh-GELU MLPs (ratio 4) and ``modulate(x, s, a) = x·(1 + a) + s``.
``Mix`` is any vitmix mixer (``mixer=``, default ``"softmax"``, with ``qkv_bias=True`` as DiT), built
through the mixer registry with the token grid known (``hw``, no prefix tokens).

Initialisation as DiT: xavier-uniform linears with zero bias, the patch projection initialised like a
linear, label table and timestep MLP N(0, 0.02), and the adaLN modulations *and* the final linear set
to zero, so every block starts as the identity and the network outputs exactly 0.

WeightFormer-DiT (:class:`WeightFormerDiT`) follows the official ``model/wfm_dit.py`` of
LeapLabTHU/WeightFormer ("Linear-Time Global Visual Modeling without Explicit Attention"): there is no
attention; the first branch is a depthwise 3×3 convolution of the modulated tokens and the MLP's first
layer a plain linear, except in the *dynamic* blocks (``(ℓ + 2) % 3 == 0``: ℓ = 1, 4, 7, ...), where they
are WeightFormer's :class:`~vitmix.models._blocks.DynamicDepthwiseConv` and
:class:`~vitmix.models._blocks.DynamicLinear` (reused, not copied). Like the official code every
block first overwrites the residual stream with ``LN₁(x)`` (``norm_residual=True``), so its blocks are not
the identity at the adaLN-Zero init (the output still is 0); ``norm_residual=False`` gives the pre-norm
``x += gate₁ · DWConv(modulate(LN₁(x)))`` instead.

Differences from the official DiT, on purpose:

* ``learn_sigma`` is not offered: vitmix trains the simple ε- (or v-) MSE loss of
  :mod:`vitmix.models.diffusion`; DiT's extra σ channels only make sense with Improved DDPM's hybrid
  VLB loss.
* the null-class row of the label table always exists (also with ``class_dropout_prob=0``), so any model
  can be sampled unconditionally; classifier-free guidance is applied to all output channels (DiT's
  ``forward_with_cfg`` guides only the first three, for reproducibility of its paper numbers).
* any input size divisible by the patch is accepted (non-square too); the position embedding is rebuilt
  for a grid other than the nominal one.

Parameters at 32×32, 3 channels, 10 classes, patch 2, at the same width D and depth (per block, DiT:
attention 4D² + MLP 8D² + adaLN 6D² = 18D² + 15D; WeightFormer-DiT static: DW conv 10D + MLP 8D² + adaLN
6D² = 14D² + 21D, dynamic: 21.5D² + 23.25D, the extra 7.5D² being the kernel and weight predictors; the
embeddings and the final layer are the same in both):

=======================  ====  =====  =============  ==============================
model                    D     depth  DiT (softmax)  WeightFormer-DiT
=======================  ====  =====  =============  ==============================
``*_nano_patch2``        128   6      1,868,044      1,725,772 (dynamic blocks 1, 4)
``*_tiny_patch2``        192   12     8,164,620      7,516,620 (dynamic 1, 4, 7, 10)
=======================  ====  =====  =============  ==============================

(``tests/generate/test_dit.py`` checks these against a closed-form count.)

These models are not classifiers: ``forward(x, t, y)``, ``task = "generation"`` on the class and on the
registered entry points (:func:`model_task`), which registry-wide classifier checks use to tell them apart.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Optional, Tuple, Union

import timm
import torch
import torch.nn.functional as F
from timm.layers import Mlp, PatchEmbed, build_sincos2d_pos_embed
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import Tensor, nn

from .. import mixers
from ._builder import model_cfg
from ._blocks import DynamicDepthwiseConv, WeightFormerMlp, grid_view, is_dynamic_block, to_tokens

__all__ = ["DiT", "DiTBlock", "FinalLayer", "LabelEmbedder", "TimestepEmbedder", "WeightFormerDiT",
           "WeightFormerDiTBlock", "model_task", "modulate"]

#: the ``task`` of models that are not image classifiers but diffusion backbones
GENERATION = "generation"


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN modulation of tokens ``(B, N, D)`` by per-sample ``shift``/``scale`` ``(B, D)``."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def _affine_free_norm(dim: int) -> nn.LayerNorm:
    return nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)


_tanh_gelu = partial(nn.GELU, approximate="tanh")


# ----------------------------------------------------------------------------------------------
# conditioning
# ----------------------------------------------------------------------------------------------
class TimestepEmbedder(nn.Module):
    """Timesteps ``(B,)`` (integers or fractions) → ``(B, D)``: a sinusoidal code then an MLP.

    The code is ``[cos(t·f_k), sin(t·f_k)]`` with ``f_k = max_period^(-k/half)``, ``k < half``
    (GLIDE/DiT), ``frequency_dim`` wide (256, zero-padded when odd).
    """

    def __init__(self, dim: int, frequency_dim: int = 256, max_period: float = 10000.0):
        super().__init__()
        self.frequency_dim, self.max_period = frequency_dim, max_period
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    @staticmethod
    def sinusoid(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
        """The ``(B, dim)`` sinusoidal code of ``t`` (computed in float32)."""
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        code = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return F.pad(code, (0, dim % 2))

    def forward(self, t: Tensor) -> Tensor:
        code = self.sinusoid(t, self.frequency_dim, self.max_period)
        return self.mlp(code.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels ``(B,)`` → ``(B, D)``; index ``num_classes`` is the null (unconditional) class.

    In training, each label is replaced by the null class with probability ``dropout_prob`` (DiT: 0.1),
    which teaches the unconditional model that classifier-free guidance needs.
    """

    def __init__(self, num_classes: int, dim: int, dropout_prob: float = 0.1):
        super().__init__()
        if not 0.0 <= dropout_prob <= 1.0:
            raise ValueError(f"class_dropout_prob must be in [0, 1], got {dropout_prob}")
        self.num_classes, self.dropout_prob = num_classes, dropout_prob
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: Tensor) -> Tensor:
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(labels.shape, device=labels.device) < self.dropout_prob
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels)


# ----------------------------------------------------------------------------------------------
# blocks
# ----------------------------------------------------------------------------------------------
class DiTBlock(nn.Module):
    """adaLN-Zero block with a vitmix mixer as attention and timm's ``Mlp`` (tanh GELU).

    ``forward(x (B, N, D), c (B, D), hw=(H, W))``: ``hw`` is passed to the mixer on every call, so
    spatial mixers (landmarks, local convs, sparse patterns) see the true grid.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, mixer: str = "softmax",
                 mixer_options: Optional[dict] = None, hw: Optional[Tuple[int, int]] = None):
        super().__init__()
        options = dict(dict(qkv_bias=True, hw=hw, num_prefix_tokens=0), **(mixer_options or {}))
        self.norm1 = _affine_free_norm(dim)
        self.attn = mixers.create(mixer, dim, num_heads, **options)
        self.norm2 = _affine_free_norm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=_tanh_gelu)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, c: Tensor, hw: Tuple[int, int]) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate1.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift1, scale1), hw=hw, num_prefix_tokens=0)
        return x + gate2.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift2, scale2))


class WeightFormerDiTBlock(nn.Module):
    """WeightFormer's block under adaLN-Zero conditioning (official ``wfm_dit.py``).

    * static: depthwise 3×3 conv (bias) as the token mixer, MLP fc1 a linear;
    * dynamic: :class:`DynamicDepthwiseConv` and a :class:`DynamicLinear` fc1 (WeightFormer's MLP,
      inference fast path included), tanh GELU.

    ``norm_residual=True`` (official): ``x = LN₁(x)`` first, then ``x += gate₁ · DWConv(modulate(x))``;
    ``False``: ``x += gate₁ · DWConv(modulate(LN₁(x)))``. The MLP branch is DiT's in both cases.
    """

    def __init__(self, dim: int, mlp_ratio: float = 4.0, dynamic: bool = False, norm_residual: bool = True,
                 odd_pool: str = "ceil", linear_path: str = "auto"):
        super().__init__()
        self.dynamic, self.norm_residual = dynamic, norm_residual
        self.norm1 = _affine_free_norm(dim)
        if dynamic:
            self.dwconv = DynamicDepthwiseConv(dim, 3)
        else:
            self.dwconv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm2 = _affine_free_norm(dim)
        self.mlp = WeightFormerMlp(dim, int(dim * mlp_ratio), dynamic, _tanh_gelu, 0.0, odd_pool, linear_path)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, c: Tensor, hw: Tuple[int, int]) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        if self.norm_residual:
            x = self.norm1(x)
            h = modulate(x, shift1, scale1)
        else:
            h = modulate(self.norm1(x), shift1, scale1)
        x = x + gate1.unsqueeze(1) * to_tokens(self.dwconv(grid_view(h.contiguous(), hw)))
        return x + gate2.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift2, scale2), hw)


class FinalLayer(nn.Module):
    """Affine-free LayerNorm, adaLN shift/scale from ``c`` and the linear to ``p·p·C`` values per token."""

    def __init__(self, dim: int, patch_size: int, out_chans: int):
        super().__init__()
        self.norm_final = _affine_free_norm(dim)
        self.linear = nn.Linear(dim, patch_size * patch_size * out_chans)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------
class DiT(nn.Module):
    """Class-conditional diffusion transformer: ``forward(x, t, y)`` → a tensor shaped like ``x``.

    Args:
        img_size: nominal input size (position-embedding cache and default cfg; any multiple of the patch
            works). patch_size: patch p (2 as DiT-*/2). in_chans: image channels (output has as many).
        num_classes: class labels ``0..num_classes-1``; ``num_classes`` itself is the null class.
        embed_dim, depth, num_heads, mlp_ratio: width D, blocks, heads, MLP ratio (4).
        class_dropout_prob: label dropout in training for classifier-free guidance (DiT: 0.1).
        mixer, mixer_options: the vitmix mixer in every block (default ``"softmax"``) and its options.
    """

    task = GENERATION

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 32, patch_size: int = 2, in_chans: int = 3,
                 num_classes: int = 10, embed_dim: int = 128, depth: int = 6, num_heads: int = 4,
                 mlp_ratio: float = 4.0, class_dropout_prob: float = 0.1, mixer: Optional[str] = None,
                 mixer_options: Optional[dict] = None, **block_options):
        super().__init__()
        if num_classes <= 0:
            raise ValueError(f"num_classes must be positive for a class-conditional model, got {num_classes}")
        self.in_chans, self.out_chans, self.num_classes = in_chans, in_chans, num_classes
        self.patch_size, self.embed_dim, self.num_prefix_tokens = patch_size, embed_dim, 0
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim, flatten=False, output_fmt="NHWC", strict_img_size=False)
        grid = tuple(self.patch_embed.grid_size)
        self.register_buffer("pos_embed", self._sincos(grid), persistent=False)
        self.t_embedder = TimestepEmbedder(embed_dim)
        self.y_embedder = LabelEmbedder(num_classes, embed_dim, class_dropout_prob)
        self.blocks = nn.ModuleList([
            self.make_block(i, depth, embed_dim, num_heads, mlp_ratio, grid, mixer, mixer_options, **block_options)
            for i in range(depth)])
        self.final_layer = FinalLayer(embed_dim, patch_size, self.out_chans)
        self.initialize_weights()
        mixers.number_layers(self)

    def make_block(self, index: int, depth: int, dim: int, num_heads: int, mlp_ratio: float,
                   grid: Tuple[int, int], mixer: Optional[str], mixer_options: Optional[dict]) -> nn.Module:
        """Block ``index`` of ``depth`` (subclasses change the token mixing)."""
        return DiTBlock(dim, num_heads, mlp_ratio, mixer or "softmax", mixer_options, grid)

    def _sincos(self, grid: Tuple[int, int]) -> Tensor:
        """timm's fixed 2-D sin-cos embedding of a row-major ``grid`` (MAE/DiT frequencies)."""
        if self.embed_dim % 4:
            raise ValueError(f"embed_dim must be divisible by 4 for the 2-D sin-cos position embedding, "
                             f"got {self.embed_dim}")
        return build_sincos2d_pos_embed(list(grid), self.embed_dim).unsqueeze(0)

    def initialize_weights(self) -> None:
        """DiT's init: xavier-uniform linears (zero bias), the patch projection as a linear, N(0, 0.02)
        label table and timestep MLP, and zero adaLN modulations and output layer (adaLN-Zero)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        w = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch_embed.proj.bias)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for layer in [b.adaLN_modulation[-1] for b in self.blocks] + [self.final_layer.adaLN_modulation[-1],
                                                                      self.final_layer.linear]:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return set()  # DiT trains with AdamW and no weight decay at all; the position embedding is a buffer

    @property
    def null_class(self) -> int:
        """The label of the unconditional (null) class, for classifier-free guidance."""
        return self.num_classes

    def example_inputs(self, batch_size: int = 1,
                       generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """One call's arguments ``(x, t, y)`` at the nominal size: zeros, timestep 0 and class 0 (FLOP
        counts), or with a ``generator`` standard-normal ``x``, timesteps in ``0..999`` and labels in
        ``0..num_classes`` (null class included; export checks)."""
        shape = (batch_size, self.in_chans, *self.patch_embed.img_size)
        if generator is None:
            zeros = torch.zeros(batch_size, dtype=torch.long)
            return torch.zeros(shape), zeros, zeros
        x = torch.randn(shape, generator=generator)
        t = torch.randint(0, 1000, (batch_size,), generator=generator)
        return x, t, torch.randint(0, self.num_classes + 1, (batch_size,), generator=generator)

    def _check_inputs(self, x: Tensor, t: Optional[Tensor], y: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        if t is None or y is None:
            raise ValueError(f"{type(self).__name__} is a class-conditional diffusion backbone, not a classifier: "
                             "call model(x, t, y) with timesteps and labels; train it with `vitmix generate train`")
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images (B, {self.in_chans}, H, W), got shape {tuple(x.shape)}")
        H, W = x.shape[2:]
        p = self.patch_size
        if H % p or W % p:
            raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {p}")
        t, y = torch.as_tensor(t, device=x.device), torch.as_tensor(y, device=x.device)
        if t.dim() == 0:  # one timestep for the whole batch
            t = t.expand(x.shape[0])
        if t.shape != (x.shape[0],) or y.shape != (x.shape[0],):
            raise ValueError(f"t and y must be ({x.shape[0]},) like the batch, got {tuple(t.shape)} and "
                             f"{tuple(y.shape)}")
        if y.dtype.is_floating_point or (not torch.compiler.is_compiling() and self._labels_out_of_range(y)):
            raise ValueError(f"labels must be integers in 0..{self.num_classes} ({self.num_classes} = the null "
                             f"class), got {y.tolist()}")
        return t, y

    def _labels_out_of_range(self, y: Tensor) -> bool:
        """Whether a label lies outside ``0..num_classes``. It reads the label values, so it runs in eager
        mode only: torch.compile / torch.export skip it (a Python branch on tensor data would break the
        graph and keep export from tracing), and the embedding lookup is then the only check."""
        return bool(((y < 0) | (y > self.num_classes)).any())

    def unpatchify(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        """``(B, h·w, p·p·C)`` patch values → ``(B, C, h·p, w·p)`` images."""
        p, c = self.patch_size, self.out_chans
        x = x.reshape(x.shape[0], hw[0], hw[1], p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(x.shape[0], c, hw[0] * p, hw[1] * p)

    def forward(self, x: Tensor, t: Optional[Tensor] = None, y: Optional[Tensor] = None) -> Tensor:
        """Noisy images ``x (B, C, H, W)``, timesteps ``t (B,)``, labels ``y (B,)`` → ``(B, C, H, W)``."""
        t, y = self._check_inputs(x, t, y)
        x = self.patch_embed(x)  # B, h, w, D
        hw = (x.shape[1], x.shape[2])
        pos = self.pos_embed if hw == tuple(self.patch_embed.grid_size) else self._sincos(hw).to(x.device)
        x = x.reshape(x.shape[0], hw[0] * hw[1], -1) + pos.to(x.dtype)
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            x = block(x, c, hw)
        return self.unpatchify(self.final_layer(x, c), hw)


class WeightFormerDiT(DiT):
    """DiT with WeightFormer's dynamic token mixing instead of attention (see the module docstring).

    Extra args: ``dynamic_every`` (3: blocks with ``(ℓ + 2) % 3 == 0`` are dynamic), ``norm_residual``
    (official ``True``), ``odd_pool`` and ``linear_path`` of :class:`DynamicLinear`. ``num_heads`` is
    accepted and unused (as in the official code); ``mixer=`` raises ``ValueError``.
    """

    def __init__(self, *args, mixer: Optional[str] = None, mixer_options: Optional[dict] = None, **kwargs):
        if mixer is not None or mixer_options:
            raise ValueError("WeightFormer-DiT has no attention layer, so mixer=/mixer_options= cannot be used; "
                             "use dit_nano_patch2 / dit_tiny_patch2 to choose a mixer")
        super().__init__(*args, **kwargs)

    def make_block(self, index, depth, dim, num_heads, mlp_ratio, grid, mixer, mixer_options, dynamic_every=3,
                   norm_residual=True, odd_pool="ceil", linear_path="auto") -> nn.Module:
        return WeightFormerDiTBlock(dim, mlp_ratio, is_dynamic_block(index, dynamic_every), norm_residual,
                                    odd_pool, linear_path)


# ----------------------------------------------------------------------------------------------
# registered models
# ----------------------------------------------------------------------------------------------
_CFG = dict(input_size=(3, 32, 32), num_classes=10, crop_pct=1.0, interpolation="bilinear", mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5), classifier=None,
            description="class-conditional diffusion backbone: forward(x, t, y) predicts noise; not a classifier")

default_cfgs = generate_default_cfgs({f"{name}.untrained": model_cfg(**_CFG) for name in (
    "dit_nano_patch2", "dit_tiny_patch2", "weightformer_dit_nano_patch2", "weightformer_dit_tiny_patch2")})


def _generation(fn):
    """Mark a registered entry point as a diffusion backbone (read by :func:`model_task`)."""
    fn.task = GENERATION
    return fn


def model_task(model: Union[str, nn.Module]) -> str:
    """``"generation"`` for the diffusion backbones here, ``"classification"`` for every other model.

    Takes a registered name (no model is built) or a model. Registry-wide checks that call
    ``model(images)`` (fingerprints, ``vitmix models --table``) select on it."""
    if isinstance(model, nn.Module):
        return getattr(model, "task", "classification")
    try:
        fn = timm.models.model_entrypoint(model.split(".")[0])
    except (KeyError, RuntimeError):  # timm versions differ in which
        raise ValueError(f"unknown model {model!r}; see `vitmix models`") from None
    return getattr(fn, "task", "classification")


def _create(cls, variant: str, pretrained: bool, **kwargs) -> DiT:
    if pretrained:
        raise ValueError(f"{variant} has no pretrained weights; train one with `vitmix generate train`")
    return build_model_with_cfg(cls, variant, pretrained, **kwargs)


_NANO = dict(img_size=32, patch_size=2, embed_dim=128, depth=6, num_heads=4, mlp_ratio=4.0)
_TINY = dict(img_size=32, patch_size=2, embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0)


@register_model
@_generation
def dit_nano_patch2(pretrained: bool = False, **kwargs) -> DiT:
    """DiT-Nano/2: D=128, 6 blocks, 4 heads, patch 2 (16×16 tokens at 32², 14×14 at 28²); any ``mixer=``."""
    return _create(DiT, "dit_nano_patch2", pretrained, **dict(_NANO, **kwargs))


@register_model
@_generation
def dit_tiny_patch2(pretrained: bool = False, **kwargs) -> DiT:
    """DiT-Tiny/2: DeiT-Tiny widths (D=192, 12 blocks, 3 heads), patch 2; any ``mixer=``."""
    return _create(DiT, "dit_tiny_patch2", pretrained, **dict(_TINY, **kwargs))


@register_model
@_generation
def weightformer_dit_nano_patch2(pretrained: bool = False, **kwargs) -> WeightFormerDiT:
    """WeightFormer-DiT-Nano/2: dit_nano_patch2's width/depth, dynamic blocks 1 and 4, no attention."""
    return _create(WeightFormerDiT, "weightformer_dit_nano_patch2", pretrained, **dict(_NANO, **kwargs))


@register_model
@_generation
def weightformer_dit_tiny_patch2(pretrained: bool = False, **kwargs) -> WeightFormerDiT:
    """WeightFormer-DiT-Tiny/2: dit_tiny_patch2's width/depth, dynamic blocks 1, 4, 7, 10, no attention."""
    return _create(WeightFormerDiT, "weightformer_dit_tiny_patch2", pretrained, **dict(_TINY, **kwargs))
