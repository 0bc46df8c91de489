"""The mixer contract shared by every vitmix token mixer.

A mixer is an ``nn.Module`` class with timm's ``Attention`` constructor signature and
``forward(x, attn_mask=None, is_causal=False)`` on ``x: (B, N, C)`` returning ``(B, N, C)``, so the
class itself (not a ``functools.partial``) can be handed to
``timm.models.vision_transformer.VisionTransformer(attn_layer=...)``.

Spatial mixers also need the token grid. It can be given explicitly, at construction
(``hw=(H, W)``, ``num_prefix_tokens=P``), per call (``forward(x, hw=..., num_prefix_tokens=...)``)
or for a whole model with :func:`set_token_grid`. Without ``hw`` the grid is inferred only where it
is unambiguous: a square ``S×S`` after the prefix count the mixer was told, or after timm's default
of one CLS token when it was told none (``N = P + S*S``); anything else is a one-line ``ValueError``
saying to pass ``hw`` / call :func:`set_token_grid` (a non-square grid, registers or no CLS token
cannot be guessed from N). With ``hw`` and no prefix count, ``N - H*W`` must be 0 or 1 (timm's
layouts without registers).

1-D sequences (text, bytes, audio frames): told ``sequence=True`` (at construction, per call, or by
:func:`set_token_grid`), a mixer reads ``(B, N, C)`` as prefix tokens (0 unless told) followed by a sequence
of any length, and each mixer states what it does there in :attr:`TokenMixer.on_sequence`. A key-padding
``mask=(B, N)`` (bool, ``True`` on real tokens, right padding) makes the outputs on a padded batch's real
tokens equal to those of each sample run alone; padded positions come out as zeros
(:mod:`vitmix.mixers.sequence`).
"""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional, Tuple

import torch
from torch import nn

from .._util import close_matches  # also imported from here by the mixers
from .options import norm_layer_class
from .sequence import SequenceGrid, check_padding_mask

# Keyword arguments that some timm versions pass to ``attn_layer`` and that mixers may ignore.
_TIMM_EXTRA_KWARGS = frozenset({"depth", "device", "dtype", "attn_head_dim", "dim_out", "gated"})
#: timm's ``VisionTransformer`` default: one CLS token and no registers (``num_prefix_tokens=1``)
TIMM_DEFAULT_PREFIX = 1
#: prefix counts accepted with an explicit ``hw`` when none was told: no CLS token, or timm's one
_UNTOLD_PREFIXES = (0, 1)
_GRID_FIX = "pass hw=(H, W) to the mixer or call vitmix.mixers.set_token_grid(model, hw=(H, W), num_prefix_tokens=P)"


def infer_grid(n_tokens: int, num_prefix_tokens: Optional[int] = None) -> Tuple[int, int, int]:
    """``(prefix, S, S)`` for ``n_tokens`` tokens laid out as ``prefix`` tokens + a square grid.

    ``prefix`` is ``num_prefix_tokens`` when given, else timm's default of one CLS token; no other
    count is tried, since a square found after a guessed prefix can be a wrong layout (CLS + 6×10
    = 61 tokens is not 12 + 7×7). Raises a one-line ``ValueError`` when the rest is not a square.
    """
    told = num_prefix_tokens is not None
    prefix = int(num_prefix_tokens) if told else TIMM_DEFAULT_PREFIX
    side = math.isqrt(max(n_tokens - prefix, 0))
    if side > 0 and side * side == n_tokens - prefix:
        return prefix, side, side
    seen = f"{prefix} prefix token(s)" if told else f"{prefix} prefix token (timm's default CLS; none was set)"
    full = math.isqrt(n_tokens)
    hint = (f" (no CLS token: num_prefix_tokens=0 makes it {full}x{full})"
            if not told and full * full == n_tokens else "")
    raise ValueError(
        f"cannot infer a square token grid from N={n_tokens} tokens with {seen}: {n_tokens - prefix} grid "
        f"tokens are not a square; {_GRID_FIX}{hint}"
    )


