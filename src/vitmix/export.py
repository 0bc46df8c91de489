"""``vitmix export``: a model as an ONNX file checked with onnxruntime, or as a ``torch.export`` program.

    vitmix export --model laplacianformer_tiny --format onnx --out model.onnx
    vitmix export --model deit_tiny_patch16_224 --mixer soft --checkpoint runs/x/best.safetensors
    vitmix export --model vit_nano_patch4_32_fibottention --format pt2 --out model.pt2

Both formats have a dynamic batch dimension (the image size is fixed at export: ``--img-size``).
Models whose forward takes more than images (the diffusion backbones' ``model(x, t, y)``) expose
``example_inputs(batch_size, generator)``; every input then gets the dynamic batch and the ONNX
inputs are ``images`` followed by the forward's own argument names.

* ``pt2``: :func:`export_program` (``torch.export``, inference) saved with ``torch.export.save``. The
  ``vitmix::*`` custom ops stay single nodes: loading the file needs ``import vitmix`` (which
  registers them) and runs vitmix's own kernels, the CPU C kernels included.
* ``onnx``: the same program with the custom ops rewritten into standard operators
  (:func:`vitmix.ops.export_decompositions`: Newton–Schulz as a fixed loop of matmuls, the sparse
  Fibottention product as gathers, ...), converted by ``torch.onnx.export`` (the dynamo exporter),
  then run by onnxruntime at two batch sizes and compared with PyTorch: the command fails when the
  largest difference exceeds ``1e-4`` of the largest PyTorch output. Needs ``pip install 'vitmix[export]'``
  (``onnx``, ``onnxscript``, ``onnxruntime``).

The command is the checked convenience: ``torch.onnx.export(model, ..., dynamo=True)``, timm's
``onnx_export`` and ``torch.export.load`` work on vitmix models after ``import vitmix`` alone (the
ops decompose themselves while ``torch.onnx`` traces; see ``docs/compile-export.md``).

Options that ONNX cannot express are a one-line ``ValueError`` naming the option to change
(``newton_alpha="safe"`` on untied landmarks picks its start with a Cholesky test; ``inverse="exact"``
is an LU solve with a pseudo-inverse fallback).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

FORMATS = ("onnx", "pt2")
#: the largest |onnxruntime - PyTorch| allowed, relative to the largest |PyTorch| output
PARITY_RTOL = 1e-4
PIP_HINT = "pip install 'vitmix[export]' (or: pip install onnx onnxscript onnxruntime)"
# ATen ops that survive vitmix's decompositions only for options ONNX has no operator for
_NOT_IN_ONNX = {
    "linalg_cholesky_ex": "newton_alpha='safe' on untied landmarks (its start is chosen by a Cholesky test, "
                          "which ONNX lacks); build the model with newton_alpha='transpose' or 'official'",
}


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a model to ONNX (checked with onnxruntime) or torch.export (.pt2)",
                       description="Export a model with a dynamic batch dimension: --format onnx writes an ONNX "
                                   "file and checks it against PyTorch with onnxruntime; --format pt2 writes a "
                                   "torch.export program (load it with torch.export.load after import vitmix).")
    p.add_argument("--model", help="a model name (vitmix models, timm's vit_*/deit_*; default: the one a vitmix "
                                   "--checkpoint records)")
    p.add_argument("--mixer", help="token mixer for timm ViT/DeiT models and the isotropic vitmix ViTs")
    p.add_argument("--checkpoint", help="weights: a vitmix checkpoint or run directory (model rebuilt from its "
                                        "metadata), or a torch .pt/.pth state dict for --model")
    p.add_argument("--format", default="onnx", help="onnx (default) or pt2")
    p.add_argument("--out", help="output file (default: MODEL.onnx / MODEL.pt2)")
    p.add_argument("--img-size", type=int, help="image size (default: the model's, or the checkpoint's)")
    p.add_argument("--opset", type=int, help="ONNX opset version (default: torch.onnx's)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime / reload check")
    p.set_defaults(func=run_export)


def run_export(args) -> int:
    fmt = check_format(args.format)
    if fmt == "onnx":
        require_packages(("onnx", "onnxscript") + (() if args.no_verify else ("onnxruntime",)))
    if args.opset is not None and fmt != "onnx":
        raise ValueError("--opset applies to --format onnx only; drop it for --format pt2")
    name = args.model or recorded_model(args.checkpoint)
    out = Path(args.out or f"{name}.{fmt}")
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give a file name such as {out / (name + '.' + fmt)}")
    model, example = build_model(name, args.mixer, args.checkpoint, args.img_size)
    program = export_program(model, example)
    if fmt == "pt2":
        import torch

        out.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, str(out))
        print(f"wrote {out} (torch.export program, {out.stat().st_size / 2**20:.1f} MiB)")
        for name, value in zip(_input_names(program), _as_tuple(example)):
            print(f"  input  {name}: {str(value.dtype).replace('torch.', '')} {_shape_text(value.shape)}")
        errors = {} if args.no_verify else pt2_parity(out, model, _image_shape(example))
    else:
        info = write_onnx(program, out, args.opset)
        print(f"wrote {out} (ONNX opset {info['opset']}, {out.stat().st_size / 2**20:.1f} MiB)")
        for kind in ("inputs", "outputs"):
            for name, dtype, shape in info[kind]:
                print(f"  {kind[:-1]:<6} {name}: {dtype} {shape}")
        errors = {} if args.no_verify else onnxruntime_parity(out, model, _image_shape(example))
    return _report_parity(errors, "onnxruntime" if fmt == "onnx" else "torch.export.load")


def check_format(fmt: str) -> str:
    """``fmt`` if supported, else a ``ValueError`` that says what to use instead."""
    if fmt in FORMATS:
        return fmt
    from ._util import close_matches

    if fmt.lower() in ("torchscript", "jit", "ts", "pt"):
        hint = " (TorchScript is not supported: torch.jit is deprecated in favour of torch.export, which pt2 writes)"
    else:
        hint = "." + close_matches(fmt, FORMATS) if close_matches(fmt, FORMATS) else ""
    raise ValueError(f"unsupported export format {fmt!r}; use --format onnx or --format pt2{hint}")


def require_packages(names: Sequence[str]) -> None:
    """A one-line ``ValueError`` naming the pip install when an optional export package is missing."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise ValueError(f"ONNX export needs the package(s) {', '.join(missing)}: {PIP_HINT}")


