#!/usr/bin/env python3
"""make_refs.py: PyTorch references for dmove's whole-layer test (tests/ref/README.md).

One training step of a Hugging Face BertLayer (post-LayerNorm, training mode) written out
explicitly in torch, computed in float64 from float32-valued inputs, with dropout masks
from dmove's Philox definition (philox.py). Each case is written to
tests/ref/layer_<cfg>_p<p>.safetensors with its float32 inputs and expected results.

Before writing, the script checks itself: the explicit operators against
torch.nn.functional, the whole explicit layer against a second composition from torch.nn
modules (nn.MultiheadAttention, nn.LayerNorm, nn.Linear) with dropout off, and the
explicit layer's gradients with torch.autograd.gradcheck on a tiny case with dropout on.

Usage: python3 tests/ref/make_refs.py [--out DIR] [--check-only] [--cases P,Q,R]
(needs PyTorch and NumPy: on Debian, apt-get install python3-torch python3-numpy and run
/usr/bin/python3; or pip install torch numpy.)
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from philox import dropout_keep  # noqa: E402

DROP_ATTN_PROBS, DROP_ATTN_OUT, DROP_FFN_OUT = 1, 2, 3

# Parameter names as in Hugging Face BertLayer's state dict, with their shapes.
def param_shapes(i, u):
    return [
        ("attention.self.query.weight", (i, i)), ("attention.self.query.bias", (i,)),
        ("attention.self.key.weight", (i, i)), ("attention.self.key.bias", (i,)),
        ("attention.self.value.weight", (i, i)), ("attention.self.value.bias", (i,)),
        ("attention.output.dense.weight", (i, i)), ("attention.output.dense.bias", (i,)),
        ("attention.output.LayerNorm.weight", (i,)), ("attention.output.LayerNorm.bias", (i,)),
        ("intermediate.dense.weight", (u, i)), ("intermediate.dense.bias", (u,)),
        ("output.dense.weight", (i, u)), ("output.dense.bias", (i,)),
        ("output.LayerNorm.weight", (i,)), ("output.LayerNorm.bias", (i,)),
    ]


# --- the layer, written out ----------------------------------------------------------

def linear(x, w, b):
    """nn.Linear: x @ w^T + b, w stored (out, in)."""
    return torch.matmul(x, w.transpose(0, 1)) + b


def layer_norm(x, w, b, eps):
    """nn.LayerNorm over the last dim: biased variance, eps inside the square root."""
    mu = x.mean(dim=-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(dim=-1, keepdim=True)
    return xc / torch.sqrt(var + eps) * w + b


def softmax(s):
    m = s.max(dim=-1, keepdim=True).values
    e = torch.exp(s - m)
    return e / e.sum(dim=-1, keepdim=True)


def activation(x, act):
    if act == "gelu":  # exact: x * Phi(x)
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if act == "gelu_tanh":  # HF gelu_new / gelu_pytorch_tanh
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if act == "relu":
        return torch.clamp(x, min=0.0)
    raise ValueError(act)


def dropout_scale(seed, stream, shape, p, dtype):
    """keep / (1 - p) as a tensor (all ones for p == 0): inverted dropout's multiplier."""
    if p == 0:
        return None
    keep = dropout_keep(seed, stream, shape, p)
    return torch.from_numpy(keep.astype(np.float64) / (1.0 - p)).to(dtype)


