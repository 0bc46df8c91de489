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
  grids where 49 would cost more than exact attention; ``landmarks="conv"`` learns them instead with
  SOFT's landmark module (stride-``r`` conv, LayerNorm, GELU; not in the paper), one for ``q`` and one for ``k``;
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
  filter shared by the head's channels;
  ``conv_kernel=0`` disables it;
* optional 2-D axial **RoPE** on the grid queries and keys (``rope=True``), reported by secondary
  sources for the paper's backbone;
* an optional **value gain** ``g`` (``value_gain``, not in the paper, a training parametrisation): the value rows
  of ``qkv`` and the ``proj`` weight are used as ``g·W`` with ``W`` initialised at ``1/g`` of its usual values, so
  the layer computes the same function at initialisation while Adam moves its value path ``g`` times faster.
  A layer with a gain saves it with its weights (``stored_gain``); loading rescales weights saved at another
  gain (a gain-1 checkpoint, a converted softmax teacher), so state dicts move between gains.

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
from .landmark import LandmarkMixer, LearntLandmarks, check_conv_kernel, masked_nystrom
from .options import check_choice, check_newton, reject_unsupported, stride_option
from .flops import landmark_total, linear_flops, linears_flops, local_conv_flops, nystrom_flops, segment_flops
from .registry import register_mixer
from .sequence import as_row, is_sequence, segment_means, zero_padding


