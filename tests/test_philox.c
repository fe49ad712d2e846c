/* test_philox.c: Philox-4x32-10 known answers, the fast word stream against the naive
 * reference over many (start, n), the index convention shared with tests/ref/philox.py,
 * and the kept fraction of a dropout mask. */
#include "core/philox.h"

#include <stdint.h>
#include <string.h>

#include "testutil.h"

/* Random123 known answers: the three philox4x32 10 lines of Random123's kat_vectors (as
 * reproduced in DEShawResearch/Random123-Boost libs/random/test/test_philox.cpp: zeros,
 * all ones, pi digits), and four key-varying lines of the full kat_vectors table. */
static const struct {
    uint32_t ctr[4], key[2], want[4];
} kat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    {{0x00000001, 0x00000000, 0x00000000, 0x00000000}, {0x00000001, 0x00000000},
     {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0x00000000, 0x00000001},
     {0x126514c3, 0xd1898b69, 0xda2707b3, 0x6e6fb436}},
    {{0x00000000, 0x00000000, 0x00000000, 0xffffffff}, {0x00000000, 0xffffffff},
     {0x9f18bb20, 0x62161056, 0x7ea8c028, 0x4c01fc6e}},
    {{0x452821e6, 0x38d01377, 0xbe5466cf, 0x34e90c6c}, {0x00000000, 0x80000000},
     {0x94ca5566, 0x14924b2f, 0x28214292, 0x59faeaee}},
};

static void test_kat(void) {
    for (size_t t = 0; t < sizeof kat / sizeof kat[0]; t++) {
        uint32_t out[4];
        dm_philox4x32_10(kat[t].ctr, kat[t].key, out);
        int ok = memcmp(out, kat[t].want, sizeof out) == 0;
        if (!ok)
            fprintf(stderr, "KAT %zu: got %08x %08x %08x %08x\n", t, out[0], out[1], out[2],
                    out[3]);
        CHECK(ok);
    }
}

/* The reference itself against the definition written out once more. */
static void test_ref_definition(void) {
    const uint64_t seed = 0xfedcba9876543210ull;
    const uint64_t start = 4ull * 0xffffffffull - 2; /* crosses into counter word 1 */
    uint32_t w[12];
    dm_philox_words_ref(seed, 3, start, 12, w);
    for (int t = 0; t < 12; t++) {
        uint64_t n = start + (uint64_t)t;
        uint32_t ctr[4] = {(uint32_t)(n >> 2), (uint32_t)((n >> 2) >> 32), 3, 0};
        uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
        uint32_t out[4];
        dm_philox4x32_10(ctr, key, out);
        CHECK(w[t] == out[n & 3]);
    }
}

/* Words computed by tests/ref/philox.py (run it as a script): the same index convention
 * in C and in the PyTorch references. */
static void test_python_convention(void) {
    static const uint32_t want[8] = {0x6b049a7d, 0x3bc08ddb, 0x96d15ef7, 0xb876199e,
                                     0x7e07027e, 0x339fe99a, 0x03a40e77, 0xf931138e};
    uint32_t w[8];
    dm_philox_words(0x0123456789abcdefull, 2, 5, 8, w);
    CHECK(memcmp(w, want, sizeof w) == 0);
    dm_philox_words_ref(0x0123456789abcdefull, 2, 5, 8, w);
    CHECK(memcmp(w, want, sizeof w) == 0);
}

/* Fast against naive for many ranges; the words around the range stay untouched. */
static void test_words_vs_ref(void) {
    enum { MAXN = 4200, GUARD = 8 };
    static uint32_t fast[MAXN + 2 * GUARD], ref[MAXN];
    static const uint64_t starts[] = {0,   1,   2,   3,    4,    5,    6,    7,
                                      13,  64,  65,  127,  128,  131,  1023, 4096 + 2,
                                      4ull * 0xffffffffull - 70, /* counter carry */
                                      (1ull << 40) + 3, UINT64_MAX - 5000};
    static const int64_t ns[] = {0,  1,  2,  3,  4,   5,   7,   15,  16,  17,  31,   32,  63,
                                 48, 64, 65, 66, 67, 80, 112, 127, 128, 129, 130, 131, 200, 240, 255, 256,
                                 257, 511, 1000, 4099, MAXN};
    static const uint64_t seeds[] = {0, 42, 0xffffffffull, 0x9e3779b97f4a7c15ull};
    int mismatches = 0, clobbered = 0, cases = 0;
    for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++)
        for (uint32_t stream = 1; stream <= 3; stream++)
            for (size_t a = 0; a < sizeof starts / sizeof starts[0]; a++)
                for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
                    uint64_t start = starts[a];
                    int64_t n = ns[b];
                    for (int g = 0; g < MAXN + 2 * GUARD; g++) fast[g] = 0xa5a5a5a5u;
                    dm_philox_words(seeds[si], stream, start, n, fast + GUARD);
                    dm_philox_words_ref(seeds[si], stream, start, n, ref);
                    cases++;
                    if (memcmp(fast + GUARD, ref, (size_t)n * sizeof(uint32_t)) != 0) {
                        if (mismatches++ < 5)
                            fprintf(stderr, "mismatch: seed %llu stream %u start %llu n %lld\n",
                                    (unsigned long long)seeds[si], stream,
                                    (unsigned long long)start, (long long)n);
                    }
                    for (int g = 0; g < GUARD; g++)
                        if (fast[g] != 0xa5a5a5a5u || fast[GUARD + n + g] != 0xa5a5a5a5u)
                            clobbered++;
                }
    printf("words vs reference: %d ranges, %d mismatches, %d clobbered guards\n", cases,
           mismatches, clobbered);
    CHECK(mismatches == 0);
    CHECK(clobbered == 0);
    /* a range split anywhere gives the same words as in one call */
    uint32_t whole[300], part[300];
    dm_philox_words(7, 1, 9, 300, whole);
    for (int cut = 0; cut <= 300; cut += 37) {
        dm_philox_words(7, 1, 9, cut, part);
        dm_philox_words(7, 1, 9 + (uint64_t)cut, 300 - cut, part + cut);
        CHECK(memcmp(whole, part, sizeof whole) == 0);
    }
}

