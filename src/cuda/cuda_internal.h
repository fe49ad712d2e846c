/* cuda_internal.h: what the CUDA backend's .cu files share (CUDA C++ only): the checked
 * call macros, and the row program: the device-side description of a run of row ops
 * (element-wise and normalization) that the one generic row kernel (rows.cu) interprets
 * row by row, as the CPU executor runs dm_cpu_row (cpu/exec.c). */
#ifndef DM_CUDA_INTERNAL_H
#define DM_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <string>

extern "C" {
#include "core/status.h"
#include "plan/gemm.h"
#include "plan/plan.h"
}
#include "cuda/cuda_backend.h"

/* Every CUDA runtime and cuBLAS call goes through these: a failure returns
 * DM_ERR_BACKEND from the calling function with the call and the library's words. */
#define DMC_CUDA(call)                                                                  \
    do {                                                                                \
        cudaError_t dmc_e_ = (call);                                                    \
        if (dmc_e_ != cudaSuccess)                                                      \
            return dm_fail(DM_ERR_BACKEND, "%s failed: %s (%s)", #call,                 \
                           cudaGetErrorString(dmc_e_), cudaGetErrorName(dmc_e_));       \
    } while (0)

#define DMC_BLAS(call)                                                                  \
    do {                                                                                \
        cublasStatus_t dmc_s_ = (call);                                                 \
        if (dmc_s_ != CUBLAS_STATUS_SUCCESS)                                            \
            return dm_fail(DM_ERR_BACKEND, "%s failed: %s (%s)", #call,                 \
                           cublasGetStatusString(dmc_s_), cublasGetStatusName(dmc_s_)); \
    } while (0)

/* A kernel launch reports bad configurations through cudaGetLastError. */
#define DMC_LAUNCHED(what)                                                              \
    do {                                                                                \
        cudaError_t dmc_e_ = cudaGetLastError();                                        \
        if (dmc_e_ != cudaSuccess)                                                      \
            return dm_fail(DM_ERR_BACKEND, "launching %s failed: %s (%s)", what,        \
                           cudaGetErrorString(dmc_e_), cudaGetErrorName(dmc_e_));       \
    } while (0)

enum {
    DMC_MAX_ROWOPS = 16, /* row ops in one program (fused groups hold 2 to 5) */
    DMC_MAX_ACC = 8,     /* column accumulators in one program */
    DMC_LOC_GLOBAL = 0,  /* operand in device memory (arena or a batched group's temp) */
    DMC_LOC_SCRATCH = 1  /* operand in the block's scratch (shared, or global fallback) */
};

/* Element types of device tensors: the storage type of the arena (DM_CUDA_FP32/BF16/FP16,
 * cuda_backend.h), or fp32 for the scratch, the column accumulators and the tensors kept
 * wide whatever the storage (LayerNorm's row statistics). Arithmetic is fp32 always. */
enum { DMC_F32 = DM_CUDA_FP32, DMC_BF16 = DM_CUDA_BF16, DMC_F16 = DM_CUDA_FP16 };

typedef struct {
    int kind;     /* dm_arg_kind */
    int loc;      /* DMC_LOC_*; COLACC operands are always in scratch */
    int dt;       /* DMC_F32, DMC_BF16, DMC_F16: element type in memory (scratch: F32) */
    void *base;   /* GLOBAL: the tensor's first element on the device */
    int64_t rdiv; /* GROUPED: rows of the iteration space per row of the operand */
    int tensor;   /* GLOBAL: its root tensor (two roots may share bytes: an output written
                   * in place over an input, memplan.c) */
    int64_t slot; /* SCRATCH: float offset in the block's scratch */
} dmc_operand;

