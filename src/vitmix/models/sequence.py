"""1-D sequence classifiers for Long Range Arena-style tasks (:mod:`vitmix.data.sequences`), any 1-D mixer.

``seq_lra_tiny`` is the encoder of Nyströmformer's LRA code at its default size: 2 pre-norm blocks of
width 64 with 2 heads of 32 and an FFN of 128, learned position embeddings, mean pooling over all tokens
and a two-layer ReLU head of the FFN's width. The input is ``(B, N)`` ids: symbol or byte ids through an
embedding table (``embed="tokens"``, as LRA embeds even pixels), or 8-bit pixel intensities through a
linear embedding of the scaled value (``embed="linear"``). Without a mask, padding is not masked: id 0 is a
token like any other, and the mean pools it too; ``model(ids, mask=...)`` with a key-padding mask
(``(B, N)`` bool, ``True`` on real tokens, right padding) leaves the padded tokens out of every mixer and of
the mean, so a padded sample is classified as it is alone. A model built with ``pad_id`` (ListOps' 0) makes that
mask itself, ``ids != pad_id``, and drops the batch's all-padding tail first, so a batch costs its longest
sample's length; this is how ``vitmix train`` gives variable-length data to the model.

Mixers are told a 1-D sequence without a CLS token (``sequence=True``; Linformer is sized for ``seq_len``).
A mixer without a 1-D behaviour is refused with a one-line ``ValueError``.
"""
from __future__ import annotations

from typing import Optional

import torch
from timm.layers import trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import Block
from torch import Tensor, nn

from ..mixers import get_mixer_class, list_mixers, set_token_grid
from ._builder import init_linear_and_norm, mixer_attn_layer, model_cfg

EMBEDDINGS = ("tokens", "linear")


def sequence_mixers() -> list:
    """The registered mixers that work on a 1-D sequence (those with a 1-D behaviour, ``vitmix mixers``)."""
    return [m for m in list_mixers() if get_mixer_class(m).sequence_support(refuse=False) is not None]


def _mixer_class(name: str):
    """The mixer class ``name``; a name that is not a mixer but an image model family (WeightFormer, whose
    dynamic weights and depthwise convolutions are built on the 2-D patch grid) is a one-line error saying so."""
    try:
        return get_mixer_class(name)
    except ValueError:
        import timm

        images = [m for m in timm.list_models(f"{name}*") if not is_sequence_model(m)] if isinstance(name, str) else []
        if not images:
            raise
        raise ValueError(f"{name!r} is an image model ({', '.join(images[:3])}), not a token mixer: it works on a 2-D "
                         f"patch grid by design; sequence models take the mixers that work on 1-D sequences: "
                         f"{', '.join(sequence_mixers())}") from None


