/* philox.h: Philox-4x32-10 counter-based RNG and dmove's dropout mask definition.
 *
 * Word m of stream `stream` under `seed` (dm_philox_words) is
 *   key     = (seed & 0xffffffff, seed >> 32)
 *   counter = ((m >> 2) & 0xffffffff, (m >> 2) >> 32, stream, 0)
 *   word    = word (m & 3) of philox4x32_10(counter, key)
 * The mask of dropout site `stream` (1 attention probs (b,h,j,k), 2 attention output
 * (b,j,i), 3 FFN output (b,j,i)) at linear element index n (row-major in the canonical
 * shape given) is defined, identically on every backend and schedule, by 16 random bits
 * per element, two elements a word:
 *   u       = bits 16 (n & 1) .. 16 (n & 1) + 15 of word n >> 1   (0 .. 65535)
 *   keep    = u >= dm_dropout_threshold(p), threshold = floor(p * 2^16) (p in [0,1))
 *   y       = keep ? x / (1 - p) : 0
 * (a kept fraction within 2^-16 of 1 - p; half the Philox work of a word an element, which
 * on the GPU is most of the flash attention's dropout). tests/ref/philox.py implements the
 * same in NumPy for the PyTorch references. */
#ifndef DM_PHILOX_H
#define DM_PHILOX_H

#include <stdint.h>

/* 4: the embeddings' output (b,j,i); 5: the classifier's pooled output (b,i). */
enum { DM_DROP_ATTN_PROBS = 1, DM_DROP_ATTN_OUT = 2, DM_DROP_FFN_OUT = 3, DM_DROP_EMBED = 4, DM_DROP_CLS = 5 };

/* One Philox-4x32-10 block: ctr[4], key[2] -> out[4] (Random123 constants). */
void dm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Words [start, start + n) of stream `stream` (word m as defined above). Vectorized. */
void dm_philox_words(uint64_t seed, uint32_t stream, uint64_t start, int64_t n, uint32_t *out);

/* Naive reference of dm_philox_words (one dm_philox4x32_10 call per word), for tests. */
void dm_philox_words_ref(uint64_t seed, uint32_t stream, uint64_t start, int64_t n,
                         uint32_t *out);

/* u[c] for c < n: the dropout's 16-bit uniform of element index start + c (the definition
 * above), each in a 32-bit slot (u holds n). */
void dm_dropout_uniforms(uint64_t seed, uint32_t stream, uint64_t start, int64_t n, uint32_t *u);
/* The same for one element, from dm_philox_words_ref (for references and tests). */
uint32_t dm_dropout_uniform_ref(uint64_t seed, uint32_t stream, uint64_t n);

/* floor(p * range), clamped to [0, range - 1]: a uniform draw in [0, range) is at least it
 * with probability 1 - p */
static inline uint32_t dm_threshold_in(double p, double range) {
    double t = p * range;
    if (t <= 0) return 0;
    if (t >= range - 1) return (uint32_t)(range - 1);
    return (uint32_t)t; /* floor */
}

/* The dropout's threshold: floor(p * 2^16), 0 for p <= 0, 65535 at p >= 1 - 2^-16. */
static inline uint32_t dm_dropout_threshold(double p) { return dm_threshold_in(p, 65536.0); }

/* A fraction's threshold on a whole 32-bit word: floor(p * 2^32), clamped to
 * [0, 2^32 - 1] (the text pipeline's draws). */
static inline uint32_t dm_fraction_threshold(double p) { return dm_threshold_in(p, 4294967296.0); }

#endif
