"""The shared base of the Nyström landmark mixers: SOFT, SOFT-Norm and LaplacianFormer.

All three pool ``m`` landmarks from the ``H×W`` token grid with a stride, at most 7×7 of them by
default (O(N) at any resolution) and never so many that the approximation costs more FLOPs than the
exact attention it replaces (small grids), approximate the kernel attention through the ``m×m`` landmark
kernel and a Newton–Schulz inverse, and add a local depthwise convolution of ``V``. What they share
lives here once: the landmark options and their checks, ``landmark_count``, the facts the models
and benchmarks read (``complexity``, ``bench_options``, ...) and the O(N²) ``attention_map``.
Each subclass supplies its projections, landmarks and kernel through :meth:`_kernel_weights`.

On a 1-D sequence (``sequence=True``) the landmarks are segment means of the sequence
(:func:`~vitmix.mixers.sequence.segment_means`, any length), :meth:`sequence_landmarks` of them, and the
local convolution reads the sequence as one ``1 × L`` row (its ``k × k`` filter acts as the 1-D filter of
its middle row). A key-padding mask is applied within the batch (:func:`masked_nystrom`): each sample's
landmark count and segments come from its own valid length, padded keys and empty landmark slots (a
sample with fewer landmarks than the batch's most) are left out of the kernel attention, and
LaplacianFormer's means, variances and ``1/N`` terms count the real tokens only. Configurations whose
inverse couples the slots (SOFT's batch-global legacy iteration, the residual-checked ``"safe"`` start of
an unsymmetric matrix, an exact inverse without ``ε``) run each valid length on its own instead.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import ops
from ..ops._common import compute_dtype, no_autocast
from ..ops._triton import check_backend
from .base import TokenMixer
from .grid import (DEFAULT_LANDMARK_GRID, LandmarkCount, adaptive_pool, grid_channels_first, landmark_grid,
                   landmark_shape, tokens_from_channels_first)
from .sequence import segment_pooling


def check_conv_kernel(conv_kernel: Optional[int]) -> int:
    """The local conv size as an int (0 = none); ``ValueError`` for an even or negative size."""
    if conv_kernel and (int(conv_kernel) < 1 or int(conv_kernel) % 2 == 0):
        raise ValueError(f"conv_kernel={conv_kernel} must be a positive odd size (3, 5, 9) or 0 to disable")
    return int(conv_kernel or 0)


def average_pooling_weight(d: int, s: int) -> torch.Tensor:
    """The ``(d, d, s, s)`` weight of a ``d``-channel ``s×s`` stride-``s`` conv that is ``s×s`` average pooling (a
    learnt landmark conv converted from softmax attention starts there)."""
    return torch.eye(d).view(d, d, 1, 1).expand(d, d, s, s) / (s * s)


class LearntLandmarks(nn.Module):
    """SOFT's learnt landmark module for one head-split input: an ``s×s`` stride-``s`` convolution of the
    ``d`` channels, shared by the heads and without bias, then ``LayerNorm(d)`` and exact GELU. SOFT applies
    it to its queries (its keys are its queries); LaplacianFormer's ``landmarks="conv"`` has one for ``q``
    and one for ``k``."""

    def __init__(self, head_dim: int, stride: int) -> None:
        super().__init__()
        self.stride = int(stride)
        self.conv = nn.Conv2d(head_dim, head_dim, kernel_size=stride, stride=stride, bias=False)
        self.norm = nn.LayerNorm(head_dim)
        self.act = nn.GELU()

    def forward(self, t: torch.Tensor, grid, count: Tuple[int, int], floor: bool = False) -> torch.Tensor:
        """Landmarks ``(B, heads, mh*mw, d)`` of the grid tokens of ``t (B, heads, N, d)``; ``grid`` is
        ``(prefix, H, W)`` and ``count`` the landmark grid ``(mh, mw)``. A grid the stride does not tile into
        ``count`` is first pooled adaptively to ``(mh*s, mw*s)``, unless ``floor`` (the conv then leaves the
        border remainder out, as SOFT's official stride-only landmarks do)."""
        prefix, h, w = grid
        (mh, mw), s = count, self.stride
        g = grid_channels_first(t, prefix, h, w)
        if not floor and (mh * s, mw * s) != (h, w):
            g = adaptive_pool(g, (mh * s, mw * s))
        return self.act(self.norm(tokens_from_channels_first(self.conv(g), t.shape[0], t.shape[1])))

    def from_means(self, means: torch.Tensor) -> torch.Tensor:
        """Landmarks from segment means ``(..., m, d)`` of a 1-D sequence: the conv of a block that holds the
        mean everywhere (its summed taps), then LayerNorm and GELU."""
        return self.act(self.norm(means @ self.conv.weight.sum((2, 3)).T))

    @torch.no_grad()
    def start_as_pooling(self) -> None:
        """Set the conv to ``s×s`` average pooling (a layer converted from softmax attention starts from the
        pooled landmarks; the LayerNorm and GELU have no neutral setting)."""
        self.conv.weight.copy_(average_pooling_weight(self.conv.in_channels, self.stride))

    def flops(self, m: int, sequence: bool = False) -> int:
        """Multiply-adds ×2 of the conv for ``m`` landmarks of one head (on a sequence: one product)."""
        d = self.conv.in_channels
        return 2 * m * d * d * (1 if sequence else self.stride ** 2)


class LandmarkMixer(TokenMixer):
    """Base of the landmark mixers: pooled landmarks on the token grid, a local conv on ``V``.

    Subclasses call :meth:`_init_landmarks` from ``__init__`` (after their own option checks, so
    errors come in the order the options are documented) and implement :meth:`_kernel_weights`.
    """

    spatial = True
    rejects_non_finite = True
    complexity = "linear"
    additive_terms = ("conv",)   # the local conv on V: zero when converted from softmax (vitmix.convert)
    #: a token sweep of one layer fixes m = 49 (7×7, the count at 224²), so the cost per token stays
    #: constant at every size ("auto" agrees from a 14×14 grid up, and gives fewer below)
    bench_options = {"num_landmarks": 49}
    on_sequence = "landmarks are segment means along the sequence (any N); the local conv is 1-D"
    padding_mask = "masked"

    def _init_landmarks(self, landmark_stride: int, num_landmarks: LandmarkCount, grid_remainder: str,
                        conv_kernel: Optional[int], backend: str) -> None:
        """Check and store the options every landmark mixer has (the stride comes from
        :func:`~vitmix.mixers.options.stride_option`, called in ``__init__`` so that its deprecation
        warning points at the caller)."""
        self.landmark_stride = landmark_stride
        self.conv_kernel = check_conv_kernel(conv_kernel)
        check_backend(type(self).__name__, backend)
        self.backend = backend
        self.landmark_hw = landmark_grid(num_landmarks)
        self.grid_remainder = grid_remainder

    def _floors_a_remainder(self, h: int, w: int) -> bool:
        """Whether the landmarks are ``r×r`` tiles of a grid the stride does not divide (``num_landmarks=None``
        with ``grid_remainder="floor"``): windows that adaptive pooling does not reproduce."""
        mh, mw = self.landmark_count(h, w)
        s = self.landmark_stride
        return self.landmark_hw is None and (mh * s, mw * s) != (h, w)

    def _eager_cpu(self, x: torch.Tensor) -> bool:
        """Whether this forward may take a one-call C path: CPU float32/float64 input, not traced or exported,
        no autocast, no Python dispatch mode (FLOP counters and memory trackers must see the torch ops), and
        not forced onto Triton."""
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or self.backend == "triton":
            return False
        return not (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_autocast_enabled("cpu")
                    or _get_current_dispatch_mode() is not None)

    def _needs_grad(self, x: torch.Tensor) -> bool:
        """Whether autograd records this forward (the input or a parameter needs a gradient)."""
        return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))

    def landmark_count(self, h: int, w: int) -> Tuple[int, int]:
        """The ``(mh, mw)`` landmark grid used on an ``h×w`` token grid (``ValueError`` if none fits).

        With ``num_landmarks="auto"`` the grid of :func:`~vitmix.mixers.grid.landmark_shape` (one
        landmark per stride block, at most 7×7) is shrunk, longer side first, until the kernel
        attention's FLOPs (:meth:`landmark_flops`) are at most those of exact attention on the same
        ``N = h·w`` tokens (``4·N²·d`` per head), but not below ``min_landmark_side`` per side (2, and
        4 for LaplacianFormer). At N = 196 and head dim 32 that is 5×5 instead of 7×7: there 49
        landmarks and 20 Newton–Schulz steps cost three times exact attention (laplacian).
        """
        mh, mw = landmark_shape(type(self).__name__, h, w, self.landmark_stride, self.landmark_hw, self.grid_remainder)
        return self._within_exact_cost(h * w, mh, mw) if self.landmark_hw == "auto" else (mh, mw)

    def _landmark_pool(self, grid, mask: torch.Tensor, dtype: torch.dtype):
        """Each sample's segment pooling ``(B, 1, m, N)`` on a padded 1-D batch and its landmark slots
        ``(B, 1, 1, m)`` (``sequence_landmarks`` of its own length; the shorter leave slots empty)."""
        lengths = mask.sum(-1)
        counts = torch.tensor([self.sequence_landmarks(n - grid.prefix) for n in lengths.tolist()],
                              device=mask.device)
        m = int(counts.max())
        pool = segment_pooling(lengths, counts, m, mask.shape[1], grid.prefix, dtype)
        slots = torch.arange(m, device=mask.device) < counts[:, None]
        return pool[:, None], slots[:, None, None, :]

    def sequence_landmarks(self, length: int) -> int:
        """The landmark count on a 1-D sequence of ``length`` tokens: with ``num_landmarks="auto"`` one per
        ``s²`` tokens (an ``s×s`` block's share on an image, so a layer costs the same on an image and on its
        flattened tokens), at most 7×7 = 49 and shrunk as on images to stay within exact attention's FLOPs;
        ``None``: one per ``s²`` tokens; a fixed count: that many. Never more than ``length``, at least 1."""
        spec = self.landmark_hw
        if isinstance(spec, tuple):
            return max(1, min(spec[0] * spec[1], length))
        m = max(1, length // self.landmark_stride ** 2)
        if spec != "auto":
            return m
        m = min(m, DEFAULT_LANDMARK_GRID[0] * DEFAULT_LANDMARK_GRID[1])
        floor, exact = min(m, self.min_landmark_side ** 2), 4 * length * length * self.head_dim
        while m > floor and self.landmark_flops(length, m) > exact:
            m -= 1
        return m

    #: the smallest landmark grid side ``"auto"`` shrinks to (where the stride grid is that large):
    #: one landmark is a rank-1 map
    min_landmark_side = 2

    def _within_exact_cost(self, n: int, mh: int, mw: int) -> Tuple[int, int]:
        exact = 4 * n * n * self.head_dim        # Q·Kᵀ and A·V of one head
        floor = self.min_landmark_side
        for side in range(max(mh, mw), floor, -1):
            if self.landmark_flops(n, min(mh, side) * min(mw, side)) <= exact:
                return min(mh, side), min(mw, side)
        return min(mh, floor), min(mw, floor)

    def landmark_flops(self, n: int, m: int) -> int:
        """FLOPs of the kernel attention of one (batch, head) slice with ``m`` landmarks at ``n`` tokens:
        everything whose cost depends on ``m`` (the projections and the local conv do not). Abstract:
        each landmark mixer states its own (``num_landmarks="auto"`` needs it)."""
        raise NotImplementedError(f"{type(self).__name__} must define landmark_flops(n, m) for num_landmarks='auto'")

    def _landmark_repr(self) -> str:
        return f"landmark_stride={self.landmark_stride}, num_landmarks={self.landmark_hw!r}"

    def _kernel_weights(self, x: torch.Tensor, grid, values: torch.Tensor) -> torch.Tensor:
        """The kernel-attention part of :meth:`mix` applied to per-head ``values (B, heads, N, ·)``."""
        raise NotImplementedError

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, hw=None, num_prefix_tokens=None, **_) -> torch.Tensor:
        """Effective ``(B, heads, N, N)`` token weights of the kernel attention (O(N²), analysis only).

        Row ``i`` holds the Nyström weights of token ``i`` (with the mixer's normalisation); the local
        convolution on ``V`` is not included.
        """
        grid = self.token_grid(x.shape[1], hw, num_prefix_tokens)
        n = x.shape[1]
        eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(x.shape[0], self.num_heads, n, n)
        return self._kernel_weights(x, grid, eye)


