"""The model families of ``docs/compile-export.md`` and their small test configurations, shared by the
compile/export tests and the CUDA parity tests (``tests/gpu``)."""
from pathlib import Path

import torch

import vitmix
from vitmix.export import example_call

DOC = Path(__file__).resolve().parents[1] / "docs" / "compile-export.md"

#: small configuration of each family's representative (one block per stage, small images). The
#: pyramids run at 128² (stage 4: a 4×4 grid): at 64² the untrained LaplacianFormer's 2×2 landmark
#: kernels make it so ill-conditioned that float32 vs float64 already differ by 2e-5 of the output
PYRAMID = dict(depths=(1, 1, 1, 1), img_size=128)
FAMILY_CONFIGS = {
    "vit_*_patch4_32": dict(depth=1),
    "vit_*_fibottention": dict(depth=1),
    "soft_*": PYRAMID,
    "soft_norm_*": PYRAMID,
    "laplacianformer_*": PYRAMID,
    "weightformer_*": dict(depth=2, img_size=32),          # block 1 is dynamic
    "dit_*": dict(depth=1),
    "weightformer_dit_*": dict(depth=2),
    "timesformer_*": dict(depth=1),
    "timesformer_*_fibottention": dict(depth=1),
    "seq_*": dict(depth=1, seq_len=64),
}


def doc_table(heading_start: str):
    """Rows (dicts by column name, backticks stripped) of the first table after the heading."""
    lines = DOC.read_text().split(heading_start, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip().strip("|").split("|")])
    header, body = rows[0], rows[2:]          # rows[1] is the |---| separator
    return [dict(zip(header, row)) for row in body]


FAMILIES = doc_table("Model families")


def family_model(row):
    """The family's representative (``tested as``) in its small configuration, seeded, in eval mode."""
    torch.manual_seed(0)
    model = vitmix.create_model(row["tested as"], **FAMILY_CONFIGS[row["models"]]).eval()
    if hasattr(model, "example_inputs"):
        perturb_zero_init(model)
    return model


def perturb_zero_init(model):
    """Small random values for the all-zero tensors of an adaLN-Zero init, whose output is exactly 0 (an
    export that dropped every block would still match it)."""
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.02)


def image_shape(model):
    if not hasattr(model, "img_size") and hasattr(model, "example_inputs"):
        return ()                     # called with its example inputs only (sequence models: ids, no image)
    size = getattr(getattr(model, "patch_embed", None), "img_size", None) or model.img_size
    return (3, *((size, size) if isinstance(size, int) else size))


def model_inputs(model, batch: int):
    """Random inputs: images, or the example call of diffusion backbones (``model(x, t, y)``: random
    images, timesteps and labels, the null class included)."""
    if hasattr(model, "example_inputs"):
        return example_call(model, batch)
    return (torch.randn(batch, *image_shape(model), generator=torch.Generator().manual_seed(batch)),)
