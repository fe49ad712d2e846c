#!/usr/bin/env python3
"""The training step (forward + backward) of NVIDIA Transformer Engine's TransformerLayer in
bf16 on a CUDA GPU, the same sizes and JSON line as torch_gpu.py (bench/gpu/run.sh runs it
where transformer_engine is installed: issue 25's point 4 peer).

The layer as BERT's: post-LN (output_layernorm: the LayerNorm after each residual add),
exact GELU, dropout 0.1 on the attention probabilities and the hidden states, eps 1e-12,
the padding mask of torch_gpu.py (the last eighth of each sequence) where TE takes a
padding mask, else none (said in the JSON's "attn"). Inputs sequence-first (TE's default
layout). Timed with CUDA events after warm-up; medians."""
import argparse
import json
import statistics
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    import transformer_engine
    import transformer_engine.pytorch as te

    dev = torch.device("cuda")
    torch.manual_seed(0)
    common = dict(layernorm_epsilon=1e-12, hidden_dropout=0.1, attention_dropout=0.1, params_dtype=torch.bfloat16,
                  output_layernorm=True)
    mask = torch.zeros(a.batch, 1, 1, a.seq, dtype=torch.bool, device=dev)  # True: masked out
    mask[..., a.seq - a.seq // 8:] = True
    try:
        layer = te.TransformerLayer(a.hidden, a.ffn, a.heads, self_attn_mask_type="padding", **common).to(dev)
        attn = "te, padding mask"
    except (TypeError, ValueError, AssertionError) as e:
        print(f"te_gpu.py: no padding mask ({e}); none", file=sys.stderr)
        layer = te.TransformerLayer(a.hidden, a.ffn, a.heads, self_attn_mask_type="no_mask", **common).to(dev)
        attn, mask = "te, no mask", None
    layer.train()
    x = torch.randn(a.seq, a.batch, a.hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gy = torch.ones_like(x)
    base_mem = torch.cuda.memory_allocated()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
           torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
    for r in range(a.warmup + a.reps):
        if r == a.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        e = ev[r - a.warmup] if r >= a.warmup else None
        if e:
            e[0].record()
        y = layer(x, attention_mask=mask) if mask is not None else layer(x)
        if e:
            e[1].record()
        y.backward(gy)
        if e:
            e[2].record()
    torch.cuda.synchronize()
    fwd = [e[0].elapsed_time(e[1]) for e in ev]
    stp = [e[0].elapsed_time(e[2]) for e in ev]
    b, j, i, u = a.batch, a.seq, a.hidden, a.ffn
    flop = 3 * 2 * b * j * (4 * i * i + 2 * i * u + 2 * j * i)
    med = statistics.median(stp)
    print(json.dumps({"framework": "transformer-engine " + getattr(transformer_engine, "__version__", "?"),
                      "attn": attn, "dtype": "bf16", "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(),
                      "config": {"batch": b, "seq": j, "hidden": i, "heads": a.heads, "ffn": u},
                      "forward_ms": statistics.median(fwd), "step_ms": med,
                      "peak_mb_above_inputs": (torch.cuda.max_memory_allocated() - base_mem) / 1e6,
                      "step_ms_min": min(stp), "tflops": flop / med / 1e9}))


if __name__ == "__main__":
    sys.exit(main())
