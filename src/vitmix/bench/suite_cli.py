"""``vitmix bench --spec FILE``: run a suite file and write its results (:mod:`.suite`)."""
from __future__ import annotations

import shlex
import sys

from .config import PASSES, BenchConfig

#: ``vitmix bench`` flags a suite sets in its file instead (given with ``--spec`` they are refused, not ignored),
#: with the value each has when not given
SWEEP_ONLY = {"tokens": None, "sizes": None, "compile": False, "batch": [BenchConfig.batch], "dim": BenchConfig.dim,
              "heads": BenchConfig.heads, "dtype": BenchConfig.dtype, "passes": ",".join(PASSES),
              "min_run_time": BenchConfig.min_run_time, "seed": BenchConfig.seed,
              "max_seconds": BenchConfig.max_seconds, "max_memory_gb": None, "no_memory": False, "no_flops": False,
              "baseline_model": BenchConfig.baseline_model, "compile_backend": BenchConfig.compile_backend,
              "sequence": False}


def run_spec(args) -> int:
    """Check the file, run it on ``--device`` (``--threads`` overrides the file's), write to ``--out``."""
    from ..runs import check_output_dir
    from ..runs.device import parse_device
    from .env import environment, machine_tag
    from .report import RESULTS_MARKER
    from .suite import load_spec, run_suite
    from .suite_report import write_suite

    given = [name for name, unset in SWEEP_ONLY.items() if getattr(args, name, unset) != unset]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} is for --mixers/--models sweeps; a --spec suite sets it in the file (copy the "
                         "file to change it)")
    spec = load_spec(args.spec)
    out = args.out
    if "{machine}" in out:           # the folder the results go to is the one checked
        out = out.replace("{machine}", machine_tag(environment(parse_device(args.device))))
    check_output_dir(out, (RESULTS_MARKER,), "vitmix bench results")     # before the suite's minutes
    if args.threads:
        spec["threads"] = args.threads
    result = run_suite(spec, args.device, log=print if not args.no_progress else (lambda _line: None))
    argv = sys.argv[1:]
    command = ("vitmix " + " ".join(shlex.quote(a) for a in argv) if argv and argv[0] == "bench"
               else f"vitmix bench --spec {shlex.quote(args.spec)} --out {shlex.quote(args.out)}")
    paths = write_suite(result, out, command)
    print("wrote", ", ".join(paths))
    return 0


__all__ = ["run_spec"]
