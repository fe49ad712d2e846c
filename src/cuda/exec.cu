/* exec.cu: the CUDA group executor, shaped like the CPU one (cpu/exec.c) and driven by
 * the same dm_plan: the same groups in the same order, every materialized tensor at its
 * memplan offset in one device arena (fp32).
 *
 * - A lone contraction is one dm_gemm (cpu/contract.c: dm_gemm_prepare only does pointer
 *   arithmetic, so it is given device pointers) run by cuBLAS: the row-major call
 *   C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the operands are
 *   swapped; batch dimensions whose strides merge become one strided-batched call, any
 *   others are looped over on the host. fp32 compute (CUBLAS_COMPUTE_32F); TF32 only when
 *   asked for (DM_CUDA_TF32).
 * - A row group (element-wise and normalization ops over one rows x cols space) is one
 *   row program run by the generic row kernel (rows.cu); tensors internal to the group
 *   are rows of the block's scratch, as the CPU's per-thread scratch rows.
 * - A batched group (attention: QK^T, mask, softmax, dropout, .V per (b, h)) runs here
 *   NOT flash-style: each contraction over the whole batch (one cuBLAS call) into a
 *   temporary device tensor for each tile tensor a GEMM touches (full size, in a buffer
 *   shared by the batched groups), and each run of row ops as one row program over all
 *   rows, its own intermediates in scratch. Correct, but it moves the score matrices
 *   through global memory that the CPU keeps in per-thread tiles.
 * Every CUDA and cuBLAS call is checked (DMC_CUDA, DMC_BLAS: DM_ERR_BACKEND with the
 * library's words). DM_CUDA_EMULATE runs the same executor on host memory (emulate.cu),
 * so tests check this file's mapping of the plan on machines without a GPU. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_internal.h"

extern "C" {
#include "core/philox.h"
}

typedef struct {
    int gemm;    /* 1: a contraction (gm); 0: a row program (prog) */
    dm_gemm gm;  /* device pointers */
    void **ptrs; /* device: B, A, C matrix addresses when the batch needs them, or NULL */
    int nptrs;   /* matrices in ptrs */
    int prog;    /* index into the executor's programs */
} dmc_step;

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
    int pooled[3];            /* temp, gscratch, partials: borrowed from the pool (not freed) */
    /* dm_cuda_exec_profile: per group a start and an end event on its stream */
    cudaEvent_t *prof_ev;     /* 2 per group (made on first use), NULL until then */
    int nprof_ev;             /* events made (a failure part way leaves fewer) */
    char *prof_rec;           /* per group: both events recorded since the last take */
    int prof_on;
};

/* --- a pool of main-stream buffers shared by executors whose main streams never run at
 * once (a trainer's layers: chained by events, dm_cuda_copy_tensor) ----------------- */

enum { POOL_TEMP = 0, POOL_GSCRATCH = 1, POOL_PARTIALS = 2 };

struct dm_cuda_pool {
    int emulated;
    void *buf[3];
    size_t bytes[3];
};

dm_status dm_cuda_pool_new(dm_cuda_pool **out, int emulated) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_pool_new: NULL argument");
    *out = (dm_cuda_pool *)calloc(1, sizeof **out);
    if (!*out) return dm_fail(DM_ERR_OOM, "out of memory");
    (*out)->emulated = emulated != 0;
    return DM_OK;
}

size_t dm_cuda_pool_bytes(const dm_cuda_pool *p) {
    return p ? p->bytes[0] + p->bytes[1] + p->bytes[2] : 0;
}

/* Emulation (DM_CUDA_EMULATE, emulate.cu): "device" buffers are host memory. */
static int emulated(const dm_cuda_exec *ex) { return (ex->flags & DM_CUDA_EMULATE) != 0; }
static void mem_free(int emulating, void *p) {
    if (emulating) free(p);
    else if (p) (void)cudaFree(p);
}

void dm_cuda_pool_free(dm_cuda_pool *p) {
    if (!p) return;
    for (int k = 0; k < 3; k++) mem_free(p->emulated, p->buf[k]);
    free(p);
}

static dm_status dev_alloc(dm_cuda_exec *ex, void **p, size_t bytes, const char *what) {
    if (bytes == 0) bytes = 256;
    ex->dev_bytes += bytes;
    if (emulated(ex)) { /* 256-byte aligned and zeroed, as cudaMalloc's (plus the memset) */
        size_t n = (bytes + 255) / 256 * 256;
        *p = n >= bytes ? aligned_alloc(256, n) : NULL;
        if (!*p) return dm_fail(DM_ERR_OOM, "out of memory emulating the GPU's %s", what);
        memset(*p, 0, n);
        return DM_OK;
    }
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        return dm_fail(DM_ERR_OOM, "cannot allocate %.3f GiB of GPU memory for %s (cudaMalloc: "
                       "%s): reduce batch or sequence length", (double)bytes / (1 << 30), what,
                       cudaGetErrorString(e));
    }
    return DM_OK;
}

static void dev_free(const dm_cuda_exec *ex, void *p) { mem_free(emulated(ex), p); }

/* Main-stream buffer k (POOL_*) of `bytes` for ex: its pool's where there is one of the
 * same kind of memory (made by the first executor to ask, of its size, and counted by the
 * pool, not by ex) and it holds that many; else ex's own. */
static dm_status main_alloc(dm_cuda_exec *ex, int k, void **p, size_t bytes, const char *what) {
    dm_cuda_pool *pool = ex->pool;
    if (pool && pool->emulated == emulated(ex)) {
        if (!pool->buf[k]) {
            const size_t before = ex->dev_bytes;
            DM_TRY(dev_alloc(ex, &pool->buf[k], bytes, what));
            ex->dev_bytes = before;
            pool->bytes[k] = bytes;
        }
        if (pool->bytes[k] >= bytes) {
            *p = pool->buf[k];
            ex->pooled[k] = 1;
            return DM_OK;
        }
    }
    return dev_alloc(ex, p, bytes, what);
}

/* A synchronous copy between host and device (or host and host, emulating). */
static dm_status dev_copy(const dm_cuda_exec *ex, void *dst, const void *src, size_t bytes,
                          cudaMemcpyKind kind) {
    if (!bytes) return DM_OK;
    if (emulated(ex)) {
        memcpy(dst, src, bytes);
        return DM_OK;
    }
    DMC_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, ex->stream));
    DMC_CUDA(cudaStreamSynchronize(ex->stream));
    return DM_OK;
}

/* every "no device" message ends by saying what works without one */
#define NO_DEVICE_HINT " (without a GPU, run on the CPU: --device cpu, the default)"

dm_status dm_cuda_available(char *why, size_t n) {
    char buf[256];
    if (!why || n == 0) {
        why = buf;
        n = sizeof buf;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        /* the runtime's words for "no driver" mislead: say what they usually mean */
        const char *hint = e == cudaErrorInsufficientDriver
                               ? ": no NVIDIA driver is loaded, or it is older than this CUDA runtime"
                           : e == cudaErrorNoDevice ? ": no NVIDIA GPU is visible" : "";
        snprintf(why, n, "cudaGetDeviceCount failed: %s (%s)%s", cudaGetErrorString(e),
                 cudaGetErrorName(e), hint);
        (void)cudaGetLastError(); /* clear it: later calls should not see it */
        return dm_fail(DM_ERR_BACKEND, "no usable CUDA device: %s" NO_DEVICE_HINT, why);
    }
    if (count < 1) {
        snprintf(why, n, "cudaGetDeviceCount found no CUDA device");
        return dm_fail(DM_ERR_BACKEND, "no usable CUDA device: %s" NO_DEVICE_HINT, why);
    }
    int dev = 0;
    cudaDeviceProp prop;
    e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        snprintf(why, n, "cudaGetDeviceProperties failed: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return dm_fail(DM_ERR_BACKEND, "no usable CUDA device: %s" NO_DEVICE_HINT, why);
    }
    /* the kernels are built for sm_80 and sm_90 (plus compute_90 PTX for newer GPUs) */
    if (prop.major < 8) {
        snprintf(why, n, "device %d (%s) has compute capability %d.%d; dmove's CUDA kernels "
                 "are built for 8.0 (A100) and newer", dev, prop.name, prop.major, prop.minor);
        return dm_fail(DM_ERR_BACKEND, "no usable CUDA device: %s" NO_DEVICE_HINT, why);
    }
    snprintf(why, n, "device %d: %s, compute capability %d.%d, %.1f GiB", dev, prop.name,
             prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30));
    return DM_OK;
}

/* 1 if x is dense and row-major in its logical letter order (size-1 letters aside): the
 * row kernel addresses rows as base + r * cols. Other layouts (the tuner's) are not run
 * by the CUDA row kernel yet; contractions take any layout through their strides. */
static int dense_rowmajor(const dm_tensor *x) {
    int64_t want = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        if (x->size[d] == 1) continue;
        if (x->stride[d] != want) return 0;
        want *= x->size[d];
    }
    return 1;
}

/* The op kinds the row kernel (rows.cu) implements: anything else fails at init rather
 * than leaving its outputs unwritten. */
static int row_kind_supported(dm_op_kind k) {
    switch (k) {
    case DM_OP_BIAS_ADD: case DM_OP_ADD: case DM_OP_MASK_ADD: case DM_OP_SOFTMAX:
    case DM_OP_DROPOUT: case DM_OP_ACT: case DM_OP_LAYERNORM: case DM_OP_DROPOUT_BWD:
    case DM_OP_ACT_BWD: case DM_OP_SOFTMAX_BWD: case DM_OP_LAYERNORM_BWD: case DM_OP_COLSUM:
    case DM_OP_ACT_DERIV: case DM_OP_MUL: case DM_OP_DROPOUT_BWD_NZ:
        return 1;
    default:
        return 0;
    }
}

static const dm_op *op_at(const dm_plan *plan, const dm_group *gr, int k) {
    return &plan->g->op[plan->order[gr->first + k]];
}

/* Device address of tensor t's first element (views included) and its element type;
 * NULL if not materialized. The plan's byte offsets are for fp32: in a 2-byte storage
 * type the arena keeps the same element offsets in half the bytes. */
static void *arena_ptr(const dm_cuda_exec *ex, int t, int *dt) {
    const dm_graph *g = ex->plan->g;
    int r = dm_tensor_root(g, t);
    if (ex->plan->offset[r] < 0) return NULL;
    if (ex->wide && ex->wide[r]) {
        *dt = DMC_F32;
        return ex->side + ex->side_off[r] + g->t[t].offset;
    }
    *dt = ex->dtype;
    return ex->arena + (ex->plan->offset[r] / 4 + g->t[t].offset) * ex->esz;
}

static void *tile_ptr(const dm_cuda_exec *ex, const dmc_tiles *tl, int t, int *dt) {
    const dm_graph *g = ex->plan->g;
    int r = dm_tensor_root(g, t);
    *dt = ex->dtype;
    for (int q = 0; q < tl->n; q++)
        if (tl->root[q] == r) return ex->temp + (tl->off[q] + g->t[t].offset) * ex->esz;
    return NULL;
}

/* The row run op k of a batched group belongs to (as build_group splits the group: a
 * contraction alone, or consecutive row ops over one iteration space); contractions -1. */
static int run_of(const dm_plan *plan, const dm_group *gr, int k) {
    int run = 0;
    for (int q = 1; q <= k; q++) {
        const dm_op *a = op_at(plan, gr, q - 1), *b = op_at(plan, gr, q);
        if (a->kind == DM_OP_CONTRACT || b->kind == DM_OP_CONTRACT || a->rows != b->rows ||
            a->cols != b->cols)
            run++;
    }
    return op_at(plan, gr, k)->kind == DM_OP_CONTRACT ? -1 : run;
}

/* The tiles of a batched group: every root not in memory that a contraction of the group
 * touches, or that row ops of two runs share. A root only one run touches lives in that
 * run's scratch (build_prog, run_private) and needs none. */
static dm_status group_tiles(const dm_plan *plan, const dm_group *gr, dmc_tiles *tl) {
    const dm_graph *g = plan->g;
    memset(tl, 0, sizeof *tl);
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = op_at(plan, gr, k);
        for (int s = 0; s < op->nin + op->nout; s++) {
            int r = dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]);
            if (plan->in_memory[r]) continue;
            int known = 0, rk = run_of(plan, gr, k), shared = rk < 0;
            for (int q = 0; q < tl->n; q++) known |= tl->root[q] == r;
            if (known) continue;
            for (int k2 = 0; k2 < gr->nops && !shared; k2++) {
                if (k2 == k || run_of(plan, gr, k2) == rk) continue;
                const dm_op *o2 = op_at(plan, gr, k2);
                for (int s2 = 0; s2 < o2->nin + o2->nout; s2++)
                    shared |= dm_tensor_root(g, s2 < o2->nin ? o2->in[s2] : o2->out[s2 - o2->nin]) == r;
            }
            if (!shared) continue;
            if (tl->n >= DMC_MAX_TILES)
                return dm_fail(DM_ERR_INTERNAL, "batched group of %s: more than %d tile tensors",
                               op_at(plan, gr, 0)->name, DMC_MAX_TILES);
            tl->root[tl->n] = r;
            tl->off[tl->n] = tl->floats;
            tl->floats += (g->t[r].numel + 63) / 64 * 64; /* 128-byte aligned or more */
            tl->n++;
        }
    }
    return DM_OK;
}

