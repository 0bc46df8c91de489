"""WeightFormer-T vs DeiT-T at growing resolution: inference throughput and peak memory (CPU).

    .venv/bin/python experiments/weightformer/weightformer.py                 # full run (224² → 1248², batch 8)
    .venv/bin/python experiments/weightformer/weightformer.py --sizes 224 448 --batch 4 --out /tmp/wf

Both models are built *at* each image size (DeiT-T via ``timm.create_model("deit_tiny_patch16_224",
img_size=S)``; WeightFormer-T is resolution-free). DeiT-T runs twice: with timm's fused attention
(``F.scaled_dot_product_attention``) and with the non-fused path (``TIMM_FUSED_ATTN=0`` in the
worker's environment, plus ``fused_attn=False`` on every attention module).

What is measured, per (model, size), each in a fresh worker process:

* **throughput** — images/s of ``model(x)`` under ``torch.no_grad()`` in eval mode, float32, batch
  ``--batch``; median over ``torch.utils.benchmark.Timer(...).timeit(1)`` runs with
  ``num_threads=torch.get_num_threads()`` (:func:`vitmix.bench.timing.time_call`). A warm-up forward
  runs first; when it alone takes ``--long-s`` seconds or longer it is used as the (single) timing,
  otherwise up to ``--repeats`` timed runs follow while they fit in ``--budget-s`` seconds.
* **peak inference memory, RSS** — ``ru_maxrss`` after the timed forwards minus the resident set
  size just before them (model and input already allocated): real bytes, including kernel scratch
  buffers (e.g. fused SDPA's).
* **peak memory, tensors** — ``torch.distributed._tools.mem_tracker.MemTracker`` run under
  ``FakeTensorMode`` (no arithmetic is done, so even configurations too large for this machine are
  measured): the largest sum of live tensor storages (parameters, input, activations, gradients,
  temporaries) during inference and during forward + backward (train mode, ``sum()`` loss), both at
  batch ``--batch``. Exact and independent of the allocator; misses scratch memory allocated
  inside a kernel.

Results go to ``--out`` (default ``experiments/weightformer/results/<machine>/``): ``results.json``,
``results.csv``, ``results.md`` and ``weightformer.png``, with the machine described.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from vitmix._util import markdown_table, write_csv

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
MODELS = {  # label → (timm name, fused attention)
    "WeightFormer-T": ("weightformer_tiny", None),
    "DeiT-T (fused SDPA)": ("deit_tiny_patch16_224", True),
    "DeiT-T (non-fused)": ("deit_tiny_patch16_224", False),
    # fairness check, not a goal: DeiT-T given the same oneDNN fused linears as WeightFormer's MLPs
    "DeiT-T (fused SDPA, oneDNN linears)": ("deit_tiny_patch16_224", "onednn"),
}


def _onednn_deit(model):
    """Give a timm ViT the inference GEMM path WeightFormer's MLPs use: every ``nn.Linear`` as a
    oneDNN primitive with fused bias, and ``fc1 → GELU`` of each MLP fused into one primitive."""
    import torch
    from timm.layers import Mlp
    from torch import nn

    def lin(x, m, post="none", alg=""):
        return torch.ops.mkldnn._linear_pointwise(x, m.weight, m.bias, post, [], alg)

    for m in model.modules():
        if isinstance(m, Mlp):
            assert isinstance(m.act, nn.GELU) and isinstance(m.norm, nn.Identity)
            m.forward = (lambda x, m=m: lin(lin(x, m.fc1, "gelu", m.act.approximate), m.fc2))
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.forward = (lambda x, m=m: lin(x, m))
    return model


# ----------------------------------------------------------------------------------------------
# worker (one model, one size, fresh process)
# ----------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _build(name: str, size: int, fused):
    import timm
    import vitmix  # noqa: F401  (registers weightformer_*)

    model = timm.create_model(name, img_size=size, num_classes=1000)
    if fused is not None:
        for m in model.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = bool(fused)
    if fused == "onednn":
        _onednn_deit(model)
    return model


def _tensor_peaks(model, batch: int, size: int) -> dict:
    """Peak tensor bytes for inference and for forward+backward, under FakeTensorMode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    out = {}
    for mode in ("infer", "train"):
        model.train(mode == "train")
        with FakeTensorMode(allow_non_fake_inputs=True):
            tracker = MemTracker()
            tracker.track_external(model)
            with tracker:
                x = torch.randn(batch, 3, size, size)
                if mode == "train":
                    model(x).sum().backward()
                else:
                    with torch.no_grad():
                        model(x)
                del x
            snap = tracker.get_tracker_snapshot("peak")
        out[mode] = int(sum(v["Total"] for v in snap.values()))
        model.zero_grad(set_to_none=True)
    model.eval()
    return out


