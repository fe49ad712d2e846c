/* exec.h: the CPU backend: runs a plan's groups over an arena. */
#ifndef DM_CPU_EXEC_H
#define DM_CPU_EXEC_H

#include <stdint.h>

#include "cpu/attn.h"
#include "cpu/contract.h"
#include "cpu/kernels.h"
#include "plan/plan.h"

typedef struct {
    uint8_t scratch;  /* lives in a per-thread scratch row */
    uint8_t staged;   /* batched groups: a memory row written (an output) or read (a later op
                       * of the same chain) in the thread's staging row at slot, the output
                       * streamed to memory when the chain is done with the row */
    dm_arg_kind kind;
    float *base;      /* memory operand: the tensor's first element */
    int64_t rdiv;     /* GROUPED: rows per group row; INDEXED, SCATTER: the table's rows */
    int64_t slot;     /* scratch: float offset in the thread's scratch; COLACC: too */
    int nrl;          /* FULL / ROWSCALAR in a non-default layout: row letters (else 0) */
    int64_t rsize[DM_MAX_DIMS], rstride[DM_MAX_DIMS]; /* outermost first */
} dm_operand;

typedef struct {
    const dm_op *op;
    dm_operand in[DM_MAX_IN], out[DM_MAX_OUT];
    int islot;       /* the input slot indexing a T input (dm_op_index_slot), or -1 */
    dm_gemm gemm;    /* contractions inside a batched group */
    int64_t tile[3]; /* their operands (A, B, C): scratch tile offset, or -1 in memory */
    int chain_end;   /* batched groups, a row op: one past the last op of its chain (the
                      * row ops up to the next contraction, run row by row) */
} dm_exop;

typedef struct {
    const dm_group *gr;
    int contract;     /* a lone contraction: gemm */
    int scatter;      /* a lone op with an X output (EMBED_BWD): exec_scatter */
    int xent;         /* a lone LINEAR_XENT (1) or LINEAR_XENT_BWD (2): exec_xent */
    float *xp[DM_MAX_IN + DM_MAX_OUT]; /* its operands (inputs, then outputs) */
    const dm_op *xop;
    int64_t nbatch;   /* > 1: a batched group */
    dm_gemm gemm;
    dm_exop *ops;
    int nops;
    int nacc;                 /* column accumulators */
    float *acc_dst[DM_MAX_OUT * 8];
    int64_t acc_slot[DM_MAX_OUT * 8];
    int64_t scratch_floats;   /* per thread */
    dm_status unusable;       /* lenient init: why this group cannot run (else DM_OK) */
    int partner;              /* algorithm "concurrent": the group run beside this one, else -1 */
    int beside;               /* that partner: the group it runs beside (it is skipped), else -1 */
    int rows_next;            /* algorithm "direct_rows": the row group run in its epilogue, else -1 */
    int rows_of;              /* that row group: the contraction group it runs inside (skipped), else -1 */
    /* an unpadded layer (unpad.c) */
    int attn;                 /* a lone ATTN (1) or ATTN_BWD (2): dm_cpu_attn on ad, aio */
    dm_attn_dims ad;
    dm_attn_io aio;
    int64_t tok_rpt;          /* a row group over the tokens: its rows per token, else 0 */
    int64_t tok_mnk[3];       /* a contraction: its m, n, k per token (0: not over the tokens) */
    float *ztail[4];          /* the layer's outputs (token rows) it writes: zeroed past the tokens */
    int64_t zrow[4];          /* their floats per token row */
    int nztail;
} dm_exgroup;

typedef struct {
    dm_exgroup *groups;
    int ngroups;
    int nthreads;
    float *scratch;           /* nthreads * per_thread floats */
    int64_t per_thread;
    uint32_t *words;          /* nthreads * max_cols */
    int64_t max_cols;
    float *pack;              /* the direct kernel's buffers, one per thread (NULL where it does not run) */
    float *bwhole;            /* "direct_rows": op(B) packed whole, shared by the threads */
    int64_t bwhole_floats;
    uint8_t *rows_ran;        /* per group: run in the epilogue of its GEMM since its own last turn */
    float *xwork;             /* the fused cross-entropy's and the attention's buffers, shared by their groups */
    int64_t xwork_floats;
    int64_t tok_cap;          /* an unpadded layer's token rows (b x j), else 0 */
    int64_t tokens;           /* the live rows this step (dm_cpu_exec_set_rows) */
    int64_t *tokkey;          /* per token row: the padded layer's row (its dropout keys) */
    int64_t *tok_off;         /* an unpadded layer's: the sequences' first rows this step (b + 1) */
    int64_t tok_b, tok_j;     /* live rows "bj": b and j (set_rows' lengths), else 0 */
    char tok_why[256];        /* a plan with live rows that runs whole all the same: why */
} dm_cpu_exec;