static void test_threshold(void) {
    CHECK(dm_dropout_threshold(0.0) == 0);
    CHECK(dm_dropout_threshold(-1.0) == 0);
    CHECK(dm_dropout_threshold(0.5) == 0x8000u);
    CHECK(dm_dropout_threshold(0.1) == 6553u); /* floor(0.1 * 2^16) */
    CHECK(dm_dropout_threshold(0.9999) == 65529u); /* floor(65529.4) */
    CHECK(dm_dropout_threshold(0.999999999999) == 65535u);
    CHECK(dm_dropout_threshold(1.0) == 0xffffu);
    /* the text pipeline's fractions keep whole words */
    CHECK(dm_fraction_threshold(0.5) == 0x80000000u);
    CHECK(dm_fraction_threshold(0.1) == 429496729u); /* floor(0.1 * 2^32) */
    CHECK(dm_fraction_threshold(1.0) == 0xffffffffu);
    CHECK(dm_fraction_threshold(-1.0) == 0);
}

/* The dropout's 16-bit uniforms: from every start parity and length, against the definition
 * (half n & 1 of word n >> 1, dm_dropout_uniform_ref, and once more from the words), and
 * the values tests/ref/philox.py prints (the PyTorch references' convention). */
static void test_uniforms(void) {
    static const uint32_t want[8] = {0xf163, 0x9b39, 0x0930, 0x0fe1, 0xff63, 0x9a7d, 0x6b04, 0x8ddb};
    uint32_t u[8];
    dm_dropout_uniforms(0x0123456789abcdefull, 2, 5, 8, u);
    CHECK(memcmp(u, want, sizeof u) == 0);
    enum { MAXN = 300, GUARD = 4 };
    static uint32_t buf[MAXN + 2 * GUARD];
    static const uint64_t starts[] = {0, 1, 2, 3, 7, 8, 9, 2 * (4ull * 0xffffffffull) - 3, UINT64_MAX - 400};
    int bad = 0, clobbered = 0;
    for (size_t a = 0; a < sizeof starts / sizeof starts[0]; a++)
        for (int64_t n = 0; n <= MAXN; n += n < 20 ? 1 : 37) {
            for (int g = 0; g < MAXN + 2 * GUARD; g++) buf[g] = 0xa5a5a5a5u;
            dm_dropout_uniforms(99, 1, starts[a], n, buf + GUARD);
            for (int64_t c = 0; c < n; c++) {
                const uint64_t e = starts[a] + (uint64_t)c;
                uint32_t w;
                dm_philox_words_ref(99, 1, e >> 1, 1, &w);
                bad += buf[GUARD + c] != dm_dropout_uniform_ref(99, 1, e) ||
                       buf[GUARD + c] != ((e & 1) ? w >> 16 : (w & 0xFFFFu));
            }
            for (int g = 0; g < GUARD; g++)
                clobbered += buf[g] != 0xa5a5a5a5u || buf[GUARD + n + g] != 0xa5a5a5a5u;
        }
    printf("dropout uniforms: %d wrong, %d clobbered guards\n", bad, clobbered);
    CHECK(bad == 0);
    CHECK(clobbered == 0);
}

/* Kept fraction at p = 0.1 over 1M draws of each stream: sd = sqrt(0.09 / 1e6) = 3e-4;
 * a margin of 3e-3 is ten standard deviations (and the draws are deterministic). Also the
 * mean of u / 2^16 (sd 2.9e-4) and that the streams differ. */
static void test_keep_fraction(void) {
    enum { N = 1 << 20 };
    static uint32_t u[4][N];
    const uint32_t thr = dm_dropout_threshold(0.1);
    for (uint32_t s = 1; s <= 3; s++) {
        dm_dropout_uniforms(2024, s, 0, N, u[s]);
        long kept = 0;
        double mean = 0;
        for (int t = 0; t < N; t++) {
            kept += u[s][t] >= thr;
            mean += u[s][t] * (1.0 / 65536.0);
        }
        double frac = (double)kept / N;
        mean /= N;
        printf("stream %u: kept fraction %.5f at p=0.1 (1M draws), mean u %.5f\n", s, frac,
               mean);
        CHECK(fabs(frac - 0.9) < 3e-3);
        CHECK(fabs(mean - 0.5) < 3e-3);
    }
    long same = 0; /* 16-bit values: two streams' equal by chance 2^-16 of the time (32 expected) */
    for (int t = 0; t < N; t++) same += (u[1][t] == u[2][t]) + (u[2][t] == u[3][t]);
    CHECK(same < 100);
    /* p = 0 keeps everything */
    long dropped0 = 0;
    for (int t = 0; t < N; t++) dropped0 += !(u[1][t] >= dm_dropout_threshold(0.0));
    CHECK(dropped0 == 0);
}

int main(void) {
    test_kat();
    test_ref_definition();
    test_python_convention();
    test_words_vs_ref();
    test_threshold();
    test_uniforms();
    test_keep_fraction();
    TEST_END();
}
