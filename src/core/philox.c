/* philox.c: Philox-4x32-10 (Salmon et al., SC'11; Random123 constants) and the word
 * stream dmove's dropout masks are cut from (definition in philox.h).
 *
 * dm_dropout_uniforms cuts 16-bit uniforms, two an element pair, from those words.
 * dm_philox_words has a naive reference (one block per word, dm_philox_words_ref, used by
 * the tests) and a fast path that runs many counters side by side:
 *  - with AVX2: 64-bit lanes, 4 blocks per register and PHILOX_GROUPS registers in flight.
 *    A lane holds a 32-bit state word in its low half; vpmuludq multiplies only the low
 *    halves, so the 32x32->64 product needs no masking, the high half of the product is
 *    one shift, and its low half is the product itself (the garbage above bit 31 never
 *    reaches a multiplier or the output). Measured 1.43 G words/s on one Zen 3 core
 *    (ranges of >= 128 words from an index that is a multiple of 4).
 *  - with AVX-512: the same with 8 blocks per register, G up to 4 (8 measured no faster):
 *    dm_dropout_uniforms over 512-element rows 0.34 -> 0.25 ns an element on one core of
 *    a Xeon with AVX-512 (2026-11-29; the AVX2 path on the same core the first figure).
 *  - otherwise: the same lanes in portable C (arrays of uint32 with 64-bit products), which
 *    gcc -O3 vectorizes: 0.5-0.6 G words/s.
 * gcc's auto-vectorization of the portable loop reached only ~0.45 G words/s on AVX2 (it
 * widens through lo/hi unpacks and cross-lane permutes, or synthesizes the multiply by a
 * constant from shifts in 64-bit lanes), hence the explicit AVX2 path. */
#include "core/philox.h"

#include <string.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10


void dm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) { /* the key schedule: bump between rounds */
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * x0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * x2;
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
        uint32_t y1 = (uint32_t)p1;
        uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
        uint32_t y3 = (uint32_t)p0;
        x0 = y0;
        x1 = y1;
        x2 = y2;
        x3 = y3;
    }
    out[0] = x0;
    out[1] = x1;
    out[2] = x2;
    out[3] = x3;
}

/* Block `blk` of stream `stream` under `seed`: the counter and key of philox.h. */
static void philox_block(uint64_t seed, uint32_t stream, uint64_t blk, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), stream, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    dm_philox4x32_10(ctr, key, out);
}

/* Naive reference: every word computed on its own from the definition. */
static void philox_words_naive(uint64_t seed, uint32_t stream, uint64_t start, int64_t n,
                               uint32_t *out) {
    for (int64_t t = 0; t < n; t++) {
        uint64_t idx = start + (uint64_t)t;
        uint32_t w[4];
        philox_block(seed, stream, idx >> 2, w);
        out[t] = w[idx & 3];
    }
}

void dm_philox_words_ref(uint64_t seed, uint32_t stream, uint64_t start, int64_t n,
                         uint32_t *out) {
    philox_words_naive(seed, stream, start, n, out);
}


/* The fast path generates "chunks" of consecutive blocks, G groups of PHILOX_GW words
 * each (G = 1, 2, 4 or PHILOX_MAXG, the largest that fits what is left): G independent
 * chains of multiplies in flight. A row of BERT-base's attention dropout (128 elements,
 * 64 words) took one group at a time before, one chain waiting on each multiply. */
#if defined(__AVX512F__)

#define PHILOX_MAXG 4
#define PHILOX_GW 32 /* a register of 8 blocks */

/* 8*G consecutive blocks from `blk` -> out[0 .. 32*G), block b's word w at out[4*b + w]:
 * the AVX2 path's lanes, twice as many a register (G 4: 16 state registers of 32, no
 * spills; 8 spilled). */
