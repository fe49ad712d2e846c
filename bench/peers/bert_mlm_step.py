#!/usr/bin/env python3
"""bench/peers/bert_mlm_step.py: the whole BERT's masked-LM training step in PyTorch
(transformers' BertForMaskedLM), timed on the very batches `dmove pretrain` trains on, and
printed as one JSON line: the peer of bench/peers/run_bert_peers.sh.

The model: BertForMaskedLM(BertConfig(vocab, hidden, layers, heads, ffn, 512 positions,
2 types, dropout 0.1)) in training mode, fp32, the attention transformers picks by default
(SDPA), the decoder tied to the word embeddings. A step: zero_grad(set_to_none=True);
forward; loss; backward; clip_grad_norm_(1.0) (dmove pretrain clips at 1 by default);
AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01 on weights, not on biases
and LayerNorms, as dmove). The batches come from bench/dump_batches (dmove's loader);
the labels past each sequence's first ceil(--predictions / b) chosen positions (and past
--predictions in all) are dropped, as dmove's trainer drops them, so both score the same
positions.

--head full    as a user runs it: model(input_ids, attention_mask, token_type_ids,
               labels=labels).loss: the MLM head (dense, GELU, LayerNorm, decoder) at every
               position, b*j x vocab logits, cross-entropy over the labelled ones
--head gather  as an expert writes it: the encoder's output gathered at the scored
               positions first (padded to --predictions rows, the padding ignored, one
               shape for every batch), the head (model.cls) and the cross-entropy on those
               rows only (what dmove computes)
--mode eager | compile  (torch.compile of the model or of the gathered forward, Inductor;
               compilation happens in the warm-up steps, never in the medians)

Both AdamW implementations are timed in one process, one after the other on the same
model: foreach (the default) for warmup + reps steps, then fused=True (fresh state) for
1 + reps steps; the JSON gives both medians and the faster one ("best").
--profile N: after timing, N more steps (fused AdamW) under torch.profiler; the top ops by
self CPU time are printed to stderr.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_batches(path, predictions):
    with open(path, "rb") as f:
        if f.read(4) != b"DMB1":
            sys.exit(f"{path}: not a dump_batches file")
        count, b, j = struct.unpack("<3q", f.read(24))
        a = np.fromfile(f, dtype="<i4", count=count * 4 * b * j).reshape(count, 4, b, j)
    out = []
    for k in range(count):
        ids, tt, am, lab = (torch.from_numpy(a[k, x].astype(np.int64)) for x in range(4))
        flat = lab.reshape(-1)
        chosen = (flat >= 0).nonzero().squeeze(1)
        if predictions:  # dmove's cap: each sequence's first ceil(M / b) chosen, M in all
            per_seq, keep = -(-predictions // b), []
            for s in range(b):
                mine = [int(r) for r in chosen if s * j <= int(r) < (s + 1) * j][:per_seq]
                keep += mine[:predictions - len(keep)]
            kept = torch.tensor(keep, dtype=torch.int64)
            left = torch.ones(flat.numel(), dtype=torch.bool)
            left[kept] = False
            flat[left & (flat >= 0)] = -100
            chosen = kept
        # the gathered rows padded to M (row 0, target -100: ignored), as dmove pads them: one
        # shape for every batch, so torch.compile compiles once
        m = predictions or chosen.numel()
        pos = torch.zeros(m, dtype=torch.int64)
        tgt = torch.full((m,), -100, dtype=torch.int64)
        pos[:chosen.numel()] = chosen
        tgt[:chosen.numel()] = flat[chosen]
        out.append({"input_ids": ids, "token_type_ids": tt, "attention_mask": am, "labels": lab,
                    "pos": pos, "target": tgt, "scored": int(chosen.numel())})
    return out


def make_model(a):
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.ffn, max_position_embeddings=512,
                     layer_norm_eps=1e-12,
                     type_vocab_size=2, hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout,
                     pad_token_id=0)
    torch.manual_seed(a.seed)
    return BertForMaskedLM(cfg).train()


def param_groups(model, wd=0.01):
    decay, rest = [], []
    for n, p in model.named_parameters():
        (decay if n.endswith("weight") and "LayerNorm" not in n else rest).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def make_optimizer(model, fused, lr=1e-4):
    return torch.optim.AdamW(param_groups(model), lr=lr, betas=(0.9, 0.999), eps=1e-6,
                             fused=True if fused else None, foreach=None if fused else True)


def loss_fn(model, head, compile_):
    """(batch) -> loss, the forward the step runs (compiled if asked)."""
    if head == "full":
        def f(ids, tt, am, lab, pos, tgt):
            return model(input_ids=ids, token_type_ids=tt, attention_mask=am, labels=lab).loss
    else:
        def f(ids, tt, am, lab, pos, tgt):
            h = model.bert(input_ids=ids, token_type_ids=tt, attention_mask=am).last_hidden_state
            rows = h.reshape(-1, h.shape[-1]).index_select(0, pos)
            return F.cross_entropy(model.cls(rows), tgt)
    return torch.compile(f, backend="inductor", dynamic=False) if compile_ else f


def step(model, opt, fn, bt):
    opt.zero_grad(set_to_none=True)
    loss = fn(bt["input_ids"], bt["token_type_ids"], bt["attention_mask"], bt["labels"], bt["pos"], bt["target"])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    opt.step()
    return loss


def timed(model, opt, fn, batches, start, warmup, reps):
    times, warm, losses = [], [], []
    for r in range(warmup + reps):
        bt = batches[(start + r) % len(batches)]
        t0 = time.perf_counter()
        loss = step(model, opt, fn, bt)
        dt = (time.perf_counter() - t0) * 1e3
        losses.append(float(loss.detach()))
        (times if r >= warmup else warm).append(dt)
    return times, warm, losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, d in (("layers", 12), ("hidden", 768), ("heads", 12), ("ffn", 3072), ("vocab", 30522),
                    ("reps", 3), ("warmup", 2), ("threads", 2), ("predictions", 0), ("seed", 0), ("profile", 0)):
        ap.add_argument("--" + name, type=int, default=d)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--batches", required=True, help="a dump_batches file")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--head", choices=("full", "gather"), default="full")
    ap.add_argument("--adamw", choices=("both", "foreach", "fused"), default="both")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    batches = read_batches(a.batches, a.predictions)
    b, j = batches[0]["input_ids"].shape
    model = make_model(a)
    fn = loss_fn(model, a.head, a.mode == "compile")
    res = {"variant": f"torch-{a.mode}-{a.head}", "batch": int(b), "seq": int(j), "torch": torch.__version__,
           "threads": torch.get_num_threads(),
           "scored": statistics.median(x["scored"] for x in batches)}
    t0 = time.perf_counter()
    warm_total = 0.0
    kinds = ("foreach", "fused") if a.adamw == "both" else (a.adamw,)
    for k, kind in enumerate(kinds):
        opt = make_optimizer(model, kind == "fused")
        times, warm, losses = timed(model, opt, fn, batches, 0, a.warmup if k == 0 else 1, a.reps)
        res[f"step_ms_{kind}"] = round(statistics.median(times), 1)
        res[f"steps_ms_{kind}"] = [round(x, 1) for x in times]
        res[f"loss_{kind}"] = losses
        warm_total += sum(warm) / 1e3
        del opt
    best = min(kinds, key=lambda k: res[f"step_ms_{k}"])
    res.update(step_ms=res[f"step_ms_{best}"], adamw=best, warmup_s=round(warm_total, 1),
               wall_s=round(time.perf_counter() - t0, 1), sdpa=model.config._attn_implementation)
    print(json.dumps(res), flush=True)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        opt = make_optimizer(model, True)
        step(model, opt, fn, batches[0])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for r in range(a.profile):
                step(model, opt, fn, batches[(r + 1) % len(batches)])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)


if __name__ == "__main__":
    main()