typedef struct {
    int kind;            /* dm_op_kind */
    int nin, nout;
    int act;             /* dm_act */
    uint32_t stream;     /* dropout site */
    int drop_on;         /* p > 0 */
    uint32_t drop_thr;   /* dm_dropout_threshold(p) */
    float drop_scale;    /* (float)(1 / (1 - p)), as the CPU computes it */
    int causal;          /* MASK_ADD: columns after the row's query (r mod cols) masked too */
    double eps;          /* LayerNorm */
    int64_t nindex;      /* EMBED: rows of its table (the T operand, in memory) */
    dmc_operand in[DM_MAX_IN], out[DM_MAX_OUT];
} dmc_rowop;

/* Ops that share one iteration space rows x cols, run in order for each row. */
typedef struct {
    int nops;
    int64_t rows, cols;
    int64_t scratch_floats; /* per block: internal rows, then the column accumulators */
    int64_t acc_off;        /* where the accumulators start in the scratch */
    int64_t acc_floats;     /* nacc * padded cols */
    int nacc;
    int vec;       /* every global operand 16-byte aligned, rows multiples of 16 bytes */
    int warp_rows; /* 0, or a row per team of this many lanes (8, 16, 32: short rows,
                    * no accumulators), acc_off floats of scratch per team */
    const long long *live; /* device: this step's live rows (set_rows; plan/live.h), or NULL:
                            * all `rows` run */
    int64_t live_rpt;      /* with live: the program's rows per live row */
    const int *rowkey;     /* device, or NULL: per live row, the row whose dropout words it
                            * draws (an unpadded layer's tokens: their padded positions) */
    void *acc_dst[DMC_MAX_ACC];  /* device: where the column sums go */
    int acc_dt[DMC_MAX_ACC];     /* their element types */
    int64_t acc_slot[DMC_MAX_ACC]; /* offset of accumulator a in the scratch */
    dmc_rowop ops[DMC_MAX_ROWOPS];
} dmc_rowprog;

/* How a program is launched (decided on the host at init). */
typedef struct {
    int threads, blocks;
    size_t smem_bytes;  /* dynamic shared memory (0 with global scratch) */
    int global_scratch; /* scratch at gscratch + blockIdx.x * scratch_floats */
    int dt;             /* the storage type: which instance of the kernel (every global
                         * operand but fp32 ones is of this type) */
} dmc_launch;

/* EMBED_BWD (scatter.cu): table[n, :] = the sum of dy[r, :] over the rows r with
 * idx[r] == n, deterministic (a stable counting sort of the rows by index, then sums in
 * chunks of the sorted rows and their partials in a fixed order). */
typedef struct {
    int64_t rows, cols, nindex; /* R (dy's rows, idx's length), C, N (the table's rows) */
    const void *dy, *idx;
    void *table;
    int dy_dt, idx_dt, table_dt;
    int64_t per;  /* rows a counting thread owns (K) */
    int64_t nthr; /* counting threads P = ceil(R / K) */
    int64_t seg;  /* sorted entries per chunk of the sums (S) */
    int *hist;    /* N * P + 1 counts, then offsets (index-major); the last: valid rows */
    int *sums;    /* the scan's block totals */
    int *key, *row; /* the sorted list: index and row, R each (the valid rows first) */
    float *part;  /* per chunk: head and tail partial rows (2 x C) */
} dmc_scatter;
/* Chooses per, nthr and seg for rows, cols, nindex (a function of these alone). */
dm_status dmc_scatter_plan(dmc_scatter *s);
/* Device work space the operation needs, and its pointers set inside `work`. */
size_t dmc_scatter_work_bytes(const dmc_scatter *s);
void dmc_scatter_bind(dmc_scatter *s, void *work);
int64_t dmc_scatter_chunks(const dmc_scatter *s);
dm_status dmc_scatter_launch(const dmc_scatter *s, cudaStream_t stream);
/* emulate: the same steps on the host, in the device's order (the same bits) */
void dmc_emu_scatter(const dmc_scatter *s);

/* ATTN and ATTN_BWD (varlen.cu): attention over packed sequences of their own lengths
 * (ops.def). Every operand but the lengths is of the storage type dt; q, k, v (and dctx)
 * are token rows, heads P apart, ld ldq (ldc, the context's; ldd, the gradients'). */
