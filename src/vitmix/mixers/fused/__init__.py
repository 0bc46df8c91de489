"""LaplacianFormer's and SOFT's whole token mixing in one C call each way on CPU (private).

These are layers, not parameter-free ops: a call takes a layer's projection outputs and parameters
(landmark conv, LayerNorm, local filter) and returns its heads merged. At the widths where small ViTs
live the composed path's ~40 torch ops forward and ~60 backward per layer cost more in dispatch than in
arithmetic; the composed path stays the reference (the tests compare outputs and every gradient).

* :mod:`.laplacian`, :mod:`.soft`: ``supports(layer, x, grid)``, the one rule for when a layer's C path
  computes exactly what its composed path does, and ``mix(layer, x, grid)``, which runs it (the layers'
  ``_fused`` call these two);
* :mod:`.library`: the C library (``csrc/landmark_layers.c``, with the Nyström core and Newton–Schulz of
  ``vitmix/ops/csrc``) and its forward calls;
* :mod:`.autograd`: the forwards paired with the C backwards as autograd Functions (training).

Imports only torch and :mod:`vitmix.ops`.
"""
