#!/usr/bin/env python3
"""bench/peers/embed_peers.py: sentence embeddings of a file of lines, `dmove embed` against
sentence-transformers (SentenceTransformer.encode: lines sorted by length, batches of 32,
padded to the batch's longest, mean pooling, normalized) and transformers' AutoModel with
the same pooling done by hand, on the CPU, in one interleaved run: each round runs every
variant once over the whole file, in a rotated order; medians of the rounds printed.

What is timed. dmove: the whole `dmove embed` command (process start, reading the model and
tokenizer, tokenizing, the runs, writing an .npy), as a user runs it. The Python peers: the
encode call alone (tokenizing and the runs; the model loaded and one warm-up batch run
before, never timed), so the table favours them by dmove's start (printed: the same command
on one line). Threads: every variant uses --threads (default: all cores).

Agreement: the embeddings of every variant are compared with sentence-transformers' (the
largest difference of a component, and the smallest cosine), so a fast wrong answer shows.

Models: --model DIR (a sentence-transformers or plain BERT directory: config.json,
model.safetensors, tokenizer.json), or --base, a BERT-base-shaped model (768/12/3072, 12
layers) with random weights written to a temporary directory with the MiniLM's tokenizer
(the same 30522-word uncased vocabulary): speed only, its agreement is still checked.

    PY=bench/.venv-peers/bin/python
    $PY bench/peers/embed_peers.py --dmove build-cpu/dmove --model DIR --rounds 3
    $PY bench/peers/embed_peers.py --dmove build-cpu/dmove --model DIR --base --rounds 3

The default text: the first --lines lines (4000) of more than 20 characters of
tests/text/corpus/debian-reference.txt.gz (Debian's reference manual; real English prose,
commands and tables); --text FILE takes any file, one input a line.
"""
import argparse
import gzip
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_lines(a):
    if a.text:
        with open(a.text, encoding="utf-8") as f:
            lines = [l.rstrip("\n") for l in f]
    else:
        path = os.path.join(ROOT, "tests/text/corpus/debian-reference.txt.gz")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [l.rstrip("\n") for l in f if len(l.rstrip("\n")) > 20]
    return lines[: a.lines] if a.lines else lines


