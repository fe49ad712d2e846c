/* gen.h: what the kernel generator's files share (src/cudagen/: gen.cu the row kernels,
 * attn.cu the fused attention kernels): the state of one program's generation, the text
 * helpers, and the row function both kinds of kernel call. Internal to the generator. */
#ifndef DMOVE_CUDAGEN_GEN_H
#define DMOVE_CUDAGEN_GEN_H

#include <string>

#include "cuda/cuda_internal.h"
#include "cuda/genrt.cuh"

enum { GEN_MAXV = 64, GEN_MAXSEG = 48, GEN_MAX_NCH = 8, GEN_SMEM = 48 * 1024 };

/* A value of the row: a global operand (one tensor row, addressed by kind) or a tensor
 * internal to the group (scratch slot), or a row scalar. */
typedef struct {
    int loc, kind, dt;
    const void *base; /* GLOBAL */
    int64_t rdiv;     /* GROUPED */
    int64_t slot;     /* SCRATCH */
    int param;        /* GLOBAL: index into the kernel's dmg_ptrs */
    int def_seg;      /* segment that computes it; -1: read from memory */
    int first_seg, last_seg; /* segments that use it (reads and the def) */
    int first_read_op, def_op; /* the first op that reads it, the op that writes it; -1 */
    int last_read_op;          /* the last op that reads it; -1 */
    int tensor;                /* global: its root tensor */
    int array;        /* 1: a row array (used across segments) */
    int loaded_seg;   /* segment in which its load was emitted, -1 none */
} gen_val;

typedef struct {
    const dmc_rowprog *p;
    gen_val v[GEN_MAXV];
    int nv, nparam;
    const void *params[DMG_MAXP];
    int seg;  /* current segment while planning or emitting */
    int team, nch, chunks, vec, full; /* full: every chunk has 8 columns */
    int64_t cols_pad;
    std::string rowscope, body, post, out; /* the segment being emitted */
    int red; /* reductions counter (unique names) */
    /* a fused attention kernel's row program: the value at s_base is read from the warp's
     * tile Ss, the one at p_base is also stored to Ps (the same tile: each lane reads its
     * chunks of S before it writes its chunks of P), SLD and PLD elements of the storage
     * type a row; P goes to memory too only if p_global */
    const void *s_base, *p_base;
    int p_global;
} gen_ctx;

/* The C++ name of storage type dt. */
const char *gen_type_name(int dt);
/* Appends printf-formatted text to s. */
void gen_add(std::string &s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Plans and emits program G->p (G->p set; G->s_base etc. for a fused kernel) as the row
 * function dmg_rows<idx>; sld, pld: the fused kernel's tile row lengths (else 0). gen.cu. */
dm_status gen_rows_fn(gen_ctx *G, int idx, int sld, int pld, std::string &src);
/* Appends fused kernel number idx for a to src; shape into k. attn.cu. */
dm_status gen_attn(const dmc_attn *a, int idx, dmc_genk *k, std::string &src);

#endif
