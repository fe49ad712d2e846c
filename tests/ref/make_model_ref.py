#!/usr/bin/env python3
"""make_model_ref.py: PyTorch references for one step of a whole BertForMaskedLM
(tests/test_model.c), in float64 from float32-valued parameters and inputs.

Five cases (CASES: sizes, layers, heads, activations, eps, padding ids, token types):
"A" (dropout 0) and "B", "C", "D" (dropout 0.1-0.2, dmove's Philox masks: the
embeddings' site 4 under the seed of segment -1, each layer's sites 1-3 under its own, as
src/train/model.c draws them at step 1), each with a [PAD] id inside the text, token
types, masked positions of which some are left out (past `m` in all, or, in "E", past a
sequence's share), and (but
D) padding at the end of a sequence; "E" with pre-LN layers. The scored positions are each
sequence's first ceil(m / b) masked ones, m at most in all, as dmove's batch_head. Each post-LN configuration is
checked here, at dropout 0, to equal transformers' own BertForMaskedLM to 1e-12, loss and
every gradient. The
metadata gives each case's configuration (<case>.b, .j, .i, ...). Written to tests/ref/model_step.safetensors: <case>.<input>,
<case>.<parameter> (Hugging Face names) and <case>.expected.{loss,correct,<parameter>.grad}.

Usage: python3 tests/ref/make_model_ref.py [--out DIR]   (needs PyTorch, NumPy, transformers)
"""
import argparse
import os
import sys

import numpy as np
import torch
from transformers import BertConfig, BertForMaskedLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_refs import bert_layer, dropout_scale, layer_norm, write_safetensors  # noqa: E402
from make_train_ref import train_layer_seed  # noqa: E402

# Each case's configuration: b, j, hidden i, heads h, ffn u, layers l, vocabulary v,
# positions n, token types t, predictions m scored, seed, padding id, activation, eps,
# dropout p; the rows of the second sequence from `padfrom` on are padding, token type 1
# from `type1` in the first; `masked`: the masked positions (the first m scored).
CASES = {
    "A": dict(b=2, j=9, i=16, h=2, u=32, l=2, v=37, n=12, t=2, m=5, seed=11, pad=0, act="gelu", eps=1e-12, p=0.0,
              padfrom=6, type1=5, masked=[(0, 1), (0, 4), (0, 7), (1, 0), (1, 2), (1, 5)]),
    "B": dict(b=2, j=9, i=16, h=2, u=32, l=2, v=37, n=12, t=2, m=5, seed=11, pad=0, act="gelu", eps=1e-12, p=0.1,
              padfrom=6, type1=5, masked=[(0, 1), (0, 4), (0, 7), (1, 0), (1, 2), (1, 5)]),
    # three layers, three heads, the tanh GELU (transformers' gelu_new), another padding id
    "C": dict(b=3, j=7, i=24, h=3, u=40, l=3, v=53, n=7, t=2, m=4, seed=5, pad=2, act="gelu_tanh", eps=1e-7,
              p=0.1, padfrom=4, type1=3, masked=[(0, 0), (1, 2), (2, 6), (2, 1), (0, 5)]),
    # one layer, one head, ReLU, three token types, one sequence of 16
    "D": dict(b=1, j=16, i=12, h=1, u=12, l=1, v=29, n=20, t=3, m=3, seed=9, pad=0, act="relu", eps=1e-5, p=0.2,
              padfrom=None, type1=8, masked=[(0, 3), (0, 9), (0, 15), (0, 4)]),
    # pre-LN layers (dmove's --norm pre: no transformers class to check against at dropout
    # 0, the composition is the same code's), heads of 3, a seed past 2^63, dropout 0.3; the first
    # sequence has 3 masked positions, past its share of ceil(4 / 3) = 2
    "E": dict(b=3, j=6, i=9, h=3, u=20, l=2, v=41, n=8, t=2, m=4, seed=0xF00DFACE12345678, pad=1, act="gelu_tanh",
              eps=1e-6, p=0.3, padfrom=3, type1=2, masked=[(0, 0), (0, 2), (0, 4), (1, 1), (2, 2), (2, 5)], norm="pre"),
}
HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def f32(a):
    return np.asarray(a, dtype=np.float32)