typedef struct {
    int bwd, causal, drop, dt, len_dt;
    int64_t B, J, H, P;
    float alpha, scale;    /* scale: 1 / (1 - p), used while drop (training) */
    uint32_t thr, stream;  /* dropout: an element is kept where its 16-bit uniform >= thr */
    const void *lengths;   /* B lengths (len_dt: fp32, the tensor kept wide); keymask: the
                            * (B, J) attention_mask instead, every sequence J long (ops.def) */
    int keymask;
    const void *q, *k, *v, *dctx;
    void *ctx, *probs, *dq, *dk, *dv; /* probs: b h j k, J x J per (sequence, head); ctx: the
                                       * forward's output (bwd: its input, read by flash) */
    int64_t ldq, ldc, ldd, ldo; /* ldc: ctx's (fwd) or dctx's (bwd); ldo: ctx's in bwd */
    int flash;             /* flash.cu's kernels (dmc_flash_ok), else the steps below */
    int *off;              /* work: the B + 1 sequences' first rows */
    void *pad[5];          /* work: padded head-major copies, B x H x J x P each */
    void *sq[2];           /* work: B x H x J x J each: scores, dropped probabilities, dP, dS */
    float *fl_d;           /* work (flash bwd): rowsum(dctx ctx), B H J */
} dmc_varlen;
/* Device work space (bwd: 5 copies and 2 squares, else 4 and 1; flash: flash.cu's), and
 * its pointers set inside `work`. */
size_t dmc_varlen_work_bytes(const dmc_varlen *v);
void dmc_varlen_bind(dmc_varlen *v, void *work);
/* The op with this seed on `stream` (cuBLAS through `blas`, set to that stream), or with
 * emulated != 0 the same steps on the host. */
dm_status dmc_varlen_run(const dmc_varlen *v, uint64_t seed, int emulated, cublasHandle_t blas, cudaStream_t stream);
/* flash.cu: whether its kernels take this op on a device with smem_max bytes of shared
 * memory a block (0: the emulation), else *why says what does not fit (the same answer
 * for an ATTN and its ATTN_BWD: it reads only what both share); the work space past the
 * offsets, its binding, and the run (offsets already computed). */
int dmc_flash_ok(const dmc_varlen *v, size_t smem_max, const char **why);
size_t dmc_flash_work_bytes(const dmc_varlen *v);
/* ATTN_BWD's own operands (dctx, dQ, dK, dV), which dmc_flash_ok does not see, 4-byte
 * aligned with even strides, else DM_ERR_UNSUPPORTED (its forward kept no probabilities) */
dm_status dmc_flash_bwd_check(const dmc_varlen *v);
/* Raises the kernels' dynamic shared memory limit to what they take (the backward's is
 * above 48 KiB at heads of 128): once, when the group is built on a device. */
dm_status dmc_flash_allow_smem(const dmc_varlen *v);
void dmc_flash_bind(dmc_varlen *v, void *work);
dm_status dmc_flash_run(const dmc_varlen *v, uint64_t seed, int emulated, cudaStream_t stream);

/* LINEAR_XENT and LINEAR_XENT_BWD (xent.cu): the fused decoder and cross-entropy
 * (ops.def), the vocabulary in chunks of `chunk` columns whose logits (fp32) live in the
 * work space. t (m x e), W (v x e), bias (v) and the gradients are of the storage type
 * dt; the row vectors (labels, lse, dloss, loss, pred) of their own types. */
typedef struct {
    int bwd, dt, lab_dt;
    int in_dt[2];         /* bwd: lse's and dloss's */
    int out_dt[3];        /* fwd: loss's, lse's, pred's */
    int64_t m, e, v;      /* rows (the capacity), inner, vocabulary */
    int64_t m_run;        /* the rows this step runs (its live rows; else m) */
    int64_t chunk;        /* dmc_xent_plan */
    const void *t, *W, *bias, *labels, *lse_in, *dloss;
    void *loss, *lse, *pred;  /* forward */
    void *dt_out, *dW, *dbias; /* backward */
    float *logits, *part;  /* work: a chunk's logits (m x chunk); the rows' partials (5 x m) */
    void *dl;              /* work: the chunk's dl in the storage type (logits in fp32) */
    float *acc;            /* work: dt's fp32 accumulator (dt_out in fp32) */
} dmc_xent;
dm_status dmc_xent_plan(dmc_xent *x);
size_t dmc_xent_work_bytes(const dmc_xent *x);
void dmc_xent_bind(dmc_xent *x, void *work);
/* The op on `stream` (cuBLAS through `blas`, set to that stream), or with emulated != 0
 * the same steps on the host. */
