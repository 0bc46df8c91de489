"""ONNX export of every registered vitmix model, checked against PyTorch with onnxruntime.

    .venv/bin/python benchmarks/onnx_parity.py                       # every model, two sizes each
    .venv/bin/python benchmarks/onnx_parity.py --models soft_tiny vit_nano_patch4_32 --out /tmp/onnx

For each model in ``vitmix models`` and each of two image sizes (its default, and a second one: 160
for the 224-pixel models, 48 for the 32-pixel ones), a fresh worker process does what
``vitmix export --format onnx`` does — build the model (random weights, seeded), ``torch.export`` with a
dynamic batch, write the ONNX file, run it in onnxruntime at batch 1 and 3 — and reports the largest
relative error ``max|onnx − torch| / max|torch|`` against the limit of ``vitmix.export.PARITY_RTOL``
(1e-4). Parameters initialised to all zeros (DiT's adaLN-Zero, zero biases) get small random values
first, so that a graph which dropped them could not match by outputting zeros.
Diffusion backbones (``dit_*``) take their own (images, timesteps, labels) inputs.

Results go to ``--out`` (default ``benchmarks/results/export/onnx/``): ``results.md``, ``results.csv``
and ``results.json``, with the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def other_size(default: int) -> int:
    """The second size checked: smaller than a 224-pixel default (cheap), larger than a small one."""
    return 160 if default >= 160 else default + default // 2


def default_size(name: str) -> int:
    """The model's default image side, from its registered config (nothing is built)."""
    import timm

    return int(timm.models.get_pretrained_cfg(name).input_size[-1])


def worker(name: str, size: int) -> dict:
    """Export ``name`` at ``size`` and measure onnxruntime parity (runs in its own process)."""
    import torch

    from vitmix import export

    torch.manual_seed(0)
    start = time.perf_counter()
    model, example = export.build_model(name, img_size=size)
    with torch.no_grad():   # all-zero inits (adaLN-Zero, zero biases) would hide a wrong graph: output 0 = 0
        for param in model.parameters():
            if not param.any():
                param.normal_(std=0.02)
    program = export.export_program(model, example)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.onnx"
        info = export.write_onnx(program, path)
        megabytes = path.stat().st_size / 2**20
        errors = export.onnxruntime_parity(path, model, export._image_shape(example))
    worst = max(errors.values())
    return {"model": name, "img_size": size, "opset": info["opset"], "inputs": len(info["inputs"]),
            "onnx_mib": round(megabytes, 1), "rel_err_b1": errors[1], "rel_err_b3": errors[3],
            "max_rel_err": worst, "ok": worst <= export.PARITY_RTOL, "seconds": round(time.perf_counter() - start, 1)}


def run_one(name: str, size: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, str(size)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"model": name, "img_size": size, "ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "img_size": size, "ok": False, "error": tail[:300]}
    return json.loads(lines[-1])


def write_results(rows: list, out: Path, started: float) -> None:
    from vitmix._util import markdown_table, write_csv
    from vitmix.bench.env import environment

    out.mkdir(parents=True, exist_ok=True)
    env = environment("cpu")
    (out / "results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    write_csv(out / "results.csv", rows)
    ok = sum(r["ok"] for r in rows)
    header = ["model", "img size", "opset", "rel. error b=1", "rel. error b=3", "ONNX MiB", "s", "result"]
    table = [[r["model"], r["img_size"], r.get("opset", ""), _e(r.get("rel_err_b1")), _e(r.get("rel_err_b3")),
              r.get("onnx_mib", ""), r.get("seconds", ""), "ok" if r["ok"] else r.get("error", "over the limit")]
             for r in rows]
    text = [
        "# ONNX export and onnxruntime parity of every registered model", "",
        "Command: `.venv/bin/python benchmarks/onnx_parity.py " + " ".join(sys.argv[1:]) + "`", "",
        f"- machine: {env.get('cpu')}; torch {env.get('torch')}; date {env.get('date_utc')}",
        f"- load average (1 min) at end: {env.get('load_average_1m')}; run took {time.time() - started:.0f} s",
        "- each row: `vitmix export --format onnx` in a fresh process (random weights, seed 0, all-zero tensors "
        "given random values), onnxruntime "
        "(CPU, float32) vs PyTorch at batch 1 and 3; relative error = max|onnx − torch| / max|torch|, "
        "limit 1e-4", "",
        f"**{ok} of {len(rows)} exports within the limit.**", "",
        markdown_table(header, table), "",
    ]
    (out / "results.md").write_text("\n".join(text))


def _previous_rows(out: Path, redo: bool) -> list:
    """Rows of an earlier (interrupted or partial) run in ``out``: kept, so a rerun adds only what is missing."""
    path = out / "results.json"
    return [] if redo or not path.exists() else json.loads(path.read_text())["rows"]


def _e(value) -> str:
    return "" if value is None else f"{value:.1e}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", help="model names (default: every registered vitmix model)")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/export/onnx"))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per export (default 900)")
    p.add_argument("--redo", action="store_true", help="re-run exports already in --out/results.json")
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]))))
        return 0
    from tqdm import tqdm

    from vitmix.models import is_vitmix_model, list_models

    names = args.models or [n for n in list_models() if is_vitmix_model(n)]
    jobs = [(n, size) for n in names for size in (default_size(n), other_size(default_size(n)))]
    started, rows = time.time(), _previous_rows(Path(args.out), args.redo)
    done = {(r["model"], r["img_size"]) for r in rows}
    for name, size in tqdm([j for j in jobs if j not in done], desc="onnx export", unit="export"):
        rows.append(run_one(name, size, args.timeout))
        tqdm.write(f"{name} @ {size}: " + ("ok" if rows[-1]["ok"] else rows[-1].get("error", "over the limit"))
                   + (f" ({rows[-1]['max_rel_err']:.1e})" if "max_rel_err" in rows[-1] else ""))
        write_results(rows, Path(args.out), started)  # partial results survive an interrupted run
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
