"""Fibottention benchmark: sparse multi-diagonal attention vs dense SDPA vs the official mask.

Run (about 5 minutes on 2 CPU cores)::

    .venv/bin/python benchmarks/fibottention.py            # writes benchmarks/results/fibottention/<machine>/
    .venv/bin/python benchmarks/fibottention.py --quick    # N = 784 only, a smoke test (runs/fibottention-partial)

Setting: batch 1, 12 heads × 64 (dim 768), one CLS token + N ∈ {784, 4096, 16384}
patch tokens, Fibottention offsets of layer 0 (default variant, w_min = 5, w_max = N // 3).

- **op level** (q, k, v → output, no projections): ``sparse`` (C kernel and PyTorch backend),
  dense ``F.scaled_dot_product_attention`` and the ``official`` multiplicative mask; forward
  (under ``no_grad``) and forward + backward; peak tensor memory of forward + backward measured
  with ``MemTracker`` (inputs and gradients included).
- **layer level** (the full mixer: qkv projection, mixing, output projection): the
  ``fibottention`` mixer (sparse and official modes) vs the ``softmax`` mixer (SDPA).

Times are medians of ``torch.utils.benchmark`` measurements with ``num_threads =
torch.get_num_threads()`` (:func:`vitmix.bench.timing.time_call`). Dense runs that would take many
seconds are timed a few single times; runs that need more memory than the machine has are skipped
and marked so.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from vitmix import mixers
from vitmix._util import markdown_table, write_csv
from vitmix.bench.env import cpu_model, machine_tag
from vitmix.bench.memory import peak_memory
from vitmix.bench.timing import time_call
from vitmix.ops import diagonal as sd
from vitmix.ops.fibonacci import fibonacci_offsets

OUT_DIR = Path(__file__).resolve().parent / "results" / "fibottention"
HEADS, HEAD_DIM, PREFIX = 12, 64, 1


# ------------------------------------------------------------------------------------ helpers
def machine() -> dict:
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "c_kernel": sd.kernel_available(), "load_average_start": os.getloadavg()}


def timeit(fn, min_run_time: float = 1.0) -> float:
    """Median seconds of ``fn()`` after a warm-up call (which also compiles the kernel and builds the
    offset cache), by :func:`vitmix.bench.timing.time_call`: calls over ``min_run_time / 3`` are timed
    3 single times, stopping after 5 s of them (so a call of many seconds is timed once)."""
    return time_call(fn, min_run_time=min_run_time, min_samples=3, max_seconds=5.0).median_s


def peak_mib(fn) -> float:
    """Peak tensor memory (MiB) while ``fn()`` runs, from :func:`vitmix.bench.memory.peak_memory`
    (``MemTracker``, all devices; tensors made before the call are not counted)."""
    gc.collect()
    return peak_memory(fn, "cpu").peak_bytes / 2**20


def dense_fits(n_tokens: int, copies: int) -> bool:
    """Whether ``copies`` float32 (H, T, T) matrices fit comfortably in the machine's memory."""
    need = copies * HEADS * n_tokens * n_tokens * 4
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        avail = 8 * 2**30
    return need < 0.6 * avail


