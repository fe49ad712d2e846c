#!/usr/bin/env python3
"""make_corpus.py: builds the tokenizer agreement corpus (tests/text/corpus/*.txt.gz) from the
text of Debian packages, deterministically, and writes tests/text/SOURCES.

    apt-get install -y --no-install-recommends $(python3 tests/text/make_corpus.py --packages)
    python3 tests/text/make_corpus.py            # writes tests/text/corpus/ and SOURCES

Every piece is taken from files that `dpkg -L PACKAGE` lists, in sorted path order, whole lines
up to a byte budget, so the same package versions give the same bytes (SOURCES records them).
The pieces are kept byte for byte (tabs, CRLF, form feeds, escape sequences) except where SOURCES
says what was done (a man page rendered by groff, an ISO-8859-7 dictionary re-encoded as UTF-8,
a certificate's base64 joined into one line, a binary file written as hex). A piece that is not
valid UTF-8 is skipped (the agreement corpus is valid UTF-8; tests/text/bad_utf8.txt is the
invalid case). The tokenizer inputs are the corpus files' lines (see tests/text/README.md).
"""
import gettext
import gzip
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")

PACKAGES = [
    "manpages-ja", "manpages-zh", "manpages-ru", "manpages-uk", "manpages-de", "manpages-fr",
    "manpages-pl", "manpages-es", "unicode-data", "hunspell-ar", "hunspell-he", "hunspell-ko",
    "hunspell-th", "hunspell-hi", "hunspell-el", "debian-reference-ja", "debian-reference-zh-cn",
    "iso-codes", "ca-certificates", "base-files", "groff-base", "libxv1",
]

sources = []  # (corpus file, first line, last line, package, version, path, bytes, how)


def run(cmd, data=None, env=None):
    return subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          check=True, env=env).stdout


def version(pkg):
    if pkg == "(none)":
        return "-"
    return run(["dpkg-query", "-W", "-f=${Version}", pkg]).decode()


def owner(path):
    out = run(["dpkg", "-S", path]).decode().split(":")[0]
    return out


def files_of(pkg, prefix="", suffix=""):
    names = run(["dpkg", "-L", pkg]).decode().split("\n")
    return sorted(p for p in names if p.startswith(prefix) and p.endswith(suffix)
                  and os.path.isfile(p) and not os.path.islink(p))


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return data


