#!/usr/bin/env python3
"""bench/gpu/train_gpu.py: training steps of a stack of BERT encoder layers in PyTorch on a
CUDA GPU, the work `dmove train --device cuda` does per step, timed with CUDA events, one
JSON line.

The stack: --layers of torch_gpu.Layer (Hugging Face's BertLayer in training mode, attention
by F.scaled_dot_product_attention, post-LN, exact GELU, dropout 0.1). A step:
zero_grad(set_to_none=True); forward; the mean squared error against a target over the
tokens the mask keeps; backward; AdamW(fused=True) (lr 1e-4, betas 0.9/0.999, eps 1e-6,
weight decay 0.01 on weights only, as dmove). --dtype bf16 is PyTorch's mixed precision
recipe, the counterpart of dmove's bf16 storage with fp32 master weights: parameters and
AdamW in fp32, the forward and backward under torch.autocast(bfloat16). --dtype fp32: all
fp32, TF32 off. Fixed inputs, mask and target (dmove's median step excludes its data too).
--mode compile wraps the stack in torch.compile (compiled in the warm-up steps).
--device cpu runs the same on the CPU (wall-clock times): a check of this script without a GPU.
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

from torch_gpu import Layer  # noqa: E402


class Stack(nn.Module):
    def __init__(self, layers, i, h, u):
        super().__init__()
        self.layer = nn.ModuleList([Layer(i, h, u, 0.1, 1e-12, "sdpa") for _ in range(layers)])

    def forward(self, x, ext):
        for l in self.layer:
            x = l(x, ext)
        return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, d in (("layers", 4), ("batch", 8), ("seq", 512), ("hidden", 1024), ("heads", 16), ("ffn", 4096),
                    ("reps", 20), ("warmup", 5)):
        ap.add_argument("--" + name, type=int, default=d)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    gpu = a.device == "cuda"
    torch.manual_seed(0)
    stack = Stack(a.layers, a.hidden, a.heads, a.ffn).to(dev).train()
    is_norm = lambda n: n.split(".")[-2] in ("ln1", "ln2")  # noqa: E731  (the LayerNorms)
    decay = [p for n, p in stack.named_parameters() if n.endswith("weight") and not is_norm(n)]
    rest = [p for n, p in stack.named_parameters() if not (n.endswith("weight") and not is_norm(n))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-6, fused=gpu or None)
    fn = torch.compile(stack) if a.mode == "compile" else stack
    x = torch.randn(a.batch, a.seq, a.hidden, device=dev)
    target = torch.randn(a.batch, a.seq, a.hidden, device=dev)
    mask = torch.ones(a.batch, a.seq, device=dev)
    mask[:, a.seq - a.seq // 8:] = 0  # some padding, as dmove's bench
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    ext = ((1.0 - mask) * torch.finfo(dt).min).to(dt)[:, None, None, :]
    kept = mask[:, :, None]
    denom = float(mask.sum()) * a.hidden
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)] \
        if gpu else []
    ms = []
    for r in range(a.warmup + a.reps):
        e = ev[r - a.warmup] if gpu and r >= a.warmup else None
        if e:
            e[0].record()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            y = fn(x, ext)
        d = (y.float() - target) * kept
        loss = (d * d).sum() / denom
        loss.backward()
        opt.step()
        if e:
            e[1].record()
        elif r >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    if gpu:
        torch.cuda.synchronize()
        ms = [e[0].elapsed_time(e[1]) for e in ev]
    nparams = sum(p.numel() for p in stack.parameters())
    print(json.dumps({"framework": "pytorch-" + a.mode, "dtype": a.dtype, "recipe": "autocast bf16, fp32 AdamW(fused)"
                      if a.dtype == "bf16" else "fp32, AdamW(fused)", "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name() if gpu else "cpu", "layers": a.layers, "params": nparams,
                      "config": {"batch": a.batch, "seq": a.seq, "hidden": a.hidden, "heads": a.heads, "ffn": a.ffn},
                      "step_ms": statistics.median(ms), "step_ms_min": min(ms), "loss": float(loss.detach()),
                      "peak_mb": torch.cuda.max_memory_allocated() / 1e6 if gpu else None}))


if __name__ == "__main__":
    sys.exit(main())
