"""``--compile``: torch.compile the model, and keep training eagerly if compiling fails."""
from __future__ import annotations

import warnings

import torch
from torch import nn


class CompiledWithFallback(nn.Module):
    """Runs ``torch.compile(module)``; if compiling raises at the first forward (a missing C++
    compiler, an unsupported op, a corrupt inductor cache), warns once and runs ``module`` eagerly
    from then on. Input errors (``ValueError``) are not compile failures and propagate.

    The state dict and parameters are the wrapped module's (``.module``), so checkpoints are the
    same with and without ``--compile``.
    """

    wraps_module = True     # checkpoint.unwrap looks through it

    def __init__(self, module: nn.Module, **compile_options) -> None:
        super().__init__()
        self.module = module
        object.__setattr__(self, "_compiled", torch.compile(module, **compile_options))  # not a submodule
        self.eager = False

    def forward(self, *args, **kwargs):
        if not self.eager:
            try:
                return self._compiled(*args, **kwargs)
            except (ValueError, FloatingPointError, KeyboardInterrupt):
                raise
            except Exception as err:  # whatever the compiler stack raises
                first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
                warnings.warn(f"vitmix: torch.compile failed ({type(err).__name__}: {first}); "
                              "training continues without compiling", RuntimeWarning, stacklevel=2)
                self.eager = True
        return self.module(*args, **kwargs)
