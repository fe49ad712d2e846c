/* attn.h: attention over packed sequences of their own lengths on the CPU (attn.c; ops.def's
 * ATTN and ATTN_BWD). */
#ifndef DM_CPU_ATTN_H
#define DM_CPU_ATTN_H

#include <stdint.h>

#include "dmove.h"

typedef struct {
    int64_t B, J, H, P; /* sequences, their longest length (the capacity per sequence), heads, head size */
    int64_t ldq;        /* floats between token rows of Q, K, V (heads P apart in a row) */
    int64_t ldc;        /* of ctx and dctx */
    int64_t ldd;        /* of dQ, dK, dV */
    float alpha;        /* the scores' scale */
    int causal;
    double p;           /* the probabilities' dropout */
    int stream;         /* its Philox stream */
} dm_attn_dims;

typedef struct {
    const float *q, *k, *v, *lengths; /* lengths: B whole numbers in [0, J], as floats */
    const float *mask;                /* or, when not NULL (keymask: ops.def), every sequence
                                       * J long and this (B, J) attention_mask on the keys */
    const int64_t *off;               /* or, when not NULL, the sequences' first rows (B + 1),
                                       * checked (a layer's, as its step began) */
    float *probs;                     /* (B, H, J, J): sequence s head h's L x L block at its top left */
    float *ctx;                       /* forward */
    const float *dctx;                /* backward, with probs read */
    float *dq, *dk, *dv;
} dm_attn_io;

/* floats of work per thread (the caller gives nthreads of them, 64-byte aligned) */
int64_t dm_cpu_attn_work_floats(int64_t J);
/* The forward (bwd 0: probs, ctx) or backward (bwd 1: dq, dk, dv) pass on nthreads
 * threads, over the rows of the real tokens alone. */
dm_status dm_cpu_attn(const dm_attn_dims *a, const dm_attn_io *io, uint64_t seed, int bwd, float *work,
                      int nthreads);

#endif