static inline __attribute__((always_inline)) void
philox_run(int G, uint32_t k0, uint32_t k1, uint32_t stream, uint64_t blk, uint32_t *out) {
    __m512i x0[PHILOX_MAXG], x1[PHILOX_MAXG], x2[PHILOX_MAXG], x3[PHILOX_MAXG];
    const __m512i m0 = _mm512_set1_epi64(PHILOX_M0), m1 = _mm512_set1_epi64(PHILOX_M1);
    const __m512i base = _mm512_add_epi64(_mm512_set1_epi64((long long)blk), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    for (int g = 0; g < G; g++) {
        __m512i c = _mm512_add_epi64(base, _mm512_set1_epi64(8 * g)); /* 64-bit counter */
        x0[g] = c;                                                      /* low half: counter bits 0..31 */
        x1[g] = _mm512_srli_epi64(c, 32);                               /* counter bits 32..63 */
        x2[g] = _mm512_set1_epi64(stream);
        x3[g] = _mm512_setzero_si512();
    }
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        const __m512i kk0 = _mm512_set1_epi64(k0), kk1 = _mm512_set1_epi64(k1);
        for (int g = 0; g < G; g++) {
            __m512i p0 = _mm512_mul_epu32(x0[g], m0); /* M0 * x0, 64-bit */
            __m512i p1 = _mm512_mul_epu32(x2[g], m1); /* M1 * x2, 64-bit */
            /* hi(p) ^ x ^ k in one ternary logic op (0x96: a ^ b ^ c) */
            x0[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), x1[g], kk0, 0x96);
            x2[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), x3[g], kk1, 0x96);
            x1[g] = p1; /* low half = lo(M1 * x2) */
            x3[g] = p0; /* low half = lo(M0 * x0) */
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    for (int g = 0; g < G; g++) {
        /* 64-bit lane b: (x0 | x1 << 32) and (x2 | x3 << 32) of block 8g+b, then the
         * blocks' two halves side by side */
        const __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, x0[g], _mm512_slli_epi64(x1[g], 32));
        const __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, x2[g], _mm512_slli_epi64(x3[g], 32));
        _mm512_storeu_si512(out + 32 * g, _mm512_permutex2var_epi64(w01, lo, w23));
        _mm512_storeu_si512(out + 32 * g + 16, _mm512_permutex2var_epi64(w01, hi, w23));
    }
}

#elif defined(__AVX2__)

#define PHILOX_MAXG 8
#define PHILOX_GW 16 /* a register of 4 blocks */

/* 4*G consecutive blocks from `blk` -> out[0 .. 16*G), block b's word w at out[4*b + w].
 * G is a constant at every call site; always_inline lets the arrays live in registers. */
static inline __attribute__((always_inline)) void
philox_run(int G, uint32_t k0, uint32_t k1, uint32_t stream, uint64_t blk, uint32_t *out) {
    __m256i x0[PHILOX_MAXG], x1[PHILOX_MAXG], x2[PHILOX_MAXG], x3[PHILOX_MAXG];
    const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
    const __m256i base = _mm256_add_epi64(_mm256_set1_epi64x((long long)blk),
                                          _mm256_setr_epi64x(0, 1, 2, 3));
    for (int g = 0; g < G; g++) {
        __m256i c = _mm256_add_epi64(base, _mm256_set1_epi64x(4 * g)); /* 64-bit counter */
        x0[g] = c;                          /* low half: counter bits 0..31 */
        x1[g] = _mm256_srli_epi64(c, 32);   /* counter bits 32..63 */
        x2[g] = _mm256_set1_epi64x(stream);
        x3[g] = _mm256_setzero_si256();
    }
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        const __m256i kk0 = _mm256_set1_epi64x(k0), kk1 = _mm256_set1_epi64x(k1);
        for (int g = 0; g < G; g++) {
            __m256i p0 = _mm256_mul_epu32(x0[g], m0); /* M0 * x0, 64-bit */
            __m256i p1 = _mm256_mul_epu32(x2[g], m1); /* M1 * x2, 64-bit */
            x0[g] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(x1[g], kk0));
            x2[g] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(x3[g], kk1));
            x1[g] = p1; /* low half = lo(M1 * x2) */
            x3[g] = p0; /* low half = lo(M0 * x0) */
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int g = 0; g < G; g++) {
        /* 64-bit lane b: (x0 | x1 << 32) and (x2 | x3 << 32) of block 4g+b */
        __m256i w01 = _mm256_blend_epi32(x0[g], _mm256_slli_epi64(x1[g], 32), 0xAA);
        __m256i w23 = _mm256_blend_epi32(x2[g], _mm256_slli_epi64(x3[g], 32), 0xAA);
        __m256i b02 = _mm256_unpacklo_epi64(w01, w23); /* block 0 | block 2 */
        __m256i b13 = _mm256_unpackhi_epi64(w01, w23); /* block 1 | block 3 */
        _mm256_storeu_si256((__m256i *)(out + 16 * g), _mm256_permute2x128_si256(b02, b13, 0x20));
        _mm256_storeu_si256((__m256i *)(out + 16 * g + 8),
                            _mm256_permute2x128_si256(b02, b13, 0x31));
    }
}

#else /* portable lanes */

#define PHILOX_MAXG 4
#define PHILOX_GW 16 /* 4 blocks */

/* 4*G consecutive blocks from `blk` -> out[0 .. 16*G), block l's word w at out[4*l + w].
 * Structure of arrays over the lanes, fixed trip counts: vectorizable. */