# --------------------------------------------------------------------------------- op level
def op_methods(n: int, slow_ok: bool = False):
    offsets = fibonacci_offsets(n, HEADS)
    plan = sd.diagonal_plan(offsets, n)
    methods = {
        "sparse (C kernel)": lambda q, k, v: sd.sparse_diagonal_attention(q, k, v, plan, PREFIX, backend="c"),
        "sparse (PyTorch backend)": lambda q, k, v: sd.sparse_diagonal_attention(q, k, v, plan, PREFIX,
                                                                                 backend="torch"),
        "SDPA (dense)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    }
    if n > 4096 and not slow_ok:  # the fallback backend is slow on CPU; measured up to 4096 unless --slow
        methods.pop("sparse (PyTorch backend)")
    mask = None
    if dense_fits(n + PREFIX, 5):
        from vitmix.ops.fibonacci import offsets_mask

        mask = offsets_mask(offsets, n, PREFIX)
        methods["official (multiplicative mask)"] = (
            lambda q, k, v: sd.official_diagonal_attention(q, k, v, None, PREFIX, mask=mask))
    if not sd.kernel_available():
        methods.pop("sparse (C kernel)")
    return methods


def _inputs(t: int, grad: bool):
    return [torch.randn(1, HEADS, t, HEAD_DIM, requires_grad=grad) for _ in range(3)]


def _op_row(n: int, name: str, fn, slow_ok: bool) -> dict:
    t = n + PREFIX
    dense = name.startswith(("SDPA", "official"))
    row = {"level": "op", "N": n, "method": name}
    q, k, v = _inputs(t, False)
    with torch.no_grad():
        row["fwd_ms"] = timeit(lambda: fn(q, k, v)) * 1e3
    q = k = v = None  # free before the next measurement
    if name.startswith("sparse (PyTorch") and n > 4096 and not slow_ok:
        row["fwd_bwd_ms"] = None
    else:
        qg, kg, vg = _inputs(t, True)
        row["fwd_bwd_ms"] = timeit(lambda: fn(qg, kg, vg).sum().backward()) * 1e3
        qg = kg = vg = None

    def step():
        a, b, c = _inputs(t, True)
        fn(a, b, c).sum().backward()

    row["peak_fwd_bwd_mib"] = peak_mib(step) if (not dense or n <= 4096) else None
    return row


def bench_op(n: int, slow_ok: bool) -> list:
    rows = []
    for name, fn in op_methods(n, slow_ok).items():
        row = _op_row(n, name, fn, slow_ok)
        rows.append(row)
        print(f"  op    N={n:6d} {name:32s} fwd {row['fwd_ms']:10.2f} ms  fwd+bwd "
              f"{_fmt(row['fwd_bwd_ms'])} ms  peak {_fmt(row['peak_fwd_bwd_mib'])} MiB", flush=True)
    return rows


# ------------------------------------------------------------------------------ layer level
def bench_layer(n: int) -> list:
    rows = []
    torch.manual_seed(0)
    base = mixers.create("softmax", HEADS * HEAD_DIM, HEADS)
    layers = {"fibottention sparse": mixers.create("fibottention", HEADS * HEAD_DIM, HEADS,
                                                   num_prefix_tokens=PREFIX),
              "softmax (SDPA)": base}
    if dense_fits(n + PREFIX, 5):
        layers["fibottention official"] = mixers.create("fibottention", HEADS * HEAD_DIM, HEADS, mode="official",
                                                        num_prefix_tokens=PREFIX)
    for layer in layers.values():
        layer.load_state_dict(base.state_dict())
    x = torch.randn(1, n + PREFIX, HEADS * HEAD_DIM)
    xg = x.clone().requires_grad_()
    for name, layer in layers.items():
        row = {"level": "layer", "N": n, "method": name}
        with torch.no_grad():
            row["fwd_ms"] = timeit(lambda layer=layer: layer(x)) * 1e3
        row["fwd_bwd_ms"] = (timeit(lambda layer=layer: layer(xg).sum().backward()) * 1e3) if n <= 4096 else None
        row["peak_fwd_bwd_mib"] = None
        rows.append(row)
        print(f"  layer N={n:6d} {name:32s} fwd {row['fwd_ms']:10.2f} ms  fwd+bwd {_fmt(row['fwd_bwd_ms'])} ms",
              flush=True)
    with torch.no_grad():
        proj = timeit(lambda: base.proj(base.qkv(x)[..., : HEADS * HEAD_DIM])) * 1e3
    rows.append({"level": "layer", "N": n, "method": "projections only (qkv + proj)", "fwd_ms": proj,
                 "fwd_bwd_ms": None, "peak_fwd_bwd_mib": None})
    print(f"  layer N={n:6d} {'projections only':32s} fwd {proj:10.2f} ms", flush=True)
    return rows


def profile_layer(n: int) -> str:
    from torch.profiler import profile

    layer = mixers.create("fibottention", HEADS * HEAD_DIM, HEADS, num_prefix_tokens=PREFIX)
    x = torch.randn(1, n + PREFIX, HEADS * HEAD_DIM, requires_grad=True)
    layer(x).sum().backward()
    with profile() as prof:
        layer(x).sum().backward()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


# ---------------------------------------------------------------------------------- report
def _fmt(v, nd=2):
    return "—" if v is None else f"{v:.{nd}f}"


def _get(rows, level, n, method, key):
    for r in rows:
        if r["level"] == level and r["N"] == n and r["method"] == method:
            return r.get(key)
    return None


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def goals(rows) -> list:
    sparse = "sparse (C kernel)"
    if _get(rows, "op", 4096, sparse, "fwd_ms") is None:
        sparse = "sparse (PyTorch backend)"
    checks = []

    def add(text, value, target, higher=True):
        ok = None if value is None else (value >= target if higher else value <= target)
        checks.append({"goal": text, "measured": value, "target": target,
                       "met": ok})

    add("op fwd speed-up vs SDPA at N=4096", _ratio(_get(rows, "op", 4096, "SDPA (dense)", "fwd_ms"),
                                                    _get(rows, "op", 4096, sparse, "fwd_ms")), 25)
    add("op fwd+bwd speed-up vs SDPA at N=4096", _ratio(_get(rows, "op", 4096, "SDPA (dense)", "fwd_bwd_ms"),
                                                        _get(rows, "op", 4096, sparse, "fwd_bwd_ms")), 25)
    add("op peak memory sparse / official at N=4096 (fwd+bwd)",
        _ratio(_get(rows, "op", 4096, sparse, "peak_fwd_bwd_mib"),
               _get(rows, "op", 4096, "official (multiplicative mask)", "peak_fwd_bwd_mib")), 1 / 20, higher=False)
    add("layer fwd speed-up vs SDPA layer at N=4096",
        _ratio(_get(rows, "layer", 4096, "softmax (SDPA)", "fwd_ms"),
               _get(rows, "layer", 4096, "fibottention sparse", "fwd_ms")), 4)
    add("layer fwd speed-up vs SDPA layer at N=16384",
        _ratio(_get(rows, "layer", 16384, "softmax (SDPA)", "fwd_ms"),
               _get(rows, "layer", 16384, "fibottention sparse", "fwd_ms")), 15)
    add("(bound) SDPA layer / projections only at N=4096",
        _ratio(_get(rows, "layer", 4096, "softmax (SDPA)", "fwd_ms"),
               _get(rows, "layer", 4096, "projections only (qkv + proj)", "fwd_ms")), 0)
    add("(bound) SDPA layer / projections only at N=16384",
        _ratio(_get(rows, "layer", 16384, "softmax (SDPA)", "fwd_ms"),
               _get(rows, "layer", 16384, "projections only (qkv + proj)", "fwd_ms")), 0)
    return checks


def write(rows, info, checks, prof, command, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"machine": info, "command": command, "rows": rows,
                                                      "goals": checks}, indent=2))
    write_csv(out / "results.csv", rows, ["level", "N", "method", "fwd_ms", "fwd_bwd_ms", "peak_fwd_bwd_mib"])
    if prof:  # only a run that includes N = 4096 has a profile
        (out / "profile_layer_4096.txt").write_text(prof)
    (out / "README.md").write_text(report(rows, info, checks, command))
    plot(rows, info, out / "op_time.png")