/* How a row op addresses memory operand t (d->kind set by the caller): DM_ERR_UNSUPPORTED
 * when t's layout does not keep the op's columns contiguous and innermost. */
dm_status dm_cpu_row_map(const dm_graph *g, const dm_op *op, int t, int64_t cols, dm_operand *d);
/* Where a plan's tensors are: its arena (plan->arena_bytes), whose activations (the plan's
 * last activation_bytes, memplan.c) lie at `act`: arena + (arena_bytes - activation_bytes)
 * in one arena, or apart, in memory that layers whose passes never overlap share (the
 * encoder layers of a forward-only model: dm_layer_act_share). */
typedef struct {
    const dm_plan *plan;
    char *arena, *act;
} dm_cpu_mem;
/* The plan's memory with its activations at act (NULL: in the arena). */
dm_cpu_mem dm_cpu_mem_of(const dm_plan *plan, char *arena, char *act);
/* The address of tensor t there (views included), or NULL if not materialized. */
float *dm_cpu_mem_ptr(const dm_cpu_mem *m, int t);
/* Resolves every operand of the plan to arena addresses and prepares the GEMM calls. */
dm_status dm_cpu_exec_init(dm_cpu_exec *ex, const dm_plan *plan, char *arena, int nthreads);
/* The same with the activations at `act` (NULL: in the arena; dm_cpu_mem), and with
 * lenient as dm_cpu_exec_init_lenient's. */
dm_status dm_cpu_exec_init_apart(dm_cpu_exec *ex, const dm_plan *plan, char *arena, char *act, int nthreads,
                                 int lenient);
/* The same, but a group whose operand layouts it cannot run is marked unusable (and
 * fails if run) instead of failing the whole plan: the tuner measures the others. */
dm_status dm_cpu_exec_init_lenient(dm_cpu_exec *ex, const dm_plan *plan, char *arena, int nthreads);
void dm_cpu_exec_free(dm_cpu_exec *ex);
/* Contraction group gi (algorithm "direct_rows") takes the next group, a row group, into
 * its epilogue: each thread runs that group's ops on each block of its rows as soon as the
 * kernel has finished them, and the row group's own turn does nothing. DM_ERR_UNSUPPORTED
 * (with the reason) where that cannot give the same result: the next group is no plain row
 * group, does not read the GEMM's output row for row as its own rows, or writes memory
 * the GEMM reads. Called by dm_cpu_exec_init for the plan's marks. */
dm_status dm_cpu_exec_fuse_rows(dm_cpu_exec *ex, const dm_plan *plan, int gi);
/* only_contractions: run just the GEMMs (the "contractions alone" floor). A group with
 * the "concurrent" algorithm runs its partner too, and the partner's own turn does
 * nothing; so does a row group run in a "direct_rows" group's epilogue since its last
 * turn (with only_contractions that GEMM runs alone, and the row group, if run, on its
 * own). A profile then counts the row group's time with its GEMM's. */
dm_status dm_cpu_exec_group(const dm_cpu_exec *ex, int gi, uint64_t seed, int only_contractions);
/* unpad.c: a lone ATTN or ATTN_BWD group's operands (init_group's, for such a group). */
dm_status dm_cpu_exec_init_attn(dm_cpu_exec *ex, dm_exgroup *eg, const dm_plan *plan, const dm_cpu_mem *arena,
                                 const dm_op *op);
/* unpad.c: for a plan with live rows (graph.h's dm_graph.live: an unpadded layer's
 * tokens, the MLM head's scored rows), how each group scales with them: a row group's
 * rows (a gather's, a scatter's, the fused cross-entropy's too), a contraction's m, n or
 * k. An unpadded layer (ATTN) whose layouts keep a tensor's rows from being its first
 * fails (DM_ERR_UNSUPPORTED); another plan then just runs whole (set_rows says why).
 * Every group runs at full capacity until dm_cpu_exec_set_rows. */
dm_status dm_cpu_exec_init_tokens(dm_cpu_exec *ex, const dm_plan *plan, const dm_cpu_mem *arena);
/* The next steps run on `rows` live rows, or for an unpadded layer on the tokens of
 * sequences of these lengths (b floats, whole numbers in [0, j]) packed from row 0 (the
 * backend's set_rows). */
dm_status dm_cpu_exec_set_rows(dm_cpu_exec *ex, int64_t rows, const float *lengths);
/* After group gi ran: the rows past the tokens of the layer's outputs it wrote set to 0
 * (the output and the input gradient of an unpadded layer are defined everywhere). */
void dm_cpu_exec_zero_tail(const dm_cpu_exec *ex, int gi);
/* The address of tensor t in a plan's one arena (views included), or NULL if not materialized. */
float *dm_cpu_tensor_ptr(const dm_plan *plan, char *arena, int t);

#endif
