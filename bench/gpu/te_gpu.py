#!/usr/bin/env python3
"""The training step (forward + backward) of NVIDIA Transformer Engine's TransformerLayer in
bf16 on a CUDA GPU, the same sizes and JSON line as torch_gpu.py (bench/gpu/run.sh runs it
where transformer_engine is installed: issue 25's point 4 peer).

The layer as BERT's: post-LN (output_layernorm: the LayerNorm after each residual add),
exact GELU, dropout 0.1 on the attention probabilities and the hidden states, eps 1e-12,
the padding mask of torch_gpu.py (the last eighth of each sequence) where TE takes a
padding mask, else none (said in the JSON's "attn"). Inputs sequence-first (TE's default
layout). Timed with CUDA events after warm-up; medians."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpu import report, size_args, time_training  # noqa: E402  (the PyTorch peers' options, timing, report)


def main():
    ap = size_args(__doc__.split("\n")[0])
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
    fwd, stp, peak_mb = time_training(lambda: layer(x, attention_mask=mask) if mask is not None else layer(x),
                                      layer, x, gy, a.warmup, a.reps)
    report("transformer-engine " + getattr(transformer_engine, "__version__", "?"), attn, "bf16", a, fwd, stp, peak_mb)


if __name__ == "__main__":
    sys.exit(main())
