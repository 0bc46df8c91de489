"""Kernel mixer layers against their physical floor: the layer's own qkv + output projections.

A mixer layer cannot be cheaper than its linear projections, so speed is stated as a multiple of
that floor (timed in the same run, same input), beside the ratio to the softmax (SDPA) layer:

* floor: ``Linear(384, 1152)`` then ``Linear(384, 384)`` on the same tokens, forward+backward;
* ``laplacian`` / ``soft``: ``vitmix.mixers.create(name, 384, 6, qkv_bias=True)`` with the defaults
  (m = 49 landmarks at these sizes), forward+backward;
* ``softmax``: the SDPA layer with timm's projections.

Shapes: batch 1 at N = 4096 / 16384 (64² / 128² grids), and batch 32 at the classification sizes
N = 197 (CLS + 14²) and N = 65 (CLS + 8², the demo). Times are medians from
:func:`vitmix.bench.time_call`. Then the first-call latency of ``laplacianformer_tiny`` at 224²
(batch 1, fwd+bwd) in a fresh process, with an empty kernel cache and with a warm one, against the
second call; and a ``torch.profiler`` table of the laplacian layer at N = 4096.

Run (idle machine, 2 threads): ``.venv/bin/python benchmarks/projection_floor.py``; writes
``benchmarks/results/projection_floor/<machine>/{results.md,results.json,profile_4096.txt}``. ``--quick``
(smaller repeat counts) writes to ``runs/projection_floor-quick`` instead, never over committed results.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from vitmix import mixers
from vitmix._util import markdown_table
from vitmix.bench.env import environment, machine_tag
from vitmix.bench.timing import time_call

DIM, HEADS = 384, 6
SHAPES = [(1, 0, 64), (1, 0, 128), (32, 1, 14), (32, 1, 8)]   # (batch, prefix, grid side)
LAYERS = ("laplacian", "soft", "softmax")
OUT = Path(__file__).resolve().parent / "results" / "projection_floor"

FIRST_CALL = r"""
import json, sys, time, torch, vitmix
torch.manual_seed(0)
model = vitmix.create_model("laplacianformer_tiny")
x = torch.randn(1, 3, 224, 224)
times = []
for _ in range(3):
    t = time.perf_counter(); model(x).sum().backward(); times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def _init_like_vit(module: nn.Module) -> nn.Module:
    for m in module.modules():      # timm's ViT init: trunc-normal(.02) linears
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
    return module


def _fwd_bwd(module, x):
    def run():
        x.grad = None
        module.zero_grad(set_to_none=True)
        module(x).sum().backward()
    return run


class Floor(nn.Module):
    """The projections every attention layer of this width has: qkv, then the output linear."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        return self.proj(self.qkv(x)[..., :DIM])


def bench_layers(min_run_time: float) -> list:
    rows = []
    for batch, prefix, side in SHAPES:
        n = prefix + side * side
        torch.manual_seed(0)
        x = torch.randn(batch, n, DIM, requires_grad=True)
        floor = time_call(_fwd_bwd(_init_like_vit(Floor()), x), min_run_time=min_run_time).median_s
        row = {"batch": batch, "N": n, "floor_ms": floor * 1e3}
        for name in LAYERS:
            layer = _init_like_vit(mixers.create(name, DIM, HEADS, qkv_bias=True, hw=(side, side),
                                                 num_prefix_tokens=prefix))
            row[f"{name}_ms"] = time_call(_fwd_bwd(layer, x), min_run_time=min_run_time).median_s * 1e3
        for name in LAYERS:
            row[f"{name}_vs_floor"] = row[f"{name}_ms"] / row["floor_ms"]
            row[f"{name}_vs_softmax"] = row[f"{name}_ms"] / row["softmax_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def first_call() -> dict:
    """Seconds of the first three fwd+bwd calls in fresh processes (empty cache, then warm cache)."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, VITMIX_CACHE_DIR=cache)
        for label in ("empty_cache", "warm_cache"):
            res = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True,
                                 check=True)
            out[label] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def profile_table(path: Path) -> None:
    from torch.profiler import profile

    layer = _init_like_vit(mixers.create("laplacian", DIM, HEADS, qkv_bias=True, hw=(64, 64)))
    x = torch.randn(1, 4096, DIM, requires_grad=True)
    step = _fwd_bwd(layer, x)
    for _ in range(2):
        step()
    with profile() as prof:
        for _ in range(3):
            step()
    path.write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def write(rows, calls, env, out: Path, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"environment": env, "command": cmd, "rows": rows,
                                                  "first_call_s": calls}, indent=2))
    lines = [
        "# Kernel mixer layers vs their projection floor",
        "",
        f"Command: `{cmd}`  ",
        f"{env['cpu']}, {env['torch_threads']} threads, torch {env['torch']}, {env['date_utc']}, "
        f"1-min load average before the run {env['load_before']:.2f}.  ",
        f"dim {DIM}, {HEADS} heads, qkv_bias, default options (m = 49 landmarks at N ≥ 196, 16 on 8×8); "
        "forward+backward medians; floor = qkv + output linears on the same input.",
        "",
    ]
    header = ["batch", "N", "floor (ms)", "laplacian (ms)", "× floor", "× softmax", "soft (ms)", "× floor",
              "× softmax", "softmax (ms)", "× floor"]
    cells = [[r["batch"], r["N"], f"{r['floor_ms']:.1f}", f"{r['laplacian_ms']:.1f}", f"{r['laplacian_vs_floor']:.2f}",
              f"{r['laplacian_vs_softmax']:.2f}", f"{r['soft_ms']:.1f}", f"{r['soft_vs_floor']:.2f}",
              f"{r['soft_vs_softmax']:.2f}", f"{r['softmax_ms']:.1f}", f"{r['softmax_vs_floor']:.2f}"] for r in rows]
    lines.append(markdown_table(header, cells, align="r" * len(header)))
    if calls:
        cells = [[label.replace("_", " "), f"{t[0]:.2f}", f"{t[1]:.2f}", f"{t[2]:.2f}", f"{t[0] / t[1]:.2f}"]
                 for label, t in calls.items()]
        lines += ["", "First fwd+bwd calls of `laplacianformer_tiny` at 224², batch 1, fresh process (seconds):", "",
                  markdown_table(["kernel cache", "1st", "2nd", "3rd", "1st / 2nd"], cells, align="lrrrr")]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short timings, written to runs/projection_floor-quick")
    ap.add_argument("--out", type=Path, default=None, help=f"output folder (default {OUT}/<machine>)")
    args = ap.parse_args(argv)
    env = dict(environment(), load_before=os.getloadavg()[0])
    out = args.out or (Path("runs/projection_floor-quick") if args.quick else OUT / machine_tag(env))
    cmd = "python benchmarks/projection_floor.py" + (" --quick" if args.quick else "")
    rows = bench_layers(0.2 if args.quick else 1.0)
    calls = first_call()
    write(rows, calls, env, out, cmd)
    profile_table(out / "profile_4096.txt")


if __name__ == "__main__":
    main()