def resolve_grid(
    n_tokens: int, hw: Optional[Tuple[int, int]] = None, num_prefix_tokens: Optional[int] = None
) -> Tuple[int, int, int]:
    """Return ``(prefix, H, W)`` for a sequence of ``n_tokens`` tokens, checking consistency.

    With ``hw``, the prefix is ``n_tokens - H*W``: it must equal ``num_prefix_tokens`` when that is
    given, else be 0 or 1 (no CLS token, or timm's one), so a wrong ``hw`` cannot turn most of the
    sequence into "prefix" tokens. Without ``hw``: :func:`infer_grid`.
    """
    n_tokens = int(n_tokens)        # torch.jit.trace (TorchScript ONNX export) hands sizes over as tensors
    if hw is None:
        return infer_grid(n_tokens, num_prefix_tokens)
    h, w = int(hw[0]), int(hw[1])
    if h <= 0 or w <= 0:
        raise ValueError(f"token grid hw must be positive, got {tuple(hw)}")
    prefix = n_tokens - h * w
    if prefix < 0:
        raise ValueError(f"token grid {h}x{w}={h * w} needs at least that many tokens, got N={n_tokens}")
    if num_prefix_tokens is not None and prefix != num_prefix_tokens:
        raise ValueError(
            f"N={n_tokens} tokens do not match grid {h}x{w} plus {num_prefix_tokens} prefix tokens "
            f"(expected N={h * w + num_prefix_tokens})"
        )
    if num_prefix_tokens is None and prefix not in _UNTOLD_PREFIXES:
        raise ValueError(
            f"N={n_tokens} tokens with grid hw=({h}, {w}) would leave {prefix} prefix tokens, and no prefix "
            f"count was set (0 or 1 are assumed); check hw, or pass num_prefix_tokens={prefix} to the mixer / "
            f"vitmix.mixers.set_token_grid(model, hw=({h}, {w}), num_prefix_tokens={prefix})"
        )
    return prefix, h, w


class NonFiniteInputError(ValueError, FloatingPointError):
    """A kernel mixer's input holds NaN or Inf (see ``TokenMixer.rejects_non_finite``). A ``ValueError``
    to whoever calls the layer on bad data; a ``FloatingPointError`` to a training loop, where it means
    the run diverged, like a non-finite loss, and takes the same abort path (``aborted.json``)."""


class TimmOptions(NamedTuple):
    """timm ``Attention``'s options, as one mixer received them (``TokenMixer.timm_options``)."""

    qkv_bias: bool
    qk_norm: bool
    scale_norm: bool
    proj_bias: bool
    attn_drop: float
    proj_drop: float
    norm_layer: Optional[type]