def masked_nystrom(q, k, v, lq, lk, slots: torch.Tensor, mask: torch.Tensor, kernel: str, *, lam: float = 4.0,
                   iters: int, eps: float, alpha: str, inverse: str, normalization: Optional[str] = None,
                   norm_eps: float = 1e-6, backend: str = "auto"):
    """:func:`vitmix.ops.nystrom_attention` on a padded batch: ``mask (B, N)`` marks the real keys (and
    queries), ``slots (B, 1, 1, m)`` the landmarks a sample has. Empty slots get zero kernel columns and an
    ``εI`` block of the landmark matrix (no coupling: every Newton–Schulz start and step is block-diagonal,
    and its norms are the real block's), so each sample's real outputs are those of its unpadded run.
    ``normalization="injective"`` returns the whitened part (contrast 1) and the mean of the real values
    separately, for the caller to weigh; otherwise the output."""
    tied = k is q and lk is lq
    with no_autocast(q.device.type):
        dt = compute_dtype(q, k, v, lq, lk)
        q, k, v, lq, lk = (t.to(dt) for t in (q, k, v, lq, lk))
        kern = ((lambda a, b: ops.gaussian_kernel(a, b, backend=backend)) if kernel == "gaussian" else
                (lambda a, b: ops.laplacian_kernel(a, b, lam, backend=backend)))
        keys = mask[:, None, :, None].to(dt)
        v = v * keys
        cq = kern(q, lk) * slots                                              # (B, h, N, m)
        ck = cq if tied else kern(k, lq) * slots
        w = kern(lq, lk) * (slots & slots.mT)                                # (B, h, m, m)
        M = ops.newton_schulz_inverse(w, iters=iters, eps=eps, symmetric=True if lk is lq else None, mode=inverse,
                                      alpha=alpha, backend=backend)
        if normalization == "soft_norm":
            dinv = w.sum(-1).masked_fill(~slots[..., 0, :], 1.0).rsqrt() * slots[..., 0, :]
            M = dinv.unsqueeze(-1) * M * dinv.unsqueeze(-2)
        if normalization != "injective":
            return cq @ (M @ (ck.mT @ v))
        # the injective map's statistics over the real queries and keys (ops.nystrom._injective_fwd)
        n = keys.sum(-2, keepdim=True)                                        # (B, 1, 1, 1)
        cc = (cq - (cq * keys).sum(-2, keepdim=True) / n) * keys
        cov = cc.mT @ cc / n
        D = ck - (ck * keys).sum(-2, keepdim=True) / n
        T = M.mT @ cov @ M
        var = ((D @ (0.5 * (T + T.mT))) * D).sum(-1, keepdim=True)
        whitened = cq @ (M @ (D.mT @ (torch.rsqrt(var.clamp_min(0) + norm_eps) * v)))
        return whitened, v.sum(-2, keepdim=True) / n


__all__ = ["LandmarkMixer", "check_conv_kernel", "masked_nystrom"]