def build_model(name: str, mixer: Optional[str] = None, checkpoint: Optional[str] = None,
                img_size: Optional[int] = None):
    """The model in eval mode and an example batch of 2 images (the exported batch size is dynamic), or
    the model's own ``example_inputs`` call at batch 2 when its forward takes more than images."""
    import torch

    from .models import create_model

    meta = _checkpoint_meta(checkpoint) if checkpoint else None
    if meta is not None:
        model, in_chans, size = _from_vitmix_checkpoint(name, mixer, checkpoint, img_size, meta)
    else:
        kwargs = {} if img_size is None else {"img_size": img_size}
        model = create_model(name, mixer=mixer, **kwargs)
        if checkpoint:
            from .runs import load_into, read_state_dict

            load_into(model, read_state_dict(checkpoint), checkpoint)
        cfg = getattr(model, "pretrained_cfg", {}) or {}
        in_chans = int(getattr(model, "in_chans", (cfg.get("input_size") or (3,))[0]))
        size = img_size or int((cfg.get("input_size") or (3, 224, 224))[-1])
    if hasattr(model, "example_inputs"):
        return model.eval(), example_call(model, 2)
    example = torch.randn(2, in_chans, size, size, generator=torch.Generator().manual_seed(0))
    return model.eval(), example


def recorded_model(checkpoint: Optional[str]) -> str:
    """The model a vitmix checkpoint (or run directory) records, for ``--checkpoint`` without ``--model``."""
    if checkpoint is None:
        raise ValueError("give --model NAME (see `vitmix models`), or --checkpoint RUN_OR_FILE of a vitmix run")
    meta = _checkpoint_meta(checkpoint)
    if meta is None:
        raise ValueError(f"--checkpoint {checkpoint} is a plain state dict that does not say its model: "
                         "add --model NAME")
    return meta["model"]


