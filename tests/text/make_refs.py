#!/usr/bin/env python3
"""make_refs.py: the reference ids of transformers' BertTokenizerFast for the agreement test
(tests/test_tokenize_ref.sh), in `dmove tokenize --digest`'s format.

    python3 tests/text/make_refs.py                 # rewrites every tests/text/refs/*/*.sums
    python3 tests/text/make_refs.py --only wp-cased # the references of the tokenizers named so
    python3 tests/text/make_refs.py --corpus hostile  # those of the corpus files named so
    python3 tests/text/make_refs.py --show bert-base-uncased.json hostile.txt 20
          # line 20 of corpus/hostile.txt.gz: its repr, the reference ids and tokens
    python3 tests/text/make_refs.py --show wp-cased-vocab.txt@cased FILE 3   # FILE: any path

Pairs: every corpus file (tests/text/corpus/*.txt.gz) with every tokenizer of TOKENIZERS below
(but wp-prefix.json: four files),
written to refs/<tokenizer>@<mode>/<corpus>.sums (mode: json = the tokenizer.json as it is;
lower/cased = a vocab.txt given as --lowercase/--cased). An input is a line: the file's bytes
split on b"\\n", a b"\\r" before it stripped, decoded as UTF-8; the empty piece after the last
b"\\n" is not an input. Each input is encoded with its special tokens ([CLS] ... [SEP]); its
reference line is "<count> <hash>", the hash FNV-1a 64 (offset basis 0xcbf29ce484222325, prime
0x100000001b3) over the ids as little-endian int32, printed as 16 hex digits: what
`dmove tokenize --digest` prints. The reference keeps, per chunk of 1000 such lines, the
chunk's first line, lines, ids and the md5 of its lines (md5sum's), so the committed files are
small (the per-line digests of all pairs would be 27 MB); a chunk that differs is narrowed down
to its lines with --show or --digests.

How BertTokenizerFast is made (transformers 5.x; 5.24.0 made the committed files):
  json:  BertTokenizerFast(tokenizer_file=PATH). The file's normalizer, pre-tokenizer and model
         hold; the post-processor is BERT's "[CLS] $A [SEP]" with the file's ids; the file's
         truncation and padding are not applied (encoding without truncation/padding turns
         them off).
  lower/cased: BertTokenizerFast(vocab=PATH, do_lower_case=True/False): tokenizers reads the
         vocab.txt (line number = id; trailing whitespace of a line is dropped), as
         from_pretrained(DIR) does for a DIR with only that vocab.txt (transformers 5 ignores
         vocab_file=). Normalizer BertNormalizer(clean_text=True,
         handle_chinese_chars=True, strip_accents=None, lowercase=do_lower_case).
"""
import argparse
import gzip
import hashlib
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
TOK = os.path.join(HERE, "tok")
REFS = os.path.join(HERE, "refs")

# (file under tok/, mode[, only these corpus files])
TOKENIZERS = [
    ("bert-base-uncased.json", "json"),
    ("bert-base-uncased-vocab.txt", "lower"),
    ("bert-base-uncased-vocab.txt", "cased"),
    ("wp-cased.json", "json"),
    ("wp-cased-vocab.txt", "cased"),
    ("wp-lower-strip.json", "json"),
    ("wp-lower-keep-accents.json", "json"),
    ("wp-cased-strip-accents.json", "json"),
    ("wp-no-chinese.json", "json"),
    ("wp-no-clean.json", "json"),
    ("wp-added-tokens.json", "json"),
    ("wp-prefix.json", "json", ("hostile.txt.gz", "man-latin.txt.gz", "long-words.txt.gz",
                                "unicode.txt.gz")),
]


def load(path, mode):
    import transformers
    from transformers import BertTokenizerFast
    transformers.logging.set_verbosity_error()
    if mode == "json":
        return BertTokenizerFast(tokenizer_file=path)
    # vocab=PATH: tokenizers reads the file (a line's trailing whitespace, "\r" included, is not
    # part of the token), as from_pretrained(DIR) does; transformers' load_vocab() would keep it
    return BertTokenizerFast(vocab=path, do_lower_case=(mode == "lower"))