static dm_status new_prog(dm_cuda_exec *ex, int *pi) {
    if (ex->nprogs == ex->cap_progs) {
        int cap = ex->cap_progs ? 2 * ex->cap_progs : 32;
        dmc_rowprog *p = (dmc_rowprog *)realloc(ex->hprogs, sizeof(dmc_rowprog) * (size_t)cap);
        if (!p) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
        ex->hprogs = p;
        dmc_launch *l = (dmc_launch *)realloc(ex->launch, sizeof(dmc_launch) * (size_t)cap);
        if (!l) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
        ex->launch = l;
        ex->cap_progs = cap;
    }
    *pi = ex->nprogs++;
    memset(&ex->hprogs[*pi], 0, sizeof(dmc_rowprog));
    memset(&ex->launch[*pi], 0, sizeof(dmc_launch));
    return DM_OK;
}

/* 1 if root r is touched by no op of group gr outside ops [k0, k1) (a batched group's
 * row run): it can then live in the block's scratch rather than in a tile. */
static int run_private(const dm_plan *plan, const dm_group *gr, int k0, int k1, int r) {
    const dm_graph *g = plan->g;
    for (int k = 0; k < gr->nops; k++) {
        if (k >= k0 && k < k1) continue;
        const dm_op *op = op_at(plan, gr, k);
        for (int s = 0; s < op->nin + op->nout; s++)
            if (dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]) == r) return 0;
    }
    return 1;
}

/* The row program of ops [k0, k1) of group gr (same rows x cols). tl: the group's tiles
 * (batched groups: every tensor not in memory is a full temporary), or NULL (row groups:
 * such tensors are rows of the block's scratch). Mirrors init_group in cpu/exec.c. */
static dm_status build_prog(dm_cuda_exec *ex, const dm_group *gr, int k0, int k1,
                            const dmc_tiles *tl, int *pi) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const dm_op *op0 = op_at(plan, gr, k0);
    if (k1 - k0 > DMC_MAX_ROWOPS)
        return dm_fail(DM_ERR_UNSUPPORTED, "group of %s: %d fused row ops; the CUDA backend runs "
                       "at most %d in one kernel", op0->name, k1 - k0, DMC_MAX_ROWOPS);
    DM_TRY(new_prog(ex, pi));
    dmc_rowprog *p = &ex->hprogs[*pi];
    const int64_t rows = op0->rows, cols = op0->cols;
    const int64_t cols_pad = (cols + 31) / 32 * 32; /* 128-byte aligned scratch rows */
    if (rows < 1 || cols < 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: empty iteration space", op0->name);
    int slot_root[DM_MAX_IN * DMC_MAX_ROWOPS];
    int nsl = 0;
    for (int k = k0; k < k1; k++) {
        const dm_op *op = op_at(plan, gr, k);
        dmc_rowop *x = &p->ops[k - k0];
        if (op->kind == DM_OP_CONTRACT || op->rows != rows || op->cols != cols)
            return dm_fail(DM_ERR_INTERNAL, "%s: not a row op of %s's iteration space", op->name,
                           op0->name);
        if (!row_kind_supported(op->kind))
            return dm_fail(DM_ERR_UNSUPPORTED, "%s: the CUDA backend has no kernel for op kind '%s' yet",
                           op->name, dm_op_kind_name(op->kind));
        x->kind = op->kind;
        x->nin = op->nin;
        x->nout = op->nout;
        x->act = op->act;
        x->stream = (uint32_t)op->stream;
        x->drop_on = op->p > 0;
        x->drop_thr = dm_dropout_threshold(op->p);
        x->drop_scale = op->p > 0 ? (float)(1.0 / (1.0 - op->p)) : 1.0f;
        x->causal = op->causal;
        x->eps = op->eps;
        for (int io = 0; io < 2; io++) {
            int n = io ? op->nout : op->nin;
            for (int s = 0; s < n; s++) {
                int t = io ? op->out[s] : op->in[s];
                dmc_operand *d = io ? &x->out[s] : &x->in[s];
                dm_arg_kind kind = io ? dm_arg_out(op->kind, s) : dm_arg_in(op->kind, s);
                d->kind = kind;
                int r = dm_tensor_root(g, t);
                /* in a batched group, a tensor only these row ops touch stays in scratch;
                 * one a GEMM or another run of the group touches is a tile */
                const int global = plan->in_memory[r] || (tl && !run_private(plan, gr, k0, k1, r));
                if (global && !dense_rowmajor(&g->t[t]))
                    return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s is not in the default "
                                   "(row-major) layout, which the CUDA row kernel needs so far (a "
                                   "plan from `dmove tune` chooses layouts for the CPU: leave out "
                                   "--plan with --device cuda)", op->name, g->t[t].name);
                if (kind == DM_ARG_COLACC) {
                    if (tl)
                        return dm_fail(DM_ERR_INTERNAL, "%s: column reduction inside a batched group",
                                       op->name);
                    if (p->nacc >= DMC_MAX_ACC)
                        return dm_fail(DM_ERR_UNSUPPORTED, "%s: more than %d column reductions in "
                                       "one group", op->name, DMC_MAX_ACC);
                    int dt = DMC_F32;
                    void *dst = arena_ptr(ex, t, &dt);
                    if (!dst || g->t[t].numel != cols)
                        return dm_fail(DM_ERR_INTERNAL, "%s: bad column reduction output", op->name);
                    d->loc = DMC_LOC_SCRATCH;
                    d->slot = p->nacc * cols_pad; /* shifted past the rows below */
                    p->acc_dst[p->nacc] = dst;
                    p->acc_dt[p->nacc] = dt;
                    p->acc_slot[p->nacc] = d->slot;
                    p->nacc++;
                    continue;
                }
                int64_t need = kind == DM_ARG_ROWSCALAR ? rows : kind == DM_ARG_COLVEC ? cols
                                                                                       : rows * cols;
                if (kind == DM_ARG_GROUPED) {
                    int64_t G = g->t[t].numel / cols;
                    if (G < 1 || g->t[t].numel % cols || rows % G)
                        return dm_fail(DM_ERR_INTERNAL, "%s: operand %s does not tile the rows",
                                       op->name, g->t[t].name);
                    d->rdiv = rows / G;
                    need = g->t[t].numel;
                }
                if (g->t[t].numel != need)
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s has %lld elements, expected %lld",
                                   op->name, g->t[t].name, (long long)g->t[t].numel, (long long)need);
                if (global) {
                    d->loc = DMC_LOC_GLOBAL;
                    d->tensor = r;
                    d->base = plan->in_memory[r] ? arena_ptr(ex, t, &d->dt) : tile_ptr(ex, tl, t, &d->dt);
                    if (!d->base)
                        return dm_fail(DM_ERR_INTERNAL, "%s: %s has no device memory", op->name,
                                       g->t[t].name);
                    continue;
                }
                /* internal to the group: a row of the block's scratch, one per root */
                int q = 0;
                while (q < nsl && slot_root[q] != r) q++;
                if (q == nsl) {
                    if (nsl >= (int)(sizeof slot_root / sizeof slot_root[0]))
                        return dm_fail(DM_ERR_INTERNAL, "too many scratch rows");
                    slot_root[nsl++] = r;
                }
                d->loc = DMC_LOC_SCRATCH;
                d->slot = q * cols_pad;
            }
        }
    }
    p->nops = k1 - k0;
    p->rows = rows;
    p->cols = cols;
    p->acc_off = nsl * cols_pad;
    p->acc_floats = p->nacc * cols_pad;
    for (int k = 0; k < p->nops; k++)
        for (int s = 0; s < p->ops[k].nout; s++)
            if (p->ops[k].out[s].kind == DM_ARG_COLACC) p->ops[k].out[s].slot += p->acc_off;
    for (int a = 0; a < p->nacc; a++) p->acc_slot[a] += p->acc_off;
    p->scratch_floats = p->acc_off + p->acc_floats;

    /* vec: 16-byte chunks are possible when every global row starts 16-byte aligned */
    p->vec = 1;
    for (int k = 0; k < p->nops; k++)
        for (int io = 0; io < 2; io++) {
            const dmc_rowop *x = &p->ops[k];
            for (int s = 0; s < (io ? x->nout : x->nin); s++) {
                const dmc_operand *d = io ? &x->out[s] : &x->in[s];
                if (d->loc != DMC_LOC_GLOBAL || d->kind == DM_ARG_ROWSCALAR) continue;
                int es = d->dt == DMC_F32 ? 4 : 2;
                if ((uintptr_t)d->base % 16 || (cols * es) % 16) p->vec = 0;
                if (d->dt != DMC_F32 && d->dt != ex->dtype)
                    return dm_fail(DM_ERR_INTERNAL, "a row operand in neither fp32 nor the "
                                   "storage type");
            }
        }
    /* Launch shape. Chunks of 8 columns per thread. Rows of at most 64 chunks without
     * column sums: a row per team of 8, 16 or 32 lanes (a lane per chunk, two at most),
     * 256 threads per block. Otherwise a row per block with a thread per chunk (32 up to
     * row_threads). The grid is a fixed function of the plan (and DMOVE_CUDA_ROW_THREADS),
     * so column sums add their per-block partials in the same order on every run. */
    dmc_launch *lc = &ex->launch[*pi];
    const int64_t chunks = (cols + 7) / 8;
    p->warp_rows = chunks > 64 || p->nacc ? 0 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    if (p->warp_rows) {
        const int teams = 256 / p->warp_rows; /* rows a block runs at once */
        lc->threads = 256;
        p->scratch_floats = teams * p->acc_off; /* acc_off: one row's scratch */
        int64_t nb = (rows + teams - 1) / teams;
        lc->blocks = (int)(nb < 16384 ? nb : 16384);
    } else {
        int64_t t = (chunks + 31) / 32 * 32;
        lc->threads = (int)(t < ex->row_threads ? t : ex->row_threads);
        int64_t maxb = p->nacc ? 2048 : 16384;
        lc->blocks = (int)(rows < maxb ? rows : maxb);
    }
    lc->dt = ex->dtype;
    size_t bytes = (size_t)p->scratch_floats * sizeof(float);
    lc->global_scratch = (ex->flags & DM_CUDA_GLOBAL_SCRATCH) || bytes > (size_t)ex->smem_optin;
    lc->smem_bytes = lc->global_scratch ? 0 : bytes;
    /* global scratch is blocks x scratch bytes: fewer blocks, still a function of the plan */
    if (lc->global_scratch && lc->blocks > 1024) lc->blocks = 1024;
    return DM_OK;
}

static dm_status gemm_pointer_arrays(dm_cuda_exec *ex, dmc_step *st);

