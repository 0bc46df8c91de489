"""Summarise the video comparison: ``python summarize.py RUNS_DIR OUT_DIR``.

Reads ``RUNS_DIR/<model>/{metrics.jsonl,summary.json,config.yaml}`` of each run and ``OUT_DIR/load.log``
(written by run.sh), and writes ``OUT_DIR/results.json``, ``OUT_DIR/table.md``, ``OUT_DIR/curves.png`` and a
copy of each run's ``metrics.jsonl``.
"""
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import matplotlib
import timm
import torch
import yaml

import vitmix
from vitmix.bench.flops import count_flops

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODELS = ("timesformer_tiny", "timesformer_tiny_fibottention")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _load(path: Path) -> dict:
    values = [float(line.split()[1]) for line in path.read_text().splitlines() if line.strip()]
    return {"samples": len(values), "min": min(values), "max": max(values), "mean": sum(values) / len(values)}


def _cost(run: Path) -> dict:
    """Parameters and GMACs of one forward pass of one clip, for the model as trained."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    model = vitmix.create_model(cfg["model"], in_chans=1, num_classes=4, num_frames=cfg["num_frames"],
                                **cfg["model_options"]).eval()
    with torch.no_grad():
        flops = count_flops(lambda: model(*model.example_inputs(1))).total
    return {"params": sum(p.numel() for p in model.parameters()), "gmacs_per_clip": flops / 2e9}


def _row(name: str, r: dict) -> str:
    h = r["history"]
    return (f"| `{name}` | {r['params'] / 1e3:.0f} k | {r['gmacs_per_clip']:.3f} | {h[0]['val_acc']:.2f} % | "
            f"{h[-1]['val_acc']:.2f} % | {max(x['val_acc'] for x in h):.2f} % | {h[-1]['train_loss']:.4f} | "
            f"{sum(x['images_per_s'] for x in h) / len(h):.0f} | {r['summary']['train_seconds']:.0f} s |")


def _plot(results: dict, path: Path) -> None:
    fig, (acc, loss) = plt.subplots(1, 2, figsize=(10, 4))
    for name, r in results.items():
        epochs = [x["epoch"] for x in r["history"]]
        acc.plot(epochs, [x["val_acc"] for x in r["history"]], marker="o", label=name)
        loss.plot(epochs, [x["train_loss"] for x in r["history"]], marker="o", label=name)
    acc.axhline(25, color="grey", ls=":", label="chance (25 %)")
    acc.axhline(50, color="grey", ls="--", label="frame order ignored (≤ 50 %)")
    acc.set(xlabel="epoch", ylabel="val accuracy (%)", title="moving-Fashion-MNIST, direction of motion")
    loss.set(xlabel="epoch", ylabel="train loss (label smoothing 0.1)", title="training loss")
    acc.legend(fontsize=8)
    loss.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(runs: Path, out: Path) -> None:
    results = {}
    for name in MODELS:
        run = runs / name
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
        results[name] = dict(history=history, summary=json.loads((run / "summary.json").read_text()), **_cost(run))
        shutil.copy(run / "metrics.jsonl", out / f"{name}.metrics.jsonl")
    machine = {"cpu": _cpu(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "python": platform.python_version(),
               "torch": torch.__version__, "timm": timm.__version__, "load_1min": _load(out / "load.log")}
    (out / "results.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")
    header = ("| model | params | GMACs / clip | val acc after epoch 1 | final val acc | best val acc "
              "| final train loss | clips/s (train) | train time |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = "\n".join([header] + [_row(n, r) for n, r in results.items()])
    (out / "table.md").write_text(table + "\n")
    _plot(results, out / "curves.png")
    print(table)
    print(json.dumps(machine))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
