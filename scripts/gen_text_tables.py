#!/usr/bin/env python3
"""scripts/gen_text_tables.py: writes src/text/unitab.c, the Unicode tables of dmove's
BERT tokenizer, measured from the reference itself (the `tokenizers` Python package, whose
Rust crates carry their own, older Unicode versions), never from Python's unicodedata
alone: every code point 0..0x10FFFF but the surrogates is put through

  BertNormalizer with clean_text alone     -> removed ("other", NUL, U+FFFD), ' ', or kept
  BertNormalizer with handle_chinese_chars -> padded with spaces (a CJK ideograph) or kept
  NFD (tokenizers.normalizers.NFD)         -> its canonical decomposition
  BertNormalizer with strip_accents alone  -> NFD less the nonspacing marks (Mn): a code
                                              point whose NFD is itself and that strips to
                                              nothing is Mn
  BertNormalizer with lowercase alone      -> Rust's char::to_lowercase (may expand)
  BertPreTokenizer                         -> whitespace (split off), punctuation
                                              (isolated) or neither
  an added token with single_word=True     -> whether the code point is a regex \\w char
                                              (it then keeps the token from matching)

and the canonical combining class of the code points the NFD crate treats as non-starters
(found by whether they move around U+0301 and U+0334; the value itself from unicodedata,
checked pairwise against the crate's ordering). Hangul syllables decompose by the
algorithm (checked against the probe). The script then checks the composition of these
per-character tables against the real normalizer on random strings.

Usage: python3 scripts/gen_text_tables.py [OUT]   (default src/text/unitab.c; about a
minute). Needs: pip install tokenizers==0.23.3 (the version the references use).
"""
import random
import sys
import unicodedata

import tokenizers
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

OUT = sys.argv[1] if len(sys.argv) > 1 else "src/text/unitab.c"

F_REMOVE, F_CLEANWS, F_CHINESE, F_WS, F_PUNCT, F_WORD, F_MN, F_HANGUL = (1 << k for k in range(8))

SB, LB, VB, TB = 0xAC00, 0x1100, 0x1161, 0x11A7
LC, VC, TC = 19, 21, 28
NC, SC = VC * TC, LC * VC * TC


