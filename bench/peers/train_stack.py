#!/usr/bin/env python3
"""bench/peers/train_stack.py: training steps of a stack of BERT encoder layers in PyTorch,
the work `dmove train` does per step, timed and printed as one JSON line.

The stack: --layers of torch_step.BertLayer (Hugging Face BertLayer in training mode: post-LN,
exact GELU, three dropouts, fp32). A step: zero_grad(set_to_none=True); forward through the
stack; the mean squared error against a target over the tokens the mask keeps; backward;
AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01 on weights only, as dmove).
The inputs, mask and target are fixed tensors (dmove's timed step excludes its data too).

--mode eager          eager PyTorch, torch.optim.AdamW's default (foreach) implementation
--mode eager-fused    eager PyTorch, AdamW(fused=True) (one fused kernel per parameter group)
--mode compile        torch.compile(stack) (Inductor) and AdamW(fused=True); compilation in
                      the warm-up steps, never in the medians
--norm pre / --causal dmove's layer variants: the stack is then PyTorch's own
                      nn.TransformerEncoderLayer (norm_first for pre-LN, exact GELU, eps
                      1e-12), called with the padding mask and, causal, a causal src_mask
                      with is_causal=True; no weight decay on its LayerNorms (norm1, norm2)
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from torch_step import BertLayer, encoder_layer  # noqa: E402


class EncoderStack(nn.Module):
    def __init__(self, layers, hidden, heads, ffn, dropout, norm_first, causal, seq):
        super().__init__()
        self.layer = nn.ModuleList([encoder_layer(hidden, heads, ffn, dropout, norm_first) for _ in range(layers)])
        self.causal = causal
        # bool, as the padding mask (True: masked), so PyTorch merges the two as they are
        self.register_buffer("src_mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1) if causal else None)

    def forward(self, x, pad):
        for l in self.layer:
            x = l(x, src_mask=self.src_mask, src_key_padding_mask=pad, is_causal=self.causal)
        return x


class Stack(nn.Module):
    def __init__(self, layers, hidden, heads, ffn, dropout):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(hidden, heads, ffn, dropout) for _ in range(layers)])

    def forward(self, x, ext_mask):
        for l in self.layer:
            x = l(x, ext_mask)
        return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, d in (("layers", 2), ("batch", 8), ("seq", 128), ("hidden", 768), ("heads", 12), ("ffn", 3072),
                    ("reps", 10), ("warmup", 3), ("threads", 2)):
        ap.add_argument("--" + name, type=int, default=d)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--mode", choices=("eager", "eager-fused", "compile"), default="eager")
    ap.add_argument("--norm", choices=("post", "pre"), default="post")
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    variant = a.norm == "pre" or a.causal
    if a.mode == "compile" and a.warmup < 2:
        sys.exit("train_stack.py: --mode compile needs --warmup >= 2 (the first steps compile)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    stack = (EncoderStack(a.layers, a.hidden, a.heads, a.ffn, a.dropout, a.norm == "pre", a.causal, a.seq)
             if variant else Stack(a.layers, a.hidden, a.heads, a.ffn, a.dropout)).train()
    is_norm = lambda n: "LayerNorm" in n or ".norm" in n  # noqa: E731
    decay = [p for n, p in stack.named_parameters() if n.endswith("weight") and not is_norm(n)]
    rest = [p for n, p in stack.named_parameters() if not (n.endswith("weight") and not is_norm(n))]
    fused = a.mode in ("eager-fused", "compile")
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-6, fused=fused if fused else None)
    fn = torch.compile(stack, backend="inductor", fullgraph=True) if a.mode == "compile" else stack
    x = torch.randn(a.batch, a.seq, a.hidden)
    target = torch.randn(a.batch, a.seq, a.hidden)
    mask = torch.ones(a.batch, a.seq)
    mask[1:, a.seq - a.seq // 8:] = 0
    ext = (mask == 0) if variant else (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min
    kept = mask[:, :, None]
    denom = float(mask.sum()) * a.hidden
    times, warm = [], []
    for r in range(a.warmup + a.reps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        y = fn(x, ext)
        d = (y - target) * kept
        loss = (d * d).sum() / denom
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        (times if r >= a.warmup else warm).append(dt * 1e3)
    print(json.dumps({"variant": "torch-" + a.mode, "step_ms": round(statistics.median(times), 3),
                      "step_min_ms": round(min(times), 3), "warmup_s": round(sum(warm) / 1e3, 2),
                      "loss": float(loss.detach()), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "adamw": "fused" if fused else "foreach (default)",
                      "layer": ("nn.TransformerEncoderLayer(norm_first=%s), causal=%s" % (a.norm == "pre", a.causal)
                                if variant else "BertLayer")}))


if __name__ == "__main__":
    main()
