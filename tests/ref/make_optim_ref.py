#!/usr/bin/env python3
"""make_optim_ref.py: PyTorch references for dmove's optimizers (tests/test_optim.c).

One BertLayer's 16 parameters (i=8, u=12; make_refs.py's shapes, weights decay, biases and
LayerNorm parameters do not), trained for three updates from given gradients, in float64:
each update takes K micro-batches' gradients, their mean, clipped by
torch.nn.utils.clip_grad_norm_ over all 16 tensors, then one optimizer step with the
update's learning rate (dmove's schedule: linear warm-up from lr/W at update 1, then
lr_end + (lr - lr_end) * ((total - s + 1) / (total - W))^power; its decay part is checked
here against transformers' get_polynomial_decay_schedule_with_warmup, whose step s - 1 it
is). Cases:
  adamw: torch.optim.AdamW (foreach=False), K=3, clipping active, polynomial decay (power 2);
  lamb:  LAMB as NVIDIA's apex FusedLAMB defines it (bias correction, decoupled decay in the
         direction, trust ratio ||w|| / ||u|| on the tensors with weight decay, 1 where a
         norm is 0), K=2, clipping active, linear decay;
  lamb1: LAMB, K=1, no clipping, constant rate.
Written to tests/ref/optim.safetensors: p0.<name> (float32 start), g.<u>.<m>.<name> (the
gradients of update u's micro-batch m), and <case>.{p,m,v}.<name> after the three updates;
the metadata holds each case's settings.

Usage: python3 tests/ref/make_optim_ref.py [--out DIR]   (needs PyTorch, NumPy, transformers)
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_refs import param_shapes, write_safetensors  # noqa: E402

I, U, UPDATES, KMAX = 8, 12, 3, 3
CASES = {
    "adamw": dict(kind="adamw", lr=2e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.05, warmup=1, total=4,
                  power=2.0, lr_end=1e-5, clip=0.05, K=3),
    "lamb": dict(kind="lamb", lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, warmup=1, total=4,
                 power=1.0, lr_end=0.0, clip=0.05, K=2),
    "lamb1": dict(kind="lamb", lr=5e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1, warmup=0, total=0,
                  power=1.0, lr_end=0.0, clip=0.0, K=1),
}


def lr_at(c, s):
    if c["warmup"] > 0 and s <= c["warmup"]:
        return c["lr"] * s / c["warmup"]
    if c["total"] > 0:
        if s > c["total"]:
            return c["lr_end"]
        left = (c["total"] - s + 1) / (c["total"] - c["warmup"])
        return c["lr_end"] + (c["lr"] - c["lr_end"]) * left ** c["power"]
    return c["lr"]


def check_schedule_against_hf(c):
    """The decay part is transformers' polynomial schedule at its step s - 1."""
    if c["total"] == 0:
        return
    from transformers import get_polynomial_decay_schedule_with_warmup
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=c["lr"])
    sch = get_polynomial_decay_schedule_with_warmup(opt, c["warmup"], c["total"], lr_end=c["lr_end"],
                                                     power=c["power"])
    for s in range(1, c["total"] + 2):
        hf = c["lr"] * sch.lr_lambdas[0](s - 1)
        if s > c["warmup"]:
            assert abs(hf - lr_at(c, s)) <= 1e-12 * c["lr"], (s, hf, lr_at(c, s))


def lamb_step(params, state, c, lr, step, decays):
    b1, b2, eps = c["beta1"], c["beta2"], c["eps"]
    with torch.no_grad():
        for p, wd in zip(params, decays):
            st = state.setdefault(p, {"m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            g = p.grad
            st["m"].mul_(b1).add_(g, alpha=1 - b1)
            st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
            mh = st["m"] / (1 - b1 ** step)
            vh = st["v"] / (1 - b2 ** step)
            u = mh / (vh.sqrt() + eps) + wd * p
            ratio = 1.0
            if wd != 0:
                wn, un = p.norm().item(), u.norm().item()
                if wn > 0 and un > 0:
                    ratio = wn / un
            p.sub_(lr * ratio * u)


def run_case(c, p0, grads):
    params = [torch.tensor(p0[n].astype(np.float64), requires_grad=True) for n, _ in param_shapes(I, U)]
    decays = [c["weight_decay"] if len(s) == 2 else 0.0 for _, s in param_shapes(I, U)]
    if c["kind"] == "adamw":
        groups = [{"params": [p], "weight_decay": wd} for p, wd in zip(params, decays)]
        opt = torch.optim.AdamW(groups, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"], foreach=False)
    state = {}
    for u in range(1, UPDATES + 1):
        for k, p in enumerate(params):
            p.grad = sum(torch.tensor(grads[u][m][k].astype(np.float64)) for m in range(c["K"])) / c["K"]
        if c["clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, c["clip"])
            assert norm > c["clip"], "the case is to clip"
        lr = lr_at(c, u)
        if c["kind"] == "adamw":
            for gr in opt.param_groups:
                gr["lr"] = lr
            opt.step()
        else:
            lamb_step(params, state, c, lr, u, decays)
    out = []
    for k, (name, _) in enumerate(param_shapes(I, U)):
        p = params[k]
        if c["kind"] == "adamw":
            m, v = opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]
        else:
            m, v = state[p]["m"], state[p]["v"]
        out += [(f"{c['name']}.p.{name}", p.detach().numpy()), (f"{c['name']}.m.{name}", m.numpy()),
                (f"{c['name']}.v.{name}", v.numpy())]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    rng = np.random.default_rng(20261127)
    p0, tensors = {}, []
    for name, shape in param_shapes(I, U):
        base = 1.0 if name.endswith("LayerNorm.weight") else 0.0
        p0[name] = (base + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        tensors.append((f"p0.{name}", p0[name]))
    p0["attention.self.key.weight"][:] = 0  # a decaying tensor whose norm is 0 (LAMB's ratio 1)
    grads = {}
    for u in range(1, UPDATES + 1):
        grads[u] = []
        for m in range(KMAX):
            gs = []
            for name, shape in param_shapes(I, U):
                g = (0.05 * rng.standard_normal(shape) * np.exp(rng.uniform(-3, 1, shape))).astype(np.float32)
                gs.append(g)
                tensors.append((f"g.{u}.{m}.{name}", g))
            grads[u].append(gs)
    meta = {"torch": torch.__version__, "updates": str(UPDATES)}
    for name, c in CASES.items():
        c = dict(c, name=name)
        check_schedule_against_hf(c)
        tensors += run_case(c, p0, grads)
        for k, v in c.items():
            if k != "name":
                meta[f"{name}.{k}"] = str(v)
    path = os.path.join(a.out, "optim.safetensors")
    write_safetensors(path, tensors, meta)
    print(f"wrote {path} ({len(tensors)} tensors)")


if __name__ == "__main__":
    main()
