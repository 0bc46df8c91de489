"""``vitmix bench --spec FILE``: a benchmark suite written as a YAML file — cases × entries, timed in
alternating rounds, each entry's time stated as per-round ratios to reference entries.

A sweep (:mod:`.sweep`) asks how one layer or model scales with size; a suite asks how entries compare
on fixed cases, fairly on a shared machine: every round times every entry of a case once (the order
reversed every other round), so a change of load hits all entries alike, and each ratio is the median
(and range) of the per-round ratios. The case kinds (:mod:`.suite_targets`) are a mixer ``layer`` (with
the ``floor`` entry: the layer's own qkv + output linears), the attention ``op`` alone, a ``model`` and
a ``train_step``. The suites the project's committed timings come from are ``benchmarks/specs/*.yaml``.

Top-level keys: ``title``, ``about`` (a paragraph for the results), ``entries`` (mixer or op specs,
``name:key=value``), ``ratios_to`` (entries the others are divided by; default the first), ``rounds``,
``min_run_time`` (seconds of timing per entry and round), ``threads``, ``seed``, ``cases``. Case keys:
``name``, ``kind``, ``batch``; ``dim``, ``heads``, ``tokens`` (grid tokens, a list; layer and op cases),
``prefix`` (extra tokens, e.g. CLS) and ``layer_options`` (layer cases); ``model``, ``model_options`` (model
and train_step cases); ``passes`` (``fwd``, ``fwd+bwd``; not train_step); ``memory`` (also the peak
memory of each entry); ``profile`` (that many calls of each entry under ``torch.profiler``, into ``profile.md``).
"""
from __future__ import annotations

import statistics
import time
from typing import List, Optional

import torch

from .._util import close_matches
from .config import PASSES
from .paired import alternating_rounds, round_ratios
from .suite_targets import KINDS, build, check_entry

TOP_KEYS = ("title", "about", "entries", "ratios_to", "rounds", "min_run_time", "threads", "seed", "cases")
CASE_KEYS = ("name", "kind", "batch", "dim", "heads", "tokens", "prefix", "layer_options", "model",
             "model_options", "passes", "memory", "profile")
#: the keys only some kinds take (a key another kind would silently ignore is refused)
KIND_KEYS = {"layer": ("dim", "heads", "tokens", "prefix", "layer_options", "passes"),
             "op": ("dim", "heads", "tokens", "passes"), "model": ("model", "model_options", "passes"),
             "train_step": ("model", "model_options")}
NEEDS = {"layer": ("dim", "heads", "tokens"), "op": ("dim", "heads", "tokens"), "model": ("model",),
         "train_step": ("model",)}


def _unknown(keys, known, where: str) -> None:
    for key in keys:
        if key not in known:
            raise ValueError(f"{where}: unknown key {key!r}." + close_matches(key, known)
                             + f" Keys: {', '.join(known)}")


def load_spec(path) -> dict:
    """Read and check a suite file (``FileNotFoundError`` / ``ValueError`` with the key at fault), with the
    defaults filled in: nothing fails half way through a run on a typo."""
    from ..runs.flags import load_yaml

    return check_spec(load_yaml(path), str(path))


def check_spec(spec: dict, where: str = "spec") -> dict:
    """:func:`load_spec` for a mapping already read."""
    _unknown(spec, TOP_KEYS, where)
    spec = {"title": "vitmix bench suite", "about": "", "rounds": 1, "min_run_time": 0.2, "threads": None,
            "seed": 0, **spec}
    entries = spec.get("entries")
    if not entries or not isinstance(entries, list):
        raise ValueError(f"{where}: 'entries' must be a list of mixer or op specs, e.g. [softmax, soft]")
    spec["entries"] = [str(e) for e in entries]
    spec["ratios_to"] = [str(r) for r in spec.get("ratios_to") or spec["entries"][:1]]
    for ref in spec["ratios_to"]:
        if ref not in spec["entries"]:
            raise ValueError(f"{where}: ratios_to names {ref!r}, which is not an entry."
                             + close_matches(ref, spec["entries"]))
    if not isinstance(spec["rounds"], int) or spec["rounds"] < 1:
        raise ValueError(f"{where}: rounds must be a positive integer, got {spec['rounds']!r}")
    if not isinstance(spec["min_run_time"], (int, float)) or spec["min_run_time"] <= 0:
        raise ValueError(f"{where}: min_run_time must be a positive number of seconds, got {spec['min_run_time']!r}")
    if not spec.get("cases") or not isinstance(spec["cases"], list):
        raise ValueError(f"{where}: 'cases' must be a list of cases (each with a name and a kind)")
    spec["cases"] = [_check_case(case, spec["entries"], f"{where}, case {i + 1}")
                     for i, case in enumerate(spec["cases"])]
    names = [c["name"] for c in spec["cases"]]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: case names repeat: {', '.join(names)}")
    return spec


