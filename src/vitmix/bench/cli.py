"""``vitmix bench``: time, memory and FLOPs of mixers (one layer) or models, swept over size; or a suite
(``--spec``): fixed cases whose entries are compared in alternating rounds."""
from __future__ import annotations

import argparse
import shlex
import sys

from .config import DEFAULT_BASELINE_MODEL, DEFAULT_IMAGE_SIZES, DEFAULT_TOKENS, PASSES, BenchConfig

EPILOG = """examples:
  vitmix bench --mixers all --tokens 196,784,3136 --max-seconds 300 --out runs/bench-mixers
  vitmix bench --mixers soft,laplacian,softmax:fused=false --dim 384 --heads 6 --passes fwd+bwd
  vitmix bench --models soft_tiny,laplacianformer_tiny --sizes 224,448 --dtype bf16
  vitmix bench --mixers softmax,laplacian --tokens 196,784 --compile
  vitmix bench --spec benchmarks/specs/projection_floor.yaml --out 'runs/projection_floor/{machine}'
  vitmix bench --mixers all --sequence --tokens 1024,4096,16384 --batch 1,8 --dim 64 --heads 2 --passes fwd+bwd

Mixer options go after the name: NAME:key=value:key=value. The softmax baseline is always
included; every row shows its speed-up and memory ratio against it."""


