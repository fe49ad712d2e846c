#!/usr/bin/env python3
"""bench/gpu/torch_gpu.py: one training step (forward + backward) of one BERT encoder layer
in PyTorch on a CUDA GPU, eager or torch.compile, timed with CUDA events, one JSON line.

The layer is Hugging Face's BertLayer in training mode written out with torch.nn modules:
one stacked QKV projection is NOT used (separate query/key/value Linear, as HF), attention by
F.scaled_dot_product_attention with the additive padding mask and dropout on the
probabilities (HF's "sdpa" attention), post-LayerNorm residual blocks, exact erf GELU,
dropout 0.1. --dtype bf16 stores parameters and activations in bfloat16 (as model.to(bf16)),
fp32 keeps everything in float32 (TF32 off, as dmove's fp32). The input requires grad, the
parameter gradients are set to None before each step. Reports medians over --reps steps
after --warmup steps.
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, i, h, u, p, eps, attn):
        super().__init__()
        self.h, self.p, self.attn = h, p, attn
        self.query, self.key, self.value = nn.Linear(i, i), nn.Linear(i, i), nn.Linear(i, i)
        self.attn_out, self.ln1 = nn.Linear(i, i), nn.LayerNorm(i, eps=eps)
        self.inter, self.out, self.ln2 = nn.Linear(i, u), nn.Linear(u, i), nn.LayerNorm(i, eps=eps)

    def heads(self, t):
        b, j, i = t.shape
        return t.view(b, j, self.h, i // self.h).transpose(1, 2)

    def forward(self, x, ext_mask):
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        if self.attn == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=ext_mask, dropout_p=self.p)
        else:  # "math": HF's eager attention, scores materialized
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + ext_mask
            ctx = torch.matmul(F.dropout(F.softmax(s, dim=-1), self.p, True), v)
        b, h, j, d = ctx.shape
        ctx = ctx.transpose(1, 2).reshape(b, j, h * d)
        a = self.ln1(F.dropout(self.attn_out(ctx), self.p, True) + x)
        return self.ln2(F.dropout(self.out(F.gelu(self.inter(a))), self.p, True) + a)


def time_training(forward, layer, x, gy, warmup, reps):
    """forward() then y.backward(gy), warmup + reps times (gradients cleared each time):
    per rep the forward's and the whole step's milliseconds by CUDA events, and the peak
    memory (MB) above what was allocated before (parameters, inputs, grad_output)."""
    base_mem = torch.cuda.memory_allocated()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
           torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for r in range(warmup + reps):
        if r == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        e = ev[r - warmup] if r >= warmup else None
        if e:
            e[0].record()
        y = forward()
        if e:
            e[1].record()
        y.backward(gy)
        if e:
            e[2].record()
    torch.cuda.synchronize()
    return ([e[0].elapsed_time(e[1]) for e in ev], [e[0].elapsed_time(e[2]) for e in ev],
            (torch.cuda.max_memory_allocated() - base_mem) / 1e6)


def report(name, attn, dtype, a, fwd, stp, peak_mb):
    """The JSON line of one peer (a: its arguments' sizes; fwd, stp: milliseconds per rep)."""
    b, j, i, u = a.batch, a.seq, a.hidden, a.ffn
    flop = 3 * 2 * b * j * (4 * i * i + 2 * i * u + 2 * j * i)  # fwd + 2x bwd contractions
    med = statistics.median(stp)
    print(json.dumps({"framework": name, "attn": attn, "dtype": dtype,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                      "config": {"batch": b, "seq": j, "hidden": i, "heads": a.heads, "ffn": u},
                      "forward_ms": statistics.median(fwd), "step_ms": med,
                      "peak_mb_above_inputs": peak_mb,
                      "step_ms_min": min(stp), "tflops": flop / med / 1e9}))


def size_args(description):
    """The peers' common options: the layer's sizes (BERT-large, b=8 j=512 by default); the
    timing's warm-up and reps are added by each peer after its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=4096)
    return ap


def main():
    ap = size_args(__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--attn", choices=["sdpa", "math"], default="sdpa")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile's mode with --mode compile: default, max-autotune (CUDA graphs "
                         "and autotuned GEMMs), ...")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layer = Layer(a.hidden, a.heads, a.ffn, 0.1, 1e-12, a.attn).to(dev, dt).train()
    x = torch.randn(a.batch, a.seq, a.hidden, device=dev, dtype=dt, requires_grad=True)
    mask = torch.ones(a.batch, a.seq, device=dev)
    mask[:, a.seq - a.seq // 8:] = 0  # some padding, as dmove's bench
    ext = ((1.0 - mask) * torch.finfo(dt).min).to(dt)[:, None, None, :]
    gy = torch.ones(a.batch, a.seq, a.hidden, device=dev, dtype=dt)
    fn = (torch.compile(layer, mode=None if a.compile_mode == "default" else a.compile_mode)
          if a.mode == "compile" else layer)
    fwd, stp, peak_mb = time_training(lambda: fn(x, ext), layer, x, gy, a.warmup, a.reps)
    name = "pytorch-" + a.mode + ("-" + a.compile_mode if a.mode == "compile" and a.compile_mode != "default" else "")
    report(name, a.attn, a.dtype, a, fwd, stp, peak_mb)


if __name__ == "__main__":
    sys.exit(main())