class TokenMixer(nn.Module):
    """Base class of all vitmix mixers: the timm ``Attention`` signature plus grid handling.

    Subclasses build their layers in ``__init__`` (after calling ``super().__init__``) and implement
    :meth:`mix`, which receives the already-checked input and the resolved grid. ``forward`` is
    shared so every mixer validates its input and handles ``hw``/prefix tokens identically. A
    subclass takes ``(dim, num_heads=8, *args, <its own keyword-only options>, **kwargs)``, passes
    ``*args, **kwargs`` on, and reads timm's options from ``self.timm_options``.

    Args:
        dim: channels C of the input ``(B, N, C)``.
        num_heads: attention heads; must divide ``dim``.
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer: timm's meaning;
            a mixer that cannot honour one ignores it only when it is at its default.
        hw: explicit token grid ``(H, W)``; inferred as a square when ``None`` (see the module docstring).
        num_prefix_tokens: CLS/register tokens before the grid; when ``None``, timm's default of one CLS
            token for an inferred square grid, 0 or 1 with ``hw`` (0 on a sequence).
        sequence: read the tokens as a 1-D sequence of any length, not an image grid (``hw`` is then unused;
            :attr:`on_sequence` says what the mixer does there).
    """

    #: mixers that read the token grid set this to True (informational; used in docs and tests)
    spatial: bool = False
    #: mixers that honour an additive/boolean ``attn_mask`` set this to True
    supports_attn_mask: bool = False
    #: cost in the number of tokens N with the default options: "linear", "n log n" or "quadratic"
    complexity: str = "quadratic"
    #: kernel mixers (inverses, normalisers) reject NaN/Inf inputs with a :class:`NonFiniteInputError`
    #: instead of propagating them into an iteration that would hide where they came from
    rejects_non_finite: bool = False
    #: True while the layer's parameters still wait for a token grid it has not been told (Linformer's
    #: E/F, sized by N); ``vitmix.create_model`` then runs one forward at the model's input size
    awaits_grid: bool = False
    #: submodules whose output is added to the mixed tokens (local convolutions of V): zeroed by
    #: :meth:`load_attention`, so a layer converted from softmax attention starts without them
    additive_terms: Tuple[str, ...] = ()
    #: options ``vitmix bench`` builds one layer of this mixer with in a token sweep, unless the spec
    #: sets them (read-only; a subclass assigns its own dict)
    bench_options: Mapping[str, object] = MappingProxyType({})
    #: what the mixer does on a 1-D sequence (``sequence=True``; ``vitmix mixers`` shows it); ``None``: a
    #: spatial mixer that needs an image grid (refused on sequences), or a non-spatial one that reads no grid
    on_sequence: Optional[str] = None
    #: how a key-padding ``mask`` is honoured: ``"masked"`` (within the batch: ``mix`` receives ``mask=`` and
    #: leaves padded keys out of every sum, landmark and normaliser), ``"by_length"`` (the mixer's pattern is
    #: a function of N, so each valid length is mixed on its own, unpadded) or ``None`` (refused)
    padding_mask: Optional[str] = None

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Optional[type] = None,
        *,
        hw: Optional[Tuple[int, int]] = None,
        num_prefix_tokens: Optional[int] = None,
        sequence: bool = False,
        **timm_kwargs,
    ) -> None:
        super().__init__()
        unknown = set(timm_kwargs) - _TIMM_EXTRA_KWARGS
        if unknown:
            bad = sorted(unknown)[0]
            raise ValueError(
                f"{type(self).__name__} got an unknown option {bad!r}."
                + close_matches(bad, self.option_names())
            )
        if dim <= 0 or num_heads <= 0 or dim % num_heads != 0:
            raise ValueError(f"dim={dim} must be a positive multiple of num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.hw = tuple(hw) if hw is not None else None
        self.num_prefix_tokens = num_prefix_tokens
        self.sequence = bool(sequence)
        if self.sequence:
            self.sequence_support()      # a mixer that needs an image grid says so at construction
        # timm's attention options, taken once here: subclasses read them instead of repeating the signature
        self.timm_options = TimmOptions(qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop,
                                        norm_layer_class(norm_layer))

    @classmethod
    def option_names(cls) -> list:
        """Names of the keyword options accepted by this mixer's constructor."""
        import inspect

        names = []
        for klass in cls.__mro__:
            if klass is nn.Module or not issubclass(klass, TokenMixer):
                continue
            for p in inspect.signature(klass.__init__).parameters.values():
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self",):
                    names.append(p.name)
        return sorted(set(names))

    @classmethod
    def stage_options(cls, stage: int, stride: int, newton_iters: int) -> dict:
        """Options this mixer takes in stage ``stage`` (0–3) of a pyramid backbone whose landmark
        stride there is ``stride``; mixers without landmarks need none."""
        return {}

    @classmethod
    def sequence_support(cls, refuse: bool = True) -> Optional[str]:
        """What the mixer does on a 1-D sequence (one line); for one that needs an image grid, a one-line
        ``ValueError`` (``refuse=False``: ``None``)."""
        if cls.on_sequence is not None:
            return cls.on_sequence
        if not cls.spatial:
            return "as on images (it reads no token grid)"
        if refuse:
            raise ValueError(f"{cls.__name__} works on image token grids only and cannot mix a 1-D sequence; pick "
                             f"a mixer whose `vitmix mixers` entry has a 1-D behaviour")
        return None

    def set_grid(self, hw: Optional[Tuple[int, int]], num_prefix_tokens: Optional[int] = None) -> None:
        """Fix the token grid used when ``forward`` is not given one."""
        self.hw = tuple(hw) if hw is not None else None
        self.num_prefix_tokens = num_prefix_tokens

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        *,
        hw: Optional[Tuple[int, int]] = None,
        num_prefix_tokens: Optional[int] = None,
        mask: Optional[torch.Tensor] = None,
        sequence: Optional[bool] = None,
    ) -> torch.Tensor:
        """``(B, N, C) -> (B, N, C)``. ``hw``/``num_prefix_tokens``/``sequence`` override the layout set on
        the mixer for this call; ``mask`` is a key-padding mask (see the module docstring)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__} expects x of shape (B, N, {self.dim}), got {tuple(x.shape)}"
            )
        # one reduction, no (B, N, C) boolean tensor: a NaN/Inf anywhere makes the float32 sum non-finite
        if (self.rejects_non_finite and not torch.compiler.is_compiling()
                and not bool(torch.isfinite(x.sum(dtype=torch.float32)))):
            raise NonFiniteInputError(f"{type(self).__name__}: the input x contains NaN or Inf values; check the "
                                      "layers before it (a diverged training step, a bad learning rate or an fp16 "
                                      "overflow)")
        if (attn_mask is not None or is_causal) and not self.supports_attn_mask:
            raise ValueError(
                f"{type(self).__name__} does not support attn_mask/is_causal; use the 'softmax' mixer"
            )
        seq = self.sequence if sequence is None else bool(sequence)
        if seq:
            self.sequence_support()
        grid = self.token_grid(x.shape[1], hw, num_prefix_tokens, sequence=seq) if self.spatial else None
        if mask is None:
            return self.mix(x, grid=grid, attn_mask=attn_mask, is_causal=is_causal)
        lengths = self._check_mask(mask, x, grid)
        if self.padding_mask == "by_length":
            out = self._mix_by_length(x, grid, lengths)
        else:
            out = self.mix(x, grid=grid, attn_mask=attn_mask, is_causal=is_causal, mask=mask)
        return out.masked_fill(~mask[..., None], 0)

    def _check_mask(self, mask: torch.Tensor, x: torch.Tensor, grid) -> torch.Tensor:
        """The valid length of each sample; one-line errors for a mask this mixer cannot take."""
        name = type(self).__name__
        if self.padding_mask is None:
            raise ValueError(f"{name} cannot take a key-padding mask; run the samples unpadded, or pick a mixer "
                             f"that masks (`vitmix mixers` lists them)")
        if grid is not None and not isinstance(grid, SequenceGrid):
            raise ValueError(f"{name}: a key-padding mask needs a 1-D sequence (an image grid has no padding); "
                             f"pass sequence=True to the mixer or to vitmix.mixers.set_token_grid")
        lengths = check_padding_mask(mask, x, name)
        prefix = grid.prefix if grid is not None else 0
        if prefix and not (torch.compiler.is_compiling() or torch.jit.is_tracing()) and int(lengths.min()) <= prefix:
            raise ValueError(f"{name}: every sample needs a real token after its {prefix} prefix token(s), got "
                             f"a mask with {int(lengths.min())} real token(s)")
        return lengths

    @torch.compiler.disable
    def _mix_by_length(self, x: torch.Tensor, grid, lengths: torch.Tensor) -> torch.Tensor:
        """``mix`` of each group of samples with the same valid length, on their unpadded tokens (padded
        positions zero): exact for patterns that depend on N, at one call per distinct length. A loop over
        the data's lengths: eager under ``torch.compile`` (the graph breaks around it)."""
        out = x.new_zeros(x.shape[0], x.shape[1], self.dim)
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero().squeeze(1)
            sub = grid if grid is None else SequenceGrid(grid.prefix, length - grid.prefix)
            out[rows, :length] = self.mix(x[rows, :length], grid=sub).to(out.dtype)
        return out

    def token_grid(self, n_tokens: int, hw: Optional[Tuple[int, int]] = None,
                   num_prefix_tokens: Optional[int] = None, sequence: Optional[bool] = None):
        """``(prefix, H, W)`` for ``n_tokens`` tokens: the per-call grid, else the one set on the
        mixer, else a square inferred where unambiguous (:func:`resolve_grid`); on a 1-D sequence
        (``sequence``, else the mixer's setting) a :class:`~vitmix.mixers.sequence.SequenceGrid`. The one
        place a mixer resolves its grid."""
        prefix = num_prefix_tokens if num_prefix_tokens is not None else self.num_prefix_tokens
        if self.sequence if sequence is None else sequence:
            prefix = int(prefix or 0)
            if prefix < 0 or prefix >= n_tokens:
                raise ValueError(f"{type(self).__name__}: num_prefix_tokens={prefix} must be between 0 and N - 1 "
                                 f"(a sequence of N={n_tokens} tokens needs at least one after the prefix)")
            return SequenceGrid(prefix, int(n_tokens) - prefix)
        hw = hw if hw is not None else self.hw
        return resolve_grid(n_tokens, hw, prefix)

    def mix(self, x, grid, attn_mask=None, is_causal=False):  # pragma: no cover - abstract
        """Mix tokens. ``grid`` is ``(prefix, H, W)`` or a :class:`~vitmix.mixers.sequence.SequenceGrid` for
        spatial mixers, else ``None``. A mixer with ``padding_mask = "masked"`` also takes ``mask=(B, N)``."""
        raise NotImplementedError

    def analytic_flops(self, batch: int, n: int) -> Optional[int]:
        """Forward FLOPs on ``(batch, n, dim)`` by formula (``vitmix.bench``'s unit), for kernels the FLOP
        counter cannot see; ``None``: no formula, the counter's total stands."""
        return None

    def attention_map(self, x: torch.Tensor, **grid) -> torch.Tensor:
        """The effective ``(B, heads, N, N)`` token-to-token weights, for analysis (O(N^2))."""
        raise NotImplementedError(f"{type(self).__name__} does not expose an attention map")

    @torch.no_grad()
    def load_attention(self, state: dict) -> None:
        """Start from a trained softmax attention layer (``vitmix.convert``): ``state`` holds its weights
        under timm ``Attention``'s names (``qkv.*``, ``proj.*``, and ``q_norm.*``/``k_norm.*``/``norm.*``
        when it has them). Default: copy them under the same names (the layout of
        :class:`AttentionProjections` and LaplacianFormer) and zero the :attr:`additive_terms`; a mixer
        with other layers or parameters that can start closer to the teacher overrides this."""
        self._take_weights(state)
        self._zero_additive_terms()

    def _take_weights(self, weights: dict) -> None:
        """Copy ``weights`` into this layer's tensors of the same names; ``ValueError`` naming the first
        one it lacks or has in another shape."""
        own = self.state_dict()
        for key, value in weights.items():
            if key not in own:
                raise ValueError(f"{type(self).__name__} has no {key!r} to take the teacher's weights into; it "
                                 f"cannot start from this attention layer (override load_attention)")
            if own[key].shape != value.shape:
                raise ValueError(f"{type(self).__name__}.{key} has shape {tuple(own[key].shape)}, the teacher's "
                                 f"{tuple(value.shape)}")
        self.load_state_dict(weights, strict=False)

    def _zero_additive_terms(self) -> None:
        for name in self.additive_terms:
            module = getattr(self, name, None)
            for p in module.parameters() if isinstance(module, nn.Module) else ():
                p.zero_()


