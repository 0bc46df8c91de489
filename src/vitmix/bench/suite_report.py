"""Writing a ``vitmix bench --spec`` suite: ``results.md``, ``results.csv``, ``results.json`` and, when a
case asks for it, ``profile.md``."""
from __future__ import annotations

import json
import os
from typing import List, Optional

from .._util import markdown_table, write_csv
from .report import env_lines


def _ratio(row: dict, ref: str, rounds: int) -> str:
    value = row.get(f"vs_{ref}")
    if value is None:
        return ""
    spread = f" ({row[f'vs_{ref}_min']:.2f}–{row[f'vs_{ref}_max']:.2f})" if rounds > 1 else ""
    return f"×{value:.2f}{spread}"


def _cells(row: dict, spec: dict, memory: bool) -> List[str]:
    ok = row["status"] == "ok"
    cells = [row["case"], "" if row["N"] is None else str(row["N"]), str(row["batch"]), row["pass"], row["entry"],
             f"{row['median_ms']:.2f}" if ok else row["status"],
             f"{row['throughput']:,.0f} {row['throughput_unit']}" if ok else ""]
    cells += [_ratio(row, ref, int(spec["rounds"])) if ok else "" for ref in spec["ratios_to"]]
    if memory:
        cells.append(f"{row['peak_mib']:.1f}" if ok and row.get("peak_mib") is not None else "")
    return cells


def results_markdown(result: dict, command: Optional[str]) -> str:
    """The ``results.md`` of a suite: command, machine, what the ratios are, one row per (case, entry)."""
    spec, rows = result["spec"], result["rows"]
    rounds = int(spec["rounds"])
    memory = any(case["memory"] for case in spec["cases"])
    parts = [f"# {spec['title']}", ""]
    if command:
        parts += ["Command:", "", "```", command, "```", ""]
    parts += env_lines(result["environment"], result["elapsed_s"]) + [""]
    if spec["about"]:
        parts += [spec["about"].strip(), ""]
    how = (f"{rounds} alternating rounds (each round times every entry of a case once, the order reversed every "
           f"other round); a time is the median over the rounds, × X the median (min–max) of the per-round ratios "
           f"to entry X" if rounds > 1 else "one round; × X is the time divided by entry X's")
    parts += [f"Times: median ms of repeated calls after a warm-up, {spec['min_run_time']:g} s of timing per entry "
              f"and round; {how} (below 1: faster than X)."
              + (" Peak MiB: tensors allocated during one call (inputs and parameters not counted)." if memory else ""),
              ""]
    header = ["case", "N", "batch", "pass", "entry", "median ms", "throughput"]
    header += [f"× {ref}" for ref in spec["ratios_to"]] + (["peak MiB"] if memory else [])
    parts += [markdown_table(header, [_cells(r, spec, memory) for r in rows]), ""]
    notes = sorted({r["note"] for r in rows if r.get("note")})
    parts += [f"**Note:** {note}" for note in notes]
    return "\n".join(parts).rstrip() + "\n"


def write_suite(result: dict, out_dir: str, command: Optional[str] = None) -> List[str]:
    """Write the suite's files into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [write_csv(os.path.join(out_dir, "results.csv"),
                       [{k: v for k, v in r.items() if k != "round_ms"} for r in result["rows"]])]
    payload = {"command": command, **{k: v for k, v in result.items() if k != "profiles"}}
    paths.append(_write(os.path.join(out_dir, "results.json"), json.dumps(payload, indent=1, default=str) + "\n"))
    paths.append(_write(os.path.join(out_dir, "results.md"), results_markdown(result, command)))
    if result["profiles"]:
        text = [f"# What dominates: {result['spec']['title']}", ""]
        for title, calls, table in result["profiles"]:
            text += [f"## {title} ({calls} calls profiled)", "", "```", table, "```", ""]
        paths.append(_write(os.path.join(out_dir, "profile.md"), "\n".join(text)))
    return paths


def _write(path: str, text: str) -> str:
    with open(path, "w") as fh:
        fh.write(text)
    return path


__all__ = ["results_markdown", "write_suite"]
