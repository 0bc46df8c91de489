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

import math
from functools import partial
from typing import Callable, Dict, List, Optional, Set, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import DropPath, PatchEmbed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import Tensor, nn

from ..ops.dynamic import (
    DYNAMIC_LINEAR_PATHS,
    choose_dynamic_linear_path,
    dynamic_depthwise_conv2d,
    dynamic_linear,
    dynamic_linear_delta,
    normalize_kernels,
    pool_tokens_2x2,
)
from ..mixers.presets import DEFAULT_PRESET, FROM_PRESET, resolve_preset
from ._builder import init_linear_and_norm, model_cfg, unwrap_checkpoint

__all__ = [
    "DynamicDepthwiseConv", "DynamicLinear", "WeightFormer", "WeightFormerBlock", "checkpoint_filter_fn",
    "is_dynamic_block",
]


def is_dynamic_block(index: int, every: int = 3) -> bool:
    """Whether block ``index`` (0-based) is dynamic: ``(index + 2) % 3 == 0`` in the official model."""
    return (index + 2) % every == 0


def _square_grid(n: int) -> Tuple[int, int]:
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"{n} tokens are not a square grid; pass hw=(H, W) explicitly")
    return side, side


def _check_tokens(x: Tensor, hw: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    if x.dim() != 3:
        raise ValueError(f"expected tokens (B, N, C), got a {x.dim()}-D tensor of shape {tuple(x.shape)}")
    if hw is None:
        return _square_grid(x.shape[1])
    H, W = int(hw[0]), int(hw[1])
    if H * W != x.shape[1]:
        raise ValueError(f"token grid {H}x{W} = {H * W} does not match {x.shape[1]} tokens")
    return H, W


def _grid_view(x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """``(B, H·W, C)`` tokens as a channels-last ``(B, C, H, W)`` view (no copy)."""
    B, _, C = x.shape
    return x.view(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def _to_tokens(y: Tensor) -> Tensor:
    """``(B, C, H, W)`` back to ``(B, H·W, C)`` tokens (a view when ``y`` is channels-last)."""
    return y.permute(0, 2, 3, 1).reshape(y.shape[0], -1, y.shape[1])


# ----------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------
class DynamicLinear(nn.Module):
    """Linear layer with a per-sample weight ``W0 + ΔW(x)`` ("bilateral activation").

    ``ΔW`` is predicted from a 2×2-average-pooled copy of the token grid: one predictor linear gives
    both branch codes ``[P | Q]``, each goes through SiLU and its expansion matrix, and their product
    ``Aᵀ Bm`` (rank ≤ ``in_features / reduction``) is scaled by ``in_features**-0.5 / N`` (N the full
    token count) and normalised per output column, ``ΔW_j / (‖ΔW_j‖ + 1)``.
    See :func:`vitmix.ops.dynamic.dynamic_linear` for the evaluation paths.

    Args:
        in_features, out_features: widths (``out_features`` defaults to ``in_features``).
        reduction: branch width divisor ``r`` (official 4): ``P`` has ``in/r``, ``Q`` ``out/r`` columns.
        odd_pool: ``"ceil"`` (default; odd rows/columns pooled in smaller, area-weighted windows so
            every token contributes) or ``"floor"`` (official ``AvgPool2d(2)``, drops them).
        path: ``"auto"`` | ``"dense"`` | ``"core"`` | ``"lowrank"`` (equal results, different cost).

    Shapes: ``forward(x (B, N, in), hw=(H, W))`` → ``(B, N, out)``; ``hw`` defaults to a square grid.
    Parameters keep the official layouts: ``weight`` is ``(in, out)`` (transpose of ``nn.Linear``).
    """

    def __init__(self, in_features: int, out_features: Optional[int] = None, reduction: int = 4,
                 odd_pool: str = "ceil", path: str = "auto"):
        super().__init__()
        out_features = out_features or in_features
        if in_features % reduction or out_features % reduction:
            raise ValueError(f"in_features={in_features} and out_features={out_features} must be "
                             f"divisible by reduction={reduction}")
        if path not in DYNAMIC_LINEAR_PATHS:
            raise ValueError(f"path must be one of {DYNAMIC_LINEAR_PATHS}, got {path!r}")
        if odd_pool not in ("ceil", "floor"):
            raise ValueError(f"odd_pool must be 'ceil' or 'floor', got {odd_pool!r}")
        self.in_features, self.out_features, self.reduction = in_features, out_features, reduction
        self.odd_pool, self.path = odd_pool, path
        self.r_in, self.r_out = in_features // reduction, out_features // reduction
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.predictor = nn.Linear(in_features, self.r_in + self.r_out)
        self.expand_in = nn.Parameter(torch.empty(self.r_in, in_features))
        self.expand_out = nn.Parameter(torch.empty(self.r_out, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: truncated normal (std 0.02) for the static weight, the bias, the expansion
        matrices and the predictor weight; zero predictor bias."""
        for p in (self.weight, self.bias, self.expand_in, self.expand_out, self.predictor.weight):
            trunc_normal_(p, std=0.02)
        nn.init.zeros_(self.predictor.bias)

    def forward(self, x: Tensor, hw: Optional[Tuple[int, int]] = None) -> Tensor:
        p, q = self.branch_codes(x, hw)
        return dynamic_linear(x, self.weight, self.bias, p, q, self.expand_in, self.expand_out, path=self.path)

    def branch_codes(self, x: Tensor, hw: Optional[Tuple[int, int]] = None) -> Tuple[Tensor, Tensor]:
        """The activated codes ``SiLU(P)`` (rows weighted by window area on odd grids) and ``SiLU(Q)``."""
        hw = _check_tokens(x, hw)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected {self.in_features} input features, got {x.shape[-1]}")
        pooled, window_weights = pool_tokens_2x2(x, hw, self.odd_pool)
        p, q = self.predictor(pooled).split([self.r_in, self.r_out], dim=-1)
        p, q = F.silu(p), F.silu(q)
        if window_weights is not None:
            p = p * window_weights.to(p.dtype)[:, None]
        return p, q

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, reduction={self.reduction}, "
                f"odd_pool={self.odd_pool!r}, path={self.path!r}")


def _adaptive_avg_pool_by_slices(x: Tensor, k: int) -> Tensor:
    """``F.adaptive_avg_pool2d(x, k)`` as ``k²`` window means (the same windows): for ``torch.jit.trace``,
    whose ONNX exporter pools only to sizes that divide the input."""
    def windows(n: int):
        return [((i * n) // k, -((-(i + 1) * n) // k)) for i in range(k)]   # floor(i·n/k), ceil((i+1)·n/k)
    rows, cols = windows(int(x.shape[-2])), windows(int(x.shape[-1]))
    means = [x[..., a:b, c:d].mean((-2, -1)) for a, b in rows for c, d in cols]
    return torch.stack(means, dim=-1).unflatten(-1, (k, k))


class DynamicDepthwiseConv(nn.Module):
    """Depthwise k×k convolution whose kernels are predicted per sample ("spatially adaptive").

    The input is average-pooled to ``k × k`` (adaptive), a shared channel MLP (1×1 conv → GELU →
    1×1 conv without bias) turns pooled region (u, v) into kernel tap (u, v) for every channel, each
    predicted kernel is normalised ``K / (‖K‖_F + 1)`` and added to the static kernel; the result is
    applied with one grouped convolution over the whole batch (bias shared, 'same' padding).

    Shapes: ``forward(x (B, C, H, W))`` → ``(B, C, H, W)`` (channels-last memory).
    Parameters keep the official shapes: ``weight`` ``(C, 1, k, k)``, ``bias`` ``(C,)``.
    """

    def __init__(self, dim: int, kernel_size: int = 3):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.dim, self.kernel_size = dim, kernel_size
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(dim))
        self.predictor = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=1), nn.GELU(), nn.Conv2d(dim, dim, kernel_size=1, bias=False))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: truncated normal (std 0.02) for the static kernel and bias; the predictor's
        1×1 convs keep PyTorch's default init."""
        trunc_normal_(self.weight, std=0.02)
        trunc_normal_(self.bias, std=0.02)

    def predict_kernels(self, x: Tensor) -> Tensor:
        """The per-sample kernels ``W0 + normalised ΔK`` of shape ``(B, C, k, k)``."""
        k, C = self.kernel_size, self.dim
        pool = _adaptive_avg_pool_by_slices if torch.jit.is_tracing() else F.adaptive_avg_pool2d
        pooled = pool(x, k).flatten(2).transpose(1, 2)  # B, k·k, C
        # the 1×1 convs as linears over the k·k pooled regions: same math, one GEMM each instead
        # of a convolution on a 3×3 image (which is slow on CPU)
        conv1, act, conv2 = self.predictor
        h = act(F.linear(pooled, conv1.weight.view(C, C), conv1.bias))
        delta = F.linear(h, conv2.weight.view(C, C)).transpose(1, 2).reshape(-1, C, k, k)
        return normalize_kernels(delta) + self.weight.view(1, C, k, k)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(f"expected (B, {self.dim}, H, W), got shape {tuple(x.shape)}")
        return dynamic_depthwise_conv2d(x, self.predict_kernels(x), self.bias)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}"


def _onednn_linear_available() -> bool:
    try:
        x = torch.ones(1, 2)
        return bool(torch.ops.mkldnn._linear_pointwise(x, torch.ones(3, 2), None, "gelu", [], "none").shape == (1, 3))
    except Exception:  # no oneDNN in this build, or a changed private signature
        return False


_ONEDNN_LINEAR: Optional[bool] = None


def _use_onednn(x: Tensor) -> bool:
    """The fused oneDNN inference path applies: float32 CPU tensors, no autograd, no autocast."""
    global _ONEDNN_LINEAR
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled():
        return False
    if torch.is_autocast_enabled("cpu") or torch.jit.is_scripting() or torch.compiler.is_compiling():
        return False  # traced: plain linears (inductor fuses them; export/ONNX keep a symbolic batch)
    if _ONEDNN_LINEAR is None:
        _ONEDNN_LINEAR = _onednn_linear_available()
    return _ONEDNN_LINEAR


def _onednn_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], gelu: Optional[str] = None) -> Tensor:
    """``[GELU](x @ weight.T + bias)`` as one oneDNN primitive (bias and GELU fused in the epilogue)."""
    if gelu is None:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], gelu)


