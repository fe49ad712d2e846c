/* stream.h: copies to memory that bypass the caches, for rows written once and read only
 * much later (the attention's probabilities, kept for the backward pass): no read of each
 * line before it is written, no eviction of the tiles the kernels work in. */
#ifndef DM_CPU_STREAM_H
#define DM_CPU_STREAM_H

#include <stdint.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

/* n floats from s to d, the whole 64-byte lines of d by streaming stores, the ends by
 * plain ones. Call dm_stream_fence before another thread may read d. */
static inline void dm_stream_row(float *restrict d, const float *restrict s, int64_t n) {
    int64_t c = 0;
#if defined(__SSE2__)
    for (; c < n && ((uintptr_t)(d + c) & 63); c++) d[c] = s[c];
#if defined(__AVX512F__)
    for (; c + 16 <= n; c += 16) _mm512_stream_ps(d + c, _mm512_loadu_ps(s + c));
#elif defined(__AVX__)
    for (; c + 8 <= n; c += 8) _mm256_stream_ps(d + c, _mm256_loadu_ps(s + c));
#else
    for (; c + 4 <= n; c += 4) _mm_stream_ps(d + c, _mm_loadu_ps(s + c));
#endif
#endif
    for (; c < n; c++) d[c] = s[c];
}

/* n zeros at d, as dm_stream_row writes (a large table cleared before a few of its rows
 * are added to: no read of the lines it zeroes) */
static inline void dm_stream_zero(float *d, int64_t n) {
    int64_t c = 0;
#if defined(__SSE2__)
    for (; c < n && ((uintptr_t)(d + c) & 63); c++) d[c] = 0.0f;
#if defined(__AVX512F__)
    for (; c + 16 <= n; c += 16) _mm512_stream_ps(d + c, _mm512_setzero_ps());
#elif defined(__AVX__)
    for (; c + 8 <= n; c += 8) _mm256_stream_ps(d + c, _mm256_setzero_ps());
#else
    for (; c + 4 <= n; c += 4) _mm_stream_ps(d + c, _mm_setzero_ps());
#endif
#endif
    for (; c < n; c++) d[c] = 0.0f;
}

/* Orders this thread's streaming stores before its later stores (a barrier's) */
static inline void dm_stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

#endif
