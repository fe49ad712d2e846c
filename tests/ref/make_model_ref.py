#!/usr/bin/env python3
"""make_model_ref.py: PyTorch references for one step of a whole BertForMaskedLM
(tests/test_model.c), in float64 from float32-valued parameters and inputs.

Two cases, "A" (dropout 0: checked here to equal transformers' own BertForMaskedLM to
1e-12, loss and every gradient) and "B" (dropout 0.1, dmove's Philox masks: the embeddings'
site 4 under the seed of segment -1, each layer's sites 1-3 under its own, as
src/train/model.c draws them at step 1), each with padding, a [PAD] id inside the text,
token types, and masked positions of which some are scored (the first `predictions`) and
one is left out. Written to tests/ref/model_step.safetensors: <case>.<input>,
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

B, J, I, H, U, L, V, P, TT, M, SEED, PAD = 2, 9, 16, 2, 32, 2, 37, 12, 2, 5, 11, 0


def f32(a):
    return np.asarray(a, dtype=np.float32)


def make_case(rng):
    cfg = BertConfig(vocab_size=V, hidden_size=I, num_hidden_layers=L, num_attention_heads=H, intermediate_size=U,
                     max_position_embeddings=P, type_vocab_size=TT, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=PAD,
                     attn_implementation="eager")
    model = BertForMaskedLM(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "cls.predictions.decoder.weight":
                continue  # tied to the word embeddings
            base = 1.0 if name.endswith("LayerNorm.weight") else 0.0
            p.copy_(torch.from_numpy(f32(base + 0.3 * rng.standard_normal(p.shape)).astype(np.float64)))
    ids = rng.integers(1, V, (B, J))
    ids[0, 3] = PAD  # a [PAD] id inside the text: its word row takes no gradient
    ids[1, 6:] = PAD  # padding at the end of the second sequence
    mask = np.ones((B, J))
    mask[1, 6:] = 0
    types = np.zeros((B, J), dtype=np.int64)
    types[0, 5:] = 1
    labels = np.full((B, J), -100)
    for (bb, jj) in [(0, 1), (0, 4), (0, 7), (1, 0), (1, 2), (1, 5)]:  # 6 masked: the first 5 scored
        labels[bb, jj] = rng.integers(0, V)
    return model, ids, mask, types, labels


def explicit_forward(model, ids, mask, types, labels, p):
    """The model by hand with dmove's dropout masks (p may be 0)."""
    e = model.bert.embeddings
    pos = torch.arange(J).expand(B, J)
    x = e.word_embeddings(torch.from_numpy(ids)) + e.position_embeddings(pos) + \
        e.token_type_embeddings(torch.from_numpy(types))
    x = layer_norm(x, e.LayerNorm.weight, e.LayerNorm.bias, 1e-12)
    # the embeddings are segment -1 of dm_train_layer_seed (layer + 1 = 0)
    ds = dropout_scale(train_layer_seed(SEED, -1, 1), 4, (B, J, I), p, torch.float64)
    if ds is not None:
        x = x * ds
    am = torch.from_numpy(mask)
    for l, layer in enumerate(model.bert.encoder.layer):
        prm = {n: t for n, t in layer.named_parameters()}
        x = bert_layer(x, am, prm, H, p, train_layer_seed(SEED, l, 1), 1e-12, "gelu")
    flat = x.reshape(B * J, I)
    lab = torch.from_numpy(labels.reshape(-1))
    scored = [r for r in range(B * J) if lab[r] >= 0][:M]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    rng = np.random.default_rng(20261127)
    out = []
    for case, p in (("A", 0.0), ("B", 0.1)):
        model, ids, mask, types, labels = make_case(rng)
        model.zero_grad()
        loss, correct = explicit_forward(model, ids, mask, types, labels, p)
        loss.backward()
        g = grads_of(model)
        if p == 0:  # the composition is transformers' model
            model.zero_grad()
            lab = labels.copy().reshape(-1)
            keep = [r for r in range(B * J) if lab[r] >= 0][M:]
            lab[keep] = -100  # the positions past `predictions` are left out, as dmove does
            hf = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                       token_type_ids=torch.from_numpy(types), labels=torch.from_numpy(lab.reshape(B, J)))
            hf.loss.backward()
            assert abs(hf.loss.item() - loss.item()) < 1e-12, (hf.loss.item(), loss.item())
            h = grads_of(model)
            for n in g:
                assert torch.allclose(g[n], h[n], rtol=1e-10, atol=1e-12), n
        out += [(f"{case}.input_ids", f32(ids)), (f"{case}.attention_mask", f32(mask)),
                (f"{case}.token_type_ids", f32(types)), (f"{case}.labels", f32(labels)),
                (f"{case}.expected.loss", f32([loss.item()])), (f"{case}.expected.correct", f32([correct]))]
        for name, t in model.named_parameters():
            if name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
                continue
            out.append((f"{case}.{name}", f32(t.detach().numpy())))
            out.append((f"{case}.expected.{name}.grad", f32(g[name].numpy())))
        print(f"case {case}: p={p} loss {loss.item():.6f}, {correct} of {M} predicted")
    meta = {"b": B, "j": J, "i": I, "heads": H, "ffn": U, "layers": L, "vocab": V, "positions": P, "types": TT,
            "predictions": M, "seed": SEED, "pad": PAD, "dropout_B": 0.1, "torch": torch.__version__}
    path = os.path.join(a.out, "model_step.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