def rope_2d(t: torch.Tensor, prefix: int, h: int, w: int, base: float = 100.0) -> torch.Tensor:
    """2-D axial rotary embedding of the grid tokens of ``t (B, heads, P + H*W, d)``.

    The first ``d/2`` channels rotate with the row index, the last ``d/2`` with the column index
    (``d/4`` frequencies ``base^(-j/(d/4))`` each, rotate-half pairing). Prefix tokens are unchanged.
    """
    d = t.shape[-1]
    quarter = d // 4
    dt = torch.float64 if t.dtype == torch.float64 else torch.float32     # float64 models: float64 angles too
    freqs = base ** (-torch.arange(quarter, device=t.device, dtype=dt) / quarter)
    rows = torch.arange(h, device=t.device, dtype=dt)[:, None].expand(h, w).reshape(-1)
    cols = torch.arange(w, device=t.device, dtype=dt)[None, :].expand(h, w).reshape(-1)
    ang = torch.cat([rows[:, None] * freqs, cols[:, None] * freqs], dim=-1)  # (HW, d/2)
    cos, sin = ang.cos().to(t.dtype), ang.sin().to(t.dtype)
    g = t[:, :, prefix:]
    g1, g2 = g[..., : d // 2], g[..., d // 2:]  # pairs (g1_j, g2_j) share angle j
    rot = torch.cat([g1 * cos - g2 * sin, g1 * sin + g2 * cos], dim=-1)
    return rot if prefix == 0 else torch.cat([t[:, :, :prefix], rot], dim=2)


@register_mixer("laplacian")
class LaplacianAttention(LandmarkMixer):
    """LaplacianFormer attention: L1 kernel, Nyström landmarks, Newton–Schulz inverse, injective map.

    With the default landmark count the layer is linear in the number of tokens: queries and keys meet
    only through at most 49 pooled landmarks. The module docstring lists the design choices;
    ``docs/soft-laplacianformer.md`` says why each default was chosen, with the measurements behind it.

    Args:
        dim, num_heads: channels and heads.
        qkv_bias, qk_norm, proj_bias, proj_drop, norm_layer: timm's meaning (``qk_norm``: ``norm_layer``
            or LayerNorm on each head's ``q`` and ``k``).
        landmark_stride: landmark pooling window ``r`` on the grid (default 2; ``pool_ratio``: its
            deprecated name).
        landmarks: ``"avgpool"`` (default: ``r×r`` average pooling of ``q`` and ``k``) or ``"conv"``: SOFT's
            learnt landmark module (:class:`~vitmix.mixers.landmark.LearntLandmarks`: ``r×r`` stride-``r``
            conv shared by the heads, LayerNorm, GELU), one for ``q`` and one for ``k``.
        num_landmarks: ``"auto"`` (default): one landmark per ``r×r`` block, at most 7×7, and on small
            grids no more than keeps the layer within exact attention's FLOPs, but not below 4×4
            (:meth:`~vitmix.mixers.landmark.LandmarkMixer.landmark_count`); a perfect square or
            ``(mh, mw)``: that count; ``None``: ``r×r`` pooling alone (quadratic at high resolution).
        lam: Laplacian kernel bandwidth λ (default 4).
        qk_scale: multiplier of ``q`` and ``k`` before the L1 distance; ``None`` → ``d^(-1/2)``.
        normalize: apply the injective normalised feature map (default) or not (ablation).
        norm_eps: ε under the column-variance square root (default 1e-3): near-constant columns are
            damped towards the uniform map instead of being whitened into noise.
        norm_scale: ``"tokens"`` (default): the whitened part divided by N, so the map is an average plus
            a unit-scale contrast; ``"none"``: the reconstructed formula, whose ``√N``-sized outputs train
            poorly under gradient clipping; ``"sqrt"``, ``"learnt"`` (a per-head exponent): ablations.
        temperature: ``"head"``: a learnt per-head factor on the whitened part (ablation; default ``"none"``).
        mean_weight: initial value of a learnt per-head weight of the map's ``mean(V)`` term; ``0.0``
            (default) starts from the local conv as SOFT does; ``None``: the fixed weight 1 (no parameter).
        newton_iters: Newton–Schulz iterations (default 10; the pyramid models pass 20). With the ``α·Pᵀ``
            start fewer steps invert fewer small singular directions: a stronger spectral filter.
        newton_eps: diagonal perturbation of the landmark matrix (0.01).
        newton_alpha: ``"transpose"`` (default: ``α·Pᵀ``, never diverges), ``"safe"`` (the converging
            start of :func:`vitmix.ops.newton_schulz_inverse`) or ``"official"`` (the authors' CUDA; can
            diverge for tiny kernel values).
        inverse: ``"newton"`` (default) or ``"exact"`` (linear solve; analysis).
        conv_kernel, conv_groups: the local depthwise conv on ``V`` (default 3; 0/None disables) and its
            grouping: ``"channel"`` (default, with bias) or ``"head"`` (SOFT's per-head filter).
        rope, rope_base: 2-D axial RoPE on grid queries and keys (needs ``head_dim % 4 == 0``).
        value_gain: the value path's parametrisation gain ``g`` (default 1: none): ``V = g·(x W_vᵀ + b_v)`` and
            ``proj(y) = g·W_p y + b_p`` with ``W_v``, ``b_v``, ``W_p`` stored at ``1/g`` of the effective weights
            (:meth:`init_weights` divides the initial values; the buffer ``stored_gain`` records ``g`` in state
            dicts, and loading rescales weights stored at another gain).
        grid_remainder: with ``num_landmarks=None``, ``"error"`` (default) or ``"floor"`` when the grid
            is not divisible by the stride.
        backend: ``"auto"`` (Triton for CUDA tensors when installed, else PyTorch/C), ``"triton"`` or
            ``"torch"``: who computes the kernel matrices and the Newton–Schulz loop (``docs/gpu.md``).
        hw, num_prefix_tokens: the token grid (see :class:`~vitmix.mixers.base.TokenMixer`).

    ``scale_norm`` and ``attn_drop`` are not supported (``ValueError`` when set).
    """

    #: ``num_landmarks="auto"`` keeps at least 4×4 landmarks where the stride grid has them: 3×3 on the
    #: demo's 8×8 grid (the exact-cost rule alone) learned markedly slower (docs/soft-laplacianformer.md,
    #: "Landmark count")
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
        "landmarks": ("avgpool", "conv"),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        landmark_stride: Optional[int] = None,
        num_landmarks: LandmarkCount = "auto",
        landmarks: str = "avgpool",
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
        value_gain: float = 1.0,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        name = type(self).__name__
        reject_unsupported(name, False, scale_norm, attn_drop)
        stride = stride_option(name, landmark_stride, {"pool_ratio": pool_ratio}, default=2)
        for key, value in dict(inverse=inverse, newton_alpha=newton_alpha, conv_groups=conv_groups,
                               norm_scale=norm_scale, temperature=temperature, conv_init=conv_init,
                               grid_remainder=grid_remainder, landmarks=landmarks).items():
            check_choice(key, value, self._CHOICES[key])
        self._check_numbers(lam, conv_kernel, newton_iters, newton_eps, inverse, rope, mean_weight)
        if not (isinstance(value_gain, (int, float)) and math.isfinite(value_gain) and value_gain > 0):
            raise ValueError(f"value_gain={value_gain!r} must be a finite number > 0 (1: no gain)")
        self._init_landmarks(stride, num_landmarks, grid_remainder, conv_kernel, backend)
        self.landmarks = landmarks
        self.lam = float(lam)
        self.qk_scale = self._qk_scale(qk_scale)
        self.qk_normed = bool(qk_norm)
        self.normalize, self.norm_eps, self.norm_scale = bool(normalize), float(norm_eps), norm_scale
        self.newton_iters, self.newton_eps = int(newton_iters), float(newton_eps)
        self.newton_alpha, self.inverse = newton_alpha, inverse
        self.conv_groups = conv_groups
        if newton_alpha == "safe" or (inverse == "exact" and not self.newton_eps):
            self.padding_mask = "by_length"     # residual-checked starts / a singular empty block: per length
        self.rope, self.rope_base = bool(rope), float(rope_base)
        self.value_gain = float(value_gain)
        self._build_layers(qkv_bias, qk_norm, proj_bias, proj_drop, norm_layer, conv_init, temperature)
        if self.value_gain != 1.0:
            self.init_weights()
            self.register_buffer("stored_gain", torch.tensor(self.value_gain))
        self._register_load_state_dict_pre_hook(_rescale_to_gain, with_module=True)
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
        if self.landmarks == "conv":      # SOFT's learnt landmark module, one for q and one for k
            self.q_landmarks = LearntLandmarks(d, self.landmark_stride)
            self.k_landmarks = LearntLandmarks(d, self.landmark_stride)
        self.log_tau = nn.Parameter(torch.zeros(h)) if temperature == "head" else None
        # learnt per-head exponent θ of the contrast scale N^(θ-1): 0 = "tokens", ½ = "sqrt", 1 = "none"
        self.scale_exponent = nn.Parameter(torch.zeros(h)) if self.norm_scale == "learnt" else None

    @torch.no_grad()
    def init_weights(self) -> None:
        """Divide the value path's initial weights by the value gain (timm's ViT init calls this after it
        initialised ``qkv`` and ``proj``, as does :func:`vitmix.models.init_linear_and_norm`), so the layer starts
        from the usual function; no-op at gain 1."""
        for name, rows in _gained(self) if self.value_gain != 1.0 else ():
            param = self.get_parameter(name)
            (param if rows is None else param[rows]).div_(self.value_gain)

    def _project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The fused ``qkv`` projection ``(B, N, 3C)`` with the value gain applied to the weights (a ``3C×C``
        product, not a pass over the ``N×3C`` output)."""
        if self.value_gain == 1.0:
            return self.qkv(x)
        c, g = self.dim, self.value_gain
        w, b = self.qkv.weight, self.qkv.bias
        w = torch.cat([w[: 2 * c], w[2 * c:] * g])
        return F.linear(x, w, None if b is None else torch.cat([b[: 2 * c], b[2 * c:] * g]))

    def _proj(self, y: torch.Tensor) -> torch.Tensor:
        """The output projection with the value gain on its weight."""
        if self.value_gain == 1.0:
            return self.proj(y)
        return F.linear(y, self.proj.weight * self.value_gain, self.proj.bias)

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
        return (f"heads={self.num_heads}, head_dim={self.head_dim}, landmarks={self.landmarks!r}, "
                f"{self._landmark_repr()}, lam={self.lam}, "
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
        head, no channels-first copy of ``q`` and ``k``: fewer, larger calls where dispatch dominates) with
        adaptive or tiling windows. Larger grids keep the O(N·d) pooling kernels."""
        prefix, h, w = grid
        mh, mw = self.landmark_count(h, w)
        return not self._floors_a_remainder(h, w) and prefix + h * w < 8 * mh * mw

    def _pool(self, t: torch.Tensor, grid, learnt: Optional[LearntLandmarks] = None) -> torch.Tensor:
        """Landmarks ``(B, heads, m, d)`` of per-head tokens ``t (B, heads, N, d)``: pooled, or by ``learnt``
        (``landmarks="conv"``)."""
        prefix, h, w = grid
        if learnt is not None:
            return learnt(t, grid, self.landmark_count(h, w), floor=self._floors_a_remainder(h, w))
        if self._pools_by_product(grid):
            return ops.avg_pool_landmarks(t, (h, w), self.landmark_count(h, w), prefix=prefix)
        g = self._pool_map(grid_channels_first(t, prefix, h, w))
        return tokens_from_channels_first(g, t.shape[0], t.shape[1])

    def _project(self, x: torch.Tensor, grid):
        """``q, k, v`` ``(B, heads, N, d)`` (unscaled: ``qk_scale`` is folded into λ), the landmarks
        ``(B, heads, m, d)`` of ``q`` and ``k``, and the fused ``qkv`` output ``(B, N, 3C)``."""
        if is_sequence(grid):
            return self._project_sequence(x, grid)
        prefix, h, w = grid
        b, n, c = x.shape
        nh, d = self.num_heads, self.head_dim
        mh, mw = self.landmark_count(h, w)
        m = mh * mw
        y = self._project_qkv(x)
        q, k, v = y.view(b, n, 3, nh, d).permute(2, 0, 3, 1, 4).unbind(0)
        if not self._pools_input(n, m):
            q, k = self.q_norm(q), self.k_norm(k)
            if self.rope:
                q, k = rope_2d(q, prefix, h, w, self.rope_base), rope_2d(k, prefix, h, w, self.rope_base)
            learnt = self.landmarks == "conv"
            return (q, k, v, self._pool(q, grid, self.q_landmarks if learnt else None),
                    self._pool(k, grid, self.k_landmarks if learnt else None), y)
        # average pooling commutes with the affine projection: pool the C-channel input once and
        # project the m pooled tokens (no pooling of q and k, no copies of them). Only when
        # N >= 8m, where the extra m·C·2C multiply-adds are cheaper than pooling q and k.
        xg = x[:, prefix:].reshape(b, h, w, c).permute(0, 3, 1, 2)
        xl = self._pool_map(xg).flatten(2).transpose(1, 2)                  # (B, m, C)
        bias = self.qkv.bias[: 2 * c] if self.qkv.bias is not None else None
        lm = F.linear(xl, self.qkv.weight[: 2 * c], bias)
        lq, lk = lm.view(b, -1, 2, nh, d).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v, lq, lk, y

    def _pools_input(self, n: int, m: int) -> bool:
        """Whether the pooled landmarks are the pooled input projected (pooling commutes with the affine
        ``qkv``): average-pooled landmarks of plain ``q`` and ``k`` (no RoPE or q/k norm) with ``N >= 8m``."""
        return self.landmarks == "avgpool" and not (self.rope or self.qk_normed) and n >= 8 * m

    def _project_sequence(self, x: torch.Tensor, grid, pool: Optional[torch.Tensor] = None):
        """:meth:`_project` on a 1-D sequence: landmarks by segment means of ``q`` and ``k`` (by ``pool``, the
        per-sample segments of a padded batch, when given); RoPE on the sequence read as one row (the column
        half of the channels rotates with the position)."""
        b, n, _ = x.shape
        y = self._project_qkv(x)
        q, k, v = y.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = (rope_2d(t, *as_row(grid), self.rope_base) for t in (q, k))
        if pool is not None:
            lq, lk = pool.to(q.dtype) @ q, pool.to(k.dtype) @ k
        else:
            m = self.sequence_landmarks(grid.length)
            lq, lk = segment_means(q, grid, m), segment_means(k, grid, m)
        if self.landmarks == "conv":
            lq, lk = self.q_landmarks.from_means(lq), self.k_landmarks.from_means(lk)
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

    def _attend_masked(self, q, k, v, lq, lk, slots, mask):
        """:meth:`_attend` on a padded batch (:func:`~vitmix.mixers.landmark.masked_nystrom`): the map's means,
        variances and N count each sample's real tokens."""
        options = dict(lam=self.lam / self.qk_scale, iters=self.newton_iters, eps=self.newton_eps,
                       alpha=self.newton_alpha, inverse=self.inverse, norm_eps=self.norm_eps, backend=self.backend)
        if not self.normalize:
            return masked_nystrom(q, k, v, lq, lk, slots, mask, "laplacian", **options).to(v.dtype)
        whitened, mean_v = masked_nystrom(q, k, v, lq, lk, slots, mask, "laplacian", normalization="injective",
                                          **options)
        n = mask.sum(-1).to(whitened.dtype).view(-1, 1, 1, 1)
        if self.scale_exponent is not None:
            scale = torch.exp((self.scale_exponent.view(-1, 1, 1).to(n.dtype) - 1.0) * n.log())
        else:
            scale = {"none": torch.ones_like(n), "tokens": 1.0 / n, "sqrt": n.rsqrt()}[self.norm_scale]
        out = whitened * scale
        if self.log_tau is not None:
            out = out * self.log_tau.exp().view(-1, 1, 1).to(out.dtype)
        if self.mean_weight is not None:
            mean_v = mean_v * self.mean_weight.view(-1, 1, 1).to(out.dtype)
        return (out + mean_v).to(v.dtype)

    def _contrast(self, n: int) -> float:
        """The fixed factor of the map's whitened part at ``n`` tokens (``norm_scale``)."""
        return {"none": 1.0, "tokens": 1.0 / n, "sqrt": n ** -0.5}[self.norm_scale]

    @torch.no_grad()
    def load_attention(self, state: dict) -> None:
        """From a trained softmax layer (``vitmix.convert``): its ``qkv`` and ``proj`` under the same names, the
        local conv at zero, and learnt landmark convs (``landmarks="conv"``) starting as ``r×r`` average pooling."""
        super().load_attention(state)
        if self.landmarks == "conv":
            self.q_landmarks.start_as_pooling()
            self.k_landmarks.start_as_pooling()

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
        grid = self.token_grid(n)
        if is_sequence(grid):       # q and k reduced to segment means by the pooling matrix
            if self.landmarks == "conv":
                total += batch * h * 2 * self.q_landmarks.flops(m, sequence=True)
            return (total + batch * h * (self.landmark_flops(n, m) + segment_flops(self, n, m, pooled=2))
                    + local_conv_flops(self, batch, n))
        if self._pools_input(n, m):
            # landmarks: the pooled input projected by the q/k rows of qkv (pooling commutes with it);
            # done only when N >= 8m, otherwise q and k are pooled (no FLOPs)
            total += linear_flops(batch * m, self.dim, 2 * self.dim)
        elif self.landmarks == "conv":
            total += batch * h * 2 * self.q_landmarks.flops(m)                      # the q and k landmark convs
        elif self._pools_by_product(grid):
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
        arithmetic; at large N the two take the same time (docs/soft-laplacianformer.md, "Inference and
        training in one C call")."""
        from .fused import laplacian as fused

        return fused.mix(self, x, grid) if fused.supports(self, x, grid) else None

    def mix(self, x, grid, attn_mask=None, is_causal=False, mask=None):
        if mask is not None:
            return self.proj_drop(self._proj(self._masked(x, grid, mask)))
        fused = self._fused(x, grid)
        return self.proj_drop(self._proj(fused if fused is not None else self._composed(x, grid)))

    def _masked(self, x: torch.Tensor, grid, mask: torch.Tensor) -> torch.Tensor:
        """:meth:`_composed` on a padded 1-D batch: each sample's own segment means, padded keys and empty
        landmark slots left out of the kernel attention and the map, padded values zero before the conv."""
        pool, slots = self._landmark_pool(grid, mask, x.dtype)
        q, k, v, lq, lk, _ = self._project_sequence(x, grid, pool)
        out = merge_heads(self._attend_masked(q, k, v, lq, lk, slots, mask))
        if self.conv_kernel:
            local = self._local(zero_padding(v, mask), as_row(grid)).to(out.dtype)
            out = out + (F.pad(local, (0, 0, grid.prefix, 0)) if grid.prefix else local)
        return out

    def _composed(self, x: torch.Tensor, grid) -> torch.Tensor:
        """The token mixing before ``proj`` as a composition of torch ops and :mod:`vitmix.ops` (every option,
        device and dtype; the reference of the C paths)."""
        q, k, v, lq, lk, _ = self._project(x, grid)
        out = merge_heads(self._attend(q, k, v, lq, lk))
        if self.conv_kernel:
            prefix = grid[0]
            local = self._local(v, as_row(grid)).to(out.dtype)
            # zero rows for the prefix tokens: the backward is a slice, not a zero-filled copy
            out = out + (F.pad(local, (0, 0, prefix, 0)) if prefix else local)
        return out

    def _kernel_weights(self, x, grid, values):
        q, k, _, lq, lk, _ = self._project(x, grid)
        return self._attend(q, k, values.to(q.dtype), lq, lk)


def _rescale_to_gain(layer, state, prefix, *_):
    """Load pre-hook: value weights saved at gain ``g'`` (``stored_gain``, absent: 1) become this layer's
    ``W·g'/g``, in new tensors (``state`` is ``load_state_dict``'s own copy of the caller's dict; the caller's
    tensors are not touched); the saved gain is replaced by this layer's (or dropped at gain 1)."""
    key = prefix + "stored_gain"
    saved = float(state[key]) if key in state else 1.0
    if layer.value_gain == 1.0:
        state.pop(key, None)
    else:
        state[key] = torch.tensor(layer.value_gain)
    if saved == layer.value_gain:
        return
    for name, rows in _gained(layer):
        if prefix + name in state:
            value = state[prefix + name].clone()
            (value if rows is None else value[rows]).mul_(saved / layer.value_gain)
            state[prefix + name] = value


def _gained(layer):
    """``(parameter name, rows)`` the value gain multiplies: the value rows of ``qkv`` (and of its bias) and all of
    ``proj``'s weight (``rows=None``)."""
    rows = slice(2 * layer.dim, 3 * layer.dim)
    return [("qkv.weight", rows), ("proj.weight", None)] + ([("qkv.bias", rows)] if layer.qkv.bias is not None else [])


__all__ = ["LaplacianAttention", "rope_2d"]