def _checkpoint_meta(checkpoint: str) -> Optional[dict]:
    """The vitmix metadata of a checkpoint file or run directory, or ``None`` for a plain state dict."""
    from .runs import load_weights, resolve_checkpoint

    path = resolve_checkpoint(checkpoint)
    if path.suffix != ".safetensors":
        return None
    meta = load_weights(path)[1]
    return meta if "model" in meta else None


def _from_vitmix_checkpoint(name, mixer, checkpoint, img_size, meta) -> Tuple[object, int, int]:
    from .runs import load_model

    def load(path, device):
        if meta.get("task") == "segmentation":   # a `vitmix dense` segmenter: images → per-pixel logits
            from .dense.runner import load_dense

            return load_dense(path, device)[0]
        if meta.get("task") == "detection":
            raise ValueError(f"{checkpoint} is a detector (torchvision R-CNN: lists of images in, lists of dicts "
                             "out); `vitmix export` exports classifiers and segmenters")
        return load_model(path, device)

    if meta["model"] != name or (mixer is not None and mixer != meta.get("mixer")):
        raise ValueError(f"{checkpoint} holds {meta['model']} (mixer={meta.get('mixer') or 'default'}), not "
                         f"{name}{f' (mixer={mixer})' if mixer else ''}; pass --model {meta['model']}"
                         + (f" --mixer {meta['mixer']}" if meta.get("mixer") else ""))
    if "sequence" in meta:       # a sequence model (vitmix train on listops, ...): its example_inputs give the ids
        if img_size is not None:
            raise ValueError(f"{checkpoint} is a sequence model (ids of up to {meta['sequence']['seq_len']} tokens), "
                             "not an image model; drop --img-size")
        return load(checkpoint, "cpu"), 1, int(meta["sequence"]["seq_len"])
    if img_size is not None and img_size != int(meta["img_size"]):
        raise ValueError(f"{checkpoint} was trained at img_size={meta['img_size']}; drop --img-size "
                         f"(the checkpoint's size is used)")
    return load(checkpoint, "cpu"), int(meta["in_chans"]), int(meta["img_size"])


def example_call(model, batch: int, seed: Optional[int] = None) -> tuple:
    """Random arguments of one ``model(...)`` call at ``batch`` for a model with ``example_inputs``
    (``model(x, t, y)``: images, timesteps, labels); seeded with ``batch`` unless ``seed`` is given."""
    import torch

    return tuple(model.example_inputs(batch, generator=torch.Generator().manual_seed(batch if seed is None else seed)))


def export_program(model, example):
    """``torch.export`` of ``model`` (inference, ``no_grad``) with a dynamic batch dimension; the
    vitmix custom ops stay single nodes (see :mod:`vitmix.ops.decompositions` to rewrite them).

    ``example``: a batch of images, or a tuple of the forward's arguments (all batch-first; e.g. from
    :func:`example_call`), which then share the dynamic batch."""
    import torch

    args = _as_tuple(example)
    if args[0].shape[0] < 2:
        raise ValueError("export_program needs an example batch of >= 2 images (batch 1 would be specialised)")
    batch = torch.export.Dim("batch", min=1)
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        with torch.no_grad():
            return torch.export.export(model.eval(), args, dynamic_shapes=tuple({0: batch} for _ in args))
    except GuardOnDataDependentSymNode:
        if getattr(model, "pad_id", None) is None:
            raise
        # a sequence model that masks its padding (ListOps): landmark and per-length mixers size their work by
        # each sample's real length, which a traced graph cannot hold
        raise ValueError(f"this sequence model masks its padding (pad_id={model.pad_id}) and its mixer sizes its "
                         "work by each sample's length, which torch.export cannot trace; export a model with a mixer "
                         "that masks within the batch (softmax, performer, linear, linformer, topk, nystromformer)"
                         ) from None


def _as_tuple(example) -> tuple:
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def _image_shape(example) -> Tuple[int, ...]:
    return tuple(_as_tuple(example)[0].shape[1:])


def _input_names(program) -> list:
    """``images`` for the first input, the forward's own argument names for the others."""
    from torch.export.graph_signature import InputKind

    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return ["images", *names[1:]]


