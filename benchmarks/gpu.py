"""The GPU table of issue 12 in one call: ops, layers and models on one CUDA device, and the goals.

Run (needs a CUDA device; ``benchmarks/gpu_check.sh`` runs it as one part of the GPU check)::

    python benchmarks/gpu.py              # writes benchmarks/results/gpu/<gpu-name>/
    python benchmarks/gpu.py --quick      # N = 1024, 4096 and 224² only (runs/gpu-partial/<gpu-name>/)
    python benchmarks/gpu.py --dry-run    # lists every measurement, needs no GPU

Batch 1, N = 1024, 4096, 16384, 65536 tokens (grid as square as N allows), bf16 (``--dtypes bf16 fp32``
adds fp32), forward (under ``no_grad``) and forward + backward, for

- **op** (q, k, v → output, no projections), 6 heads × 64 (dim 384) and, for SDPA and
  ``fibottention``, 12 heads × 64 (dim 768): ``softmax`` = ``F.scaled_dot_product_attention`` with
  SDPA's own choice (flash on Hopper and Ampere in bf16; the backend that ran is recorded per row),
  ``softmax_cudnn`` = the same call held to cuDNN attention (faster than flash on Hopper);
  ``laplacian`` = ``nystrom_attention(kernel="laplacian", injective normalisation)`` and ``soft`` = the
  Gaussian one with tied q = k, both with m = 49 landmarks pooled to 7×7 inside the op and the
  Newton–Schulz iterations, start and ε of the ``laplacian`` / ``soft`` mixer's defaults (read from the
  mixer classes, so the op runs what the layer runs); ``fibottention`` = ``sparse_diagonal_attention``
  with the layer-0 Fibonacci offsets;
- **kernel**: the kernel matrix alone, ``laplacian_kernel(q, k̃)`` and ``gaussian_kernel(q, k̃)``
  (m = 49), forward: the share of the GPU's FP32 issue rate it reaches (it is compute-bound, see
  :data:`FLOOR_NOTE`), and GB/s against a device-to-device copy for reference;
- **layer**: the whole mixer as ``vitmix bench`` builds it (qkv and output projections; landmark
  mixers with ``num_landmarks=49``), input in fp32 and bf16 under ``torch.autocast``, 6 heads × 64;
- **model**: training images/s (forward + backward, bf16 autocast, batch ``--model-batch``) of
  ``laplacianformer_tiny`` against timm's ``pvt_v2_b1``, and ``deit_tiny_patch16_224`` and
  ``weightformer_tiny``, at 224² and 448².

Times are CUDA-event medians after a synchronised warm-up (:func:`vitmix.bench.timing.time_call`),
peak memory is ``max_memory_allocated`` minus what was allocated before the call (inputs and
parameters excluded, :func:`vitmix.bench.memory.peak_memory`). A call slower than ``--call-cap-s`` is
timed once and larger N of its series are skipped; an out-of-memory entry is recorded as ``OOM`` (and
larger N skipped); once ``--budget-s`` is spent the remaining entries are ``not run``. The goals'
rows run first within each dtype.

``--device cpu`` runs the same code on CPU tensors (tiny ``--sizes``): a check of the plumbing for
``gpu_check.sh --dry-run``, not a benchmark.
"""
from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitmix._util import markdown_table, write_csv
from vitmix.bench.config import BenchConfig
from vitmix.bench.env import environment, load_average
from vitmix.bench.flops import analytic_flops, count_flops
from vitmix.bench.memory import memory_method, peak_memory
from vitmix.bench.report import env_lines, fit_slope
from vitmix.bench.sdpa import sdpa_backend
from vitmix.bench.sweep import DTYPES, build_point, is_oom, point_call, token_grid
from vitmix.runs import parse_device
from vitmix.bench.timing import time_call
from vitmix.mixers.flops import nystrom_flops

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "gpu"
SIZES = (1024, 4096, 16384, 65536)
QUICK_SIZES = (1024, 4096)
IMAGE_SIZES = (224, 448)
QUICK_IMAGE_SIZES = (224,)
RUN_DTYPES = ("bf16",)
PASSES = ("fwd", "fwd+bwd")
LANDMARK_SIDE = 7
#: (dim, heads) → the ops measured at that width (Fibottention's own setting is ViT-B's)
OP_WIDTHS = {(384, 6): ("softmax", "softmax_cudnn", "laplacian", "soft", "fibottention"),
             (768, 12): ("softmax", "softmax_cudnn", "fibottention")}