static dm_status build_group(dm_cuda_exec *ex, int gi, dmc_tiles *tl) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[gi];
    dmc_group *eg = &ex->groups[gi];
    eg->steps = (dmc_step *)calloc((size_t)(gr->nops > 0 ? gr->nops : 1), sizeof(dmc_step));
    if (!eg->steps) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    const int batched = gr->nbatch > 1;
    if (batched) DM_TRY(group_tiles(plan, gr, tl));
    int k = 0;
    while (k < gr->nops) {
        const dm_op *op = op_at(plan, gr, k);
        dmc_step *st = &eg->steps[eg->nsteps];
        if (op->kind == DM_OP_CONTRACT) {
            if (!batched && gr->nops != 1)
                return dm_fail(DM_ERR_INTERNAL, "%s: a contraction fused with other ops outside a "
                               "batched group", op->name);
            void *p[3];
            int ts[3] = {op->in[0], op->in[1], op->out[0]};
            for (int s = 0; s < 3; s++) {
                int r = dm_tensor_root(g, ts[s]), dt = DMC_F32;
                p[s] = plan->in_memory[r] ? arena_ptr(ex, ts[s], &dt)
                       : batched           ? tile_ptr(ex, tl, ts[s], &dt)
                                           : NULL;
                if (!p[s])
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s has no device memory", op->name,
                                   g->t[ts[s]].name);
                if (dt != ex->dtype)
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s is not in the storage type",
                                   op->name, g->t[ts[s]].name);
            }
            /* dm_gemm_prepare does float pointer arithmetic from the operands' first
             * elements: its results are turned back into element offsets, and those into
             * device addresses of the storage type */
            DM_TRY(dm_gemm_prepare(&st->gm, g, op, (float *)p[0], (float *)p[1], (float *)p[2]));
            {
                /* swapped: gm's A is the op's second input, its B the first */
                char *pa = (char *)p[st->gm.swapped ? 1 : 0], *pb = (char *)p[st->gm.swapped ? 0 : 1];
                st->gm.A = (float *)(pa + (st->gm.A - (float *)pa) * ex->esz);
                st->gm.B = (float *)(pb + (st->gm.B - (float *)pb) * ex->esz);
                st->gm.C = (float *)((char *)p[2] + (st->gm.C - (float *)p[2]) * ex->esz);
            }
            st->gemm = 1;
            eg->nsteps++; /* first: dm_cuda_exec_free frees ptrs of counted steps */
            DM_TRY(gemm_pointer_arrays(ex, st));
            k++;
            continue;
        }
        /* a run of row ops over one iteration space */
        int k1 = k + 1;
        while (k1 < gr->nops) {
            const dm_op *o2 = op_at(plan, gr, k1);
            if (o2->kind == DM_OP_CONTRACT || o2->rows != op->rows || o2->cols != op->cols) break;
            k1++;
        }
        /* outside batched groups, scratch rows cannot cross kernels: the run must be the
         * whole group, over the group's iteration space */
        if (!batched && (k != 0 || k1 != gr->nops || op->rows != gr->rows || op->cols != gr->cols))
            return dm_fail(DM_ERR_INTERNAL, "group of %s: ops over different iteration spaces",
                           op->name);
        DM_TRY(build_prog(ex, gr, k, k1, batched ? tl : NULL, &st->prog));
        st->gemm = 0;
        eg->nsteps++;
        k = k1;
    }
    return DM_OK;
}

/* Non-fp32 storage: the tensors that only row ops touch as row scalars (LayerNorm's mean
 * and rstd, saved for backward) stay fp32, in the side buffer: statistics in fp32. */
static dm_status init_wide(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    ex->wide = (char *)calloc((size_t)g->nt, 1);
    ex->side_off = (int64_t *)calloc((size_t)g->nt, sizeof(int64_t));
    char *no = (char *)calloc((size_t)g->nt, 1);
    if (!ex->wide || !ex->side_off || !no) {
        free(no);
        return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    }
    for (int o = 0; o < g->nop; o++) {
        const dm_op *op = &g->op[o];
        for (int s = 0; s < op->nin + op->nout; s++) {
            int t = s < op->nin ? op->in[s] : op->out[s - op->nin];
            int r = dm_tensor_root(g, t);
            dm_arg_kind k = op->kind == DM_OP_CONTRACT ? DM_ARG_FULL
                            : s < op->nin              ? dm_arg_in(op->kind, s)
                                                       : dm_arg_out(op->kind, s - op->nin);
            if (k == DM_ARG_ROWSCALAR) ex->wide[r] = 1;
            else no[r] = 1;
        }
    }
    ex->side_floats = 0;
    for (int r = 0; r < g->nt; r++) {
        ex->wide[r] = ex->wide[r] && !no[r] && g->t[r].base < 0 && plan->offset[r] >= 0;
        if (!ex->wide[r]) continue;
        ex->side_off[r] = (int64_t)ex->side_floats;
        ex->side_floats += (size_t)(g->t[r].numel + 63) / 64 * 64;
    }
    free(no);
    if (!ex->side_floats) return DM_OK;
    DM_TRY(dev_alloc(ex, (void **)&ex->side, ex->side_floats * sizeof(float), "row statistics"));
    if (!emulated(ex)) /* emulated memory comes zeroed from dev_alloc */
        DMC_CUDA(cudaMemsetAsync(ex->side, 0, ex->side_floats * sizeof(float), ex->stream));
    return DM_OK;
}

/* Group gi as one fused kernel (dmc_attn): steps GEMM, row program, GEMM (and a GEMM
 * more), the first GEMM's output a tile the row ops read, the others' A operand one they
 * write (the second's plain, the third's transposed: P^T), row r of both being row r % m
 * of batch item r / m of the GEMMs. 0 if not (or not 16-bit storage). */
static int attn_pattern(const dm_cuda_exec *ex, int gi, dmc_attn *a) {
    const dmc_group *eg = &ex->groups[gi];
    if (ex->dtype == DM_CUDA_FP32 || ex->plan->groups[gi].nbatch <= 1) return 0;
    if (eg->nsteps != 3 && eg->nsteps != 4) return 0;
    const dmc_step *s0 = &eg->steps[0], *s1 = &eg->steps[1], *s2 = &eg->steps[2];
    if (!s0->gemm || s1->gemm || !s2->gemm || (eg->nsteps == 4 && !eg->steps[3].gemm)) return 0;
    memset(a, 0, sizeof *a);
    a->prog = &ex->hprogs[s1->prog];
    a->g1 = s0->gm;
    a->g2 = s2->gm;
    a->has3 = eg->nsteps == 4;
    if (a->has3) { /* the plain one is GEMM 2, the transposed one GEMM 3 */
        a->g3 = eg->steps[3].gm;
        a->tail_step = 3;
        if (a->g2.transA) {
            a->tail_step = 2;
            dm_gemm t = a->g2;
            a->g2 = a->g3;
            a->g3 = t;
        }
    }
    a->dt = ex->dtype;
    a->smem_max = (size_t)ex->smem_optin;
    const dm_gemm *g1 = &a->g1, *g2 = &a->g2, *g3 = &a->g3;
    const char *temp_end = ex->temp + ex->temp_floats * (size_t)ex->esz;
    const int s_tile = (const char *)g1->C >= ex->temp && (const char *)g1->C < temp_end;
    a->p_in_memory = !((const char *)g2->A >= ex->temp && (const char *)g2->A < temp_end);
    if (!s_tile || g1->beta != 0.0f || g2->beta != 0.0f || g2->transA) return 0;
    const int64_t cols = a->prog->cols;
    if (g1->n != cols || g1->ldc != cols || g2->k != cols || g2->lda != cols || g2->m != g1->m) return 0;
    if (a->has3 && (g3->A != g2->A || !g3->transA || g3->beta != 0.0f || g3->lda != cols || g3->k != g1->m))
        return 0;
    dmc_gemm_batches(g1, &a->b1);
    dmc_gemm_batches(g2, &a->b2);
    if (a->has3) dmc_gemm_batches(g3, &a->b3);
    if (a->b1.count != a->b2.count || a->prog->rows != a->b1.count * g1->m) return 0;
    if (a->has3 && a->b3.count != a->b1.count) return 0;
    for (int64_t q = 0; q < a->b1.count; q++) {
        int64_t oa, ob, oc;
        dmc_batch_offsets(&a->b1, q, &oa, &ob, &oc);
        if (oc != q * g1->m * cols) return 0;
        dmc_batch_offsets(&a->b2, q, &oa, &ob, &oc);
        if (oa != q * g1->m * cols) return 0;
        if (!a->has3) continue;
        dmc_batch_offsets(&a->b3, q, &oa, &ob, &oc);
        if (oa != q * g1->m * cols) return 0;
    }
    return 1;
}

/* DM_CUDA_GEN: every program the generator takes (gen.cu: row reductions over at most
 * 2048 columns, ...) runs as a kernel of its own, and every batched group of attention's
 * shapes (forward; backward when an item's rows fit a block) as one fused kernel (unless
 * DMOVE_CUDA_FUSE=0), compiled here in one NVRTC program; the rest stay with the
 * interpreter and cuBLAS (DMOVE_CUDA_DUMP=FILE writes the generated source). */
static dm_status init_gen(dm_cuda_exec *ex) {
    const size_t np = (size_t)(ex->nprogs > 0 ? ex->nprogs : 1), ng = (size_t)(ex->ngroups > 0 ? ex->ngroups : 1);
    ex->gen_of = (int *)malloc(sizeof(int) * np);
    const dmc_rowprog **list = (const dmc_rowprog **)malloc(sizeof(void *) * np);
    dmc_attn *attns = (dmc_attn *)malloc(sizeof(dmc_attn) * ng);
    int *attn_group = (int *)malloc(sizeof(int) * ng);
    char *in_attn = (char *)calloc(np, 1);
    if (!ex->gen_of || !list || !attns || !attn_group || !in_attn) {
        free(list);
        free(attns);
        free(attn_group);
        free(in_attn);
        return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    }
    int na = 0;
    const char *fz = getenv("DMOVE_CUDA_FUSE"); /* =0: no fused attention kernels */
    for (int gi = 0; gi < ex->ngroups && !(fz && !strcmp(fz, "0")); gi++) {
        if (!attn_pattern(ex, gi, &attns[na])) continue;
        int tail = 0;
        if (dmc_gen_attn_eligible(&attns[na]) != DM_OK) {
            /* an item's rows too many for one block: the kernel stores P (attention's
             * d scores) to its tile, and GEMM 3 runs after it, by cuBLAS */
            if (!attns[na].has3) continue;
            attns[na].has3 = 0;
            attns[na].p_in_memory = 1;
            if (dmc_gen_attn_eligible(&attns[na]) != DM_OK) continue;
            tail = attns[na].tail_step;
        }
        in_attn[ex->groups[gi].steps[1].prog] = 1;
        ex->groups[gi].tail = tail;
        attn_group[na++] = gi;
    }
    ex->ngen = 0;
    for (int i = 0; i < ex->nprogs; i++) {
        ex->gen_of[i] = -1;
        /* a program inside a fused kernel gets a kernel of its own only for auto, which
         * may find cuBLAS around it faster than the fused kernel */
        if ((in_attn[i] && !(ex->flags & DM_CUDA_AUTO)) || dmc_gen_eligible(&ex->hprogs[i]) != DM_OK)
            continue; /* fused, or interpreted */
        ex->gen_of[i] = ex->ngen;
        list[ex->ngen++] = &ex->hprogs[i];
    }
    dm_clear_error(); /* a program the generator does not take is no error */
    for (int q = 0; q < na; q++) ex->groups[attn_group[q]].fused = 1 + ex->ngen + q;
    ex->nfused = na;
    const int mode = !emulated(ex) ? 0 : (ex->flags & DM_CUDA_SIM_LANES) ? 2 : 1;
    dm_status s = ex->ngen + na ? dmc_gen_build(&ex->gen, list, ex->ngen, attns, na, mode, ex->device) : DM_OK;
    if ((s == DM_ERR_NOT_FOUND || s == DM_ERR_BACKEND) && (ex->flags & DM_CUDA_AUTO)) {
        /* auto chooses whatever runs fastest, and kernels NVRTC or the driver cannot build
         * or load do not run (no toolkit headers, an architecture NVRTC does not know):
         * the row groups and attention keep the interpreter and cuBLAS (bias epilogues,
         * cuBLASLt's, are still weighed); the reason is kept for the user */
        snprintf(ex->gen_note, sizeof ex->gen_note, "%s", dm_last_error());
        for (int i = 0; i < ex->nprogs; i++) ex->gen_of[i] = -1;
        for (int q = 0; q < na; q++) {
            ex->groups[attn_group[q]].fused = 0;
            ex->groups[attn_group[q]].tail = 0;
        }
        ex->ngen = ex->nfused = 0;
        ex->gen = NULL;
        dm_clear_error();
        s = DM_OK;
    }
    free(list);
    free(attns);
    free(attn_group);
    free(in_attn);
    DM_TRY(s);
    return DM_OK;
}

const char *dm_cuda_exec_gen_note(const dm_cuda_exec *ex) { return ex ? ex->gen_note : ""; }

/* The row programs of the plan that run generated code: inside a fused kernel, or as a
 * kernel of their own (a bias group a cuBLASLt epilogue absorbed runs nothing: not
 * counted). */
int dm_cuda_exec_generated(const dm_cuda_exec *ex, int *programs) {
    if (programs) *programs = ex ? ex->nprogs : 0;
    int n = 0;
    for (int gi = 0; ex && gi < ex->ngroups; gi++) {
        const dmc_group *eg = &ex->groups[gi];
        for (int k = 0; k < eg->nsteps && !eg->skip; k++)
            n += !eg->steps[k].gemm && (eg->fused || (ex->gen_of && ex->gen_of[eg->steps[k].prog] >= 0));
    }
    return n;
}

int dm_cuda_exec_fused(const dm_cuda_exec *ex) { return ex ? ex->nfused : 0; }

