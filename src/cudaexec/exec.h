/* exec.h: the CUDA executor's state, shared by its files (src/cudaexec/):
 *   exec.cu      device memory, set-up and tear-down, running a group (cuBLAS calls, row
 *                programs, fused kernels), profiling by events
 *   build.cu     the plan's groups as steps: contractions as cuBLAS calls, row runs as row
 *                programs, tile temporaries, fp32 statistics, the generated kernels
 *   epilogue.cu  a contraction's bias in a cuBLASLt epilogue
 *   streams.cu   the second stream: which groups go there, hazards, joins; copies
 *                between executors ordered by events
 *   autosel.cu   --rows auto: each generated choice timed against what it replaces
 *   transfer.cu  host <-> device copies of tensors and the arena, in the storage type
 * Internal: nothing here is part of the C API (cuda/cuda_backend.h is). */
#ifndef DMOVE_CUDAEXEC_EXEC_H
#define DMOVE_CUDAEXEC_EXEC_H

#include "cuda/cuda_internal.h"

extern "C" {
#include "plan/live.h"
}

typedef struct {
    int gemm;    /* 1: a contraction (gm); 0: a row program (prog) */
    dm_gemm_map gm; /* device pointers */
    void **ptrs; /* device: B, A, C matrix addresses when the batch needs them, or NULL */
    int nptrs;   /* matrices in ptrs */
    int prog;    /* index into the executor's programs */
    int scatter; /* 1: an embedding gradient (sc; gemm 0, prog -1) */
    dmc_scatter sc; /* device pointers; its work space one allocation, `work` */
    int varlen;  /* 1: attention over packed sequences (vl; gemm 0, prog -1) */
    dmc_varlen vl; /* device pointers; its work space the executor's lone_work */
    int xent;    /* 1: the fused decoder and cross-entropy (xe; gemm 0, prog -1) */
    dmc_xent xe; /* device pointers; its work space the executor's lone_work */
    void *work;
    int ktail;   /* a contraction whose k was rounded up past the live rows (live.cu): rows
                  * [ktail, k) of A (transposed) and B are zeroed before it runs; 0: none */
} dmc_step;

/* Whether a step runs a row program (prog): none of the other kinds. */
static inline int dmx_step_rows(const dmc_step *st) { return !st->gemm && !st->scatter && !st->varlen && !st->xent; }

/* DM_CUDA_EPILOGUE: a contraction with the bias of the next group added by cuBLASLt. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l1, l2, ld; /* cuBLAS's first operand (gm.B), second (gm.A), D */
    cublasLtMatmulAlgo_t algo;
    int have_op, have_l1, have_l2, have_ld;
    const void *bias; /* the bias vector (n, storage type) */
    void *D;          /* the biased tensor: row-major m x n, ld gm.ldc */
} dmc_epi;

typedef struct {
    dmc_step *steps;
    int nsteps;
    dmc_epi *epi; /* the contraction runs with the next group's bias, or NULL */
    int skip;     /* the bias group that epi took over: nothing to run */
    int fused; /* 1 + the generated kernel that runs the group (dmc_attn), or 0 */
    int tail;  /* with fused: a step still run after the kernel (cuBLAS), or 0 */
} dmc_group;

/* The tile tensors of a batched group: roots not in memory, each a full-size temporary
 * at `off` floats into the executor's temp buffer. */
enum { DMC_MAX_TILES = 64 };
typedef struct {
    int root[DMC_MAX_TILES];
    int64_t off[DMC_MAX_TILES];
    int n;
    int64_t floats;
} dmc_tiles;