#: (dim, heads) → the mixers measured as whole layers
LAYER_WIDTHS = {(384, 6): ("softmax", "laplacian", "soft", "fibottention")}
KERNELS = ("laplacian_kernel", "gaussian_kernel")
#: models, trained (forward + backward) only: the goal compares laplacianformer_tiny with pvt_v2_b1
MODELS = ("pvt_v2_b1", "laplacianformer_tiny", "deit_tiny_patch16_224", "weightformer_tiny")
MODEL_PASSES = ("fwd+bwd",)
BASELINE = {"op": "softmax", "layer": "softmax", "model": "pvt_v2_b1"}
#: the forward + backward FLOPs are taken as 3 × forward: the backward of each product is two products
BACKWARD_FACTOR = 3
#: fitted log–log slope of peak memory against N up to which growth counts as linear
LINEAR_SLOPE = 1.15
#: FP32 operations per (token, landmark, channel, head) of the L1 distances: the forward's kernel matrix
#: and its use (2 passes × subtract and add-with-|·|), the backward's 4 passes × about 4 (issue 43)
L1_OPS_FWD, L1_OPS_FWD_BWD = 4, 20
#: FP32 operations per (token, landmark, channel) of one kernel matrix: a subtraction, then an add of its
#: |·| (L1) or a fused multiply-add of its square (Gaussian)
KERNEL_OPS = 2
#: SDPA's FLOPs per N²·d·head: forward 4 (two products), forward + backward 14 (the flash backward
#: recomputes the scores: 5 products)
SDPA_FLOPS_FWD, SDPA_FLOPS_FWD_BWD = 4, 14
#: published bf16 rates of SDPA on an H100 at head dim 64, 16k tokens (FlashAttention-3 paper,
#: arXiv 2407.08608): TFLOP/s (forward, forward + backward) of FA2 (SDPA's flash) and cuDNN
SDPA_ANCHOR_TFLOPS = {"softmax": (324.0, 300.0), "softmax_cudnn": (413.0, 425.0)}
#: why the kernel matrix has an issue-rate goal and no bandwidth goal (written into results.md)
FLOOR_NOTE = ("The Laplacian kernel matrix does about 19 FP32 operations per byte it moves (2 per "
              "token·landmark·channel against bf16 q and a float32 output), above an H100's balance of about "
              "11 (33.5 TFLOP/s of FP32 issue over ~3 TB/s): it is bound by CUDA-core issue, not memory "
              "bandwidth, so its goal is a share of the FP32 issue rate and GB/s is reported only for "
              "reference. The floors below are arithmetic, not measurements: the L1 distances at the GPU's "
              "FP32 issue rate, SDPA at its published H100 rates.")


def mixer_op_settings(name: str) -> dict:
    """The Newton–Schulz iterations, ε and start of mixer ``name``'s defaults (λ and the normaliser's ε too
    where it has them): read from the class signature, or its default preset where that defers to one."""
    from vitmix.mixers import get_mixer_class
    from vitmix.mixers.presets import DEFAULT_PRESET, FROM_PRESET

    cls = get_mixer_class(name)
    params = inspect.signature(cls.__init__).parameters
    preset = getattr(cls, "presets", {}).get(DEFAULT_PRESET, {})

    def default(key):
        value = params[key].default
        return preset[key] if value is FROM_PRESET else value

    settings = dict(iters=default("newton_iters"), eps=default("newton_eps"), alpha=default("newton_alpha"))
    settings.update({key: default(key) for key in ("lam", "norm_eps") if key in params})
    return settings


@dataclass(frozen=True)
class Entry:
    """One measurement: ``section`` op / kernel / layer / model, ``size`` = N tokens or the image side."""

    section: str
    name: str
    size: int
    dim: int
    heads: int
    dtype: str
    pass_name: str
    batch: int = 1

    def series(self) -> tuple:
        """Everything but the size: the entries whose times form one line of the plot."""
        return (self.section, self.name, self.dim, self.heads, self.dtype, self.pass_name, self.batch)

    def label(self) -> str:
        width = f"{self.heads}×{self.dim // self.heads}" if self.section != "model" else f"batch {self.batch}"
        size = f"N={self.size}" if self.section != "model" else f"{self.size}²"
        return f"{self.section:6s} {self.name:22s} {width:8s} {self.dtype:4s} {self.pass_name:7s} {size}"


# ------------------------------------------------------------------------------------------------ plan
def plan(sizes: Sequence[int], image_sizes: Sequence[int], dtypes: Sequence[str], model_batch: int) -> List[Entry]:
    """Every measurement in run order: by dtype (bf16 first), then what the goals read (op, kernel, model),
    then the layers; each section by size."""
    entries = []
    for dtype in dtypes:
        for section in ("op", "kernel"):
            for n in sizes:
                entries += _width_entries(section, n, dtype)
        for size in image_sizes:
            entries += [Entry("model", m, size, 0, 0, dtype, p, model_batch) for m in MODELS for p in MODEL_PASSES]
        for n in sizes:
            entries += _width_entries("layer", n, dtype)
    return entries


def _width_entries(section: str, n: int, dtype: str) -> List[Entry]:
    if section == "kernel":
        return [Entry("kernel", k, n, 384, 6, dtype, "fwd") for k in KERNELS]
    widths = OP_WIDTHS if section == "op" else LAYER_WIDTHS
    return [Entry(section, name, n, dim, heads, dtype, p)
            for (dim, heads), names in widths.items() for name in names for p in PASSES]


def _per_size() -> Tuple[int, int]:
    """Op and layer entries per size and dtype."""
    return tuple(sum(len(names) for names in w.values()) * len(PASSES) for w in (OP_WIDTHS, LAYER_WIDTHS))


def expected_count(n_sizes: int, n_images: int, n_dtypes: int) -> int:
    """How many entries :func:`plan` lists (the formula the dry run prints beside its list)."""
    ops, layers = _per_size()
    return n_dtypes * (n_sizes * (ops + len(KERNELS) + layers) + n_images * len(MODELS) * len(MODEL_PASSES))


