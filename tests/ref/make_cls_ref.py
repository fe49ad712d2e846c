#!/usr/bin/env python3
"""make_cls_ref.py: PyTorch references for one step of a whole BertForSequenceClassification
(tests/test_cls.c), in float64 from float32-valued parameters and inputs.

Three small random configurations (sizes, heads, layers, num_labels 2 and 5; padding, token
types, a sequence without a label in some): "A" at dropout 0, checked here to equal
transformers' own BertForSequenceClassification to 1e-12 (loss and every gradient); "B" and
"C" with dropout on, dmove's Philox masks as src/train/model.c draws them at step 1: the
embeddings' site 4 under the seed of segment -1, each layer's sites 1-3 under its own, and
the pooled output's site 5 (shape (b, hidden)) under the seed of segment `layers` (the
head's). The model: pooled = tanh(dense(hidden[:, 0])), logits = classifier(dropout(pooled)),
loss = cross-entropy averaged over the labelled sequences (label -100: none).
Written to tests/ref/cls_step.safetensors: <case>.<input>, <case>.<parameter> (Hugging Face
names) and <case>.expected.{loss,correct,<parameter>.grad}; each case's sizes in the
metadata as <case>.<key>.

Usage: python3 tests/ref/make_cls_ref.py [--out DIR]   (needs PyTorch, NumPy, transformers)
"""
import argparse
import os
import sys

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_refs import bert_layer, dropout_scale, layer_norm, write_safetensors  # noqa: E402
from make_train_ref import train_layer_seed  # noqa: E402

PAD = 0
HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
# case: b, j, hidden, heads, ffn, layers, vocab, positions, types, labels, seed, dropout
CASES = {
    "A": dict(b=3, j=7, i=16, heads=2, ffn=32, layers=1, vocab=29, positions=10, types=2, labels=2, seed=11, p=0.0),
    "B": dict(b=4, j=9, i=24, heads=3, ffn=40, layers=2, vocab=31, positions=12, types=2, labels=5, seed=5, p=0.1),
    "C": dict(b=2, j=6, i=12, heads=1, ffn=20, layers=3, vocab=23, positions=6, types=3, labels=2, seed=9, p=0.2),
    # pre-LN, ReLU, heads of 3, one token type, 7 classes, eps 1e-6, a seed past 2^63
    "D": dict(b=3, j=5, i=15, heads=5, ffn=22, layers=2, vocab=19, positions=6, types=1, labels=7,
              seed=0xC0FFEE0123456789, p=0.3, act="relu", eps=1e-6, norm="pre"),
    # the tanh GELU, eps 1e-5, 4 classes, dropout 0: checked against transformers
    "E": dict(b=3, j=8, i=8, heads=2, ffn=12, layers=2, vocab=17, positions=9, types=3, labels=4, seed=3, p=0.0,
              act="gelu_tanh", eps=1e-5),
}


def f32(a):
    return np.asarray(a, dtype=np.float32)