def worker(spec: dict) -> dict:
    import torch

    from vitmix.bench.timing import time_call

    torch.manual_seed(0)
    model = _build(spec["name"], spec["size"], spec["fused"]).eval()
    x = torch.randn(spec["batch"], 3, spec["size"], spec["size"])
    res = dict(spec)
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32) if spec["name"].startswith("weightformer") else x[:1])  # load kernels
        rss0 = _rss_bytes()
        # one-call samples after a warm-up forward, which alone is the timing when it takes long_s or more
        timing = time_call(lambda: model(x), min_run_time=0.0, min_samples=spec["repeats"],
                           max_seconds=spec["budget_s"], long_call_s=spec["long_s"])
        res["rss_peak_infer_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    res.update(times_s=timing.samples, median_s=timing.median_s, warmup_s=timing.warmup_s,
               throughput=spec["batch"] / timing.median_s, threads=torch.get_num_threads())
    if spec["fused"] == "onednn":  # the patched forwards have no fake-tensor kernels: measure unpatched
        model = _build(spec["name"], spec["size"], True).eval()
    peaks = _tensor_peaks(model, spec["batch"], spec["size"])
    res["tensor_peak_infer_bytes"], res["tensor_peak_train_bytes"] = peaks["infer"], peaks["train"]
    return res


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------
def machine() -> dict:
    import timm
    import torch

    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return dict(cpu=cpu, logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, timm=timm.__version__, python=platform.python_version(),
                platform=platform.platform(), load_avg_start=os.getloadavg(),
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))


def run_worker(spec: dict) -> dict:
    env = dict(os.environ)
    # On a shared, oversubscribed machine spinning OpenMP workers wait for descheduled peers at
    # every barrier (observed: 5-20x slowdowns); passive waiting yields instead. Same for all models.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if spec["fused"] is not None:
        env["TIMM_FUSED_ATTN"] = "1" if spec["fused"] else "0"  # "onednn" → fused SDPA
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mib(b):
    return b / 2 ** 20


def write_report(rows: list, info: dict, out: Path, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(machine=info, command=cmd, rows=rows), indent=2))
    write_csv(out / "results.csv", [_csv_row(r) for r in rows])
    by = {(r["model"], r["size"]): r for r in rows}
    sizes = sorted({r["size"] for r in rows})
    (out / "results.md").write_text("\n".join(_report_lines(by, sizes, info, cmd) + _goal_lines(by, max(sizes)))
                                    + "\n")
    _plot(by, sizes, rows[0]["batch"], info, out / "weightformer.png")


def _csv_row(r: dict) -> dict:
    return {"model": r["model"], "size": r["size"], "batch": r["batch"], "throughput": f"{r['throughput']:.4f}",
            "median_s": f"{r['median_s']:.4f}", "n_timed": len(r["times_s"]),
            "rss_peak_infer_mib": f"{_mib(r['rss_peak_infer_bytes']):.1f}",
            "tensor_peak_infer_mib": f"{_mib(r['tensor_peak_infer_bytes']):.1f}",
            "tensor_peak_train_mib": f"{_mib(r['tensor_peak_train_bytes']):.1f}"}


