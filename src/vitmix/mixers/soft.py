"""SOFT: softmax-free attention with a Gaussian kernel, Nyström landmarks and a Newton–Schulz inverse.

Faithful to the official SOFT code (``fudan-zvg/SOFT``, ``SoftmaxFreeAttention``), see
``docs/soft-laplacianformer.md``:

* one query projection ``W_q`` and a value projection ``W_v``; **keys are the queries** (``K = Q``,
  there is no ``W_k``), so the kernel matrix is symmetric;
* ``Q`` is scaled by ``d^(-1/4)`` and compared with the Gaussian kernel ``exp(-‖x - y‖² / 2)``, i.e.
  ``S_ij = exp(-‖q_i - q_j‖² / (2√d))`` — unnormalised (no softmax, no row sums);
* landmarks (bottleneck tokens) from the scaled queries on the token grid: a ``s×s`` stride-``s``
  convolution shared by all heads, then ``LayerNorm(d)`` and GELU (official, ``landmarks="conv"``)
  or parameter-free average pooling (the paper's, ``landmarks="avgpool"``); the landmark keys are
  the landmark queries;
* ``Y = K(Q, L) · NS(K(L, L)) · (K(L, Q) · V)`` evaluated right to left (never N×N), plus a local
  term: one ``k×k`` spatial filter per head, shared by the head's ``d`` channels, applied to ``V``;
* merged heads go through the output projection ``ff``.

``soft_norm`` (SOFT++ / SOFT-Norm) normalises the landmark inverse symmetrically,
``D^(-1/2) · NS(A) · D^(-1/2)`` with ``D`` the row sums of the landmark kernel ``A``. The official
class cannot be built (a ``NameError``); this one works.

``preset="official"`` switches every option where vitmix's default departs from the official code
(SOFT: the Newton start and the stride-only, floored landmarks; SOFT-Norm: in addition the original
backtracking Newton iteration its official kernel calls), see ``docs/presets.md``.

Parameter names follow the official modules (``W_q``, ``W_v``, ``Qlandmark_op``, ``Qnorm_act``,
``conv``, ``ff``) so official state dicts map one to one.

Prefix tokens (CLS/registers, e.g. inside a stock timm ``VisionTransformer``) take part as ordinary
queries and keys of the kernel attention; the landmarks and the local convolution use the ``H×W``
grid tokens only (prefix tokens get no local term).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..ops._common import no_autocast
from .grid import (
    adaptive_pool,
    LandmarkCount, add_to_grid, grid_channels_first, head_conv, merge_heads, split_heads, tokens_from_channels_first,
)
from .landmark import LandmarkMixer, average_pooling_weight, check_conv_kernel, masked_nystrom
from .options import check_choice, check_newton, reject_unsupported, stride_option
from .presets import DEFAULT_PRESET, FROM_PRESET, resolve_preset
from .flops import landmark_total, linears_flops, local_conv_flops, nystrom_flops, segment_flops
from .registry import register_mixer
from .sequence import as_row, is_sequence, segment_means, zero_padding

#: the inverses of the landmark kernel (``inverse=``)
INVERSES = ("newton", "exact", "newton_legacy")
_LEGACY_TOL, _LEGACY_HALVINGS = 1.01, 10


def newton_inverse_legacy(A: torch.Tensor, iters: int = 20, eps: float = 0.0) -> torch.Tensor:
    """SOFT's original Newton–Schulz inverse (NeurIPS 2021), which the official SOFT-Norm kernel still calls.

    ``P = A + eps·I`` (official: ``eps = 0``); ``α = 2 / (max row sum of P)²`` with the maximum taken
    over the **whole batch** (every sample and head shares one α, so a sample's result depends on
    the others in its batch); ``α`` is halved while ``max_j Σ_i |I - α P²|_ij > 1.01``, at most 10
    times; then ``V <- 2V - V P V`` ``iters`` times from ``V0 = α P``. Gradients flow through every
    iteration and through ``α`` (plain autograd, memory O(iters·m²)) as in the official code, not
    through the implicit backward of :func:`vitmix.ops.newton_schulz_inverse`. This plain loop is
    its own reference; use it only to reproduce official SOFT-Norm results.

    Args:
        A: ``(..., m, m)`` landmark kernel matrices (float32/float64).
        iters: Newton–Schulz iterations (official 20). eps: diagonal shift (official 0).
    Returns:
        ``V ≈ P⁻¹`` of the same shape and dtype.
    """
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    P = A + eps * eye if eps else A
    alpha = 2.0 / P.sum(-1).max().square()
    halvings = 0
    with torch.no_grad():  # the halving count is a discrete choice: no gradient, as in the official code
        P2 = P @ P
        while halvings < _LEGACY_HALVINGS and bool(
                (eye - alpha * 0.5 ** halvings * P2).abs().sum(-2).max() > _LEGACY_TOL):
            halvings += 1
    V = (alpha * 0.5 ** halvings) * P
    for _ in range(iters):
        V = 2 * V - V @ P @ V
    return V


# ---------------------------------------------------------------------------------------------
@register_mixer("soft")
class SoftAttention(LandmarkMixer):
    """SOFT softmax-free attention: Gaussian kernel, Nyström landmarks, Newton–Schulz (official code).

    The module docstring lists what follows the official code.

    Args:
        dim, num_heads: channels and heads (``d = dim / num_heads``; the released models use d = 32).
        qkv_bias: bias of ``W_q`` and ``W_v`` (the official models use ``True``).
        proj_bias, proj_drop: bias of, and dropout after, the output projection ``ff``.
        preset: ``"default"`` (vitmix's choices below) or ``"official"`` (the official code wherever
            vitmix departs from it; the values are in :attr:`presets` and ``docs/presets.md``). The
            five options marked *(preset)* default to the preset's value; passing one explicitly
            overrides the preset for that option only. They exist for ablations and for reproducing
            the official code; ``preset`` is the switch meant for users.
        landmark_stride: landmark stride ``s`` on the token grid (official ``sr_ratio`` 8 / 4 / 2 for
            stages 1–3, which gives m = 49 at 224²). The default 2 is stage 3's setting.
        sr_ratio: deprecated name of ``landmark_stride`` (warns).
        landmarks: ``"conv"`` (official: ``s×s`` stride-``s`` conv shared by heads, no bias, then
            LayerNorm + GELU) or ``"avgpool"`` (the paper's parameter-free average pooling).
        num_landmarks *(preset)*: ``"auto"`` (default): one landmark per ``s×s`` block, at most 7×7 =
            49 (the papers' m), so the layer is O(N) at any resolution, and on small grids no more
            than keep the layer's kernel attention within exact attention's FLOPs (5×5 at 14×14
            tokens and head dim 32; see :meth:`~vitmix.mixers.landmark.LandmarkMixer.landmark_count`);
            a perfect square or ``(mh, mw)``: that fixed count;
            ``None`` (official): the stride alone (m grows with the input, quadratic cost at high
            resolution). When the count is fixed and ``landmarks="conv"``, the grid is first
            adaptively pooled to ``(mh·s, mw·s)`` and the learnt conv applied (identity at the
            training resolution).
        conv_kernel: size ``k`` of the per-head local filter on ``V`` (official 9 / 5 / 3 for stages
            1–3; default 3); ``0`` or ``None`` disables it.
        newton_iters: Newton–Schulz iterations (20, official).
        newton_eps *(preset)*: diagonal perturbation ε of the landmark kernel (0.01; SOFT-Norm's
            official inverse uses none).
        newton_alpha *(preset)*: start ``V0 = αP`` of ``inverse="newton"``: ``"safe"`` (default,
            ``α = 1.8/‖A + εI‖∞²``) or ``"official"`` (SOFT's CUDA kernel, ``α = 1.8/‖A‖∞²`` from
            ``A`` before the shift; larger by ``((r + ε)/r)²`` for row-sum norm ``r``, which
            changes the eigen-directions the 20 steps leave unconverged, so outputs differ slightly).
        inverse *(preset)*: ``"newton"`` (default, the current official kernel with the implicit
            backward), ``"exact"`` (linear solve of ``A + εI``; analysis) or ``"newton_legacy"``
            (:func:`newton_inverse_legacy`: the original backtracking iteration the official SOFT-Norm
            kernel calls; batch-coupled, for reproduction only; ignores ``newton_alpha``).
        grid_remainder *(preset)*: with ``num_landmarks=None``, ``"error"`` (default) raises when the
            grid is not divisible by the stride; ``"floor"`` (official) lets border rows/columns
            join no landmark.
        backend: who computes the kernel matrices and the Newton–Schulz loop (:mod:`vitmix.ops`):
            ``"auto"`` (default: Triton for CUDA tensors when triton is installed, else PyTorch/C),
            ``"triton"`` or ``"torch"``; the numbers are the same up to float32 rounding (``docs/gpu.md``).
        hw, num_prefix_tokens: the token grid (see :class:`~vitmix.mixers.base.TokenMixer`).

    ``qk_norm``, ``scale_norm`` and ``attn_drop`` are not supported (``ValueError`` when set).
    """

    normalization: Optional[str] = None
    #: option values of each ``preset`` (every preset names the same options)
    presets = {
        "default": dict(num_landmarks="auto", newton_eps=0.01, newton_alpha="safe", inverse="newton",
                        grid_remainder="error"),
        "official": dict(num_landmarks=None, newton_eps=0.01, newton_alpha="official", inverse="newton",
                         grid_remainder="floor"),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        preset: str = DEFAULT_PRESET,
        landmark_stride: Optional[int] = None,
        landmarks: str = "conv",
        num_landmarks: LandmarkCount = FROM_PRESET,
        conv_kernel: Optional[int] = 3,
        newton_iters: int = 20,
        newton_eps: float = FROM_PRESET,
        newton_alpha: str = FROM_PRESET,
        inverse: str = FROM_PRESET,
        grid_remainder: str = FROM_PRESET,
        sr_ratio: Optional[int] = None,
        backend: str = "auto",
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        name = type(self).__name__
        reject_unsupported(name, qk_norm, scale_norm, attn_drop)
        stride = stride_option(name, landmark_stride, {"sr_ratio": sr_ratio}, default=2)
        opts = resolve_preset(name, self.presets, preset, num_landmarks=num_landmarks, newton_eps=newton_eps,
                              newton_alpha=newton_alpha, inverse=inverse, grid_remainder=grid_remainder)
        self._check_options(landmarks, conv_kernel, newton_iters, opts)
        self._init_landmarks(stride, opts["num_landmarks"], opts["grid_remainder"], conv_kernel, backend)
        self.preset = preset
        self.landmarks = landmarks
        self.newton_iters = int(newton_iters)
        self.newton_eps = float(opts["newton_eps"])
        self.newton_alpha = opts["newton_alpha"]
        self.inverse = opts["inverse"]
        self.scale = self.head_dim ** -0.25
        if self.inverse == "newton_legacy" or (self.inverse == "exact" and not self.newton_eps):
            self.padding_mask = "by_length"     # a batch-global α / a singular empty block: no in-batch mask
        self._build_layers(stride, qkv_bias, proj_bias, proj_drop)

    def _check_options(self, landmarks, conv_kernel, newton_iters, opts: dict) -> None:
        check_choice("landmarks", landmarks, ("conv", "avgpool"))
        check_choice("inverse", opts["inverse"], INVERSES)
        check_choice("newton_alpha", opts["newton_alpha"], ("safe", "official"))
        check_choice("grid_remainder", opts["grid_remainder"], ("error", "floor"))
        check_conv_kernel(conv_kernel)
        # the legacy iteration needs iterations as much as the current one does
        newton = "exact" if opts["inverse"] == "exact" else "newton"
        check_newton(type(self).__name__, newton_iters, opts["newton_eps"], newton)

    def _build_layers(self, stride: int, qkv_bias: bool, proj_bias: bool, proj_drop: float) -> None:
        """The official modules, under the official names (so official state dicts load one to one)."""
        dim, d, h = self.dim, self.head_dim, self.num_heads
        self.W_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.W_v = nn.Linear(dim, dim, bias=qkv_bias)
        if self.landmarks == "conv":
            self.Qlandmark_op = nn.Conv2d(d, d, kernel_size=stride, stride=stride, bias=False)
            self.Qnorm_act = nn.Sequential(nn.LayerNorm(d), nn.GELU())
        if self.conv_kernel:
            k = self.conv_kernel
            self.conv = nn.Conv2d(h, h, kernel_size=k, padding=k // 2, groups=h, bias=False)
        self.ff = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    #: SOFT's per-stage local-conv sizes (stages 1–4 of the official pyramids)
    stage_conv_kernels = (9, 5, 3, 3)

    @classmethod
    def stage_options(cls, stage: int, stride: int, newton_iters: int) -> dict:
        """Per-stage options in the pyramid backbones (official stride 8 / 4 / 2, conv 9 / 5 / 3)."""
        return dict(landmark_stride=stride, conv_kernel=cls.stage_conv_kernels[stage], newton_iters=newton_iters)

    @torch.no_grad()
    def load_attention(self, state: dict) -> None:
        """From a softmax layer (``vitmix.convert``): ``W_q`` and ``W_v`` take its query and value rows of
        ``qkv``, ``ff`` its ``proj``; its key rows have no place (SOFT's keys are its queries). The landmark
        conv starts as ``s×s`` average pooling (then the LayerNorm + GELU, which have no neutral setting),
        the local filter at zero."""
        c = self.dim
        weights = {"ff." + key[len("proj."):]: value for key, value in state.items() if key.startswith("proj.")}
        for layer, rows in (("W_q", slice(0, c)), ("W_v", slice(2 * c, 3 * c))):
            weights.update({f"{layer}.{p}": state[f"qkv.{p}"][rows] for p in ("weight", "bias") if f"qkv.{p}" in state})
        self._take_weights(weights)
        if self.landmarks == "conv":
            self.Qlandmark_op.weight.copy_(average_pooling_weight(self.head_dim, self.landmark_stride))
        self._zero_additive_terms()

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, head_dim={self.head_dim}, preset={self.preset!r}, "
                f"landmarks={self.landmarks!r}, {self._landmark_repr()}, newton_iters={self.newton_iters}, "
                f"inverse={self.inverse!r}")

    # -- pieces --------------------------------------------------------------------------------
    def _landmarks(self, q: torch.Tensor, grid) -> torch.Tensor:
        """Landmarks ``(B, heads, m, d)`` from the (scaled) grid queries."""
        if is_sequence(grid):
            return self._from_means(segment_means(q, grid, self.sequence_landmarks(grid.length)))
        prefix, h, w = grid
        b, nh = q.shape[:2]
        mh, mw = self.landmark_count(h, w)
        g = grid_channels_first(q, prefix, h, w)
        s = self.landmark_stride
        fixed = self.landmark_hw is not None
        if self.landmarks == "conv":
            if fixed and (mh * s, mw * s) != (h, w):
                g = adaptive_pool(g, (mh * s, mw * s))
            lm = tokens_from_channels_first(self.Qlandmark_op(g), b, nh)
            return self.Qnorm_act(lm)
        if fixed and (mh * s, mw * s) != (h, w):
            g = adaptive_pool(g, (mh, mw))
        else:
            g = F.avg_pool2d(g, s, s)
        return tokens_from_channels_first(g, b, nh)

    def _from_means(self, lm: torch.Tensor) -> torch.Tensor:
        """Landmarks from segment means on a 1-D sequence: with ``landmarks="conv"`` the s×s conv of a block
        that holds the segment mean everywhere (its summed taps), then LayerNorm + GELU."""
        if self.landmarks == "conv":
            return self.Qnorm_act(lm @ self.Qlandmark_op.weight.sum((2, 3)).T)
        return lm

    def _qv(self, x: torch.Tensor):
        q = split_heads(self.W_q(x), self.num_heads) * self.scale
        v = split_heads(self.W_v(x), self.num_heads)
        return q, v

    def _attend(self, q, v, lm):
        if self.inverse == "newton_legacy":
            return self._attend_legacy(q, v, lm)
        return ops.nystrom_attention(
            q, q, v, lm, lm, kernel="gaussian", iters=self.newton_iters, eps=self.newton_eps,
            alpha=self.newton_alpha, inverse=self.inverse, normalization=self.normalization, backend=self.backend,
        )

    def _attend_legacy(self, q, v, lm):
        """``K(Q, L) · M · (K(L, Q) · V)`` with ``M`` from :func:`newton_inverse_legacy` (normalised
        ``D^(-1/2) M D^(-1/2)`` for SOFT-Norm), in float32 (float64 stays float64) without autocast."""
        out_dtype = torch.promote_types(q.dtype, v.dtype)
        dt = torch.float64 if out_dtype == torch.float64 else torch.float32
        with no_autocast(q.device.type):
            qf, vf, lf = q.to(dt), v.to(dt), lm.to(dt)
            k1 = ops.gaussian_kernel(qf, lf, backend=self.backend)         # (B, h, N, m)
            a = ops.gaussian_kernel(lf, lf, backend=self.backend)          # (B, h, m, m)
            M = newton_inverse_legacy(a, self.newton_iters, self.newton_eps)
            if self.normalization == "soft_norm":
                dinv = a.sum(-1).rsqrt()
                M = dinv.unsqueeze(-1) * M * dinv.unsqueeze(-2)
            out = k1 @ (M @ (k1.mT @ vf))
        return out.to(out_dtype)

    def analytic_flops(self, batch: int, n: int) -> int:
        m = landmark_total(self, n)
        total = linears_flops(self, batch * n)  # W_q, W_v, ff
        total += batch * self.num_heads * (self.landmark_flops(n, m) + segment_flops(self, n, m, pooled=1))
        return total + local_conv_flops(self, batch, n)

    def landmark_flops(self, n: int, m: int) -> int:
        d, s = self.head_dim, self.landmark_stride
        window = 1 if self.sequence else s * s        # on a sequence: the conv's summed s×s taps, one product
        conv = 2 * m * d * d * window if self.landmarks == "conv" else 0    # the learnt landmark conv
        return conv + nystrom_flops(n, m, d, self.newton_iters, tied=True, normalization=self.normalization,
                                    inverse=self.inverse)

    def _fused(self, x: torch.Tensor, grid) -> Optional[torch.Tensor]:
        """The token mixing before ``ff`` as one C call, with a C backward when autograd records
        (:mod:`vitmix.mixers.fused.soft`), on CPU in float32/float64 where its ``supports`` rule holds: the
        Newton–Schulz inverse (not the legacy one) and the official landmark module (strided conv, LayerNorm,
        exact GELU) or average pooling; ``None`` otherwise (the composed path, :meth:`_composed`, runs). At small
        widths the composed path's small ops (two mkldnn convs per layer among them, forward and backward) cost
        more than their arithmetic."""
        from .fused import soft as fused

        return fused.mix(self, x, grid) if fused.supports(self, x, grid) else None

    def mix(self, x, grid, attn_mask=None, is_causal=False, mask=None):
        if mask is not None:
            return self.proj_drop(self.ff(self._masked(x, grid, mask)))
        fused = self._fused(x, grid)
        return self.proj_drop(self.ff(fused if fused is not None else self._composed(x, grid)))

    def _composed(self, x: torch.Tensor, grid) -> torch.Tensor:
        """The token mixing before ``ff`` as a composition of torch ops and :mod:`vitmix.ops` (every option, device
        and dtype; the reference of the C paths)."""
        prefix, h, w = as_row(grid)
        q, v = self._qv(x)
        lm = self._landmarks(q, grid)
        out = self._attend(q, v, lm)
        if self.conv_kernel:
            out = add_to_grid(out, head_conv(self.conv, v, prefix, h, w).to(out.dtype), prefix)
        return merge_heads(out)

    def _masked(self, x: torch.Tensor, grid, mask: torch.Tensor) -> torch.Tensor:
        """:meth:`_composed` on a padded 1-D batch: each sample's own segment means, padded keys and empty
        landmark slots left out (:func:`~vitmix.mixers.landmark.masked_nystrom`), padded values zero before
        the local conv."""
        q, v = self._qv(x)
        pool, slots = self._landmark_pool(grid, mask, q.dtype)
        lm = self._from_means(pool @ q)
        v = zero_padding(v, mask)
        out = masked_nystrom(q, q, v, lm, lm, slots, mask, "gaussian", iters=self.newton_iters, eps=self.newton_eps,
                             alpha=self.newton_alpha, inverse=self.inverse, normalization=self.normalization,
                             backend=self.backend).to(v.dtype)
        if self.conv_kernel:
            out = add_to_grid(out, head_conv(self.conv, v, *as_row(grid)).to(out.dtype), grid.prefix)
        return merge_heads(out)

    def _kernel_weights(self, x, grid, values):
        q, _ = self._qv(x)
        return self._attend(q, values.to(q.dtype), self._landmarks(q, grid))


@register_mixer("soft_norm")
class SoftNormAttention(SoftAttention):
    """SOFT-Norm (SOFT++): :class:`SoftAttention` with ``D^(-1/2)·NS(A)·D^(-1/2)``.

    ``D`` is the diagonal of row sums of the landmark kernel ``A`` (the official code's landmark
    degrees, not the full-matrix degrees). Same options as :class:`SoftAttention`; the normalisation
    formula is the official one, but the official class normalises the inverse of its *original*
    Newton iteration (batch-global α, no ε, backtracking, unrolled gradients), so
    ``preset="official"`` also sets ``inverse="newton_legacy"`` and ``newton_eps=0``.
    """

    normalization = "soft_norm"
    presets = {
        "default": SoftAttention.presets["default"],
        "official": dict(SoftAttention.presets["official"], inverse="newton_legacy", newton_eps=0.0),
    }


__all__ = ["SoftAttention", "SoftNormAttention", "newton_inverse_legacy"]