# ------------------------------------------------------------------------------------------ the calls
@dataclass
class Built:
    """The call to time and what the row needs besides the time."""

    fn: Callable[[], object]
    flops: Optional[float]  # of one call; None when unknown
    items: int              # tokens (ops, kernels, layers) or images (models) per call
    unit: str
    io_bytes: Optional[int] = None  # kernel matrices: bytes read and written by one call
    fp32_ops: Optional[float] = None  # kernel matrices: FP32 operations of one call (KERNEL_OPS per element)
    track: tuple = ()


def _qkv(e: Entry, device, grad: bool):
    g = torch.Generator(device=device).manual_seed(0)
    head_dim = e.dim // e.heads
    shape = (e.batch, e.heads, e.size, head_dim)
    # q and k at the scale a trained layer feeds the kernels (|q - k|_1 / 4 of order 1..3)
    scales = (head_dim ** -0.5, head_dim ** -0.5, 1.0)
    return [(torch.randn(shape, generator=g, device=device) * s).to(DTYPES[e.dtype]).requires_grad_(grad)
            for s in scales]


class Unavailable(Exception):
    """An entry this device cannot run (e.g. cuDNN attention on a CPU): its row is ``skipped``, not an error."""


def _sdpa(e: Entry, device) -> Callable:
    if e.name == "softmax":
        return F.scaled_dot_product_attention
    if torch.device(device).type != "cuda":
        raise Unavailable("cuDNN attention needs a CUDA device")

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)
    return cudnn


def _op_function(e: Entry, device) -> Tuple[Callable, float]:
    """The op ``(q, k, v) -> out`` of ``e`` and its forward FLOPs."""
    from vitmix.ops import avg_pool_landmarks, nystrom_attention, sparse_diagonal_attention
    from vitmix.ops.fibonacci import fibonacci_offsets, interaction_counts

    n, d, bh, m = e.size, e.dim // e.heads, e.batch * e.heads, LANDMARK_SIDE ** 2
    hw, side = token_grid(n), (LANDMARK_SIDE, LANDMARK_SIDE)
    pool = 2 * bh * m * n * d  # pooling one of q, k as a (m, N) matrix product
    if e.name in SDPA_ANCHOR_TFLOPS:
        return _sdpa(e, device), float(SDPA_FLOPS_FWD * bh * n * n * d)
    if e.name == "laplacian":
        s = mixer_op_settings("laplacian")

        def laplacian(q, k, v):
            return nystrom_attention(q, k, v, avg_pool_landmarks(q, hw, side), avg_pool_landmarks(k, hw, side),
                                     kernel="laplacian", lam=s["lam"], iters=s["iters"], eps=s["eps"],
                                     alpha=s["alpha"], normalization="injective", norm_eps=s["norm_eps"])
        return laplacian, bh * nystrom_flops(n, m, d, s["iters"], normalization="injective") + 2.0 * pool
    if e.name == "soft":
        s = mixer_op_settings("soft")

        def soft(q, k, v):
            lm = avg_pool_landmarks(q, hw, side)
            return nystrom_attention(q, q, v, lm, lm, kernel="gaussian", iters=s["iters"], eps=s["eps"],
                                     alpha=s["alpha"])
        return soft, bh * nystrom_flops(n, m, d, s["iters"], tied=True) + float(pool)
    if e.name == "fibottention":
        offsets = fibonacci_offsets(n, e.heads)
        return ((lambda q, k, v: sparse_diagonal_attention(q, k, v, offsets)),
                4.0 * e.batch * d * sum(interaction_counts(offsets, n)))
    raise ValueError(f"unknown op {e.name!r}")


def _pass_call(op: Callable, tensors: list, pass_name: str) -> Callable[[], object]:
    if pass_name == "fwd":
        def fwd():
            with torch.no_grad():
                return op(*tensors)
        return fwd

    def fwd_bwd():
        op(*tensors).float().sum().backward()
        for t in tensors:  # nothing left behind between calls (the memory baseline is the inputs)
            t.grad = None
    return fwd_bwd


def build_op(e: Entry, device) -> Built:
    op, flops = _op_function(e, device)
    tensors = _qkv(e, device, e.pass_name == "fwd+bwd")
    factor = 1 if e.pass_name == "fwd" else BACKWARD_FACTOR
    return Built(_pass_call(op, tensors, e.pass_name), flops * factor, e.batch * e.size, "tokens/s",
                 track=tuple(tensors))


