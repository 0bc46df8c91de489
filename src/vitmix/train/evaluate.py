"""``vitmix eval``: its parser (timm ``validate.py``'s flag names where they mean the same) and the
command. A classifier is scored by :func:`.validation.validate` (printed, and written by
``--results-file`` as CSV or JSON, as timm does) or under ``--corruptions`` by :mod:`.robustness`;
another task's checkpoint goes to its own evaluator (``runs/tasks.py``).

The parser is built without torch (``vitmix --help`` stays fast): everything heavy is imported inside
the functions."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional, Sequence

from .validation import CROP_MODES, INTERPOLATIONS, PREPROCESSING, validate

_CORRUPTION_FLAGS = ("severities", "seed", "out")


def add_parser(sub) -> None:
    """The ``vitmix eval`` sub-parser (timm ``validate.py``'s flag names where they mean the same)."""
    e = sub.add_parser(
        "eval", help="evaluate a run, a checkpoint or a timm/vitmix model on a validation split (timm's validate.py)",
        description="Evaluate a classifier on a validation split, preprocessed from the model's data config "
                    "(timm's resolve_data_config; --img-size, --crop-pct, ... override it), with timm "
                    "validate.py's result keys (top1, top5, param_count, ...): a vitmix run directory or "
                    "checkpoint, or --model NAME with --pretrained or --checkpoint FILE. With --corruptions, "
                    "also under image corruptions (ImageNet-C family), written to corruptions.md/.csv/.json/.png. "
                    "A dense (segmentation/detection) run is evaluated by its task's metrics.")
    e.add_argument("checkpoint_path", nargs="?", metavar="RUN_DIR_OR_CHECKPOINT",
                   help="a run directory (its best.safetensors) or a .safetensors checkpoint")
    e.add_argument("--checkpoint", help="the same, as a flag; with --model: that model's weights (a run, a vitmix "
                                        "or timm checkpoint, or a torch state dict)")
    e.add_argument("--model", "-m", metavar="NAME",
                   help="build this model (see `vitmix models`; also timm's hf-hub:REPO and local-dir:DIR) instead "
                        "of a run's, with the weights of --pretrained or --checkpoint")
    e.add_argument("--pretrained", action="store_true", help="with --model: timm's pretrained weights of it")
    e.add_argument("--mixer", help="with --model: replace its attention by this mixer (pretrained softmax weights "
                                   "are converted, see docs/convert.md)")
    e.add_argument("--model-kwargs", "--model-option", dest="model_option", nargs="+", action="extend",
                   metavar="KEY=VALUE", help="with --model: constructor options (e.g. depth=4 drop_path_rate=0.1)")
    e.add_argument("--mixer-option", "-M", action="append", metavar="KEY=VALUE",
                   help="with --mixer: a mixer option, repeatable (e.g. -M num_landmarks=16)")
    e.add_argument("--num-classes", type=int, metavar="N",
                   help="with --model: its classifier's classes (default: the checkpoint's, else the data's; "
                        "with --pretrained, the pretrained head's)")
    e.add_argument("--use-ema", action="store_true",
                   help="evaluate the EMA weights: a run's ema.safetensors, a timm checkpoint's state_dict_ema")
    e.add_argument("--data", help="dataset (default: the one the run was trained on; with --model and --data-dir: "
                                  "imagefolder)")
    e.add_argument("--data-dir", help="the dataset's folder (default: the run's); for imagefolder, as in timm's "
                                      "validate.py: DIR/val/<class>/* (or validation/), else DIR/<class>/*")
    e.add_argument("--batch-size", "-b", type=int, default=128)
    e.add_argument("--workers", "-j", type=int, default=0, help="data-loading processes (default: 0, in-process)")
    e.add_argument("--device")
    e.add_argument("--amp", action="store_true", help="bf16 autocast")
    pre = e.add_argument_group("preprocessing", "override the model's data config (timm validate.py's flags)")
    pre.add_argument("--img-size", type=int, metavar="S", help="input size S×S")
    pre.add_argument("--input-size", type=int, nargs=3, metavar=("C", "H", "W"), help="channels and size")
    pre.add_argument("--crop-pct", type=float, metavar="F", help="resize to size / F, then centre-crop the size")
    pre.add_argument("--crop-mode", choices=CROP_MODES)
    pre.add_argument("--interpolation", choices=INTERPOLATIONS)
    pre.add_argument("--mean", type=float, nargs="+", metavar="M", help="one value, or one per channel")
    pre.add_argument("--std", type=float, nargs="+", metavar="S", help="one value, or one per channel")
    e.add_argument("--results-file", metavar="PATH", help="also write the result to PATH (as timm's validate.py)")
    e.add_argument("--results-format", choices=("csv", "json"),
                   help="format of --results-file (default: json for a .json file, else csv, timm's default)")
    e.add_argument("--corruptions", metavar="all|NAME,NAME",
                   help="also evaluate under these corruptions (names and parameters: docs/robustness.md)")
    e.add_argument("--severities", metavar="1,2,3", help="corruption severities, 1..5 (default: 1,2,3,4,5)")
    e.add_argument("--seed", type=int, help="seed of the corruptions' random noise (default: 0)")
    e.add_argument("--out", metavar="DIR", help="corruption report directory (default: the run directory, "
                                                "or the checkpoint's folder)")
    e.set_defaults(func=run_eval)


def run_eval(args) -> int:
    """``vitmix eval``: ``--model`` builds a classifier by name; otherwise the checkpoint's task picks its
    evaluator (``runs/tasks.py``)."""
    from ..runs.tasks import evaluator

    checkpoint = _eval_checkpoint(args)
    if args.model is not None:
        return eval_classifier(args, checkpoint)
    if checkpoint is None:
        raise ValueError("give a run directory or checkpoint (vitmix eval RUN), or --model NAME with --pretrained "
                         "or --checkpoint FILE")
    return evaluator(checkpoint)(args, checkpoint)


def eval_classifier(args, checkpoint: Optional[str]) -> int:
    """``vitmix eval`` of a classifier: the validation result (printed, and ``--results-file``), or the
    corruption report."""
    from ..runs.flags import parse_key_values

    if args.corruptions is not None:
        return _run_corruptions(args, checkpoint)
    given = [flag for flag in _CORRUPTION_FLAGS if getattr(args, flag) is not None]
    if given:
        raise ValueError(f"--{given[0]} sets up the corruption report: add --corruptions all (or names)")
    if args.results_format is not None and args.results_file is None:
        raise ValueError("--results-format is the format of --results-file: give --results-file PATH too")
    results_file = _results_file(args.results_file)
    record = validate(checkpoint, model=args.model, pretrained=args.pretrained, mixer=args.mixer,
                      mixer_options=parse_key_values(args.mixer_option) or None,
                      model_options=parse_key_values(args.model_option) or None,
                      num_classes=args.num_classes, use_ema=args.use_ema, data=args.data, data_dir=args.data_dir,
                      batch_size=args.batch_size, workers=args.workers, device=args.device, amp=args.amp,
                      preprocessing={k: getattr(args, k) for k in PREPROCESSING})
    print(describe(record))
    if results_file is not None:
        write_results(results_file, record, args.results_format or results_format(results_file))
    return 0


def describe(record: dict) -> str:
    """One line of a :func:`validate` result."""
    if record.get("seq_len"):
        items = f"{record['images']} sequences of up to {record['seq_len']} ids"
    else:
        how = (f"{record['img_size']}px, crop_pct {record['crop_pct']}, {record['interpolation']}"
               if record["interpolation"] else f"{record['img_size']}px clips")
        items = f"{record['images']} images, {how}"
    return (f"{record['model']} (mixer={record['mixer'] or 'default'}) on {record['data']}: top-1 "
            f"{record['top1']:.2f}%, top-5 {record['top5']:.2f}% ({items}), "
            f"loss {record['loss']:.4f}, {record['param_count']}M params  [{record['checkpoint'] or 'pretrained'}]")


def results_format(path) -> str:
    """``--results-file``'s format when ``--results-format`` is not given: json for a ``.json`` file, else
    csv (timm's default)."""
    return "json" if Path(path).suffix.lower() == ".json" else "csv"


def write_results(path, record: dict, fmt: str) -> None:
    """Write one result as timm's ``validate.py`` does: JSON, or CSV with a header row (atomically)."""
    from ..runs import save_text

    if fmt == "json":
        text = json.dumps(record, indent=2) + "\n"
    else:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(record), lineterminator="\n")
        writer.writeheader()
        writer.writerow(record)
        text = out.getvalue()
    save_text(Path(path), text)


