"""Parameters and multiply–accumulates of the SOFT and LaplacianFormer pyramid models at 224².

MACs = ``torch.utils.flop_counter.FlopCounterMode`` FLOPs / 2 over one forward (matmuls, linears,
convolutions) plus the L1-distance accumulations of the Laplacian kernel, which the counter cannot see
and which are added analytically; "without NS" replaces the Newton–Schulz iterations by the exact
inverse, which the counter does not count either, the convention of the papers' tables. Counts do not
depend on the machine (see ``docs/soft-laplacianformer.md``, "How MACs are counted").

    python benchmarks/pyramid_macs.py        # writes benchmarks/results/pyramid_macs/{macs.md,macs.json}
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from vitmix._util import markdown_table

OUT_DIR = Path(__file__).resolve().parent / "results" / "pyramid_macs"


def count_macs(name: str, newton: bool, img: int = 224) -> dict:
    """G MACs of ``name`` at ``img``²: FlopCounterMode/2 plus the Laplacian L1 accumulations."""
    import timm
    from torch.utils.flop_counter import FlopCounterMode

    import vitmix  # noqa: F401
    from vitmix.mixers.laplacian import LaplacianAttention

    # "without NS": the exact inverse, which FlopCounterMode does not count (no formula for linalg.inv)
    model = timm.create_model(name, mixer_options=None if newton else {"inverse": "exact"}).eval()
    l1 = [0]

    def hook(mod, args, kwargs, out):
        n, (h, w) = args[0].shape[1], kwargs["hw"]
        mh, mw = mod.landmark_count(h, w)
        m = mh * mw
        l1[0] += mod.num_heads * mod.head_dim * (2 * n * m + m * m)  # |x - y| summed per element

    for mod in model.modules():
        if isinstance(mod, LaplacianAttention):
            mod.register_forward_hook(hook, with_kwargs=True)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, 3, img, img))
    params = sum(p.numel() for p in model.parameters())
    return {"matmul_conv_gmacs": counter.get_total_flops() / 2e9, "l1_gmacs": l1[0] / 1e9, "params_m": params / 1e6}


def macs_table(args, info, cmd) -> None:
    names = [f"{fam}_{s}" for fam in ("soft", "laplacianformer")
             for s in ("tiny", "small", "medium", "large", "huge")]
    rows = []
    for name in names:
        full = count_macs(name, newton=True)
        no_ns = count_macs(name, newton=False)
        row = {"model": name, "params_m": full["params_m"],
               "gmacs": full["matmul_conv_gmacs"] + full["l1_gmacs"],
               "gmacs_without_newton": no_ns["matmul_conv_gmacs"] + no_ns["l1_gmacs"],
               "l1_gmacs": full["l1_gmacs"]}
        rows.append(row)
        print(row, flush=True)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "macs.json").write_text(json.dumps({"machine": info, "command": cmd, "rows": rows}, indent=2))
    lines = [
        "# Pyramid models: parameters and multiply–accumulates at 224²",
        "",
        f"Command: `{cmd}`  ",
        f"torch {info['torch']}. MACs = `torch.utils.flop_counter.FlopCounterMode` FLOPs / 2 (matmuls, "
        "linears, convolutions; it does not count elementwise ops, exp, norms or pooling) + the L1-distance "
        "accumulations of the Laplacian kernel (N·m·d per kernel matrix, added analytically since "
        "cdist/fused loops are not counted). 'without NS' drops the 20 Newton–Schulz iterations "
        "(2·m³ per iteration and head); SOFT's README numbers are reproduced by that column.",
        "",
    ]
    cells = [[r["model"], f"{r['params_m']:.2f}", f"{r['gmacs']:.2f}", f"{r['gmacs_without_newton']:.2f}",
              f"{r['l1_gmacs']:.2f}"] for r in rows]
    lines.append(markdown_table(["model", "params (M)", "G MACs", "G MACs without NS", "of which L1"], cells,
                                align="lrrrr"))
    (out / "macs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = ap.parse_args(argv)
    info = {"torch": torch.__version__, "python": platform.python_version()}
    cmd = ("python benchmarks/pyramid_macs.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    macs_table(args, info, cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
