#!/usr/bin/env python3
"""bench/peers/python_step.py: what dmove.torch.patch gives a PyTorch user: one training
step of transformers' BertForMaskedLM (random init, fp32, CPU, dropout 0.1 as BERT, the
default attention (SDPA), MLM labels on 15% of the positions) timed three ways in one
interleaved run: eager, torch.compile (Inductor; compiled in the warm-up, never timed) and
patched (dmove.torch.patch: the encoder's layers on dmove, embeddings and MLM head still
PyTorch's). A step: zero_grad; model(input_ids, attention_mask, labels).loss; backward;
AdamW (foreach). Each round times one step of each variant in turn; medians printed, with
the ratios and the bytes copied between torch and dmove per patched step.

    PYTHONPATH=python python3 bench/peers/python_step.py --rounds 5
    (after `make python`; --no-compile skips torch.compile; --batch/--seq/--layers)

--fill F (below 1): padded batches, as a collator pads to the longest sequence: each
sequence's length drawn uniformly so that the mean fill is about F, the padding at the end
(attention_mask 0, labels -100 there), the same batch for every variant; a fourth variant,
"unpad", is the model patched with unpad=True (the layers on the real tokens alone).

--device cuda: the same on a GPU (each step timed to a torch.cuda.synchronize; AdamW
fused), --dtype bf16 under torch.autocast (fp32 parameters, as mixed-precision training;
dmove's layers then run in bf16 storage), --large for BERT-large (1024/16/4096, 24 layers
unless --layers says): issue 28's GPU point, e.g.
    DMOVE_LIB=.dev/lib/libdmove.so PYTHONPATH=python python3 bench/peers/python_step.py \
        --device cuda --dtype bf16 --large --batch 32 --rounds 10 --no-compile
"""
import argparse
import contextlib
import copy
import os
import platform
import statistics
import sys
import time

import torch
from transformers import BertConfig, BertForMaskedLM

