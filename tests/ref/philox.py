#!/usr/bin/env python3
"""philox.py: Philox-4x32-10 and dmove's dropout mask definition in NumPy.

Word m of `stream` under `seed` is word (m & 3) of philox4x32_10(counter, key) with
key = (seed & 0xffffffff, seed >> 32), counter = ((m >> 2) & 0xffffffff, (m >> 2) >> 32,
stream, 0). The mask of dropout site `stream` (1 attention probs (b,h,j,k), 2 attention
output (b,j,i), 3 FFN output (b,j,i)) at linear element index n (row-major in that
canonical shape) is, as in src/core/philox.h:

    u       = bits 16 (n & 1) .. + 15 of word n >> 1   (16 bits an element)
    keep    = u >= floor(p * 2**16)            (p in [0, 1))
    y       = x / (1 - p) if keep else 0       (inverted dropout)

Vectorized over blocks with uint64 arithmetic (32x32 -> 64-bit products never overflow).
Run as a script to check the Random123 known-answer vectors.
"""
import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)
ROUNDS = 10


def philox4x32_10(ctr, key):
    """ctr: uint array (..., 4), key: uint array (..., 2) (broadcast) -> uint32 (..., 4)."""
    ctr = np.asarray(ctr, dtype=np.uint64)
    key = np.asarray(key, dtype=np.uint64)
    x0, x1, x2, x3 = (ctr[..., w].copy() for w in range(4))
    k0, k1 = key[..., 0].copy(), key[..., 1].copy()
    m0, m1 = np.uint64(M0), np.uint64(M1)
    s32 = np.uint64(32)
    for r in range(ROUNDS):
        if r > 0:  # key schedule: bump between rounds
            k0 = (k0 + np.uint64(W0)) & MASK32
            k1 = (k1 + np.uint64(W1)) & MASK32
        p0 = m0 * x0
        p1 = m1 * x2
        x0, x1, x2, x3 = ((p1 >> s32) ^ x1 ^ k0, p1 & MASK32,
                          (p0 >> s32) ^ x3 ^ k1, p0 & MASK32)
    return np.stack([x0, x1, x2, x3], axis=-1).astype(np.uint32)


def philox_words(seed, stream, start, n):
    """Words [start, start + n) of `stream` (dm_philox_words)."""
    seed = int(seed)
    idx = np.arange(start, start + n, dtype=np.uint64)
    blk0, blk1 = start >> 2, (start + n + 3) >> 2
    blk = np.arange(blk0, max(blk1, blk0), dtype=np.uint64)
    ctr = np.stack([blk & MASK32, blk >> np.uint64(32),
                    np.full_like(blk, stream), np.zeros_like(blk)], axis=-1)
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint64)
    words = philox4x32_10(ctr, key).reshape(-1)  # word 4*(blk - blk0) + w
    return words[(idx - np.uint64(blk0 * 4)).astype(np.int64)]


def dropout_threshold(p):
    """floor(p * 2^16) clamped to [0, 2^16 - 1], as dm_dropout_threshold."""
    t = p * 65536.0
    if t <= 0:
        return 0
    if t >= 65535.0:
        return 65535
    return int(np.floor(t))


def dropout_uniforms(seed, stream, start, n):
    """The 16-bit uniforms of element indices [start, start + n) (dm_dropout_uniforms)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    m0 = start >> 1
    words = philox_words(seed, stream, m0, ((start + n - 1) >> 1) - m0 + 1) if n > 0 else np.zeros(0, np.uint32)
    w = words[((idx >> np.uint64(1)) - np.uint64(m0)).astype(np.int64)].astype(np.uint64)
    return ((w >> (np.uint64(16) * (idx & np.uint64(1)))) & np.uint64(0xFFFF)).astype(np.uint32)


def dropout_keep(seed, stream, shape, p):
    """Bool keep-mask of a tensor of canonical row-major `shape` at dropout site `stream`."""
    n = int(np.prod(shape, dtype=np.int64))
    u = dropout_uniforms(seed, stream, 0, n)
    return (u >= np.uint32(dropout_threshold(p))).reshape(shape)


# Random123 known answers (kat_vectors of the Random123 distribution, as reproduced in
# DEShawResearch/Random123-Boost libs/random/test/test_philox.cpp), and four more
# key-varying ones from the full kat_vectors file: (counter[4], key[2], expected[4]).
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
    ((0x00000001, 0x00000000, 0x00000000, 0x00000000), (0x00000001, 0x00000000),
     (0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0x00000000, 0x00000001),
     (0x126514c3, 0xd1898b69, 0xda2707b3, 0x6e6fb436)),
    ((0x00000000, 0x00000000, 0x00000000, 0xffffffff), (0x00000000, 0xffffffff),
     (0x9f18bb20, 0x62161056, 0x7ea8c028, 0x4c01fc6e)),
    ((0x452821e6, 0x38d01377, 0xbe5466cf, 0x34e90c6c), (0x00000000, 0x80000000),
     (0x94ca5566, 0x14924b2f, 0x28214292, 0x59faeaee)),
]


def _selfcheck():
    for ctr, key, want in KAT:
        got = tuple(int(v) for v in philox4x32_10(ctr, key))
        assert got == want, (ctr, key, [hex(v) for v in got], [hex(v) for v in want])
    # all KATs at once (broadcasting over rows)
    got = philox4x32_10(np.array([c for c, _, _ in KAT]), np.array([k for _, k, _ in KAT]))
    assert (got == np.array([w for _, _, w in KAT], dtype=np.uint32)).all()
    # words vs the per-word definition, unaligned ranges and a counter carry into word 1
    seed = 0x0123456789ABCDEF
    for start, n in [(0, 1), (1, 2), (3, 9), (5, 64), (4 * (2**32 - 2) + 3, 13)]:
        w = philox_words(seed, 2, start, n)
        for t in range(n):
            e = start + t
            blk = e >> 2
            ref = philox4x32_10((blk & 0xFFFFFFFF, blk >> 32, 2, 0),
                                (seed & 0xFFFFFFFF, seed >> 32))[e & 3]
            assert w[t] == ref, (start, n, t)
    # uniforms vs the per-element definition, from odd and even starts
    for start, n in [(0, 1), (1, 1), (1, 2), (3, 9), (6, 17), (2 * (2**33 - 3) + 1, 13)]:
        u = dropout_uniforms(seed, 1, start, n)
        for t in range(n):
            e = start + t
            word = int(philox_words(seed, 1, e >> 1, 1)[0])
            assert u[t] == (word >> (16 * (e & 1))) & 0xFFFF, (start, n, t)
    keep = dropout_keep(1234, 1, (2, 3, 50, 70), 0.1)
    frac = keep.mean()
    assert abs(frac - 0.9) < 0.01, frac
    print("philox.py: %d KAT vectors ok, words and uniforms ok, keep fraction %.4f at p=0.1"
          % (len(KAT), frac))
    # values tying the C test to this file's index convention (tests/test_philox.c)
    print("words(seed=0x0123456789abcdef, stream=2, start=5, n=8):",
          " ".join("0x%08x" % v for v in philox_words(seed, 2, 5, 8)))
    print("uniforms(seed=0x0123456789abcdef, stream=2, start=5, n=8):",
          " ".join("0x%04x" % v for v in dropout_uniforms(seed, 2, 5, 8)))


if __name__ == "__main__":
    _selfcheck()
