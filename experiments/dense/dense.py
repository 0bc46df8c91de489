"""Dense-prediction comparison: segmentation at 128² and 256², detection at 256², five backbones.

One pyramid (widths 16/32/80/128, depths 1/1/2/1) with the Laplacian, SOFT and softmax mixers, WeightFormer-Nano,
and a ResNet-18-FPN baseline (timm's ``resnet18``, torchvision's ResNet-18 architecture, untrained like the
others), each trained with the same recipe per task through ``vitmix dense train`` on fashion-scenes, two seeds.
Then the costs, measured apart from training, one backbone per fresh process: the backbone's forward GFLOPs
per image, the backbone's peak memory in one forward+backward, and the whole task model's training img/s.

    python experiments/dense/dense.py                   # what is missing: costs, then the training runs
    python experiments/dense/dense.py --costs-only      # remeasure the costs (on a quiet machine), train nothing
    python experiments/dense/dense.py --report-only     # rewrite the table from what is there
    python experiments/dense/dense.py --quick           # smoke version, into runs/dense-bench-quick/
    python experiments/dense/dense.py --jobs 8          # eight runs at a time, each its own process (a GPU machine)
    python experiments/dense/dense.py --backbones laplacian-4x4 --tasks segment-128,segment-256 \
        --out experiments/dense/results/landmarks-4x4    # a study backbone (EXTRA_BACKBONES), its own table

On a GPU lease, put the detection runs first (``--tasks detect-256`` in one call): they take the longest.

Runs go to ``<runs-dir>/<task>-<size>/<backbone>/seed-<k>`` (default ``runs/dense-bench``): a finished run (its
``summary.json``) is read back, an interrupted one continued with ``--resume``; a run whose folder is absent
(a fresh checkout) but whose result the committed ``dense.json`` holds with the same recipe is read back from
there, not retrained. Costs are cached in ``<runs-dir>/costs/``. Results, rewritten after every run:
``dense.md`` (table, goals, recipe, machine), ``dense.csv``, ``dense.json``, ``dense.png`` in ``--out``
(default ``experiments/dense/results``).
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from vitmix._util import markdown_table
from vitmix.bench.env import environment, load_average

ROOT = Path(__file__).resolve().parent
#: label: (--model, --mixer); the first four share one pyramid's widths/depths (softmax: LaplacianFormer's
#: pre-norm pyramid with softmax in all four stages; soft: SOFT's own, post-norm, softmax in stage 4)
BACKBONES = {
    "laplacian": ("laplacianformer_nano", None),
    "soft": ("soft_nano", None),
    "weightformer": ("weightformer_nano", None),
    "softmax": ("laplacianformer_nano", "softmax"),
    "resnet18": ("resnet18", None),
}
#: backbones outside the default set, for studies written to their own --out (they use the same recipes):
#: label: (--model, --mixer, mixer options). `laplacian-4x4`: LaplacianFormer with a fixed 4×4 landmark grid
#: in every stage, the O(N) alternative to the default stride-block rule (docs/dense.md, the cost goal)
EXTRA_BACKBONES = {
    "laplacian-4x4": ("laplacianformer_nano", None, {"num_landmarks": 16}),
}
LINEAR = ("laplacian", "soft", "weightformer", "laplacian-4x4")
TASKS = ("segment-128", "segment-256", "detect-256")
#: one recipe per task for every backbone (AdamW, 1 warm-up epoch then cosine, weight decay 0.05, clip 1:
#: the runner's defaults). Sized from measured steps (OMP_NUM_THREADS=1 on a loaded 2-core machine): a
#: 128² segmentation run takes ~5 min for the nano backbones and ~14 min for ResNet-18
RECIPES = {
    "segment": dict(train_scenes=1000, val_scenes=200, epochs=6, batch_size=16, lr=1e-3),
    "detect": dict(train_scenes=500, val_scenes=100, epochs=6, batch_size=8, lr=1e-3),
}
QUICK = dict(train_scenes=8, val_scenes=4, epochs=1, batch_size=4)
#: the validation numbers tabulated per task (fractions in dense.json, shown in %)
METRICS = {"segment": ("mIoU",), "detect": ("box_AP", "mask_AP")}
METRIC_NAMES = {"mIoU": "mIoU", "box_AP": "box AP", "mask_AP": "mask AP"}
#: a linear backbone's cost may grow at most this much when the pixels grow 4× (128² → 256²)
GROWTH_LIMIT = 4.5
RSS_METHOD = ("the rise of the peak RSS (VmHWM, reset through /proc/self/clear_refs) above the RSS before the call, "
              "with weights, gradients and input already allocated, in a fresh process with glibc's mmap threshold "
              "fixed (MALLOC_MMAP_THRESHOLD_=131072, so freed buffers leave the RSS), after a batch-1 warm-up: "
              "everything the real compute path touches (activations, temporaries, kernel workspaces)")


class Run(NamedTuple):
    key: str          # "segment-128"
    task: str
    size: int
    backbone: str
    seed: int
    run_dir: Path
    recipe: dict


# ----------------------------------------------------------------------------------------------
# plan and training
# ----------------------------------------------------------------------------------------------
def parse_task(key: str):
    task, _, size = key.rpartition("-")
    if task not in RECIPES or not size.isdigit() or int(size) < 64 or int(size) % 32:
        raise SystemExit(f"--tasks: {key!r} is not TASK-SIZE with TASK segment or detect and SIZE a multiple of "
                         "32, at least 64 (smaller maps leave the coarsest level 1×1)")
    return task, int(size)


def recipe(task: str, args) -> dict:
    r = dict(RECIPES[task], **(QUICK if args.quick else {}))
    r["train_scenes"] = max(r["batch_size"], round(r["train_scenes"] * args.scale))
    r["max_steps"] = args.max_steps
    return r


def plan(args) -> list:
    """Every run, seed-major (all of seed 0 first), so that an interrupted sweep covers every cell once."""
    runs = []
    for seed in args.seeds:
        for key in args.tasks:
            task, size = parse_task(key)
            for b in args.backbones:
                runs.append(Run(key, task, size, b, seed, args.runs_dir / key / b / f"seed-{seed}", recipe(task, args)))
    return runs


def finished(run: Run) -> Optional[dict]:
    """The run's summary.json when it finished its recipe (the runner's own stopping rule), else None."""
    path = run.run_dir / "summary.json"
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    r = run.recipe
    done = s.get("epochs_run") == r["epochs"] or (r["max_steps"] is not None and s.get("steps", 0) >= r["max_steps"])
    return s if done else None


def backbone_spec(label: str) -> tuple:
    """``(model, mixer, mixer options)`` of a backbone label."""
    if label in EXTRA_BACKBONES:
        return EXTRA_BACKBONES[label]
    return (*BACKBONES[label], {})


def backbone_flags(label: str) -> str:
    """The ``vitmix dense train`` flags that select a backbone label."""
    model, mixer, options = backbone_spec(label)
    return " ".join([f"--model {model}", *([f"--mixer {mixer}"] if mixer else []),
                     *(f"-M {k}={v}" for k, v in options.items())])


def train_argv(run: Run, args, resume: bool) -> list:
    model, mixer, options = backbone_spec(run.backbone)
    r = run.recipe
    argv = ["dense", "train", "--task", run.task, "--model", model, "--img-size", str(run.size),
            "--train-scenes", str(r["train_scenes"]), "--val-scenes", str(r["val_scenes"]),
            "--epochs", str(r["epochs"]), "--batch-size", str(r["batch_size"]), "--lr", str(r["lr"]),
            "--seed", str(run.seed), "--out", str(run.run_dir), "--preview", "1" if args.quick else "4"]
    argv += ["--mixer", mixer] if mixer else []
    argv += [arg for k, v in options.items() for arg in ("-M", f"{k}={v}")]
    argv += ["--max-steps", str(r["max_steps"])] if r["max_steps"] is not None else []
    argv += ["--device", args.device] if args.device else []
    argv += ["--data-dir", str(args.data_dir)] if args.data_dir else []
    return argv + (["--resume"] if resume else [])


def train(run: Run, args, index: int, total: int) -> bool:
    """Train (or continue) one run through ``vitmix dense train``; False when it failed."""
    from vitmix.cli import main as vitmix

    resume = (run.run_dir / "config.yaml").is_file()
    print(f"[{index}/{total}] {run.key} {run.backbone} seed {run.seed}: {'resuming' if resume else 'training'} "
          f"→ {run.run_dir}", flush=True)
    t0 = time.perf_counter()
    rc = vitmix(train_argv(run, args, resume))
    if rc == 130:
        raise KeyboardInterrupt
    print(f"[{index}/{total}] {run.key} {run.backbone} seed {run.seed}: "
          + ("done" if rc == 0 else f"FAILED (exit {rc}, see above)") + f" in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return rc == 0


def launch(run: Run, args) -> subprocess.Popen:
    """Start one run as its own ``python -m vitmix dense train`` process (``--jobs`` > 1), its output in
    ``<run_dir>.log``; each process gets ``--threads`` (or this machine's cores) divided by the jobs."""
    resume = (run.run_dir / "config.yaml").is_file()
    run.run_dir.parent.mkdir(parents=True, exist_ok=True)
    threads = max(1, (args.threads or os.cpu_count() or 1) // args.jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TQDM_DISABLE="1")
    log = open(run.run_dir.with_suffix(".log"), "a")
    return subprocess.Popen([sys.executable, "-m", "vitmix", *train_argv(run, args, resume)], stdout=log,
                            stderr=subprocess.STDOUT, env=env)


def train_parallel(todo: list, args, on_done) -> list:
    """Train ``todo`` with ``args.jobs`` runs at a time (a GPU, or a machine with many cores); calls
    ``on_done()`` after each run; returns the failed runs' labels."""
    waiting, running, failed = list(todo), [], []
    try:
        while waiting or running:
            while waiting and len(running) < args.jobs:
                run = waiting.pop(0)
                print(f"{run.key} {run.backbone} seed {run.seed}: started → {run.run_dir} (log: "
                      f"{run.run_dir.with_suffix('.log')})", flush=True)
                running.append((run, launch(run, args), time.perf_counter()))
            for item in [r for r in running if r[1].poll() is not None]:
                running.remove(item)
                run, proc, t0 = item
                ok = proc.returncode == 0
                print(f"{run.key} {run.backbone} seed {run.seed}: " + ("done" if ok else f"FAILED (exit "
                      f"{proc.returncode}, see its log)") + f" in {time.perf_counter() - t0:.0f} s", flush=True)
                if not ok:
                    failed.append(f"{run.key}/{run.backbone}/seed-{run.seed}")
                on_done()
            time.sleep(0.5)
    finally:      # interrupted: stop the runs (each resumes from its last epoch next time)
        for _, proc, _ in running:
            proc.terminate()
    return failed


def committed_results(out: Path) -> tuple:
    """What the committed dense.json of ``out`` holds (run folders and the cost cache are not in git):
    ``{(key, backbone, seed): record}`` of its finished runs, ``{backbone: costs}`` and the command and
    environment that trained them (``{}`` when there is no dense.json)."""
    path = out / "dense.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    runs = {(r["key"], r["backbone"], r["seed"]): r for r in data.get("runs", [])
            if r["status"] in ("done", "committed")}
    costs = {b: c for b, c in (data.get("costs") or {}).items() if c and "error" not in c}
    return runs, costs, {k: data[k] for k in ("command", "environment") if k in data}


def _fraction(summary: dict, metric: str):
    """A run's final ``metric`` as the fraction dense.json stores: runs write mIoU in percent now (their
    summary.json's ``units`` says so); the committed runs, and COCO AP, are fractions."""
    value = summary["final"].get(metric)
    return value / 100 if value is not None and summary.get("units", {}).get(metric) == "%" else value


def run_record(run: Run, committed: dict) -> dict:
    """What is known of a run: its finished summary; else, when its folder holds no run, the committed value
    (same recipe); else nothing."""
    base = {"key": run.key, "backbone": run.backbone, "seed": run.seed, "run_dir": run.run_dir.as_posix(),
            "recipe": run.recipe}
    summary = finished(run)
    if summary is not None:
        return dict(base, status="done", final={k: _fraction(summary, k) for k in METRICS[run.task]},
                    train_seconds=summary["train_seconds"], device=summary.get("device"))
    if (run.run_dir / "config.yaml").is_file():       # begun here: continued, whatever was committed
        return dict(base, status="interrupted", final={})
    old = committed.get((run.key, run.backbone, run.seed))
    if old is not None and old["recipe"] == run.recipe:
        return dict(old, status="committed")
    return dict(base, status="missing", final={})


# ----------------------------------------------------------------------------------------------
# costs: one fresh process per backbone
# ----------------------------------------------------------------------------------------------
def cost_spec(backbone: str, args) -> dict:
    tasks = {key: recipe(parse_task(key)[0], args)["batch_size"] for key in args.tasks}
    return {"backbone": backbone, "sizes": sorted({parse_task(k)[1] for k in args.tasks}), "tasks": tasks,
            "memory_batch": args.memory_batch, "device": args.device, "threads": args.threads,
            "data_dir": str(args.data_dir) if args.data_dir else None, "quick": args.quick}


def cached_costs(backbone: str, args, committed: dict) -> Optional[dict]:
    """The costs measured before with the same settings: in the cache, else in the committed dense.json."""
    path = args.runs_dir / "costs" / f"{backbone}.json"
    costs = json.loads(path.read_text()) if path.is_file() else committed.get(backbone) or {}
    return costs if costs.get("spec") == cost_spec(backbone, args) else None


def measure_costs(backbone: str, args) -> dict:
    """Run the cost worker for ``backbone`` in a fresh Python process and cache its result."""
    spec = cost_spec(backbone, args)
    print(f"costs of {backbone}: measuring (fresh process)", flush=True)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--cost-worker", json.dumps(spec)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
        print(f"costs of {backbone}: FAILED: {tail[0]}", flush=True)
        return {"spec": spec, "error": tail[0]}
    costs = dict(json.loads(proc.stdout.strip().splitlines()[-1]), spec=spec)
    path = args.runs_dir / "costs" / f"{backbone}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(costs, indent=2) + "\n")
    return costs


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (Linux ≥ 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def backbone_memory(body, size: int, batch: int, device) -> tuple:
    """Peak MiB of one forward+backward of the backbone at ``batch``, and the method's name."""
    from vitmix.bench.memory import peak_memory

    def step(x):
        sum(m.float().sum() for m in body(x).values()).backward()
        body.zero_grad(set_to_none=False)   # gradients stay allocated, in the baseline like the weights

    step(torch.randn(1, 3, size, size, device=device))     # warm-up: kernels, thread pools, caches, gradients
    gc.collect()
    x = torch.randn(batch, 3, size, size, device=device)
    if device.type == "cuda" or not _reset_peak_rss():
        result = peak_memory(lambda: step(x), device, track=[body, x])
        return (None if result.peak_bytes is None else result.peak_bytes / 2 ** 20), result.method
    peaks = []
    for _ in range(2):      # the two agree within ~1 % with the fixed mmap threshold; keep the larger
        gc.collect()
        _reset_peak_rss()
        base = _rss_kib("VmRSS")
        step(x)
        peaks.append((_rss_kib("VmHWM") - base) / 1024)
    return max(peaks), RSS_METHOD


def backbone_gflops(body, size: int, device) -> float:
    """Forward GFLOPs of the backbone on one image (vitmix's FlopCounterMode; 1 MAC = 2 FLOPs)."""
    from vitmix.bench.flops import count_flops

    one = torch.randn(1, 3, size, size, device=device)
    body.eval()
    with torch.no_grad():
        flops = count_flops(lambda: body(one)).total
    body.train()
    return flops / 1e9


def train_speed(key: str, backbone: str, batch: int, spec: dict, device) -> float:
    """Images/s of one training step of the whole task model (forward, loss, backward, clip, AdamW step)
    at the recipe's batch, on real scenes; median of timed steps after a warm-up."""
    import torch.nn.functional as F

    from vitmix.bench.timing import time_call
    from vitmix.dense.config import DenseConfig
    from vitmix.dense.runner import IGNORE_INDEX, META_TASK, build_data, build_dense_model
    from vitmix.dense.scenes import detection_collate, segmentation_collate

    task, size = parse_task(key)
    model_name, mixer, options = backbone_spec(backbone)
    data, _, num_classes, _ = build_data(DenseConfig(task=task, img_size=size, train_scenes=batch, val_scenes=1,
                                                     data_dir=spec["data_dir"]))
    items = [data[i] for i in range(batch)]
    torch.manual_seed(0)
    model = build_dense_model({"task": META_TASK[task], "model": model_name, "mixer": mixer, "num_classes": num_classes,
                               "img_size": size, "masks": True, "mixer_options": options}).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    if task == "segment":
        images, semantic = (t.to(device) for t in segmentation_collate(items))

        def loss():
            return F.cross_entropy(model(images), semantic, ignore_index=IGNORE_INDEX)
    else:
        images, targets = detection_collate(items)
        images = [im.to(device) for im in images]
        targets = [{k: v.to(device) for k, v in t.items() if torch.is_tensor(v) and k != "semantic"} for t in targets]

        def loss():
            return sum(model(images, targets).values())

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    # --quick: the warm-up step alone is the sample (a smoke test, not a measurement)
    timed = time_call(step, device=device, min_run_time=1.0, min_samples=3, long_call_s=0.0 if spec["quick"] else None)
    return batch / timed.median_s


def cost_worker(spec: dict) -> dict:
    """Everything measured for one backbone (run in a fresh process: the memory figures need one)."""
    from vitmix.dense.heads import DenseBackbone

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    model_name, mixer, options = backbone_spec(spec["backbone"])
    sizes, method = {}, None
    for size in spec["sizes"]:       # memory first, before anything else has grown the process
        torch.manual_seed(0)
        body = DenseBackbone(model_name, img_size=size, mixer=mixer, mixer_options=options or None).to(device).train()
        peak, method = backbone_memory(body, size, spec["memory_batch"], device)
        sizes[str(size)] = {"params": sum(p.numel() for p in body.parameters()), "peak_mib": peak,
                            "gflops": backbone_gflops(body, size, device)}
        del body
    speed = {key: train_speed(key, spec["backbone"], batch, spec, device) for key, batch in spec["tasks"].items()}
    return {"sizes": sizes, "train_images_per_s": speed, "memory_method": method,
            "torch_threads": torch.get_num_threads(), "device": str(device),
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average_1m": load_average()}


# ----------------------------------------------------------------------------------------------
# table, goals, files
# ----------------------------------------------------------------------------------------------
def aggregate(records: list, key: str, backbone: str, metric: str, planned: int) -> dict:
    values = {r["seed"]: r["final"][metric] for r in records if r["key"] == key and r["backbone"] == backbone
              and r["final"].get(metric) is not None}
    vals = [100 * v for v in values.values()]
    return {"mean": statistics.fmean(vals) if vals else None, "std": statistics.stdev(vals) if len(vals) > 1 else None,
            "n": len(vals), "planned": planned, "per_seed": {s: 100 * v for s, v in sorted(values.items())}}


def build_rows(records: list, costs: dict, args) -> list:
    """One row per backbone: quality per task and metric, costs per size and task, growth lo² → hi²."""
    lo, hi = _size_range(args)
    rows = []
    for b in args.backbones:
        model, mixer, _ = backbone_spec(b)
        c = costs.get(b) or {}
        at = c.get("sizes", {})
        row = {"backbone": b, "model": model, "mixer": mixer or "default",
               "params_m": at[str(lo)]["params"] / 1e6 if str(lo) in at else None,
               "quality": {f"{k}_{m}": aggregate(records, k, b, m, len(args.seeds))
                           for k in args.tasks for m in METRICS[parse_task(k)[0]]},
               "gflops": {s: v["gflops"] for s, v in at.items()}, "peak_mib": {s: v["peak_mib"] for s, v in at.items()},
               "train_images_per_s": c.get("train_images_per_s", {}), "cost_error": c.get("error")}
        for what in ("gflops", "peak_mib"):
            a, z = row[what].get(str(lo)), row[what].get(str(hi))
            row[f"{what}_ratio"] = z / a if a and z is not None and hi != lo else None
        rows.append(row)
    return rows


def _size_range(args) -> tuple:
    sizes = [parse_task(k)[1] for k in args.tasks]
    return min(sizes), max(sizes)


def goals(rows: list, args) -> list:
    """The issue's goals that the selected backbones and tasks allow: (verdict, text) pairs."""
    lo, hi = _size_range(args)
    limit = GROWTH_LIMIT * (hi / lo) ** 2 / 4
    by = {r["backbone"]: r for r in rows}
    out = []
    if hi != lo:
        for b in (b for b in LINEAR if b in by):
            for what, name in (("gflops", "backbone FLOPs"), ("peak_mib", "backbone peak memory")):
                ratio = by[b][f"{what}_ratio"]
                verdict = None if ratio is None else ratio <= limit
                growth = "not measured" if ratio is None else f"×{ratio:.2f}"
                out.append((verdict, f"{b}: {name} {growth} from {lo}² to {hi}² (goal ≤ {limit:.3g}×)"))
    pairs = [("laplacian", "soft", "mIoU"), ("laplacian", "soft", "box_AP"), ("weightformer", "softmax", "mIoU")]
    for a, b, metric in pairs:
        if a not in by or b not in by:
            continue
        for key in (k for k in args.tasks if metric in METRICS[parse_task(k)[0]]):
            qa, qb = by[a]["quality"][f"{key}_{metric}"], by[b]["quality"][f"{key}_{metric}"]
            out.append(_compare(a, b, metric, key, qa, qb))
    return out


def _compare(a: str, b: str, metric: str, key: str, qa: dict, qb: dict) -> tuple:
    text = f"{a} ≥ {b} on {METRIC_NAMES[metric]}, {key.replace('-', ' ')}²"
    if qa["mean"] is None or qb["mean"] is None:
        return None, text
    margin = qa["mean"] - qb["mean"]
    noise = max(qa["std"] or 0.0, qb["std"] or 0.0)
    shown = f"{margin:+.1f}" if round(margin, 1) else "0.0"
    notes = [f"{qa['mean']:.1f} vs {qb['mean']:.1f}, margin {shown} points"]
    if abs(margin) < noise:
        notes.append("within one seed std")
    if qa["n"] < qa["planned"] or qb["n"] < qb["planned"]:
        notes.append(f"partial: {qa['n']}/{qa['planned']} and {qb['n']}/{qb['planned']} seeds")
    return margin >= 0, f"{text} ({'; '.join(notes)})"


def _pm(q: dict) -> str:
    if q["mean"] is None:
        return "–"
    cell = f"{q['mean']:.1f} ± {q['std']:.1f}" if q["std"] is not None else f"{q['mean']:.1f}"
    return cell + (f" ({q['n']}/{q['planned']} seeds)" if q["n"] < q["planned"] else "")


def _growth(values: dict, ratio, lo: int, hi: int, fmt: str) -> str:
    a, z = values.get(str(lo)), values.get(str(hi))
    if a is None:
        return "–"
    if hi == lo or z is None:
        return format(a, fmt)
    return f"{format(a, fmt)} → {format(z, fmt)} (×{ratio:.2f})"


def table(rows: list, args) -> str:
    lo, hi = _size_range(args)
    quality_cols = [(k, m) for k in args.tasks for m in METRICS[parse_task(k)[0]]]
    sizes = f"{lo}² → {hi}²" if hi != lo else f"{lo}²"
    header = (["backbone", "params (M)"] + [f"{k.replace('-', ' ')}² {METRIC_NAMES[m]}" for k, m in quality_cols]
              + [f"backbone GFLOPs {sizes}", f"backbone peak MiB {sizes}",
                 "train img/s (" + ", ".join(k.replace('-', ' ') + "²" for k in args.tasks) + ")"])
    cells = []
    for r in rows:
        speed = [r["train_images_per_s"].get(k) for k in args.tasks]
        cells.append([f"{r['backbone']}" + (" †" if r["cost_error"] else ""),
                      "–" if r["params_m"] is None else f"{r['params_m']:.2f}"]
                     + [_pm(r["quality"][f"{k}_{m}"]) for k, m in quality_cols]
                     + [_growth(r["gflops"], r["gflops_ratio"], lo, hi, ".3g"),
                        _growth(r["peak_mib"], r["peak_mib_ratio"], lo, hi, ".0f"),
                        " / ".join("–" if s is None else f"{s:.1f}" for s in speed)])
    return markdown_table(header, cells)


def report(rows, records, costs, goal_list, args, env: dict, cmd: str) -> str:
    lo, _ = _size_range(args)
    verdict = {True: "holds", False: "**fails**", None: "not measured"}
    counts = {v: sum(1 for g, _ in goal_list if g is v) for v in (True, False, None)}
    measured = next((c for c in costs.values() if c and "memory_method" in c), None)
    done = sum(1 for r in records if r["status"] in ("done", "committed"))
    script = Path(os.path.relpath(Path(__file__).resolve(), Path(args.out).resolve())).as_posix()
    lines = [
        "# Dense prediction on fashion-scenes: nano backbones and a ResNet-18-FPN baseline", "",
        f"Produced by `{cmd}` ([experiments/dense/dense.py]({script}), see docs/dense.md); {done} of "
        f"{len(records)} runs finished. {env['cpu']} ({env['cpu_count']} cores), torch {env['torch']} "
        f"({env['torch_threads']} threads), timm {env['timm']}, vitmix {env['vitmix']}, {env['date_utc']}; "
        f"1-minute load average {env['load_average_1m']} at the start"
        + (f", {env['load_average_end_1m']} at the end." if env.get("load_average_end_1m") is not None else ".")
        + _devices_line(records), "",
        table(rows, args), "",
        f"- **Quality**: final-epoch validation mIoU (Semantic FPN) and COCO box / mask AP (Mask R-CNN), in %, "
        f"mean ± sample std over seeds {', '.join(map(str, args.seeds))} (all runs of a task see the same "
        "validation scenes); per-seed values under *Runs*.",
        "- **Costs** (measured apart from training, one backbone per fresh process"
        + (f", {measured['date_utc']}, {measured['device']}, {measured['torch_threads']} threads, load average "
           f"{measured['load_average_1m']}" if measured else "") + "): the backbone alone (no FPN, no head). "
        "GFLOPs: one forward of one image, vitmix's FlopCounterMode count (1 multiply-accumulate = 2 FLOPs; matmul, "
        f"conv, attention only). Peak MiB: one forward+backward at batch {args.memory_batch}, "
        + (measured["memory_method"] if measured else "not measured") + ". Train img/s: one training step of the "
        "whole task model (forward, loss, backward, clip, AdamW) at the recipe's batch on real scenes, median "
        "after a warm-up — wall time, so it moves with the machine's load.",
        f"- params: the backbone's at {lo}² (the pyramids' position embeddings grow with the input)."
        + (" † the cost pass of that backbone failed (dense.json has the message)."
           if any(r["cost_error"] for r in rows) else ""), "",
        "## Goals", "",
        f"{counts[True]} hold, {counts[False]} fail, {counts[None]} not measured.", ""]
    lines += [f"- {verdict[v]} — {text}" for v, text in goal_list]
    lines += ["", "## Recipe", "", recipe_table(args), "",
              "Backbones: " + "; ".join(f"`{b}` = `{backbone_flags(b)}`" for b in args.backbones) + ". "
              "Each run is one `vitmix dense train --task TASK --img-size SIZE ... --seed K --out "
              "RUNS/TASK-SIZE/BACKBONE/seed-K` (AdamW, weight decay 0.05, one warm-up epoch then cosine to 1e-5, "
              "gradient clip 1, fp32; fashion-scenes with scene seed 0).", "",
              "![dense.png](dense.png)", "", "## Runs", "", runs_table(records)]
    return "\n".join(lines) + "\n"


def recipe_table(args) -> str:
    cells = []
    for key in args.tasks:
        task, size = parse_task(key)
        r = recipe(task, args)
        cells.append([key, f"{size}²", r["train_scenes"], r["val_scenes"], r["epochs"], r["batch_size"], r["lr"],
                      r["max_steps"] if r["max_steps"] is not None else "–"])
    return markdown_table(["task", "input", "train scenes / epoch", "val scenes", "epochs", "batch", "lr",
                           "max steps"], cells)


def runs_table(records: list) -> str:
    cells = [[r["key"], r["backbone"], r["seed"], r["status"] + (" †" if r["status"] == "committed" else ""),
              ", ".join(f"{METRIC_NAMES[m]} {100 * v:.1f}" for m, v in r["final"].items() if v is not None) or "–",
              f"{r['train_seconds']:.0f}" if r.get("train_seconds") is not None else "–",
              _device_name(r.get("device"))] for r in records]
    note = "\n\n† read back from the committed dense.json (the run folder is not on this machine)."
    return markdown_table(["task", "backbone", "seed", "status", "final (%)", "train s", "trained on"], cells) + (
        note if any(r["status"] == "committed" for r in records) else "")


def _devices_line(records: list) -> str:
    """Where the finished runs were trained, when they were not all trained on one kind of device
    (a sweep resumed on another machine)."""
    counts = Counter(_device_name(r.get("device")) for r in records if r["status"] in ("done", "committed"))
    if len(counts) < 2:
        return ""
    where = ", ".join(f"{d} ({n})" for d, n in sorted(counts.items()))
    return f" Runs trained on: {where} (the *trained on* column of *Runs*)."


def _device_name(device: Optional[str]) -> str:
    """``cuda:0`` → ``cuda``; the summaries of runs trained before the device was recorded have none."""
    return device.split(":")[0] if device else "–"


def write_csv(rows: list, path: Path) -> None:
    flat = []
    for r in rows:
        row = {k: r[k] for k in ("backbone", "model", "mixer", "params_m", "gflops_ratio", "peak_mib_ratio")}
        for col, q in r["quality"].items():
            row.update({f"{col}_mean": q["mean"], f"{col}_std": q["std"], f"{col}_n": q["n"]})
        row.update({f"gflops_{s}": v for s, v in r["gflops"].items()})
        row.update({f"peak_mib_{s}": v for s, v in r["peak_mib"].items()})
        row.update({f"train_img_s_{k}": v for k, v in r["train_images_per_s"].items()})
        flat.append(row)
    fields = list(dict.fromkeys(k for row in flat for k in row))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(flat)


def plot(rows: list, args, path: Path) -> None:
    """Left: growth of backbone FLOPs and peak memory from the smallest to the largest input; right: quality."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = _size_range(args)
    names = [r["backbone"] for r in rows]
    xs = range(len(names))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (what, label) in enumerate((("gflops_ratio", "backbone FLOPs"), ("peak_mib_ratio", "backbone peak memory"))):
        left.bar([x + (i - 0.5) * 0.38 for x in xs], [r[what] or 0.0 for r in rows], width=0.38, label=label)
    left.axhline((hi / lo) ** 2, color="gray", ls=":", label=f"linear in pixels (×{(hi / lo) ** 2:.0f})")
    limit = GROWTH_LIMIT * (hi / lo) ** 2 / 4
    left.axhline(limit, color="red", ls="--", label="goal for linear backbones")
    top = max([limit] + [r[w] or 0.0 for r in rows for w in ("gflops_ratio", "peak_mib_ratio")])
    left.set(xticks=list(xs), xticklabels=names, ylabel=f"cost at {hi}² / cost at {lo}²", title="cost growth",
             ylim=(0, 1.3 * top))
    cols = [(k, m) for k in args.tasks for m in METRICS[parse_task(k)[0]] if m != "mask_AP"]
    width = 0.8 / max(len(cols), 1)
    for j, (k, m) in enumerate(cols):
        qs = [r["quality"][f"{k}_{m}"] for r in rows]
        right.bar([x + (j - (len(cols) - 1) / 2) * width for x in xs], [q["mean"] or 0.0 for q in qs], width=width,
                  yerr=[q["std"] or 0.0 for q in qs], capsize=3, label=f"{k} {METRIC_NAMES[m]}")
    right.set(xticks=list(xs), xticklabels=names, ylabel="%", title="quality (mean ± std over seeds)",
              ylim=(0, 1.3 * right.get_ylim()[1]))     # room for the legend
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(runs: list, costs: dict, args, env: dict, cmd: str, committed: dict) -> str:
    records = [run_record(r, committed) for r in runs]
    if not (args.costs_only or args.report_only):
        env["load_average_end_1m"] = load_average()
    rows = build_rows(records, costs, args)
    goal_list = goals(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(rows, records, costs, goal_list, args, env, cmd)
    (args.out / "dense.md").write_text(text)
    write_csv(rows, args.out / "dense.csv")
    recipes = {k: recipe(parse_task(k)[0], args) for k in args.tasks}
    (args.out / "dense.json").write_text(json.dumps({
        "command": cmd, "environment": env, "recipes": recipes,
        "backbones": {b: dict(zip(("model", "mixer", "mixer_options"), backbone_spec(b))) for b in args.backbones},
        "rows": rows, "goals": [{"holds": v, "goal": t} for v, t in goal_list], "costs": costs, "runs": records,
    }, indent=2, default=str) + "\n")
    plot(rows, args, args.out / "dense.png")
    return text


# ----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--backbones", default=",".join(BACKBONES),
                    help="comma-separated (default: %(default)s; also " + ", ".join(EXTRA_BACKBONES)
                    + ", for a study with its own --out)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated training seeds (default: %(default)s)")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated TASK-SIZE (default: %(default)s)")
    ap.add_argument("--runs-dir", type=Path,
                    help="run folders (default runs/dense-bench, --quick: runs/dense-bench-quick)")
    ap.add_argument("--out", type=Path, help="results (default experiments/dense/results, --quick: RUNS_DIR/results)")
    ap.add_argument("--quick", action="store_true", help=f"smoke recipe {QUICK} and short timings")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every recipe's training scenes (default 1)")
    ap.add_argument("--max-steps", type=int, help="stop every run after this many optimizer steps (smoke tests)")
    ap.add_argument("--memory-batch", type=int, default=8, help="batch of the peak-memory pass (default 8)")
    ap.add_argument("--threads", type=int, help="torch threads for training and costs (default: torch's)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs trained at once, each its own process (default 1: one at a time, in this process); "
                         "on a GPU, several small runs share it")
    ap.add_argument("--device", help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--data-dir", type=Path, help="where Fashion-MNIST is (default: where vitmix looks)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--costs-only", action="store_true", help="remeasure the costs, train nothing")
    what.add_argument("--report-only", action="store_true", help="measure and train nothing, rewrite the results")
    ap.add_argument("--cost-worker", help=argparse.SUPPRESS)    # internal: one backbone's costs, as JSON
    args = ap.parse_args(argv)
    if args.cost_worker:
        return args
    args.backbones = [b for b in args.backbones.split(",") if b]
    unknown = [b for b in args.backbones if b not in BACKBONES and b not in EXTRA_BACKBONES]
    if unknown:
        ap.error(f"--backbones: unknown {', '.join(unknown)} (choose from {', '.join([*BACKBONES, *EXTRA_BACKBONES])})")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: must be at least 1")
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.tasks = [t for t in args.tasks.split(",") if t]
    for key in args.tasks:
        parse_task(key)
    if any(parse_task(k)[0] == "detect" for k in args.tasks):   # say so now, not after the segmentation runs
        from vitmix.dense.metrics import require_pycocotools

        try:
            require_pycocotools("--tasks detect-* (COCO box/mask AP)")
        except ValueError as err:
            ap.error(f"{err}; or leave detection out: --tasks segment-128,segment-256")
    args.runs_dir = args.runs_dir or Path("runs") / ("dense-bench-quick" if args.quick else "dense-bench")
    args.out = args.out or (args.runs_dir / "results" if args.quick else ROOT / "results")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cost_worker:
        print(json.dumps(cost_worker(json.loads(args.cost_worker))))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    cmd = "python experiments/dense/dense.py " + " ".join(sys.argv[1:] if argv is None else argv)
    env = environment(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    committed, committed_costs, trained_by = committed_results(args.out)
    if (args.costs_only or args.report_only) and len(trained_by) == 2:
        # nothing trains: the header keeps the command and machine that trained (the costs line dates its own)
        cmd, env = trained_by["command"], trained_by["environment"]
    runs = plan(args)
    costs = {}
    for b in args.backbones:
        cached = cached_costs(b, args, committed_costs)
        if args.costs_only or (cached is None and not args.report_only):
            cached = measure_costs(b, args)
        costs[b] = cached
    failed = [b for b, c in costs.items() if c and "error" in c]
    todo = [] if args.costs_only or args.report_only else [
        r for r in runs if run_record(r, committed)["status"] not in ("done", "committed")]
    if args.jobs > 1:
        failed += train_parallel(todo, args, lambda: write(runs, costs, args, env, cmd, committed))
    for i, run in enumerate(todo if args.jobs == 1 else [], 1):
        if not train(run, args, i, len(todo)):
            failed.append(f"{run.key}/{run.backbone}/seed-{run.seed}")
        write(runs, costs, args, env, cmd, committed)
    print(write(runs, costs, args, env, cmd, committed))
    print(f"results in {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
