#!/usr/bin/env python3
"""tokenize_speed.py: tokenizer throughput, dmove against Hugging Face `tokenizers` (the Rust
library behind BertTokenizerFast), on the same text, same machine, one run. Prints MB/s
(MB = 10^6 bytes of input text, line ends included), the median of --reps repetitions, for:

  dmove 1 thread      dmove tokenize --tokenizer FILE --digest --threads 1 TEXT > /dev/null
  dmove N threads     the same with --threads N (default: all cores)
  tokenizers 1 thread Tokenizer.from_file(FILE).encode_batch(lines, add_special_tokens=True),
                      RAYON_NUM_THREADS=1, in batches of --batch lines
  tokenizers N threads the same with RAYON_NUM_THREADS=N

MB/CPU-s (MB per CPU second, user + system, all threads) is printed beside: on a busy machine
it says more about the work per byte than the wall-clock MB/s. dmove's time is the whole process (start, loading the tokenizer, reading the file, encoding,
writing one digest line per input); tokenizers' time is encode_batch alone (the lines already
in memory, the tokenizer loaded), so the comparison leans toward tokenizers. Inputs are lines
(a line's "\\n" and a "\\r" before it are not part of the input), as for `dmove tokenize`.

usage: bench/tokenize_speed.sh [--dmove build/dmove] [--tokenizer FILE] [--lowercase|--cased]
                               [--reps 3] [--threads N] [--batch 8192] [TEXT...]
  TEXT: text files (.gz decompressed first); default: tests/text/corpus/*.txt.gz, the
        agreement corpus (12 MB of Debian text in many languages)
  --tokenizer: default tests/text/tok/bert-base-uncased.json
examples:
  bench/tokenize_speed.sh
  bench/tokenize_speed.sh --tokenizer tests/text/tok/wp-cased.json --reps 5 big.txt
"""
import argparse
import glob
import gzip
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_line():
    model, flags = "?", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = line
    except OSError:
        pass
    avx = "AVX-512" if "avx512f" in flags else ("AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    return f"{model}, {os.cpu_count()} logical cores, {avx}"


def worker(args):
    """Runs in a child whose RAYON_NUM_THREADS is set: times encode_batch, prints seconds."""
    from tokenizers import Tokenizer, normalizers
    if args.tokenizer.endswith(".json"):
        tok = Tokenizer.from_file(args.tokenizer)
    else:  # a vocab.txt, as BertTokenizerFast(vocab=..., do_lower_case=...) builds it
        from tokenizers import decoders, models, pre_tokenizers, processors
        tok = Tokenizer(models.WordPiece.from_file(args.tokenizer, unk_token="[UNK]"))
        vocab = tok.get_vocab()
        tok.normalizer = normalizers.BertNormalizer(lowercase=not args.cased)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", special_tokens=[("[CLS]", vocab["[CLS]"]),
                                                           ("[SEP]", vocab["[SEP]"])])
        tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.no_truncation()
    tok.no_padding()
    with open(args.worker, "rb") as f:
        data = f.read()
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    lines = [p[:-1].decode() if p.endswith(b"\r") else p.decode() for p in pieces]
    tok.encode_batch(lines[:1000])  # warm the thread pool
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for i in range(0, len(lines), args.batch):
        n += sum(len(e.ids) for e in tok.encode_batch(lines[i:i + args.batch],
                                                       add_special_tokens=True))
    print(time.perf_counter() - t0, time.process_time() - c0, n)


def run_tokenizers(args, text, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", text, "--tokenizer",
           args.tokenizer, "--batch", str(args.batch)] + (["--cased"] if args.cased else [])
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE).stdout.split()
    return float(out[0]), float(out[1])


def run_dmove(args, text, threads):
    cmd = [args.dmove, "tokenize", "--tokenizer", args.tokenizer, "--digest", "--threads",
           str(threads), text]
    if args.lowercase:
        cmd.append("--lowercase")
    if args.cased:
        cmd.append("--cased")
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.devnull, "wb") as null:
        subprocess.run(cmd, check=True, stdout=null)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.perf_counter() - t0,
            r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)


def gather(paths, out):
    size = 0
    with open(out, "wb") as o:
        for p in paths:
            data = gzip.open(p).read() if p.endswith(".gz") else open(p, "rb").read()
            if data and not data.endswith(b"\n"):
                data += b"\n"
            o.write(data)
            size += len(data)
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage=argparse.SUPPRESS)
    ap.add_argument("text", nargs="*")
    ap.add_argument("--dmove", default=os.path.join(ROOT, "build", "dmove"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "tests/text/tok/bert-base-uncased.json"))
    ap.add_argument("--lowercase", action="store_true", help="vocab.txt: do_lower_case=True")
    ap.add_argument("--cased", action="store_true", help="vocab.txt: do_lower_case=False")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not os.access(args.dmove, os.X_OK):
        sys.exit(f"tokenize_speed: {args.dmove} is not an executable (build it: make, or give --dmove)")
    paths = args.text or sorted(p for p in glob.glob(os.path.join(ROOT, "tests/text/corpus/*.txt.gz"))
                                if not p.endswith("hostile.txt.gz"))
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        size = gather(paths, text)
        mb = size / 1e6
        print(f"CPU: {cpu_line()}")
        print(f"text: {mb:.2f} MB, {sum(1 for _ in open(text, 'rb'))} lines, from {len(paths)} file(s)")
        print(f"tokenizer: {os.path.relpath(args.tokenizer)}; median of {args.reps} runs each")
        rows = []
        for label, fn, th in (("dmove", run_dmove, 1), ("dmove", run_dmove, args.threads),
                              ("tokenizers", run_tokenizers, 1),
                              ("tokenizers", run_tokenizers, args.threads)):
            runs = [fn(args, text, th) for _ in range(args.reps)]
            times = [r[0] for r in runs]
            med = statistics.median(times)
            cpu = statistics.median(r[1] for r in runs)
            rows.append((label, th, mb / med))
            print(f"  {label:<11} {th:>3} thread{'s' if th > 1 else ' '}  {mb / med:8.2f} MB/s"
                  f"  {mb / cpu:8.2f} MB/CPU-s  (wall {', '.join(f'{t:.3f}' for t in times)} s;"
                  f" CPU {cpu:.3f} s)", flush=True)
        d1, dn, t1, tn = (r[2] for r in rows)
        print(f"dmove / tokenizers: {d1 / t1:.2f}x at 1 thread, {dn / tn:.2f}x at {args.threads} threads;"
              f" dmove scales {dn / d1:.2f}x from 1 to {args.threads} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