# --- the command's plumbing -----------------------------------------------------------------------------------

def _results_file(path):
    """``--results-file``, checked before any work: a file in an existing folder."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--results-file {path} is a directory; give a file name such as {path / 'results.csv'}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"--results-file {path}: the folder {path.parent} does not exist")
    return path


def _eval_checkpoint(args) -> Optional[str]:
    """The checkpoint given positionally or with --checkpoint (one of them, both the same, or none)."""
    given = {c for c in (args.checkpoint_path, args.checkpoint) if c}
    if len(given) > 1:
        raise ValueError(f"two different checkpoints given ({' and '.join(sorted(given))}); give one")
    return given.pop() if given else None


def _flags_given(args, names: Sequence[str]) -> list:
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) not in (None, False)]


def _run_corruptions(args, checkpoint: Optional[str]) -> int:
    """``vitmix eval --corruptions``: every name, severity and path is checked before any work."""
    from ..data.corruptions import parse_corruptions, parse_severities
    from .robustness import (
        REPORT_FILES, corruption_summary, corruption_table, default_report_dir, evaluate_checkpoint_corruptions,
        write_corruption_report,
    )
    from ..runs import check_output_dir
    from .runner import resolve_checkpoint

    if args.results_file is not None:
        raise ValueError("--results-file is for the plain evaluation; with --corruptions the results go to "
                         "corruptions.json in --out")
    other = _flags_given(args, ("model", "pretrained", "mixer", "num_classes", "model_option", "mixer_option",
                                "use_ema", *PREPROCESSING, "results_format"))
    if other:
        raise ValueError(f"{other[0]} is for the plain evaluation; --corruptions evaluates a run's checkpoint with "
                         "its dataset's preprocessing (for its EMA: give RUN/ema.safetensors)")
    if checkpoint is None:
        raise ValueError("give a run directory or checkpoint: vitmix eval RUN --corruptions all")
    names = parse_corruptions(args.corruptions)
    severities = parse_severities(args.severities if args.severities is not None else "1,2,3,4,5")
    resolve_checkpoint(checkpoint)                      # a missing checkpoint fails here, before the data
    out = Path(args.out) if args.out else default_report_dir(checkpoint)
    if args.out:          # a folder given must be new, empty, a run's or hold an earlier report
        check_output_dir(out, ("corruptions.json", "config.yaml"), "corruption report")
    elif not (out / "corruptions.json").is_file():    # the checkpoint's folder: never over files of yours
        theirs = [name for name in REPORT_FILES if (out / name).exists()]
        if theirs:
            raise ValueError(f"{out} holds {theirs[0]}, which no corruption report wrote: give --out DIR for "
                             "the report, so that no file of yours is overwritten")
    result = evaluate_checkpoint_corruptions(
        checkpoint, data=args.data, data_dir=args.data_dir, device=args.device, corruptions=names,
        severities=severities, seed=args.seed or 0, batch_size=args.batch_size, amp=args.amp)
    paths = write_corruption_report(result, out)
    print(f"{result['model']} (mixer={result['mixer'] or 'default'}) on {result['data']}  [{result['checkpoint']}]")
    print(corruption_table(result))
    print(corruption_summary(result))
    print(f"report: {paths['corruptions.md']} (+ .csv, .json, .png)")
    return 0
