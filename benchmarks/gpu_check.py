"""The Python steps of ``benchmarks/gpu_check.sh`` (which runs each under its own timeout).

    python benchmarks/gpu_check.py env ENV_JSON            # versions, GPU, missing packages
    python benchmarks/gpu_check.py images DIR [--train N --val N]   # a random image folder to train on
    python benchmarks/gpu_check.py train-check RUN LOG     # finite losses, no compile fallback
    python benchmarks/gpu_check.py summary OUT WORK [--dry-run] [--commit-dir DIR]

The training data is generated (random 32×32 images in two classes) so the check needs no dataset and
no scikit-learn on the GPU machine: it tests that training runs, not what it learns.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import platform
import re
import shutil
import sys
from pathlib import Path

#: modules the parts import besides torch: timm and vitmix's dependencies, and the test runner's plugins
NEEDED = ("timm", "triton", "safetensors", "yaml", "matplotlib", "PIL", "pytest", "xdist", "pytest_timeout")
#: the line CompiledWithFallback (vitmix/train/compiled.py) warns with when torch.compile fails
COMPILE_FALLBACK = "vitmix: torch.compile failed"


def _version(name: str):
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001  (a broken install is reported, not raised)
        return None, f"{type(err).__name__}: {err}"
    return getattr(module, "__version__", "?"), None


def env_report(path: Path) -> int:
    """Writes and prints the versions, the GPU and the missing packages; exit status 1 when one is missing."""
    import torch

    report = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "packages": {},
              "missing": {}}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        report.update(gpu_capability=f"{props.major}.{props.minor}", gpu_sm_count=props.multi_processor_count,
                      gpu_memory_gib=round(props.total_memory / 2 ** 30, 1))
    for name in NEEDED:
        version, error = _version(name)
        if error:
            report["missing"][name] = error
        else:
            report["packages"][name] = version
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    if report["missing"]:
        print("missing: " + ", ".join(report["missing"]) + " (carry their wheels in .whl/, see docs/gpu.md)")
    return 1 if report["missing"] else 0


def make_images(root: Path, train: int = 640, val: int = 64, side: int = 32) -> int:
    """``root/{train,val}/{a,b}/*.png``: random RGB images, the two classes told apart by brightness."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            label = "ab"[i % 2]
            folder = root / split / label
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 128, (side, side, 3)) + (96 if label == "b" else 0)
            Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i:04d}.png")
    print(f"{train} train and {val} val images in {root}")
    return 0


def train_check(run: Path, log: Path) -> int:
    """Exit status 1 (and why) when the run fell back from torch.compile or logged a non-finite loss."""
    problems = []
    text = log.read_text(errors="replace") if log.exists() else ""
    if COMPILE_FALLBACK in text:
        problems.append("torch.compile fell back to eager: "
                        + next(line for line in text.splitlines() if COMPILE_FALLBACK in line).strip()[:200])
    metrics = run / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() \
        else []
    losses = [r[k] for r in records for k in ("train_loss", "val_loss") if k in r]
    if not losses:
        problems.append(f"no losses in {metrics}")
    elif not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        problems.append(f"non-finite loss: {losses}")
    name = run.name
    if problems:
        print(f"{name}: FAIL: " + "; ".join(problems))
        return 1
    print(f"{name}: ok, last train loss {records[-1].get('train_loss'):.4f}")
    return 0


# ------------------------------------------------------------------------------------------------ summary
def _parts(work: Path):
    """Rows of ``parts.tsv``: part, status, seconds, budget."""
    rows = []
    for line in (work / "parts.tsv").read_text().splitlines():
        name, status, seconds, budget = line.split("\t")[:4]
        rows.append(dict(part=name, status=status, seconds=float(seconds), budget=float(budget)))
    return rows


def _key_numbers(part: str, log: str) -> str:
    """The line of a part's log that says what it found."""
    if part in ("triton", "parity"):
        found = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|error|deselected|tests? collected).*?)\s*=*$", log,
                           re.M)
        collected = re.findall(r"^(\d+ tests? collected.*)$", log, re.M)
        reasons = sorted(set(re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", log, re.M)))
        text = (found or collected or ["no pytest summary"])[-1]
        return text + (f"; skipped: {'; '.join(reasons)}" if reasons else "")
    if part == "train":
        return "; ".join(re.findall(r"^(\S+: (?:ok|FAIL).*)$", log, re.M)) or "no run checked"
    if part == "bench":
        goals = re.findall(r"^(PASS|FAIL|NOT MEASURED) ", log, re.M)
        counts = {s: goals.count(s) for s in ("PASS", "FAIL", "NOT MEASURED")}
        return "goals: " + ", ".join(f"{v} {k}" for k, v in counts.items())
    if part == "env":
        missing = re.findall(r"^missing: (.*)$", log, re.M)
        return f"missing: {missing[0]}" if missing else "all packages present"
    return ""


def summary(out: Path, work: Path, dry_run: bool, commit_dir: Path | None) -> int:
    """``OUT/summary.md``: the parts' table, the goal verdicts and the over-budget warnings; with
    ``commit_dir``, the benchmark's files and the summary copied to ``commit_dir/<gpu-name>/``."""
    env = json.loads((work / "env.json").read_text()) if (work / "env.json").exists() else {}
    parts = _parts(work)
    rows, warnings = [], []
    for p in parts:
        log_path = work / "logs" / f"{p['part']}.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        rows.append([p["part"], p["status"], f"{p['seconds']:.1f}", f"{p['budget']:g}",
                     _key_numbers(p["part"], log).replace("|", "/")])
        if p["seconds"] > p["budget"]:
            warnings.append(f"part {p['part']} took {p['seconds']:.0f} s, over its budget of {p['budget']:g} s")
    lines = ["# GPU check" + (" (dry run on the CPU: plumbing only)" if dry_run else ""), "",
             f"- GPU: {env.get('gpu') or 'none'}; torch {env.get('torch')}, CUDA {env.get('cuda')}, "
             f"python {env.get('python')}; " + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items()),
             f"- missing: {', '.join(env['missing'])}" if env.get("missing") else "- missing: none",
             f"- total: {sum(p['seconds'] for p in parts):.0f} s", "",
             "| part | status | seconds | budget s | key numbers |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    results = work / "bench" / "results.json"
    if results.exists():
        goals = json.loads(results.read_text())["goals"]
        lines += ["", "## Goals (benchmarks/gpu.py)", "", "| goal | measured | target | result |", "|---|---|---|---|"]
        for g in goals:
            measured = "" if g["measured"] is None else f"{g['measured']:.3g}"
            lines.append(f"| {g['goal']} | {measured} | {'≥' if g['higher_is_better'] else '≤'} {g['target']:g} | "
                         f"{g['status']} |")
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print(text)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if commit_dir is not None and results.exists():
        slug = re.sub(r"[^a-z0-9]+", "-", (env.get("gpu") or "cpu").lower()).strip("-")
        target = commit_dir / slug
        target.mkdir(parents=True, exist_ok=True)
        for f in (work / "bench").iterdir():
            shutil.copy2(f, target / f.name)
        shutil.copy2(out / "summary.md", target / "gpu_check_summary.md")
        print(f"copied the benchmark and the summary to {target}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("env").add_argument("path", type=Path)
    i = sub.add_parser("images")
    i.add_argument("root", type=Path)
    i.add_argument("--train", type=int, default=640, help="training images (default 640: 20 batches of 32)")
    i.add_argument("--val", type=int, default=64, help="validation images (default 64)")
    t = sub.add_parser("train-check")
    t.add_argument("run", type=Path)
    t.add_argument("log", type=Path)
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    s.add_argument("work", type=Path)
    s.add_argument("--dry-run", action="store_true")
    s.add_argument("--commit-dir", type=Path)
    args = ap.parse_args(argv)
    if args.step == "env":
        return env_report(args.path)
    if args.step == "images":
        return make_images(args.root, args.train, args.val)
    if args.step == "train-check":
        return train_check(args.run, args.log)
    return summary(args.out, args.work, args.dry_run, args.commit_dir)


if __name__ == "__main__":
    raise SystemExit(main())