def bert_layer(x, attention_mask, prm, heads, p, seed, eps, act, norm="post", causal=False):
    """Hugging Face BertLayer forward in training mode (post-LN), explicit; norm="pre"
    moves the LayerNorms onto the inputs of attention and FFN (residuals bypass them, as
    nn.TransformerEncoderLayer(norm_first=True)); causal masks the keys after each query.

    x (b, j, i); attention_mask (b, j) with 1 = token, 0 = padding; prm: name -> tensor.
    Dropout masks: site 1 attention probs (b, h, j, k), site 2 attention output (b, j, i),
    site 3 FFN output (b, j, i), from dmove's Philox definition."""
    b, j, i = x.shape
    h = heads
    d = i // h
    dt = x.dtype

    def heads_split(t):  # (b, j, i) -> (b, h, j, d), head-major split of i
        return t.view(b, j, h, d).permute(0, 2, 1, 3)

    ln1 = lambda t: layer_norm(t, prm["attention.output.LayerNorm.weight"],  # noqa: E731
                               prm["attention.output.LayerNorm.bias"], eps)
    ln2 = lambda t: layer_norm(t, prm["output.LayerNorm.weight"],  # noqa: E731
                               prm["output.LayerNorm.bias"], eps)
    xa = ln1(x) if norm == "pre" else x
    q = heads_split(linear(xa, prm["attention.self.query.weight"], prm["attention.self.query.bias"]))
    k = heads_split(linear(xa, prm["attention.self.key.weight"], prm["attention.self.key.bias"]))
    v = heads_split(linear(xa, prm["attention.self.value.weight"], prm["attention.self.value.bias"]))
    # HF get_extended_attention_mask: (1 - mask) * finfo(model dtype).min, the model being
    # float32; in float64 it drives the masked scores to ~-3.4e38, so their probabilities
    # are exactly 0, as they are in float32.
    keep = attention_mask[:, None, None, :].to(dt).expand(b, 1, j, j)
    if causal:  # key k > query q masked as padding is: (1 - 0) * finfo.min
        keep = keep * torch.tril(torch.ones(j, j, dtype=dt))
    ext = (1.0 - keep) * torch.finfo(torch.float32).min
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d) + ext
    probs = softmax(scores)
    ds = dropout_scale(seed, DROP_ATTN_PROBS, (b, h, j, j), p, dt)
    if ds is not None:
        probs = probs * ds
    ctx = torch.matmul(probs, v)  # (b, h, j, d)
    ctx = ctx.permute(0, 2, 1, 3).reshape(b, j, i)  # merge heads: h outer, d inner
    attn = linear(ctx, prm["attention.output.dense.weight"], prm["attention.output.dense.bias"])
    ds = dropout_scale(seed, DROP_ATTN_OUT, (b, j, i), p, dt)
    if ds is not None:
        attn = attn * ds
    h1 = attn + x if norm == "pre" else ln1(attn + x)
    xf = ln2(h1) if norm == "pre" else h1
    inter = activation(linear(xf, prm["intermediate.dense.weight"], prm["intermediate.dense.bias"]), act)
    out = linear(inter, prm["output.dense.weight"], prm["output.dense.bias"])
    ds = dropout_scale(seed, DROP_FFN_OUT, (b, j, i), p, dt)
    if ds is not None:
        out = out * ds
    return out + h1 if norm == "pre" else ln2(out + h1)


# --- a second composition from torch.nn modules (dropout off) ------------------------

def bert_layer_modules(x, attention_mask, prm, heads, eps, act):
    b, j, i = x.shape
    dt = x.dtype
    mha = torch.nn.MultiheadAttention(i, heads, dropout=0.0, bias=True, batch_first=True).to(dt)
    ln1 = torch.nn.LayerNorm(i, eps=eps).to(dt)
    ln2 = torch.nn.LayerNorm(i, eps=eps).to(dt)
    fc1 = torch.nn.Linear(i, prm["intermediate.dense.weight"].shape[0]).to(dt)
    fc2 = torch.nn.Linear(prm["intermediate.dense.weight"].shape[0], i).to(dt)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([prm["attention.self.query.weight"],
                                            prm["attention.self.key.weight"],
                                            prm["attention.self.value.weight"]], 0))
        mha.in_proj_bias.copy_(torch.cat([prm["attention.self.query.bias"],
                                          prm["attention.self.key.bias"],
                                          prm["attention.self.value.bias"]], 0))
        mha.out_proj.weight.copy_(prm["attention.output.dense.weight"])
        mha.out_proj.bias.copy_(prm["attention.output.dense.bias"])
        ln1.weight.copy_(prm["attention.output.LayerNorm.weight"])
        ln1.bias.copy_(prm["attention.output.LayerNorm.bias"])
        fc1.weight.copy_(prm["intermediate.dense.weight"])
        fc1.bias.copy_(prm["intermediate.dense.bias"])
        fc2.weight.copy_(prm["output.dense.weight"])
        fc2.bias.copy_(prm["output.dense.bias"])
        ln2.weight.copy_(prm["output.LayerNorm.weight"])
        ln2.bias.copy_(prm["output.LayerNorm.bias"])
    mha.train()
    attn, _ = mha(x, x, x, key_padding_mask=(attention_mask == 0), need_weights=False)
    h1 = ln1(attn + x)
    if act == "gelu":
        a = F.gelu(fc1(h1))
    elif act == "gelu_tanh":
        a = F.gelu(fc1(h1), approximate="tanh")
    else:
        a = F.relu(fc1(h1))
    y = ln2(fc2(a) + h1)
    named = {
        "attention.self.in_proj.weight": mha.in_proj_weight, "attention.self.in_proj.bias": mha.in_proj_bias,
        "attention.output.dense.weight": mha.out_proj.weight, "attention.output.dense.bias": mha.out_proj.bias,
        "attention.output.LayerNorm.weight": ln1.weight, "attention.output.LayerNorm.bias": ln1.bias,
        "intermediate.dense.weight": fc1.weight, "intermediate.dense.bias": fc1.bias,
        "output.dense.weight": fc2.weight, "output.dense.bias": fc2.bias,
        "output.LayerNorm.weight": ln2.weight, "output.LayerNorm.bias": ln2.bias,
    }
    return y, named


