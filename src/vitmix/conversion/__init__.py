"""Start from a trained softmax ViT: swap its attention for a vitmix mixer and transfer the attention.

>>> student = vitmix.convert(teacher, "laplacian")                          # doctest: +SKIP
>>> losses = transfer_attention(student, teacher, loader, epochs=1)         # doctest: +SKIP

The package is ``vitmix.conversion`` (not ``vitmix.convert``) so that ``vitmix.convert`` stays the
function whatever was imported first. See ``docs/convert.md``.
"""
from ..models.swap import convert, convert_layer, find_attention_layers, load_timm_checkpoint
from .transfer import layer_mse, paired_layers, transfer_attention

__all__ = ["convert", "convert_layer", "find_attention_layers", "layer_mse", "load_timm_checkpoint",
           "paired_layers", "transfer_attention"]