def build_kernel(e: Entry, device) -> Built:
    """The kernel matrix ``k(q, k̃)`` between N tokens and m pooled landmarks, forward only."""
    from vitmix.ops import avg_pool_landmarks, gaussian_kernel, laplacian_kernel

    q, k, _ = _qkv(e, device, False)
    landmarks = avg_pool_landmarks(k, token_grid(e.size), (LANDMARK_SIDE, LANDMARK_SIDE)).contiguous()
    lam = mixer_op_settings("laplacian")["lam"]
    kernel = (lambda: laplacian_kernel(q, landmarks, lam)) if e.name == "laplacian_kernel" else \
        (lambda: gaussian_kernel(q, landmarks))
    with torch.no_grad():
        out = kernel()
    io_bytes = _nbytes(q) + _nbytes(landmarks) + _nbytes(out)
    elements = float(q.shape[0] * q.shape[1] * q.shape[2] * landmarks.shape[2] * q.shape[3])
    del out
    return Built(_pass_call(lambda: kernel(), [], "fwd"), 2.0 * elements, e.batch * e.size, "tokens/s", io_bytes,
                 KERNEL_OPS * elements, (q, landmarks))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def build_layer_or_model(e: Entry, device) -> Built:
    """A mixer layer or a whole model, built and called exactly as ``vitmix bench`` does."""
    kind = "mixers" if e.section == "layer" else "models"
    config = BenchConfig(kind=kind, names=[e.name], batch=e.batch, dim=e.dim or 384, heads=e.heads or 6)
    point = build_point(config, e.name, e.size, device)
    fn = point_call(point, e.pass_name, device, e.dtype)
    if e.section == "layer":
        fwd = analytic_flops(point.module, e.batch, e.size)
        flops = None if fwd is None else fwd * (1 if e.pass_name == "fwd" else BACKWARD_FACTOR)
        return Built(fn, flops, e.batch * e.size, "tokens/s", track=(point.module, point.inputs))
    flops = count_flops(fn).total  # counted (matmuls, convolutions, attention), backward included
    return Built(fn, float(flops), e.batch, "images/s", track=(point.module, point.inputs))


BUILDERS = {"op": build_op, "kernel": build_kernel, "layer": build_layer_or_model, "model": build_layer_or_model}


# ------------------------------------------------------------------------------------------ measuring
def measure_entry(e: Entry, device, call_cap_s: float, min_run_time: float) -> dict:
    """One row: time, peak memory, TFLOP/s (and GB/s for kernels) of entry ``e``; raises on OOM."""
    torch.manual_seed(0)
    built = BUILDERS[e.section](e, device)
    row = _row(e)
    if e.name in SDPA_ANCHOR_TFLOPS:
        row["sdpa_backend"] = sdpa_backend(built.fn)
    timing = time_call(built.fn, device, min_run_time=min_run_time, min_samples=3, max_seconds=call_cap_s,
                       long_call_s=call_cap_s)
    mem = peak_memory(built.fn, device, built.track)
    t = timing.median_s
    row.update(status="ok", median_ms=t * 1e3, iqr_ms=timing.iqr_s * 1e3, samples=len(timing.samples),
               timing_method=timing.method, capped=len(timing.samples) == 1 and timing.median_s >= call_cap_s,
               peak_mib=None if mem.peak_bytes is None else mem.peak_bytes / 2 ** 20,
               throughput=built.items / t, throughput_unit=built.unit,
               gflop=None if built.flops is None else built.flops / 1e9,
               tflops=None if built.flops is None else built.flops / t / 1e12)
    if built.io_bytes is not None:
        row.update(io_mib=built.io_bytes / 2 ** 20, gbs=built.io_bytes / t / 1e9, fp32_ops=built.fp32_ops)
    return row


def _row(e: Entry) -> dict:
    return {**asdict(e), "status": "", "note": ""}