def valid(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class Corpus:
    """One corpus file, filled piece by piece (each piece whole lines, ending in b"\\n")."""

    def __init__(self, name):
        self.name = name
        self.parts = []
        self.lines = 0
        self.size = 0

    def add(self, data, pkg, path, how="as is"):
        if not data:
            return 0
        if not data.endswith(b"\n"):
            data += b"\n"
        if not valid(data):
            print(f"skipped (not UTF-8): {path}", file=sys.stderr)
            return 0
        n = data.count(b"\n")
        sources.append((self.name, self.lines + 1, self.lines + n, pkg, version(pkg), path,
                        len(data), how))
        self.parts.append(data)
        self.lines += n
        self.size += len(data)
        return len(data)

    def add_files(self, pkg, paths, budget, how="as is", convert=None):
        """Whole files in order while they fit the budget, then the head of the next one."""
        used = 0
        for p in paths:
            data = read(p) if convert is None else convert(p)
            if not valid(data):
                print(f"skipped (not UTF-8): {p}", file=sys.stderr)
                continue
            if used + len(data) > budget:
                cut = data[: budget - used]
                cut = cut[: cut.rfind(b"\n") + 1]
                used += self.add(cut, pkg, p, how + ", first lines")
                break
            used += self.add(data, pkg, p, how)
        return used

    def write(self):
        os.makedirs(OUT, exist_ok=True)
        data = b"".join(self.parts)
        path = os.path.join(OUT, self.name + ".gz")
        # mtime 0 and no file name: the .gz bytes depend on the text only
        with open(path, "wb") as f:
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as g:
                g.write(data)
        print(f"{self.name}: {len(data)} bytes, {self.lines} lines, "
              f"{os.path.getsize(path)} compressed", file=sys.stderr)


def man_pages(pkg, lang):
    return files_of(pkg, f"/usr/share/man/{lang}/", ".gz")


def groff(path, overstrike):
    """A man page rendered as man(1) shows it: UTF-8 with bold/underline as backspace
    overstrikes (-P-c) or as ANSI escape sequences (grotty's default)."""
    args = ["groff", "-k", "-t", "-Tutf8", "-man"] + (["-P-c"] if overstrike else [])
    env = dict(os.environ, LC_ALL="C.UTF-8", GROFF_SGR="1")  # Debian's grotty: SGR only when asked
    env.pop("GROFF_NO_SGR", None)
    return run(args, read(path), env)


def corpus_man():
    c = Corpus("man-cjk.txt")
    c.add_files("manpages-ja", man_pages("manpages-ja", "ja"), 1_000_000, "roff source")
    c.add_files("manpages-zh", man_pages("manpages-zh", "zh_CN"), 500_000, "roff source")
    c.add_files("manpages-zh", man_pages("manpages-zh", "zh_TW"), 400_000, "roff source")
    c.write()
    c = Corpus("man-cyrillic.txt")
    c.add_files("manpages-ru", man_pages("manpages-ru", "ru"), 700_000, "roff source")
    c.add_files("manpages-uk", man_pages("manpages-uk", "uk"), 600_000, "roff source")
    c.write()
    c = Corpus("man-latin.txt")
    for pkg, lang in (("manpages-de", "de"), ("manpages-fr", "fr"), ("manpages-pl", "pl"),
                      ("manpages-es", "es")):
        c.add_files(pkg, man_pages(pkg, lang), 450_000, "roff source")
    c.write()
    c = Corpus("man-rendered.txt")
    # the last pages of each list, so that the text differs from the roff sources above
    for pkg, lang, over in (("manpages-de", "de", True), ("manpages-ru", "ru", False),
                            ("manpages-fr", "fr", True), ("manpages-ja", "ja", False)):
        pages = man_pages(pkg, lang)[-40:]
        how = "rendered by groff -k -t -Tutf8 -man" + (" -P-c (backspace overstrikes)"
                                                       if over else " GROFF_SGR=1 (ANSI escapes)")
        c.add_files(pkg, pages, 220_000, how, convert=lambda p, o=over: groff(p, o))
    c.write()


def corpus_docs():
    c = Corpus("debian-reference.txt")
    for pkg, lang in (("debian-reference-ja", "ja"), ("debian-reference-zh-cn", "zh-cn")):
        c.add_files(pkg, [f"/usr/share/debian-reference/debian-reference.{lang}.txt.gz"], 450_000,
                    "plain text")
        html = files_of(pkg, "/usr/share/debian-reference/", f".{lang}.html")
        c.add_files(pkg, html, 300_000, "HTML")
    c.write()


def dict_text(path):
    aff = path[:-4] + ".aff"
    enc = "utf-8"
    for line in read(aff).split(b"\n"):
        if line.startswith(b"SET"):
            enc = line.split()[1].decode()
    return read(path).decode(enc).encode("utf-8")


def corpus_dicts():
    c = Corpus("dictionaries.txt")
    for pkg, name in (("hunspell-ar", "ar"), ("hunspell-he", "he_IL"), ("hunspell-ko", "ko_KR"),
                      ("hunspell-th", "th_TH"), ("hunspell-hi", "hi_IN"), ("hunspell-el", "el_GR")):
        path = os.path.realpath(f"/usr/share/hunspell/{name}.dic")
        c.add_files(pkg, [path], 260_000, "hunspell word list (re-encoded as UTF-8 from the "
                    ".aff's SET)", convert=dict_text)
    c.write()


def corpus_isocodes():
    c = Corpus("iso-codes.txt")
    mos = [p for p in files_of("iso-codes", "/usr/share/locale/", ".mo")]
    for p in mos:
        with open(p, "rb") as f:
            cat = gettext.GNUTranslations(f)._catalog
        lines = [f"{k}\t{v}" for k, v in sorted(cat.items()) if k and isinstance(k, str)]
        data = ("\n".join(lines) + "\n").encode("utf-8")
        data = data[:2600]
        data = data[: data.rfind(b"\n") + 1]
        c.add(data, "iso-codes", p, "msgid TAB msgstr of the .mo, sorted, first lines")
    c.write()


def unicode_ranges():
    """Every code point UnicodeData.txt lists (its First/Last ranges expanded)."""
    cps, first = [], None
    for line in read("/usr/share/unicode/UnicodeData.txt").decode().split("\n"):
        if not line:
            continue
        f = line.split(";")
        cp = int(f[0], 16)
        if f[1].endswith(", First>"):
            first = cp
        elif f[1].endswith(", Last>"):
            step = 1 if first < 0xF0000 else 251  # the Private Use planes: a sample
            cps.extend(range(first, cp + 1, step))
        else:
            cps.append(cp)
    return cps


def corpus_unicode():
    c = Corpus("unicode.txt")
    c.add(read("/usr/share/unicode/emoji/emoji-test.txt"), "unicode-data",
          "/usr/share/unicode/emoji/emoji-test.txt")
    c.add(read("/usr/share/unicode/emoji/emoji-zwj-sequences.txt"), "unicode-data",
          "/usr/share/unicode/emoji/emoji-zwj-sequences.txt")
    names = read("/usr/share/unicode/NamesList.txt")
    names = names[:150_000]
    c.add(names[: names.rfind(b"\n") + 1], "unicode-data", "/usr/share/unicode/NamesList.txt",
          "first lines")
    cps = [cp for cp in unicode_ranges() if cp not in (0x0A, 0x0D) and not 0xD800 <= cp < 0xE000]
    assigned = set(cps)
    glued = []  # 24 code points a line, glued together
    for i in range(0, len(cps), 24):
        glued.append("".join(chr(cp) for cp in cps[i:i + 24]))
    c.add(("\n".join(glued) + "\n").encode(), "unicode-data", "/usr/share/unicode/UnicodeData.txt",
          "every listed code point (but LF, CR, surrogates; Private Use planes sampled) as text, "
          "24 a line")
    spaced = []  # the same outside the big ideograph/syllable blocks, space-separated, 16 a line
    small = [cp for cp in cps if not (0x3400 <= cp < 0xA000 or 0xAC00 <= cp < 0xD7A4
                                      or 0x17000 <= cp < 0x18D00 or 0x20000 <= cp < 0x32000
                                      or cp >= 0xF0000)]
    for i in range(0, len(small), 16):
        spaced.append(" ".join(chr(cp) for cp in small[i:i + 16]))
    c.add(("\n".join(spaced) + "\n").encode(), "unicode-data", "/usr/share/unicode/UnicodeData.txt",
          "the code points outside the ideograph/Hangul/Tangut blocks, space-separated, 16 a line")
    # code points UnicodeData.txt does not list (unassigned), every 97th, planes 0-3 and 14
    un = [cp for cp in range(0, 0x40000) if cp not in assigned and not 0xD800 <= cp < 0xE000
          and cp not in (0x0A, 0x0D)]
    un += [cp for cp in range(0xE0000, 0xF0000) if cp not in assigned]
    un = un[::97]
    lines = [" ".join(chr(cp) for cp in un[i:i + 8]) + " x" + "".join(chr(cp) for cp in un[i:i + 8])
             for i in range(0, len(un), 8)]
    c.add(("\n".join(lines) + "\n").encode(), "unicode-data", "/usr/share/unicode/UnicodeData.txt",
          "code points it does not list, every 97th, spaced and glued to 'x'")
    c.write()


def corpus_long():
    c = Corpus("long-words.txt")
    certs = files_of("ca-certificates", "/usr/share/ca-certificates/mozilla/", ".crt")
    out = []
    for p in certs:
        text = read(p).decode()
        body = "".join(l.strip() for l in text.split("\n") if l and not l.startswith("-----"))
        out.append(os.path.basename(p) + " " + body)
    c.add(("\n".join(out) + "\n").encode(), "ca-certificates",
          "/usr/share/ca-certificates/mozilla/*.crt",
          "each certificate: file name, space, its base64 joined into one line")
    mo = "/usr/share/locale/de/LC_MESSAGES/iso_3166-1.mo"
    raw = read(mo)[:60_000]
    hexl = [raw[i:i + 50].hex() + " " + raw[i + 50:i + 100].hex().upper()
            for i in range(0, len(raw), 100)]
    c.add(("\n".join(hexl) + "\n").encode(), "iso-codes", mo,
          "bytes as hex, 100 a line: 100 lowercase hex digits, space, 100 uppercase")
    c.add(read("/usr/share/doc/libxv1/copyright"), "libxv1", "/usr/share/doc/libxv1/copyright",
          "as is (CRLF line ends)")
    for lic in ("GPL-1", "LGPL-2", "LGPL-2.1"):
        c.add(read(f"/usr/share/common-licenses/{lic}"), "base-files",
              f"/usr/share/common-licenses/{lic}", "as is (form feeds)")
    for pkg in PACKAGES:
        for p in files_of(pkg, "/usr/share/doc/", "copyright"):
            lines = [l for l in read(p).split(b"\n") if b"http" in l]
            if lines:
                c.add(b"\n".join(lines) + b"\n", pkg, p, "the lines with 'http' in them")
    c.write()


# The hand-written hostile lines (corpus/hostile.txt.gz): each is one input.
HOSTILE = [
    "",
    " ",
    "\t\t  \u3000 \u00a0",
    "plain ascii words, with punctuation!? (and) [brackets] {braces} <angles> 'quotes' \"dq\"",
    "e\u0301 vs \u00e9: combining acute, a\u0300\u0301\u0302\u0303\u0304 stacked, \u0301 alone, x\u20dd",
    "Cafe\u0301 CAF\u00c9 na\u00efve \u00c5ngstr\u00f6m \u212b (angstrom sign) \u2126 (ohm) \ufb01 (fi ligature) \u00df STRASSE",
    "\u0130stanbul \u0131 I\u0307 \u0130\u0130\u0130 dotted capital I, dotless i",
    "\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 \u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03cd\u03c2 final sigma \u03c2 \u03a3 \u1f00\u1f10\u1fb3 \u0390",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \u1112\u1161\u11ab (conjoining jamo) \u3131\u314f (compat jamo) \ud7a3",
    "\u4e2d\u6587\u5b57\u7b26abc\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\uff08\u5168\u89d2\uff09\uff21\uff22\uff23\uff11\uff12\uff13",
    "CJK ext: \U00020000\U0002a6df\U0002a700\U0002b740\U0002b820\U0002ceaf\U0002ceb0 \U00030000 \uf900\ufaff\U0002f800 \u2e80 \u3400\u4dbf\u4dc0 \u9fff\ua000",
    "nbsp:\u00a0| narrow:\u202f| figure:\u2007| thin:\u2009| ideographic:\u3000| ogham:\u1680| line sep:\u2028| para sep:\u2029|",
    "zero width: a\u200bb a\u200cb a\u200db a\u2060b a\ufeffb soft\u00adhyphen",
    "\ufeffBOM at the start of a line",
    "rtl: \u202eabc\u202c \u200f\u05e9\u05dc\u05d5\u05dd\u200e \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u061c \u2066isolate\u2069",
    "private use: \ue000\uf8ff \U000f0000 \U0010fffd x\ue000y",
    "unassigned: \u0378 \u0530 \U0001fffe \U000e0000 \uffff \ufffe \ufffd (replacement char)",
    "noncharacters \ufdd0\ufdef and tags \U000e0041\U000e007f and variation selectors \u2764\ufe0f \u2764\ufe0e \U000e0100",
    "specials: [CLS] [SEP] [MASK] [UNK] [PAD] [cls] [mask] [MASK][MASK]x[MASK] ##ing ## #",
    "[CLS]glued[SEP] a[MASK]b [ MASK ] [MASK ] [[MASK]] \uff3bMASK\uff3d",
    "emoji: \U0001f600 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f1e9\U0001f1ea \U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f #\ufe0f\u20e3",
    "controls: a\x00b a\x01b a\x07b a\x08b a\x0bb a\x0cb a\x1bb a\x1fb a\x7fb a\x80b a\x85b a\x9fb",
    "escape seqs: \x1b[1mbold\x1b[0m \x1b[4;31munder\x1b[m b\x08bo\x08ol\x08ld _\x08u_\x08n",
    "tabs:\tone\t\ttwo\t",
    "crlf line\r",
    "two cr, one stays\r\r",
    "\r",
    "cr inside: a\rb \r c",
    "x" * 99,
    "y" * 100,
    "z" * 101,
    "\u00e9" * 100 + " " + "\u00e9" * 101 + " " + "\u4e00" * 150,
    "a" * 99 + "\u0301",
    "e\u0301" * 60 + " (120 chars before strip, 60 after)",
    "w" * 100 + "." + "w" * 101 + ".w",
    "https://example.org/" + "path/" * 30 + "?q=" + "0123456789abcdef" * 8,
    "digits 0123456789 \u0660\u0661\u0662 \u0966\u0967 \uff10\uff11 \u00b2\u00b3\u00bd \u2160\u2161 \u2460",
    "punct: \u2014\u2013\u2026\u00bf\u00a1\u00ab\u00bb\u201c\u201d\u2018\u2019\u3001\u3002\u30fb\uff01\uff1f \u00a7\u00b6\u2020 $\u20ac\u00a3\u00a5 ^`~|\\ @#%&*_+=",
    "symbols: \u00b0 \u00b1 \u00d7 \u00f7 \u2200 \u2211 \u221e \u2192 \u21d2 \u2605 \u266b \u00a9 \u00ae \u2122 \u2103 \u33a1",
    "thai \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 devanagari \u0939\u093f\u0928\u094d\u0926\u0940 \u0915\u094d\u200d\u0937 bengali \u09ac\u09be\u0982\u09b2\u09be tamil \u0ba4\u0bae\u0bbf\u0bb4\u0bcd",
    "vietnamese Ti\u1ebfng Vi\u1ec7t \u0110\u00e2y l\u00e0 m\u1ed9t c\u00e2u; decomposed Tie\u0302\u0301ng Vie\u0323\u0302t",
    "compatibility: \u2460 \u2474 \u2488 \u24b6 \u3392 \u337f \ufe35 \uff76 \uff9e \u1d400 \U0001d400\U0001d41a \U0001d7d8",
    "mixed\u00a0nbsp\u00a0joined and\u3000ideographic\u3000space and\u0085nel",
    "  leading and trailing spaces  ",
    "a.b,c;d:e!f?g-h_i/j\\k'l\"m(n)o[p]q{r}s<t>u@v#w$x%y^z&*",
    "\U0010ffff \U0010fffe \U000fffff last planes",
    "\u0345\u0399\u03b9 ypogegrammeni; \u1e9e capital sharp s; \u0149 \u01f0 \u1e96 special casings; \u0587",
    "\u00c6\u00e6\u0152\u0153\u00d8\u00f8\u0141\u0142\u0110\u0111\u00de\u00fe\u00d0\u00f0 (no decomposition)",
    "added tokens (wp-added-tokens.json): see [URL] and [url] DMOVE dmoves xdmove Dmove[URL]dmove",
    "\u00dcn\u00ef \u00fcn\u00ef UNI U\u0308n\u00ef New York new  york NEW YORK newyork new york",
    "\u0130" * 50 + " " + "\u0130" * 51 + " (lowercased: 100 and 102 characters)",
    "\ud55c" * 33 + " " + "\ud55c" * 34 + " " + "\uac00" * 50 + " " + "\uac00" * 51 + " (NFD: 99, 102, 100, 102 jamo)",
    "\u0130dmove DMOVE\u0301 dmov\u00e9 d\u0301move \u4e2ddmove\u6587 \u4e2d[MASK]\u6587 [URL]\u4e2d \uff24\uff2d\uff2f\uff36\uff25",
    "a\u0308\u0323 \u1ec7 e\u0323\u0302 e\u0302\u0323 (canonical order) \u0e33 \u0f73 \u0344 (decompose to 2)",
]


def corpus_hostile():
    c = Corpus("hostile.txt")
    data = ("\n".join(HOSTILE) + "\n").encode("utf-8")
    c.add(data, "(none)", "tests/text/make_corpus.py HOSTILE", "hand-written")
    c.write()


def main():
    if "--packages" in sys.argv:
        print(" ".join(PACKAGES))
        return
    corpus_man()
    corpus_docs()
    corpus_dicts()
    corpus_isocodes()
    corpus_unicode()
    corpus_long()
    corpus_hostile()
    with open(os.path.join(HERE, "SOURCES"), "w") as f:
        f.write("# corpus file\tlines\tpackage\tversion\tpath\tbytes\twhat was taken\n")
        for name, a, b, pkg, ver, path, n, how in sources:
            f.write(f"{name}\t{a}-{b}\t{pkg}\t{ver}\t{path}\t{n}\t{how}\n")
        total = sum(s[6] for s in sources)
        f.write(f"# total\t{total} bytes\n")
    print(f"total {sum(s[6] for s in sources)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
