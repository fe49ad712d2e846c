#!/usr/bin/env python3
"""make_train_ref.py: PyTorch references for dmove's trainer test (tests/test_train.c).

Two cases, written to tests/ref/train_stack.safetensors:

1. One training step of a stack of two BertLayers (make_refs.py's explicit layer, float64
   from float32-valued inputs) with a padding mask and dropout p=0.1: each layer's masks
   from dmove's Philox definition under the layer's own seed for step 1 (train_layer_seed,
   as src/train/adamw.c), the loss the mean squared error over the kept tokens' features,
   and every parameter's gradient.
2. One torch.optim.AdamW update (float32, foreach=False, the third step: the state is
   loaded with step 2 and given moments), for a tensor with weight decay and one without.

Usage: python3 tests/ref/make_train_ref.py [--out DIR]   (needs PyTorch and NumPy)
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_refs import bert_layer, make_params, param_shapes, write_safetensors  # noqa: E402

M64 = (1 << 64) - 1


def train_layer_seed(seed, layer, step):
    """SplitMix64 of (seed, layer, step), as dm_train_layer_seed."""
    z = seed ^ ((step * 0x9E3779B97F4A7C15) & M64) ^ (((layer + 1) * 0xD1B54A32D192ED03) & M64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


CFG = dict(b=2, j=5, i=8, heads=2, u=12, act="gelu", eps=1e-12, seed=7, p=0.1, layers=2, keep=[5, 3])


def stack_case(rng):
    b, j, i, u, L = CFG["b"], CFG["j"], CFG["i"], CFG["u"], CFG["layers"]
    f32 = np.float32
    x = rng.standard_normal((b, j, i)).astype(f32)
    target = rng.standard_normal((b, j, i)).astype(f32)
    mask = np.zeros((b, j), dtype=f32)
    for s, k in enumerate(CFG["keep"]):
        mask[s, :k] = 1
    prm = [make_params(i, u, rng, 0.3) for _ in range(L)]

    dt = torch.float64
    h = torch.tensor(x, dtype=dt)
    tm = torch.tensor(mask, dtype=dt)
    tp = [{k: torch.tensor(v, dtype=dt, requires_grad=True) for k, v in d.items()} for d in prm]
    for l in range(L):
        h = bert_layer(h, tm, tp[l], CFG["heads"], CFG["p"], train_layer_seed(CFG["seed"], l, 1), CFG["eps"],
                       CFG["act"])
    diff = (h - torch.tensor(target, dtype=dt)) * tm[:, :, None]
    kept = float(mask.sum()) * i
    loss = (diff * diff).sum() / kept
    loss.backward()

    out = [("hidden_states", x), ("attention_mask", mask), ("target", target)]
    for l in range(L):
        for name, _ in param_shapes(i, u):
            out.append((f"encoder.layer.{l}.{name}", prm[l][name]))
    out.append(("expected.output", h.detach().numpy()))
    out.append(("expected.loss", np.array([loss.item()])))
    for l in range(L):
        # the key bias's gradient is exactly zero (the softmax cancels it, make_refs.py):
        # stored as 0, not float64 round-off, so the test's relative error falls back to
        # the norm of dmove's result
        kb = tp[l]["attention.self.key.bias"].grad
        assert kb.norm() < 1e-12 * max(tp[l]["attention.self.key.weight"].grad.norm(), 1.0)
        kb.zero_()
        for name, _ in param_shapes(i, u):
            out.append((f"expected.encoder.layer.{l}.{name}.grad", tp[l][name].grad.numpy()))
    return out


ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, step=3)


def adamw_case(rng):
    out = []
    for tag, wd in (("decay", ADAMW["weight_decay"]), ("nodecay", 0.0)):
        n = 1000
        p0 = (0.05 * rng.standard_normal(n)).astype(np.float32)
        g = (1e-3 * rng.standard_normal(n) * np.exp(rng.uniform(-6, 2, n))).astype(np.float32)
        m0 = (0.5 * g + 1e-4 * rng.standard_normal(n)).astype(np.float32)
        v0 = (np.abs(g) ** 2 * rng.uniform(0.5, 2.0, n)).astype(np.float32)
        p = torch.tensor(p0.copy(), dtype=torch.float32, requires_grad=True)
        opt = torch.optim.AdamW([p], lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                                weight_decay=wd, foreach=False)
        opt.state[p] = {"step": torch.tensor(float(ADAMW["step"] - 1)), "exp_avg": torch.tensor(m0.copy()),
                        "exp_avg_sq": torch.tensor(v0.copy())}
        p.grad = torch.tensor(g.copy())
        opt.step()
        st = opt.state[p]
        assert float(st["step"]) == ADAMW["step"]
        out += [(f"adamw.{tag}.p0", p0), (f"adamw.{tag}.g", g), (f"adamw.{tag}.m0", m0), (f"adamw.{tag}.v0", v0),
                (f"adamw.{tag}.p1", p.detach().numpy()), (f"adamw.{tag}.m1", st["exp_avg"].numpy()),
                (f"adamw.{tag}.v1", st["exp_avg_sq"].numpy())]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    rng = np.random.default_rng(20261124)
    tensors = stack_case(rng) + adamw_case(rng)
    meta = {k: str(v) for k, v in CFG.items() if k != "keep"}
    meta.update({f"adamw_{k}": str(v) for k, v in ADAMW.items()})
    meta["torch"] = torch.__version__
    path = os.path.join(a.out, "train_stack.safetensors")
    write_safetensors(path, tensors, meta)
    print(f"wrote {path} ({len(tensors)} tensors; loss {tensors[[n for n, _ in tensors].index('expected.loss')][1][0]:.6f})")


if __name__ == "__main__":
    main()
