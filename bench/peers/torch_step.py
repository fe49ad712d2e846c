#!/usr/bin/env python3
"""bench/peers/torch_step.py: one training step (forward + backward) of one BERT encoder
layer in PyTorch eager mode, timed the way `dmove bench` times it, printed as one JSON line.

The layer is written out with torch.nn.Linear / LayerNorm / functional.softmax / dropout
exactly as Hugging Face transformers' BertLayer (BertSelfAttention, BertSelfOutput,
BertIntermediate, BertOutput) in training mode: separate Q/K/V projections, scores / sqrt(p)
plus the extended padding mask ((1 - mask) * finfo.min, mask all ones), softmax, dropout on
the probabilities, post-LayerNorm residual blocks, exact (erf) GELU, dropout 0.1, fp32.
Backward is y.backward(grad_output) with the input requiring grad (dmove also computes the
input gradient); parameter gradients are reset to None before each step, as
optimizer.zero_grad(set_to_none=True) does.

Runs under Debian's PyTorch (python3-torch, 1.13): use /usr/bin/python3. The BLAS and the
malloc settings are chosen by the caller's environment (see run_torch_vs_dmove.sh); this
script reports what it found in "settings".
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def transpose_for_scores(self, x):  # (b, j, i) -> (b, h, j, p)
        return x.view(x.size()[:-1] + (self.heads, self.head_size)).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        scores = scores + attention_mask
        probs = self.dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.heads * self.head_size,))


class BertSelfOutput(nn.Module):
    def __init__(self, hidden, dropout, eps):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertIntermediate(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.dense = nn.Linear(hidden, ffn)

    def forward(self, hidden_states):
        return F.gelu(self.dense(hidden_states))  # exact erf GELU, as ACT2FN["gelu"]


class BertOutput(nn.Module):
    def __init__(self, hidden, ffn, dropout, eps):
        super().__init__()
        self.dense = nn.Linear(ffn, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, hidden, heads, dropout, eps):
        super().__init__()
        self.self = BertSelfAttention(hidden, heads, dropout)
        self.output = BertSelfOutput(hidden, dropout, eps)

    def forward(self, hidden_states, attention_mask):
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


def encoder_layer(hidden, heads, ffn, dropout, norm_first):
    """PyTorch's own nn.TransformerEncoderLayer with dmove's settings (exact GELU, eps 1e-12,
    batch first): the peer of dmove's layer variants (--norm pre, --causal)."""
    return nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=ffn, dropout=dropout, activation="gelu",
                                      layer_norm_eps=1e-12, batch_first=True, norm_first=norm_first)


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, ffn, dropout=0.1, eps=1e-12):
        super().__init__()
        self.attention = BertAttention(hidden, heads, dropout, eps)
        self.intermediate = BertIntermediate(hidden, ffn)
        self.output = BertOutput(hidden, ffn, dropout, eps)

    def forward(self, hidden_states, attention_mask):
        attention_output = self.attention(hidden_states, attention_mask)
        return self.output(self.intermediate(attention_output), attention_output)


def loaded_libraries():
    """The BLAS/LAPACK/OpenMP libraries mapped into this process, by path."""
    keys = ("blas", "lapack", "blis", "gomp", "libiomp", "mkl", "jemalloc", "tcmalloc")
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and any(k in os.path.basename(parts[5]) for k in keys):
                if parts[5] not in found:
                    found.append(parts[5])
    return found


def time_steps(fn, layer, x, ext_mask, grad_output, warmup, reps):
    """Runs warmup + reps training steps of fn (the layer, or a compiled wrapper of it).
    Returns per timed step forward, backward and step ms, the warm-up step seconds, and the
    minor page faults of the timed steps."""
    fwd, bwd, step, warm = [], [], [], []
    faults0 = 0
    for r in range(warmup + reps):
        if r == warmup:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        t0 = time.perf_counter()
        y = fn(x, ext_mask)
        t1 = time.perf_counter()
        y.backward(grad_output)
        t2 = time.perf_counter()
        del y
        if r >= warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            step.append((t2 - t0) * 1e3)
        else:
            warm.append(t2 - t0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    return fwd, bwd, step, warm, faults


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch.set_num_threads(N); 0 leaves PyTorch's own default")
    ap.add_argument("--variant", default="pytorch-eager", help="label copied into the JSON")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for name in ("batch", "seq", "hidden", "heads", "ffn", "reps"):
        if getattr(a, name) <= 0:
            sys.exit(f"torch_step.py: --{name} must be positive")
    if a.hidden % a.heads:
        sys.exit(f"torch_step.py: hidden {a.hidden} is not divisible by heads {a.heads}")
    if not 0.0 <= a.dropout < 1.0:
        sys.exit("torch_step.py: --dropout must be in [0, 1)")

    default_threads = torch.get_num_threads()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    layer = BertLayer(a.hidden, a.heads, a.ffn, a.dropout).train()
    x = torch.randn(a.batch, a.seq, a.hidden, requires_grad=True)
    grad_output = torch.randn(a.batch, a.seq, a.hidden)
    mask = torch.ones(a.batch, a.seq)  # padding mask, 1 = token
    # BertModel.get_extended_attention_mask: (b, 1, 1, k), 0 where attended.
    ext_mask = (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min

    fwd, bwd, step, _, faults = time_steps(layer, layer, x, ext_mask, grad_output, a.warmup, a.reps)
    env = {k: os.environ[k] for k in sorted(os.environ)
           if k.startswith(("MALLOC_", "OMP_", "OPENBLAS_", "GOMP_", "LD_PRELOAD", "LD_LIBRARY_PATH"))}
    b, j, i, u = a.batch, a.seq, a.hidden, a.ffn
    flop_fwd = 2 * b * j * i * (4 * i + 2 * u) + 4 * b * j * j * i
    print(json.dumps({
        "peer": "pytorch-eager",
        "variant": a.variant,
        "forward_ms": round(statistics.median(fwd), 3),
        "backward_ms": round(statistics.median(bwd), 3),
        "step_ms": round(statistics.median(step), 3),
        "step_min_ms": round(min(step), 3),
        "page_faults_per_step": round(faults / a.reps),
        "contraction_gflop": round(3 * flop_fwd * 1e-9, 3),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "default_threads": default_threads,
        "config": {"batch": b, "seq": j, "hidden": i, "heads": a.heads, "ffn": u,
                   "dropout": a.dropout, "reps": a.reps, "warmup": a.warmup},
        "settings": "; ".join([f"threads={torch.get_num_threads()} (PyTorch default {default_threads})",
                               "libs=" + ",".join(loaded_libraries())]
                              + [f"{k}={v}" for k, v in env.items()]),
    }))


if __name__ == "__main__":
    main()
