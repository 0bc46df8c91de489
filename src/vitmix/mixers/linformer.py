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

Sequence length: ``E`` and ``F`` have one column per token, so they depend on N. Their parameters
exist from construction (so a model can be counted, summarised, saved or handed to an optimizer
at once), built for exactly N when the layer is told it: ``seq_len=N``, or ``hw=(H, W)`` together
with ``num_prefix_tokens`` (``N = P + H·W``), or — inside a timm model, where the attention layer is
built before the grid is known — :func:`~vitmix.mixers.set_token_grid` (``vitmix.create_model``
calls it) or a first call that passes the grid (the pyramid backbones, whose stages pass it on
every call; ``vitmix.create_model`` runs that call). Such a layer refuses any other N with a
``ValueError``: interpolating learned projections to a new length is not part of the method, so a
model at another image size is built (or fine-tuned) at that size.

A layer told nothing (a stock timm ``VisionTransformer(attn_layer=timm_attn("linformer"))``) is built
for up to ``max_seq_len`` tokens (default :data:`DEFAULT_MAX_SEQ_LEN` = 197, timm's default ViT:
224², patch 16, CLS) and uses the first N columns of ``E``/``F`` for an N-token input — the same as
zero-padding the sequence to ``max_seq_len``, which is how reference implementations serve shorter
sequences. Longer inputs are a ``ValueError`` naming ``seq_len`` and ``set_token_grid``. While such
a layer's ``E``/``F`` hold their first draw (not trained, not loaded), being told its grid re-shapes
them in place to exactly N, drawing them as a layer built for N would; trained ones are kept.

Default ``k=64``: the projected length of the SOFT paper's Linformer comparison is not stated in
the sources we could check; 64 sits just above the 49-key budget of vitmix's other linear baselines
and stays well below N at 224² (197 tokens). With ``k ≥ N`` there is no compression.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import AttentionProjections, TokenMixer, close_matches
from .registry import register_mixer
from .sequence import zero_padding

__all__ = ["DEFAULT_MAX_SEQ_LEN", "LinformerAttention", "linformer_reference", "SHARING"]

#: the length a layer that is told nothing is built for: timm's default ViT (224², patch 16, one CLS token)
DEFAULT_MAX_SEQ_LEN = 197
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


def _positive_length(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name}={value!r} must be a positive integer (tokens, prefix included)")


