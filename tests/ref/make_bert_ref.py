#!/usr/bin/env python3
"""make_bert_ref.py: PyTorch references for the parts of a whole BERT beside its encoder
layers (tests/test_bert.c): transformers' BertEmbeddings and BertOnlyMLMHead (tied
decoder, cross-entropy over the masked positions), in float64 from float32-valued inputs.

Case "emb": b=3 j=7 i=16, vocabulary 50, 20 positions, 2 token types, dropout p=0.1 with
dmove's Philox mask (site 4, the embeddings'), layer_norm_eps 1e-12: output, and every
parameter's gradient for a given grad_output.
Case "head": the same sizes and 6 scored positions (two of them padding rows, label -100),
gelu: the mean cross-entropy over the 4 that count, its per-row losses, and the gradients
of hidden_states and every head parameter (the decoder's own, before tying).

Usage: python3 tests/ref/make_bert_ref.py [--out DIR]   (needs PyTorch, NumPy, transformers)
"""
import argparse
import os
import sys

import numpy as np
import torch
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertEmbeddings, BertOnlyMLMHead

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_refs import dropout_scale, write_safetensors  # noqa: E402

B, J, I, V, P, TT, M, SEED, PDROP = 3, 7, 16, 50, 20, 2, 6, 5, 0.1


def f32(a):
    return np.asarray(a, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(20261127)
    cfg = BertConfig(vocab_size=V, hidden_size=I, max_position_embeddings=P, type_vocab_size=TT,
                     hidden_dropout_prob=0.0, layer_norm_eps=1e-12, hidden_act="gelu")
    out = []
    # --- embeddings -------------------------------------------------------------------
    emb = BertEmbeddings(cfg).double().eval()
    prm = {"embeddings.word_embeddings.weight": emb.word_embeddings.weight,
           "embeddings.position_embeddings.weight": emb.position_embeddings.weight,
           "embeddings.token_type_embeddings.weight": emb.token_type_embeddings.weight,
           "embeddings.LayerNorm.weight": emb.LayerNorm.weight, "embeddings.LayerNorm.bias": emb.LayerNorm.bias}
    with torch.no_grad():
        for name, p in prm.items():
            v = f32(rng.standard_normal(p.shape) * (0.3 if "Norm" not in name else 0.2) + (1.0 if name.endswith(
                "LayerNorm.weight") else 0.0))
            p.copy_(torch.from_numpy(v.astype(np.float64)))
            out.append((f"emb.{name}", v))
    ids = rng.integers(0, V, (B, J))
    ids[0, 0], ids[1, 3] = 0, V - 1
    ids[2, :] = ids[2, 0]  # one id many times: the scatter sums its rows
    types = rng.integers(0, TT, (B, J))
    pos = np.tile(np.arange(J), (B, 1))
    pos[1] = np.arange(J) + 3  # positions need not start at 0
    out += [("emb.input_ids", f32(ids)), ("emb.token_type_ids", f32(types)), ("emb.position_ids", f32(pos))]
    x = emb(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types),
            position_ids=torch.from_numpy(pos))
    y = x * dropout_scale(SEED, 4, (B, J, I), PDROP, torch.float64)
    gy = f32(rng.standard_normal((B, J, I)))
    (y * torch.from_numpy(gy.astype(np.float64))).sum().backward()
    out += [("emb.grad_output", gy), ("emb.expected.output", f32(y.detach().numpy()))]
    for name, p in prm.items():
        out.append((f"emb.expected.{name}.grad", f32(p.grad.numpy())))
    # --- MLM head ---------------------------------------------------------------------
    head = BertOnlyMLMHead(cfg).double().eval()
    hp = {"cls.predictions.transform.dense.weight": head.predictions.transform.dense.weight,
          "cls.predictions.transform.dense.bias": head.predictions.transform.dense.bias,
          "cls.predictions.transform.LayerNorm.weight": head.predictions.transform.LayerNorm.weight,
          "cls.predictions.transform.LayerNorm.bias": head.predictions.transform.LayerNorm.bias,
          "cls.predictions.decoder.weight": head.predictions.decoder.weight,
          "cls.predictions.bias": head.predictions.decoder.bias}  # transformers 5: the decoder's own bias, tied in models
    with torch.no_grad():
        for name, p in hp.items():
            v = f32(rng.standard_normal(p.shape) * 0.3 + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
            p.copy_(torch.from_numpy(v.astype(np.float64)))
            out.append((f"head.{name}", v))
    hidden = torch.from_numpy(f32(rng.standard_normal((B, J, I))).astype(np.float64)).requires_grad_(True)
    mpos = np.array([0, 5, 9, 20, 0, 0])  # rows of (b*j): the last two are padding rows
    labels = np.array([3, V - 1, 0, 17, -100, -100])
    logits = head(hidden.reshape(B * J, I)[torch.from_numpy(mpos)])
    ce = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels), ignore_index=-100, reduction="none")
    loss = ce.sum() / (labels >= 0).sum()
    loss.backward()
    out += [("head.hidden_states", f32(hidden.detach().numpy())), ("head.masked_positions", f32(mpos)),
            ("head.labels", f32(labels)), ("head.expected.loss_rows", f32(ce.detach().numpy())),
            ("head.expected.loss", f32([loss.item()])), ("head.expected.grad_hidden_states", f32(hidden.grad.numpy()))]
    for name, p in hp.items():
        out.append((f"head.expected.{name}.grad", f32(p.grad.numpy())))
    meta = {"b": B, "j": J, "i": I, "vocab": V, "positions": P, "types": TT, "predictions": M, "seed": SEED,
            "dropout": PDROP, "torch": torch.__version__}
    path = os.path.join(a.out, "bert_parts.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path} ({len(out)} tensors; loss {loss.item():.6f})")


if __name__ == "__main__":
    main()