def measure_bandwidth(device, nbytes: int = 2 ** 30, min_run_time: float = 0.2) -> float:
    """Device memory bandwidth in GB/s from a device-to-device copy of ``nbytes`` (read + write)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, min_run_time=min_run_time, min_samples=5).median_s
    return 2 * nbytes / t / 1e9


@dataclass
class Budget:
    """The wall-clock budget of the run and the series cut short (OOM or too slow) so far."""

    seconds: float
    call_cap_s: float
    min_run_time: float
    start: float = field(default_factory=time.perf_counter)
    #: series → why its larger sizes are skipped
    blocked: Dict[tuple, str] = field(default_factory=dict)

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)


def run_entry(e: Entry, device, budget: Budget) -> dict:
    """Measure ``e`` unless the budget is spent or a smaller N of its series was cut; never raises for
    OOM or an error of the measured code (the row says what happened)."""
    if budget.left() <= 0:
        return dict(_row(e), status="not run", note="budget spent")
    if e.series() in budget.blocked:
        return dict(_row(e), status="skipped", note=budget.blocked[e.series()])
    try:
        row = measure_entry(e, device, budget.call_cap_s, budget.min_run_time)
    except Unavailable as why:
        return dict(_row(e), status="skipped", note=str(why))
    except Exception as err:  # noqa: BLE001  (one entry's failure is a row, the table goes on)
        if not is_oom(err):
            first = (str(err).splitlines() or [""])[0][:200]
            return dict(_row(e), status="error", note=f"{type(err).__name__}: {first}")
        budget.blocked[e.series()] = f"OOM at a smaller size ({e.size})"
        return dict(_row(e), status="OOM", note="out of memory")
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    if row["capped"]:
        budget.blocked[e.series()] = f"size {e.size} took {row['median_ms'] / 1e3:.1f} s > the call cap"
        row["note"] = "timed once (slower than the call cap)"
    return row


def add_ratios(rows: List[dict]) -> None:
    """Speed-up and memory ratio of every op / layer / model row against its baseline at the same point."""
    def key(r):
        return (r["section"], r["dim"], r["heads"], r["size"], r["dtype"], r["pass_name"], r["batch"])

    base = {key(r): r for r in rows if r["status"] == "ok" and BASELINE.get(r["section"]) == r["name"]}
    for r in rows:
        b = base.get(key(r))
        ok = r["status"] == "ok" and b is not None
        r["speedup_vs_baseline"] = b["median_ms"] / r["median_ms"] if ok else None
        r["memory_vs_baseline"] = (r["peak_mib"] / b["peak_mib"] if ok and r.get("peak_mib") and b.get("peak_mib")
                                   else None)


# ------------------------------------------------------------------------------------------------ goals
def _find(rows, section, name, size, dim, heads, dtype="bf16", pass_name="fwd+bwd") -> Optional[dict]:
    for r in rows:
        if (r["section"], r["name"], r["size"], r["dim"], r["heads"], r["dtype"], r["pass_name"]) == \
                (section, name, size, dim, heads, dtype, pass_name) and r["status"] == "ok":
            return r
    return None


def _goal(text: str, measured: Optional[float], target: float, higher: bool, detail: str) -> dict:
    if measured is None:
        status = "NOT MEASURED"
    else:
        status = "PASS" if (measured >= target if higher else measured <= target) else "FAIL"
    return {"goal": text, "measured": measured, "target": target, "higher_is_better": higher, "status": status,
            "detail": detail}


def _speedup_goal(rows, name: str, n: int, dim: int, heads: int, target: float, base: str = "softmax",
                  pass_name: str = "fwd+bwd") -> dict:
    b = _find(rows, "op", base, n, dim, heads, pass_name=pass_name)
    r = _find(rows, "op", name, n, dim, heads, pass_name=pass_name)
    value = b["median_ms"] / r["median_ms"] if b and r else None
    detail = (f"SDPA ({b.get('sdpa_backend')}) {b['median_ms']:.3g} ms / {name} {r['median_ms']:.3g} ms"
              if b and r else "a row is missing")
    against = "SDPA" if base == "softmax" else "cuDNN SDPA"
    which = "forward only" if pass_name == "fwd" else "forward + backward"
    return _goal(f"{name} op ≥ {target:g}× {against} at N={n}, {which} ({heads}×{dim // heads}, bf16, batch 1)",
                 value, target, True, detail)


#: FP32 lanes per SM where it is not 128 (compute capability 7.x and 8.0: V100, T4, A100)
FP32_LANES = {"7.0": 64, "7.2": 64, "7.5": 64, "8.0": 64}


def fp32_issue_rate(env: dict) -> Optional[float]:
    """FP32 operations per second the GPU can issue (SMs × FP32 lanes × boost clock), ``None`` when the
    environment lacks the SM count or clock (an FMA counts as one operation: one issue slot)."""
    sms, mhz, cap = env.get("gpu_sm_count"), env.get("gpu_clock_mhz"), env.get("gpu_capability")
    if not sms or not mhz:
        return None
    return sms * FP32_LANES.get(cap, 128) * mhz * 1e6


def _issue_goal(rows, issue_rate: Optional[float]) -> dict:
    kernel = [r for r in rows if r["section"] == "kernel" and r["name"] == "laplacian_kernel"
              and r["dtype"] == "bf16" and r["status"] == "ok" and r.get("fp32_ops")]
    text = "Laplacian kernel-matrix kernel at ≥ 50% of the FP32 issue rate (bf16, largest N measured)"
    if not kernel or not issue_rate:
        return _goal(text, None, 0.5, True, "no kernel row or no FP32 issue rate (SM count, clock)")
    r = max(kernel, key=lambda x: x["size"])
    achieved = r["fp32_ops"] / (r["median_ms"] / 1e3)
    return _goal(text, achieved / issue_rate, 0.5, True,
                 f"N={r['size']}: {achieved / 1e12:.3g} of {issue_rate / 1e12:.3g} T FP32 op/s "
                 f"({r['gbs']:.0f} GB/s)")


def _model_goal(rows, size: int) -> dict:
    def find(name):
        return _find(rows, "model", name, size, 0, 0)
    ours, base = find("laplacianformer_tiny"), find("pvt_v2_b1")
    value = base["median_ms"] / ours["median_ms"] if ours and base else None
    detail = (f"{ours['throughput']:,.0f} vs {base['throughput']:,.0f} images/s (batch {ours['batch']})"
              if ours and base else "a row is missing")
    return _goal(f"laplacianformer_tiny trains faster than pvt_v2_b1 at {size}² (bf16 autocast, same batch; "
                 "speed ratio)", value, 1.0, True, detail)


def _memory_goal(rows, name: str, dim: int, heads: int) -> dict:
    pts = sorted((r["size"], r["peak_mib"]) for r in rows if r["section"] == "op" and r["name"] == name
                 and (r["dim"], r["heads"], r["dtype"], r["pass_name"], r["status"]) ==
                 (dim, heads, "bf16", "fwd+bwd", "ok") and r.get("peak_mib"))
    slope = fit_slope([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 3 else None
    detail = (f"log–log slope of peak MiB over N = {pts[0][0]}…{pts[-1][0]} ({len(pts)} sizes)" if pts
              else "no rows")
    return _goal(f"{name} op peak memory linear in N (fitted slope ≤ {LINEAR_SLOPE}; bf16 fwd+bwd, "
                 f"{heads}×{dim // heads})", slope, LINEAR_SLOPE, False, detail)


def evaluate_goals(rows: List[dict], issue_rate: Optional[float]) -> List[dict]:
    """The goals of issue 43 item 4, each PASS / FAIL / NOT MEASURED with the numbers behind it."""
    return [_speedup_goal(rows, "laplacian", 16384, 384, 6, 8.0),
            _speedup_goal(rows, "laplacian", 65536, 384, 6, 35.0),
            _speedup_goal(rows, "laplacian", 16384, 384, 6, 6.0, base="softmax_cudnn"),
            _speedup_goal(rows, "laplacian", 65536, 384, 6, 25.0, base="softmax_cudnn"),
            _speedup_goal(rows, "laplacian", 16384, 384, 6, 6.0, pass_name="fwd"),
            _speedup_goal(rows, "laplacian", 65536, 384, 6, 35.0, pass_name="fwd"),
            _issue_goal(rows, issue_rate),
            _memory_goal(rows, "laplacian", 384, 6),
            _speedup_goal(rows, "fibottention", 16384, 768, 12, 3.0),
            _memory_goal(rows, "fibottention", 768, 12),
            _model_goal(rows, 224),
            _model_goal(rows, 448)]


def floors(rows: List[dict], issue_rate: Optional[float], sizes: Sequence[int] = (16384, 65536)) -> List[dict]:
    """The arithmetic floors of the goals' ops (6 heads × 64, m = 49, batch 1) beside the measured times: the
    Laplacian op's L1 distances at the FP32 issue rate, SDPA at its published H100 rates."""
    d, heads, m = 64, 6, LANDMARK_SIDE ** 2
    out = []
    for n in sizes:
        for pass_name, l1_ops, sdpa_flops, k in (("fwd+bwd", L1_OPS_FWD_BWD, SDPA_FLOPS_FWD_BWD, 1),
                                                  ("fwd", L1_OPS_FWD, SDPA_FLOPS_FWD, 0)):
            measured = _find(rows, "op", "laplacian", n, 384, heads, pass_name=pass_name)
            out.append(dict(op="laplacian", size=n, pass_name=pass_name,
                            floor_ms=l1_ops * n * m * d * heads / issue_rate * 1e3 if issue_rate else None,
                            basis=f"{l1_ops} FP32 ops per token·landmark·channel at the FP32 issue rate",
                            measured_ms=measured and measured["median_ms"]))
            for name, rates in SDPA_ANCHOR_TFLOPS.items():
                measured = _find(rows, "op", name, n, 384, heads, pass_name=pass_name)
                out.append(dict(op=name, size=n, pass_name=pass_name,
                                floor_ms=sdpa_flops * n * n * d * heads / (rates[k] * 1e12) * 1e3,
                                basis=f"{sdpa_flops}·N²·d FLOP per head at {rates[k]:g} TFLOP/s (H100, published)",
                                measured_ms=measured and measured["median_ms"]))
    return out