int dm_cuda_exec_fused_tails(const dm_cuda_exec *ex) {
    int n = 0;
    for (int gi = 0; ex && gi < ex->ngroups; gi++) n += ex->groups[gi].fused && ex->groups[gi].tail;
    return n;
}

int dm_cuda_exec_side_groups(const dm_cuda_exec *ex) {
    int n = 0;
    for (int gi = 0; ex && ex->on_side && gi < ex->ngroups; gi++) n += ex->on_side[gi];
    return n;
}

/* A non-blocking stream and a cuBLAS handle bound to it (TF32 only when asked for); the
 * have_ flags say what exists, for dm_cuda_exec_free. */
static dm_status stream_and_blas(const dm_cuda_exec *ex, cudaStream_t *st, int *have_st, cublasHandle_t *h,
                                 int *have_h) {
    DMC_CUDA(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
    *have_st = 1;
    DMC_BLAS(cublasCreate(h));
    *have_h = 1;
    DMC_BLAS(cublasSetStream(*h, *st));
    DMC_BLAS(cublasSetMathMode(*h, (ex->flags & DM_CUDA_TF32) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return DM_OK;
}

/* --- the second stream (DM_CUDA_OVERLAP) ------------------------------------------ */

static dm_status run_gemm(const dm_cuda_exec *ex, const dmc_step *st, cublasHandle_t blas);
static dm_status run_steps(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows, int side);

/* Group gi's arena spans: per tensor root in memory that its ops read or write, its bytes
 * in the plan's (fp32) arena and whether it is written. */
static dm_status group_spans(dm_cuda_exec *ex, int gi) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[gi];
    int cap = 0;
    for (int k = 0; k < gr->nops; k++) cap += op_at(plan, gr, k)->nin + op_at(plan, gr, k)->nout;
    ex->spans[gi] = (int64_t *)malloc(sizeof(int64_t) * 3 * (size_t)(cap > 0 ? cap : 1));
    if (!ex->spans[gi]) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    int n = 0;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = op_at(plan, gr, k);
        for (int s = 0; s < op->nin + op->nout; s++) {
            int r = dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]);
            if (!plan->in_memory[r] || plan->offset[r] < 0) continue;
            int64_t *x = ex->spans[gi] + 3 * n++;
            x[0] = plan->offset[r];
            x[1] = plan->offset[r] + g->t[r].numel * (int64_t)sizeof(float);
            x[2] = s >= op->nin;
        }
    }
    ex->nspans[gi] = n;
    return DM_OK;
}

/* 1 if main-stream group h must wait for side group q: h writes bytes q reads or writes,
 * or reads bytes q writes. */
static int hazard(const dm_cuda_exec *ex, int h, int q) {
    for (int a = 0; a < ex->nspans[h]; a++) {
        const int64_t *x = ex->spans[h] + 3 * a;
        for (int b = 0; b < ex->nspans[q]; b++) {
            const int64_t *y = ex->spans[q] + 3 * b;
            if ((x[2] || y[2]) && x[0] < y[1] && y[0] < x[1]) return 1;
        }
    }
    return 0;
}

/* Which groups run on the side stream: those whose written bytes no later group reads
 * (the weight and bias gradients), if they are a lone contraction or a row group (not
 * batched, not fused, no global scratch: the side has its own column-sum partials). */
static dm_status init_overlap(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const size_t ng = (size_t)(ex->ngroups > 0 ? ex->ngroups : 1);
    ex->spans = (int64_t **)calloc(ng, sizeof(int64_t *));
    ex->nspans = (int *)calloc(ng, sizeof(int));
    ex->on_side = (char *)calloc(ng, 1);
    ex->pending = (int *)malloc(sizeof(int) * ng);
    ex->pending_seed = (uint64_t *)malloc(sizeof(uint64_t) * ng);
    ex->done = (cudaEvent_t *)calloc(ng, sizeof(cudaEvent_t));
    if (!ex->spans || !ex->nspans || !ex->on_side || !ex->pending || !ex->pending_seed || !ex->done)
        return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    for (int gi = 0; gi < ex->ngroups; gi++) DM_TRY(group_spans(ex, gi));
    int nside = 0;
    for (int gi = 0; gi < ex->ngroups; gi++) {
        const dmc_group *eg = &ex->groups[gi];
        if (eg->nsteps != 1 || plan->groups[gi].nbatch > 1 || eg->fused || eg->epi || eg->skip) continue;
        if (!eg->steps[0].gemm && ex->launch[eg->steps[0].prog].global_scratch) continue;
        int read_later = 0;
        for (int h = gi + 1; h < ex->ngroups && !read_later; h++)
            for (int a = 0; a < ex->nspans[h] && !read_later; a++)
                for (int b = 0; b < ex->nspans[gi] && !read_later; b++) {
                    const int64_t *x = ex->spans[h] + 3 * a, *y = ex->spans[gi] + 3 * b;
                    read_later = !x[2] && y[2] && x[0] < y[1] && y[0] < x[1];
                }
        ex->on_side[gi] = !read_later;
        nside += !read_later;
    }
    if (!nside) return DM_OK;
    if (ex->partial_floats)
        DM_TRY(dev_alloc(ex, (void **)&ex->side_partials, ex->partial_floats * sizeof(float),
                         "column-sum partials of the second stream"));
    if (emulated(ex)) return DM_OK;
    DM_TRY(stream_and_blas(ex, &ex->side_stream, &ex->have_side_stream, &ex->blas2, &ex->have_blas2));
    DMC_CUDA(cudaEventCreateWithFlags(&ex->fork, cudaEventDisableTiming));
    ex->have_fork = 1;
    for (int gi = 0; gi < ex->ngroups; gi++) {
        if (!ex->on_side[gi]) continue;
        DMC_CUDA(cudaEventCreateWithFlags(&ex->done[gi], cudaEventDisableTiming));
        ex->ndone = gi + 1; /* events 0 .. gi exist (unused ones are NULL: destroy skips) */
    }
    return DM_OK;
}

/* The pending side groups up to and including pending[k] are waited for (emulating: run
 * now, in order) and dropped. */
static dm_status join_upto(dm_cuda_exec *ex, int k) {
    if (k < 0) return DM_OK;
    if (emulated(ex)) {
        for (int i = 0; i <= k; i++) {
            dm_status s = run_steps(ex, ex->pending[i], ex->pending_seed[i], 0, 1);
            if (s != DM_OK) { /* those that ran are done */
                memmove(ex->pending, ex->pending + i, sizeof(int) * (size_t)(ex->npending - i));
                memmove(ex->pending_seed, ex->pending_seed + i, sizeof(uint64_t) * (size_t)(ex->npending - i));
                ex->npending -= i;
                return s;
            }
        }
    } else {
        DMC_CUDA(cudaStreamWaitEvent(ex->stream, ex->done[ex->pending[k]], 0));
    }
    memmove(ex->pending, ex->pending + k + 1, sizeof(int) * (size_t)(ex->npending - k - 1));
    memmove(ex->pending_seed, ex->pending_seed + k + 1, sizeof(uint64_t) * (size_t)(ex->npending - k - 1));
    ex->npending -= k + 1;
    return DM_OK;
}

static dm_status join_all(dm_cuda_exec *ex) { return join_upto(ex, ex->npending - 1); }

/* Before main-stream group h: the latest pending side group it conflicts with, and all
 * before it, are waited for. */
static dm_status resolve_hazards(dm_cuda_exec *ex, int h) {
    int k = ex->npending - 1;
    while (k >= 0 && !hazard(ex, h, ex->pending[k])) k--;
    return join_upto(ex, k);
}

/* Before the main stream reads (writing = 0) or writes tensor t's root: the latest
 * pending side group that writes those bytes (or, writing, touches them at all), and all
 * before it, are waited for; the others may go on running. */
static dm_status join_touching(dm_cuda_exec *ex, int t, int writing) {
    const dm_plan *plan = ex->plan;
    const int r = dm_tensor_root(plan->g, t);
    if (plan->offset[r] < 0) return DM_OK;
    const int64_t lo = plan->offset[r], hi = lo + plan->g->t[r].numel * (int64_t)sizeof(float);
    int k = ex->npending - 1;
    for (; k >= 0; k--) {
        const int q = ex->pending[k];
        int hit = 0;
        for (int b = 0; b < ex->nspans[q] && !hit; b++) {
            const int64_t *y = ex->spans[q] + 3 * b;
            hit = (writing || y[2]) && y[0] < hi && lo < y[1];
        }
        if (hit) break;
    }
    return join_upto(ex, k);
}

/* Profiling by events (dm_cuda_exec_profile): group gi's start (end = 0) or end event on
 * the stream its work goes to; the end marks both recorded. */
static dm_status prof_mark(dm_cuda_exec *ex, int gi, int end, cudaStream_t st) {
    if (!ex->prof_on || emulated(ex) || !ex->prof_ev) return DM_OK;
    DMC_CUDA(cudaEventRecord(ex->prof_ev[2 * gi + end], st));
    if (end) ex->prof_rec[gi] = 1;
    return DM_OK;
}

/* Side group gi: after everything enqueued on the main stream so far (emulating: later,
 * at join_upto). */
static dm_status launch_side(dm_cuda_exec *ex, int gi, uint64_t seed) {
    if (ex->npending >= ex->ngroups) DM_TRY(join_all(ex)); /* a pass cut short by an error */
    if (!emulated(ex)) {
        DMC_CUDA(cudaEventRecord(ex->fork, ex->stream));
        DMC_CUDA(cudaStreamWaitEvent(ex->side_stream, ex->fork, 0));
        DM_TRY(prof_mark(ex, gi, 0, ex->side_stream));
        DM_TRY(run_steps(ex, gi, seed, 0, 1));
        DM_TRY(prof_mark(ex, gi, 1, ex->side_stream));
        DMC_CUDA(cudaEventRecord(ex->done[gi], ex->side_stream));
    }
    ex->pending_seed[ex->npending] = seed;
    ex->pending[ex->npending++] = gi;
    return DM_OK;
}

/* --- cuBLASLt bias epilogue (DM_CUDA_EPILOGUE) --------------------------------------- */

static void epi_free(dmc_epi *e);
static void narrow(int dt, const float *src, void *dst, size_t n);
static void widen(int dt, const void *src, float *dst, size_t n);

static cudaDataType_t blas_type(int dtype) {
    return dtype == DM_CUDA_BF16 ? CUDA_R_16BF : dtype == DM_CUDA_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two (at most 256) that divides address p. */
static uint32_t align_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

/* The descriptors and algorithm of e for gm: D (n x m column-major) = alpha op(B)^T op(A)^T
 * + bias. DM_ERR_UNSUPPORTED if cuBLASLt has no algorithm for it. */
static dm_status epi_prepare(dm_cuda_exec *ex, const dm_gemm *gm, dmc_epi *e) {
    const cudaDataType_t ty = blas_type(ex->dtype);
    const cublasComputeType_t ct = (ex->flags & DM_CUDA_TF32) && ex->dtype == DM_CUDA_FP32
                                       ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cublasOperation_t o1 = gm->transB ? CUBLAS_OP_T : CUBLAS_OP_N, o2 = gm->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = (int32_t)ty;
    DMC_BLAS(cublasLtMatmulDescCreate(&e->op, ct, CUDA_R_32F));
    e->have_op = 1;
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &o1, sizeof o1));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &o2, sizeof o2));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    /* column-major storage: op N keeps (rows, cols) of op(X), op T swaps them */
    DMC_BLAS(cublasLtMatrixLayoutCreate(&e->l1, ty, gm->transB ? gm->k : gm->n, gm->transB ? gm->n : gm->k, gm->ldb));
    e->have_l1 = 1;
    DMC_BLAS(cublasLtMatrixLayoutCreate(&e->l2, ty, gm->transA ? gm->m : gm->k, gm->transA ? gm->k : gm->m, gm->lda));
    e->have_l2 = 1;
    DMC_BLAS(cublasLtMatrixLayoutCreate(&e->ld, ty, gm->n, gm->m, gm->ldc));
    e->have_ld = 1;
    cublasLtMatmulPreference_t pref;
    DMC_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ex->lt_ws_bytes;
    const uint32_t a1 = align_of(gm->B), a2 = align_of(gm->A), ad = align_of(e->D);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a1, sizeof a1);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a2, sizeof a2);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(ex->lt, e->op, e->l1, e->l2, e->ld, e->ld, pref, 1, &res, &nres);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || nres < 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for the bias epilogue (%s)",
                       cublasGetStatusString(st));
    e->algo = res.algo;
    return DM_OK;
}

