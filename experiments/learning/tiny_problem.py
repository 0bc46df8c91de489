"""The learning guard's tiny problem as an experiment: any width, head count, learning rate, step count, mixer
options, and a learning-rate factor for one group of parameters.

The problem is the learning guard's (``tests/train/test_learning_guard.py`` runs it through :func:`tiny_run`): the
bundled 8×8 digits, patch 2, a 2-block ViT, AdamW with batch 128 from the first 512 digits, clip 1.0, validation
on the last 397, one thread. A run takes seconds,
so questions about how a mixer learns (which learning rate it needs, which parameters are slow) can be asked
over many seeds before a grid run. Each spec is ``LABEL=MIXER[:KEY=VALUE,...]``; the keys ``width``, ``heads``,
``lr``, ``steps``, ``boost`` (parameter-name substrings, ``+``-separated), ``factor`` (the boosted group's
learning-rate multiplier, default 4), ``depth`` (blocks, default 2), ``mlp`` (MLP ratio, default 2) and ``batch``
(default 128) set the run, every other key is a mixer option:

    python experiments/learning/tiny_problem.py --seeds 0,1,2 --out experiments/learning/results/tiny-lr \\
        "soft=soft:width=64,heads=4,lr=1e-3" "laplacian=laplacian:width=64,heads=4,lr=1e-3" \\
        "attention x4=laplacian:width=64,heads=4,lr=1e-3,boost=attn."

Writes ``results.json`` (every seed's validation top-1 %) and ``results.md`` (mean ± std per spec) into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import vitmix
from vitmix._util import markdown_table
from vitmix.bench.env import environment

#: the run's own keys in a spec, with their defaults (the guard's two-head problem)
RUN_KEYS = {"width": 32, "heads": 2, "lr": 4e-3, "steps": 120, "boost": "", "factor": 4.0, "depth": 2, "mlp": 2.0,
            "batch": 128}


def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0 - 0.3) / 0.4, torch.tensor(d.target)


def parse_spec(spec: str):
    """``LABEL=MIXER[:K=V,...]`` → ``(label, mixer, run settings, mixer options)``."""
    label, _, rest = spec.partition("=")
    mixer, _, pairs = rest.partition(":")
    if not label or not mixer:
        raise ValueError(f"spec {spec!r}: expected LABEL=MIXER[:KEY=VALUE,...]")
    run, options = dict(RUN_KEYS), {}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        target = run if key in RUN_KEYS else options
        target[key] = value if key == "boost" else _number(value)
    return label, mixer, run, options


def _number(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def tiny_run(data, mixer: str, seed: int, run: dict, options: dict) -> float:
    """Validation top-1 (%) after the tiny problem's recipe with ``run``'s settings."""
    x, y = data
    torch.manual_seed(seed)
    model = vitmix.create_model("vit_nano_patch4_32", mixer=mixer, mixer_options=options, img_size=8, in_chans=1,
                                num_classes=10, patch_size=2, embed_dim=int(run["width"]), depth=int(run["depth"]),
                                num_heads=int(run["heads"]), mlp_ratio=float(run["mlp"]))
    boost = [b for b in str(run["boost"]).split("+") if b]
    fast = [p for n, p in model.named_parameters() if any(b in n for b in boost)]
    slow = [p for n, p in model.named_parameters() if not any(b in n for b in boost)]
    groups = [{"params": slow, "lr": run["lr"]}] + ([{"params": fast, "lr": run["lr"] * run["factor"]}] if fast else [])
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    train, val = torch.arange(0, 512), torch.arange(1400, len(x))
    draw = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(int(run["steps"])):
        idx = train[torch.randint(0, len(train), (int(run["batch"]),), generator=draw)]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    with torch.no_grad():
        return (model(x[val]).argmax(-1) == y[val]).float().mean().item() * 100


def main(argv=None, script: str = "experiments/learning/tiny_problem.py") -> None:
    """Runs the specs; ``script`` is the command the results name (a wrapper registering more mixers passes its own)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", help="LABEL=MIXER[:KEY=VALUE,...] (see the module docstring)")
    ap.add_argument("--seeds", default="0,1,2,3,4,5", help="comma-separated seeds (default: the guard's six)")
    ap.add_argument("--out", type=Path, required=True, help="results folder")
    args = ap.parse_args(argv)
    specs = [parse_spec(s) for s in args.specs]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    torch.set_num_threads(1)          # the problem is chaotic in the last bits: one thread, as the guard
    data, results = digits(), {}
    for label, mixer, run, options in specs:
        accs = [tiny_run(data, mixer, seed, run, options) for seed in seeds]
        results[label] = {"mixer": mixer, "run": run, "options": options, "seeds": seeds, "top1": accs}
        print(f"{label}: {statistics.fmean(accs):.2f}  ({', '.join(f'{a:.1f}' for a in accs)})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"environment": environment(), "results": results}, indent=1))
    rows = [[label, r["mixer"], json.dumps({**r["run"], **r["options"]}), f"{statistics.fmean(r['top1']):.1f}"
             + (f" ± {statistics.stdev(r['top1']):.1f}" if len(r["top1"]) > 1 else ""),
             ", ".join(f"{a:.1f}" for a in r["top1"])] for label, r in results.items()]
    (args.out / "results.md").write_text(f"# The tiny problem\n\nCommand: `python {script} "
                                         + " ".join(f'"{s}"' for s in args.specs) + f" --seeds {args.seeds}`\n\n"
                                         + markdown_table(["spec", "mixer", "settings", "top-1 % (mean ± std)",
                                                           "per seed"], rows) + "\n")


if __name__ == "__main__":
    main()