class AttentionProjections:
    """timm ``Attention``'s layers for mixers that score q·k: ``qkv``, ``q_norm``/``k_norm``,
    ``attn_drop``, ``norm`` (scale_norm), ``proj``, ``proj_drop`` — same names, so timm state dicts load.

    Mix into a :class:`TokenMixer` subclass and call :meth:`_init_projections` from ``__init__``.
    """

    def _init_projections(self, qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, proj_drop, norm_layer):
        if (qk_norm or scale_norm) and norm_layer is None:
            norm_layer = nn.LayerNorm
        dim = self.dim
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def _qkv(self, x: torch.Tensor):
        """``(B, N, C)`` → normed ``q, k`` and ``v``, each ``(B, heads, N, head_dim)``."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def _project_out(self, out: torch.Tensor) -> torch.Tensor:
        """Per-head ``(B, heads, N, head_dim)`` → merged, normed and projected ``(B, N, C)``."""
        b, _, n, _ = out.shape
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.dim))
        return self.proj_drop(self.proj(out))


def set_token_grid(model: nn.Module, hw: Optional[Tuple[int, int]], num_prefix_tokens: Optional[int] = None,
                   *, sequence: bool = False):
    """Set the token grid of every vitmix mixer inside ``model`` (e.g. a stock timm ViT).

    ``sequence=True`` makes them read a 1-D sequence instead (a one-line ``ValueError`` if one of them needs
    an image grid); ``hw`` then only sizes the mixers built for a fixed N (Linformer: ``N = P + H*W``).

    Needed in a stock timm ``VisionTransformer`` whose grid is not square or whose prefix is not one
    CLS token (``class_token=False``, ``reg_tokens``): pass ``num_prefix_tokens=model.num_prefix_tokens``
    and ``hw=model.patch_embed.grid_size``. Returns ``model``."""
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    for module in mixers if sequence else ():
        module.sequence_support()          # before anything changes
    for module in mixers:
        module.set_grid(hw, num_prefix_tokens)
        module.sequence = bool(sequence)
    return model


def number_layers(model: nn.Module, start: int = 0, *, overwrite: bool = False) -> nn.Module:
    """Give the depth-aware mixers of ``model`` (those with a ``layer_idx``, e.g. Fibottention's per-layer
    head shuffle) the indices ``start, start+1, ...`` in module order; returns ``model``.

    timm's ``Block`` does not pass its depth to ``attn_layer``, so the model builders call this once.
    Mixers that already have an index keep it unless ``overwrite``; other mixers are not counted (a
    TimeSformer with softmax in time numbers its spatial Fibottention layers 0, 1, ...).
    """
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be an integer >= 0, got {start!r}")
    depth_aware = [m for m in model.modules() if isinstance(m, TokenMixer) and hasattr(m, "layer_idx")]
    for index, mixer in enumerate(depth_aware, start):
        if overwrite or mixer.layer_idx is None:
            mixer.layer_idx = index
    return model