/* Every lone contraction whose output only the next group reads, that group being one
 * bias add over the same rows x cols in the same pass, takes the bias into its epilogue
 * (DM_CUDA_EPILOGUE; DMOVE_CUDA_EPILOGUE=0 turns it off). Where cuBLASLt has no algorithm,
 * or the biased tensor shares bytes with an operand, both stay. A run of some classes
 * only (dm_layer_run's class mask) counts the bias with the contraction. */
static dm_status init_epilogues(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const char *off = getenv("DMOVE_CUDA_EPILOGUE");
    if (off && !strcmp(off, "0")) return DM_OK;
    for (int gi = 0; gi + 1 < ex->ngroups; gi++) {
        dmc_group *eg = &ex->groups[gi], *nx = &ex->groups[gi + 1];
        const dm_group *pg = &plan->groups[gi], *pn = &plan->groups[gi + 1];
        if (eg->nsteps != 1 || !eg->steps[0].gemm || eg->steps[0].ptrs || pg->nbatch > 1 || pn->nops != 1 ||
            pn->nbatch > 1 || nx->nsteps != 1 || nx->fused)
            continue;
        const dm_gemm *gm = &eg->steps[0].gm;
        const dm_op *c = op_at(plan, pg, 0), *b = op_at(plan, pn, 0);
        if (b->kind != DM_OP_BIAS_ADD || gm->nbd != 0 || gm->beta != 0.0f || b->rows != gm->m || b->cols != gm->n ||
            gm->ldc != gm->n)
            continue;
        const int pre = dm_tensor_root(g, c->out[0]);
        int dt = 0, dtb = 0, dto = 0;
        if (dm_tensor_root(g, b->in[0]) != pre || arena_ptr(ex, b->in[0], &dt) != (void *)gm->C) continue;
        const void *bias = arena_ptr(ex, b->in[1], &dtb);
        void *D = arena_ptr(ex, b->out[0], &dto);
        if (!bias || !D || dtb != ex->dtype || dto != ex->dtype || dm_tensor_root(g, b->out[0]) == pre) continue;
        int read_elsewhere = 0; /* the pre-bias tensor: read by the bias group alone */
        for (int o = 0; o < g->nop && !read_elsewhere; o++) {
            if (&g->op[o] == b) continue;
            for (int s = 0; s < g->op[o].nin; s++) read_elsewhere |= dm_tensor_root(g, g->op[o].in[s]) == pre;
        }
        if (read_elsewhere || pg->pass != pn->pass) continue;
        /* the memory planner may give the biased tensor the bytes of an input that dies
         * at the contraction: written while it is read, as one call */
        int overlap = 0;
        const int dr = dm_tensor_root(g, b->out[0]);
        const int64_t d0 = plan->offset[dr], d1 = d0 + g->t[dr].numel * (int64_t)sizeof(float);
        const int ins[3] = {c->in[0], c->in[1], b->in[1]};
        for (int q = 0; q < 3; q++) {
            const int r = dm_tensor_root(g, ins[q]);
            const int64_t a0 = plan->offset[r], a1 = a0 + g->t[r].numel * (int64_t)sizeof(float);
            overlap |= a0 < d1 && d0 < a1;
        }
        if (overlap) continue;
        if (!emulated(ex) && !ex->have_lt) {
            DMC_BLAS(cublasLtCreate(&ex->lt));
            ex->have_lt = 1;
            ex->lt_ws_bytes = (size_t)32 << 20;
            DM_TRY(dev_alloc(ex, &ex->lt_ws, ex->lt_ws_bytes, "cuBLASLt's workspace"));
        }
        dmc_epi *e = (dmc_epi *)calloc(1, sizeof *e);
        if (!e) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
        e->bias = bias;
        e->D = D;
        if (!emulated(ex) && epi_prepare(ex, gm, e) != DM_OK) {
            epi_free(e);
            dm_clear_error(); /* no algorithm (or no descriptor): the two groups run as before */
            continue;
        }
        eg->epi = e;
        nx->skip = 1;
        ex->nepi++;
    }
    return DM_OK;
}

/* The contraction of group eg with its bias epilogue. Emulating: the GEMM into D, then
 * the bias added (and rounded to the storage type again: the GPU rounds once). */
static dm_status run_epi(const dm_cuda_exec *ex, const dmc_group *eg) {
    const dm_gemm *gm = &eg->steps[0].gm;
    const dmc_epi *e = eg->epi;
    const float alpha = gm->alpha, beta = 0.0f;
    if (!emulated(ex)) {
        DMC_BLAS(cublasLtMatmul(ex->lt, e->op, &alpha, gm->B, e->l1, gm->A, e->l2, &beta, e->D, e->ld, e->D,
                                e->ld, &e->algo, ex->lt_ws, ex->lt_ws_bytes, ex->stream));
        return DM_OK;
    }
    dmc_emu_gemm(ex->dtype, gm->transB, gm->transA, gm->n, gm->m, gm->k, alpha, gm->B, gm->ldb, 0, gm->A,
                 gm->lda, 0, 0.0f, e->D, gm->ldc, 0, 1);
    for (int64_t r = 0; r < gm->m; r++)
        for (int64_t c = 0; c < gm->n; c++) {
            const size_t at = (size_t)(r * gm->ldc + c);
            float y, b;
            widen(ex->dtype, (const char *)e->D + at * ex->esz, &y, 1);
            widen(ex->dtype, (const char *)e->bias + (size_t)c * ex->esz, &b, 1);
            y += b;
            narrow(ex->dtype, &y, (char *)e->D + at * ex->esz, 1);
        }
    return DM_OK;
}

int dm_cuda_exec_epilogues(const dm_cuda_exec *ex) { return ex ? ex->nepi : 0; }

int dm_cuda_exec_group_absorbed(const dm_cuda_exec *ex, int gi) {
    return ex && ex->groups && gi >= 0 && gi < ex->ngroups && ex->groups[gi].skip;
}

const char *dm_cuda_exec_gpu_name(const dm_cuda_exec *ex) { return ex ? ex->gpu : ""; }

/* --- per-group choice by measurement (DM_CUDA_AUTO) ---------------------------------- */

static double host_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Sorts n (a handful of) timings ascending, in place: insertion sort. */
static void sort_small(double *t, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
}

/* The median time of `reps` runs of group gi as it is set up now, after two warm-ups
 * (one emulating):
 * on the GPU the runs are enqueued back to back with an event between each two (so the
 * host's launch gaps, which a step hides, are not counted), and read after one wait;
 * emulating, host time. */
static dm_status time_group(dm_cuda_exec *ex, int gi, int reps, double *ms) {
    enum { MAXR = 9 };
    double t[MAXR];
    cudaEvent_t ev[MAXR + 1] = {0};
    if (reps > MAXR) reps = MAXR;
    dm_status s = DM_OK;
    for (int r = 0; r <= reps && s == DM_OK && !emulated(ex); r++) {
        cudaError_t ce = cudaEventCreate(&ev[r]);
        if (ce != cudaSuccess) {
            ev[r] = NULL;
            s = dm_fail(DM_ERR_BACKEND, "cudaEventCreate failed: %s", cudaGetErrorString(ce));
        }
    }
    for (int r = 0; r < (emulated(ex) ? 1 : 2) && s == DM_OK; r++) s = dm_cuda_exec_group(ex, gi, 0, 0);
    if (s == DM_OK && !emulated(ex) && cudaEventRecord(ev[0], ex->stream) != cudaSuccess)
        s = dm_fail(DM_ERR_BACKEND, "cudaEventRecord failed");
    for (int r = 0; r < reps && s == DM_OK; r++) {
        const double h0 = host_now();
        s = dm_cuda_exec_group(ex, gi, 0, 0);
        if (s == DM_OK && emulated(ex)) t[r] = (host_now() - h0) * 1e3;
        else if (s == DM_OK && cudaEventRecord(ev[r + 1], ex->stream) != cudaSuccess)
            s = dm_fail(DM_ERR_BACKEND, "cudaEventRecord failed");
    }
    if (s == DM_OK && !emulated(ex)) {
        cudaError_t ce = cudaEventSynchronize(ev[reps]);
        for (int r = 0; r < reps && ce == cudaSuccess; r++) {
            float f = 0;
            ce = cudaEventElapsedTime(&f, ev[r], ev[r + 1]);
            t[r] = f;
        }
        if (ce != cudaSuccess) s = dm_fail(DM_ERR_BACKEND, "timing group %d: %s", gi, cudaGetErrorString(ce));
    }
    for (int r = 0; r <= reps; r++)
        if (ev[r]) (void)cudaEventDestroy(ev[r]);
    DM_TRY(s);
    sort_small(t, reps);
    *ms = t[reps / 2];
    return DM_OK;
}

/* One choice auto weighs: a fused attention kernel (FUSED), a bias epilogue (EPI: off,
 * the contraction and then the bias group gi + 1 run), a generated row kernel (GEN). */
enum { CH_FUSED, CH_EPI, CH_GEN };
typedef struct {
    int kind, gi;
    int fused;   /* CH_FUSED: the group's fused index */
    dmc_epi *epi;
    int prog, k; /* CH_GEN: the program and its kernel */
} dmc_choice;

static void choice_set(dm_cuda_exec *ex, const dmc_choice *c, int on) {
    dmc_group *eg = &ex->groups[c->gi];
    switch (c->kind) {
    case CH_FUSED: eg->fused = on ? c->fused : 0; break;
    case CH_EPI:
        eg->epi = on ? c->epi : NULL;
        ex->groups[c->gi + 1].skip = on;
        break;
    default: ex->gen_of[c->prog] = on ? c->k : -1; break;
    }
}

/* Median time of the choice on and off, timed in alternation (on, off, off, on, on, off)
 * so that neither side always runs first, on a cold or a warm GPU. */
static dm_status time_choice(dm_cuda_exec *ex, const dmc_choice *c, double *on_ms, double *off_ms) {
    enum { ROUNDS = 6, REPS = 3 };
    double t[2][ROUNDS];
    /* emulating, host timings mean little and each run is slow: two rounds of one */
    const int rounds = emulated(ex) ? 2 : ROUNDS, reps = emulated(ex) ? 1 : REPS;
    for (int r = 0; r < rounds; r++) {
        const int first = (r + 1) / 2 % 2 == 0; /* on first in rounds 0, 3, 4 */
        for (int q = 0; q < 2; q++) {
            const int on = q == 0 ? first : !first;
            choice_set(ex, c, on);
            double a = 0, b = 0;
            dm_status s = time_group(ex, c->gi, reps, &a);
            if (s == DM_OK && c->kind == CH_EPI && !on) s = time_group(ex, c->gi + 1, reps, &b);
            if (s != DM_OK) {
                choice_set(ex, c, 1);
                return s;
            }
            t[on][r] = a + b;
        }
    }
    for (int on = 0; on < 2; on++) sort_small(t[on], rounds); /* then the middle pair */
    *on_ms = 0.5 * (t[1][rounds / 2 - 1] + t[1][rounds / 2]);
    *off_ms = 0.5 * (t[0][rounds / 2 - 1] + t[0][rounds / 2]);
    return DM_OK;
}

/* Every group once in order, repeated for at least `ms` of GPU time: clocks up, caches
 * and lazily loaded modules warm, before the first choice is timed. */
static dm_status warm_up(dm_cuda_exec *ex, double ms) {
    if (emulated(ex)) return DM_OK;
    const double t0 = host_now();
    for (int round = 0; round < 1000 && (host_now() - t0) * 1e3 < ms; round++) {
        for (int gi = 0; gi < ex->ngroups; gi++) DM_TRY(dm_cuda_exec_group(ex, gi, 0, 0));
        DMC_CUDA(cudaStreamSynchronize(ex->stream));
    }
    return DM_OK;
}

/* DM_CUDA_AUTO: each choice the generator made, measured against what it replaces, kept
 * only where it is faster: a fused attention kernel against cuBLAS around the row
 * program's own generated kernel (or the interpreter, where the generator does not take
 * it), which, if the fused kernel loses, is timed against the interpreter next; a bias
 * epilogue against the contraction and the bias group; a generated row kernel against
 * the interpreter. The arena is zeroed again after. */
