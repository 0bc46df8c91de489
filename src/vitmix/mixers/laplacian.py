"""LaplacianFormer attention: Laplacian kernel, Nyström landmarks, Newton–Schulz, injective map.

Reconstruction of LaplacianFormer (Feng et al., ICLR 2026, arXiv 2604.20368); only the abstract and
the authors' CUDA operators are public, so several choices are vitmix's own. Each is an option and
documented in ``docs/soft-laplacianformer.md``:

* **kernel** ``k(x, y) = exp(-‖x - y‖₁ / λ)``, ``λ = 4`` (``lam``) [paper / student re-implementation];
* **input scaling** (not public): queries and keys are multiplied by ``qk_scale``, default
  ``d^(-1/2)``. The L1 distance of ``d``-dim vectors grows like ``d·E|Δ|``, so unscaled features
  drive the kernel values towards ``e^{-d/λ}`` and the landmark matrix towards ``εI``;
  ``d^(-1/2)`` plays the role of softmax's ``1/√d``. ``qk_scale=1.0`` gives the raw kernel;
  ``qk_norm=True`` adds a per-head LayerNorm on ``q`` and ``k`` before the scaling;
* **separate** ``Q`` and ``K`` projections (one fused ``qkv`` linear, as timm);
* **landmarks** by average pooling ``r×r`` with stride ``r`` (``landmark_stride``) of the grid queries and
  keys, at most 7×7 = 49 of them by default (adaptive pooling: O(N) at any resolution), fewer on small
  grids where 49 would cost more than exact attention;
* ``Ĝ = K(Q, K̃) · NS(K(Q̃, K̃)) · K(Q̃, K)`` evaluated right to left; the landmark matrix is not
  symmetric, so Newton–Schulz starts from ``α·Pᵀ`` (never diverges; ``newton_alpha="safe"`` gives the
  faster-converging start of :func:`vitmix.ops.newton_schulz_inverse`);
* the **injective normalised feature map** (default ``normalize=True``): each row is centred by
  its mean over keys, each key column is divided by ``√(var over queries + norm_eps)``, and
  ``1/N`` is added; computed in linear time by :func:`vitmix.ops.nystrom_attention`. By default
  (``norm_scale="tokens"``) the whitened part is divided by N so the map is an average plus a
  contrast term (``"none"``: the formula as reconstructed, which trains poorly; see the docs).
  ``normalize=False`` is the un-normalised ablation;
* a **local depthwise convolution** on ``V`` (not public): default per-channel ``3×3`` with bias
  (``conv_groups="channel"``, as PVT-style re-implementations); ``"head"`` gives SOFT's per-head
  filter shared by the head's channels (faster early on digits, weaker on Fashion-MNIST with 2 heads);
  ``conv_kernel=0`` disables it;
* optional 2-D axial **RoPE** on the grid queries and keys (``rope=True``), reported by secondary
  sources for the paper's backbone.

Prefix tokens (CLS/registers) are ordinary queries and keys; the landmarks, RoPE and the local
convolution use the grid tokens only.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .grid import adaptive_pool, LandmarkCount, grid_channels_first, head_conv, merge_heads, tokens_from_channels_first
from .landmark import LandmarkMixer, check_conv_kernel
from .options import check_choice, check_newton, reject_unsupported, stride_option
from .flops import landmark_total, linear_flops, linears_flops, local_conv_flops, nystrom_flops
from .registry import register_mixer


def rope_2d(t: torch.Tensor, prefix: int, h: int, w: int, base: float = 100.0) -> torch.Tensor:
    """2-D axial rotary embedding of the grid tokens of ``t (B, heads, P + H*W, d)``.

    The first ``d/2`` channels rotate with the row index, the last ``d/2`` with the column index
    (``d/4`` frequencies ``base^(-j/(d/4))`` each, rotate-half pairing). Prefix tokens are unchanged.
    """
    d = t.shape[-1]
    quarter = d // 4
    freqs = base ** (-torch.arange(quarter, device=t.device, dtype=torch.float32) / quarter)
    rows = torch.arange(h, device=t.device, dtype=torch.float32)[:, None].expand(h, w).reshape(-1)
    cols = torch.arange(w, device=t.device, dtype=torch.float32)[None, :].expand(h, w).reshape(-1)
    ang = torch.cat([rows[:, None] * freqs, cols[:, None] * freqs], dim=-1)  # (HW, d/2)
    cos, sin = ang.cos().to(t.dtype), ang.sin().to(t.dtype)
    g = t[:, :, prefix:]
    g1, g2 = g[..., : d // 2], g[..., d // 2:]  # pairs (g1_j, g2_j) share angle j
    rot = torch.cat([g1 * cos - g2 * sin, g1 * sin + g2 * cos], dim=-1)
    return rot if prefix == 0 else torch.cat([t[:, :, :prefix], rot], dim=2)


@register_mixer("laplacian")
class LaplacianAttention(LandmarkMixer):
    """LaplacianFormer attention: L1 kernel, Nyström landmarks, Newton–Schulz inverse, injective map.

    Each design choice is explained in the module docstring.

    Args:
        dim, num_heads: channels and heads.
        qkv_bias, qk_norm, proj_bias, proj_drop, norm_layer: timm's meaning (``qk_norm`` uses
            ``norm_layer`` or LayerNorm on each head's ``q`` and ``k``).
        landmark_stride: landmark pooling window ``r`` on the token grid (per stage 8 / 4 / 2 / 1 in
            the pyramid; default 2).
        pool_ratio: deprecated name of ``landmark_stride`` (warns).
        num_landmarks: ``"auto"`` (default): one landmark per ``r×r`` block, at most 7×7 = 49, by
            adaptive average pooling, and on small grids no more than keep the kernel attention within
            exact attention's FLOPs but not below 4×4 — at head dim 32: 16 landmarks on an 8×8 grid, 25 on
            14×14, 49 from 28×28 up — so the layer is O(N) at any resolution and, above 4×4 landmarks,
            never costlier than what it approximates
            (:meth:`~vitmix.mixers.landmark.LandmarkMixer.landmark_count`); a perfect
            square or ``(mh, mw)``: that fixed count; ``None``: ``r×r`` pooling alone (m = N/r²,
            quadratic cost at high resolution).
        lam: Laplacian kernel bandwidth λ (default 4).
        qk_scale: multiplier of ``q`` and ``k`` before the L1 distance; ``None`` → ``d^(-1/2)``.
        normalize: apply the injective normalised feature map (default) or not (ablation).
        norm_eps: ε under the column-variance square root of the normalisation (default 1e-3).
            Columns whose variance over the queries is below ε are damped towards the uniform map.
            The student re-implementation's 1e-6 whitens the near-constant columns of the initial
            kernel into amplified noise (digits: qkv gradients dominate the clipped update). 1e-4
            learned faster in 2-epoch diagnostic runs but worse on the full short grid recipe
            (63.8 against 70.9 %, width 96, 3 heads, seed 0), so 1e-3 stays
            (``docs/soft-laplacianformer.md``, "Off the tuning recipe").
        norm_scale: ``"tokens"`` (default) divides the whitened part of the map by N, so that
            ``ZV = mean(V) + (R·D^(-1/2)·V)/N`` (an average plus a unit-scale contrast; still
            injective); ``"none"`` is the reconstructed paper formula ``Z = R·D^(-1/2) + 1/N``, whose
            ``√N``-sized outputs give ~20x larger gradients at initialisation and train poorly
            with gradient clipping (see ``docs/soft-laplacianformer.md``); ``"sqrt"`` divides by √N
            (ablation); ``"learnt"`` learns a per-head exponent θ (init 0) of the factor
            ``N^(θ-1)``, which moves between the three (ablation).
        temperature: ``"head"`` multiplies the whitened part by a learnt per-head factor (ablation;
            ``"none"`` default).
        mean_weight: the initial value of a learnt per-head weight of the map's ``mean(V)`` term (its
            ``1/N``). ``0.0`` (default) starts the layer without the uniform average that every token
            receives at initialisation, so it starts from its local conv as SOFT does; it learned
            faster or as fast at every grid shape and on digits, over 3 seeds each
            (``docs/soft-laplacianformer.md``, "The map's mean(V) term"). ``None``: the reconstructed
            map's fixed weight 1 (no parameter; checkpoints saved before this default load as weight 1).
            Unused with ``normalize=False``.
        newton_iters: Newton–Schulz iterations (default 10). With the ``α·Pᵀ`` start the iterate
            inverts only the large singular directions of the landmark matrix; 10 steps filter more
            than SOFT's 20 and learned faster and with less seed spread at every grid shape and on
            the CI guard (``docs/soft-laplacianformer.md``, "Newton–Schulz steps"). The pyramid
            models pass their own count (20).
        newton_eps: diagonal perturbation of the landmark matrix (0.01).
        newton_alpha: ``"transpose"`` (default: ``α·Pᵀ``, ``α = 1/(‖P‖₁‖P‖∞)``: never diverges and,
            like SOFT's start, leaves the smallest eigen-directions of ``P`` un-inverted — a
            spectrally filtered inverse that learned faster in the measurements),
            ``"safe"`` (the converging start of :func:`vitmix.ops.newton_schulz_inverse`: the scaled
            identity where the symmetric part of ``P`` is positive definite, residual ≤ 1e-3 after
            20 steps at cond ≈ 500) or ``"official"`` (the authors' CUDA: ``V₀ = α·P``,
            ``α = 1.8/‖W‖∞²``, which can diverge for tiny kernel values).
        inverse: ``"newton"`` (default) or ``"exact"`` (linear solve; analysis).
        conv_kernel: local depthwise conv size on ``V`` (default 3; 0/None disables).
        conv_groups: ``"channel"`` (default: per-channel depthwise with bias, as PVT-style
            re-implementations) or ``"head"`` (SOFT's per-head filter shared across the head's
            channels, no bias: learns the local prior sooner on digits but has only one filter per
            head; see the learning study in ``docs/soft-laplacianformer.md``).
        rope: apply 2-D axial RoPE to grid queries and keys (needs ``head_dim % 4 == 0``).
        rope_base: RoPE frequency base.
        grid_remainder: with ``num_landmarks=None``, ``"error"`` (default) or ``"floor"`` when the
            grid is not divisible by the stride.
        backend: who computes the kernel matrices and the Newton–Schulz loop (:mod:`vitmix.ops`):
            ``"auto"`` (default: Triton for CUDA tensors when triton is installed, else PyTorch/C),
            ``"triton"`` or ``"torch"``; the numbers are the same up to float32 rounding (``docs/gpu.md``).
        hw, num_prefix_tokens: the token grid (see :class:`~vitmix.mixers.base.TokenMixer`).

    ``scale_norm`` and ``attn_drop`` are not supported (``ValueError`` when set).
    """

    #: ``num_landmarks="auto"`` keeps at least 4×4 landmarks where the stride grid has them: with 3×3
    #: on the demo's 8×8 grid (the exact-cost rule alone) digits learned 10–20 points slower mid-run
    #: than with 4×4 (docs/soft-laplacianformer.md, "Landmark count")
    min_landmark_side = 4

    #: the string options and the values each accepts
    _CHOICES = {
        "inverse": ("newton", "exact"),
        "newton_alpha": ("safe", "transpose", "official"),
        "conv_groups": ("channel", "head"),
        "norm_scale": ("none", "tokens", "sqrt", "learnt"),
        "temperature": ("none", "head"),
        "conv_init": ("default", "zero"),
        "grid_remainder": ("error", "floor"),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        landmark_stride: Optional[int] = None,
        num_landmarks: LandmarkCount = "auto",
        lam: float = 4.0,
        qk_scale: Optional[float] = None,
        normalize: bool = True,
        norm_eps: float = 1e-3,
        norm_scale: str = "tokens",
        newton_iters: int = 10,
        newton_eps: float = 0.01,
        newton_alpha: str = "transpose",
        inverse: str = "newton",
        conv_kernel: Optional[int] = 3,
        conv_groups: str = "channel",
        rope: bool = False,
        rope_base: float = 100.0,
        grid_remainder: str = "error",
        temperature: str = "none",
        mean_weight: Optional[float] = 0.0,
        conv_init: str = "default",
        pool_ratio: Optional[int] = None,
        backend: str = "auto",
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        name = type(self).__name__
        reject_unsupported(name, False, scale_norm, attn_drop)
        stride = stride_option(name, landmark_stride, {"pool_ratio": pool_ratio}, default=2)
        for key, value in dict(inverse=inverse, newton_alpha=newton_alpha, conv_groups=conv_groups,
                               norm_scale=norm_scale, temperature=temperature, conv_init=conv_init,
                               grid_remainder=grid_remainder).items():
            check_choice(key, value, self._CHOICES[key])
        self._check_numbers(lam, conv_kernel, newton_iters, newton_eps, inverse, rope, mean_weight)
        self._init_landmarks(stride, num_landmarks, grid_remainder, conv_kernel, backend)
        self.lam = float(lam)
        self.qk_scale = self._qk_scale(qk_scale)
        self.qk_normed = bool(qk_norm)
        self.normalize, self.norm_eps, self.norm_scale = bool(normalize), float(norm_eps), norm_scale
        self.newton_iters, self.newton_eps = int(newton_iters), float(newton_eps)
        self.newton_alpha, self.inverse = newton_alpha, inverse
        self.conv_groups = conv_groups
        self.rope, self.rope_base = bool(rope), float(rope_base)
        self._build_layers(qkv_bias, qk_norm, proj_bias, proj_drop, norm_layer, conv_init, temperature)
        # learnt per-head weight of the map's mean(V) term (None: the map's fixed 1; no map, no weight)
        self.mean_weight = (nn.Parameter(torch.full((self.num_heads,), float(mean_weight)))
                            if mean_weight is not None and self.normalize else None)

    def _check_numbers(self, lam, conv_kernel, newton_iters, newton_eps, inverse: str, rope: bool,
                       mean_weight: Optional[float] = None) -> None:
        """``ValueError`` for numeric options out of range (the string options are checked against
        ``_CHOICES``)."""
        name = type(self).__name__
        if not lam > 0:
            raise ValueError(f"lam={lam} must be > 0 (the Laplacian kernel bandwidth)")
        if mean_weight is not None and not math.isfinite(mean_weight):
            raise ValueError(f"mean_weight={mean_weight} must be a finite number (the initial weight) or None")
        check_conv_kernel(conv_kernel)
        check_newton(name, newton_iters, newton_eps, inverse, default_iters=10)
        if rope and self.head_dim % 4:
            raise ValueError(f"rope=True needs head_dim divisible by 4, got head_dim={self.head_dim} "
                             f"(dim={self.dim}, num_heads={self.num_heads}); change num_heads or set rope=False")

    def _qk_scale(self, qk_scale: Optional[float]) -> float:
        scale = float(qk_scale) if qk_scale is not None else self.head_dim ** -0.5
        if not scale > 0:
            raise ValueError(f"qk_scale={qk_scale} must be > 0 (None gives head_dim ** -0.5)")
        return scale

    def _build_layers(self, qkv_bias, qk_norm, proj_bias, proj_drop, norm_layer, conv_init, temperature) -> None:
        """The parameters, created in a fixed order (it fixes their initial values for a given seed)."""
        dim, d, h = self.dim, self.head_dim, self.num_heads
        norm_layer = norm_layer or nn.LayerNorm
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(d) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(d) if qk_norm else nn.Identity()
        if self.conv_kernel:
            self.conv = self._local_conv(conv_init)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.log_tau = nn.Parameter(torch.zeros(h)) if temperature == "head" else None
        # learnt per-head exponent θ of the contrast scale N^(θ-1): 0 = "tokens", ½ = "sqrt", 1 = "none"
        self.scale_exponent = nn.Parameter(torch.zeros(h)) if self.norm_scale == "learnt" else None

    def _local_conv(self, conv_init: str) -> nn.Conv2d:
        """The depthwise conv on ``V``: per channel with bias, or one bias-free filter per head."""
        k, h = self.conv_kernel, self.num_heads
        if self.conv_groups == "channel":
            conv = nn.Conv2d(self.dim, self.dim, kernel_size=k, padding=k // 2, groups=self.dim, bias=True)
        else:
            conv = nn.Conv2d(h, h, kernel_size=k, padding=k // 2, groups=h, bias=False)
        if conv_init == "zero":      # the local term starts at 0 and is learnt
            nn.init.zeros_(conv.weight)
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)
        return conv

    @classmethod
    def stage_options(cls, stage: int, stride: int, newton_iters: int) -> dict:
        """Per-stage options in the pyramid backbones (stride 8 / 4 / 2 / 1)."""
        return dict(landmark_stride=stride, newton_iters=newton_iters)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, head_dim={self.head_dim}, {self._landmark_repr()}, lam={self.lam}, "
                f"qk_scale={self.qk_scale:.4g}, normalize={self.normalize}, rope={self.rope}")

    # -- pieces --------------------------------------------------------------------------------
    def _pool_map(self, g: torch.Tensor) -> torch.Tensor:
        """Landmark pooling of a channels-first grid ``(B', C', H, W)``."""
        h, w = g.shape[-2:]
        mh, mw = self.landmark_count(h, w)
        s = self.landmark_stride
        if self.landmark_hw is None or (mh * s, mw * s) == (h, w):
            return F.avg_pool2d(g, s, s) if s > 1 else g       # plain r×r pooling (floors a remainder)
        return adaptive_pool(g, (mh, mw))

    def _pools_by_product(self, grid) -> bool:
        """Whether ``q`` and ``k`` are pooled as one product with the cached pooling matrix
        (:func:`vitmix.ops.avg_pool_landmarks`): on small grids (``N < 8m``, at most ~8·m²·d multiply-adds per
        head, no channels-first copy of ``q`` and ``k``; layer N = 65, batch 32, fwd+bwd: 1.49× → 1.29×
        softmax's time) with adaptive or tiling windows. Larger grids keep the O(N·d) pooling kernels."""
        prefix, h, w = grid
        mh, mw = self.landmark_count(h, w)
        return not self._floors_a_remainder(h, w) and prefix + h * w < 8 * mh * mw

    def _pool(self, t: torch.Tensor, grid) -> torch.Tensor:
        """Landmarks ``(B, heads, m, d)`` of per-head tokens ``t (B, heads, N, d)``."""
        prefix, h, w = grid
        if self._pools_by_product(grid):
            return ops.avg_pool_landmarks(t, (h, w), self.landmark_count(h, w), prefix=prefix)
        g = self._pool_map(grid_channels_first(t, prefix, h, w))
        return tokens_from_channels_first(g, t.shape[0], t.shape[1])

    def _project(self, x: torch.Tensor, grid):
        """``q, k, v`` ``(B, heads, N, d)`` (unscaled: ``qk_scale`` is folded into λ), the landmarks
        ``(B, heads, m, d)`` of ``q`` and ``k``, and the fused ``qkv`` output ``(B, N, 3C)``."""
        prefix, h, w = grid
        b, n, c = x.shape
        nh, d = self.num_heads, self.head_dim
        mh, mw = self.landmark_count(h, w)
        m = mh * mw
        y = self.qkv(x)
        q, k, v = y.view(b, n, 3, nh, d).permute(2, 0, 3, 1, 4).unbind(0)
        if self.rope or self.qk_normed or n < 8 * m:
            q, k = self.q_norm(q), self.k_norm(k)
            if self.rope:
                q, k = rope_2d(q, prefix, h, w, self.rope_base), rope_2d(k, prefix, h, w, self.rope_base)
            return q, k, v, self._pool(q, grid), self._pool(k, grid), y
        # average pooling commutes with the affine projection: pool the C-channel input once and
        # project the m pooled tokens (no pooling of q and k, no copies of them). Only when
        # N >= 8m, where the extra m·C·2C multiply-adds are cheaper than pooling q and k.
        xg = x[:, prefix:].reshape(b, h, w, c).permute(0, 3, 1, 2)
        xl = self._pool_map(xg).flatten(2).transpose(1, 2)                  # (B, m, C)
        bias = self.qkv.bias[: 2 * c] if self.qkv.bias is not None else None
        lm = F.linear(xl, self.qkv.weight[: 2 * c], bias)
        lq, lk = lm.view(b, -1, 2, nh, d).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v, lq, lk, y

    def _attend(self, q, k, v, lq, lk):
        n = v.shape[-2]
        # Z = R·D^(-1/2) + 1/N  →  R·D^(-1/2)/N + w/N: ZV = w·mean(V) + (whitened part)/N. The fixed
        # scales and the mean weight are applied inside the op (no extra full-size passes); the
        # learnt exponent and temperature ablations compose them here, as does a traced graph (N may
        # be a tensor or a symbolic size there, not a number).
        inside = (self.normalize and self.scale_exponent is None and self.log_tau is None
                  and isinstance(n, int) and not isinstance(n, bool))
        out = ops.nystrom_attention(
            q, k, v, lq, lk, kernel="laplacian", lam=self.lam / self.qk_scale,  # exp(-|sq - sk|/λ)
            iters=self.newton_iters, eps=self.newton_eps, alpha=self.newton_alpha, inverse=self.inverse,
            normalization="injective" if self.normalize else None, norm_eps=self.norm_eps, backend=self.backend,
            contrast=self._contrast(n) if inside else 1.0,
            mean_weight=self.mean_weight.view(-1, 1, 1) if inside and self.mean_weight is not None else None,
        )
        if self.normalize and not inside:
            mean_v = v.mean(-2, keepdim=True).to(out.dtype)
            if self.scale_exponent is not None:
                scale = torch.exp((self.scale_exponent - 1.0) * math.log(n)).view(-1, 1, 1).to(out.dtype)
            else:
                scale = self._contrast(n)
            contrast = (out - mean_v) * scale
            if self.log_tau is not None:
                contrast = contrast * self.log_tau.exp().view(-1, 1, 1).to(out.dtype)
            if self.mean_weight is not None:
                mean_v = mean_v * self.mean_weight.view(-1, 1, 1).to(out.dtype)
            out = contrast + mean_v
        return out

    def _contrast(self, n: int) -> float:
        """The fixed factor of the map's whitened part at ``n`` tokens (``norm_scale``)."""
        return {"none": 1.0, "tokens": 1.0 / n, "sqrt": n ** -0.5}[self.norm_scale]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A checkpoint without ``mean_weight`` was saved with the fixed map (``mean_weight=None``, the
        default before 0.0): it loads as a learnt weight of 1, which gives the same outputs."""
        key = prefix + "mean_weight"
        if self.mean_weight is not None and key not in state_dict and prefix + "qkv.weight" in state_dict:
            state_dict[key] = torch.ones_like(self.mean_weight)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _local(self, v: torch.Tensor, grid) -> torch.Tensor:
        """The depthwise conv of the grid values ``v (B, heads, N, d)``, as ``(B, H*W, C)``.

        Read from ``v`` (a view of the qkv output, no slice of it), so its gradient joins v's instead
        of zero-filling a second full-size qkv gradient."""
        prefix, h, w = grid
        if self.conv_groups == "head":
            return merge_heads(head_conv(self.conv, v, prefix, h, w))
        b, nh, _, d = v.shape
        vg = v[:, :, prefix:].transpose(1, 2).reshape(b, h, w, nh * d).permute(0, 3, 1, 2)
        out = self.conv(vg.contiguous(memory_format=torch.channels_last))
        return out.permute(0, 2, 3, 1).reshape(b, h * w, nh * d)

    def analytic_flops(self, batch: int, n: int) -> int:
        h = self.num_heads
        m = landmark_total(self, n)
        total = linears_flops(self, batch * n)  # qkv, proj
        if not (getattr(self, "rope", False) or self.qk_normed) and n >= 8 * m:
            # landmarks: the pooled input projected by the q/k rows of qkv (pooling commutes with it);
            # done only when N >= 8m, otherwise q and k are pooled (no FLOPs)
            total += linear_flops(batch * m, self.dim, 2 * self.dim)
        grid = self.token_grid(n)
        if (getattr(self, "rope", False) or self.qk_normed or n < 8 * m) and self._pools_by_product(grid):
            total += batch * h * 2 * (2 * m * grid[1] * grid[2] * self.head_dim)    # q and k by the pooling matrix
        total += batch * h * self.landmark_flops(n, m)
        return total + local_conv_flops(self, batch, n)

    def landmark_flops(self, n: int, m: int) -> int:
        return nystrom_flops(n, m, self.head_dim, self.newton_iters, tied=False,
                             normalization="injective" if self.normalize else None,
                             inverse=self.inverse, start=self.newton_alpha)

    def _fused(self, x: torch.Tensor, grid) -> Optional[torch.Tensor]:
        """The token mixing before ``proj`` as one C call, with a C backward when autograd records
        (:mod:`vitmix.mixers.fused.laplacian`), on CPU in float32/float64 and in the configurations its
        ``supports`` rule covers (the defaults and the official preset: injective
        map with a fixed contrast scale, adaptive or tiling landmark windows, per-channel conv, no RoPE/q-k
        norm); ``None`` otherwise (the composed path, :meth:`_composed`, runs). At batch 1 and at small
        widths the composed path's ~50 small ops per layer forward (and ~60 backward) cost more than their
        arithmetic (layer N = 65, dim 128, 4 heads, batch 32, fwd+bwd: 17.2 → 8.5 ms); from N ≈ 800 up the
        two take the same time (N = 4096, dim 128, 2 heads, batch 4: 97.5 vs 98.1 ms)."""
        from .fused import laplacian as fused

        return fused.mix(self, x, grid) if fused.supports(self, x, grid) else None

    def mix(self, x, grid, attn_mask=None, is_causal=False):
        fused = self._fused(x, grid)
        return self.proj_drop(self.proj(fused if fused is not None else self._composed(x, grid)))

    def _composed(self, x: torch.Tensor, grid) -> torch.Tensor:
        """The token mixing before ``proj`` as a composition of torch ops and :mod:`vitmix.ops` (every option,
        device and dtype; the reference of the C paths)."""
        q, k, v, lq, lk, _ = self._project(x, grid)
        out = merge_heads(self._attend(q, k, v, lq, lk))
        if self.conv_kernel:
            prefix = grid[0]
            local = self._local(v, grid).to(out.dtype)
            # zero rows for the prefix tokens: the backward is a slice, not a zero-filled copy
            out = out + (F.pad(local, (0, 0, prefix, 0)) if prefix else local)
        return out

    def _kernel_weights(self, x, grid, values):
        q, k, _, lq, lk, _ = self._project(x, grid)
        return self._attend(q, k, values.to(q.dtype), lq, lk)


__all__ = ["LaplacianAttention", "rope_2d"]