def make_base(src, dst):
    """A BERT-base-shaped BertModel with random weights in dst, with src's tokenizer."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=512)
    BertModel(cfg).eval().save_pretrained(dst, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)


def st_model(mdir, max_len):
    from sentence_transformers import SentenceTransformer

    m = SentenceTransformer(mdir, device="cpu")
    m.max_seq_length = max_len
    return m


def run_st(m, lines, batch):
    t = time.perf_counter()
    e = m.encode(lines, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True,
                 show_progress_bar=False)
    return time.perf_counter() - t, e


def run_hf(tok, model, lines, batch, max_len):
    t = time.perf_counter()
    order = sorted(range(len(lines)), key=lambda k: -len(lines[k]))
    out = np.empty((len(lines), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for i in range(0, len(lines), batch):
            idx = order[i:i + batch]
            enc = tok([lines[k] for k in idx], padding=True, truncation=True, max_length=max_len,
                      return_tensors="pt")
            h = model(**enc).last_hidden_state
            msk = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
            e = torch.nn.functional.normalize((h * msk).sum(1) / msk.sum(1), dim=1)
            out[idx] = e.numpy()
    return time.perf_counter() - t, out


def run_dmove(a, mdir, path, out, extra, binary=None):
    cmd = [binary or a.dmove, "embed", "--quiet", "--model", mdir, "--max-length", str(a.max_length), "--pooling", "mean",
           "--normalize", "--threads", str(a.threads), "--format", "npy", "--out", out] + extra + [path]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"embed_peers: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return dt, np.load(out)


def peak_rss_kb(cmd):
    r = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    try:
        return int(r.stderr.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dmove", default=os.path.join(ROOT, "build-cpu/dmove"))
    ap.add_argument("--model", required=True, help="a BERT directory (sentence-transformers or plain)")
    ap.add_argument("--base", action="store_true", help="BERT-base-shaped random weights, --model's tokenizer")
    ap.add_argument("--text", help="one input a line (default: the Debian reference manual's lines)")
    ap.add_argument("--lines", type=int, default=4000, help="the first N lines (0: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="the Python peers' batch (dmove: its own default)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--dmove-args", default="", help="more options for dmove embed (a variant 'dmove+ARGS')")
    ap.add_argument("--other-dmove", help="another dmove binary, timed beside (a variant 'dmove (other)'): "
                    "an A/B of two builds in one run")
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args()
    threads = a.threads or os.cpu_count()
    a.threads = threads
    torch.set_num_threads(threads)
    tmp = tempfile.mkdtemp(prefix="embed_peers.")
    try:
        lines = read_lines(a)
        text = os.path.join(tmp, "lines.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        mdir = a.model
        if a.base:
            mdir = os.path.join(tmp, "base")
            make_base(a.model, mdir)
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(mdir)
        hf = AutoModel.from_pretrained(mdir).eval()
        st = st_model(mdir, a.max_length)
        ntok = sum(min(len(tok(l)["input_ids"]), a.max_length) for l in lines)
        run_st(st, lines[:32], a.batch)  # warm-up: one batch each
        run_hf(tok, hf, lines[:32], a.batch, a.max_length)
        one = os.path.join(tmp, "one.txt")
        with open(one, "w", encoding="utf-8") as f:
            f.write(lines[0] + "\n")
        variants = ["dmove", "sentence-transformers", "transformers"]
        extra = a.dmove_args.split() if a.dmove_args else []
        if extra:
            variants.insert(1, "dmove+" + " ".join(extra))
        if a.other_dmove:
            variants.insert(1, "dmove (other)")
        times = {v: [] for v in variants}
        embs = {}
        start = []
        for r in range(a.rounds):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for v in order:
                if v == "dmove (other)":
                    dt, e = run_dmove(a, mdir, text, os.path.join(tmp, "e.npy"), [], a.other_dmove)
                elif v.startswith("dmove"):
                    dt, e = run_dmove(a, mdir, text, os.path.join(tmp, "e.npy"), extra if v != "dmove" else [])
                elif v == "sentence-transformers":
                    dt, e = run_st(st, lines, a.batch)
                else:
                    dt, e = run_hf(tok, hf, lines, a.batch, a.max_length)
                times[v].append(dt)
                embs[v] = e
                print(f"round {r + 1}: {v:<24} {dt:7.2f} s", file=sys.stderr)
            start.append(run_dmove(a, mdir, one, os.path.join(tmp, "e1.npy"), [])[0])
        dm_cmd = [a.dmove, "embed", "--quiet", "--model", mdir, "--max-length", str(a.max_length), "--pooling",
                  "mean", "--normalize", "--threads", str(threads), "--format", "npy", "--out",
                  os.path.join(tmp, "e.npy"), text]
        rss = peak_rss_kb(dm_cmd)
        ref = embs["sentence-transformers"]
        cfg = hf.config
        rep = []
        rep.append(f"# embed peers: sentence embeddings of {len(lines)} lines ({ntok} tokens, "
                   f"{ntok / len(lines):.1f} a line, at most {a.max_length}), mean pooling, normalized, CPU")
        rep.append(f"date:     {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        cpu = platform.processor() or ""
        try:
            with open("/proc/cpuinfo") as f:
                info = f.read()
            cpu = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), cpu)
            isa = " ".join(x for x in ("avx2", "avx512f", "amx_tile") if f" {x}" in info)
        except OSError:
            isa = "?"
        rep.append(f"machine:  {cpu} ({os.cpu_count()} CPUs; {isa}); {threads} threads each")
        try:
            rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip()
        except OSError:
            rev = "?"
        import sentence_transformers
        import transformers

        other = f" (other: {a.other_dmove})" if a.other_dmove else ""
        rep.append(f"commit:   {rev}; dmove {a.dmove}{other}; torch {torch.__version__}, transformers "
                   f"{transformers.__version__}, sentence-transformers {sentence_transformers.__version__}")
        rep.append(f"model:    {'BERT-base-shaped, random weights' if a.base else a.model}: hidden "
                   f"{cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads, ffn "
                   f"{cfg.intermediate_size}")
        rep.append(f"text:     {a.text or 'tests/text/corpus/debian-reference.txt.gz (lines over 20 characters)'}; "
                   f"{a.rounds} rounds, order rotated; Python peers batch {a.batch}")
        rep.append("")
        rep.append(f"{'variant':<28}{'s (median)':>11}{'lines/s':>10}{'tokens/s':>10}{'vs st':>8}"
                   f"{'max |diff|':>12}{'min cos':>10}   runs (s)")
        st_med = statistics.median(times["sentence-transformers"])
        for v in variants:
            med = statistics.median(times[v])
            e = embs[v]
            diff = float(np.abs(e - ref).max())
            cos = float(np.min(np.sum(e * ref, axis=1) /
                               (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))))
            rep.append(f"{v:<28}{med:>11.2f}{len(lines) / med:>10.0f}{ntok / med:>10.0f}{st_med / med:>7.2f}x"
                       f"{diff:>12.2e}{cos:>10.7f}   " + " ".join(f"{x:.2f}" for x in times[v]))
        rep.append("")
        rep.append(f"dmove: the whole command (start, model and tokenizer read, output written); the same "
                   f"command on one line: {statistics.median(start):.2f} s (median); peak memory "
                   f"{rss / 1024:.0f} MB" if rss else "dmove: the whole command")
        rep.append("sentence-transformers, transformers: the encode alone (model loaded and warmed before)")
        text_out = "\n".join(rep)
        print(text_out)
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                f.write(text_out + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
