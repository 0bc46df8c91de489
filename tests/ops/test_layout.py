"""The per-op package layout keeps every old import and every custom-op schema.

``vitmix.ops.kernels`` and ``vitmix.ops.sparse_diagonal`` (split into ``ops/kernel/`` and ``ops/diagonal/``)
still import, with a ``DeprecationWarning``, and hand out the same objects; the other old module paths
are the new packages themselves. The ``torch.ops.vitmix.*`` names and schemas are what saved ``.pt2``
programs refer to, so they are pinned here.
"""
import importlib
import sys

import pytest
import torch

import vitmix.ops

SCHEMAS = {
    "gaussian_kernel": 'vitmix::gaussian_kernel(Tensor x, Tensor y, str backend="auto") -> Tensor',
    "gaussian_kernel_backward": 'vitmix::gaussian_kernel_backward(Tensor g, Tensor x, Tensor y, Tensor out, '
                                'str backend="auto") -> (Tensor, Tensor)',
    "laplacian_kernel": 'vitmix::laplacian_kernel(Tensor x, Tensor y, float lam, str backend="auto") -> Tensor',
    "laplacian_kernel_backward": 'vitmix::laplacian_kernel_backward(Tensor g, Tensor x, Tensor y, Tensor out, '
                                 'float lam, str backend="auto") -> (Tensor, Tensor)',
    "newton_schulz_inverse": 'vitmix::newton_schulz_inverse(Tensor A, SymInt iters, float eps, bool? symmetric, '
                             'str alpha, str mode, str backend="auto") -> Tensor',
    "newton_schulz_inverse_backward": "vitmix::newton_schulz_inverse_backward(Tensor V, Tensor g) -> Tensor",
    "sparse_diagonal_attention": "vitmix::sparse_diagonal_attention(Tensor q, Tensor k, Tensor v, SymInt[] offsets, "
                                 "SymInt[] offset_counts, SymInt num_prefix_tokens, float scale, str backend) "
                                 "-> (Tensor, Tensor, Tensor)",
    "sparse_diagonal_attention_backward": "vitmix::sparse_diagonal_attention_backward(Tensor dout, Tensor q, "
                                          "Tensor k, Tensor v, Tensor out, Tensor lse, Tensor lse_pre, "
                                          "SymInt[] offsets, SymInt[] offset_counts, SymInt num_prefix_tokens, "
                                          "float scale, str backend) -> (Tensor, Tensor, Tensor)",
    "dynamic_depthwise_conv2d": "vitmix::dynamic_depthwise_conv2d(Tensor x, Tensor kernels, Tensor? bias) -> Tensor",
    "dynamic_depthwise_conv2d_backward": "vitmix::dynamic_depthwise_conv2d_backward(Tensor g, Tensor x, "
                                         "Tensor kernels, Tensor? bias) -> (Tensor, Tensor, Tensor)",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_custom_op_names_and_schemas_are_unchanged(name):
    assert str(getattr(torch.ops.vitmix, name).default._schema) == SCHEMAS[name]


@pytest.mark.parametrize("old, new", [("kernels", "kernel"), ("sparse_diagonal", "diagonal")])
def test_deprecated_module_paths_warn_and_re_export(monkeypatch, old, new):
    monkeypatch.delitem(sys.modules, f"vitmix.ops.{old}", raising=False)    # a fresh import warns again
    with pytest.warns(DeprecationWarning, match=f"vitmix.ops.{old} is deprecated.*vitmix.ops.{new}"):
        alias = importlib.import_module(f"vitmix.ops.{old}")
    package = importlib.import_module(f"vitmix.ops.{new}")
    assert alias.__all__ == package.__all__
    for name in package.__all__:
        assert getattr(alias, name) is getattr(package, name)
    private = "_gaussian_op" if new == "kernel" else "_diagonal_op"         # code that reached inside still runs
    assert getattr(alias, private) is getattr(package, private)


@pytest.mark.parametrize("path", ["newton", "nystrom", "dynamic", "index_sparse", "decompositions", "fibonacci"])
def test_other_module_paths_import_without_a_warning(recwarn, path):
    module = importlib.import_module(f"vitmix.ops.{path}")
    assert module.__all__ and all(hasattr(module, name) for name in module.__all__)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning) and "vitmix" in str(w.message)]


def test_every_public_name_of_vitmix_ops_resolves():
    assert [name for name in vitmix.ops.__all__ if not hasattr(vitmix.ops, name)] == []