def onnx_program(program, opset: Optional[int] = None):
    """The ``torch.onnx`` program of an exported program, vitmix's custom ops decomposed first."""
    import torch

    from .ops import export_decompositions

    require_packages(("onnx", "onnxscript"))
    decomposed = program.run_decompositions(export_decompositions())
    _check_onnx_ops(decomposed)
    names = _input_names(program)
    with torch.no_grad():     # a classifier's output is logits; a diffusion backbone's is its prediction
        return torch.onnx.export(decomposed, dynamo=True, opset_version=opset, input_names=names,
                                 output_names=["logits" if len(names) == 1 else "prediction"], verbose=False)


def _check_onnx_ops(program) -> None:
    import torch

    for gm in program.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            op = getattr(node.target, "__name__", str(node.target)).split(".")[0]
            if op in _NOT_IN_ONNX:
                raise ValueError(f"this model cannot be exported to ONNX: {_NOT_IN_ONNX[op]}")


def write_onnx(program, path: Path, opset: Optional[int] = None) -> Dict[str, object]:
    """Write the ONNX file; returns its ``opset`` and ``inputs``/``outputs`` as (name, dtype, shape)."""
    import onnx

    proto = onnx_program(program, opset).model_proto
    _name_batch_dim(proto)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(path))
    opset_used = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return {"opset": opset_used, "inputs": [_value_info(v) for v in proto.graph.input],
            "outputs": [_value_info(v) for v in proto.graph.output]}


def _name_batch_dim(proto) -> None:
    """Call the symbolic batch dimension ``batch`` (the exporter names it after an internal symbol)."""
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    symbol = dim0.dim_param
    if not symbol:
        return
    for value in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == symbol:
                dim.dim_param = "batch"


def _value_info(value) -> Tuple[str, str, str]:
    import onnx

    t = value.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) for d in t.shape.dim]
    return value.name, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "[" + ", ".join(dims) + "]"


def _shape_text(shape) -> str:
    return "[" + ", ".join(["batch", *(str(s) for s in shape[1:])]) + "]"


def relative_error(got, want) -> float:
    """``max |got - want| / max |want|`` (float64)."""
    import torch

    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _reference(model, args: tuple):
    import torch

    with torch.no_grad():
        return model(*args)


def _parity_inputs(model, image_shape: Tuple[int, ...], batch: int) -> tuple:
    """The inputs of the parity checks at ``batch``: random images, or :func:`example_call`."""
    import torch

    if hasattr(model, "example_inputs"):
        return example_call(model, batch)
    return (torch.randn(batch, *image_shape, generator=torch.Generator().manual_seed(batch)),)


def onnxruntime_parity(path: Path, model, image_shape: Tuple[int, ...], batches=(1, 3)) -> Dict[int, float]:
    """``{batch: relative error}`` of onnxruntime's output against ``model`` (CPU, float32)."""
    require_packages(("onnxruntime",))
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    errors = {}
    for b in batches:
        args = _parity_inputs(model, image_shape, b)
        feed = {name: a.numpy() for name, a in zip(names, args)}
        errors[b] = relative_error(session.run(None, feed)[0], _reference(model, args))
    return errors


def pt2_parity(path: Path, model, image_shape: Tuple[int, ...], batches=(1, 3)) -> Dict[int, float]:
    """``{batch: relative error}`` of the reloaded ``.pt2`` program against ``model``."""
    import torch

    loaded = torch.export.load(str(path)).module()
    errors = {}
    for b in batches:
        args = _parity_inputs(model, image_shape, b)
        errors[b] = relative_error(_reference(loaded, args), _reference(model, args))
    return errors


def _report_parity(errors: Dict[int, float], runner: str) -> int:
    if not errors:
        return 0
    text = ", ".join(f"{err:.1e} at batch {b}" for b, err in errors.items())
    ok = max(errors.values()) <= PARITY_RTOL
    print(f"  {runner} vs PyTorch: max relative error {text} (limit {PARITY_RTOL:g}): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


__all__ = ["FORMATS", "PARITY_RTOL", "add_parser", "build_model", "check_format", "example_call", "export_program",
           "onnx_program", "onnxruntime_parity", "pt2_parity", "relative_error", "require_packages", "write_onnx"]
