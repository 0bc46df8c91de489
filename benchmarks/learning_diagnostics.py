"""Why a mixer learns slowly: gradient norms, kernel-value spread, attention entropy, Newton residual.

Trains the demo recipe (``configs/digits.yaml``: ``vit_nano_patch4_32`` on digits, AdamW, cosine
schedule, clip 1.0, label smoothing 0.1, seed 0) for a few epochs with each mixer and, at
initialisation and after every epoch, records on one fixed training batch:

* the gradient norm of each parameter group (attention projections, attention's other parameters
  such as the local conv, MLPs, norms, embeddings, head) and the total norm before clipping;
* the mixer's output scale relative to its input (``std(out) / std(x)``, mean over blocks);
* the entropy of each query's attention row (``attention_map``; kernel maps are normalised as
  ``|w| / sum |w|``), in nats, mean over blocks, heads and queries (uniform over 65 keys: 4.17);
* kernel mixers: the spread of the landmark kernel ``C_q`` values (``std / mean``) and the
  Newton–Schulz residual ``||I - P V||_F / sqrt(m)`` of the first block's landmark matrices.

    python benchmarks/learning_diagnostics.py --mixers softmax,soft,laplacian --epochs 4
    python benchmarks/learning_diagnostics.py --mixers laplacian -M norm_eps=1e-3   # an option under test

Writes ``benchmarks/results/learning/diagnostics/{results.md,results.json}`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler

import vitmix
from vitmix._util import markdown_table
from vitmix.bench.env import environment
from vitmix.data import build_datasets, build_loaders
from vitmix.mixers import TokenMixer
from vitmix.train.config import TrainConfig, load_yaml, parse_key_values

ROOT = Path(__file__).resolve().parent


def _group(name: str) -> str:
    if ".attn." in name:
        leaf = name.split(".attn.")[1].split(".")[0]
        return "attn proj" if leaf in ("qkv", "proj", "W_q", "W_v", "ff") else "attn other"
    if ".mlp." in name:
        return "mlp"
    if "norm" in name:
        return "norms"
    if name.startswith("head"):
        return "head"
    return "embed"


@torch.no_grad()
def _attention_stats(model, x) -> dict:
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw: inputs.__setitem__(mod, args[0]), with_kwargs=True)
             for m in mixers]
    model(x)
    for h in hooks:
        h.remove()
    ent, scale = [], []
    for m in mixers:
        xin = inputs[m]
        scale.append(float(m(xin).std() / xin.std()))
        w = m.attention_map(xin).abs().float()
        p = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        ent.append(float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean()))
    stats = {"out_over_in": sum(scale) / len(scale), "entropy": sum(ent) / len(ent)}
    first = mixers[0]
    if hasattr(first, "landmark_count") and hasattr(first, "_attend"):
        stats.update(_kernel_stats(first, inputs[first]))
    return stats


def _kernel_stats(mixer, x) -> dict:
    from vitmix.ops import gaussian_kernel, laplacian_kernel, newton_schulz_inverse

    grid = mixer.token_grid(x.shape[1])
    if hasattr(mixer, "_project"):                      # laplacian: q, k, landmarks
        q, _, _, lq, lk, _ = mixer._project(x, grid)
        lam = mixer.lam / mixer.qk_scale
        cq, w = laplacian_kernel(q, lk, lam), laplacian_kernel(lq, lk, lam)
    else:                                               # soft: tied
        q, _ = mixer._qv(x)
        lm = mixer._landmarks(q, grid)
        cq, w = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    _, res = newton_schulz_inverse(w, iters=mixer.newton_iters, eps=mixer.newton_eps,
                                   alpha=mixer.newton_alpha, return_residual=True)
    return {"kernel_cv": float(cq.std() / cq.mean()), "newton_residual": float(res.mean() / math.sqrt(w.shape[-1]))}


def diagnose(mixer: str, options: dict, epochs: int, cfg: TrainConfig) -> list:
    torch.manual_seed(cfg.seed)
    train_set, val_set, info = build_datasets(cfg.data, cfg.img_size, None, False)
    loader, _ = build_loaders(train_set, val_set, cfg.batch_size, 0, cfg.seed)
    model = vitmix.create_model(cfg.model, mixer=mixer, mixer_options=options or None, num_classes=info.num_classes,
                                in_chans=info.in_chans, img_size=cfg.img_size)
    opt = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = len(loader)
    sched = CosineLRScheduler(opt, t_initial=steps * cfg.epochs, lr_min=cfg.min_lr,
                              warmup_t=int(cfg.warmup_epochs * steps), warmup_lr_init=cfg.lr * 0.01,
                              warmup_prefix=True, t_in_epochs=False)
    loss_fn = LabelSmoothingCrossEntropy(cfg.smoothing)
    probe_x, probe_y = next(iter(loader))
    rows, step = [], 0
    for epoch in range(epochs + 1):
        if epoch:
            model.train()
            for xb, yb in loader:
                loss = loss_fn(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                opt.step()
                step += 1
                sched.step_update(num_updates=step)
        model.eval()
        model.zero_grad(set_to_none=True)
        loss_fn(model(probe_x), probe_y).backward()
        groups = {}
        for name, p in model.named_parameters():
            if p.grad is not None:
                groups[_group(name)] = groups.get(_group(name), 0.0) + float(p.grad.pow(2).sum())
        row = {"mixer": mixer, "options": options, "epoch": epoch,
               "grad_total": math.sqrt(sum(groups.values())),
               **{f"grad {k}": math.sqrt(v) for k, v in sorted(groups.items())}, **_attention_stats(model, probe_x)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def write(rows, out: Path, env: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"environment": env, "command": cmd, "rows": rows}, indent=2))
    keys = ["grad_total", "grad attn proj", "grad attn other", "grad mlp", "grad embed", "out_over_in", "entropy",
            "kernel_cv", "newton_residual"]
    lines = ["# Learning diagnostics (demo recipe, one fixed training batch)", "", f"Command: `{cmd}`  ",
             f"{env['cpu']}, torch {env['torch']}, {env['date_utc']}. Gradient norms before clipping (clip 1.0); "
             "entropy of each query's attention row in nats (uniform over 65 keys = 4.17).", ""]
    cells = [[r["mixer"], ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "defaults", r["epoch"]]
             + ["–" if r.get(k) is None else f"{r[k]:.3g}" for k in keys] for r in rows]
    lines.append(markdown_table(["mixer", "options", "epoch"] + keys, cells))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixers", default="softmax,soft,laplacian")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of the 20-epoch schedule to follow")
    ap.add_argument("-M", "--mixer-option", action="append", help="KEY=VALUE for every mixer (an option under test)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "learning" / "diagnostics")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cfg = TrainConfig.from_dict(load_yaml(ROOT.parent / "configs" / "digits.yaml"))
    options = parse_key_values(args.mixer_option)
    rows = [r for m in args.mixers.split(",") for r in diagnose(m, options, args.epochs, cfg)]
    cmd = "python benchmarks/learning_diagnostics.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write(rows, args.out, environment(), cmd.strip())


if __name__ == "__main__":
    main()
