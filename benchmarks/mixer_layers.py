"""Whole mixer layer benchmark: ``laplacian`` and ``soft`` layers vs the ``softmax`` (SDPA) layer.

The second level, what a model sees, projections included. Batch 1, dim 384, 6 heads
(head dim 64), N in {1024, 4096, 16384} tokens on a square grid (32², 64², 128²). For each layer:
forward time, forward+backward time (medians, :func:`vitmix.bench.timing.time_call`:
``torch.utils.benchmark`` with ``num_threads=torch.get_num_threads()``) and the peak tensor memory of
forward+backward (:func:`vitmix.bench.memory.peak_memory`: ``MemTracker``; parameters and the input
included, since they are part of the layer's cost).

* ``laplacian``: ``vitmix.mixers.create("laplacian", 384, 6, qkv_bias=True, num_landmarks=49)``
  (λ = 4, injective normalisation, the default Newton–Schulz steps, 3×3 depthwise conv on V);
* ``soft``: ``create("soft", 384, 6, qkv_bias=True, num_landmarks=49)`` (official conv landmarks
  after adaptive pooling to 14×14, tied Q = K, per-head 3×3 conv on V);
* ``softmax``: ``create("softmax", 384, 6, qkv_bias=True)`` (fused SDPA, same projections as timm).

The landmark count is fixed (m = 49) so that cost and memory are linear in N; with a fixed stride m
grows with N and the layers become quadratic.

``--macs`` instead counts the multiply–accumulates of the pyramid models at 224² (see
``docs/soft-laplacianformer.md``): ``FlopCounterMode`` FLOPs / 2 for every matmul and convolution,
plus the L1-distance accumulations of the Laplacian kernel (which ``FlopCounterMode`` does not
see), with and without the Newton–Schulz iterations.

Run: ``flock /tmp/vitmix-bench.lock .venv/bin/python benchmarks/mixer_layers.py`` (or ``--macs``).
Writes ``benchmarks/results/mixer_layers/<machine>/{results.md,results.csv,results.json,mixer_layers.png}``
(``--macs``: ``macs.md``, ``macs.json``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

from vitmix import mixers
from vitmix._util import markdown_table, write_csv
from vitmix.bench.env import cpu_model, machine_tag
from vitmix.bench.memory import peak_memory
from vitmix.bench.report import loglog_panels
from vitmix.bench.timing import time_call

DIM, HEADS, M = 384, 6, 49
LAYERS = {
    "laplacian": dict(num_landmarks=M),
    "soft": dict(num_landmarks=M),
    "softmax": dict(),
}
OUT_DIR = Path(__file__).resolve().parent / "results" / "mixer_layers"
PANELS = [("fwd_bwd_ms", "forward+backward (ms)", "time"), ("peak_mib", "peak memory (MiB)", "memory (fwd+bwd)")]


def machine() -> dict:
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "c_kernel_disabled": bool(os.environ.get("VITMIX_DISABLE_C_KERNEL"))}


def median_time(fn, min_run_time: float, repeats: int) -> float:
    """Median seconds per call (:func:`vitmix.bench.timing.time_call`: one warm-up call, which also
    compiles fused kernels; calls longer than ``min_run_time / repeats`` are timed one by one)."""
    return time_call(fn, min_run_time=min_run_time, min_samples=repeats).median_s


def peak_mib(fn) -> float:
    """Peak tensor memory of ``fn()`` (:func:`vitmix.bench.memory.peak_memory`, MemTracker): everything
    the call touches, parameters and input included (nothing is registered as existing before it)."""
    return peak_memory(fn, "cpu").peak_bytes / 2**20


def bench_layers(args, info) -> list:
    rows = []
    for n in args.sizes:
        side = math.isqrt(n)
        for name in args.layers:
            torch.manual_seed(0)
            layer = mixers.create(name, DIM, HEADS, qkv_bias=True, hw=(side, side), **LAYERS[name])
            x = torch.randn(1, n, DIM, requires_grad=True)

            def fwd(layer=layer, x=x):
                with torch.no_grad():
                    layer(x)

            def fwd_bwd(layer=layer, x=x):
                x.grad = None
                layer.zero_grad(set_to_none=True)
                layer(x).sum().backward()

            t_f = median_time(fwd, args.min_run_time, args.repeats)
            t_fb = median_time(fwd_bwd, args.min_run_time, args.repeats)
            layer.zero_grad(set_to_none=True)
            mem = peak_mib(fwd_bwd)
            rows.append({"layer": name, "N": n, "fwd_ms": t_f * 1e3, "fwd_bwd_ms": t_fb * 1e3, "peak_mib": mem})
            print(f"N={n:6d} {name:10s} fwd {t_f * 1e3:10.2f} ms  fwd+bwd {t_fb * 1e3:10.2f} ms  "
                  f"peak {mem:9.1f} MiB", flush=True)
    base = {r["N"]: r for r in rows if r["layer"] == "softmax"}
    for r in rows:
        b = base.get(r["N"])
        r["speedup_fwd_vs_softmax"] = b["fwd_ms"] / r["fwd_ms"] if b else None
        r["speedup_fwd_bwd_vs_softmax"] = b["fwd_bwd_ms"] / r["fwd_bwd_ms"] if b else None
    return rows


def write_layer_results(rows, args, info, cmd) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "results.csv", rows)
    (out / "results.json").write_text(json.dumps({"machine": info, "command": cmd, "rows": rows}, indent=2))
    text = layer_report(rows, info, cmd)
    (out / "results.md").write_text(text + "\n")
    print(text)
    loglog_panels(rows, "layer", args.layers, "N", "tokens N", PANELS,
                  f"mixer layers, B=1, dim {DIM}, {HEADS} heads, {info['cpu']}, {info['threads']} threads",
                  out / "mixer_layers.png")


def layer_report(rows, info: dict, cmd: str) -> str:
    """The markdown of ``results.md``."""
    def fmt(v):
        return "–" if v is None else f"{v:.1f}×"

    lines = [
        "# Whole mixer layers (projections included): laplacian / soft vs softmax (SDPA)",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {info['cpu']}, {info['logical_cpus']} logical CPUs, {info['threads']} torch threads, "
        f"torch {info['torch']}, Python {info['python']}.  ",
        f"Batch 1, dim {DIM}, {HEADS} heads × {DIM // HEADS}, square token grids; kernel layers with m = {M} "
        "landmarks (adaptive pooling), 20 Newton–Schulz iterations. Times are medians; peak memory is "
        "the MemTracker peak of tensors (parameters, input, activations, gradients) during "
        "forward+backward. 1-minute load average when the table was written: "
        f"{os.getloadavg()[0]:.1f} (above ~1 on 2 cores, other jobs were running and absolute times are noisy); "
        "ratios are measured within one run.",
        "",
    ]
    header = ["layer", "N", "fwd (ms)", "fwd+bwd (ms)", "peak fwd+bwd (MiB)", "fwd speed-up vs softmax",
              "fwd+bwd speed-up vs softmax"]
    cells = [[r["layer"], r["N"], f"{r['fwd_ms']:.2f}", f"{r['fwd_bwd_ms']:.2f}", f"{r['peak_mib']:.1f}",
              fmt(r["speedup_fwd_vs_softmax"]), fmt(r["speedup_fwd_bwd_vs_softmax"])] for r in rows]
    return "\n".join(lines + [markdown_table(header, cells, align="lrrrrrr")])


# ---------------------------------------------------------------------------------------------
# pyramid MACs
# ---------------------------------------------------------------------------------------------
def count_macs(name: str, newton: bool, img: int = 224) -> dict:
    """G MACs of ``name`` at ``img``²: FlopCounterMode/2 plus the Laplacian L1 accumulations."""
    import timm
    from torch.utils.flop_counter import FlopCounterMode

    import vitmix  # noqa: F401
    from vitmix.mixers.laplacian import LaplacianAttention

    # "without NS": the exact inverse, which FlopCounterMode does not count (no formula for linalg.inv)
    model = timm.create_model(name, mixer_options=None if newton else {"inverse": "exact"}).eval()
    l1 = [0]

    def hook(mod, args, kwargs, out):
        n, (h, w) = args[0].shape[1], kwargs["hw"]
        mh, mw = mod.landmark_count(h, w)
        m = mh * mw
        l1[0] += mod.num_heads * mod.head_dim * (2 * n * m + m * m)  # |x - y| summed per element

    for mod in model.modules():
        if isinstance(mod, LaplacianAttention):
            mod.register_forward_hook(hook, with_kwargs=True)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, 3, img, img))
    params = sum(p.numel() for p in model.parameters())
    return {"matmul_conv_gmacs": counter.get_total_flops() / 2e9, "l1_gmacs": l1[0] / 1e9, "params_m": params / 1e6}


def macs_table(args, info, cmd) -> None:
    names = [f"{fam}_{s}" for fam in ("soft", "laplacianformer")
             for s in ("tiny", "small", "medium", "large", "huge")]
    rows = []
    for name in names:
        full = count_macs(name, newton=True)
        no_ns = count_macs(name, newton=False)
        row = {"model": name, "params_m": full["params_m"],
               "gmacs": full["matmul_conv_gmacs"] + full["l1_gmacs"],
               "gmacs_without_newton": no_ns["matmul_conv_gmacs"] + no_ns["l1_gmacs"],
               "l1_gmacs": full["l1_gmacs"]}
        rows.append(row)
        print(row, flush=True)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "macs.json").write_text(json.dumps({"machine": info, "command": cmd, "rows": rows}, indent=2))
    lines = [
        "# Pyramid models: parameters and multiply–accumulates at 224²",
        "",
        f"Command: `{cmd}`  ",
        f"torch {info['torch']}. MACs = `torch.utils.flop_counter.FlopCounterMode` FLOPs / 2 (matmuls, "
        "linears, convolutions; it does not count elementwise ops, exp, norms or pooling) + the L1-distance "
        "accumulations of the Laplacian kernel (N·m·d per kernel matrix, added analytically since "
        "cdist/fused loops are not counted). 'without NS' drops the 20 Newton–Schulz iterations "
        "(2·m³ per iteration and head); SOFT's README numbers are reproduced by that column.",
        "",
    ]
    cells = [[r["model"], f"{r['params_m']:.2f}", f"{r['gmacs']:.2f}", f"{r['gmacs_without_newton']:.2f}",
              f"{r['l1_gmacs']:.2f}"] for r in rows]
    lines.append(markdown_table(["model", "params (M)", "G MACs", "G MACs without NS", "of which L1"], cells,
                                align="lrrrr"))
    (out / "macs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--min-run-time", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help=f"output folder (default {OUT_DIR}/<machine>; --macs: {OUT_DIR})")
    ap.add_argument("--macs", action="store_true", help="count pyramid-model MACs instead of timing layers")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for n in args.sizes:
        if math.isqrt(n) ** 2 != n or n < M:
            ap.error(f"N={n}: need a square number >= {M}")
    args.out = args.out or (OUT_DIR if args.macs else OUT_DIR / machine_tag())
    info = machine()
    cmd = ("python benchmarks/mixer_layers.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    print(f"# machine: {info}", flush=True)
    if args.macs:
        macs_table(args, info, cmd)
        return 0
    write_layer_results(bench_layers(args, info), args, info, cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