struct dm_cuda_exec {
    const dm_plan *plan;
    unsigned flags;
    int dtype;                /* DM_CUDA_FP32/BF16/FP16: the arena's storage type */
    int esz;                  /* its bytes per element */
    int row_threads;          /* most threads per block of a block-per-row program */
    char *wide;               /* per root: 1 if kept in fp32 in `side` (row statistics) */
    int64_t *side_off;        /* per root: its float offset in `side` */
    float *side;              /* device: the wide tensors (non-fp32 storage only) */
    size_t side_floats;
    int device;
    int smem_optin;           /* largest dynamic shared memory a block may use */
    cudaStream_t stream;
    cublasHandle_t blas;
    int have_stream, have_blas;
    char *arena;              /* device: tensor r at plan->offset[r] / 4 elements */
    size_t arena_bytes;       /* plan->arena_bytes: the plan's (fp32) arena size */
    char *temp;               /* device: tile tensors of batched groups (one group at a time) */
    size_t temp_floats;
    float *gscratch;          /* device: per-block scratch of programs too big for shared */
    size_t gscratch_floats;
    float *partials;          /* device: per-block partial column sums */
    size_t partial_floats;
    dmc_rowprog *hprogs;      /* host copies of the row programs */
    dmc_rowprog *dprogs;      /* device copies, same order */
    dmc_launch *launch;       /* per program */
    int nprogs, cap_progs;
    dmc_group *groups;
    int ngroups;
    dmc_gen *gen;             /* DM_CUDA_GEN: the generated row kernels */
    int *gen_of;              /* per program: its generated kernel, or -1 (interpreted) */
    int ngen;
    int nfused;               /* groups run as one fused kernel (dmc_attn) */
    int nflash;               /* ATTN and ATTN_BWD groups on flash.cu's kernels */
    char flash_note[160];     /* why an ATTN group does not, the first one's */
    char gen_note[512];       /* DM_CUDA_AUTO: why no generated kernel is used, if the build failed */
    /* DM_CUDA_OVERLAP: the second stream and what runs there */
    cudaStream_t side_stream;
    cublasHandle_t blas2;     /* its own handle (and workspace) */
    int have_side_stream, have_blas2;
    cudaEvent_t fork;         /* recorded on the main stream before a side launch */
    cudaEvent_t *done;        /* per group on the side: recorded after it */
    int have_fork, ndone;
    char *on_side;            /* per group: 1 if it runs on the side stream */
    int *pending;             /* side groups launched (emulating: deferred), oldest first */
    uint64_t *pending_seed;   /* emulating: the seed each deferred group runs with */
    int npending;
    float *side_partials;     /* the column-sum partials of row groups on the side stream */
    int64_t **spans;          /* per group: lo, hi, written (arena bytes of the fp32 plan) */
    int *nspans;
    /* DM_CUDA_EPILOGUE */
    cublasLtHandle_t lt;
    int have_lt, nepi;
    void *lt_ws;              /* cuBLASLt's workspace */
    size_t lt_ws_bytes;
    size_t dev_bytes;         /* device memory allocated for the plan, the arena included */
    char gpu[128];            /* the GPU's name ("" emulated, or if the driver would not say) */
    cudaEvent_t xfer;         /* dm_cuda_copy_tensor: recorded when this executor is a source */
    cudaEvent_t copied;       /* ... and when it is the destination, after the copy */
    int have_xfer, have_copied;
    dm_cuda_pool *pool;       /* where temp, gscratch and partials come from, or NULL */
    int pooled[4];            /* temp, gscratch, partials, attention work: borrowed from the pool (not freed) */
    void *lone_work;          /* the attention and fused cross-entropy steps' work space (varlen.cu,
                               * xent.cu), one for all of them */
    int evaluating;           /* dm_cuda_exec_set_training(0): dropout off, the interpreter alone */
    float *drop_scale;        /* per program, per op: its dropout scale while training */
    /* live rows (live.cu; plan/live.h): a step on fewer rows than the plan's */
    int64_t live_cap;         /* the live rows at full size; 0: every step runs whole */
    int64_t tokens;           /* this step's (set_rows) */
    int64_t live_round;       /* a contraction's m or n over the live rows runs on them rounded up
                               * to a multiple of this (DMOVE_CUDA_LIVE_ROUND, default 64; 1:
                               * exact): fewer shapes for cuBLAS to choose kernels for */
    int live_round_k;         /* and its k too, over zeroed rows (default; DMOVE_CUDA_LIVE_ROUND_K=0: exact) */
    int live_bj, live_attn;   /* live rows "bj" (dropout keyed by padded positions); an unpadded layer */
    dm_live_group *liveg;     /* per group: how it follows them */
    long long *livebuf;       /* device: this step's count, then at byte 256 the dropout keys (ints) */
    char *livehost;           /* its host copy */
    char live_why[256];       /* why the plan runs whole, if it has live rows */
    /* dm_cuda_exec_profile: per group a start and an end event on its stream */
    cudaEvent_t *prof_ev;     /* 2 per group (made on first use), NULL until then */
    int nprof_ev;             /* events made (a failure part way leaves fewer) */
    char *prof_rec;           /* per group: both events recorded since the last take */
    int prof_on;
};