def _check_case(case: dict, entries: List[str], where: str) -> dict:
    if not isinstance(case, dict):
        raise ValueError(f"{where}: a case is a mapping with a name and a kind, got {case!r}")
    _unknown(case, CASE_KEYS, where)
    kind = case.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}."
                         + close_matches(str(kind), KINDS))
    for key in NEEDS[kind]:
        if key not in case:
            raise ValueError(f"{where}: a {kind} case needs {key!r}")
    for key in case:
        if key not in KIND_KEYS[kind] and any(key in keys for keys in KIND_KEYS.values()):
            takes = [k for k, keys in KIND_KEYS.items() if key in keys]
            raise ValueError(f"{where}: {key!r} is for {' and '.join(takes)} cases, not {kind}")
    case = {"name": f"{kind} {where.rsplit(' ', 1)[-1]}", "batch": 1, "prefix": 0, "memory": False, "profile": 0,
            "passes": ["fwd+bwd"], **case}
    if kind == "train_step":
        case["passes"] = ["train step"]  # forward, backward and the update: one pass of its own
    elif [p for p in case["passes"] if p not in PASSES] or not case["passes"]:
        raise ValueError(f"{where}: passes must be a list of {', '.join(PASSES)}, got {case['passes']!r}")
    if kind in ("layer", "op"):
        if case["dim"] % case["heads"]:
            raise ValueError(f"{where}: dim={case['dim']} is not divisible by heads={case['heads']}")
        if not isinstance(case["tokens"], list) or any(not isinstance(n, int) or n < 1 for n in case["tokens"]):
            raise ValueError(f"{where}: tokens must be a list of positive token counts, got {case['tokens']!r}")
    for entry in entries:
        try:
            check_entry(kind, entry)
        except ValueError as err:
            raise ValueError(f"{where} ({case['name']}): {err}") from None
    return case


def run_suite(spec: dict, device="cpu", log=print) -> dict:
    """Time every case of a checked ``spec`` (:func:`check_spec`); returns the rows and the environment."""
    from ..runs.device import parse_device
    from .env import environment, load_average

    device = parse_device(str(device))
    threads = torch.get_num_threads()
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    try:
        env = environment(device)
        from .memory import memory_method

        measured = any(case["memory"] for case in spec["cases"])
        env.update(memory_method=memory_method(device) if measured else "off", flop_unit="not counted in a suite")
        start, rows, profiles = time.perf_counter(), [], []
        for case in spec["cases"]:
            for tokens in case.get("tokens") or [None]:
                for pass_name in case["passes"]:
                    point = _run_point(spec, case, tokens, pass_name, device, profiles)
                    for row in point:
                        log(_log_line(row))
                    rows += point
        env["load_average_1m_end"] = load_average()
    finally:
        torch.set_num_threads(threads)
    return {"environment": env, "elapsed_s": round(time.perf_counter() - start, 2), "spec": spec, "rows": rows,
            "profiles": profiles}


def _run_point(spec: dict, case: dict, tokens: Optional[int], pass_name: str, device, profiles: list) -> List[dict]:
    """One row per entry: median time over the rounds, per-round ratios to the references, peak memory."""
    entries = spec["entries"]
    base = {"case": case["name"], "kind": case["kind"], "N": None if tokens is None else case["prefix"] + tokens,
            "batch": case["batch"], "pass": pass_name}
    try:
        torch.manual_seed(spec["seed"])
        built = {e: build(case, e, tokens, pass_name, device) for e in entries}
        rounds = alternating_rounds({e: b.call for e, b in built.items()}, device, spec["min_run_time"],
                                    int(spec["rounds"]))
    except (RuntimeError, MemoryError) as err:  # e.g. out of memory: the point is a result, the rest still runs
        note = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return [dict(base, entry=e, status="error", note=note) for e in entries]
    rows = []
    for entry in entries:
        median = statistics.median(rounds[entry])
        row = dict(base, entry=entry, status="ok", median_ms=median * 1e3,
                   throughput=built[entry].items / median, throughput_unit=built[entry].unit,
                   round_ms=[t * 1e3 for t in rounds[entry]])
        for ref in spec["ratios_to"]:
            ratios = sorted(round_ratios(rounds[entry], rounds[ref]))
            row[f"vs_{ref}"], row[f"vs_{ref}_min"], row[f"vs_{ref}_max"] = \
                statistics.median(ratios), ratios[0], ratios[-1]
        if case["memory"]:
            from .memory import peak_memory

            mem = peak_memory(built[entry].call, device, built[entry].holds)
            row["peak_mib"] = None if mem.peak_bytes is None else mem.peak_bytes / 2 ** 20
        rows.append(row)
        if case["profile"]:
            profiles.append((f"{case['name']}, {entry}" + (f", N = {base['N']}" if tokens else "")
                             + f", {pass_name}", case["profile"], _profile(built[entry].call, case["profile"])))
    return rows


def _profile(call, calls: int, rows: int = 20) -> str:
    """A ``torch.profiler`` table of ``calls`` calls after one warm-up call: what dominates."""
    from torch.profiler import profile

    call()
    with profile() as prof:
        for _ in range(calls):
            call()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def _log_line(row: dict) -> str:
    where = f"{row['case']}" + (f" N={row['N']}" if row["N"] else "") + f" {row['pass']} {row['entry']}"
    if row["status"] != "ok":
        return f"{where}: {row['note']}"
    return f"{where}: {row['median_ms']:.2f} ms"


__all__ = ["check_spec", "load_spec", "run_suite"]
