#!/usr/bin/env python3
"""make_model_ops_ref.py: the PyTorch reference of tests/test_model_ops.c: BERT's
embeddings and a masked-LM head built from dmove's whole-model operators (EMBED, its
scatter-add backward, XENT), one step forward and backward in float64.

  embeddings: transformers' BertEmbeddings (word + position + token type, LayerNorm,
              dropout off): h = LN(W[ids] + P[pos] + T[tt])            (b, j, i)
  head:       the masked positions' rows, a decoder tied to the word embeddings with a
              bias, cross-entropy with ignore_index=-100, the mean over the rows that
              count: loss = CE(h.view(-1, i)[mpos] @ W^T + bias, labels)

The word table's padding_idx is cleared (a plain gather, as EMBED). Sizes: b=2, j=5, i=8, vocab 11, 7 positions, 2 token types, 4 masked rows (one label
-100: ignored); ids include 0 and vocab - 1 and repeat. Checked before writing: the
embeddings against an explicit composition (F.embedding, F.layer_norm) in float64, and
BertEmbeddings' word table tied (the same Parameter as the decoder's weight).
Written to tests/ref/model_ops.safetensors (float32): the inputs (ids, pos, tt, mpos,
labels as floats, dmove's index convention), the parameters, and the expected h, per-row
losses (0 where ignored), the mean loss and every parameter's gradient (word: the sum of
its gather and decoder parts).

Usage: python3 tests/ref/make_model_ops_ref.py [--out DIR]   (needs PyTorch, NumPy, transformers)
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_refs import write_safetensors  # noqa: E402

B, J, I, V, M, T, K, EPS = 2, 5, 8, 11, 7, 2, 4, 1e-12


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertEmbeddings

    rng = np.random.default_rng(20261127)
    ids = rng.integers(0, V, size=(B, J))
    ids[0, 0], ids[1, 4], ids[1, 1] = 0, V - 1, ids[0, 2]  # the first, the last, a repeat
    pos = np.tile(np.arange(J), (B, 1))
    tt = np.zeros((B, J), dtype=np.int64)
    tt[:, 3:] = 1
    mpos = np.array([0, 3, 7, B * J - 1])  # flat (b, j) rows: the first and the last
    labels = np.array([ids.flat[r] for r in mpos])
    labels[2] = -100  # not counted
    word = (0.5 * rng.standard_normal((V, I))).astype(np.float32)
    posw = (0.5 * rng.standard_normal((M, I))).astype(np.float32)
    typew = (0.5 * rng.standard_normal((T, I))).astype(np.float32)
    gamma = (1 + 0.2 * rng.standard_normal(I)).astype(np.float32)
    beta = (0.2 * rng.standard_normal(I)).astype(np.float32)
    bias = (0.2 * rng.standard_normal(V)).astype(np.float32)

    cfg = BertConfig(vocab_size=V, hidden_size=I, max_position_embeddings=M, type_vocab_size=T,
                     layer_norm_eps=EPS, hidden_dropout_prob=0.0, pad_token_id=0)
    emb = BertEmbeddings(cfg).double().eval()
    # Hugging Face gives the word table padding_idx = pad_token_id: that row takes no
    # gradient from the lookup. EMBED is the plain gather (every row's gradient); a
    # trainer that wants HF's rule masks the pad rows of dy (issue 24's notes).
    emb.word_embeddings.padding_idx = None
    with torch.no_grad():
        emb.word_embeddings.weight.copy_(torch.tensor(word, dtype=torch.float64))
        emb.position_embeddings.weight.copy_(torch.tensor(posw, dtype=torch.float64))
        emb.token_type_embeddings.weight.copy_(torch.tensor(typew, dtype=torch.float64))
        emb.LayerNorm.weight.copy_(torch.tensor(gamma, dtype=torch.float64))
        emb.LayerNorm.bias.copy_(torch.tensor(beta, dtype=torch.float64))
    dec_bias = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    ti = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    h = emb(input_ids=ti(ids), token_type_ids=ti(tt), position_ids=ti(pos))
    h.retain_grad()
    W = emb.word_embeddings.weight  # tied: the decoder's weight is this Parameter
    logits = h.reshape(-1, I)[ti(mpos)] @ W.t() + dec_bias
    rows = F.cross_entropy(logits, ti(labels), ignore_index=-100, reduction="none")
    loss = F.cross_entropy(logits, ti(labels), ignore_index=-100, reduction="mean")
    assert abs(loss.item() - rows.sum().item() / (labels >= 0).sum()) < 1e-14
    loss.backward()

    # self-check: the embeddings as an explicit composition
    with torch.no_grad():
        x = F.embedding(ti(ids), W) + F.embedding(ti(pos), emb.position_embeddings.weight) + \
            F.embedding(ti(tt), emb.token_type_embeddings.weight)
        h2 = F.layer_norm(x, (I,), emb.LayerNorm.weight, emb.LayerNorm.bias, EPS)
        err = (h2 - h).abs().max().item()
        assert err < 1e-13, err

    f = lambda t: t.detach().numpy().astype(np.float32)  # noqa: E731
    tensors = [
        ("ids", ids.astype(np.float32)), ("pos", pos.astype(np.float32)), ("tt", tt.astype(np.float32)),
        ("mpos", mpos.astype(np.float32)), ("labels", labels.astype(np.float32)),
        ("word", word), ("position", posw), ("type", typew), ("gamma", gamma), ("beta", beta), ("bias", bias),
        ("h", f(h)), ("loss_rows", f(rows)), ("loss", np.array([loss.item()], dtype=np.float32)),
        ("word.grad", f(W.grad)), ("position.grad", f(emb.position_embeddings.weight.grad)),
        ("type.grad", f(emb.token_type_embeddings.weight.grad)), ("gamma.grad", f(emb.LayerNorm.weight.grad)),
        ("beta.grad", f(emb.LayerNorm.bias.grad)), ("bias.grad", f(dec_bias.grad)),
    ]
    meta = {"b": B, "j": J, "i": I, "vocab": V, "positions": M, "types": T, "masked": K, "eps": EPS,
            "torch": torch.__version__}
    path = os.path.join(a.out, "model_ops.safetensors")
    write_safetensors(path, tensors, meta)
    print(f"wrote {path}: loss {loss.item():.6f}, self-check {err:.1e}")


if __name__ == "__main__":
    main()