/* A pool of main-stream buffers shared by executors whose main streams never run at
 * once (a trainer's layers: chained by events, dm_cuda_copy_tensor). */
enum { POOL_TEMP = 0, POOL_GSCRATCH = 1, POOL_PARTIALS = 2, POOL_LONE = 3, POOL_N = 4 };

struct dm_cuda_pool {
    int emulated;
    void *buf[POOL_N];
    size_t bytes[POOL_N];
};

/* Emulation (DM_CUDA_EMULATE, emulate.cu): "device" buffers are host memory. */
static inline int dmx_emulated(const dm_cuda_exec *ex) { return (ex->flags & DM_CUDA_EMULATE) != 0; }

static inline const dm_op *dmx_op_at(const dm_plan *plan, const dm_group *gr, int k) {
    return &plan->g->op[plan->order[gr->first + k]];
}

/* exec.cu */
dm_status dmx_dev_alloc(dm_cuda_exec *ex, void **p, size_t bytes, const char *what);
void dmx_dev_free(const dm_cuda_exec *ex, void *p);
dm_status dmx_dev_copy(const dm_cuda_exec *ex, void *dst, const void *src, size_t bytes,
                       cudaMemcpyKind kind);
dm_status dmx_stream_and_blas(const dm_cuda_exec *ex, cudaStream_t *st, int *have_st, cublasHandle_t *h,
                              int *have_h);
dm_status dmx_prof_mark(dm_cuda_exec *ex, int gi, int end, cudaStream_t st);
dm_status dmx_run_gemm(const dm_cuda_exec *ex, const dmc_step *st, cublasHandle_t blas);
dm_status dmx_run_steps(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows, int side);

/* build.cu */
void *dmx_arena_ptr(const dm_cuda_exec *ex, int t, int *dt);
dm_status dmx_group_tiles(const dm_plan *plan, const dm_group *gr, dmc_tiles *tl);
dm_status dmx_build_group(dm_cuda_exec *ex, int gi, dmc_tiles *tl);
dm_status dmx_init_wide(dm_cuda_exec *ex);
dm_status dmx_init_gen(dm_cuda_exec *ex);

/* epilogue.cu */
dm_status dmx_init_epilogues(dm_cuda_exec *ex);
dm_status dmx_run_epi(const dm_cuda_exec *ex, const dmc_group *eg);
void dmx_epi_free(dmc_epi *e);

/* streams.cu */
dm_status dmx_init_overlap(dm_cuda_exec *ex);
dm_status dmx_join_all(dm_cuda_exec *ex);
dm_status dmx_resolve_hazards(dm_cuda_exec *ex, int h);
dm_status dmx_launch_side(dm_cuda_exec *ex, int gi, uint64_t seed);

/* live.cu: how the groups follow the live rows (after the groups are built, before the
 * generated kernels and epilogues); whether group gi does; its outputs zeroed past them */
dm_status dmx_init_live(dm_cuda_exec *ex);
int dmx_live_scaled(const dm_cuda_exec *ex, int gi);
dm_status dmx_zero_tail(const dm_cuda_exec *ex, int gi, cudaStream_t stream);

/* autosel.cu */
dm_status dmx_auto_select(dm_cuda_exec *ex);

/* transfer.cu: host fp32 <-> the storage type dt */
void dmx_narrow(int dt, const float *src, void *dst, size_t n);
void dmx_widen(int dt, const void *src, float *dst, size_t n);

#endif