class _Mlp(nn.Module):
    """fc1 (static or :class:`DynamicLinear`) → GELU → dropout → fc2 → dropout.

    Inference fast path (float32 CPU, no grad, no autocast, exact or tanh GELU, inactive dropout):
    each linear is one oneDNN primitive with the bias and the GELU fused into it, so the
    ``(B, N, 4C)`` hidden is written once and never re-read for the bias or the activation; the
    dynamic layer forms its per-sample ``W0 + ΔW`` and runs fc1 → GELU → fc2 one sample at a time. On this
    project's AMD CPU oneDNN's GEMM is also ~2× faster than the MKL ``addmm`` behind ``nn.Linear``.
    Same results up to float32 rounding (tested); training and other dtypes take the plain path.
    """

    def __init__(self, dim: int, hidden: int, dynamic: bool, act_layer: Callable, drop: float,
                 odd_pool: str, linear_path: str):
        super().__init__()
        self.dynamic = dynamic
        if dynamic:
            self.fc1 = DynamicLinear(dim, hidden, odd_pool=odd_pool, path=linear_path)
        else:
            self.fc1 = nn.Linear(dim, hidden)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)
        self.fused_inference = True

    def _fast_ok(self, x: Tensor) -> bool:
        return (self.fused_inference and isinstance(self.act, nn.GELU) and self.act.approximate in ("none", "tanh")
                and (not self.training or (self.drop1.p == 0 and self.drop2.p == 0)) and _use_onednn(x))

    def _dynamic_weight(self, x: Tensor, hw: Tuple[int, int]) -> Optional[Tensor]:
        """Per-sample ``(B, out, in)`` weight of the dynamic fc1, or ``None`` on the low-rank path."""
        fc1 = self.fc1
        p, q = fc1.branch_codes(x, hw)
        N, M = x.shape[1], p.shape[1]
        path = fc1.path
        if path == "auto":
            path = choose_dynamic_linear_path(N, M, fc1.in_features, fc1.out_features, fc1.r_in, fc1.r_out)
        if path == "lowrank":
            return None
        delta = dynamic_linear_delta(p, q, fc1.expand_in, fc1.expand_out, fc1.in_features ** -0.5 / N, path)
        return (delta + fc1.weight).transpose(1, 2)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        if self._fast_ok(x):
            gelu = self.act.approximate
            if not self.dynamic:
                h = _onednn_linear(x, self.fc1.weight, self.fc1.bias, gelu)
                return _onednn_linear(h, self.fc2.weight, self.fc2.bias)
            w = self._dynamic_weight(x, hw)
            if w is not None:  # one sample at a time: only one sample's (N, 4C) hidden is alive
                return torch.stack([
                    _onednn_linear(_onednn_linear(x[i], w[i], self.fc1.bias, gelu), self.fc2.weight, self.fc2.bias)
                    for i in range(x.shape[0])])
        x = self.fc1(x, hw) if self.dynamic else self.fc1(x)
        if isinstance(self.act, nn.GELU) and not (torch.is_grad_enabled() and x.requires_grad):
            # inference: GELU in place, so the (B, N, 4C) hidden exists once, not twice
            x = torch.ops.aten.gelu_(x, approximate=self.act.approximate)
        else:
            x = self.act(x)
        x = self.fc2(self.drop1(x))  # one name for the hidden, so fc1's output is freed early
        return self.drop2(x)


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
        self.mlp = _Mlp(dim, int(dim * mlp_ratio), dynamic, act_layer, proj_drop, odd_pool, linear_path)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor, hw: Optional[Tuple[int, int]] = None) -> Tensor:
        hw = _check_tokens(x, hw)
        if self.dynamic and self.norm_residual:
            x = self.norm1(x)
            x = x + _to_tokens(self.dwconv(_grid_view(x, hw)))
        else:  # static blocks: norm1 is the identity
            x = x + _to_tokens(self.dwconv(_grid_view(self.norm1(x), hw)))
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
