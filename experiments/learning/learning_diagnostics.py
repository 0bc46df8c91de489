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

    python experiments/learning/learning_diagnostics.py --mixers softmax,soft,laplacian --epochs 4
    python experiments/learning/learning_diagnostics.py --mixers laplacian -M norm_eps=1e-3   # an option under test

Any recipe with ``--config`` (e.g. a grid point, ``configs/grid/fmnist196-w96h3-short.yaml``), a
smaller ``--train-subset``, ``--seeds``; ``--val-subset N`` also reports the accuracy on the first
N validation images after each epoch. For the kernel mixers every block and head is also recorded
(``layers`` in ``results.json``, a per-block table in ``results.md``): the kernel spread, the
Newton residual, the attention entropy, the scale of the kernel-attention output and of the local
conv's output, and for ``laplacian`` the normalisation statistics: the column variances of the
centred Nyström matrix over the queries against ``norm_eps`` (the median ratio and the share of
columns below it, i.e. damped towards the uniform map).

    python experiments/learning/learning_diagnostics.py --config configs/grid/fmnist196-w96h3-short.yaml \
        --train-subset 3000 --epochs 2 --val-subset 2000 --mixers soft,laplacian

Trained runs instead (``--runs``): the same per-block, per-head statistics of each run's kernel mixers, plus
the condition number of ``P = W + εI``, what each head's kernel attention and local conv add to the block
output through the head's columns of the output projection (their ratio; a head is "on" when it is at least
``ON_SHARE``) and ``laplacian``'s learnt mean(V) weights, on its first ``--images`` validation images (no
training), with a summary per run (heads on, medians, the run's final accuracy), e.g. good and bad seeds or
head counts side by side:

    python experiments/learning/learning_diagnostics.py --runs runs/a runs/b --images 64 --out DIR

Writes ``experiments/learning/results/diagnostics/{results.md,results.json}`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
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


def _mixer_inputs(model, x):
    """The model's token mixers and the input each one saw in one forward of ``x``."""
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw: inputs.__setitem__(mod, args[0]), with_kwargs=True)
             for m in mixers]
    model(x)
    for h in hooks:
        h.remove()
    return mixers, inputs


@torch.no_grad()
def _attention_stats(model, x) -> dict:
    mixers, inputs = _mixer_inputs(model, x)
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


@torch.no_grad()
def _layer_stats(model, x) -> list:
    """Per block and head of a kernel mixer (``soft``/``laplacian``): see the module docstring."""
    mixers, inputs = _mixer_inputs(model, x)
    return [_block_stats(m, inputs[m]) for m in mixers if hasattr(m, "_attend") and hasattr(m, "landmark_count")]


def _per_head(t: torch.Tensor) -> list:
    """std over batch, tokens and channels of each head of ``t (B, heads, N, d)``."""
    return [float(t[:, i].std()) for i in range(t.shape[1])]


def _block_stats(m, x) -> dict:
    from vitmix.mixers.grid import head_conv
    from vitmix.ops import gaussian_kernel, laplacian_kernel, newton_schulz_inverse

    grid = m.token_grid(x.shape[1])
    prefix, h, w = grid
    laplacian = hasattr(m, "_project")
    if laplacian:
        q, k, v, lq, lk, _ = m._project(x, grid)
        lam = m.lam / m.qk_scale
        cq, wl = laplacian_kernel(q, lk, lam), laplacian_kernel(lq, lk, lam)
        attn = m._attend(q, k, v, lq, lk)
        local = m._local(v, grid).view(x.shape[0], h * w, m.num_heads, -1).transpose(1, 2) if m.conv_kernel else None
        eye = torch.eye(x.shape[1]).expand(x.shape[0], m.num_heads, -1, -1)
        amap = m._attend(q, k, eye, lq, lk)
    else:
        q, v = m._qv(x)
        lm = m._landmarks(q, grid)
        cq, wl = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
        attn = m._attend(q, v, lm)
        local = head_conv(m.conv, v, prefix, h, w) if m.conv_kernel else None
        eye = torch.eye(x.shape[1]).expand(x.shape[0], m.num_heads, -1, -1)
        amap = m._attend(q, eye, lm)
    _, res = newton_schulz_inverse(wl, iters=m.newton_iters, eps=m.newton_eps, alpha=m.newton_alpha,
                                   return_residual=True)
    cond = torch.linalg.cond(wl + m.newton_eps * torch.eye(wl.shape[-1], dtype=wl.dtype))    # (B, heads)
    p = amap.abs() / amap.abs().sum(-1, keepdim=True).clamp_min(1e-30)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1).mean(dim=(0, 2))
    stats = {"kernel_cv": [float(c.std() / c.mean()) for c in cq.unbind(1)],
             "kernel_mean": [float(c.mean()) for c in cq.unbind(1)],
             "newton_residual": [float(r) / math.sqrt(wl.shape[-1]) for r in res.mean(0)],
             "newton_cond": [float(c) for c in cond.median(0).values],
             "entropy": [float(e) for e in ent], "attn_std": _per_head(attn),
             "local_std": _per_head(local) if local is not None else None, "v_std": _per_head(v)}
    stats.update(_head_contributions(m, attn[:, :, prefix:], local))
    if laplacian and m.normalize:
        from vitmix.ops import nystrom_attention

        g = nystrom_attention(q, k, eye, lq, lk, kernel="laplacian", lam=lam, iters=m.newton_iters,
                              eps=m.newton_eps, alpha=m.newton_alpha, inverse=m.inverse)
        r = g - g.mean(-1, keepdim=True)
        ratio = r.var(dim=-2, correction=0) / m.norm_eps                  # (B, heads, N_k)
        stats["colvar_over_eps"] = [float(t.median()) for t in ratio.unbind(1)]
        stats["damped_share"] = [float((t < 1).float().mean()) for t in ratio.unbind(1)]
    return stats


#: a head is "on" when its kernel-attention path reaches the block output with at least this share of the size
#: of its local conv path; trained `soft` heads sit at 1e-4..1e-2 or 0.3..10 (bimodal), so any threshold in
#: 0.02..0.2 counts the same heads
ON_SHARE = 0.1


def _head_contributions(m, attn: torch.Tensor, local) -> dict:
    """What each head adds to the block output on the grid tokens: the std of its kernel-attention output ``attn
    (B, heads, HW, d)`` and of its local conv output (same shape) mapped through the head's columns of the output
    projection, their ratio,
    whether the head is "on" (:data:`ON_SHARE`), and ``laplacian``'s learnt weight of the map's mean(V) term."""
    d = m.head_dim
    w = (m.proj if hasattr(m, "proj") else m.ff).weight.to(attn.dtype)     # SOFT names its output linear ff
    heads = range(m.num_heads)
    attn_out = [float((attn[:, i] @ w[:, i * d:(i + 1) * d].T).std()) for i in heads]
    stats = {"attn_out": attn_out}
    if local is not None:
        local = local.to(attn.dtype)
        local_out = [float((local[:, i] @ w[:, i * d:(i + 1) * d].T).std()) for i in heads]
        ratio = [a / max(lo, 1e-30) for a, lo in zip(attn_out, local_out)]
        stats.update(local_out=local_out, attn_over_local=ratio, heads_on=sum(r >= ON_SHARE for r in ratio))
    weight = getattr(m, "mean_weight", None)
    if isinstance(weight, torch.Tensor):
        stats["mean_weight"] = [float(v) for v in weight.detach()]
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


@torch.no_grad()
def _val_acc(model, val_loader) -> float:
    model.eval()
    right = total = 0
    for xb, yb in val_loader:
        right += int((model(xb).argmax(-1) == yb).sum())
        total += len(yb)
    return 100.0 * right / total


def diagnose(mixer: str, options: dict, epochs: int, cfg: TrainConfig, val_subset: int = 0) -> list:
    from vitmix.train.runner import _subset

    torch.manual_seed(cfg.seed)
    train_set, val_set, info = build_datasets(cfg.data, cfg.img_size, None, False)
    train_set = _subset(train_set, cfg.train_subset, cfg.seed)
    loader, _ = build_loaders(train_set, val_set, cfg.batch_size, 0, cfg.seed)
    val_loader = None
    if val_subset:
        val_loader = torch.utils.data.DataLoader(torch.utils.data.Subset(val_set, range(val_subset)), batch_size=256)
    model = vitmix.create_model(cfg.model, mixer=mixer, mixer_options=options or None, num_classes=info.num_classes,
                                in_chans=info.in_chans, img_size=cfg.img_size, **cfg.model_options)
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
        row = {"mixer": mixer, "options": options, "seed": cfg.seed, "epoch": epoch,
               "grad_total": math.sqrt(sum(groups.values())),
               **{f"grad {k}": math.sqrt(v) for k, v in sorted(groups.items())}, **_attention_stats(model, probe_x)}
        row["layers"] = _layer_stats(model, probe_x)
        if val_loader is not None:
            row["val_acc"] = _val_acc(model, val_loader)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "layers"}), flush=True)
    return rows


def write(rows, out: Path, env: dict, cmd: str, recipe: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"environment": env, "command": cmd, "rows": rows}, indent=2))
    keys = ["val_acc", "grad_total", "grad attn proj", "grad attn other", "grad mlp", "grad embed", "out_over_in",
            "entropy", "kernel_cv", "newton_residual"]
    keys = [k for k in keys if any(k in r for r in rows)]
    lines = [f"# Learning diagnostics ({recipe}, one fixed training batch)", "", f"Command: `{cmd}`  ",
             f"{env['cpu']}, torch {env['torch']}, {env['date_utc']}. Gradient norms before clipping; "
             "entropy of each query's attention row in nats (uniform over N keys = ln N); val_acc on the "
             "first --val-subset validation images.", ""]
    cells = [[r["mixer"], _options(r), r.get("seed", 0), r["epoch"]]
             + ["–" if r.get(k) is None else f"{r[k]:.3g}" for k in keys] for r in rows]
    lines.append(markdown_table(["mixer", "options", "seed", "epoch"] + keys, cells))
    layered = [r for r in rows if r.get("layers")]
    if layered:
        lines += ["", "Per block (values per head, separated by /): kernel spread std/mean of K(Q, landmarks), "
                  "entropy, std of the kernel-attention output and of the local conv's output, and for "
                  "laplacian the median column variance of the centred Nyström matrix over norm_eps and "
                  "the share of columns below norm_eps:", ""]
        lkeys = ["kernel_cv", "entropy", "attn_std", "local_std", "v_std", "colvar_over_eps", "damped_share"]
        cells = [[r["mixer"], _options(r), r.get("seed", 0), r["epoch"], i]
                 + ["–" if layer.get(k) is None else "/".join(f"{v:.3g}" for v in layer[k]) for k in lkeys]
                 for r in layered for i, layer in enumerate(r["layers"])]
        lines.append(markdown_table(["mixer", "options", "seed", "epoch", "block"] + lkeys, cells))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def trained(run: str, images: int) -> dict:
    """Per-block statistics of a trained run's kernel mixers (:func:`_block_stats`) on its first ``images``
    validation images."""
    from vitmix.runs.checkpoints import load_checkpoint

    model, meta, path = load_checkpoint(run)
    _, val_set, _ = build_datasets(meta["data"], int(meta["img_size"]), None, False, augment=False)
    x = torch.stack([val_set[i][0] for i in range(min(images, len(val_set)))])
    layers = _layer_stats(model, x)
    if not layers:
        raise SystemExit(f"{run}: {meta.get('mixer') or meta['model']} has no kernel (landmark) mixer to diagnose")
    summary = Path(run) / "summary.json"
    acc = json.loads(summary.read_text()).get("final_val_acc") if summary.is_file() else None
    mixer = next(m for m in model.modules() if isinstance(m, TokenMixer))
    return {"run": str(run), "checkpoint": path.name, "mixer": meta.get("mixer") or meta["model"],
            "options": meta.get("mixer_options") or {}, "images": len(x), "layers": layers,
            "heads": mixer.num_heads, "head_dim": mixer.head_dim, "final_val_acc": acc}


def write_trained(rows, out: Path, env: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"environment": env, "command": cmd, "rows": rows}, indent=2))
    keys = ["newton_residual", "newton_cond", "kernel_cv", "entropy", "attn_std", "local_std", "attn_over_local",
            "mean_weight"]
    cells = [[r["run"], r["mixer"], i] + ["–" if layer.get(k) is None else "/".join(f"{v:.3g}" for v in layer[k])
                                          for k in keys]
             for r in rows for i, layer in enumerate(r["layers"])]
    summary = [[r["run"], r["mixer"], f"{r['heads']}×{r['head_dim']}",
                "–" if r.get("final_val_acc") is None else f"{r['final_val_acc']:.2f}",
                f"{sum(layer.get('heads_on', 0) for layer in r['layers'])}/{r['heads'] * len(r['layers'])}",
                f"{_median(v for layer in r['layers'] for v in layer['kernel_cv']):.3g}",
                f"{_median(v for layer in r['layers'] for v in layer.get('attn_over_local') or [math.nan]):.3g}",
                f"{_median(v for layer in r['layers'] for v in layer['entropy']):.3g}"]
               for r in rows]
    lines = ["# Kernel-mixer statistics of trained runs", "", f"Command: `{cmd}`  ",
             f"{env['cpu']}, torch {env['torch']}, {env['date_utc']}. Per block, values per head separated by /, "
             f"on each run's first {rows[0]['images']} validation images: the Newton–Schulz residual "
             "‖I − PV‖_F/√m after the mixer's own iterations (mean over images; P = W + εI, W the landmark "
             "kernel matrix), the condition number of P (median), the kernel spread std/mean of K(Q, landmarks), "
             "the attention entropy in nats, the std of the kernel-attention and local-conv outputs, the ratio of "
             "the two after the output projection (each head's columns of `proj`), and `laplacian`'s learnt weight "
             f"of the map's mean(V) term. A head is on when that ratio is at least {ON_SHARE}.", "",
             markdown_table(["run", "mixer", "heads × dim", "final top-1 %", "heads on", "median kernel_cv",
                             "median attn/local", "median entropy"], summary), "",
             markdown_table(["run", "mixer", "block"] + keys, cells)]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


def _options(row) -> str:
    return ", ".join(f"{k}={v}" for k, v in row["options"].items()) or "defaults"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixers", default="softmax,soft,laplacian")
    ap.add_argument("--config", type=Path, default=ROOT.parents[1] / "configs" / "digits.yaml",
                    help="the recipe (default: the demo's configs/digits.yaml)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of the recipe's schedule to follow")
    ap.add_argument("--schedule-epochs", type=int, help="length of the cosine schedule (default: the recipe's)")
    ap.add_argument("--train-subset", type=int, help="train on a seeded subset of this many images")
    ap.add_argument("--val-subset", type=int, default=0, help="report accuracy on the first N validation images")
    ap.add_argument("--seeds", default="", help="comma-separated seeds (default: the recipe's)")
    ap.add_argument("-M", "--mixer-option", action="append", help="KEY=VALUE for every mixer (an option under test)")
    ap.add_argument("--runs", nargs="+", help="trained run directories (or checkpoints): diagnose them, no training")
    ap.add_argument("--images", type=int, default=64, help="--runs: validation images per run (default 64)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "diagnostics")
    args = ap.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cmd = "python experiments/learning/learning_diagnostics.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.runs:
        with torch.no_grad():
            rows = [trained(run, args.images) for run in args.runs]
        write_trained(rows, args.out, environment(), cmd.strip())
        return
    values = load_yaml(args.config)
    values.update({k: v for k, v in (("epochs", args.schedule_epochs), ("train_subset", args.train_subset))
                   if v is not None})
    options = parse_key_values(args.mixer_option)
    seeds = [int(x) for x in args.seeds.split(",") if x] or [values.get("seed", 0)]
    rows = [r for seed in seeds for m in args.mixers.split(",")
            for r in diagnose(m, options, args.epochs, TrainConfig.from_dict({**values, "seed": seed}),
                              args.val_subset)]
    write(rows, args.out, environment(), cmd.strip(), f"`{args.config.as_posix()}`")


if __name__ == "__main__":
    main()