static dm_status auto_select(dm_cuda_exec *ex) {
    /* the tests' way to make every choice one way (the timings decide otherwise):
     * DMOVE_TEST_AUTO=gen keeps every generated choice, =interp drops every one,
     * =unfused drops the fused kernels only */
    const char *force = getenv("DMOVE_TEST_AUTO");
    const int f_gen = force && !strcmp(force, "gen"), f_interp = force && !strcmp(force, "interp"),
              f_unfused = force && !strcmp(force, "unfused"); /* =unfused: cuBLAS + generated */
    int choices = ex->nfused + ex->nepi;
    for (int i = 0; i < ex->nprogs && ex->gen_of; i++) choices += ex->gen_of[i] >= 0;
    if (choices && !(f_gen || f_interp || f_unfused)) DM_TRY(warm_up(ex, 200.0));
    for (int gi = 0; gi < ex->ngroups; gi++) {
        dmc_group *eg = &ex->groups[gi];
        if (eg->skip) continue; /* a bias in the epilogue before it: nothing runs */
        /* the group's row program, if it has exactly one */
        int prog = -1, rows = 0;
        for (int k = 0; k < eg->nsteps; k++)
            if (!eg->steps[k].gemm) prog = eg->steps[k].prog, rows++;
        if (rows != 1) prog = -1;
        for (int pass = 0; pass < 2; pass++) {
            dmc_choice c;
            memset(&c, 0, sizeof c);
            c.gi = gi;
            if (pass == 0 && eg->fused) {
                c.kind = CH_FUSED;
                c.fused = eg->fused;
            } else if (pass == 0 && eg->epi && gi + 1 < ex->ngroups) {
                c.kind = CH_EPI;
                c.epi = eg->epi;
            } else if (!eg->fused && !eg->epi && prog >= 0 && ex->gen_of && ex->gen_of[prog] >= 0) {
                /* pass 0: a row group; pass 1: the row program of a group whose fused kernel
                 * lost, between the GEMMs */
                c.kind = CH_GEN;
                c.prog = prog;
                c.k = ex->gen_of[prog];
            } else {
                continue;
            }
            if (pass == 1 && c.kind != CH_GEN) continue;
            double on = 0, off = 0;
            DM_TRY(time_choice(ex, &c, &on, &off));
            const int keep = (f_gen || f_interp || f_unfused)
                                 ? f_gen || (f_unfused && c.kind != CH_FUSED)
                                 : on <= off;
            choice_set(ex, &c, keep);
            if (keep) break;
            if (c.kind == CH_FUSED) ex->nfused--;
            else if (c.kind == CH_EPI) {
                epi_free(c.epi);
                ex->nepi--;
            }
        }
    }
    if (!ex->nepi && ex->have_lt) { /* no epilogue kept: cuBLASLt's handle and workspace go */
        dev_free(ex, ex->lt_ws);
        ex->lt_ws = NULL;
        ex->dev_bytes -= ex->lt_ws_bytes ? ex->lt_ws_bytes : 256; /* as dev_alloc counted it */
        (void)cublasLtDestroy(ex->lt);
        ex->have_lt = 0;
    }
    const size_t bytes = ex->arena_bytes / 4 * (size_t)ex->esz;
    if (emulated(ex)) {
        memset(ex->arena, 0, bytes);
        if (ex->side) memset(ex->side, 0, ex->side_floats * sizeof(float));
    } else {
        DMC_CUDA(cudaMemsetAsync(ex->arena, 0, bytes ? bytes : 256, ex->stream));
        if (ex->side) DMC_CUDA(cudaMemsetAsync(ex->side, 0, ex->side_floats * sizeof(float), ex->stream));
        DMC_CUDA(cudaStreamSynchronize(ex->stream));
    }
    return DM_OK;
}

static dm_status init_all(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    if (emulated(ex)) {
        ex->smem_optin = 227 * 1024 - 1024; /* as an H100 */
    } else {
        DMC_CUDA(cudaGetDevice(&ex->device));
        DMC_CUDA(cudaDeviceGetAttribute(&ex->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        ex->device));
        ex->smem_optin -= 1024; /* the kernel's static shared memory, with room to spare */
        if (ex->smem_optin < 0) ex->smem_optin = 0;
        DM_TRY(stream_and_blas(ex, &ex->stream, &ex->have_stream, &ex->blas, &ex->have_blas));
    }

    ex->arena_bytes = plan->arena_bytes;
    size_t dev_bytes = ex->arena_bytes / 4 * (size_t)ex->esz;
    DM_TRY(dev_alloc(ex, (void **)&ex->arena, dev_bytes, "the layer's tensors"));
    if (!emulated(ex)) /* emulated memory comes zeroed from dev_alloc */
        DMC_CUDA(cudaMemsetAsync(ex->arena, 0, dev_bytes ? dev_bytes : 256, ex->stream));
    if (ex->dtype != DM_CUDA_FP32) DM_TRY(init_wide(ex));

    /* the tile temporaries: sized for the largest batched group */
    dmc_tiles tl;
    for (int gi = 0; gi < plan->ngroups; gi++) {
        if (plan->groups[gi].nbatch <= 1) continue;
        DM_TRY(group_tiles(plan, &plan->groups[gi], &tl));
        if ((size_t)tl.floats > ex->temp_floats) ex->temp_floats = (size_t)tl.floats;
    }
    if (ex->temp_floats)
        DM_TRY(main_alloc(ex, POOL_TEMP, (void **)&ex->temp, ex->temp_floats * (size_t)ex->esz,
                          "the attention score temporaries"));

    ex->ngroups = plan->ngroups;
    ex->groups = (dmc_group *)calloc((size_t)(plan->ngroups > 0 ? plan->ngroups : 1), sizeof(dmc_group));
    if (!ex->groups) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    for (int gi = 0; gi < plan->ngroups; gi++) DM_TRY(build_group(ex, gi, &tl));

    if (ex->flags & DM_CUDA_GEN) DM_TRY(init_gen(ex));
    if (ex->flags & DM_CUDA_EPILOGUE) DM_TRY(init_epilogues(ex));

    /* programs to the device; shared memory limit; global scratch and partials */
    size_t max_smem = 0;
    for (int i = 0; i < ex->nprogs; i++) {
        const dmc_launch *lc = &ex->launch[i];
        const dmc_rowprog *p = &ex->hprogs[i];
        if (lc->smem_bytes > max_smem) max_smem = lc->smem_bytes;
        if (lc->global_scratch && (size_t)lc->blocks * (size_t)p->scratch_floats > ex->gscratch_floats)
            ex->gscratch_floats = (size_t)lc->blocks * (size_t)p->scratch_floats;
        if ((size_t)lc->blocks * (size_t)p->acc_floats > ex->partial_floats)
            ex->partial_floats = (size_t)lc->blocks * (size_t)p->acc_floats;
        const dmc_genk *k = ex->gen_of && ex->gen_of[i] >= 0 ? dmc_gen_kernel(ex->gen, ex->gen_of[i]) : NULL;
        if (k && (size_t)k->blocks * (size_t)k->acc_floats > ex->partial_floats)
            ex->partial_floats = (size_t)k->blocks * (size_t)k->acc_floats;
    }
    if (max_smem > 48 * 1024 && !emulated(ex)) DM_TRY(dmc_rows_allow_smem(max_smem));
    if (ex->nprogs && !emulated(ex)) { /* emulating, the host copies serve */
        size_t pb = sizeof(dmc_rowprog) * (size_t)ex->nprogs;
        DM_TRY(dev_alloc(ex, (void **)&ex->dprogs, pb, "the row programs"));
        DM_TRY(dev_copy(ex, ex->dprogs, ex->hprogs, pb, cudaMemcpyHostToDevice));
    }
    if (ex->gscratch_floats)
        DM_TRY(main_alloc(ex, POOL_GSCRATCH, (void **)&ex->gscratch, ex->gscratch_floats * sizeof(float),
                          "row scratch"));
    if (ex->partial_floats)
        DM_TRY(main_alloc(ex, POOL_PARTIALS, (void **)&ex->partials, ex->partial_floats * sizeof(float),
                          "column-sum partials"));
    if ((ex->flags & DM_CUDA_AUTO) && (ex->flags & DM_CUDA_GEN)) DM_TRY(auto_select(ex));
    if (ex->flags & DM_CUDA_OVERLAP) DM_TRY(init_overlap(ex)); /* after partial_floats is known */
    if (!emulated(ex)) DMC_CUDA(cudaStreamSynchronize(ex->stream));
    return DM_OK;
}

dm_status dm_cuda_exec_init(dm_cuda_exec **out, const dm_plan *plan, int dtype, unsigned flags) {
    return dm_cuda_exec_init_pooled(out, plan, dtype, flags, NULL);
}

dm_status dm_cuda_exec_init_pooled(dm_cuda_exec **out, const dm_plan *plan, int dtype, unsigned flags,
                                   dm_cuda_pool *pool) {
    if (!out || !plan) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_init: NULL argument");
    *out = NULL;
    if (dtype != DM_CUDA_FP32 && dtype != DM_CUDA_BF16 && dtype != DM_CUDA_FP16)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_init: unknown storage type %d", dtype);
    char why[256];
    if (!(flags & DM_CUDA_EMULATE)) DM_TRY(dm_cuda_available(why, sizeof why));
    dm_cuda_exec *ex = (dm_cuda_exec *)calloc(1, sizeof *ex);
    if (!ex) return dm_fail(DM_ERR_OOM, "out of memory");
    if (!(flags & DM_CUDA_EMULATE)) { /* its name, for the roofline model (no name: no model) */
        int dev = 0;
        cudaDeviceProp prop;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
            snprintf(ex->gpu, sizeof ex->gpu, "%.127s", prop.name);
        else
            (void)cudaGetLastError(); /* dm_cuda_available just read the same: not expected */
    }
    ex->plan = plan;
    ex->flags = flags;
    ex->dtype = dtype;
    ex->pool = pool;
    /* threads per block of a block-per-row program, at most rows.cu's launch bounds;
     * DMOVE_CUDA_ROW_THREADS overrides the default, for experiments */
    ex->row_threads = 128; /* H100, bf16, BERT-large: 128 ~ 64 < 32 < 256 < 512 */
    const char *rt = getenv("DMOVE_CUDA_ROW_THREADS");
    if (rt && atoi(rt) >= 32 && atoi(rt) <= 512) ex->row_threads = atoi(rt) / 32 * 32;
    if (ex->row_threads > dmc_rows_max_threads()) ex->row_threads = dmc_rows_max_threads();
    ex->esz = dtype == DM_CUDA_FP32 ? 4 : 2;
    dm_status s = init_all(ex);
    if (s != DM_OK) {
        dm_cuda_exec_free(ex);
        return s;
    }
    *out = ex;
    return DM_OK;
}

/* Frees what init made, ignoring errors (there is nobody left to tell). */
static void epi_free(dmc_epi *e) {
    if (!e) return;
    if (e->have_op) (void)cublasLtMatmulDescDestroy(e->op);
    if (e->have_l1) (void)cublasLtMatrixLayoutDestroy(e->l1);
    if (e->have_l2) (void)cublasLtMatrixLayoutDestroy(e->l2);
    if (e->have_ld) (void)cublasLtMatrixLayoutDestroy(e->ld);
    free(e);
}

void dm_cuda_exec_free(dm_cuda_exec *ex) {
    if (!ex) return;
    if (ex->have_side_stream) (void)cudaStreamSynchronize(ex->side_stream); /* before any free */
    if (ex->have_stream) (void)cudaStreamSynchronize(ex->stream);
    dev_free(ex, ex->arena);
    if (!ex->pooled[POOL_TEMP]) dev_free(ex, ex->temp);
    dev_free(ex, ex->side);
    free(ex->wide);
    free(ex->side_off);
    if (!ex->pooled[POOL_GSCRATCH]) dev_free(ex, ex->gscratch);
    if (!ex->pooled[POOL_PARTIALS]) dev_free(ex, ex->partials);
    dev_free(ex, ex->dprogs);
    if (ex->have_blas) (void)cublasDestroy(ex->blas);
    if (ex->have_blas2) (void)cublasDestroy(ex->blas2);
    if (ex->have_stream) (void)cudaStreamDestroy(ex->stream);
    if (ex->have_side_stream) (void)cudaStreamDestroy(ex->side_stream);
    if (ex->have_fork) (void)cudaEventDestroy(ex->fork);
    if (ex->have_xfer) (void)cudaEventDestroy(ex->xfer);
    if (ex->have_copied) (void)cudaEventDestroy(ex->copied);
    for (int i = 0; i < ex->ndone; i++)
        if (ex->done[i]) (void)cudaEventDestroy(ex->done[i]);
    free(ex->done);
    for (int i = 0; i < ex->nprof_ev; i++) (void)cudaEventDestroy(ex->prof_ev[i]);
    free(ex->prof_ev);
    free(ex->prof_rec);
    free(ex->on_side);
    free(ex->pending);
    free(ex->pending_seed);
    dev_free(ex, ex->side_partials);
    if (ex->spans)
        for (int gi = 0; gi < ex->ngroups; gi++) free(ex->spans[gi]);
    free(ex->spans);
    free(ex->nspans);
    if (ex->groups)
        for (int gi = 0; gi < ex->ngroups; gi++) {
            for (int k = 0; k < ex->groups[gi].nsteps; k++) dev_free(ex, ex->groups[gi].steps[k].ptrs);
            free(ex->groups[gi].steps);
            epi_free(ex->groups[gi].epi);
        }
    dev_free(ex, ex->lt_ws);
    if (ex->have_lt) (void)cublasLtDestroy(ex->lt);
    free(ex->groups);
    dmc_gen_free(ex->gen);
    free(ex->gen_of);
    free(ex->hprogs);
    free(ex->launch);
    free(ex);
}

