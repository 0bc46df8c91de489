"""What a trained kernel mixer's parts are worth: test accuracy with each part knocked out in every block.

A run whose mixer leans on its kernel attention loses much when that attention is replaced by its mean over the
tokens (the same average, no token-dependent mixing); one that leans on its local conv loses much when the conv
is off. Conditions, each applied to every block of the run's ``soft``/``soft_norm``/``laplacian`` mixers at once
(the composed path, the reference of the C paths, in all of them):

* ``full``: nothing knocked out (the run's own accuracy on these images);
* ``attention→mean``: each head's kernel-attention output replaced by its mean over the tokens;
* ``attention off``: the kernel attention removed (the local conv and the projections stay);
* ``local off``: the local depthwise conv removed.

    python experiments/learning/knockout.py --runs runs/learning/grid/fmnist196-w128h4d5-check/seed3/{soft,laplacian} \
        --images 2000 --out experiments/learning/results/grid/knockout

Writes ``results.md`` and ``results.json`` to ``--out`` (default ``experiments/learning/results/knockout``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from vitmix._util import markdown_table
from vitmix.bench.env import environment
from vitmix.data import build_datasets
from vitmix.runs.checkpoints import load_checkpoint

ROOT = Path(__file__).resolve().parent
CONDITIONS = ("full", "attention→mean", "attention off", "local off")


def kernel_mixers(model) -> list:
    """The model's mixers that have a kernel attention (``_attend``) and a local conv (``conv_kernel``)."""
    return [m for m in model.modules() if hasattr(m, "_attend") and hasattr(m, "conv_kernel")]


#: what the kernel attention's output (B, heads, tokens, head_dim) becomes under each attention knock-out
REPLACE_ATTENTION = {"attention→mean": lambda out: out.mean(dim=-2, keepdim=True).expand_as(out),
                     "attention off": torch.zeros_like}


@contextmanager
def knocked_out(mixers: list, condition: str):
    """Every mixer in ``mixers`` on its composed path with ``condition`` applied; restored on exit."""
    names = ("_fused", "_attend", "conv_kernel")
    saved = [{n: m.__dict__[n] for n in names if n in m.__dict__} for m in mixers]
    for m in mixers:
        m._fused = lambda x, grid: None
        if condition in REPLACE_ATTENTION:
            m._attend = lambda *args, _attend=m._attend, _replace=REPLACE_ATTENTION[condition]: _replace(_attend(*args))
        elif condition == "local off":
            m.conv_kernel = 0
    try:
        yield
    finally:
        for m, own in zip(mixers, saved):
            for name in names:
                m.__dict__.pop(name, None)
            m.__dict__.update(own)


@torch.no_grad()
def accuracy(model, images: torch.Tensor, labels: torch.Tensor, batch: int = 250) -> float:
    right = sum(int((model(images[i:i + batch]).argmax(-1) == labels[i:i + batch]).sum())
                for i in range(0, len(images), batch))
    return 100.0 * right / len(images)


def knockout(run: str, images: int) -> dict:
    """Accuracy of ``run`` on its first ``images`` validation images under every condition."""
    model, meta, _ = load_checkpoint(run)
    model.eval()
    mixers = kernel_mixers(model)
    if not mixers:
        raise SystemExit(f"{run}: {meta.get('mixer') or meta['model']} has no kernel mixer to knock out")
    _, val_set, _ = build_datasets(meta["data"], int(meta["img_size"]), None, False, augment=False)
    pairs = [val_set[i] for i in range(min(images, len(val_set)))]
    x, y = torch.stack([p[0] for p in pairs]), torch.tensor([int(p[1]) for p in pairs])
    acc = {}
    for condition in CONDITIONS:
        with knocked_out(mixers, condition):
            acc[condition] = accuracy(model, x, y)
    return {"run": str(run), "mixer": meta.get("mixer") or meta["model"], "images": len(x), "accuracy": acc}


def write(rows: list, out: Path, env: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"environment": env, "command": cmd, "rows": rows}, indent=2))
    cells = [[r["run"], r["mixer"]] + [f"{r['accuracy'][c]:.2f}" for c in CONDITIONS] for r in rows]
    lines = ["# Knock-out accuracy of trained kernel mixers", "", f"Command: `{cmd}`  ",
             f"{env['cpu']}, torch {env['torch']}, {env['date_utc']}. Top-1 % on each run's first "
             f"{rows[0]['images']} validation images, with each part knocked out in every block "
             "(`experiments/learning/knockout.py` says how).", "",
             markdown_table(["run", "mixer", *CONDITIONS], cells)]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, help="trained run directories (or checkpoints)")
    ap.add_argument("--images", type=int, default=2000, help="validation images per run (default 2000)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "knockout")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cmd = "python experiments/learning/knockout.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write([knockout(run, args.images) for run in args.runs], args.out, environment(), cmd.strip())


if __name__ == "__main__":
    main()
