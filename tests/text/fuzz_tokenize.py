#!/usr/bin/env python3
"""fuzz_tokenize.py: random hostile lines through `dmove tokenize` and BertTokenizerFast, compared
id for id (a developer's tool beside the committed references; needs transformers).

    python3 tests/text/fuzz_tokenize.py --dmove build/dmove [--lines 20000] [--seed 1]
                                        [--tokenizer wp-cased.json@json ...]

Lines mix pieces chosen at random: letters of many scripts, combining marks, CJK at the edges of
BERT's Chinese ranges, Hangul, emoji sequences, controls and format characters, every kind of
space, Private Use and unassigned code points, the special and added tokens, runs of one
character around the 100-character word limit. A difference prints the line's repr, both id
lists and the exit; the exit status is 1 when any line differs.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_refs  # noqa: E402

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    " \t\x0b\x0c\r\x00\x01\x1b\x1f\x7f\x80\x85\x9f\xa0\xad",
    "".join(map(chr, range(0x300, 0x370))),  # combining marks
    "".join(map(chr, range(0xC0, 0x180))),  # Latin-1, Latin Extended-A
    "ΑΒΓΔΣσςΩωάέήίόύώΐΰϐϑϕϖ\u0345\u1f00\u1fb3",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВЁЇІЄҐ",
    "\u0130\u0131\u00df\u1e9e\ufb01\ufb00\u212b\u2126\u00c5\u0149\u01f0\u0587",
    "\u4e00\u4e01\u9fff\u9fa5\u3400\u4dbf\u4dc0\uf900\ufaff\ufb00\u3040\u30a2\u3000\u3001\u3002\uff01\uff21",
    "\U00020000\U0002a6df\U0002a6e0\U0002a700\U0002b73f\U0002b740\U0002b81f\U0002b820\U0002ceaf"
    "\U0002ceb0\U0002f800\U0002fa1f\U0002fa20\U00030000\U0003134a",
    "\uac00\ud7a3\ud55c\uae00\u1100\u1161\u11a8\u3131\u314f\ud7b0",
    "\U0001f600\U0001f44d\U0001f3fd\u200d\U0001f468\U0001f469\U0001f1e9\U0001f1ea\u2764\ufe0f\ufe0e\u20e3#",
    "\u200b\u200c\u200d\u200e\u200f\u202a\u202e\u2060\u2061\u2066\u2069\ufeff\u00ad\u061c\U000e0001\U000e0041",
    "\u1680\u2000\u2001\u2002\u2007\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u180e",
    "\ue000\uf8ff\U000f0000\U0010fffd\U0010ffff\ufffe\uffff\ufdd0\u0378\u0530\U0001fffe\U000e0000",
    "\u0e01\u0e32\u0e33\u0e31\u0e48\u0939\u093f\u0928\u094d\u0926\u0940\u0627\u0644\u064b\u05e9\u05b8",
    "\u2160\u2460\u24b6\u3392\uff10\u00b2\u00bd\u0660\u0966\U0001d400\U0001d7d8",
]
WORDS = ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "[mask]", "[URL]", "dmove", "DMOVE", "new york",
         "Ünï", "##", "##ing", "http://x.org/a?b=c", " ", "  ", "\t"]


def piece(rng):
    r = rng.random()
    if r < 0.12:
        return rng.choice(WORDS)
    if r < 0.17:  # a run around the word limit
        c = rng.choice(rng.choice(POOLS[:1] + POOLS[3:12]))
        return c * rng.choice([48, 49, 50, 51, 99, 100, 101, 102, 150])
    pool = rng.choice(POOLS)
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))


def line(rng):
    s = "".join(piece(rng) for _ in range(rng.randint(1, 8)))
    s = s.replace("\n", " ")
    while s.endswith("\r"):
        s = s[:-1]
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dmove", default=os.path.join(HERE, "..", "..", "build", "dmove"))
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", action="append",
                    help="NAME@MODE under tests/text/tok (default: all of make_refs.py's)")
    ap.add_argument("--show", type=int, default=10, help="differences printed per tokenizer")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    texts = [line(rng) for _ in range(a.lines)]
    toks = [t.split("@") for t in a.tokenizer] if a.tokenizer else [t[:2] for t in make_refs.TOKENIZERS]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzz.txt")
        with open(path, "wb") as f:
            f.write("".join(t + "\n" for t in texts).encode("utf-8", "surrogatepass"))
        for name, mode in toks:
            ref = make_refs.encode(make_refs.load(os.path.join(make_refs.TOK, name), mode), texts)
            flag = {"json": [], "lower": ["--lowercase"], "cased": ["--cased"]}[mode]
            out = subprocess.run([a.dmove, "tokenize", "--tokenizer", os.path.join(make_refs.TOK, name)]
                                 + flag + [path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            got = [list(map(int, l.split())) for l in out.stdout.decode().split("\n")[:-1]]
            diff = [i for i in range(len(texts)) if i >= len(got) or got[i] != ref[i]]
            print(f"{name}@{mode}: {len(texts) - len(diff)}/{len(texts)} lines agree"
                  + (f" (dmove exit {out.returncode}: {out.stderr.decode()[:200]})" if out.returncode else ""))
            for i in diff[:a.show]:
                print(f"  input {texts[i]!r}\n  reference {ref[i]}\n  dmove     {got[i] if i < len(got) else None}")
            bad += len(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