void dmc_gemm_batches(const dm_gemm *gm, dmc_batches *bt) {
    int nd = 0;
    bt->count = 1;
    for (int d = 0; d < gm->nbd; d++) {
        bt->count *= gm->bsize[d];
        if (nd > 0 && bt->sa[nd - 1] == gm->bsA[d] * gm->bsize[d] &&
            bt->sb[nd - 1] == gm->bsB[d] * gm->bsize[d] && bt->sc[nd - 1] == gm->bsC[d] * gm->bsize[d]) {
            bt->sz[nd - 1] *= gm->bsize[d];
            bt->sa[nd - 1] = gm->bsA[d];
            bt->sb[nd - 1] = gm->bsB[d];
            bt->sc[nd - 1] = gm->bsC[d];
            continue;
        }
        bt->sz[nd] = gm->bsize[d];
        bt->sa[nd] = gm->bsA[d];
        bt->sb[nd] = gm->bsB[d];
        bt->sc[nd] = gm->bsC[d];
        nd++;
    }
    bt->nd = nd;
}

void dmc_batch_offsets(const dmc_batches *bt, int64_t q, int64_t *oa, int64_t *ob, int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int d = bt->nd - 1; d >= 0; d--) {
        int64_t i = q % bt->sz[d];
        q /= bt->sz[d];
        *oa += i * bt->sa[d];
        *ob += i * bt->sb[d];
        *oc += i * bt->sc[d];
    }
}

/* A contraction whose batch does not merge into one stride (attention's (b, h) over
 * head-interleaved activations) runs as one cublasGemmBatchedEx over arrays of matrix
 * addresses, made here once (the arena does not move): B's, A's, C's, `count` each. */
static dm_status gemm_pointer_arrays(dm_cuda_exec *ex, dmc_step *st) {
    dmc_batches bt;
    dmc_gemm_batches(&st->gm, &bt);
    if (bt.nd <= 1 || emulated(ex)) return DM_OK; /* one strided-batched call, or emulating */
    if (bt.count > INT_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "a batched contraction of %lld matrices exceeds cuBLAS's "
                       "batch count range", (long long)bt.count);
    size_t n = (size_t)bt.count;
    const void **h = (const void **)malloc(3 * n * sizeof(void *));
    if (!h) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    const int64_t es = ex->esz;
    for (size_t q = 0; q < n; q++) {
        int64_t oa, ob, oc;
        dmc_batch_offsets(&bt, (int64_t)q, &oa, &ob, &oc);
        h[q] = (const char *)st->gm.B + ob * es;
        h[n + q] = (const char *)st->gm.A + oa * es;
        h[2 * n + q] = (const char *)st->gm.C + oc * es;
    }
    dm_status s = dev_alloc(ex, (void **)&st->ptrs, 3 * n * sizeof(void *), "GEMM batch addresses");
    if (s == DM_OK) s = dev_copy(ex, st->ptrs, h, 3 * n * sizeof(void *), cudaMemcpyHostToDevice);
    free(h);
    st->nptrs = (int)n;
    return s;
}

/* One contraction: one cuBLAS call, strided-batched (batch dims merged into one stride)
 * or batched over the address arrays of gemm_pointer_arrays. Emulating, the dimensions
 * that do not merge are looped over here. */
static dm_status run_gemm(const dm_cuda_exec *ex, const dmc_step *st, cublasHandle_t blas) {
    const dm_gemm *gm = &st->gm;
    dmc_batches bt;
    dmc_gemm_batches(gm, &bt);
    const int nd = bt.nd;
    int64_t inner = nd ? bt.sz[nd - 1] : 1;
    long long ia = nd ? bt.sa[nd - 1] : 0, ib = nd ? bt.sb[nd - 1] : 0, ic = nd ? bt.sc[nd - 1] : 0;
    if (inner > INT_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "a batched contraction of %lld matrices exceeds cuBLAS's "
                       "batch count range", (long long)inner);
    const float alpha = gm->alpha, beta = gm->beta;
    cublasOperation_t opA = gm->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = gm->transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = (ex->flags & DM_CUDA_TF32) && ex->dtype == DM_CUDA_FP32
                                 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ty = ex->dtype == DM_CUDA_BF16 ? CUDA_R_16BF
                        : ex->dtype == DM_CUDA_FP16 ? CUDA_R_16F
                                                    : CUDA_R_32F;
    /* row-major C (m x n) = op(A) op(B) is column-major C^T (n x m) = op(B)^T op(A)^T:
     * B's storage read column-major is B^T (so B's transpose flag carries over), B goes
     * first, m and n swap. gm's pointers are device addresses of the storage type. */
    if (st->ptrs) {
        const int n = st->nptrs;
        DMC_BLAS(cublasGemmBatchedEx(blas, opB, opA, gm->n, gm->m, gm->k, &alpha,
                                     (const void *const *)st->ptrs, ty, gm->ldb,
                                     (const void *const *)(st->ptrs + n), ty, gm->lda, &beta,
                                     st->ptrs + 2 * n, ty, gm->ldc, n, ct, CUBLAS_GEMM_DEFAULT));
        return DM_OK;
    }
    const char *A = (const char *)gm->A, *B = (const char *)gm->B;
    char *C = (char *)gm->C;
    const int64_t es = ex->esz;
    int64_t outer = bt.count / (inner > 0 ? inner : 1);
    dmc_batches ob_ = bt; /* the outer dims alone */
    ob_.nd = nd > 0 ? nd - 1 : 0;
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa, ob, oc;
        dmc_batch_offsets(&ob_, o, &oa, &ob, &oc);
        if (emulated(ex)) {
            dmc_emu_gemm(ex->dtype, opB == CUBLAS_OP_T, opA == CUBLAS_OP_T, gm->n, gm->m, gm->k,
                         alpha, B + ob * es, gm->ldb, ib, A + oa * es, gm->lda, ia, beta,
                         C + oc * es, gm->ldc, ic, (int)inner);
            continue;
        }
        DMC_BLAS(cublasGemmStridedBatchedEx(blas, opB, opA, gm->n, gm->m, gm->k, &alpha,
                                            B + ob * es, ty, gm->ldb, ib, A + oa * es, ty,
                                            gm->lda, ia, &beta, C + oc * es, ty, gm->ldc, ic,
                                            (int)inner, ct, CUBLAS_GEMM_DEFAULT));
    }
    return DM_OK;
}

/* The steps of group gi in order: GEMMs by cuBLAS, row programs by their generated
 * kernel, the interpreter, or its emulation; on the main stream, or (side) on the second
 * stream with its own cuBLAS handle and column-sum partials. */
static dm_status run_steps(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows, int side) {
    const dmc_group *eg = &ex->groups[gi];
    cudaStream_t stream = side ? ex->side_stream : ex->stream;
    cublasHandle_t blas = side ? ex->blas2 : ex->blas;
    float *partials = side ? ex->side_partials : ex->partials;
    for (int s = 0; s < eg->nsteps; s++) {
        const dmc_step *st = &eg->steps[s];
        if (s > 0 && (ex->flags & DM_CUDA_SYNC_EACH) && !emulated(ex)) {
            cudaError_t e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess)
                return dm_fail(DM_ERR_BACKEND, "group %d (%s), step %d: %s (%s)", gi,
                               op_at(ex->plan, &ex->plan->groups[gi], 0)->name, s - 1,
                               cudaGetErrorString(e), cudaGetErrorName(e));
        }
        if (st->gemm) {
            DM_TRY(run_gemm(ex, st, blas));
        } else if (!skip_rows && ex->gen_of && ex->gen_of[st->prog] >= 0) {
            const dmc_rowprog *hp = &ex->hprogs[st->prog];
            const dmc_genk *k = dmc_gen_kernel(ex->gen, ex->gen_of[st->prog]);
            DM_TRY(dmc_gen_launch(ex->gen, ex->gen_of[st->prog], seed, partials, stream));
            if (hp->nacc && emulated(ex)) dmc_emu_colacc(hp, partials, k->blocks);
            else if (hp->nacc)
                DM_TRY(dmc_colacc_launch(ex->dprogs + st->prog, hp, partials, k->blocks, stream));
        } else if (!skip_rows && emulated(ex)) {
            DM_TRY(dmc_emu_rows(&ex->hprogs[st->prog], &ex->launch[st->prog], seed, ex->gscratch,
                                partials));
        } else if (!skip_rows) {
            DM_TRY(dmc_rows_launch(ex->dprogs + st->prog, &ex->hprogs[st->prog], &ex->launch[st->prog],
                                   seed, ex->gscratch, partials, stream));
        }
    }
    if ((ex->flags & DM_CUDA_SYNC_EACH) && !emulated(ex) && eg->nsteps > 0) {
        cudaError_t e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess)
            return dm_fail(DM_ERR_BACKEND, "group %d (%s), step %d: %s (%s)", gi,
                           op_at(ex->plan, &ex->plan->groups[gi], 0)->name, eg->nsteps - 1,
                           cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return DM_OK;
}

static dm_status group_work(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows);

dm_status dm_cuda_exec_profile(dm_cuda_exec *ex, int on, int *by_events) {
    if (!ex || !by_events) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_profile: NULL argument");
    *by_events = 0;
    ex->prof_on = 0;
    if (!on || emulated(ex)) return DM_OK;
    if (!ex->prof_ev) {
        const int n = 2 * (ex->ngroups > 0 ? ex->ngroups : 1);
        ex->prof_ev = (cudaEvent_t *)calloc((size_t)n, sizeof *ex->prof_ev);
        ex->prof_rec = (char *)calloc((size_t)n / 2, 1);
        if (!ex->prof_ev || !ex->prof_rec) {
            free(ex->prof_ev);
            free(ex->prof_rec);
            ex->prof_ev = NULL;
            ex->prof_rec = NULL;
            return dm_fail(DM_ERR_OOM, "out of memory for the profiling events");
        }
        for (; ex->nprof_ev < n; ex->nprof_ev++) {
            cudaError_t e = cudaEventCreate(&ex->prof_ev[ex->nprof_ev]);
            if (e != cudaSuccess) {
                for (int i = 0; i < ex->nprof_ev; i++) (void)cudaEventDestroy(ex->prof_ev[i]);
                free(ex->prof_ev);
                free(ex->prof_rec);
                ex->prof_ev = NULL;
                ex->prof_rec = NULL;
                ex->nprof_ev = 0;
                return dm_fail(DM_ERR_BACKEND, "cudaEventCreate for profiling: %s (%s)", cudaGetErrorString(e),
                               cudaGetErrorName(e));
            }
        }
    }
    /* marks of a pass an error cut short are stale: start afresh */
    memset(ex->prof_rec, 0, (size_t)(ex->ngroups > 0 ? ex->ngroups : 1));
    ex->prof_on = 1;
    *by_events = 1;
    return DM_OK;
}

dm_status dm_cuda_exec_profile_take(dm_cuda_exec *ex, double *secs) {
    if (!ex || !secs) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_profile_take: NULL argument");
    for (int gi = 0; gi < ex->ngroups; gi++) secs[gi] = 0;
    if (!ex->prof_ev) return DM_OK;
    DM_TRY(dm_cuda_sync(ex)); /* every recorded event has happened */
    for (int gi = 0; gi < ex->ngroups; gi++) {
        if (!ex->prof_rec[gi]) continue;
        float ms = 0;
        ex->prof_rec[gi] = 0;
        /* the end event itself (a side group's is covered by the sync above only when its
         * own done event was recorded after it) */
        DMC_CUDA(cudaEventSynchronize(ex->prof_ev[2 * gi + 1]));
        DMC_CUDA(cudaEventElapsedTime(&ms, ex->prof_ev[2 * gi], ex->prof_ev[2 * gi + 1]));
        secs[gi] = 1e-3 * (double)ms;
    }
    return DM_OK;
}

