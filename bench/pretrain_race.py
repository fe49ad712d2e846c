#!/usr/bin/env python3
"""bench/pretrain_race.py: one system of bench/pretrain_race.sh's race (pretraining the same
small BERT from scratch for a fixed wall time), or the chart of a finished race.

  pretrain_race.py run --system S --minutes M --out FILE.json [the shared options]
  pretrain_race.py chart --out DIR FILE.json ...

Systems: dmove (`dmove pretrain`, its progress lines read as they come, each line's time
taken on arrival); torch-eager, torch-compile (transformers' BertForMaskedLM with labels,
as a user runs it: the head at every position); torch-eager-gather, torch-compile-gather
(the encoder's output gathered at the scored positions before the head, as dmove does).

The clock: training time only, from the first step (for torch.compile: its compilation
included) to the wall time; the held-out evaluations (every K steps, the same E held-out
batches for all: dmove's valid loader, no dropout) are taken out of it for every system.
The torch systems read the very batches dmove trains on (bench/dump_batches, dmove's
loader with pretrain's settings), keep the first M chosen positions of a batch as dmove's
trainer does, and use the same optimizer (AdamW, lr, warm-up then constant, betas
0.9/0.999, eps 1e-6, weight decay 0.01 on weights, clipping at 1), dropout 0.1 and seed
(the initial weights are each system's own draw: both N(0, 0.02), zero biases).
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "peers"))


def shared(ap):
    for name, d in (("layers", 4), ("hidden", 256), ("heads", 4), ("ffn", 1024), ("batch", 16), ("seq", 128),
                    ("eval_every", 50), ("eval_batches", 8), ("warmup", 100), ("threads", 2), ("seed", 0),
                    ("vocab", 30522)):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=d)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--dmove", default="dmove")
    ap.add_argument("--dumper", default="dump_batches")


def run_dmove(a):
    """dmove pretrain, SIGINT at the wall time; the held-out points timed on arrival."""
    cmd = [a.dmove, "pretrain", "--data", a.data, "--tokenizer", a.tokenizer, "--layers", str(a.layers),
           "--hidden", str(a.hidden), "--heads", str(a.heads), "--ffn", str(a.ffn), "--batch", str(a.batch),
           "--seq", str(a.seq), "--steps", "100000000", "--lr", str(a.lr), "--warmup", str(a.warmup),
           "--lr-schedule", "constant", "--eval-every", str(a.eval_every), "--eval-batches", str(a.eval_batches),
           "--log-every", "1", "--threads", str(a.threads), "--seed", str(a.seed), "--dropout", str(a.dropout)]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    points, train, evals, t_step, step, stopped = [], [], 0.0, t0, 0, False
    for line in p.stdout:
        t = time.perf_counter()
        w = line.split()
        if line.startswith("step "):
            step = int(w[1].split("/")[0])
            t_step = t
            train.append((round(t - t0 - evals, 3), step, float(w[3])))
        elif line.startswith("  held-out at step"):
            evals += t - t_step  # the evaluation ran between the step's line and this one
            points.append({"t": round(t_step - t0 - (evals - (t - t_step)), 3), "step": step,
                           "loss": float(w[5].rstrip(",")), "accuracy": float(w[8])})
            print(f"dmove: step {step}, {points[-1]['t']:.0f} s: held-out loss {points[-1]['loss']:.4f}, "
                  f"accuracy {points[-1]['accuracy']:.3f}", file=sys.stderr, flush=True)
        if not stopped and t - t0 - evals >= a.minutes * 60:
            p.send_signal(signal.SIGINT)  # the step under way ends, then dmove exits
            stopped = True
    p.wait()
    return points, train, " ".join(cmd)


class Batches:
    """dmove's batches, dumped in chunks by bench/dump_batches as they are needed."""

    def __init__(self, a, split, predictions, chunk):
        from bert_mlm_step import read_batches
        self.a, self.split, self.m, self.chunk, self.read, self.have = a, split, predictions, chunk, read_batches, {}
        self.tmp = a.out + f".{split}.bin"

    def get(self, k):
        c = k // self.chunk
        if c not in self.have:
            self.have = {}
            subprocess.run([self.a.dumper, self.a.data, self.a.tokenizer, self.split, str(self.a.seed), str(self.a.batch),
                            str(self.a.seq), str(c * self.chunk), str(self.chunk), self.tmp], check=True)
            self.have[c] = self.read(self.tmp, self.m)
            os.remove(self.tmp)
        return self.have[c][k % self.chunk]