class SequenceClassifier(nn.Module):
    """Embedding + learned positions → ``depth`` timm ``Block``s with a vitmix mixer → LayerNorm → mean
    over the tokens → ``Linear → ReLU → Linear`` head.

    Args:
        num_classes: output classes.
        seq_len: the position table's length, the longest input accepted (shorter inputs use its start).
        vocab_size: ids are ``0 .. vocab_size - 1``; with ``embed="linear"`` an id is read as the value
            ``id / (vocab_size - 1)`` (256: 8-bit pixels).
        embed: ``"tokens"`` (a lookup table) or ``"linear"`` (one value per token, linearly embedded).
        embed_dim, depth, num_heads, mlp_dim: widths; ``mlp_dim`` is the FFN's hidden width and the head's.
        mixer, mixer_options: the token mixer of every block (default ``softmax``).
        pad_id: the id that right-pads a shorter sequence (``None``: no id pads; every token is real). With it,
            ``forward(ids)`` masks the padding (see the module docstring); ``SequenceInfo.model_kwargs()`` sets it.
        drop_rate: dropout after the embedding, in the FFN and on the mixer's output; ``attn_drop_rate``:
            on attention weights (not every mixer has them); ``drop_path_rate``: stochastic depth.

    Shapes: ``forward(ids (B, N), mask=None)`` → ``(B, num_classes)`` with ``N <= seq_len``; ``mask`` is an
    optional ``(B, N)`` key-padding mask (see the module docstring).
    """

    def __init__(self, num_classes: int = 10, seq_len: int = 2000, vocab_size: int = 256, embed: str = "tokens",
                 embed_dim: int = 64, depth: int = 2, num_heads: int = 2, mlp_dim: int = 128,
                 mixer: Optional[str] = None, mixer_options: Optional[dict] = None, drop_rate: float = 0.1,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0, qkv_bias: bool = True,
                 pad_id: Optional[int] = None):
        super().__init__()
        if embed not in EMBEDDINGS:
            raise ValueError(f"embed={embed!r}: expected one of {', '.join(EMBEDDINGS)}")
        if seq_len < 1 or vocab_size < 2:
            raise ValueError(f"seq_len must be >= 1 and vocab_size >= 2, got {seq_len} and {vocab_size}")
        if pad_id is not None and not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id={pad_id} is not an id (0..{vocab_size - 1}); use None when no id pads")
        name = mixer or "softmax"
        if _mixer_class(name).sequence_support(refuse=False) is None:
            raise ValueError(f"mixer {name!r} needs a 2-D token grid; sequence models take the mixers that work on "
                             f"1-D sequences: {', '.join(sequence_mixers())}")
        self.num_classes, self.seq_len, self.vocab_size, self.embed = num_classes, seq_len, vocab_size, embed
        self.pad_id = pad_id
        self.num_features = self.embed_dim = embed_dim
        self.mlp_dim = mlp_dim
        self.num_prefix_tokens = 0
        self.tokens = nn.Embedding(vocab_size, embed_dim) if embed == "tokens" else nn.Linear(1, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, seq_len, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        attn_layer = mixer_attn_layer(mixer, mixer_options)
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio=mlp_dim / embed_dim, qkv_bias=qkv_bias, proj_drop=drop_rate,
                  attn_drop=attn_drop_rate, drop_path=dpr[i], attn_layer=attn_layer)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = self._make_head(num_classes)
        init_linear_and_norm(self)
        trunc_normal_(self.pos_embed, std=0.02)
        if embed == "tokens":
            nn.init.normal_(self.tokens.weight, std=0.02)
        set_token_grid(self, (1, seq_len), 0, sequence=True)     # mixers sized by N (Linformer): for seq_len

    def _make_head(self, num_classes: int) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        return nn.Sequential(nn.Linear(self.embed_dim, self.mlp_dim), nn.ReLU(), nn.Linear(self.mlp_dim, num_classes))

    def reset_classifier(self, num_classes: int) -> None:
        """A new, freshly initialised head for ``num_classes`` (0: the pooled features)."""
        self.num_classes, self.head = num_classes, self._make_head(num_classes)
        init_linear_and_norm(self.head)

    def example_inputs(self, batch: int = 1, generator: Optional[torch.Generator] = None):
        """Random ids of the model's full length (none of them ``pad_id``), as the one argument of
        ``model(...)`` (what registry-wide checks and ``vitmix.create_model`` call it with)."""
        low = 0 if self.pad_id is None else 1           # ids >= 1 are mapped past pad_id
        ids = torch.randint(low, self.vocab_size, (batch, self.seq_len), generator=generator)
        return (ids if self.pad_id is None else ids - (ids <= self.pad_id).long(),)

    def embed_ids(self, ids: Tensor) -> Tensor:
        """``(B, N)`` ids → ``(B, N, C)`` embedded tokens with positions; one-line errors for bad input."""
        if ids.dim() != 2:
            raise ValueError(f"expected ids (B, N), got a {ids.dim()}-D tensor of shape {tuple(ids.shape)}")
        n = ids.shape[1]
        if n > self.seq_len:
            raise ValueError(f"a sequence of {n} tokens is longer than the model's position table "
                             f"(seq_len={self.seq_len}); build the model with seq_len >= {n}")
        if ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"expected integer ids, got {ids.dtype}")
        # a value check reads the data: eager only (compiled and exported graphs stay free of it)
        eager = not (torch.jit.is_tracing() or torch.compiler.is_compiling())
        if eager and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"ids must lie in 0..{self.vocab_size - 1} (vocab_size={self.vocab_size}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        if self.embed == "tokens":
            x = self.tokens(ids)
        else:
            x = self.tokens((ids.to(self.pos_embed.dtype) / (self.vocab_size - 1)).unsqueeze(-1))
        return self.pos_drop(x + self.pos_embed[:, :n])

    def forward_features(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """``(B, N, C)`` normalised tokens after the blocks (with ``mask``, the mixers leave padding out)."""
        x = self.embed_ids(ids)
        if mask is None:
            return self.norm(self.blocks(x))
        for block in self.blocks:       # timm's Block.forward has no key-padding mask: its steps, with one
            x = x + block.drop_path1(block.ls1(block.attn(block.norm1(x), mask=mask)))
            x = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False, mask: Optional[Tensor] = None) -> Tensor:
        """Mean over the tokens (the real ones with ``mask``), then the head unless ``pre_logits``."""
        if mask is None:
            x = x.mean(dim=1)
        else:
            weights = mask.to(x.dtype).unsqueeze(-1)
            x = (x * weights).sum(dim=1) / weights.sum(dim=1)
        return x if pre_logits else self.head(x)

    def padding_mask(self, ids: Tensor):
        """``(ids, mask)`` for a model with ``pad_id``: ``mask = ids != pad_id`` and, in eager mode, both cut
        after the batch's last real token (the columns after it pad every row, and masked tokens change
        nothing), so a batch costs the length of its longest sample."""
        mask = ids != self.pad_id
        if torch.jit.is_tracing() or torch.compiler.is_compiling() or not mask.numel():
            return ids, mask
        ends = (mask * torch.arange(1, ids.shape[1] + 1, device=ids.device)).amax()  # past the last real token
        end = max(int(ends), 1)           # a row of padding only is left to the mixers' one-line error
        return ids[:, :end], mask[:, :end]

    def forward(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        if mask is None and self.pad_id is not None and ids.dim() == 2:
            ids, mask = self.padding_mask(ids)
        return self.forward_head(self.forward_features(ids, mask), mask=mask)


# timm's configs hold an input as (C, H, W): a sequence is read as 1 x 1 x N (ids, so no mean/std)
default_cfgs = generate_default_cfgs({
    "seq_lra_tiny.untrained": model_cfg(input_size=(1, 1, 2000), num_classes=10, mean=(0.0,), std=(1.0,),
                                        crop_pct=1.0, first_conv="tokens", classifier="head.2"),
})


def _sequence(fn):
    """Mark a model function as taking ``(B, N)`` ids (read by :func:`is_sequence_model`)."""
    fn.sequence = True
    return fn


def is_sequence_model(name: str) -> bool:
    """True for registered models whose input is a sequence of ids ``(B, N)`` (``seq_*``)."""
    import timm

    try:
        fn = timm.models.model_entrypoint(name.split(".")[0])
    except (KeyError, RuntimeError):       # unknown name: create_model reports it
        return False
    return bool(getattr(fn, "sequence", False))


@register_model
@_sequence
def seq_lra_tiny(pretrained: bool = False, **kwargs) -> SequenceClassifier:
    """Nyströmformer's LRA encoder size: 2 layers, width 64, 2 heads of 32, FFN 128, mean pooling; default
    2000 positions, 256 ids and 10 classes (pass a dataset's ``SequenceInfo.model_kwargs()``)."""
    return build_model_with_cfg(SequenceClassifier, "seq_lra_tiny", pretrained, kwargs_filter=("in_chans",),
                                **kwargs)


__all__ = ["EMBEDDINGS", "SequenceClassifier", "is_sequence_model", "seq_lra_tiny", "sequence_mixers"]
