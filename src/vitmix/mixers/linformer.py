"""Linformer (Wang et al., "Linformer: Self-Attention with Linear Complexity", arXiv 2006.04768, 2020):
softmax attention against keys and values compressed along the sequence.

Learned projections ``E, F ∈ R^(k×N)`` map the ``N`` projected keys and values to ``k`` rows;
attention is ``softmax(Q·(E·K)ᵀ/√d) · (F·V)``: O(N·k·d) time and memory, no N×N matrix. The whole
sequence is compressed, prefix (CLS) tokens included, as in the paper.

Sharing (``sharing=``, the paper's Section 4 options): ``"headwise"`` (default; one ``E`` and one
``F`` per layer shared by all heads — what the authors' fairseq code does), ``"kv"`` (also
``E = F``), or ``"none"`` (``E_i, F_i`` per head, the paper's general form). The paper's layerwise
sharing (one projection for all layers) is not offered. ``E``/``F`` are initialised as in the
authors' code (Xavier-uniform with gain 1/√2) and applied to the keys/values after their
projection (the paper's equation; the authors' code compresses the layer input first, which differs
only through the key/value bias).

Sequence length: ``E`` and ``F`` have one column per token, so the layer is built for one length N:
``seq_len=N``, or ``hw=(H, W)`` together with ``num_prefix_tokens`` (``N = P + H·W``), or — inside
a timm model, where the attention layer is built before the grid is known —
:func:`~vitmix.mixers.set_token_grid` (``vitmix.create_model`` calls it), or else the first input
(the projections are torch lazy parameters until then: run one forward before counting
parameters or wrapping the model in DDP, as with any ``torch.nn`` lazy module — the case of the
pyramid backbones, whose stages learn their grid only at the first forward). Another length is a
``ValueError``: interpolating learned projections to a new length is not part of the method, so a
model at another image size must be built (or fine-tuned) at that size.

Default ``k=64``: the projected length of the SOFT paper's Linformer comparison is not stated in
the sources we could check; 64 sits just above the 49-key budget of vitmix's other linear baselines
and stays well below N at 224² (197 tokens). With ``k ≥ N`` there is no compression.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter, is_lazy

from .base import AttentionProjections, TokenMixer, close_matches
from .registry import register_mixer

__all__ = ["LinformerAttention", "linformer_reference", "SHARING"]

#: projection sharing schemes of the paper (layerwise sharing is not offered)
SHARING = ("headwise", "kv", "none")


def linformer_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, f: torch.Tensor,
                        scale: Optional[float] = None) -> torch.Tensor:
    """Explicit Linformer: per head ``softmax(q·(E_h k)ᵀ·scale) (F_h v)`` with ``E, F`` of shape
    ``(k, N)`` (shared) or ``(H, k, N)`` (per head); a loop over heads, no broadcasting."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    heads = []
    for h in range(q.shape[1]):
        eh, fh = (t if t.dim() == 2 else t[h] for t in (e, f))
        kh, vh = torch.einsum("kn,bnd->bkd", eh, k[:, h]), torch.einsum("kn,bnd->bkd", fh, v[:, h])
        weights = torch.softmax(torch.einsum("bnd,bkd->bnk", q[:, h], kh) * scale, dim=-1)
        heads.append(torch.einsum("bnk,bkd->bnd", weights, vh))
    return torch.stack(heads, dim=1)


