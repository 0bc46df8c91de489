"""Is a refactor free? Times the same hot paths with two source trees, in alternating rounds.

Each round starts one worker process per tree (``PYTHONPATH=<tree>``, one thread), which times
every point with ``torch.utils.benchmark`` and prints JSON; rounds alternate old/new so that a
change of machine load hits both trees alike. The table gives each tree's median over rounds and
the ratio new/old (1.00 = no change). Typical use, after moving code between modules:

    git archive <old-commit> src | tar -x -C /tmp/old
    python benchmarks/tree_ab.py /tmp/old/src src --out benchmarks/results/structure
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

#: (name, what is timed): layers at the sizes the speed goals name, fwd+bwd; whole small models
POINTS = [
    ("laplacian layer N=64+1, dim 128, 4 heads, batch 32", ("mixer", "laplacian", 128, 4, 8, 32)),
    ("soft layer N=64+1, dim 128, 4 heads, batch 32", ("mixer", "soft", 128, 4, 8, 32)),
    ("soft_norm layer N=64+1, dim 128, 4 heads, batch 32", ("mixer", "soft_norm", 128, 4, 8, 32)),
    ("laplacian layer N=196+1, dim 384, 6 heads, batch 8", ("mixer", "laplacian", 384, 6, 14, 8)),
    ("fibottention layer N=196+1, dim 384, 6 heads, batch 8", ("mixer", "fibottention", 384, 6, 14, 8)),
    ("laplacian layer N=1024+1, dim 64, 2 heads, batch 4", ("mixer", "laplacian", 64, 2, 32, 4)),
    ("weightformer_nano_patch4_32 model, 32 px, batch 32", ("model", "weightformer_nano_patch4_32", {}, 32, 32)),
    ("vit_nano_patch4_32 mixer=laplacian model, 32 px, batch 32",
     ("model", "vit_nano_patch4_32", {"mixer": "laplacian"}, 32, 32)),
]


def _worker(min_run_time: float) -> None:
    """Time every point with the vitmix on ``PYTHONPATH``; print ``{name: seconds}`` as JSON."""
    import torch
    from torch.utils.benchmark import Timer

    import vitmix
    from vitmix import mixers

    torch.set_num_threads(1)
    out = {}
    for name, spec in POINTS:
        torch.manual_seed(0)
        if spec[0] == "mixer":
            _, mixer, dim, heads, side, batch = spec
            layer = mixers.create(mixer, dim=dim, num_heads=heads, hw=(side, side), num_prefix_tokens=1)
            x = torch.randn(batch, 1 + side * side, dim, requires_grad=True)

            def step(layer=layer, x=x):
                layer(x).sum().backward()
        else:
            _, model_name, options, size, batch = spec
            model = vitmix.create_model(model_name, img_size=size, num_classes=10, **options)
            x = torch.randn(batch, 3, size, size)

            def step(model=model, x=x):
                model(x).sum().backward()
        step()   # first call: compiled extensions, caches
        out[name] = Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=min_run_time).median
    print(json.dumps(out))


def _round(tree: str, min_run_time: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, "--worker", "--min-run-time", str(min_run_time)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"tree_ab.py: the worker for {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(times: dict, load: float, command: str):
    """Rows and markdown: each tree's median, and the median (and range) of the per-round ratios new/old
    (a round times both trees back to back, so its ratio sees one machine load)."""
    rows = []
    for name, _ in POINTS:
        ratios = sorted(n[name] / o[name] for o, n in zip(times["old"], times["new"]))
        rows.append({"point": name, "old_ms": statistics.median(t[name] for t in times["old"]) * 1e3,
                     "new_ms": statistics.median(t[name] for t in times["new"]) * 1e3,
                     "ratio": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1]})
    rounds = len(times["old"])
    lines = [f"# Same hot paths, two source trees ({rounds} alternating rounds, 1 thread)", "",
             f"Command: `{command}`; 1-minute load average at the end {load:.2f} on {os.cpu_count()} cores. "
             "fwd+bwd; each tree's median over rounds, and the median (range) of the per-round ratios.",
             "", "| point | old (ms) | new (ms) | new/old per round: median (range) |", "|---|---|---|---|"]
    lines += [f"| {r['point']} | {r['old_ms']:.2f} | {r['new_ms']:.2f} | {r['ratio']:.3f} "
              f"({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) |" for r in rows]
    return rows, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("old", nargs="?", help="the old source tree (the folder holding vitmix/)")
    ap.add_argument("new", nargs="?", help="the new source tree")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per point and round")
    ap.add_argument("--out", type=Path, default=None, help="folder for results.md and results.json")
    ap.add_argument("--report-only", action="store_true", help="rewrite results.md from --out's results.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.min_run_time)
        return 0
    if args.report_only:
        if not args.out or not (args.out / "results.json").is_file():
            ap.error("--report-only reads results.json from --out; give the folder of an earlier run")
        saved = json.loads((args.out / "results.json").read_text())
        times, load, command = saved["raw"], saved["load"], saved["command"]
    else:
        if not (args.old and args.new):
            ap.error("give the old and the new source tree")
        for tree in (args.old, args.new):
            if not (Path(tree) / "vitmix" / "__init__.py").is_file():
                ap.error(f"{tree} holds no vitmix/__init__.py; give the folder that holds the vitmix package")
        times = {"old": [], "new": []}
        for r in range(args.rounds):
            for label in (("old", "new") if r % 2 == 0 else ("new", "old")):
                times[label].append(_round(getattr(args, label), args.min_run_time))
                print(f"round {r + 1}/{args.rounds}: {label} done", file=sys.stderr, flush=True)
        load = os.getloadavg()[0]
        command = f"python benchmarks/tree_ab.py {args.old} {args.new} --rounds {args.rounds}"
    rows, text = _report(times, load, command)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(text)
        (args.out / "results.json").write_text(json.dumps({"rows": rows, "raw": times, "load": load,
                                                           "command": command}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