def make_case(rng, c):
    B, J, V, PAD = c["b"], c["j"], c["v"], c["pad"]
    cfg = BertConfig(vocab_size=V, hidden_size=c["i"], num_hidden_layers=c["l"], num_attention_heads=c["h"],
                     intermediate_size=c["u"], max_position_embeddings=c["n"], type_vocab_size=c["t"],
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=c["eps"],
                     hidden_act=HF_ACT[c["act"]], pad_token_id=PAD, attn_implementation="eager")
    model = BertForMaskedLM(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "cls.predictions.decoder.weight":
                continue  # tied to the word embeddings
            base = 1.0 if name.endswith("LayerNorm.weight") else 0.0
            p.copy_(torch.from_numpy(f32(base + 0.3 * rng.standard_normal(p.shape)).astype(np.float64)))
    ids = rng.integers(0, V, (B, J))
    ids[ids == PAD] = (PAD + 1) % V
    ids[0, 3] = PAD  # a [PAD] id inside the text: its word row takes no gradient
    mask = np.ones((B, J))
    if c["padfrom"] is not None:
        ids[1, c["padfrom"]:] = PAD  # padding at the end of the second sequence
        mask[1, c["padfrom"]:] = 0
    types = np.zeros((B, J), dtype=np.int64)
    types[0, c["type1"]:] = 1
    if c["t"] > 2:
        types[0, -2:] = c["t"] - 1
    labels = np.full((B, J), -100)
    for (bb, jj) in c["masked"]:  # the first m scored, the rest left out
        labels[bb, jj] = rng.integers(0, V)
    return model, ids, mask, types, labels


def scored_rows(c, labels):
    """dmove's scored rows: each sequence's first ceil(m / b) masked positions in order, m at
    most in all (src/train/model.c, batch_head)."""
    B, J, M = c["b"], c["j"], c["m"]
    per_seq, rows = -(-M // B), []
    lab = labels.reshape(-1)
    for bb in range(B):
        mine = [bb * J + jj for jj in range(J) if lab[bb * J + jj] >= 0][:per_seq]
        rows += mine[:M - len(rows)]
    return rows


def explicit_forward(model, c, ids, mask, types, labels):
    """The model by hand with dmove's dropout masks (p may be 0)."""
    B, J, I, p, eps = c["b"], c["j"], c["i"], c["p"], c["eps"]
    e = model.bert.embeddings
    pos = torch.arange(J).expand(B, J)
    x = e.word_embeddings(torch.from_numpy(ids)) + e.position_embeddings(pos) + \
        e.token_type_embeddings(torch.from_numpy(types))
    x = layer_norm(x, e.LayerNorm.weight, e.LayerNorm.bias, eps)
    # the embeddings are segment -1 of dm_train_layer_seed (layer + 1 = 0)
    ds = dropout_scale(train_layer_seed(c["seed"], -1, 1), 4, (B, J, I), p, torch.float64)
    if ds is not None:
        x = x * ds
    am = torch.from_numpy(mask)
    for l, layer in enumerate(model.bert.encoder.layer):
        prm = {n: t for n, t in layer.named_parameters()}
        x = bert_layer(x, am, prm, c["h"], p, train_layer_seed(c["seed"], l, 1), eps, c["act"],
                       norm=c.get("norm", "post"))
    flat = x.reshape(B * J, I)
    lab = torch.from_numpy(labels.reshape(-1))
    scored = scored_rows(c, labels)
    logits = model.cls(flat[torch.tensor(scored)])
    tgt = lab[torch.tensor(scored)]
    loss = torch.nn.functional.cross_entropy(logits, tgt)
    correct = int((logits.argmax(-1) == tgt).sum())
    return loss, correct


def grads_of(model):
    out = {}
    for name, p in model.named_parameters():
        if name == "cls.predictions.decoder.weight" or name == "cls.predictions.decoder.bias":
            continue
        out[name] = p.grad.detach().clone()
    return out


def check_hf(model, c, ids, mask, types, labels, loss, g):
    """At dropout 0 the composition is transformers' own model, loss and every gradient."""
    model.zero_grad()
    B, J = c["b"], c["j"]
    lab = labels.copy().reshape(-1)
    scored = set(scored_rows(c, labels))
    keep = [r for r in range(B * J) if lab[r] >= 0 and r not in scored]
    lab[keep] = -100  # the positions past a sequence's share are left out, as dmove does
    hf = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
               token_type_ids=torch.from_numpy(types), labels=torch.from_numpy(lab.reshape(B, J)))
    hf.loss.backward()
    assert abs(hf.loss.item() - loss.item()) < 1e-12, (hf.loss.item(), loss.item())
    h = grads_of(model)
    for n in g:
        assert torch.allclose(g[n], h[n], rtol=1e-10, atol=1e-12), n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    rng = np.random.default_rng(20261127)
    out, meta = [], {"cases": ",".join(CASES), "torch": torch.__version__}
    for case, c in CASES.items():
        model, ids, mask, types, labels = make_case(rng, c)
        # every post-LN configuration's composition is transformers' model at dropout 0
        if c.get("norm", "post") == "post":
            c0 = dict(c, p=0.0)
            model.zero_grad()
            loss0, _ = explicit_forward(model, c0, ids, mask, types, labels)
            loss0.backward()
            check_hf(model, c0, ids, mask, types, labels, loss0, grads_of(model))
        model.zero_grad()
        loss, correct = explicit_forward(model, c, ids, mask, types, labels)
        loss.backward()
        g = grads_of(model)
        out += [(f"{case}.input_ids", f32(ids)), (f"{case}.attention_mask", f32(mask)),
                (f"{case}.token_type_ids", f32(types)), (f"{case}.labels", f32(labels)),
                (f"{case}.expected.loss", f32([loss.item()])), (f"{case}.expected.correct", f32([correct]))]
        for name, t in model.named_parameters():
            if name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
                continue
            out.append((f"{case}.{name}", f32(t.detach().numpy())))
            out.append((f"{case}.expected.{name}.grad", f32(g[name].numpy())))
        for k in ("b", "j", "i", "h", "u", "l", "v", "n", "t", "m", "seed", "pad", "act", "eps", "p"):
            meta[f"{case}.{k}"] = c[k]
        meta[f"{case}.counted"] = len(scored_rows(c, labels))
        meta[f"{case}.dropped"] = len(c["masked"]) - meta[f"{case}.counted"]
        meta[f"{case}.norm"] = c.get("norm", "post")
        print(f"case {case}: p={c['p']} {c['act']} loss {loss.item():.6f}, {correct} of {c['m']} predicted")
    path = os.path.join(a.out, "model_step.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