def hangul_nfd(cp):
    s = cp - SB
    out = [LB + s // NC, VB + (s % NC) // TC]
    if s % TC:
        out.append(TB + s % TC)
    return "".join(map(chr, out))


def bert(clean=False, chinese=False, strip=False, lower=False):
    return normalizers.BertNormalizer(clean_text=clean, handle_chinese_chars=chinese,
                                      strip_accents=strip, lowercase=lower)


def main():
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    chars = [chr(c) for c in cps]
    n_clean, n_cjk, n_strip, n_lower = bert(clean=True), bert(chinese=True), bert(strip=True), bert(lower=True)
    n_nfd = normalizers.NFD()
    pre = pre_tokenizers.BertPreTokenizer()
    word_tok = Tokenizer(models.WordPiece({"[UNK]": 0, "x": 1}, unk_token="[UNK]"))
    word_tok.add_tokens([AddedToken("\u2603", single_word=True, normalized=False)])
    word_ids = word_tok.encode_batch([ch + "\u2603" for ch in chars])

    flags, nfd, lower, ccc = {}, {}, {}, {}
    for k, cp in enumerate(cps):
        ch = chars[k]
        f = 0
        c = n_clean.normalize_str(ch)
        if c == "":
            f |= F_REMOVE
        elif c == " " and ch != " ":
            f |= F_CLEANWS
        elif c != ch:
            raise SystemExit("clean_text: unexpected U+%04X -> %r" % (cp, c))
        z = n_cjk.normalize_str(ch)
        if z == " " + ch + " ":
            f |= F_CHINESE
        elif z != ch:
            raise SystemExit("chinese: unexpected U+%04X -> %r" % (cp, z))
        p = pre.pre_tokenize_str(ch + ch)
        if not p:
            f |= F_WS
        elif len(p) == 2:
            f |= F_PUNCT
        elif len(p) != 1 or p[0][0] != ch + ch:
            raise SystemExit("pre-tokenizer: unexpected U+%04X -> %r" % (cp, p))
        if word_ids[k].ids[-1] != 2 and ch != "\u2603":
            f |= F_WORD
        d = n_nfd.normalize_str(ch)
        if SB <= cp < SB + SC:
            if d != hangul_nfd(cp):
                raise SystemExit("Hangul U+%04X: NFD %r, not the algorithm's" % (cp, d))
            f |= F_HANGUL
        elif d != ch:
            nfd[cp] = d
        if d == ch and n_strip.normalize_str(ch) == "":
            f |= F_MN
        lo = n_lower.normalize_str(ch)
        if lo != ch:
            lower[cp] = lo
        flags[cp] = f

    # canonical combining classes, as the NFD crate orders them
    for k, cp in enumerate(cps):
        ch = chars[k]
        if cp in nfd or flags[cp] & F_HANGUL:
            continue
        hi = "\u0300" if ch == "\u0301" else "\u0301"  # class 230
        lo = "\u0335" if ch == "\u0334" else "\u0334"  # class 1
        s1 = n_nfd.normalize_str("a" + hi + ch) == "a" + ch + hi  # 0 < ccc < 230
        s2 = n_nfd.normalize_str("a" + ch + lo) == "a" + lo + ch  # ccc > 1
        if s1 or s2:
            v = unicodedata.combining(ch)
            if v == 0 or (0 < v < 230) != s1 or (v > 1) != s2:
                raise SystemExit("ccc of U+%04X: unicodedata %d, crate moves it %s %s" % (cp, v, s1, s2))
            ccc[cp] = v
    by_class = {}
    for cp, v in ccc.items():
        by_class.setdefault(v, cp)
    reps = sorted(by_class.items())
    for va, a in reps:
        for vb, b in reps:
            got = n_nfd.normalize_str("a" + chr(a) + chr(b))
            want = "a" + (chr(b) + chr(a) if va > vb else chr(a) + chr(b))
            if got != want:
                raise SystemExit("ccc order U+%04X U+%04X: crate %r" % (a, b, got))

    # strip_accents = NFD less Mn, per character
    for k, cp in enumerate(cps):
        ch = chars[k]
        d = nfd.get(cp, hangul_nfd(cp) if flags[cp] & F_HANGUL else ch)
        want = "".join(x for x in d if not flags[ord(x)] & F_MN)
        got = n_strip.normalize_str(ch)
        if got != want:
            raise SystemExit("strip U+%04X: %r, tables say %r" % (cp, got, want))

    check_random(cps, flags, nfd, lower, ccc)
    write(cps, flags, nfd, lower, ccc)


def model_normalize(s, flags, nfd, lower, ccc, clean, chinese, strip, low):
    """The tables' normalizer, as src/text does it (for the random check)."""
    out = []
    for ch in s:
        cp = ord(ch)
        if clean:
            if flags[cp] & F_REMOVE:
                continue
            if flags[cp] & F_CLEANWS:
                ch, cp = " ", 32
        if chinese and flags[cp] & F_CHINESE:
            out += [" ", ch, " "]
        else:
            out.append(ch)
    if strip:
        dec = []
        for ch in out:
            cp = ord(ch)
            dec += list(nfd.get(cp, hangul_nfd(cp) if flags[cp] & F_HANGUL else ch))
        k = 0
        while k < len(dec):  # canonical reordering, stable by class in each run
            if ccc.get(ord(dec[k]), 0) == 0:
                k += 1
                continue
            e = k
            while e < len(dec) and ccc.get(ord(dec[e]), 0) != 0:
                e += 1
            dec[k:e] = sorted(dec[k:e], key=lambda x: ccc[ord(x)])
            k = e
        out = [x for x in dec if not flags[ord(x)] & F_MN]
    if low:
        out = [lower.get(ord(x), x) for x in out]
    return "".join(out)


def check_random(cps, flags, nfd, lower, ccc):
    rng = random.Random(23)
    marks = [cp for cp in ccc] + [cp for cp in cps if flags[cp] & F_MN][:400]
    pools = [list(range(0x20, 0x7F)), list(range(0xA0, 0x250)), list(range(0x370, 0x530)),
             list(nfd), list(lower), marks, marks, list(range(0x4E00, 0x4E40)),
             list(range(0xAC00, 0xAC40)), list(range(0x1100, 0x1200)), list(range(0x1F300, 0x1FB00)),
             [0, 9, 10, 13, 0xFFFD, 0x200B, 0x200D, 0xFEFF, 0x2028, 0x3000, 0x85, 0xAD], cps]
    configs = [(c, z, s, l) for c in (0, 1) for z in (0, 1) for s in (0, 1) for l in (0, 1)]
    norms = {cf: bert(*map(bool, cf)) for cf in configs}
    bad = 0
    for _ in range(20000):
        n = rng.randint(1, 12)
        s = "".join(chr(rng.choice(rng.choice(pools))) for _ in range(n))
        for cf in configs:
            want = norms[cf].normalize_str(s)
            got = model_normalize(s, flags, nfd, lower, ccc, *cf)
            if got != want:
                bad += 1
                if bad < 10:
                    print("MISMATCH", cf, repr(s), repr(want), repr(got), file=sys.stderr)
    if bad:
        raise SystemExit("%d random strings normalize otherwise than the tables say" % bad)
    print("random check: 20000 strings x 16 configurations agree", file=sys.stderr)


def write(cps, flags, nfd, lower, ccc):
    pool, seqs, seq_index = [], [(0, 0)], {}

    def seq(s):
        if s not in seq_index:
            seq_index[s] = len(seqs)
            seqs.append((len(pool), len(s)))
            pool.extend(ord(x) for x in s)
        return seq_index[s]

    infos, info_index = [(0, 0, 0, 0)], {(0, 0, 0, 0): 0}
    per_cp = [0] * 0x110000
    for cp in cps:
        key = (flags[cp], ccc.get(cp, 0), seq(nfd[cp]) if cp in nfd else 0,
               seq(lower[cp]) if cp in lower else 0)
        if key not in info_index:
            info_index[key] = len(infos)
            infos.append(key)
        per_cp[cp] = info_index[key]
    assert len(infos) < 65536 and len(seqs) < 65536 and len(pool) < (1 << 24)
    BLK = 128
    blocks, block_index, stage1 = [], {}, []
    for b in range(0x110000 // BLK):
        blk = tuple(per_cp[b * BLK:(b + 1) * BLK])
        if blk not in block_index:
            block_index[blk] = len(blocks)
            blocks.append(blk)
        stage1.append(block_index[blk])
    assert len(blocks) < 65536

    def rows(vals, width=16):
        vals = list(vals)
        return ",\n".join("    " + ", ".join(str(v) for v in vals[k:k + width])
                          for k in range(0, len(vals), width))

    with open(OUT + ".tmp", "w") as f:
        f.write("/* unitab.c: GENERATED by scripts/gen_text_tables.py from tokenizers %s (its\n"
                " * BertNormalizer, NFD, BertPreTokenizer and added-token matching probed for every\n"
                " * code point); do not edit, run the script. The layout is unitab.h's. */\n"
                % tokenizers.__version__)
        f.write('#include "text/unitab.h"\n\n')
        f.write("const uint16_t dm_uni_stage1[%d] = {\n%s\n};\n\n" % (len(stage1), rows(stage1)))
        f.write("const uint16_t dm_uni_stage2[%d][%d] = {\n" % (len(blocks), BLK))
        f.write(",\n".join("  {\n%s\n  }" % rows(b) for b in blocks))
        f.write("\n};\n\n")
        f.write("const dm_uni_info dm_uni_infos[%d] = {\n" % len(infos))
        f.write(",\n".join("    {%d, %d, %d, %d}" % i for i in infos))
        f.write("\n};\n\n")
        f.write("const uint32_t dm_uni_seqs[%d] = {\n%s\n};\n\n"
                % (len(seqs), rows(((o << 8) | n for o, n in seqs), 8)))
        f.write("const uint32_t dm_uni_pool[%d] = {\n%s\n};\n" % (max(len(pool), 1), rows(pool or [0], 12)))
    import os
    os.replace(OUT + ".tmp", OUT)
    print("wrote %s: %d blocks, %d infos, %d sequences, %d pool code points"
          % (OUT, len(blocks), len(infos), len(seqs), len(pool)), file=sys.stderr)


if __name__ == "__main__":
    main()