def _report_lines(by: dict, sizes: list, info: dict, cmd: str) -> list:
    """The header of ``results.md`` and its table, a row per (size, model)."""
    wf = "WeightFormer-T"
    lines = [
        "# WeightFormer-T vs DeiT-T, CPU inference",
        "",
        f"Command: `{cmd}`",
        "",
        f"Machine: {info['cpu']}, {info['logical_cpus']} logical CPUs, torch {info['torch']} "
        f"({info['torch_threads']} threads, OMP_WAIT_POLICY={info['omp_wait_policy']}), timm {info['timm']}, "
        f"Python {info['python']}. "
        f"Load average at start {tuple(round(v, 1) for v in info['load_avg_start'])}, "
        f"at end {tuple(round(v, 1) for v in info['load_avg_end'])} (a shared machine: other jobs ran "
        f"concurrently, so absolute times are noisy).",
        "",
        "Throughput: images/s, float32, eval, `torch.no_grad()`, median of timed runs (n). RSS: peak resident "
        "set growth while the forwards ran. Tensors: peak live tensor bytes (MemTracker under "
        "FakeTensorMode), inference and forward+backward, same batch.",
        "",
    ]
    header = ["size", "tokens", "model", "batch", "img/s", "n", "WF speed-up", "RSS peak MiB",
              "tensor peak MiB (inference)", "WF / model (tensors)", "tensor peak MiB (fwd+bwd)"]
    cells = []
    for s in sizes:
        for label in (m for m in MODELS if (m, s) in by):
            r, w = by[(label, s)], by.get((wf, s))
            speed = f"{w['throughput'] / r['throughput']:.2f}×" if w and label != wf else "—"
            mem = (f"{100 * w['tensor_peak_infer_bytes'] / r['tensor_peak_infer_bytes']:.1f}%"
                   if w and label != wf else "—")
            cells.append([f"{s}²", (s // 16) ** 2, label, r["batch"], f"{r['throughput']:.3f}", len(r["times_s"]),
                          speed, f"{_mib(r['rss_peak_infer_bytes']):.0f}", f"{_mib(r['tensor_peak_infer_bytes']):.0f}",
                          mem, f"{_mib(r['tensor_peak_train_bytes']):.0f}"])
    return lines + [markdown_table(header, cells)]


def _goal_lines(by: dict, top: int) -> list:
    """The goals at the largest size, when every model ran there."""
    if not all((m, top) in by for m in MODELS):
        return []
    w, f_, n_ = by[("WeightFormer-T", top)], by[("DeiT-T (fused SDPA)", top)], by[("DeiT-T (non-fused)", top)]

    def ratio(a, b, kind):
        return a[f"{kind}_peak_infer_bytes"] / b[f"{kind}_peak_infer_bytes"]
    return [
        "",
        f"## Goals at {top}²",
        "",
        f"- throughput WF-T / DeiT-T: **{w['throughput'] / f_['throughput']:.2f}×** vs fused SDPA, "
        f"**{w['throughput'] / n_['throughput']:.2f}×** vs non-fused (goal ≥ 5×).",
        f"- peak inference memory WF-T / DeiT-T non-fused: tensors **{100 * ratio(w, n_, 'tensor'):.1f}%**, "
        f"RSS {100 * ratio(w, n_, 'rss'):.1f}% (goal ≤ 10%).",
        f"- peak inference memory WF-T / DeiT-T fused SDPA: tensors **{ratio(w, f_, 'tensor'):.2f}×**, "
        f"RSS {ratio(w, f_, 'rss'):.2f}× (goal ≤ 1×).",
    ]


def _plot(by: dict, sizes: list, batch: int, info: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label in MODELS:
        pts = [by[(label, s)] for s in sizes if (label, s) in by]
        if not pts:
            continue
        xs = [p["size"] for p in pts]
        axes[0].plot(xs, [p["throughput"] for p in pts], "o-", label=label)
        axes[1].plot(xs, [_mib(p["tensor_peak_infer_bytes"]) for p in pts], "o-", label=label)
        axes[2].plot(xs, [_mib(p["tensor_peak_train_bytes"]) for p in pts], "o-", label=label)
    titles = ["inference throughput (img/s)", "peak inference memory (MiB, tensors)",
              "peak fwd+bwd memory (MiB, tensors)"]
    for ax, t in zip(axes, titles):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{s}²" for s in sizes])
        ax.set_xlabel("image size")
        ax.set_title(t)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"WeightFormer-T vs DeiT-T, batch {batch}, {info['cpu']}, "
                 f"{info['torch_threads']} threads, torch {info['torch']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def digits_check(out: Path, epochs: int = 6, seed: int = 0) -> dict:
    """Train ``weightformer_nano_patch4_32`` on scikit-learn's 8×8 digits (upsampled to 32², 1437 train /
    360 val, stratified) for a few epochs; writes ``digits.json`` with the validation accuracy."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import vitmix

    torch.manual_seed(seed)
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=32, mode="bilinear", align_corners=False)
    x = (x - 0.5) / 0.5
    y = torch.tensor(d.target)
    tr, va = train_test_split(np.arange(len(y)), test_size=0.2, stratify=d.target, random_state=seed)
    model = vitmix.create_model("weightformer_nano_patch4_32", in_chans=1, num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    steps = epochs * ((len(tr) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.15)
    history = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        perm = torch.tensor(tr)[torch.randperm(len(tr))]
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            loss = F.cross_entropy(model(x[idx]), y[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            acc = (model(x[va]).argmax(1) == y[va]).float().mean().item()
        history.append(dict(epoch=epoch + 1, val_acc=acc, train_loss=loss.item()))
        print(f"digits epoch {epoch + 1}: val acc {acc:.4f}", flush=True)
    res = dict(model="weightformer_nano_patch4_32", epochs=epochs, batch=64, lr=1e-3,
               optimizer="AdamW wd 0.05, one-cycle",
               val_acc=history[-1]["val_acc"], history=history, seconds=time.perf_counter() - t0,
               torch_threads=torch.get_num_threads())
    out.mkdir(parents=True, exist_ok=True)
    (out / "digits.json").write_text(json.dumps(res, indent=2))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[224, 448, 896, 1248])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs at most (after a warm-up)")
    ap.add_argument("--budget-s", type=float, default=20.0, help="stop timing a config after this long")
    ap.add_argument("--long-s", type=float, default=15.0,
                    help="a warm-up forward longer than this is used as the single timing")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--out", type=Path, default=None,
                    help=f"output folder (default {DEFAULT_OUT}/<machine>; --digits-check: {DEFAULT_OUT})")
    ap.add_argument("--digits-check", action="store_true",
                    help="instead: train weightformer_nano_patch4_32 on 8x8 digits (32²) and report val accuracy")
    ap.add_argument("--replot", action="store_true", help="rewrite the report and plot from --out/results.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.digits_check:
        digits_check(args.out or DEFAULT_OUT)
        return 0
    if args.out is None:
        from vitmix.bench.env import machine_tag  # imports torch: only here, not in the workers' parent

        args.out = DEFAULT_OUT / machine_tag()
    if args.replot:  # rebuild results.md / .csv / .png from an existing results.json
        saved = json.loads((args.out / "results.json").read_text())
        write_report(saved["rows"], saved["machine"], args.out, saved["command"])
        return 0
    for s in args.sizes:
        if s % 16:
            ap.error(f"size {s} is not a multiple of the patch size 16")
    info = machine()
    cmd = ("python experiments/weightformer/weightformer.py "
           + " ".join(argv if argv is not None else sys.argv[1:]))
    rows = []
    for s in args.sizes:
        for label in args.models:
            name, fused = MODELS[label]
            spec = dict(model=label, name=name, fused=fused, size=s, batch=args.batch, repeats=args.repeats,
                        budget_s=args.budget_s, long_s=args.long_s)
            t = time.perf_counter()
            r = run_worker(spec)
            rows.append(r)
            print(f"{label:22s} {s:5d}²  {r['throughput']:8.3f} img/s  (n={len(r['times_s'])}, "
                  f"rss {_mib(r['rss_peak_infer_bytes']):7.0f} MiB, "
                  f"tensors {_mib(r['tensor_peak_infer_bytes']):7.0f} / "
                  f"{_mib(r['tensor_peak_train_bytes']):7.0f} MiB)  [{time.perf_counter() - t:.0f}s]", flush=True)
    info["load_avg_end"] = os.getloadavg()
    write_report(rows, info, args.out, cmd.strip())
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