def run_torch(a):
    import torch
    import torch.nn.functional as F
    from bert_mlm_step import loss_fn, make_model, make_optimizer
    torch.set_num_threads(a.threads)
    mode, head = a.system[len("torch-"):].split("-")[0], "gather" if a.system.endswith("-gather") else "full"
    m = a.batch * ((a.seq + 4) // 5)  # dmove's default: ceil(j / 5) a sequence
    train_b, valid_b = Batches(a, "train", m, 200), Batches(a, "valid", m, a.eval_batches)
    model = make_model(a)
    opt = make_optimizer(model, True, a.lr)  # fused AdamW: the faster on this CPU (bench/results/bert-peers-*)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup) if a.warmup else 1.0)
    fn = loss_fn(model, head, mode == "compile")
    from bert_mlm_step import step as one_step

    def evaluate():
        model.eval()
        tot, n, right = 0.0, 0, 0
        with torch.no_grad():
            for k in range(a.eval_batches):
                bt = valid_b.get(k)
                h = model.bert(input_ids=bt["input_ids"], token_type_ids=bt["token_type_ids"],
                               attention_mask=bt["attention_mask"]).last_hidden_state
                s = bt["scored"]
                logits = model.cls(h.reshape(-1, h.shape[-1]).index_select(0, bt["pos"][:s]))
                tot += float(F.cross_entropy(logits, bt["target"][:s], reduction="sum"))
                right += int((logits.argmax(-1) == bt["target"][:s]).sum())
                n += s
        model.train()
        return tot / max(n, 1), right / max(n, 1)

    points, train, clock, step = [], [], 0.0, 0
    while clock < a.minutes * 60:
        bt = train_b.get(step)  # the dump of a chunk is data time, as dmove's loader's is
        t = time.perf_counter()
        loss = one_step(model, opt, fn, bt)
        sched.step()
        lv = float(loss.detach())
        clock += time.perf_counter() - t
        step += 1
        train.append((round(clock, 3), step, lv))
        if not math.isfinite(lv):
            print(f"{a.system}: loss {lv} at step {step}", file=sys.stderr)
        if step % a.eval_every == 0:
            l, acc = evaluate()
            points.append({"t": round(clock, 3), "step": step, "loss": round(l, 6), "accuracy": round(acc, 6)})
            print(f"{a.system}: step {step}, {clock:.0f} s: held-out loss {l:.4f}, accuracy {acc:.3f}",
                  file=sys.stderr, flush=True)
    return points, train, f"bench/pretrain_race.py run --system {a.system} (torch {torch.__version__}, AdamW fused)"


def svg(series, path, minutes, title):
    """Held-out loss against training time, one line per system."""
    W, H, L, R, T, B = 760, 440, 70, 190, 40, 50
    pts = [p for s in series.values() for p in s]
    if not pts:
        return
    ymin, ymax = min(p["loss"] for p in pts), max(p["loss"] for p in pts)
    ymin, ymax = math.floor(ymin * 2) / 2, max(math.ceil(ymax * 2) / 2, math.floor(ymin * 2) / 2 + 0.5)
    xmax = max(minutes * 60, max(p["t"] for p in pts))
    X = lambda t: L + (W - L - R) * t / xmax  # noqa: E731
    Y = lambda v: T + (H - T - B) * (ymax - v) / max(ymax - ymin, 1e-9)  # noqa: E731
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2 - 60}" y="20" text-anchor="middle" font-size="14">{title}</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    nt = 10
    for k in range(nt + 1):
        t = xmax * k / nt
        o.append(f'<line x1="{X(t):.1f}" y1="{H - B}" x2="{X(t):.1f}" y2="{H - B + 4}" stroke="black"/>'
                 f'<text x="{X(t):.1f}" y="{H - B + 18}" text-anchor="middle">{t / 60:.1f}</text>')
    ny = int(round((ymax - ymin) / 0.5))
    for k in range(ny + 1):
        v = ymin + 0.5 * k
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>'
                 f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">training time (minutes; evaluations not counted)</text>')
    o.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" text-anchor="middle">held-out MLM loss</text>')
    for i, (name, s) in enumerate(series.items()):
        c = colors[i % len(colors)]
        if s:
            path_d = " ".join(f"{'M' if k == 0 else 'L'}{X(p['t']):.1f},{Y(p['loss']):.1f}" for k, p in enumerate(s))
            o.append(f'<path d="{path_d}" fill="none" stroke="{c}" stroke-width="2"/>')
            o.extend(f'<circle cx="{X(p["t"]):.1f}" cy="{Y(p["loss"]):.1f}" r="2.5" fill="{c}"/>' for p in s)
            last = s[-1]
            label = f"{name}: {last['loss']:.3f}, acc {last['accuracy']:.3f}"
        else:
            label = f"{name}: no evaluation"
        o.append(f'<line x1="{W - R + 10}" y1="{T + 20 * i + 10}" x2="{W - R + 30}" y2="{T + 20 * i + 10}" stroke="{c}" stroke-width="2"/>'
                 f'<text x="{W - R + 34}" y="{T + 20 * i + 14}" font-size="10">{label}</text>')
    o.append("</svg>")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(o) + "\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    shared(r)
    r.add_argument("--system", required=True, choices=("dmove", "torch-eager", "torch-compile", "torch-eager-gather",
                                                       "torch-compile-gather"))
    r.add_argument("--minutes", type=float, default=20)
    r.add_argument("--out", required=True)
    c = sub.add_parser("chart")
    c.add_argument("--out", required=True)
    c.add_argument("--title", default="")
    c.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.cmd == "chart":
        runs = [json.load(open(f)) for f in a.files]
        series = {x["system"]: x["eval"] for x in runs}
        with open(os.path.join(a.out, "curves.csv"), "w") as f:
            f.write("system,train_seconds,step,heldout_loss,heldout_accuracy\n")
            for x in runs:
                for p in x["eval"]:
                    f.write(f"{x['system']},{p['t']},{p['step']},{p['loss']},{p['accuracy']}\n")
        svg(series, os.path.join(a.out, "heldout-loss.svg"), runs[0]["minutes"], a.title)
        return
    t0 = time.time()
    points, train, how = run_dmove(a) if a.system == "dmove" else run_torch(a)
    res = {"system": a.system, "minutes": a.minutes, "how": how, "steps": train[-1][1] if train else 0,
           "wall_s": round(time.time() - t0, 1), "eval": points,
           "train_loss": [list(x) for x in train[:: max(1, len(train) // 400)]]}
    with open(a.out + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
