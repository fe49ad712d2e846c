#!/usr/bin/env python3
"""bench/gpu/bert_gpu.py: transformers' BertForMaskedLM training step on a CUDA GPU, the
work bench/gpu/bert_step.c times for dmove, one JSON line.

The model: BertForMaskedLM of BertConfig(--layers, --hidden, --heads, --ffn, --vocab, 512
positions, 2 token types, dropout 0.1, exact GELU, eps 1e-12), the decoder tied to the
word table, attention by F.scaled_dot_product_attention (attn_implementation "sdpa"),
training mode. A step: zero_grad(set_to_none=True); forward with labels (the loss is
transformers' own: the decoder over all b x j positions, cross-entropy over the masked
ones); backward; AdamW(fused=True) (lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01
on weights and tables, not on biases and LayerNorm parameters, as dmove). --dtype bf16:
PyTorch's mixed precision recipe (fp32 parameters and AdamW, the forward and backward
under torch.autocast(bfloat16)), the counterpart of dmove's bf16 storage with fp32 master
weights; --dtype fp32: all fp32, TF32 off. The batches (15% of positions masked, token
type 0, no padding) are made on the device before timing, four of them in turn.
--mode compile: torch.compile(model, mode=--compile-mode, default max-autotune), compiled
in the warm-up steps (its time reported as compile_s). Timed with CUDA events around each
step (wall clock on the CPU), the median after --warmup steps.
--device cpu runs the same on the CPU: a check of this script without a GPU (use a tiny
--layers/--hidden/--vocab there).
"""
import argparse
import json
import os
import statistics
import time

import torch


def build(a, dev):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.ffn, max_position_embeddings=max(512, a.seq),
                     type_vocab_size=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                     hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).to(dev).train()
    impl = getattr(model.config, "_attn_implementation", "?")
    if impl != "sdpa":
        raise SystemExit(f"bert_gpu.py: attention implementation {impl}, not sdpa")
    if model.cls.predictions.decoder.weight.data_ptr() != model.bert.embeddings.word_embeddings.weight.data_ptr():
        raise SystemExit("bert_gpu.py: the decoder is not tied to the word table")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, d in (("layers", 24), ("hidden", 1024), ("heads", 16), ("ffn", 4096), ("vocab", 30522),
                    ("batch", 8), ("seq", 512), ("reps", 10), ("warmup", 3)):
        ap.add_argument("--" + name, type=int, default=d)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--compile-mode", default="max-autotune")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    gpu = a.device == "cuda"
    model = build(a, dev)
    named = list(model.named_parameters())  # the tied table once
    no_decay = lambda n: n.endswith(".bias") or "LayerNorm" in n  # noqa: E731
    groups = [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": 0.01},
              {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, fused=gpu)
    fwd = torch.compile(model, mode=a.compile_mode) if a.mode == "compile" else model
    g = torch.Generator(device="cpu").manual_seed(1)
    batches = []
    for _ in range(4):
        ids = torch.randint(5, a.vocab, (a.batch, a.seq), generator=g)
        masked = torch.rand(a.batch, a.seq, generator=g) < 0.15
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        inp = torch.where(masked, torch.full_like(ids, 4), ids)
        batches.append((inp.to(dev), labels.to(dev), torch.ones(a.batch, a.seq, dtype=torch.long, device=dev),
                        torch.zeros(a.batch, a.seq, dtype=torch.long, device=dev)))
    amp = torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step(k):
        inp, labels, mask, tt = batches[k % 4]
        opt.zero_grad(set_to_none=True)
        with amp:
            out = fwd(input_ids=inp, attention_mask=mask, token_type_ids=tt, labels=labels)
        out.loss.backward()
        opt.step()
        return out.loss

    t0 = time.perf_counter()
    for k in range(a.warmup):
        step(k)
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warm = time.perf_counter() - t0
    times, loss = [], None
    for k in range(a.reps):
        if gpu:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step(k)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        else:
            s = time.perf_counter()
            loss = step(k)
            times.append(1e3 * (time.perf_counter() - s))
    ms = statistics.median(times)
    name = "pytorch-" + a.mode
    recipe = ("autocast bf16" if a.dtype == "bf16" else "fp32") + ", sdpa, AdamW" + (" fused" if gpu else "") + \
        (f", compile {a.compile_mode}" if a.mode == "compile" else "")
    print(json.dumps({"framework": name, "recipe": recipe, "layers": a.layers, "batch": a.batch, "seq": a.seq,
                      "step_ms": round(ms, 3), "step_ms_min": round(min(times), 3),
                      "step_ms_max": round(max(times), 3), "seq_per_s": round(1e3 * a.batch / ms, 2),
                      "loss": round(float(loss.detach()), 4),
                      "peak_mb": round(torch.cuda.max_memory_allocated() / 1e6) if gpu else None,
                      "compile_s": round(warm, 1) if a.mode == "compile" else None,
                      "torch": torch.__version__}), flush=True)
    # torch.compile's worker processes can hold the interpreter's exit for minutes: the
    # line is out, leave now (bert.sh's timeout would otherwise count it as a failure)
    os._exit(0)


if __name__ == "__main__":
    main()