def _int_list(text: str):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command."""
    p = subparsers.add_parser(
        "bench", help="benchmark mixers or models: latency, throughput, peak memory, FLOPs",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--mixers", help="'all' or comma-separated mixer specs (one attention layer)")
    what.add_argument("--models", help="comma-separated models (whole models); NAME:mixer=M[:key=value...] "
                                       "puts mixer M (with those options) in the model, e.g. "
                                       "deit_tiny_patch16_224:mixer=laplacian")
    what.add_argument("--spec", help="a YAML suite (e.g. benchmarks/specs/*.yaml): its cases and entries timed in "
                                     "alternating rounds, with per-round ratios (see vitmix.bench.suite)")
    p.add_argument("--tokens", type=_int_list, default=None,
                   help=f"token counts for --mixers (default {','.join(map(str, DEFAULT_TOKENS))})")
    p.add_argument("--sizes", type=_int_list, default=None,
                   help=f"image sides for --models (default {','.join(map(str, DEFAULT_IMAGE_SIZES))})")
    p.add_argument("--batch", type=_int_list, default=[1],
                   help="batch size (default 1); with --sequence, comma-separated sizes to scan (e.g. 1,8)")
    p.add_argument("--dim", type=int, default=384, help="layer width for --mixers (default 384)")
    p.add_argument("--sequence", action="store_true",
                   help="--mixers on 1-D sequences of --tokens tokens (no token grid), as sequence models run them; "
                        "adds where each mixer gets faster than softmax and how its memory grows, per --batch "
                        "(vitmix.bench.long_sequence)")
    p.add_argument("--heads", type=int, default=6, help="heads for --mixers (default 6)")
    p.add_argument("--dtype", default="fp32",
                   help="fp32, bf16 or fp16 (half = autocast, parameters stay fp32) (default fp32)")
    p.add_argument("--passes", default=",".join(PASSES),
                   help="comma-separated: fwd, fwd+bwd (default both)")
    p.add_argument("--max-seconds", type=float, default=600.0,
                   help="time budget of the whole sweep; points that would not fit are skipped (default 600)")
    p.add_argument("--max-memory-gb", type=float, default=None,
                   help="skip points predicted to exceed this peak memory (default: half the available memory)")
    p.add_argument("--min-run-time", type=float, default=0.2, help="seconds of timing per point (default 0.2)")
    p.add_argument("--device", default="auto",
                   help="auto, cpu, cuda or cuda:i (default auto: cuda when visible); on CUDA, times are CUDA "
                        "events after a synchronised warm-up and memory is max_memory_allocated")
    p.add_argument("--baseline-model", default=DEFAULT_BASELINE_MODEL,
                   help=f"softmax model for ratios in --models mode (default {DEFAULT_BASELINE_MODEL})")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--no-flops", action="store_true", help="skip FLOP counting")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: all, torch.get_num_threads())")
    p.add_argument("--compile", action="store_true",
                   help="also time each point under torch.compile: compiled ms, compile seconds (first call, "
                        "not in the median) and the compiled / eager ratio")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend for --compile (default inductor)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results",
                   help="results directory (default ./bench-results): new, empty or an earlier bench's (a folder "
                        "of other files is refused); {machine} in it becomes the machine's name, e.g. "
                        "cpu-amd-epyc-2c-torch2.14, so that one machine's table never replaces another's")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def config_from_args(args) -> BenchConfig:
    kind = "mixers" if args.mixers else "models"
    if kind == "mixers" and args.sizes:
        raise ValueError("--sizes is for --models; use --tokens with --mixers")
    if kind == "models" and args.tokens:
        raise ValueError("--tokens is for --mixers; use --sizes with --models")
    if args.sequence and kind != "mixers":
        raise ValueError("--sequence is for --mixers (one layer on a 1-D sequence)")
    if len(args.batch) > 1 and not args.sequence:
        raise ValueError(f"--batch {','.join(map(str, args.batch))}: several batch sizes are for --sequence scans; "
                         "give one")
    if args.compile_backend != "inductor" and not args.compile:
        raise ValueError("--compile-backend is for --compile; add --compile")
    names = (args.mixers or args.models).split(",")
    return BenchConfig(
        kind=kind, names=names, sizes=args.tokens if kind == "mixers" else args.sizes,
        batch=args.batch[0], dim=args.dim, heads=args.heads, dtype=args.dtype.lower(),
        passes=tuple(p.strip() for p in args.passes.split(",") if p.strip()),
        max_seconds=args.max_seconds, max_memory_gb=args.max_memory_gb, min_run_time=args.min_run_time,
        device=args.device, baseline_model=args.baseline_model, seed=args.seed,
        measure_memory=not args.no_memory, measure_flops=not args.no_flops, threads=args.threads,
        compile=args.compile, compile_backend=args.compile_backend, sequence=args.sequence,
    )


def run(args) -> int:
    """Entry point of ``vitmix bench``."""
    from ..runs import check_output_dir
    from .env import environment, machine_tag
    from .report import RESULTS_MARKER, summary_text, write_results
    from .sweep import parse_device, run_sweep

    if args.spec:
        from .suite_cli import run_spec

        return run_spec(args)
    config = config_from_args(args)
    out = args.out
    if "{machine}" in out:           # the folder the results go to is the one checked
        out = out.replace("{machine}", machine_tag(environment(parse_device(config.device))))
    argv = sys.argv[1:]
    command = ("vitmix " + " ".join(shlex.quote(a) for a in argv) if argv and argv[0] == "bench"
               else "vitmix bench " + _reconstruct(args))
    if config.sequence:
        return _run_scan(args, config, out, command)
    check_output_dir(out, (RESULTS_MARKER,), "vitmix bench results")     # before the sweep's minutes
    result = run_sweep(config, progress=not args.no_progress)
    paths = write_results(result, out, command=command)
    print(summary_text(result))
    print()
    for note in result.notes:
        print("note:", note)
    print("wrote", ", ".join(paths))
    return 0


def _run_scan(args, config: BenchConfig, out: str, command: str) -> int:
    """``--sequence``: the sweep at each ``--batch`` size, with the crossover / memory-growth report."""
    from ..runs import check_output_dir
    from .long_sequence import SCAN_MARKER, run_scan, summary_lines, write_report

    check_output_dir(out, (SCAN_MARKER,), "vitmix bench --sequence results")
    results = run_scan(config, args.batch, progress=not args.no_progress)
    paths = write_report(results, out, command=command)
    print("\n".join(summary_lines(results)))
    print("wrote", ", ".join(paths))
    return 0


def _reconstruct(args) -> str:
    parts = []
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command") or value in (None, False):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts.append(f"{flag} {','.join(map(str, value))}")
        else:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


__all__ = ["add_parser", "run", "config_from_args"]