import dmove.torch as dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=0, help="12 (BERT-base), 24 with --large")
    ap.add_argument("--large", action="store_true", help="BERT-large's sizes (1024/16/4096)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--fill", type=float, default=1.0)
    a = ap.parse_args()
    if not 0.0 < a.fill <= 1.0:
        ap.error("--fill: a fraction in (0, 1]")
    if a.dtype == "bf16" and a.device != "cuda":
        ap.error("--dtype bf16 is for --device cuda (the CPU step is fp32)")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU here")
    if not a.layers:
        a.layers = 24 if a.large else 12
    dev = torch.device(a.device)

    torch.manual_seed(0)
    sizes = dict(hidden_size=1024, num_attention_heads=16, intermediate_size=4096) if a.large else {}
    cfg = BertConfig(num_hidden_layers=a.layers, **sizes)  # BERT-base: 768/12/3072, vocab 30522
    try:  # the eager peer's attention: PyTorch's scaled_dot_product_attention, said in the header
        cfg._attn_implementation = "sdpa"
        ref = BertForMaskedLM(cfg)
    except (AttributeError, ValueError):  # a transformers whose BERT has no SDPA: its eager one
        cfg._attn_implementation = "eager"
        ref = BertForMaskedLM(cfg)
    ref = ref.to(dev).train()
    attn = getattr(ref.config, "_attn_implementation", None) or "eager"
    pat = dt.patch(copy.deepcopy(ref)).train()
    ids = torch.randint(1000, cfg.vocab_size, (a.batch, a.seq))
    mask = torch.ones(a.batch, a.seq, dtype=torch.long)
    if a.fill < 1.0:  # lengths uniform on [lo, hi] with mean about fill * seq
        hi = a.seq if a.fill >= 0.5 else max(1, round(2 * a.fill * a.seq))
        lo = max(1, round((2 * a.fill - 1) * a.seq)) if a.fill >= 0.5 else 1
        lengths = torch.randint(lo, hi + 1, (a.batch,))
        mask = (torch.arange(a.seq) < lengths[:, None]).long()
    labels = torch.where((torch.rand(a.batch, a.seq) < 0.15) & mask.bool(), ids, torch.full_like(ids, -100))
    ids, mask, labels = ids.to(dev), mask.to(dev), labels.to(dev)
    gpu = dev.type == "cuda"

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-4, fused=True) if gpu else torch.optim.AdamW(params, lr=1e-4)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if a.dtype == "bf16" else contextlib.nullcontext()

    variants = {"eager": (ref, adamw(ref.parameters()))}
    compile_why = ""
    if not a.no_compile:
        try:
            cref = copy.deepcopy(ref)
            variants["compile"] = (torch.compile(cref), adamw(cref.parameters()))
        except Exception as e:  # noqa: BLE001
            compile_why = f"torch.compile unavailable: {type(e).__name__}: {e}"
    variants["patched"] = (pat, adamw(pat.parameters()))
    if a.fill < 1.0:
        unp = dt.patch(copy.deepcopy(ref), unpad=True).train()
        variants["unpad"] = (unp, adamw(unp.parameters()))

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        out = loss.item()  # waits for the step (and, on a GPU, synchronizes)
        if gpu:
            torch.cuda.synchronize()
        return out

    for name in list(variants):
        t = time.perf_counter()
        try:
            for _ in range(a.warmup):
                step(*variants[name])
        except Exception as e:  # noqa: BLE001
            if name != "compile":
                raise
            compile_why = f"torch.compile failed here: {type(e).__name__}: {str(e)[:200]}"
            del variants[name]
            continue
        print(f"warm-up {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)

    times = {k: [] for k in variants}
    copies = None
    for r in range(a.rounds):
        for name, (model, opt) in variants.items():
            if name in ("patched", "unpad"):
                dt.reset_copy_stats()
            t = time.perf_counter()
            step(model, opt)
            times[name].append(time.perf_counter() - t)
            if name == "patched":
                copies = dt.copy_stats()
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1] * 1e3:.0f} ms" for k, v in times.items()),
              file=sys.stderr)

    med = {k: statistics.median(v) for k, v in times.items()}
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except Exception:  # noqa: BLE001
        pass
    where = torch.cuda.get_device_name(0) if gpu else "CPU"
    print(f"python_step: BertForMaskedLM BERT-{'large' if a.large else 'base'} ({a.layers} layers) b={a.batch} "
          f"j={a.seq} {a.dtype}{' autocast' if a.dtype == 'bf16' else ''} {where}, training step (forward, "
          f"backward, AdamW{' fused' if gpu else ''}), dropout 0.1, eager attention: {attn}"
          + (f"; padded batch, fill {float(mask.float().mean()):.3f}" if a.fill < 1.0 else ""))
    print(f"  {cpu}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), dmove threads {dt.get_num_threads()}, "
          f"python {platform.python_version()}")
    print(f"  rounds {a.rounds} (interleaved, after {a.warmup} warm-up step each); medians:")
    for k, v in med.items():
        print(f"    {k:8s} {v * 1e3:9.0f} ms   (min {min(times[k]) * 1e3:.0f}, "
              f"max {max(times[k]) * 1e3:.0f})")
    if compile_why:
        print(f"  {compile_why}")
    for k in med:
        if k not in ("patched", "unpad"):
            print(f"  patched vs {k}: {med[k] / med['patched']:.2f}x")
            if "unpad" in med:
                print(f"  unpad vs {k}: {med[k] / med['unpad']:.2f}x")
    if copies:
        mb = lambda n: f"{n / 2**20:.1f} MiB"
        print(f"  copies per patched step: {mb(copies['total'])} "
              f"({', '.join(f'{k} {mb(copies[k])}' for k in copies if k not in ('total', 'forward', 'backward'))}; "
              f"{copies['forward']} layer forwards, {copies['backward']} backwards)")


if __name__ == "__main__":
    main()
