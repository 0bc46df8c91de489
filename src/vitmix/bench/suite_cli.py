"""``vitmix bench --spec FILE``: run a suite file and write its results (:mod:`.suite`)."""
from __future__ import annotations

import shlex
import sys

#: ``vitmix bench`` flags a suite takes from its file instead; given with ``--spec`` they are refused
SWEEP_ONLY = ("tokens", "sizes", "compile")


def run_spec(args) -> int:
    """Check the file, run it on ``--device`` (``--threads`` overrides the file's), write to ``--out``."""
    from .env import machine_tag
    from .suite import load_spec, run_suite
    from .suite_report import write_suite

    given = [name for name in SWEEP_ONLY if getattr(args, name, None)]
    if given:
        raise ValueError(f"--{given[0]} is for --mixers/--models sweeps; a --spec suite sets its sizes in the file")
    spec = load_spec(args.spec)
    if args.threads:
        spec["threads"] = args.threads
    result = run_suite(spec, args.device, log=print if not args.no_progress else (lambda _line: None))
    argv = sys.argv[1:]
    command = ("vitmix " + " ".join(shlex.quote(a) for a in argv) if argv and argv[0] == "bench"
               else f"vitmix bench --spec {shlex.quote(args.spec)} --out {shlex.quote(args.out)}")
    paths = write_suite(result, args.out.replace("{machine}", machine_tag(result["environment"])), command)
    print("wrote", ", ".join(paths))
    return 0


__all__ = ["run_spec"]
