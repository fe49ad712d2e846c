#!/usr/bin/env python3
"""bench/peers/compile_step.py: one training step (forward + backward) of one BERT encoder
layer in a recent PyTorch (the one bench/peers/setup_venv.sh installs from PyPI into
bench/.venv-peers), eager or torch.compile'd, timed the way `dmove bench` times it, printed
as one JSON line.

The layer is the module of torch_step.py (Hugging Face BertLayer in training mode: post-LN,
exact erf GELU, three dropouts, extended padding mask, fp32), imported from it so that the
eager 1.13 peer, this one and dmove compute the same thing. Backward is y.backward(grad_output)
with the input requiring grad; parameter gradients are set to None before each step.

--mode eager      plain eager PyTorch (the venv's version, not Debian's 1.13)
--mode compile    torch.compile(layer, backend="inductor", mode=--compile-mode): TorchDynamo
                  captures the forward, AOTAutograd derives the backward graph, Inductor
                  generates fused C++/OpenMP kernels for both (GEMMs stay in MKL/oneDNN
                  unless max-autotune picks its own template). Compilation happens in the
                  warm-up steps and is reported apart (compile_s), never in the medians.

--norm pre / --causal (dmove's layer variants): the layer is PyTorch's own
nn.TransformerEncoderLayer(norm_first=True for pre-LN, exact GELU, eps 1e-12, batch_first)
called with a causal src_mask and is_causal=True, the module a PyTorch user would take (its
attention is F.scaled_dot_product_attention, which has fused CPU kernels); without them, the
BertLayer above.

Threads: torch.set_num_threads(--threads) (PyTorch's CPU tuning guide: one intra-op thread
per physical core). Allocator: whatever the environment says (run_peers.sh passes the glibc
malloc settings that helped the 1.13 peer); reported in "settings".
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from torch_step import BertLayer, encoder_layer, loaded_libraries, time_steps  # noqa: E402


class EncoderLayer(torch.nn.Module):
    """nn.TransformerEncoderLayer in a wrapper with time_steps' call (x, mask): the padding
    mask (all ones here) is not passed; the causal one is, with the is_causal hint."""

    def __init__(self, hidden, heads, ffn, dropout, norm_first, causal, seq):
        super().__init__()
        self.enc = encoder_layer(hidden, heads, ffn, dropout, norm_first)
        self.causal = causal
        self.register_buffer("src_mask", torch.nn.Transformer.generate_square_subsequent_mask(seq)
                             if causal else None)

    def forward(self, x, _mask):
        return self.enc(x, src_mask=self.src_mask, is_causal=self.causal)


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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=("eager", "compile"), default="compile")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, max-autotune-no-cudagraphs, ...")
    ap.add_argument("--variant", default=None, help="label copied into the JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--norm", choices=("post", "pre"), default="post")
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    for name in ("batch", "seq", "hidden", "heads", "ffn", "reps"):
        if getattr(a, name) <= 0:
            sys.exit(f"compile_step.py: --{name} must be positive")
    if a.hidden % a.heads:
        sys.exit(f"compile_step.py: hidden {a.hidden} is not divisible by heads {a.heads}")
    if a.mode == "compile" and a.warmup < 2:
        sys.exit("compile_step.py: --mode compile needs --warmup >= 2 (the first steps compile)")

    default_threads = torch.get_num_threads()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    variant = a.norm == "pre" or a.causal
    layer = (EncoderLayer(a.hidden, a.heads, a.ffn, a.dropout, a.norm == "pre", a.causal, a.seq) if variant
             else BertLayer(a.hidden, a.heads, a.ffn, a.dropout)).train()
    x = torch.randn(a.batch, a.seq, a.hidden, requires_grad=True)
    grad_output = torch.randn(a.batch, a.seq, a.hidden)
    mask = torch.ones(a.batch, a.seq)
    ext_mask = (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min

    fn = layer
    if a.mode == "compile":
        fn = torch.compile(layer, backend="inductor", mode=a.compile_mode, fullgraph=True)

    fwd, bwd, step, warm, faults = time_steps(fn, layer, x, ext_mask, grad_output, a.warmup, a.reps)
    env = {k: os.environ[k] for k in sorted(os.environ)
           if k.startswith(("MALLOC_", "OMP_", "KMP_", "MKL_", "GOMP_", "LD_PRELOAD", "TORCHINDUCTOR_"))}
    b, j, i, u = a.batch, a.seq, a.hidden, a.ffn
    flop_fwd = 2 * b * j * i * (4 * i + 2 * u) + 4 * b * j * j * i
    peer = "torch-eager" if a.mode == "eager" else "torch-compile"
    settings = [f"torch {torch.__version__}",
                f"threads={torch.get_num_threads()} (default {default_threads})",
                f"mkldnn={torch.backends.mkldnn.is_available()}",
                f"mkl={torch.backends.mkl.is_available()}"]
    if a.mode == "compile":
        settings.append(f'torch.compile(backend="inductor", mode="{a.compile_mode}", fullgraph=True)')
    if variant:
        settings.append(f"nn.TransformerEncoderLayer(norm_first={a.norm == 'pre'}), causal={a.causal}")
    settings.append("libs=" + ",".join(os.path.basename(p) for p in loaded_libraries()))
    settings += [f"{k}={v}" for k, v in env.items()]
    print(json.dumps({
        "peer": peer,
        "variant": a.variant or peer,
        "forward_ms": round(statistics.median(fwd), 3),
        "backward_ms": round(statistics.median(bwd), 3),
        "step_ms": round(statistics.median(step), 3),
        "step_min_ms": round(min(step), 3),
        "compile_s": round(warm[0], 2) if a.mode == "compile" else None,
        "page_faults_per_step": round(faults / a.reps),
        "contraction_gflop": round(3 * flop_fwd * 1e-9, 3),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": {"batch": b, "seq": j, "hidden": i, "heads": a.heads, "ffn": u,
                   "dropout": a.dropout, "reps": a.reps, "warmup": a.warmup, "norm": a.norm,
                   "causal": a.causal},
        "settings": "; ".join(settings),
    }))


if __name__ == "__main__":
    main()