dm_status dm_cuda_exec_group(dm_cuda_exec *ex, int gi, uint64_t seed, int only_contractions) {
    if (!ex || gi < 0 || gi >= ex->ngroups)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_group: no group %d", gi);
    const dmc_group *eg = &ex->groups[gi];
    /* as the CPU: only a batched group skips its row ops when asked for contractions */
    int skip_rows = only_contractions && ex->plan->groups[gi].nbatch > 1;
    if (eg->skip) return DM_OK; /* its bias went into the contraction before it */
    if (ex->on_side && ex->on_side[gi] && !only_contractions) return launch_side(ex, gi, seed);
    DM_TRY(resolve_hazards(ex, gi));
    if (eg->epi) DM_TRY(resolve_hazards(ex, gi + 1)); /* it writes the bias group's output */
    /* the start event after the waits: a group's time is its own work */
    DM_TRY(prof_mark(ex, gi, 0, ex->stream));
    DM_TRY(group_work(ex, gi, seed, skip_rows));
    return prof_mark(ex, gi, 1, ex->stream);
}

/* The work of group gi on the main stream, its hazards resolved. */
static dm_status group_work(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows) {
    const dmc_group *eg = &ex->groups[gi];
    if (eg->epi) {
        DM_TRY(run_epi(ex, eg));
        if ((ex->flags & DM_CUDA_SYNC_EACH) && !emulated(ex)) DMC_CUDA(cudaStreamSynchronize(ex->stream));
        return DM_OK;
    }
    if (eg->fused && !skip_rows) {
        DM_TRY(dmc_gen_launch(ex->gen, eg->fused - 1, seed, ex->partials, ex->stream));
        if (eg->tail) DM_TRY(run_gemm(ex, &eg->steps[eg->tail], ex->blas));
        if ((ex->flags & DM_CUDA_SYNC_EACH) && !emulated(ex)) {
            cudaError_t e = cudaStreamSynchronize(ex->stream);
            if (e != cudaSuccess)
                return dm_fail(DM_ERR_BACKEND, "group %d (%s), fused kernel: %s (%s)", gi,
                               op_at(ex->plan, &ex->plan->groups[gi], 0)->name, cudaGetErrorString(e),
                               cudaGetErrorName(e));
        }
        return DM_OK;
    }
    return run_steps(ex, gi, seed, skip_rows, 0);
}

dm_status dm_cuda_sync(dm_cuda_exec *ex) {
    if (!ex) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_sync: NULL executor");
    DM_TRY(join_all(ex)); /* the main stream then covers the side stream's work */
    if (emulated(ex)) return DM_OK;
    DMC_CUDA(cudaStreamSynchronize(ex->stream));
    return DM_OK;
}

/* Device address, element type and element count of tensor t's span (its first to its
 * last element, gaps of a strided view included). */
static dm_status tensor_span(const dm_cuda_exec *ex, int t, char **dev, int *dt, size_t *n) {
    const dm_graph *g = ex->plan->g;
    if (t < 0 || t >= g->nt) return dm_fail(DM_ERR_INVALID_ARG, "no tensor %d in the plan", t);
    const dm_tensor *x = &g->t[t];
    int r = dm_tensor_root(g, t);
    if (ex->plan->offset[r] < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "tensor %s is not materialized in the arena", x->name);
    int64_t last = 0;
    *n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (x->size[d] < 1) return DM_OK;
        last += (x->size[d] - 1) * x->stride[d];
    }
    *n = (size_t)(last + 1);
    if ((size_t)ex->plan->offset[r] + ((size_t)x->offset + *n) * sizeof(float) > ex->arena_bytes)
        return dm_fail(DM_ERR_INTERNAL, "tensor %s lies outside the arena", x->name);
    *dev = (char *)arena_ptr(ex, t, dt);
    return DM_OK;
}

/* Host fp32 <-> a 2-byte storage type (copy_tensor converts through a host buffer), on
 * the host's threads: a trainer's batch is millions of elements, converted every step. */
static void narrow(int dt, const float *src, void *dst, size_t n) {
    const int64_t m = (int64_t)n;
    if (dt == DMC_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (dt == DMC_BF16) {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) ((__nv_bfloat16 *)dst)[e] = __float2bfloat16_rn(src[e]);
    } else {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) ((__half *)dst)[e] = __float2half_rn(src[e]);
    }
}

static void widen(int dt, const void *src, float *dst, size_t n) {
    const int64_t m = (int64_t)n;
    if (dt == DMC_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (dt == DMC_BF16) {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) dst[e] = __bfloat162float(((const __nv_bfloat16 *)src)[e]);
    } else {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) dst[e] = __half2float(((const __half *)src)[e]);
    }
}

void dm_cuda_round(int dtype, float *x, size_t n) {
    if (dtype != DM_CUDA_BF16 && dtype != DM_CUDA_FP16) return;
    const float big = dtype == DM_CUDA_BF16 ? 3.38953139e38f : 65504.0f;
    for (size_t e = 0; e < n; e++) {
        float v = isfinite(x[e]) ? fminf(fmaxf(x[e], -big), big) : x[e];
        x[e] = dtype == DM_CUDA_BF16 ? __bfloat162float(__float2bfloat16_rn(v))
                                     : __half2float(__float2half_rn(v));
    }
}

static dm_status copy_tensor(dm_cuda_exec *ex, int t, float *host, int up) {
    DM_TRY(join_all(ex)); /* copies go through the main stream */
    char *dev = NULL;
    int dt = DMC_F32;
    size_t n = 0;
    DM_TRY(tensor_span(ex, t, &dev, &dt, &n));
    if (!n) return DM_OK;
    if (dt == DMC_F32)
        return up ? dev_copy(ex, dev, host, n * sizeof(float), cudaMemcpyHostToDevice)
                  : dev_copy(ex, host, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
    const size_t CHUNK = (size_t)1 << 20; /* elements per conversion */
    uint16_t *buf = (uint16_t *)malloc(sizeof(uint16_t) * (n < CHUNK ? n : CHUNK));
    if (!buf) return dm_fail(DM_ERR_OOM, "out of memory converting %s", ex->plan->g->t[t].name);
    dm_status s = DM_OK;
    for (size_t e = 0; e < n && s == DM_OK; e += CHUNK) {
        size_t m = n - e < CHUNK ? n - e : CHUNK;
        if (up) {
            narrow(dt, host + e, buf, m);
            s = dev_copy(ex, dev + e * 2, buf, m * 2, cudaMemcpyHostToDevice);
        } else {
            s = dev_copy(ex, buf, dev + e * 2, m * 2, cudaMemcpyDeviceToHost);
            if (s == DM_OK) widen(dt, buf, host + e, m);
        }
    }
    free(buf);
    return s;
}

dm_status dm_cuda_upload(dm_cuda_exec *ex, int t, const float *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_upload: NULL argument");
    return copy_tensor(ex, t, (float *)host, 1);
}

dm_status dm_cuda_download(dm_cuda_exec *ex, int t, float *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_download: NULL argument");
    return copy_tensor(ex, t, host, 0);
}

/* The whole arena: one copy in fp32; otherwise every materialized root converted, in
 * tensor order. Roots the plan lets share bytes (lifetimes apart) are separate on the
 * device when one of them is kept wide: downloading, the last one wins the shared host
 * bytes, so read a particular tensor with dm_cuda_download. */
static dm_status copy_arena(dm_cuda_exec *ex, void *host, int up) {
    DM_TRY(join_all(ex));
    if (!ex->arena_bytes) return DM_OK;
    if (ex->dtype == DM_CUDA_FP32)
        return up ? dev_copy(ex, ex->arena, host, ex->arena_bytes, cudaMemcpyHostToDevice)
                  : dev_copy(ex, host, ex->arena, ex->arena_bytes, cudaMemcpyDeviceToHost);
    const dm_graph *g = ex->plan->g;
    for (int r = 0; r < g->nt; r++)
        if (g->t[r].base < 0 && ex->plan->offset[r] >= 0)
            DM_TRY(copy_tensor(ex, r, (float *)((char *)host + ex->plan->offset[r]), up));
    return DM_OK;
}

dm_status dm_cuda_upload_arena(dm_cuda_exec *ex, const void *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_upload_arena: NULL argument");
    return copy_arena(ex, (void *)host, 1);
}

dm_status dm_cuda_download_arena(dm_cuda_exec *ex, void *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_download_arena: NULL argument");
    return copy_arena(ex, host, 0);
}

/* --- buffers and copies beside the arena (the trainer: train.cu, train/trainer_cuda.c) - */

int dmc_emulated(const dm_cuda_exec *ex) { return emulated(ex); }
cudaStream_t dmc_stream(const dm_cuda_exec *ex) { return ex->stream; }
dm_status dmc_join(dm_cuda_exec *ex) { return join_all(ex); }
dm_status dmc_tensor_span(const dm_cuda_exec *ex, int t, char **dev, int *dt, size_t *n) {
    return tensor_span(ex, t, dev, dt, n);
}

dm_status dm_cuda_alloc(dm_cuda_exec *ex, size_t bytes, void **dev, const char *what) {
    if (!ex || !dev) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_alloc: NULL argument");
    const size_t before = ex->dev_bytes;
    dm_status s = dev_alloc(ex, dev, bytes, what ? what : "a buffer");
    ex->dev_bytes = before; /* its user counts these */
    return s;
}

dm_status dm_cuda_tensor_elems(const dm_cuda_exec *ex, int t, size_t *n) {
    if (!ex || !n) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_tensor_elems: NULL argument");
    char *dev = NULL;
    int dt = DMC_F32;
    return tensor_span(ex, t, &dev, &dt, n);
}

size_t dm_cuda_exec_workspace_bytes(const dm_cuda_exec *ex) {
    if (!ex) return 0;
    size_t arena = ex->arena_bytes / 4 * (size_t)ex->esz; /* as allocated by init */
    if (!arena) arena = 256;
    return ex->dev_bytes > arena ? ex->dev_bytes - arena : 0;
}

void dm_cuda_free(dm_cuda_exec *ex, void *dev) {
    if (ex && dev) dev_free(ex, dev);
}

dm_status dm_cuda_memcpy(dm_cuda_exec *ex, void *dst, const void *src, size_t bytes, int to_device) {
    if (!ex || (bytes && (!dst || !src))) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_memcpy: NULL argument");
    DM_TRY(join_all(ex)); /* the copy goes through the main stream, after all work before it */
    return dev_copy(ex, dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
}

dm_status dm_cuda_copy_tensor(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts) {
    if (!dst || !src) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_copy_tensor: NULL executor");
    if (emulated(dst) != emulated(src))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_copy_tensor: one executor is emulated, the other not");
    char *pd = NULL, *ps = NULL;
    int dtd = DMC_F32, dts = DMC_F32;
    size_t nd = 0, ns = 0;
    DM_TRY(tensor_span(dst, td, &pd, &dtd, &nd));
    DM_TRY(tensor_span(src, ts, &ps, &dts, &ns));
    const dm_tensor *xd = &dst->plan->g->t[td], *xs = &src->plan->g->t[ts];
    int same = dtd == dts && nd == ns && xd->ndim == xs->ndim;
    for (int d = 0; same && d < xd->ndim; d++)
        same = xd->size[d] == xs->size[d] && xd->stride[d] == xs->stride[d];
    if (!same)
        return dm_fail(DM_ERR_INVALID_ARG, "cannot copy %s into %s: their shapes, layouts or storage "
                       "types differ", xs->name, xd->name);
    if (!nd) return DM_OK;
    /* on dst's stream, after src's work so far that writes the tensor (a side-stream group
     * among it: the input gradient's last sum may run there; the weight gradients there
     * go on, overlapping dst's work) and dst's own that touches its bytes; no host wait:
     * dst's later work is ordered after the copy, and src's later main-stream work (and
     * the side groups it forks) after it too */
    if (src->npending) DM_TRY(join_touching(src, ts, 0));
    if (dst->npending) DM_TRY(join_touching(dst, td, 1));
    const size_t bytes = nd * (dtd == DMC_F32 ? 4u : 2u);
    if (emulated(dst)) {
        memcpy(pd, ps, bytes);
        return DM_OK;
    }
    if (!src->have_xfer) {
        DMC_CUDA(cudaEventCreateWithFlags(&src->xfer, cudaEventDisableTiming));
        src->have_xfer = 1;
    }
    if (!dst->have_copied) {
        DMC_CUDA(cudaEventCreateWithFlags(&dst->copied, cudaEventDisableTiming));
        dst->have_copied = 1;
    }
    DMC_CUDA(cudaEventRecord(src->xfer, src->stream));
    DMC_CUDA(cudaStreamWaitEvent(dst->stream, src->xfer, 0));
    DMC_CUDA(cudaMemcpyAsync(pd, ps, bytes, cudaMemcpyDeviceToDevice, dst->stream));
    DMC_CUDA(cudaEventRecord(dst->copied, dst->stream));
    DMC_CUDA(cudaStreamWaitEvent(src->stream, dst->copied, 0));
    return DM_OK;
}
