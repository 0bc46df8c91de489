"""Put a retrained entry's runs into a committed leaderboard (the other entries' run folders are not in git).

A committed board (``experiments/compare/results/<board>/``) keeps every run's numbers in its ``leaderboard.json``;
when one entry is retrained (its defaults changed) with the board's own recipe, seeds and budget into a fresh
``vitmix compare`` folder, this rewrites the board with that entry's runs replaced and everything else as
committed: ranks, Welch's p against the best, the CSVs and the plots are recomputed from the runs.

    vitmix compare --config configs/compare-fashion-mnist.yaml --mixers laplacian --seeds 0,1,2 \\
        --corruptions all --severities 1,3,5 --corruption-images 300 --out runs/compare/fashion-mnist-laplacian
    python experiments/compare/replace_entry.py experiments/compare/results/fashion-mnist \\
        runs/compare/fashion-mnist-laplacian --entries laplacian

The retrained board must have the committed board's recipe, seeds and budget (checked). The header keeps the
committed board's machine line; the retrained entry's cost columns were measured on the retrain's machine
(``retrained.json`` beside the board records which entries and where).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitmix.compare.leaderboard import write_leaderboard
from vitmix.train import TrainConfig

#: recipe keys that may differ between the two boards (where the runs were written, not how they trained)
_RUN_LOCATION = ("out", "resume")


def _board(folder: Path) -> dict:
    path = folder / "leaderboard.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: give a folder written by `vitmix compare`")
    return json.loads(path.read_text())


def _recipe(board: dict) -> dict:
    """The board's recipe with today's defaults for the options added since it was written."""
    return {k: v for k, v in TrainConfig.from_dict(board["recipe"]).to_dict().items() if k not in _RUN_LOCATION}


def _check_same_setup(committed: dict, new: dict) -> None:
    mine, theirs = _recipe(committed), _recipe(new)
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differ or committed["seeds"] != new["seeds"] or committed["budget"] != new["budget"]:
        raise ValueError(f"the retrained board differs from the committed one (recipe keys {differ}, seeds "
                         f"{committed['seeds']} vs {new['seeds']}, budget {committed['budget']} vs {new['budget']}): "
                         "retrain with the committed board's compare.yaml")


def replace_entries(board: Path, retrained: Path, entries) -> list:
    """Rewrite ``board`` with the runs of ``entries`` taken from ``retrained``; returns the written paths."""
    committed, new = _board(board), _board(retrained)
    _check_same_setup(committed, new)
    fresh = {r["entry"]: r["runs"] for r in new["rows"] if r["entry"] in entries}
    missing = sorted(set(entries) - set(fresh))
    if missing:
        raise ValueError(f"{retrained} has no runs of {missing} (it has {[r['entry'] for r in new['rows']]})")
    runs = [run for r in committed["rows"] for run in (fresh.pop(r["entry"]) if r["entry"] in fresh else r["runs"])]
    runs += [run for group in fresh.values() for run in group]       # entries the committed board did not have
    paths = write_leaderboard(runs, board, TrainConfig.from_dict(committed["recipe"]), committed["environment"],
                              seeds=committed["seeds"], budget=committed["budget"])
    record = board / "retrained.json"
    done = json.loads(record.read_text()) if record.is_file() else {}
    done.update({e: {"environment": new["environment"], "from": retrained.as_posix()} for e in entries})
    record.write_text(json.dumps(done, indent=2) + "\n")
    return paths + [record]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("board", type=Path, help="the committed board's folder")
    ap.add_argument("retrained", type=Path, help="the `vitmix compare` folder with the retrained entries")
    ap.add_argument("--entries", required=True, help="comma-separated entries to take from the retrained folder")
    args = ap.parse_args(argv)
    for path in replace_entries(args.board, args.retrained, [e for e in args.entries.split(",") if e]):
        print(path)


if __name__ == "__main__":
    main()
