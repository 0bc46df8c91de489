"""The first forward+backward calls of a model in a fresh process: the cold start that every timing of
``vitmix bench`` leaves out on purpose (its warm-up call), with an empty vitmix kernel cache
(``VITMIX_CACHE_DIR``: the C kernels are built on first use) and then with the cache that run filled.

    python benchmarks/first_call.py           # laplacianformer_tiny at 224², batch 1
    # writes benchmarks/results/first_call/<machine>/{results.md,results.json}; --out elsewhere

The committed figures of an earlier run are in the projection-floor table
(``benchmarks/results/projection_floor/cpu-amd-epyc-2c-torch2.14/results.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from vitmix._util import markdown_table
from vitmix.bench.env import environment, machine_tag

OUT_DIR = Path(__file__).resolve().parent / "results" / "first_call"
CALLS = r"""
import json, sys, time, torch, vitmix
torch.manual_seed(0)
model = vitmix.create_model(sys.argv[1])
x = torch.randn(1, 3, int(sys.argv[2]), int(sys.argv[2]))
times = []
for _ in range(3):
    t = time.perf_counter(); model(x).sum().backward(); times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def first_calls(model: str, size: int) -> dict:
    """Seconds of the first three fwd+bwd calls in two fresh processes: empty kernel cache, then warm."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, VITMIX_CACHE_DIR=cache)
        for label in ("empty cache", "warm cache"):
            res = subprocess.run([sys.executable, "-c", CALLS, model, str(size)], env=env, capture_output=True,
                                 text=True, check=True)
            out[label] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="laplacianformer_tiny")
    ap.add_argument("--size", type=int, default=224, help="image side (default 224)")
    ap.add_argument("--out", type=Path, default=None, help=f"output folder (default {OUT_DIR}/<machine>)")
    args = ap.parse_args(argv)
    env = environment()
    out = args.out or OUT_DIR / machine_tag(env)
    calls = first_calls(args.model, args.size)
    cmd = "python benchmarks/first_call.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    cells = [[label, *(f"{t:.2f}" for t in times), f"{times[0] / times[1]:.2f}"] for label, times in calls.items()]
    text = "\n".join([f"# First fwd+bwd calls of `{args.model}` at {args.size}², batch 1, fresh process (seconds)", "",
                      f"Command: `{cmd}`; {env['device_name']}, torch {env['torch']}, {env['date_utc']}.", "",
                      markdown_table(["kernel cache", "1st", "2nd", "3rd", "1st / 2nd"], cells, align="lrrrr")])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"environment": env, "command": cmd, "first_calls_s": calls},
                                                 indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