def inputs(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    return [p[:-1].decode("utf-8") if p.endswith(b"\r") else p.decode("utf-8") for p in pieces]


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for b in struct.pack(f"<{len(ids)}i", *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def encode(tok, texts):
    out = []
    for i in range(0, len(texts), 4096):
        out.extend(tok(texts[i:i + 4096], add_special_tokens=True)["input_ids"])
    return out


def ref_dir(name, mode):
    return os.path.join(REFS, f"{name}@{mode}")


CHUNK = 1000  # digest lines per checked chunk


def sums_text(lines):
    """The reference of one corpus file: per chunk of CHUNK `--digest` lines, its first line,
    its lines, its ids and the md5 of its digest lines (as md5sum prints it), one line each,
    after a header line: the file's lines and ids."""
    out, total = [], 0
    for k in range(0, len(lines), CHUNK):
        part = lines[k:k + CHUNK]
        ids = sum(int(x.split(" ")[0]) for x in part)
        total += ids
        out.append(f"{k + 1} {len(part)} {ids} {hashlib.md5(''.join(part).encode()).hexdigest()}\n")
    return f"# lines {len(lines)} ids {total} chunk {CHUNK}\n" + "".join(out)


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def make(only, only_corpus):
    corpora = sorted(n for n in os.listdir(CORPUS) if n.endswith(".txt.gz")
                     and (not only_corpus or any(c in n for c in only_corpus)))
    texts = {n: inputs(os.path.join(CORPUS, n)) for n in corpora}
    for name, mode, *subset in TOKENIZERS:
        if only and not any(o in f"{name}@{mode}" for o in only):
            continue
        tok = load(os.path.join(TOK, name), mode)
        os.makedirs(ref_dir(name, mode), exist_ok=True)
        for n in corpora:
            if subset and n not in subset[0]:
                continue
            ids = encode(tok, texts[n])
            lines = [f"{len(x)} {fnv1a64(x):016x}\n" for x in ids]
            write_text(os.path.join(ref_dir(name, mode), n[:-len(".txt.gz")] + ".sums"), sums_text(lines))
            print(f"{name}@{mode} {n}: {len(ids)} lines, {sum(map(len, ids))} ids", flush=True)


def show(spec, corpus, lineno):
    name, _, mode = spec.partition("@")
    mode = mode or ("json" if name.endswith(".json") else "lower")
    path = name if os.path.exists(name) else os.path.join(TOK, name)
    src = corpus if os.path.exists(corpus) else os.path.join(CORPUS, corpus)
    if not os.path.exists(src) and os.path.exists(src + ".gz"):
        src += ".gz"
    text = inputs(src)[lineno - 1]
    tok = load(path, mode)
    ids = tok([text], add_special_tokens=True)["input_ids"][0]
    print(f"input:  {text!r}")
    print(f"ids:    {' '.join(map(str, ids))}")
    print(f"tokens: {tok.convert_ids_to_tokens(ids)}")
    print(f"digest: {len(ids)} {fnv1a64(ids):016x}")


def digests(spec, corpus, first, count):
    name, _, mode = spec.partition("@")
    mode = mode or ("json" if name.endswith(".json") else "lower")
    path = name if os.path.exists(name) else os.path.join(TOK, name)
    src = corpus if os.path.exists(corpus) else os.path.join(CORPUS, corpus)
    if not os.path.exists(src) and os.path.exists(src + ".gz"):
        src += ".gz"
    texts = inputs(src)[first - 1:first - 1 + count]
    for k, x in enumerate(encode(load(path, mode), texts)):
        print(f"{first + k}: {len(x)} {fnv1a64(x):016x}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="only the tokenizers whose NAME@MODE contains this")
    ap.add_argument("--corpus", action="append", help="only the corpus files whose name contains this")
    ap.add_argument("--show", nargs=3, metavar=("TOKENIZER[@MODE]", "CORPUS", "LINE"),
                    help="print one line's reference ids (LINE counts from 1)")
    ap.add_argument("--digests", nargs=4, metavar=("TOKENIZER[@MODE]", "CORPUS", "FIRST", "COUNT"),
                    help="print the reference digest lines FIRST .. FIRST+COUNT-1 (compare with "
                         "dmove tokenize --digest's)")
    a = ap.parse_args()
    if a.show:
        show(a.show[0], a.show[1], int(a.show[2]))
    elif a.digests:
        digests(a.digests[0], a.digests[1], int(a.digests[2]), int(a.digests[3]))
    else:
        make(a.only, a.corpus)


if __name__ == "__main__":
    sys.exit(main())
