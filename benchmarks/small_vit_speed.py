"""Speed where small ViTs live: the leaderboard model and two layers, against softmax.

The leaderboard model is ``configs/fashion-mnist-196.yaml``'s: ``vit_nano_patch4_32`` at 28×28, patch 2
(196 grid tokens + CLS), width 64, 2 heads, depth 4. For each entry, in one process and alternating
rounds (every round times every entry once, so a change of machine load hits all of them alike):

* ``train``: one AdamW training step (forward, backward, update) on a batch of 64, as images/s;
* ``latency``: batch-1 inference (``eval``, ``no_grad``), ms;
* the two layer points of the issue, fwd+bwd, batch 32: N = 64 + CLS (dim 128, 4 heads) and N = 196 + CLS
  (dim 384, 6 heads).

Each figure is the median over rounds of the per-round ratio to softmax (and its range), next to the
median time. Entries are ``mixer`` or ``mixer:key=value:key=value`` (candidate options, e.g. fewer landmarks).
``--profile`` adds torch.profiler tables of one training step and of batch-1 inference of the leaderboard
model per entry: what dominates.

    python benchmarks/small_vit_speed.py --threads 2 --rounds 5 --profile
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

import vitmix
from vitmix import mixers
from vitmix.bench.env import cpu_model, machine_tag
from vitmix.bench.targets import parse_mixer_spec

DEFAULT_ENTRIES = "softmax,soft,laplacian"
MODEL = dict(img_size=28, in_chans=1, num_classes=10, patch_size=2, embed_dim=64, depth=4, num_heads=2)
OUT_DIR = Path(__file__).resolve().parent / "results" / "small_vit_speed"
LAYERS = {"layer N=64+1 dim 128 h4": (128, 4, 8), "layer N=196+1 dim 384 h6": (384, 6, 14)}


def _entry(spec: str):
    target = parse_mixer_spec(spec)
    return target.name, target.options


def _train_step(spec: str):
    name, options = _entry(spec)
    torch.manual_seed(0)
    model = vitmix.create_model("vit_nano_patch4_32", mixer=name, mixer_options=options, **MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _latency(spec: str):
    name, options = _entry(spec)
    torch.manual_seed(0)
    model = vitmix.create_model("vit_nano_patch4_32", mixer=name, mixer_options=options, **MODEL).eval()
    x = torch.randn(1, 1, 28, 28)

    def call():
        with torch.no_grad():
            model(x)
    return call


def _layer(spec: str, dim: int, heads: int, side: int):
    name, options = _entry(spec)
    torch.manual_seed(0)
    layer = mixers.create(name, dim=dim, num_heads=heads, hw=(side, side), num_prefix_tokens=1, **options)
    x = torch.randn(32, 1 + side * side, dim, requires_grad=True)

    def call():
        layer(x).sum().backward()
    return call


def _measures(spec: str) -> dict:
    calls = {"train": _train_step(spec), "latency": _latency(spec)}
    calls.update({key: _layer(spec, *shape) for key, shape in LAYERS.items()})
    for call in calls.values():
        call()   # first call: compiled kernels, caches
    return calls


def _profile(call, repeats: int, rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            call()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--entries", default=DEFAULT_ENTRIES,
                    help=f"comma-separated mixer specs (default {DEFAULT_ENTRIES}; options: mixer:key=value:...)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-run-time", type=float, default=0.5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help=f"output folder (default {OUT_DIR}/<machine>)")
    args = ap.parse_args(argv)
    args.out = args.out or OUT_DIR / machine_tag()
    specs = [e.strip() for e in args.entries.split(",") if e.strip()]
    if specs[0] != "softmax":
        specs.insert(0, "softmax")
    torch.set_num_threads(args.threads)
    calls = {spec: _measures(spec) for spec in specs}
    times = {spec: {key: [] for key in calls[spec]} for spec in specs}
    for r in range(args.rounds):
        order = specs if r % 2 == 0 else specs[::-1]
        for spec in order:
            for key, call in calls[spec].items():
                t = Timer("call()", globals={"call": call}, num_threads=args.threads)
                times[spec][key].append(t.blocked_autorange(min_run_time=args.min_run_time).median)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    keys = list(calls[specs[0]])
    lines = [f"# Small-ViT speed: the leaderboard model and two layers ({args.rounds} alternating rounds, "
             f"{args.threads} threads)", "",
             f"Command: `python benchmarks/small_vit_speed.py --entries {','.join(specs)} --threads {args.threads} "
             f"--rounds {args.rounds} --min-run-time {args.min_run_time}{' --profile' if args.profile else ''}`; "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, 1-minute load "
             f"average at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores of {cpu_model()}, torch "
             f"{torch.__version__}.",
             "Each cell: median time, then × softmax as the median (range) of per-round ratios. `train`: one AdamW "
             "step at batch 64 (img/s = 64 / time); `latency`: batch-1 inference; layers: fwd+bwd at batch 32.",
             "", "| entry | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    summary = {}
    for spec in specs:
        cells = []
        for key in keys:
            ratios = sorted(a / b for a, b in zip(times[spec][key], times["softmax"][key]))
            med = statistics.median(times[spec][key])
            extra = f" ({64 / med:.0f} img/s)" if key == "train" else ""
            cells.append(f"{med * 1e3:.1f} ms{extra}, ×{statistics.median(ratios):.2f} "
                         f"({ratios[0]:.2f}–{ratios[-1]:.2f})")
            summary.setdefault(spec, {})[key] = {"median_s": med, "ratio": statistics.median(ratios),
                                                 "ratio_range": [ratios[0], ratios[-1]]}
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "raw": times}, indent=1))
    if args.profile:
        prof = "\n\n".join(f"## {spec}: one training step of the leaderboard model (3 steps profiled)\n\n```\n"
                           f"{_profile(_train_step(spec), 3)}\n```\n\n"
                           f"## {spec}: batch-1 inference (20 calls profiled)\n\n```\n"
                           f"{_profile(_latency(spec), 20)}\n```" for spec in specs)
        (args.out / "profile.md").write_text(f"# What dominates a training step and batch-1 inference ({args.threads} "
                                             f"threads)\n\nThe one-call C forwards of the kernel mixers show as "
                                             f"`vitmix::*_mix (C)` / `vitmix::nystrom_forward (C)`.\n\n{prof}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
