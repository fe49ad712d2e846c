"""gelu_torch.py: PyTorch's exact GELU forward and backward on the GPU, bf16, on the
FFN's 96 x 128 x 4096 elements (gelu_probe.cu's shape): medians of 21 runs by CUDA events,
to compare with dmove's generated kernels and with gelu_probe's bounds."""
import torch

n = 96 * 128 * 4096
x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(n, device="cuda", dtype=torch.bfloat16)


def timed(fn):
    ts = []
    for r in range(24):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if r >= 3:
            ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


fwd = timed(lambda: torch.nn.functional.gelu(x))
bwd = timed(lambda: torch.ops.aten.gelu_backward(dy, x))
print(f"PyTorch {torch.__version__}: gelu fwd {fwd:.4f} ms ({n * 4 / fwd / 1e6:.0f} GB/s), "
      f"gelu bwd {bwd:.4f} ms ({n * 6 / bwd / 1e6:.0f} GB/s)")
