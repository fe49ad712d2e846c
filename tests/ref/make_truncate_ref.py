"""Writes tests/ref/truncate_pair.txt: how Hugging Face tokenizers' truncation
"longest_first" cuts a pair of texts of la and lb tokens to a room of `room` tokens (the
length less the three special tokens), one line "la lb room kept_a kept_b" per case, for
la, lb in 0..11 and twelve rooms. test_text checks dm_truncate_pair against every line.
Run with a Python that has tokenizers: python tests/ref/make_truncate_ref.py"""
import os

from tokenizers import Tokenizer, models, pre_tokenizers, processors

vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "b": 5}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
lines = []
for room in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13):
    tok.enable_truncation(max_length=room + 3, strategy="longest_first")
    for la in range(12):
        for lb in range(12):
            ids = tok.encode(" ".join(["a"] * la), " ".join(["b"] * lb)).ids
            lines.append(f"{la} {lb} {room} {ids.count(4)} {ids.count(5)}\n")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "truncate_pair.txt")
with open(out, "w") as f:
    f.writelines(lines)
print(f"wrote {out}: {len(lines)} cases")