# ------------------------------------------------------------------------------------------------ output
COLUMNS = ["section", "name", "dim", "heads", "size", "batch", "dtype", "pass_name", "status", "median_ms",
           "iqr_ms", "samples", "throughput", "throughput_unit", "peak_mib", "gflop", "tflops", "io_mib", "gbs",
           "fp32_ops",
           "speedup_vs_baseline", "memory_vs_baseline", "sdpa_backend", "timing_method", "note"]


def _fmt(value, digits: int = 3) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return str(value)


def _cells(r: dict, bandwidth_gbs: Optional[float], issue_rate: Optional[float]) -> list:
    rate = f"{_fmt(r.get('tflops'))} TFLOP/s" if r.get("tflops") else ""
    if r.get("gbs"):
        share = f" ({r['gbs'] / bandwidth_gbs:.0%} of copy)" if bandwidth_gbs else ""
        rate = f"{_fmt(r['gbs'])} GB/s{share}; " + rate
    if r.get("fp32_ops") and r.get("median_ms") and issue_rate:
        rate = f"{r['fp32_ops'] / (r['median_ms'] / 1e3) / issue_rate:.0%} of FP32 issue; " + rate
    ratio = f"{r['speedup_vs_baseline']:.2f}×" if r.get("speedup_vs_baseline") else ""
    mem = f"{r['memory_vs_baseline']:.2f}×" if r.get("memory_vs_baseline") else ""
    width = f"{r['heads']}×{r['dim'] // r['heads']}" if r["heads"] else f"batch {r['batch']}"
    status = "" if r["status"] == "ok" else r["status"]
    note = "; ".join(x for x in (status, r.get("sdpa_backend") and f"SDPA: {r['sdpa_backend']}", r.get("note")) if x)
    throughput = f"{_fmt(r['throughput'])} {r.get('throughput_unit', '')}".strip() if r.get("throughput") else ""
    return [r["size"], r["name"], width, r["dtype"], r["pass_name"], _fmt(r.get("median_ms")), rate,
            throughput, _fmt(r.get("peak_mib")), ratio, mem, note.replace("|", "/")]