def encoder_layer_modules(x, attention_mask, prm, heads, eps, act, norm, causal):
    """A third composition, for every configuration: nn.TransformerEncoderLayer
    (norm_first for pre-LN, a causal src_mask), dropout off; gradients by parameter name."""
    b, j, i = x.shape
    dt = x.dtype
    u = prm["intermediate.dense.weight"].shape[0]
    fn = {"gelu": F.gelu, "relu": F.relu,
          "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act]
    enc = torch.nn.TransformerEncoderLayer(i, heads, dim_feedforward=u, dropout=0.0, activation=fn,
                                           layer_norm_eps=eps, batch_first=True,
                                           norm_first=(norm == "pre")).to(dt)
    mods = {"attention.output.dense": enc.self_attn.out_proj, "attention.output.LayerNorm": enc.norm1,
            "intermediate.dense": enc.linear1, "output.dense": enc.linear2, "output.LayerNorm": enc.norm2}
    with torch.no_grad():
        enc.self_attn.in_proj_weight.copy_(torch.cat([prm["attention.self.%s.weight" % n]
                                                      for n in ("query", "key", "value")], 0))
        enc.self_attn.in_proj_bias.copy_(torch.cat([prm["attention.self.%s.bias" % n]
                                                    for n in ("query", "key", "value")], 0))
        for name, m in mods.items():
            m.weight.copy_(prm[name + ".weight"])
            m.bias.copy_(prm[name + ".bias"])
    enc.train()
    src_mask = torch.triu(torch.ones(j, j, dtype=torch.bool), 1) if causal else None
    y = enc(x, src_mask=src_mask, src_key_padding_mask=(attention_mask == 0))
    named = {"attention.self.in_proj.weight": enc.self_attn.in_proj_weight,
             "attention.self.in_proj.bias": enc.self_attn.in_proj_bias}
    for name, m in mods.items():
        named[name + ".weight"], named[name + ".bias"] = m.weight, m.bias
    return y, named


# --- safetensors, written by hand ----------------------------------------------------

def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, float32 ndarray); metadata: str -> str.
    Layout: u64 LE header length N, N bytes of JSON (padded with spaces to a multiple of
    8), then the raw little-endian data; data_offsets relative to the data start."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs, off = [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype="<f4")
        raw = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * (-len(hj) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32"
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(info["shape"])
    return out, meta


# --- cases ---------------------------------------------------------------------------

CONFIGS = {
    # name: b, j, i, heads, u, act, eps, seed, padded positions per sequence
    "A": dict(b=2, j=5, i=8, heads=2, u=16, act="gelu", eps=1e-12, seed=1234, pad=[0, 2]),
    "B": dict(b=3, j=7, i=12, heads=3, u=20, act="gelu_tanh", eps=1e-5,
              seed=0x1234567890ABCDEF, pad=[3, 0, 1]),
    "C": dict(b=2, j=4, i=6, heads=1, u=10, act="relu", eps=1e-6, seed=7, pad=[1, 3]),
}
# Layer variants (a config without "norm" is post-LN, without "causal" bidirectional):
CONFIGS.update({
    "P": dict(b=2, j=6, i=8, heads=2, u=12, act="gelu", eps=1e-5, seed=42, pad=[0, 2], norm="pre"),
    "Q": dict(b=3, j=5, i=12, heads=3, u=16, act="gelu_tanh", eps=1e-6, seed=0xFEDCBA9876543210,
              pad=[1, 0, 2], norm="pre", causal=True),
    "R": dict(b=2, j=4, i=6, heads=2, u=8, act="relu", eps=1e-12, seed=3, pad=[0, 1], causal=True),
})
CASES = [("A", 0.0), ("A", 0.1), ("B", 0.0), ("B", 0.1), ("B", 0.3), ("C", 0.0), ("C", 0.1),
         ("P", 0.0), ("P", 0.1), ("Q", 0.0), ("Q", 0.2), ("R", 0.0), ("R", 0.1)]


def make_inputs(cfg, rng):
    b, j, i, u = cfg["b"], cfg["j"], cfg["i"], cfg["u"]
    f32 = np.float32
    x = rng.standard_normal((b, j, i)).astype(f32)
    mask = np.ones((b, j), dtype=f32)
    for s, npad in enumerate(cfg["pad"]):
        if npad:
            mask[s, j - npad:] = 0
    gy = rng.standard_normal((b, j, i)).astype(f32)
    return x, mask, gy, make_params(i, u, rng, 0.2)


def make_params(i, u, rng, wscale):
    """Random BertLayer parameters (float32): weights N(0, wscale^2), biases N(0, 0.01),
    LayerNorm weights 1 + N(0, 0.01)."""
    prm = {}
    for name, shape in param_shapes(i, u):
        if name.endswith("LayerNorm.weight"):
            v = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("weight"):
            v = wscale * rng.standard_normal(shape)
        else:
            v = 0.1 * rng.standard_normal(shape)
        prm[name] = v.astype(np.float32)
    return prm


def run_case(x, mask, gy, prm, cfg, p):
    dt = torch.float64
    tx = torch.tensor(x, dtype=dt, requires_grad=True)
    tp = {k: torch.tensor(v, dtype=dt, requires_grad=True) for k, v in prm.items()}
    y = bert_layer(tx, torch.tensor(mask, dtype=dt), tp, cfg["heads"], p, cfg["seed"],
                   cfg["eps"], cfg["act"], cfg.get("norm", "post"), cfg.get("causal", False))
    loss = (y * torch.tensor(gy, dtype=dt)).sum()
    loss.backward()
    return y.detach(), tx.grad, {k: v.grad for k, v in tp.items()}


def rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    nb = b.norm().item()
    return (a - b).norm().item() / (nb if nb > 0 else 1.0)


# --- self-checks ---------------------------------------------------------------------

def check_operators():
    g = torch.Generator().manual_seed(0)
    dt = torch.float64
    s = torch.randn(3, 4, 9, generator=g, dtype=dt) * 3
    w = torch.randn(9, generator=g, dtype=dt)
    bb = torch.randn(9, generator=g, dtype=dt)
    W = torch.randn(5, 9, generator=g, dtype=dt)
    B5 = torch.randn(5, generator=g, dtype=dt)
    checks = {
        "softmax": rel(softmax(s), F.softmax(s, dim=-1)),
        "layer_norm(1e-12)": rel(layer_norm(s, w, bb, 1e-12), F.layer_norm(s, (9,), w, bb, 1e-12)),
        "layer_norm(1e-5)": rel(layer_norm(s, w, bb, 1e-5), F.layer_norm(s, (9,), w, bb, 1e-5)),
        "gelu": rel(activation(s, "gelu"), F.gelu(s)),
        "gelu_tanh": rel(activation(s, "gelu_tanh"), F.gelu(s, approximate="tanh")),
        "relu": rel(activation(s, "relu"), F.relu(s)),
        "linear": rel(linear(s, W, B5), F.linear(s, W, B5)),
    }
    # masked softmax: the finfo.min bias gives exact zeros, and matches masked_fill(-inf)
    m = torch.ones(3, 9, dtype=dt)
    m[1, 6:] = 0
    ext = (1.0 - m[:, None, :]) * torch.finfo(torch.float32).min
    ref = F.softmax(s.masked_fill(m[:, None, :] == 0, float("-inf")), dim=-1)
    checks["masked softmax"] = rel(softmax(s + ext), ref)
    for k, v in checks.items():
        print("  operator %-18s vs torch.nn.functional: rel err %.2e" % (k, v))
        assert v < 1e-14, k
    assert (softmax(s + ext)[1, :, 6:] == 0).all()


def check_modules(x, mask, gy, prm, cfg, which):
    """Whole layer, dropout off: explicit vs nn modules; output and all gradients.
    which: "bert" (MultiheadAttention + LayerNorm + Linear, post-LN only) or "encoder"
    (nn.TransformerEncoderLayer, any configuration)."""
    dt = torch.float64
    y, gx, gp = run_case(x, mask, gy, prm, cfg, 0.0)
    tx = torch.tensor(x, dtype=dt, requires_grad=True)
    tp = {k: torch.tensor(v, dtype=dt) for k, v in prm.items()}
    if which == "bert":
        y2, named = bert_layer_modules(tx, torch.tensor(mask, dtype=dt), tp, cfg["heads"],
                                       cfg["eps"], cfg["act"])
    else:
        y2, named = encoder_layer_modules(tx, torch.tensor(mask, dtype=dt), tp, cfg["heads"], cfg["eps"],
                                          cfg["act"], cfg.get("norm", "post"), cfg.get("causal", False))
    (y2 * torch.tensor(gy, dtype=dt)).sum().backward()
    errs = {"output": rel(y, y2), "grad_hidden_states": rel(gx, tx.grad)}
    ipw, ipb = named["attention.self.in_proj.weight"].grad, named["attention.self.in_proj.bias"].grad
    i = cfg["i"]
    for t, nm in enumerate(["query", "key", "value"]):
        errs["attention.self.%s.weight" % nm] = rel(gp["attention.self.%s.weight" % nm], ipw[t * i:(t + 1) * i])
        errs["attention.self.%s.bias" % nm] = rel(gp["attention.self.%s.bias" % nm], ipb[t * i:(t + 1) * i])
    for k, v in named.items():
        if not k.startswith("attention.self.in_proj"):
            errs[k] = rel(gp[k], v.grad)
    # The key bias gets no gradient: it adds q_j . b_k to every score of row j, which the
    # softmax cancels. Both compositions give round-off (~1e-17); compare norms instead.
    kb = "attention.self.key.bias"
    kb_norms = (gp[kb].norm().item(), ipb[i:2 * i].norm().item(),
                gp["attention.self.key.weight"].norm().item())
    del errs[kb]
    worst = max(errs, key=errs.get)
    print("  layer vs %s (p=0): %d tensors, worst rel err %.2e (%s); key.bias grad "
          "norms %.1e / %.1e (key.weight grad %.1e)"
          % ("nn modules" if which == "bert" else "nn.TransformerEncoderLayer", len(errs), errs[worst],
             worst, kb_norms[0], kb_norms[1], kb_norms[2]))
    assert errs[worst] < 1e-12, errs
    assert max(kb_norms[:2]) < 1e-12 * max(kb_norms[2], 1.0)


def check_gradcheck():
    """gradcheck of the explicit layer on a tiny case with dropout on, every act."""
    dt = torch.float64
    for act, norm, causal in [("gelu", "post", False), ("gelu_tanh", "post", False), ("relu", "post", False),
                              ("gelu", "pre", True)]:
        cfg = dict(b=2, j=3, i=4, heads=2, u=5, act=act, eps=1e-5, seed=99, pad=[1, 0])
        x, mask, _, prm = make_inputs(cfg, np.random.default_rng(5))
        names = list(prm)
        tmask = torch.tensor(mask, dtype=dt)
        inputs = [torch.tensor(x, dtype=dt, requires_grad=True)] + \
                 [torch.tensor(prm[k], dtype=dt, requires_grad=True) for k in names]

        def f(xx, *ps):
            return bert_layer(xx, tmask, dict(zip(names, ps)), cfg["heads"], 0.25, cfg["seed"],
                              cfg["eps"], act, norm, causal)
        ok = torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)
        print("  gradcheck (b=2 j=3 i=4 h=2 u=5, p=0.25, %s, %s-LN%s): %s"
              % (act, norm, ", causal" if causal else "", ok))
        assert ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--cases", default="", help="configurations to write, e.g. P,Q,R (default: all)")
    args = ap.parse_args()
    only = set(c for c in args.cases.split(",") if c)
    if only - set(CONFIGS):
        ap.error("--cases: unknown configuration(s) %s (known: %s)" % (",".join(sorted(only - set(CONFIGS))),
                                                                      ",".join(CONFIGS)))
    torch.manual_seed(0)
    print("torch %s, numpy %s" % (torch.__version__, np.__version__))
    print("self-checks:")
    check_operators()
    for name, cfg in CONFIGS.items():
        x, mask, gy, prm = make_inputs(cfg, np.random.default_rng(ord(name)))
        if not cfg.get("norm") and not cfg.get("causal"):
            check_modules(x, mask, gy, prm, cfg, "bert")
        check_modules(x, mask, gy, prm, cfg, "encoder")
    check_gradcheck()
    if args.check_only:
        return
    for name, p in CASES:
        if only and name not in only:
            continue
        cfg = CONFIGS[name]
        x, mask, gy, prm = make_inputs(cfg, np.random.default_rng(ord(name)))
        y, gx, gp = run_case(x, mask, gy, prm, cfg, p)
        # The key bias's gradient is exactly zero in exact arithmetic (the softmax cancels
        # it; see check_modules); store the exact zero rather than float64 round-off, so
        # that a relative-error test falls back to the absolute norm of dmove's result.
        kb = "attention.self.key.bias"
        assert gp[kb].norm() < 1e-12 * max(gp["attention.self.key.weight"].norm(), 1.0)
        gp[kb] = torch.zeros_like(gp[kb])
        tensors = [("hidden_states", x), ("attention_mask", mask), ("grad_output", gy)]
        tensors += [(k, prm[k]) for k, _ in param_shapes(cfg["i"], cfg["u"])]
        tensors += [("expected.output", y.numpy()), ("expected.grad_hidden_states", gx.numpy())]
        tensors += [("expected.%s.grad" % k, gp[k].numpy()) for k, _ in param_shapes(cfg["i"], cfg["u"])]
        meta = {"heads": cfg["heads"], "dropout": repr(p), "seed": cfg["seed"],
                "eps": repr(cfg["eps"]), "act": cfg["act"],
                "source": "tests/ref/make_refs.py: HF BertLayer (post-LN, training mode), "
                          "explicit torch %s in float64; dmove Philox dropout masks"
                          % torch.__version__}
        if cfg.get("norm") or cfg.get("causal"):  # the first files stay as they were
            meta["norm"] = cfg.get("norm", "post")
            meta["causal"] = "1" if cfg.get("causal") else "0"
            meta["source"] = meta["source"].replace("HF BertLayer (post-LN, training mode)",
                                                    "HF BertLayer in training mode, %s-LN%s"
                                                    % (meta["norm"], ", causal" if cfg.get("causal") else ""))
        path = os.path.join(args.out, "layer_%s_p%s.safetensors" % (name, ("%g" % p)))
        write_safetensors(path, tensors, meta)
        back, bmeta = read_safetensors(path)
        assert all(np.array_equal(back[k], np.asarray(v, dtype=np.float32)) for k, v in tensors)
        assert bmeta["heads"] == str(cfg["heads"])
        keep = [dropout_keep(cfg["seed"], s, sh, p).mean() if p else 1.0 for s, sh in
                [(1, (cfg["b"], cfg["heads"], cfg["j"], cfg["j"])), (2, x.shape), (3, x.shape)]]
        print("wrote %s: %d bytes, b=%d j=%d i=%d h=%d u=%d %s eps=%g p=%g seed=%d, "
              "kept %.3f/%.3f/%.3f, padded %s"
              % (path, os.path.getsize(path), cfg["b"], cfg["j"], cfg["i"], cfg["heads"],
                 cfg["u"], cfg["act"], cfg["eps"], p, cfg["seed"], keep[0], keep[1], keep[2],
                 cfg["pad"]))


if __name__ == "__main__":
    main()