dm_status dmc_xent_run(const dmc_xent *x, int emulated, cublasHandle_t blas, cudaStream_t stream);

/* cudaexec/transfer.cu, for train.cu: whether the executor is emulated, its main
 * stream, a wait for its side stream's groups, and tensor t's span (device address,
 * element type, elements from its first to its last). */
int dmc_emulated(const dm_cuda_exec *ex);
cudaStream_t dmc_stream(const dm_cuda_exec *ex);
dm_status dmc_join(dm_cuda_exec *ex);
dm_status dmc_tensor_span(const dm_cuda_exec *ex, int t, char **dev, int *dt, size_t *n);

/* rows.cu */
/* The most threads per block the row kernel takes (its launch bounds). */
int dmc_rows_max_threads(void);
/* Raises the kernel's dynamic shared memory limit to `bytes` (needed above 48 KiB). */
dm_status dmc_rows_allow_smem(size_t bytes);
/* Runs program `dprog` (device copy of `hprog`), then sums the column accumulators'
 * per-block partials in a fixed order (deterministic) into hprog->acc_dst. */
dm_status dmc_rows_launch(const dmc_rowprog *dprog, const dmc_rowprog *hprog,
                          const dmc_launch *lc, uint64_t seed, float *gscratch,
                          float *partials, cudaStream_t stream);

/* The batch dimensions of a contraction, merged where their strides allow (outer stride
 * = inner stride * inner size in A, B and C). cudaexec/exec.cu. */
typedef struct {
    int nd;
    int64_t sz[DM_MAX_DIMS], sa[DM_MAX_DIMS], sb[DM_MAX_DIMS], sc[DM_MAX_DIMS];
    int64_t count; /* all matrices: the product of sz */
} dmc_batches;
void dmc_gemm_batches(const dm_gemm_map *gm, dmc_batches *bt);
/* Element offsets in A, B, C of matrix number q (row-major over the merged dims). */
void dmc_batch_offsets(const dmc_batches *bt, int64_t q, int64_t *oa, int64_t *ob, int64_t *oc);

/* A batched group of the shape GEMM, row ops, GEMM (attention's forward: scores, mask,
 * softmax, dropout, context), or GEMM, row ops, GEMM, GEMM (its backward: d probs,
 * dropout and softmax backward, d queries, d keys) as one fused kernel (cudagen/attn.cu,
 * DM_CUDA_GEN, 16-bit storage):
 * per batch item and 16 rows, a warp computes C1 = alpha1 op(A1) op(B1) on tensor cores
 * into shared memory (fp32), runs the row program over those rows (reading C1 there; the
 * operand GEMM 2 reads is written there too), and C2 = alpha2 P op(B2) to memory. The
 * scores never leave the SM. cudaexec/build.cu checks that the rows of prog are C1's
 * and P's rows item by item. */
typedef struct {
    const dmc_rowprog *prog; /* the row ops (host copy; device addresses) */
    dm_gemm_map g1, g2;      /* device addresses of the storage type */
    dmc_batches b1, b2;
    int has3;                /* attention's backward: also C3 = alpha3 P^T op(B3) over all
                              * rows of an item (a block per item) */
    int tail_step;           /* the group's step of GEMM 3 (2 or 3), when it has one */
    dm_gemm_map g3;
    dmc_batches b3;
    int dt;                  /* the storage type (DMC_BF16 or DMC_F16) */
    int p_in_memory;         /* P (g2.A) is kept for later groups: written to memory too */
    size_t smem_max;         /* the most dynamic shared memory a block may use */
} dmc_attn;