TITLES = {"op": "Ops (q, k, v → output)", "kernel": "Kernel matrix k(q, k̃), m = 49",
          "layer": "Layers (whole mixer, as `vitmix bench` builds it)", "model": "Models (images/s)"}


def report(result: dict) -> str:
    """The markdown of ``results.md``: machine, bandwidth, goals, floors, then one table per section."""
    bw, issue = result["bandwidth_gbs"], result.get("fp32_issue_rate")
    parts = ["# GPU benchmark (issues 12 and 43)", "", f"Command: `{result['command']}`", ""]
    parts += env_lines(result["environment"], result["elapsed_s"]) + [
        f"- device-to-device copy bandwidth: {_fmt(bw)} GB/s (read + write); fp32 matmul precision "
        f"`{result['environment'].get('float32_matmul_precision')}`",
        "",
        "Batch 1 for ops, kernels and layers. Speed-up and memory ratio are against `softmax` (SDPA) at the same "
        "point (models: `deit_tiny_patch16_224`). FLOPs: analytic (1 multiply–accumulate = 2 FLOPs), forward + "
        f"backward taken as {BACKWARD_FACTOR}× forward; models counted by `FlopCounterMode`.", "",
        "- FP32 issue rate: " + (f"{issue / 1e12:.3g} T op/s (SMs × FP32 lanes × boost clock)" if issue
                                   else "unknown (no SM clock in the device properties)"), "",
        "## Goals (issue 43, item 4)", "",
        markdown_table(["goal", "measured", "target", "result", "detail"],
                       [[g["goal"], _fmt(g["measured"]), ("≥ " if g["higher_is_better"] else "≤ ") + _fmt(g["target"]),
                         g["status"], g["detail"]] for g in result["goals"]]), "",
        "## Floors (arithmetic, not measured)", "", FLOOR_NOTE, "",
        markdown_table(["op", "N", "pass", "floor ms", "measured ms", "measured / floor", "basis"],
                       [[f["op"], f["size"], f["pass_name"], _fmt(f["floor_ms"]), _fmt(f["measured_ms"]),
                         _fmt(f["measured_ms"] / f["floor_ms"]) if f["measured_ms"] and f["floor_ms"] else "",
                         f["basis"]] for f in floors(result["rows"], issue)]), ""]
    header = ["N / image", "name", "width", "dtype", "pass", "median ms", "rate", "throughput", "peak MiB",
              "speed-up", "memory ratio", "note"]
    for section, title in TITLES.items():
        rows = [r for r in result["rows"] if r["section"] == section]
        if rows:
            parts += [f"## {title}", "", markdown_table(header, [_cells(r, bw, issue) for r in rows]), ""]
    if result.get("warnings"):
        parts += ["Warnings during the run (e.g. an op that fell back from Triton to PyTorch):", ""]
        parts += [f"- {w}" for w in result["warnings"]] + [""]
    return "\n".join(parts + ["![time vs N](time_vs_n.png)", ""])


def plot(rows: List[dict], path: Path, title: str) -> Optional[Path]:
    """Log–log time against N: op and layer panels, one line per (name, width) and dtype, forward + backward.
    ``None`` without matplotlib (a bare GPU machine may lack it): the tables are written all the same."""
    try:
        import matplotlib
    except ImportError as err:
        print(f"no time_vs_n.png: {err}", file=sys.stderr)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [s for s in ("op", "layer", "kernel") if any(r["section"] == s and r["status"] == "ok" for r in rows)]
    if not sections:
        return None
    fig, axes = plt.subplots(1, len(sections), figsize=(6 * len(sections), 4.6), squeeze=False)
    for ax, section in zip(axes[0], sections):
        lines: Dict[str, List[Tuple[int, float]]] = {}
        for r in rows:
            wanted = "fwd" if section == "kernel" else "fwd+bwd"
            if r["section"] == section and r["status"] == "ok" and r["pass_name"] == wanted:
                lines.setdefault(f"{r['name']} {r['heads']}×{r['dim'] // r['heads']} {r['dtype']}", []).append(
                    (r["size"], r["median_ms"]))
        for label, pts in sorted(lines.items()):
            pts.sort()
            ax.plot(*zip(*pts), marker="o", ls="--" if label.startswith("softmax") else "-", label=label)
        ax.set(xscale="log", yscale="log", xlabel="tokens N", ylabel="median ms",
               title=f"{section}, {'forward' if section == 'kernel' else 'forward + backward'}")
        sizes = sorted({n for pts in lines.values() for n, _ in pts})
        ax.set_xticks(sizes, [str(n) for n in sizes], rotation=45)
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict, out: Path) -> List[Path]:
    """``results.md``, ``results.csv``, ``results.json`` and ``time_vs_n.png`` of one run in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [Path(write_csv(out / "results.csv", result["rows"], COLUMNS))]
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "results.md").write_text(report(result))
    paths += [out / "results.json", out / "results.md"]
    env = result["environment"]
    png = plot(result["rows"], out / "time_vs_n.png", f"{env.get('gpu') or env.get('device_name')}, batch 1")
    return paths + ([png] if png else [])


def slug(name: str) -> str:
    """A folder name for a GPU name: ``"NVIDIA H200"`` → ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