def make_case(rng, c):
    cfg = BertConfig(vocab_size=c["vocab"], hidden_size=c["i"], num_hidden_layers=c["layers"],
                     num_attention_heads=c["heads"], intermediate_size=c["ffn"],
                     max_position_embeddings=c["positions"], type_vocab_size=c["types"], hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, layer_norm_eps=c.get("eps", 1e-12),
                     hidden_act=HF_ACT[c.get("act", "gelu")], pad_token_id=PAD,
                     num_labels=c["labels"], attn_implementation="eager")
    model = BertForSequenceClassification(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("LayerNorm.weight") else 0.0
            p.copy_(torch.from_numpy(f32(base + 0.3 * rng.standard_normal(p.shape)).astype(np.float64)))
    B, J = c["b"], c["j"]
    ids = rng.integers(1, c["vocab"], (B, J))
    ids[:, 0] = 2  # a [CLS] id
    ids[0, 3] = PAD  # a [PAD] id inside the text: its word row takes no gradient
    mask = np.ones((B, J))
    ids[1, J - 2:] = PAD  # padding at the end of the second sequence
    mask[1, J - 2:] = 0
    types = np.zeros((B, J), dtype=np.int64)
    if c["types"] > 1:
        types[0, J // 2:] = 1
    types[B - 1, 2:] = c["types"] - 1
    labels = rng.integers(0, c["labels"], B)
    if B > 2:
        labels[2] = -100  # a sequence without a label
    return model, ids, mask, types, labels


def explicit_forward(model, c, ids, mask, types, labels):
    """The model by hand with dmove's dropout masks (p may be 0)."""
    B, J, I, p, seed = c["b"], c["j"], c["i"], c["p"], c["seed"]
    e = model.bert.embeddings
    pos = torch.arange(J).expand(B, J)
    x = e.word_embeddings(torch.from_numpy(ids)) + e.position_embeddings(pos) + \
        e.token_type_embeddings(torch.from_numpy(types))
    eps = c.get("eps", 1e-12)
    x = layer_norm(x, e.LayerNorm.weight, e.LayerNorm.bias, eps)
    ds = dropout_scale(train_layer_seed(seed, -1, 1), 4, (B, J, I), p, torch.float64)
    if ds is not None:
        x = x * ds
    am = torch.from_numpy(mask)
    for l, layer in enumerate(model.bert.encoder.layer):
        prm = {n: t for n, t in layer.named_parameters()}
        x = bert_layer(x, am, prm, c["heads"], p, train_layer_seed(seed, l, 1), eps, c.get("act", "gelu"),
                       norm=c.get("norm", "post"))
    pooled = torch.tanh(model.bert.pooler.dense(x[:, 0]))
    ds = dropout_scale(train_layer_seed(seed, c["layers"], 1), 5, (B, I), p, torch.float64)
    if ds is not None:
        pooled = pooled * ds
    logits = model.classifier(pooled)
    lab = torch.from_numpy(labels)
    loss = torch.nn.functional.cross_entropy(logits, lab, ignore_index=-100)
    keep = lab >= 0
    correct = int((logits.argmax(-1)[keep] == lab[keep]).sum())
    return loss, correct


def grads_of(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    rng = np.random.default_rng(20261127)
    out = []
    meta = {"pad": PAD, "torch": torch.__version__, "cases": "".join(CASES)}
    for case, c in CASES.items():
        model, ids, mask, types, labels = make_case(rng, c)
        model.zero_grad()
        loss, correct = explicit_forward(model, c, ids, mask, types, labels)
        loss.backward()
        g = grads_of(model)
        if c["p"] == 0 and c.get("norm", "post") == "post":  # the composition is transformers' model
            model.zero_grad()
            hf = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                       token_type_ids=torch.from_numpy(types), labels=torch.from_numpy(labels))
            hf.loss.backward()
            assert abs(hf.loss.item() - loss.item()) < 1e-12, (hf.loss.item(), loss.item())
            h = grads_of(model)
            for n in g:
                assert torch.allclose(g[n], h[n], rtol=1e-10, atol=1e-12), n
        out += [(f"{case}.input_ids", f32(ids)), (f"{case}.attention_mask", f32(mask)),
                (f"{case}.token_type_ids", f32(types)), (f"{case}.labels", f32(labels)),
                (f"{case}.expected.loss", f32([loss.item()])), (f"{case}.expected.correct", f32([correct]))]
        for name, t in model.named_parameters():
            out.append((f"{case}.{name}", f32(t.detach().numpy())))
            out.append((f"{case}.expected.{name}.grad", f32(g[name].numpy())))
        for k, v in c.items():
            meta[f"{case}.{k}"] = v
        print(f"case {case}: {c} loss {loss.item():.6f}, {correct} predicted")
    path = os.path.join(a.out, "cls_step.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path} ({len(out)} tensors, {os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
