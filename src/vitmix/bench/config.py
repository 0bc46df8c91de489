"""What a benchmark sweep is asked to do, and what it returns (no torch: the CLI's parser uses it)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

DEFAULT_TOKENS = (196, 784, 1600, 3136, 6400, 12544, 16384)
DEFAULT_IMAGE_SIZES = (224, 384, 512, 768, 1024, 1248)
DEFAULT_BASELINE_MODEL = "deit_tiny_patch16_224"
PASSES = ("fwd", "fwd+bwd")


@dataclass
class Target:
    """One thing to benchmark: a mixer spec (``name`` + options) or a model name."""

    label: str
    name: str
    options: Dict[str, object] = field(default_factory=dict)
    baseline: bool = False


@dataclass
class BenchConfig:
    """Settings of one sweep (the ``vitmix bench`` flags).

    Args:
        kind: ``"mixers"`` (one layer, sizes are token counts) or ``"models"`` (whole models,
            sizes are square image sides).
        names: mixer specs (``name`` or ``name:key=value:key=value``) or model names; ``["all"]``
            means every registered mixer.
        sizes: token counts or image sides; defaults to :data:`DEFAULT_TOKENS` /
            :data:`DEFAULT_IMAGE_SIZES`.
        batch, dim, heads: input batch; layer width and heads (mixers only).
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (half = ``torch.autocast``; parameters stay fp32).
        passes: any of ``"fwd"`` (under ``no_grad``) and ``"fwd+bwd"``.
        max_seconds: wall-clock budget of the whole sweep.
        max_memory_gb: points predicted to need more peak memory are skipped; default: half of
            the memory available when the sweep starts (CPU) or of the free GPU memory.
        min_run_time: seconds of timing per point (``blocked_autorange``).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` or ``"cuda:i"`` (``ValueError`` when
            no CUDA device is visible).
        baseline_model: the softmax model every model is compared with (models mode).
        measure_memory, measure_flops: turn the slower measurements off.
        threads: CPU threads for the sweep (default: all of ``torch.get_num_threads()``).
        compile: also time every point under ``torch.compile`` (``compile_backend``); the rows gain the
            compiled median, the first call's seconds (compilation) and the compiled / eager ratio.
        compile_backend: the ``torch.compile`` backend (default ``"inductor"``; ``"eager"`` or
            ``"aot_eager"`` only trace, which is what the tests use to stay fast).
        sequence: mixers on a 1-D sequence of ``size`` tokens (``sequence=True``: no token grid, no CLS), as
            a sequence model runs them; else on the most square grid of ``size`` tokens.
    """

    kind: str
    names: List[str]
    sizes: Optional[List[int]] = None
    batch: int = 1
    dim: int = 384
    heads: int = 6
    dtype: str = "fp32"
    passes: Tuple[str, ...] = PASSES
    max_seconds: float = 600.0
    max_memory_gb: Optional[float] = None
    min_run_time: float = 0.2
    device: str = "auto"
    baseline_model: str = DEFAULT_BASELINE_MODEL
    seed: int = 0
    measure_memory: bool = True
    measure_flops: bool = True
    threads: Optional[int] = None
    compile: bool = False
    compile_backend: str = "inductor"
    sequence: bool = False


@dataclass
class SweepResult:
    """Rows (one dict per point), the configuration, and whether the budget cut the sweep short."""

    config: BenchConfig
    rows: List[dict]
    environment: dict
    stopped_early: bool = False
    elapsed_s: float = 0.0
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        cfg = asdict(self.config)
        cfg["passes"] = list(cfg["passes"])
        if not self.config.compile:  # a sweep without --compile writes what it always wrote
            cfg.pop("compile")
            cfg.pop("compile_backend")
        if not self.config.sequence:
            cfg.pop("sequence")
        return {"environment": self.environment, "config": cfg, "stopped_early": self.stopped_early,
                "elapsed_s": round(self.elapsed_s, 2), "notes": self.notes, "rows": self.rows}
