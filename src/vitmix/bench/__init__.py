"""Speed, memory and FLOP measurement of vitmix mixers and models (``vitmix bench``).

The pieces can be used on their own:

- :mod:`vitmix.bench.timing` — median latency (``torch.utils.benchmark`` with all threads on CPU,
  CUDA events on GPU);
- :mod:`vitmix.bench.memory` — peak memory (CUDA ``max_memory_allocated`` delta, or
  ``MemTracker`` on CPU);
- :mod:`vitmix.bench.flops` — FLOPs (= 2 × MACs) from ``FlopCounterMode`` with formulas for the ops
  it misses, plus each mixer class's own ``analytic_flops`` formula;
- :mod:`vitmix.bench.sweep` — the sweep over mixers × token counts or models × image sizes (the loop;
  :mod:`~vitmix.bench.targets` checks what it is asked, :mod:`~vitmix.bench.points` builds and
  measures one point, :mod:`~vitmix.bench.paired` times two calls in alternating rounds);
- :mod:`vitmix.bench.report` — CSV / JSON / markdown tables and log–log plots.
- :mod:`vitmix.bench.suite` — a suite (``vitmix bench --spec FILE``): fixed cases whose entries are timed in
  alternating rounds and compared by per-round ratios (:mod:`~vitmix.bench.suite_targets` what each case
  kind times, :mod:`~vitmix.bench.suite_report` its files).

>>> from vitmix.bench import BenchConfig, run_sweep          # doctest: +SKIP
>>> result = run_sweep(BenchConfig(kind="mixers", names=["soft"], sizes=[196, 784]))
"""
from .._lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, {
    "BenchConfig": ".config:BenchConfig",
    "SweepResult": ".config:SweepResult",
    "run_sweep": ".sweep:run_sweep",
})

__all__ = ["BenchConfig", "SweepResult", "run_sweep"]