# --------------------------------------------------------------------------------------------------- main
def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 1024, 4096 and 224² only (a smoke test)")
    ap.add_argument("--dry-run", action="store_true", help="list every measurement and their count; needs no GPU")
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="token counts (default 1024, 4096, 16384, 65536)")
    ap.add_argument("--image-sizes", type=int, nargs="+", default=None, help="model image sides (default 224 448)")
    ap.add_argument("--dtypes", nargs="+", default=list(RUN_DTYPES), choices=list(DTYPES))
    ap.add_argument("--model-batch", type=int, default=32, help="batch of the model throughput rows (default 32)")
    ap.add_argument("--budget-s", type=float, default=180.0, help="wall-clock budget of the measurements")
    ap.add_argument("--call-cap-s", type=float, default=2.0,
                    help="a call slower than this is timed once and larger N of its series are skipped")
    ap.add_argument("--min-run-time", type=float, default=0.1, help="seconds of timing per entry")
    ap.add_argument("--device", default="cuda",
                    help="cuda or cuda:i; cpu runs the same code on CPU tensors (a plumbing check, not a benchmark)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default: benchmarks/results/gpu/<gpu> for a full run, "
                         "runs/gpu-partial/<gpu> otherwise)")
    args = ap.parse_args(argv)
    args.full = (args.sizes is None and args.image_sizes is None and not args.quick
                 and args.dtypes == list(RUN_DTYPES) and args.device.startswith("cuda"))
    args.sizes = sorted(set(args.sizes or (QUICK_SIZES if args.quick else SIZES)))
    args.image_sizes = sorted(set(args.image_sizes or (QUICK_IMAGE_SIZES if args.quick else IMAGE_SIZES)))
    if not (args.device.startswith("cuda") or args.device == "cpu"):
        ap.error(f"--device must be cuda, cuda:i or cpu, got {args.device!r}")
    if any(n < LANDMARK_SIDE ** 2 for n in args.sizes):
        ap.error(f"sizes must be at least {LANDMARK_SIDE ** 2} (m = 49 landmarks)")
    return args


def dry_run(entries: List[Entry], args) -> int:
    print(f"would measure the copy bandwidth, then {len(entries)} entries on {args.device}:")
    for i, e in enumerate(entries, 1):
        print(f"{i:4d}  {e.label()}")
    expected = expected_count(len(args.sizes), len(args.image_sizes), len(args.dtypes))
    ops, layers = _per_size()
    print(f"{len(entries)} measurements (expected {expected}: {len(args.dtypes)} dtypes × ({len(args.sizes)} sizes × "
          f"({ops} op + {len(KERNELS)} kernel + {layers} layer entries) + {len(args.image_sizes)} images × "
          f"{len(MODELS)} models × {len(MODEL_PASSES)} pass))")
    print("goals: " + "; ".join(g["goal"] for g in evaluate_goals([], None)))
    return 0


def run(entries: List[Entry], args, device: torch.device) -> dict:
    """Measure the bandwidth and every entry; the result dictionary that :func:`write_outputs` writes."""
    env = environment(device)
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    env["memory_method"] = memory_method(device)
    if device.type == "cuda":  # the boost clock (kHz) where this torch reports it: the FP32 issue rate
        khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", None)
        env["gpu_clock_mhz"] = khz / 1e3 if khz else None
    issue_rate = fp32_issue_rate(env)
    budget = Budget(args.budget_s, args.call_cap_s, args.min_run_time)
    bandwidth = measure_bandwidth(device, 2 ** 30 if device.type == "cuda" else 2 ** 24)
    print(f"copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    rows = []
    # the ops warn once per reason when a CUDA input falls back from Triton to PyTorch: keep those lines
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, e in enumerate(entries, 1):
            row = run_entry(e, device, budget)
            rows.append(row)
            print(f"[{i}/{len(entries)}] {e.label()}  {row['status']:7s} {_fmt(row.get('median_ms')):>9s} ms  "
                  f"{_fmt(row.get('peak_mib')):>9s} MiB  {row.get('note', '')}", flush=True)
    add_ratios(rows)
    env["load_average_1m_end"] = load_average()
    return {"environment": env, "bandwidth_gbs": bandwidth, "fp32_issue_rate": issue_rate, "rows": rows,
            "elapsed_s": time.perf_counter() - budget.start, "goals": evaluate_goals(rows, issue_rate),
            "warnings": list(dict.fromkeys(str(w.message) for w in caught))}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    entries = plan(args.sizes, args.image_sizes, args.dtypes, args.model_batch)
    if args.dry_run:
        return dry_run(entries, args)
    try:
        device = parse_device(args.device, hint="; --dry-run lists the measurements without one")
    except ValueError as err:
        print(f"gpu.py: error: {err}", file=sys.stderr)
        return 2
    result = run(entries, args, device)
    result["command"] = " ".join(["python benchmarks/gpu.py"] + argv)
    gpu = slug(result["environment"].get("gpu") or device.type)
    out = args.out or (RESULTS / gpu if args.full else Path("runs/gpu-partial") / gpu)
    for g in result["goals"]:
        print(f"{g['status']:12s} {g['goal']}: {_fmt(g['measured'])} ({g['detail']})")
    print("wrote", ", ".join(str(p) for p in write_outputs(result, out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