@register_mixer("linformer")
class LinformerAttention(AttentionProjections, TokenMixer):
    """Linformer attention (Wang et al., 2020): keys/values projected to ``k`` rows; O(N·k).

    Args:
        k: projected length (default 64).
        sharing: ``"headwise"`` (default) | ``"kv"`` | ``"none"`` (see the module docstring).
        seq_len: the token count N the projections are built for; default: ``num_prefix_tokens +
            H·W`` when both are given, else the grid set later (:func:`~vitmix.mixers.set_token_grid`
            or a call with ``hw`` and ``num_prefix_tokens``).
        max_seq_len: for a layer told no N: the longest input, whose first N columns of ``E``/``F`` an
            N-token input uses (default :data:`DEFAULT_MAX_SEQ_LEN`).
        See :class:`~vitmix.mixers.base.TokenMixer` for the shared arguments (``attn_drop`` applies
        to the ``N × k`` weights).
    """

    complexity = "linear"
    #: padded keys and values are zeroed before ``E``/``F``: a padded sample is compressed exactly as a
    #: layer not told its N serves it unpadded (its first columns)
    padding_mask = "masked"

    def __init__(self, dim: int, num_heads: int = 8, *args, k: int = 64, sharing: str = "headwise",
                 seq_len: Optional[int] = None, max_seq_len: Optional[int] = None, **kwargs) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer = self.timm_options
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be a positive integer (the projected length, e.g. 64)")
        if sharing not in SHARING:
            raise ValueError(f"linformer sharing={sharing!r} is not one of {', '.join(SHARING)}."
                             + close_matches(str(sharing), SHARING))
        _positive_length("seq_len", seq_len)
        _positive_length("max_seq_len", max_seq_len)
        self.k, self.sharing = k, sharing
        self._init_projections(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer)
        told = self._told_length(seq_len, max_seq_len)
        # plain Python state, so that compiled code reads ints and bools (no tensor checks in forward)
        self._length = told if told is not None else (max_seq_len or DEFAULT_MAX_SEQ_LEN)
        self._exact = told is not None                 # built for exactly N (else: for up to _length tokens)
        self._provisional = told is None               # may still be re-shaped to the grid it is told
        self.compress_k = nn.Parameter(torch.empty(self._projection_shape(self._length)))
        self.compress_v = nn.Parameter(torch.empty_like(self.compress_k)) if sharing != "kv" else None
        if told is not None:
            self._draw()
        else:   # usually re-drawn once the grid is known: leave the global RNG where it was, so the
            with torch.random.fork_rng(devices=[]):   # model's other weights do not depend on this draw
                self._draw()
        self._first_values = self._probe()             # to tell an untouched E from a trained or loaded one

    def _told_length(self, seq_len: Optional[int], max_seq_len: Optional[int]) -> Optional[int]:
        grid_len = self._grid_length(self.hw, self.num_prefix_tokens)
        if seq_len is not None and grid_len is not None and seq_len != grid_len:
            raise ValueError(f"seq_len={seq_len} disagrees with hw={self.hw} and num_prefix_tokens="
                             f"{self.num_prefix_tokens} (N={grid_len}); give one of them")
        told = seq_len if seq_len is not None else grid_len
        if told is not None and max_seq_len is not None:
            raise ValueError(f"linformer: max_seq_len={max_seq_len} is for a layer told no N, but this one is "
                             f"built for N={told}; drop max_seq_len")
        return told

    @staticmethod
    def _grid_length(hw, prefix) -> Optional[int]:
        return None if hw is None or prefix is None else int(prefix) + int(hw[0]) * int(hw[1])

    @property
    def seq_len(self) -> Optional[int]:
        """The token count N the projections are built for (``None`` for a layer told no N)."""
        return self._length if self._exact else None

    @property
    def max_seq_len(self) -> int:
        """The longest input: ``seq_len`` when built for one N, else ``max_seq_len``."""
        return self._length

    @property
    def awaits_grid(self) -> bool:
        """True until the layer was told its N or loaded (see :attr:`TokenMixer.awaits_grid`)."""
        return self._provisional

    def _probe(self) -> list:
        """A few entries of ``E`` (row 0, the first columns, which every input's gradient reaches)."""
        return self.compress_k.detach().reshape(-1, self.compress_k.shape[-1])[0, :8].tolist()

    def _projection_shape(self, n: int):
        return (self.num_heads, self.k, n) if self.sharing == "none" else (self.k, n)

    def _projections(self):
        return [p for p in (self.compress_k, self.compress_v) if p is not None]

    @torch.no_grad()
    def _draw(self) -> None:
        """``E`` (and ``F``): Xavier-uniform with gain 1/√2 (authors' code), for their current length."""
        bound = math.sqrt(6.0 / (self.k + self._length)) / math.sqrt(2.0)
        for p in self._projections():
            p.uniform_(-bound, bound)

    def _reshape(self, n: int) -> None:
        """Give ``E``/``F`` ``n`` columns in place (same ``Parameter`` objects, so references held
        by an optimizer stay valid), uninitialised; exact from now on."""
        with torch.inference_mode(False), torch.no_grad():   # told under inference_mode: trainable E/F
            for p in self._projections():
                p.data = torch.empty(self._projection_shape(n), dtype=p.dtype, device=p.device)
        self._length, self._exact, self._provisional = n, True, False

    def _fit(self, n: int) -> None:
        """Told the length ``n``: re-shape a provisional layer to it (and draw E/F), or check it. E/F
        that changed since construction (trained) are kept: re-drawing them would lose the training."""
        if self._provisional and self._probe() == self._first_values:
            self._reshape(n)
            with torch.inference_mode(False):
                self._draw()
            return
        self._provisional = False
        self._check_length(n)

    def _check_length(self, n: int) -> None:
        if self._exact and n != self._length:
            raise ValueError(
                f"linformer: E/F were built for N={self._length} tokens, got N={n}. Linformer projects a fixed "
                f"sequence length; build the layer for this input (seq_len={n}, or create the model at this "
                f"image size)")
        if n > self._length:
            raise ValueError(
                f"linformer: N={n} tokens exceed max_seq_len={self._length} of a layer that was not told its "
                f"length; pass seq_len={n} (mixers.timm_attn('linformer', seq_len={n})) or call "
                f"vitmix.mixers.set_token_grid(model, hw=(H, W), num_prefix_tokens=P) before training")

    def set_grid(self, hw, num_prefix_tokens=None) -> None:
        """Fix the grid; with both ``hw`` and ``num_prefix_tokens`` this also fits ``E``/``F`` to N."""
        n = self._grid_length(hw, num_prefix_tokens)
        if n is not None:
            self._fit(n)
        super().set_grid(hw, num_prefix_tokens)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False, *,
                hw=None, num_prefix_tokens=None, **options) -> torch.Tensor:
        # a provisional layer's first call that passes a grid (pyramid stages) fits E/F; compiled code
        # never re-shapes parameters, and an untold call changes nothing (one graph, no recompilation)
        if not torch.compiler.is_compiling() and self._provisional and x.dim() == 3:
            told = self._grid_length(hw if hw is not None else self.hw,
                                     num_prefix_tokens if num_prefix_tokens is not None else self.num_prefix_tokens)
            if told is not None:
                self._fit(told)
        return super().forward(x, attn_mask, is_causal, hw=hw, num_prefix_tokens=num_prefix_tokens, **options)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Loaded E/F are final: a provisional layer takes their length (saved from a layer built for N)."""
        saved = state_dict.get(prefix + "compress_k")
        if saved is not None and self._provisional:
            if tuple(saved.shape) != tuple(self.compress_k.shape):
                self._reshape(int(saved.shape[-1]))
            self._provisional = False
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _e_f(self, n: int):
        """``E`` and ``F`` for ``n`` tokens: all columns, or the first ``n`` of a ``max_seq_len`` layer."""
        e = self.compress_k
        f = self.compress_v if self.compress_v is not None else e
        return (e, f) if n == self._length else (e[..., :n], f[..., :n])

    def _compress(self, k: torch.Tensor, v: torch.Tensor):
        e, f = self._e_f(k.shape[-2])
        return e @ k, f @ v                                          # (B, H, k, d): broadcast over B (and H)

    def mix(self, x, grid=None, attn_mask=None, is_causal=False, mask=None):
        self._check_length(x.shape[1])
        q, k, v = self._qkv(x)
        kp, vp = self._compress(zero_padding(k, mask), zero_padding(v, mask))   # padding: zero columns of E, F
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
        return torch.softmax((q @ kp.transpose(-1, -2)) * self.scale, dim=-1) @ self._e_f(x.shape[1])[1]

    @torch.no_grad()
    def load_attention(self, state: dict) -> None:
        """From a softmax layer (``vitmix.convert``): its ``qkv``/``proj`` (:class:`TokenMixer`'s default), and
        ``E``/``F`` as adaptive average pooling of the tokens into ``k`` rows (windows of consecutive tokens,
        as Nyströmformer's segment means), so the layer starts as softmax attention over ``k`` mean keys and
        values (exactly the teacher's when ``k`` equals N)."""
        super().load_attention(state)
        n = self.compress_k.shape[-1]
        pool = F.adaptive_avg_pool1d(torch.eye(n)[None], self.k)[0].T           # (k, N): row j averages segment j
        for p in self._projections():
            p.copy_(pool.expand_as(p))

    def extra_repr(self) -> str:
        length = f"seq_len={self._length}" if self._exact else f"max_seq_len={self._length}"
        return f"dim={self.dim}, num_heads={self.num_heads}, k={self.k}, sharing={self.sharing!r}, {length}"
