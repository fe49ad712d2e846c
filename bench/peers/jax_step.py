#!/usr/bin/env python3
"""bench/peers/jax_step.py: one training step (forward + backward) of one BERT encoder layer
in JAX, jax.jit(jax.value_and_grad(loss, argnums=(params, input))) on XLA's CPU backend,
timed the way `dmove bench` times it, printed as one JSON line.

The layer is Hugging Face BertLayer in training mode written as a pure function: separate
Q/K/V projections (weights stored (out, in) as torch.nn.Linear, applied as x @ W.T + b),
scores / sqrt(p) plus the extended padding mask ((1 - mask) * finfo.min, mask all ones),
softmax, dropout 0.1 on the probabilities, attention output dense + dropout + residual +
LayerNorm (post-LN, eps 1e-12), intermediate dense + exact erf GELU, output dense + dropout +
residual + LayerNorm, fp32. Backward: loss = sum(y * grad_output), so its gradient is the
vector-Jacobian product with grad_output, taken with respect to all 16 parameters and the
input, as the torch peers' y.backward(grad_output) and dmove do. The dropout key is an
argument of the jitted step, split fresh every step (new masks each step, no recompilation).

Settings (JAX/XLA documentation): XLA_FLAGS="--xla_cpu_multi_thread_eigen=true
intra_op_parallelism_threads=N" sets XLA's CPU intra-op thread pool (run_peers.sh sets it;
this script sets it itself when absent, before importing jax); the PRNG implementation is
--prng (default "rbg": the JAX docs' faster choice for random bits on CPU/GPU; "threefry2x32"
is JAX's default). Compile time is reported apart (compile_s); each timed call ends with
block_until_ready. forward_ms is a separate jit of the forward alone (same inputs), timed
after the step; backward_ms = step - forward is not reported, as XLA fuses the two.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eps", type=float, default=1e-12)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prng", default="rbg", choices=("threefry2x32", "rbg", "unsafe_rbg"))
    ap.add_argument("--variant", default="jax-jit", help="label copied into the JSON")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for name in ("batch", "seq", "hidden", "heads", "ffn", "reps", "warmup"):
        if getattr(a, name) <= 0:
            sys.exit(f"jax_step.py: --{name} must be positive")
    if a.hidden % a.heads:
        sys.exit(f"jax_step.py: hidden {a.hidden} is not divisible by heads {a.heads}")

    if "XLA_FLAGS" not in os.environ and a.threads > 0:
        os.environ["XLA_FLAGS"] = (f"--xla_cpu_multi_thread_eigen=true "
                                   f"intra_op_parallelism_threads={a.threads}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import jaxlib
    jax.config.update("jax_default_prng_impl", a.prng)

    b, j, i, h, u, p = a.batch, a.seq, a.hidden, a.heads, a.ffn, a.dropout
    d = i // h
    keep = 1.0 - p

    def dropout(key, x):
        if p == 0.0:
            return x
        m = jax.random.bernoulli(key, keep, x.shape)
        return jnp.where(m, x / keep, 0.0)

    def layer_norm(x, g, beta):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + a.eps) * g + beta

    def dense(x, w, bias):
        return x @ w.T + bias

    def layer(P, x, ext_mask, key):
        k1, k2, k3 = jax.random.split(key, 3)
        split = lambda t: t.reshape(b, j, h, d).transpose(0, 2, 1, 3)  # (b, h, j, d)
        q = split(dense(x, P["attention.self.query.weight"], P["attention.self.query.bias"]))
        k = split(dense(x, P["attention.self.key.weight"], P["attention.self.key.bias"]))
        v = split(dense(x, P["attention.self.value.weight"], P["attention.self.value.bias"]))
        s = jnp.einsum("bhjd,bhkd->bhjk", q, k) / jnp.sqrt(jnp.float32(d)) + ext_mask
        probs = dropout(k1, jax.nn.softmax(s, axis=-1))
        ctx = jnp.einsum("bhjk,bhkd->bhjd", probs, v).transpose(0, 2, 1, 3).reshape(b, j, i)
        att = dense(ctx, P["attention.output.dense.weight"], P["attention.output.dense.bias"])
        att = layer_norm(dropout(k2, att) + x,
                         P["attention.output.LayerNorm.weight"], P["attention.output.LayerNorm.bias"])
        inter = jax.nn.gelu(dense(att, P["intermediate.dense.weight"], P["intermediate.dense.bias"]),
                            approximate=False)
        out = dense(inter, P["output.dense.weight"], P["output.dense.bias"])
        return layer_norm(dropout(k3, out) + att, P["output.LayerNorm.weight"], P["output.LayerNorm.bias"])

    def loss(P, x, ext_mask, key, grad_output):
        return jnp.sum(layer(P, x, ext_mask, key) * grad_output)

    step_fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    fwd_fn = jax.jit(layer)

    rng = jax.random.PRNGKey(a.seed)
    shapes = {}
    for name, (o, n) in {"attention.self.query": (i, i), "attention.self.key": (i, i),
                         "attention.self.value": (i, i), "attention.output.dense": (i, i),
                         "intermediate.dense": (u, i), "output.dense": (i, u)}.items():
        shapes[name + ".weight"] = (o, n)
        shapes[name + ".bias"] = (o,)
    P = {}
    for name, shp in shapes.items():
        rng, sub = jax.random.split(rng)
        P[name] = 0.02 * jax.random.normal(sub, shp, jnp.float32)
    for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
        P[ln + ".weight"] = jnp.ones((i,), jnp.float32)
        P[ln + ".bias"] = jnp.zeros((i,), jnp.float32)
    rng, kx, kg = jax.random.split(rng, 3)
    x = jax.random.normal(kx, (b, j, i), jnp.float32)
    grad_output = jax.random.normal(kg, (b, j, i), jnp.float32)
    mask = jnp.ones((b, j), jnp.float32)
    ext_mask = (1.0 - mask[:, None, None, :]) * jnp.finfo(jnp.float32).min

    step, warm = [], []
    faults0 = 0
    for r in range(a.warmup + a.reps):
        if r == a.warmup:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rng, key = jax.random.split(rng)
        key.block_until_ready()
        t0 = time.perf_counter()
        out = step_fn(P, x, ext_mask, key, grad_output)
        jax.block_until_ready(out)
        t1 = time.perf_counter()
        del out
        (step if r >= a.warmup else warm).append((t1 - t0) * 1e3)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0

    fwd = []
    for r in range(a.warmup + a.reps):
        rng, key = jax.random.split(rng)
        key.block_until_ready()
        t0 = time.perf_counter()
        y = fwd_fn(P, x, ext_mask, key)
        y.block_until_ready()
        t1 = time.perf_counter()
        del y
        if r >= a.warmup:
            fwd.append((t1 - t0) * 1e3)

    flop_fwd = 2 * b * j * i * (4 * i + 2 * u) + 4 * b * j * j * i
    env = {k: os.environ[k] for k in sorted(os.environ)
           if k.startswith(("MALLOC_", "XLA_", "JAX_", "OMP_", "LD_PRELOAD"))}
    settings = [f"jax {jax.__version__}, jaxlib {jaxlib.__version__}",
                f"device={jax.devices()[0].device_kind}",
                "jax.jit(jax.value_and_grad(loss, argnums=(params, x)))",
                f"prng={a.prng}"] + [f"{k}={v}" for k, v in env.items()]
    print(json.dumps({
        "peer": "jax-jit",
        "variant": a.variant,
        "forward_ms": round(statistics.median(fwd), 3),
        "backward_ms": None,
        "step_ms": round(statistics.median(step), 3),
        "step_min_ms": round(min(step), 3),
        "compile_s": round(warm[0] * 1e-3, 2),
        "page_faults_per_step": round(faults / a.reps),
        "contraction_gflop": round(3 * flop_fwd * 1e-9, 3),
        "jax_version": jax.__version__,
        "threads": a.threads,
        "config": {"batch": b, "seq": j, "hidden": i, "heads": h, "ffn": u,
                   "dropout": p, "reps": a.reps, "warmup": a.warmup},
        "settings": "; ".join(settings),
    }))


if __name__ == "__main__":
    main()