/* cudagen/ (gen.cu, genbuild.cu): row kernels generated per program (DM_CUDA_GEN). */
enum { DMC_GEN_MAXP = 48 }; /* global operands of one program (genrt.cuh: DMG_MAXP) */
typedef struct {
    int threads, teams, blocks; /* launch: teams of lanes per block, one row per team */
    size_t smem;                /* dynamic shared memory: the teams' column accumulators */
    int nparams;
    void *params[DMC_GEN_MAXP]; /* the global operands' addresses, in argument order */
    int64_t acc_floats;         /* one block's partial column sums (prog->acc_floats) */
    void *kernel;               /* device: a cudaKernel_t */
    void *host;                 /* emulation: the host build's entry */
} dmc_genk;
typedef struct dmc_gen dmc_gen;
/* DM_OK if program p can run as a generated kernel (dm_last_error says why not). */
dm_status dmc_gen_eligible(const dmc_rowprog *p);
/* DM_OK if the fused kernel of a can be generated (tile sizes, alignment, shared memory). */
dm_status dmc_gen_attn_eligible(const dmc_attn *a);
/* The CUDA C++ of progs[0..n) then attns[0..na) (kernels dmg_k<i>, host entries
 * dmg_h<i>, i < n + na) into *src, and their launch shapes into k[0..n+na); sms: the
 * GPU's multiprocessors. Element types come from each operand. cudagen/gen.cu. */
dm_status dmc_gen_source(const dmc_rowprog *const *progs, int n, const dmc_attn *attns, int na,
                         int sms, dmc_genk *k, std::string *src);
/* Generates and compiles the kernels of progs[0..n) (host copies, device addresses) and
 * of the fused groups attns[0..na): emulate 0, NVRTC and the runtime's library loader for
 * `device`; 1 or 2, the host compiler, for a team of one lane or lanes simulated by
 * threads (NVRTC still compiles the device text, to PTX). */
dm_status dmc_gen_build(dmc_gen **out, const dmc_rowprog *const *progs, int n,
                        const dmc_attn *attns, int na, int emulate, int device);
const dmc_genk *dmc_gen_kernel(const dmc_gen *gn, int i);
/* Runs kernel i (its column sums as per-block partials; dmc_colacc_launch adds them). */
dm_status dmc_gen_launch(const dmc_gen *gn, int i, uint64_t seed, float *partials, cudaStream_t stream);
void dmc_gen_free(dmc_gen *gn);

/* rows.cu: the column sums of `nblocks` per-block partials of program hprog (device copy
 * dprog) into its acc_dst, in a fixed order. */
dm_status dmc_colacc_launch(const dmc_rowprog *dprog, const dmc_rowprog *hprog, const float *partials,
                            int nblocks, cudaStream_t stream);

/* emulate.cu (DM_CUDA_EMULATE): what cublasGemmStridedBatchedEx (column-major, elements
 * of type dt, strides in elements) and dmc_rows_launch compute, on the host, with the
 * same arguments. */
void dmc_emu_gemm(int dt, int transa, int transb, int m, int n, int k, float alpha, const void *A,
                  int lda, long long sA, const void *B, int ldb, long long sB, float beta,
                  void *C, int ldc, long long sC, int batch);
/* The same with C of its own type dtc (cublasGemmEx's Ctype). */
void dmc_emu_gemm_ex(int dt, int dtc, int transa, int transb, int m, int n, int k, float alpha, const void *A,
                     int lda, long long sA, const void *B, int ldb, long long sB, float beta,
                     void *C, int ldc, long long sC, int batch);
dm_status dmc_emu_rows(const dmc_rowprog *prog, const dmc_launch *lc, uint64_t seed,
                       float *gscratch, float *partials);
/* What dmc_colacc_launch computes. */
void dmc_emu_colacc(const dmc_rowprog *p, const float *partials, int nblocks);

#endif