def report(rows, info, checks, command) -> str:
    """The markdown of ``README.md``: machine, goals, then the op and layer tables."""
    lines = ["# Fibottention benchmark", "",
             f"Command: `{command}`", "",
             f"Machine: {info['cpu']}, {info['logical_cpus']} logical CPUs, torch {info['torch']} with "
             f"{info['torch_threads']} threads, Python {info['python']}, C kernel available: {info['c_kernel']}. "
             f"Load average at start {tuple(round(x, 2) for x in info['load_average_start'])}, at end "
             f"{tuple(round(x, 2) for x in info['load_average_end'])} (shared machine: other jobs were running).", "",
             "Setting: batch 1, 12 heads × 64 (dim 768), 1 CLS token + N patch tokens, layer-0 offsets. "
             "Medians of `torch.utils.benchmark`; forward under `no_grad`; peak = tensor memory of forward + "
             "backward (inputs and gradients included) from `MemTracker`. — = not run (too slow or too much "
             "memory for this machine).", "",
             "## Goals (issue 4)", "", markdown_table(["goal", "measured", "target", "met"], map(_goal_cells, checks))]
    for level in ("op", "layer"):
        dense = "SDPA (dense)" if level == "op" else "softmax (SDPA)"
        cells = [[r["N"], r["method"], _fmt(r["fwd_ms"]), _fmt(r["fwd_bwd_ms"]), _fmt(r["peak_fwd_bwd_mib"], 1),
                  f"{_fmt(_ratio(_get(rows, level, r['N'], dense, 'fwd_ms'), r['fwd_ms']), 1)}×"]
                 for r in rows if r["level"] == level]
        lines += ["", f"## {'Op level (q, k, v → out)' if level == 'op' else 'Layer level (whole mixer)'}", "",
                  markdown_table(["N", "method", "fwd ms", "fwd+bwd ms", "peak fwd+bwd MiB", "fwd speed-up vs SDPA"],
                                 cells)]
    lines += ["", "Profile of one forward + backward of the sparse mixer layer at N = 4096: "
              "[profile_layer_4096.txt](profile_layer_4096.txt).", ""]
    return "\n".join(lines)