@register_mixer("linformer")
class LinformerAttention(LazyModuleMixin, AttentionProjections, TokenMixer):
    """Linformer attention (Wang et al., 2020): keys/values projected to ``k`` rows; O(N·k).

    Args:
        k: projected length (default 64).
        sharing: ``"headwise"`` (default) | ``"kv"`` | ``"none"`` (see the module docstring).
        seq_len: the token count N the projections are built for; default: ``num_prefix_tokens +
            H·W`` when both are given, else the grid set later or the first input's N.
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments (``attn_drop`` applies
        to the ``N × k`` weights).
    """

    complexity = "linear"

    def __init__(self, dim: int, num_heads: int = 8, *args, k: int = 64, sharing: str = "headwise",
                 seq_len: Optional[int] = None, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be a positive integer (the projected length, e.g. 64)")
        if sharing not in SHARING:
            raise ValueError(f"linformer sharing={sharing!r} is not one of {', '.join(SHARING)}."
                             + close_matches(str(sharing), SHARING))
        if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
            raise ValueError(f"seq_len={seq_len!r} must be a positive integer (tokens, prefix included)")
        self.k, self.sharing = k, sharing
        self._built_len: Optional[int] = None      # N once E/F exist: a plain int that compiled code can read
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)
        self.compress_k = UninitializedParameter()
        self.compress_v = UninitializedParameter() if sharing != "kv" else None
        grid_len = self._grid_length(self.hw, self.num_prefix_tokens)
        if seq_len is not None and grid_len is not None and seq_len != grid_len:
            raise ValueError(f"seq_len={seq_len} disagrees with hw={self.hw} and num_prefix_tokens="
                             f"{self.num_prefix_tokens} (N={grid_len}); give one of them")
        if seq_len is not None or grid_len is not None:
            self._build(seq_len if seq_len is not None else grid_len)
            self._drop_lazy_hooks()

    @staticmethod
    def _grid_length(hw, prefix) -> Optional[int]:
        return None if hw is None or prefix is None else int(prefix) + int(hw[0]) * int(hw[1])

    @property
    def seq_len(self) -> Optional[int]:
        """The token count N the projections were built for (``None`` until known).

        Remembered as a Python int once the projections exist, so a built layer's forward never calls
        ``is_lazy`` (which torch.compile cannot trace); E/F materialised by ``load_state_dict`` into a
        lazy layer are picked up at the first call."""
        if self._built_len is None and not is_lazy(self.compress_k):
            self._built_len = int(self.compress_k.shape[-1])
        return self._built_len

    def _projection_shape(self, n: int):
        return (self.num_heads, self.k, n) if self.sharing == "none" else (self.k, n)

    @torch.no_grad()
    def _build(self, n: int) -> None:
        """Materialise ``E`` (and ``F``) for ``n`` tokens, or check that they were built for ``n``."""
        if not is_lazy(self.compress_k):
            self._check_length(n)
            return
        bound = math.sqrt(6.0 / (self.k + n)) / math.sqrt(2.0)     # Xavier-uniform, gain 1/√2 (authors' code)
        with torch.inference_mode(False), torch.no_grad():   # a first call under inference_mode: trainable E/F
            for p in (self.compress_k, self.compress_v):
                if p is not None:
                    p.materialize(self._projection_shape(n))
                    p.uniform_(-bound, bound)
        self._built_len = n

    def _drop_lazy_hooks(self) -> None:
        """Built outside a forward: remove torch's lazy-module hooks (its first forward would)."""
        if hasattr(self, "_initialize_hook"):
            self._initialize_hook.remove()
            self._load_hook.remove()
            del self._initialize_hook, self._load_hook

    def _replicate_for_data_parallel(self):
        if self.has_uninitialized_params():                         # torch's lazy-module error
            return LazyModuleMixin._replicate_for_data_parallel(self)
        return torch.nn.Module._replicate_for_data_parallel(self)

    def _check_length(self, n: int) -> None:
        if n != self.seq_len:
            raise ValueError(
                f"linformer: E/F were built for N={self.seq_len} tokens, got N={n}. Linformer projects a fixed "
                f"sequence length; build the layer for this input (seq_len={n}, or create the model at this "
                f"image size)")

    def set_grid(self, hw, num_prefix_tokens=None) -> None:
        """Fix the grid; with both ``hw`` and ``num_prefix_tokens`` this also builds ``E``/``F``."""
        n = self._grid_length(hw, num_prefix_tokens)
        if n is not None:
            self._build(n)
            self._drop_lazy_hooks()
        super().set_grid(hw, num_prefix_tokens)

    def initialize_parameters(self, x, *args, **kwargs) -> None:
        """torch's lazy-module hook (first forward): build ``E``/``F`` for the input's length."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__} expects x of shape (B, N, {self.dim}), got "
                             f"{tuple(getattr(x, 'shape', ()))}")
        self._build(x.shape[1])

    def _compress(self, k: torch.Tensor, v: torch.Tensor):
        e = self.compress_k
        f = self.compress_v if self.compress_v is not None else e
        return e @ k, f @ v                                          # (B, H, k, d): broadcast over B (and H)

    def mix(self, x, grid=None, attn_mask=None, is_causal=False):
        self._check_length(x.shape[1])
        q, k, v = self._qkv(x)
        kp, vp = self._compress(k, v)
        drop = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, kp, vp, dropout_p=drop, scale=self.scale)
        return self._project_out(out)

    def analytic_flops(self, batch: int, n: int) -> int:
        """qkv and proj, ``E·K`` and ``F·V`` (``2·k·N·d`` per head each), ``q·(EK)ᵀ`` and ``A·(FV)``."""
        c = self.dim
        return 2 * batch * n * c * 4 * c + 8 * batch * n * self.k * c

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, **grid) -> torch.Tensor:
        """Effective ``(B, heads, N, N)`` weights ``softmax(q·(EK)ᵀ)·F`` (``out = that · V``)."""
        self._check_length(x.shape[1])
        q, k, v = self._qkv(x)
        kp, _ = self._compress(k, v)
        f = self.compress_v if self.compress_v is not None else self.compress_k
        return torch.softmax((q @ kp.transpose(-1, -2)) * self.scale, dim=-1) @ f

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, k={self.k}, sharing={self.sharing!r}, "
                f"seq_len={self.seq_len}")