static inline __attribute__((always_inline)) void
philox_run(int G, uint32_t k0, uint32_t k1, uint32_t stream, uint64_t blk, uint32_t *out) {
    enum { LANES = 4 * PHILOX_MAXG };
    const int L = 4 * G;
    uint32_t x0[LANES], x1[LANES], x2[LANES], x3[LANES];
    for (int l = 0; l < L; l++) {
        uint64_t c = blk + (uint64_t)l;
        x0[l] = (uint32_t)c;
        x1[l] = (uint32_t)(c >> 32);
        x2[l] = stream;
        x3[l] = 0;
    }
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        for (int l = 0; l < L; l++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * x0[l];
            uint64_t p1 = (uint64_t)PHILOX_M1 * x2[l];
            uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1[l] ^ k0;
            uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3[l] ^ k1;
            x1[l] = (uint32_t)p1;
            x3[l] = (uint32_t)p0;
            x0[l] = y0;
            x2[l] = y2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int l = 0; l < L; l++) {
        out[4 * l + 0] = x0[l];
        out[4 * l + 1] = x1[l];
        out[4 * l + 2] = x2[l];
        out[4 * l + 3] = x3[l];
    }
}

#endif

/* G groups (a power of two up to PHILOX_MAXG) from block `blk`: each G its own code,
 * its arrays in registers */
static void philox_chunk(int G, uint32_t k0, uint32_t k1, uint32_t stream, uint64_t blk, uint32_t *out) {
    switch (G) {
    case PHILOX_MAXG: philox_run(PHILOX_MAXG, k0, k1, stream, blk, out); break;
#if PHILOX_MAXG > 4
    case 4: philox_run(4, k0, k1, stream, blk, out); break;
#endif
    case 2: philox_run(2, k0, k1, stream, blk, out); break;
    default: philox_run(1, k0, k1, stream, blk, out); break;
    }
}

void dm_philox_words(uint64_t seed, uint32_t stream, uint64_t start, int64_t n,
                     uint32_t *out) {
    if (n <= 0) return;
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint64_t idx = start; /* word index of out[pos] */
    int64_t pos = 0;

    /* Head: `start` inside a block: the rest of the group that begins there. */
    if (idx & 3) {
        uint32_t buf[PHILOX_GW];
        int64_t skip = (int64_t)(idx & 3), take = PHILOX_GW - skip;
        if (take > n) take = n;
        philox_chunk(1, k0, k1, stream, idx >> 2, buf);
        memcpy(out, buf + skip, (size_t)take * sizeof(uint32_t));
        pos = take;
        idx += (uint64_t)take;
    }
    /* Body: from here idx is a multiple of 4 (or nothing is left); whole chunks, the
     * largest that fit, are written in place. */
    for (; n - pos >= PHILOX_MAXG * PHILOX_GW; pos += PHILOX_MAXG * PHILOX_GW, idx += PHILOX_MAXG * PHILOX_GW)
        philox_chunk(PHILOX_MAXG, k0, k1, stream, idx >> 2, out + pos);
    for (int G = PHILOX_MAXG / 2; G >= 1; G /= 2)
        if (n - pos >= G * PHILOX_GW) {
            philox_chunk(G, k0, k1, stream, idx >> 2, out + pos);
            pos += G * PHILOX_GW;
            idx += (uint64_t)(G * PHILOX_GW);
        }
    /* Tail: fewer than a group's words. */
    if (pos < n) {
        uint32_t buf[PHILOX_GW];
        philox_chunk(1, k0, k1, stream, idx >> 2, buf);
        memcpy(out + pos, buf, (size_t)(n - pos) * sizeof(uint32_t));
    }
}

void dm_dropout_uniforms(uint64_t seed, uint32_t stream, uint64_t start, int64_t n, uint32_t *u) {
    enum { CHUNK = 512 }; /* elements a round: their words, then their halves widened */
    uint32_t w[CHUNK / 2 + 1];
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        const int64_t m = n - c0 < CHUNK ? n - c0 : CHUNK;
        const uint64_t s = start + (uint64_t)c0, m0 = s >> 1;
        const int odd = (int)(s & 1);
        const uint64_t nw = ((uint64_t)m + (uint64_t)odd + 1) >> 1; /* words m0 .. (s + m - 1) / 2 */
        dm_philox_words(seed, stream, m0, (int64_t)nw, w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint16_t h[CHUNK + 2]; /* word k's low half at 2k, high at 2k + 1 */
        memcpy(h, w, nw * sizeof(uint32_t));
        for (int64_t c = 0; c < m; c++) u[c0 + c] = h[c + odd];
#else
        for (int64_t c = 0; c < m; c++) {
            const int64_t i = c + odd;
            u[c0 + c] = (w[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
        }
#endif
    }
}

uint32_t dm_dropout_uniform_ref(uint64_t seed, uint32_t stream, uint64_t n) {
    uint32_t w;
    dm_philox_words_ref(seed, stream, n >> 1, 1, &w);
    return (w >> (16 * (n & 1))) & 0xFFFFu;
}