def _goal_cells(c: dict) -> list:
    tgt = "—" if c["target"] == 0 else (f"≤ {c['target']:.3f}" if c["target"] < 1 else f"≥ {c['target']}×")
    met = "—" if c["met"] is None or c["target"] == 0 else ("yes" if c["met"] else "**no**")
    return [c["goal"], _fmt(c["measured"], 3 if (c["measured"] or 0) < 1 else 1), tgt, met]


def plot(rows, info, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is optional
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "fwd_ms", "op forward"), (axes[1], "fwd_bwd_ms", "op forward + backward")):
        for method in dict.fromkeys(r["method"] for r in rows if r["level"] == "op"):
            pts = [(r["N"], r[key]) for r in rows if r["level"] == "op" and r["method"] == method and r[key]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("patch tokens N")
        ax.set_ylabel("ms (median)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Fibottention vs SDPA, 12 heads × 64, batch 1 — {info['cpu']}, {info['torch_threads']} threads",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 784 only (smoke test)")
    parser.add_argument("--sizes", type=int, nargs="*", default=None,
                        help="patch-token counts (default 784 4096 16384)")
    parser.add_argument("--slow", action="store_true", help="also time the PyTorch backend at N > 4096")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: {OUT_DIR}/<machine> for a full run, runs/fibottention-partial "
                             "otherwise)")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([784] if args.quick else [784, 4096, 16384])
    # a quick or partial run never replaces the committed results
    full = sorted(sizes) == [784, 4096, 16384]
    out = args.out or (OUT_DIR / machine_tag() if full else Path("runs/fibottention-partial"))
    info = machine()
    print(f"machine: {info}", flush=True)
    rows = []
    for n in sizes:
        rows += bench_op(n, args.slow)
        rows += bench_layer(n)
    prof = profile_layer(4096) if 4096 in sizes else ""
    info["load_average_end"] = os.getloadavg()
    checks = goals(rows)
    for c in checks:
        print(f"goal: {c['goal']}: {_fmt(c['measured'], 3)} (target {c['target']}) met={c['met']}")
    command = "python benchmarks/fibottention.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write(rows, info, checks, prof, command.strip(), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
