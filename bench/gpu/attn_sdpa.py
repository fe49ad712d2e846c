"""bench/gpu/attn_sdpa.py: PyTorch's scaled_dot_product_attention alone, forward and
forward + backward, bf16, on each backend that takes the case (issue 25's point 2, the
peers of dmove's flash kernels; bench/gpu/attn.sh runs it beside `dmove bench --lengths`):
  flash      no mask (its kernel takes none), dropout 0 and 0.1
  efficient  a key-padding mask (boolean, broadcast over heads and queries) and dropout 0.1
  math       the same, unfused (materializes the scores)
One JSON line per (size, backend, mask, dropout): medians of --reps timed calls (CUDA events)
after --warmup, ms and TFLOP/s (4 b h j^2 d forward, 8 backward: the GEMMs, as dmove counts).
A backend that refuses the case prints its reason instead of a time.
Usage: python3 bench/gpu/attn_sdpa.py [--sizes 8x512,96x128] [--heads 16] [--head-dim 64]
       [--reps 20] [--warmup 5] [--fill 1.0]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8x512,96x128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--fill", type=float, default=1.0, help="the mask's real keys per sequence / j")
    a = ap.parse_args()
    torch.manual_seed(0)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}
    cases = [("flash", False, 0.0), ("flash", False, 0.1), ("efficient", True, 0.1), ("efficient", False, 0.0),
             ("math", True, 0.1)]
    for size in a.sizes.split(","):
        b, j = (int(x) for x in size.split("x"))
        h, d = a.heads, a.head_dim
        q, k, v = (torch.randn(b, h, j, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(b, h, j, d, device="cuda", dtype=torch.bfloat16)
        keep = max(1, int(round(a.fill * j)))
        mask = torch.zeros(b, 1, 1, j, device="cuda", dtype=torch.bool)
        mask[..., :keep] = True
        flop = 4.0 * b * h * j * j * d
        for name, masked, p in cases:
            rec = {"b": b, "j": j, "h": h, "d": d, "backend": name, "mask": masked, "dropout": p,
                   "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if masked else None, dropout_p=p)

            def both():
                o = fwd()
                o.backward(g)

            try:
                with sdpa_kernel(backends[name]):
                    tf = timed(lambda: fwd(), a.reps, a.warmup)
                    tb = timed(both, a.reps, a.warmup)
                rec.update(forward_ms=tf, backward_ms=tb - tf, forward_tflops=flop / tf / 1e9,
                           backward_tflops=2 * flop / (tb - tf) / 1e9 if tb > tf else None)
            except RuntimeError as e:
                rec["refused"] = str(e).splitlines()[0][:200]
            q.grad = k.grad = v.grad = None
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
