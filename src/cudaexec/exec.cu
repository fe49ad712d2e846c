/* exec.cu: the CUDA group executor, shaped like the CPU one (cpu/exec.c) and driven by
 * the same dm_plan: the same groups in the same order, every materialized tensor at its
 * memplan offset in one device arena (fp32).
 *
 * - A lone contraction is one dm_gemm_map (plan/gemm.c: dm_gemm_map_prepare only does
 *   pointer arithmetic, so it is given device pointers) run by cuBLAS: the row-major call
 *   C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the operands are
 *   swapped; batch dimensions whose strides merge become one strided-batched call, any
 *   others are looped over on the host. fp32 compute (CUBLAS_COMPUTE_32F); TF32 only when
 *   asked for (DM_CUDA_TF32).
 * - A row group (element-wise and normalization ops over one rows x cols space) is one
 *   row program run by the generic row kernel (rows.cu); tensors internal to the group
 *   are rows of the block's scratch, as the CPU's per-thread scratch rows.
 * - A batched group (attention: QK^T, mask, softmax, dropout, .V per (b, h)) runs, when
 *   interpreted, NOT flash-style: each contraction over the whole batch (one cuBLAS call) into a
 *   temporary device tensor for each tile tensor a GEMM touches (full size, in a buffer
 *   shared by the batched groups), and each run of row ops as one row program over all
 *   rows, its own intermediates in scratch. Correct, but it moves the score matrices
 *   through global memory that the CPU keeps in per-thread tiles.
 * Every CUDA and cuBLAS call is checked (DMC_CUDA, DMC_BLAS: DM_ERR_BACKEND with the
 * library's words). DM_CUDA_EMULATE runs the same executor on host memory (emulate.cu),
 * so tests check this file's mapping of the plan on machines without a GPU.
 * With --rows gen (DM_CUDA_GEN) row programs and attention's groups run as kernels
 * generated for the plan (cudagen/) instead: see build.cu.
 * This file: device memory, set-up and tear-down, running a group, profiling by events;
 * the rest of the executor beside it (exec.h lists the files). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaexec/exec.h"

extern "C" {
#include "core/sysinfo.h"
}

/* --- the pool of main-stream buffers a trainer's layers share (exec.h) --------------- */

dm_status dm_cuda_pool_new(dm_cuda_pool **out, int emulated) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_pool_new: NULL argument");
    *out = (dm_cuda_pool *)calloc(1, sizeof **out);
    if (!*out) return dm_fail(DM_ERR_OOM, "out of memory");
    (*out)->emulated = emulated != 0;
    return DM_OK;
}

size_t dm_cuda_pool_bytes(const dm_cuda_pool *p) {
    size_t n = 0;
    for (int k = 0; p && k < POOL_N; k++) n += p->bytes[k];
    return n;
}

/* Device memory: cudaMalloc'd, or host memory when emulating (DM_CUDA_EMULATE, emulate.cu). */
static void mem_free(int emulating, void *p) {
    if (emulating) free(p);
    else if (p) (void)cudaFree(p);
}

void dm_cuda_pool_free(dm_cuda_pool *p) {
    if (!p) return;
    for (int k = 0; k < POOL_N; k++) mem_free(p->emulated, p->buf[k]);
    free(p);
}

dm_status dmx_dev_alloc(dm_cuda_exec *ex, void **p, size_t bytes, const char *what) {
    if (bytes == 0) bytes = 256;
    ex->dev_bytes += bytes;
    if (dmx_emulated(ex)) { /* 256-byte aligned and zeroed, as cudaMalloc's (plus the memset) */
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

void dmx_dev_free(const dm_cuda_exec *ex, void *p) { mem_free(dmx_emulated(ex), p); }

/* Main-stream buffer k (POOL_*) of `bytes` for ex: its pool's where there is one of the
 * same kind of memory (made by the first executor to ask, of its size, and counted by the
 * pool, not by ex) and it holds that many; else ex's own. */
static dm_status main_alloc(dm_cuda_exec *ex, int k, void **p, size_t bytes, const char *what) {
    dm_cuda_pool *pool = ex->pool;
    if (pool && pool->emulated == dmx_emulated(ex)) {
        if (!pool->buf[k]) {
            const size_t before = ex->dev_bytes;
            DM_TRY(dmx_dev_alloc(ex, &pool->buf[k], bytes, what));
            ex->dev_bytes = before;
            pool->bytes[k] = bytes;
        }
        if (pool->bytes[k] >= bytes) {
            *p = pool->buf[k];
            ex->pooled[k] = 1;
            return DM_OK;
        }
    }
    return dmx_dev_alloc(ex, p, bytes, what);
}

/* A synchronous copy between host and device (or host and host, emulating). */
dm_status dmx_dev_copy(const dm_cuda_exec *ex, void *dst, const void *src, size_t bytes,
                          cudaMemcpyKind kind) {
    if (!bytes) return DM_OK;
    if (dmx_emulated(ex)) {
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
    /* one of several ranks on this machine: GPU local_rank mod the GPUs it sees (with
     * CUDA_VISIBLE_DEVICES set per rank by the launcher: its one GPU) */
    if (dm_local_rank() >= 0 && (e = cudaSetDevice(dm_local_rank() % count)) != cudaSuccess) {
        snprintf(why, n, "cudaSetDevice(%d) for local rank %d failed: %s", dm_local_rank() % count, dm_local_rank(),
                 cudaGetErrorString(e));
        return dm_fail(DM_ERR_BACKEND, "no usable CUDA device: %s" NO_DEVICE_HINT, why);
    }
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

/* A non-blocking stream and a cuBLAS handle bound to it (TF32 only when asked for); the
 * have_ flags say what exists, for dm_cuda_exec_free. */
dm_status dmx_stream_and_blas(const dm_cuda_exec *ex, cudaStream_t *st, int *have_st, cublasHandle_t *h,
                                 int *have_h) {
    DMC_CUDA(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
    *have_st = 1;
    DMC_BLAS(cublasCreate(h));
    *have_h = 1;
    DMC_BLAS(cublasSetStream(*h, *st));
    DMC_BLAS(cublasSetMathMode(*h, (ex->flags & DM_CUDA_TF32) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return DM_OK;
}

/* Profiling by events (dm_cuda_exec_profile): group gi's start (end = 0) or end event on
 * the stream its work goes to; the end marks both recorded. */
dm_status dmx_prof_mark(dm_cuda_exec *ex, int gi, int end, cudaStream_t st) {
    if (!ex->prof_on || dmx_emulated(ex) || !ex->prof_ev) return DM_OK;
    DMC_CUDA(cudaEventRecord(ex->prof_ev[2 * gi + end], st));
    if (end) ex->prof_rec[gi] = 1;
    return DM_OK;
}

const char *dm_cuda_exec_gpu_name(const dm_cuda_exec *ex) { return ex ? ex->gpu : ""; }

static dm_status init_all(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    if (dmx_emulated(ex)) {
        ex->smem_optin = 227 * 1024 - 1024; /* as an H100 */
    } else {
        DMC_CUDA(cudaGetDevice(&ex->device));
        DMC_CUDA(cudaDeviceGetAttribute(&ex->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        ex->device));
        ex->smem_optin -= 1024; /* the kernel's static shared memory, with room to spare */
        if (ex->smem_optin < 0) ex->smem_optin = 0;
        DM_TRY(dmx_stream_and_blas(ex, &ex->stream, &ex->have_stream, &ex->blas, &ex->have_blas));
    }

    ex->arena_bytes = plan->arena_bytes;
    size_t dev_bytes = ex->arena_bytes / 4 * (size_t)ex->esz;
    DM_TRY(dmx_dev_alloc(ex, (void **)&ex->arena, dev_bytes, "the layer's tensors"));
    if (!dmx_emulated(ex)) /* emulated memory comes zeroed from dev_alloc */
        DMC_CUDA(cudaMemsetAsync(ex->arena, 0, dev_bytes ? dev_bytes : 256, ex->stream));
    if (ex->dtype != DM_CUDA_FP32) DM_TRY(dmx_init_wide(ex));

    /* the tile temporaries: sized for the largest batched group */
    dmc_tiles tl;
    for (int gi = 0; gi < plan->ngroups; gi++) {
        if (plan->groups[gi].nbatch <= 1) continue;
        DM_TRY(dmx_group_tiles(plan, &plan->groups[gi], &tl));
        if ((size_t)tl.floats > ex->temp_floats) ex->temp_floats = (size_t)tl.floats;
    }
    if (ex->temp_floats)
        DM_TRY(main_alloc(ex, POOL_TEMP, (void **)&ex->temp, ex->temp_floats * (size_t)ex->esz,
                          "the attention score temporaries"));

    ex->ngroups = plan->ngroups;
    ex->groups = (dmc_group *)calloc((size_t)(plan->ngroups > 0 ? plan->ngroups : 1), sizeof(dmc_group));
    if (!ex->groups) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    for (int gi = 0; gi < plan->ngroups; gi++) DM_TRY(dmx_build_group(ex, gi, &tl));
    /* the attention and fused cross-entropy steps' work space: one for all (they run one
     * at a time on the main stream, and keep nothing in it between them), shared through
     * the pool */
    size_t lone_bytes = 0;
    for (int gi = 0; gi < ex->ngroups; gi++)
        for (int k = 0; k < ex->groups[gi].nsteps; k++) {
            const dmc_step *st = &ex->groups[gi].steps[k];
            const size_t b = st->varlen ? dmc_varlen_work_bytes(&st->vl) : st->xent ? dmc_xent_work_bytes(&st->xe) : 0;
            if (b > lone_bytes) lone_bytes = b;
        }
    if (lone_bytes)
        DM_TRY(main_alloc(ex, POOL_LONE, &ex->lone_work, lone_bytes, "the attention's or cross-entropy's work space"));
    for (int gi = 0; gi < ex->ngroups; gi++)
        for (int k = 0; k < ex->groups[gi].nsteps; k++) {
            dmc_step *st = &ex->groups[gi].steps[k];
            if (st->varlen) dmc_varlen_bind(&st->vl, ex->lone_work);
            if (st->xent) dmc_xent_bind(&st->xe, ex->lone_work);
        }
    DM_TRY(dmx_init_live(ex));

    if (ex->flags & DM_CUDA_GEN) DM_TRY(dmx_init_gen(ex));
    if (ex->flags & DM_CUDA_EPILOGUE) DM_TRY(dmx_init_epilogues(ex));

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
    if (max_smem > 48 * 1024 && !dmx_emulated(ex)) DM_TRY(dmc_rows_allow_smem(max_smem));
    if (ex->nprogs && !dmx_emulated(ex)) { /* emulating, the host copies serve */
        size_t pb = sizeof(dmc_rowprog) * (size_t)ex->nprogs;
        DM_TRY(dmx_dev_alloc(ex, (void **)&ex->dprogs, pb, "the row programs"));
        DM_TRY(dmx_dev_copy(ex, ex->dprogs, ex->hprogs, pb, cudaMemcpyHostToDevice));
    }
    if (ex->gscratch_floats)
        DM_TRY(main_alloc(ex, POOL_GSCRATCH, (void **)&ex->gscratch, ex->gscratch_floats * sizeof(float),
                          "row scratch"));
    if (ex->partial_floats)
        DM_TRY(main_alloc(ex, POOL_PARTIALS, (void **)&ex->partials, ex->partial_floats * sizeof(float),
                          "column-sum partials"));
    if ((ex->flags & DM_CUDA_AUTO) && (ex->flags & DM_CUDA_GEN)) DM_TRY(dmx_auto_select(ex));
    if (ex->flags & DM_CUDA_OVERLAP) DM_TRY(dmx_init_overlap(ex)); /* after partial_floats is known */
    if (!dmx_emulated(ex)) DMC_CUDA(cudaStreamSynchronize(ex->stream));
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

/* The profiling events made so far and their marks, released (made again on next use). */
static void prof_release(dm_cuda_exec *ex) {
    for (int i = 0; i < ex->nprof_ev; i++) (void)cudaEventDestroy(ex->prof_ev[i]);
    free(ex->prof_ev);
    free(ex->prof_rec);
    ex->prof_ev = NULL;
    ex->prof_rec = NULL;
    ex->nprof_ev = 0;
}

void dm_cuda_exec_free(dm_cuda_exec *ex) {
    if (!ex) return;
    if (ex->have_side_stream) (void)cudaStreamSynchronize(ex->side_stream); /* before any free */
    if (ex->have_stream) (void)cudaStreamSynchronize(ex->stream);
    dmx_dev_free(ex, ex->arena);
    if (!ex->pooled[POOL_TEMP]) dmx_dev_free(ex, ex->temp);
    dmx_dev_free(ex, ex->side);
    free(ex->wide);
    free(ex->side_off);
    if (!ex->pooled[POOL_GSCRATCH]) dmx_dev_free(ex, ex->gscratch);
    if (!ex->pooled[POOL_PARTIALS]) dmx_dev_free(ex, ex->partials);
    if (!ex->pooled[POOL_LONE]) dmx_dev_free(ex, ex->lone_work);
    dmx_dev_free(ex, ex->dprogs);
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
    prof_release(ex);
    free(ex->on_side);
    free(ex->pending);
    free(ex->pending_seed);
    dmx_dev_free(ex, ex->side_partials);
    if (ex->spans)
        for (int gi = 0; gi < ex->ngroups; gi++) free(ex->spans[gi]);
    free(ex->spans);
    free(ex->nspans);
    if (ex->groups)
        for (int gi = 0; gi < ex->ngroups; gi++) {
            for (int k = 0; k < ex->groups[gi].nsteps; k++) {
                dmx_dev_free(ex, ex->groups[gi].steps[k].ptrs);
                dmx_dev_free(ex, ex->groups[gi].steps[k].work);
            }
            free(ex->groups[gi].steps);
            dmx_epi_free(ex->groups[gi].epi);
        }
    free(ex->drop_scale);
    dmx_dev_free(ex, ex->livebuf);
    free(ex->livehost);
    free(ex->liveg);
    dmx_dev_free(ex, ex->lt_ws);
    if (ex->have_lt) (void)cublasLtDestroy(ex->lt);
    free(ex->groups);
    dmc_gen_free(ex->gen);
    free(ex->gen_of);
    free(ex->hprogs);
    free(ex->launch);
    free(ex);
}

void dmc_gemm_batches(const dm_gemm_map *gm, dmc_batches *bt) {
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

/* One contraction: one cuBLAS call, strided-batched (batch dims merged into one stride)
 * or batched over the address arrays of gemm_pointer_arrays. Emulating, the dimensions
 * that do not merge are looped over here. */
dm_status dmx_run_gemm(const dm_cuda_exec *ex, const dmc_step *st, cublasHandle_t blas) {
    const dm_gemm_map *gm = &st->gm;
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
    if (st->ktail && st->ktail < gm->k) { /* k rounded past the live rows (live.cu): zero them in both */
        const size_t rows = (size_t)(gm->k - st->ktail);
        char *za = (char *)gm->A + (int64_t)st->ktail * gm->lda * es, *zb = (char *)gm->B + (int64_t)st->ktail * gm->ldb * es;
        if (dmx_emulated(ex)) {
            for (size_t r = 0; r < rows; r++) {
                memset(za + (int64_t)r * gm->lda * es, 0, (size_t)(gm->m * es));
                memset(zb + (int64_t)r * gm->ldb * es, 0, (size_t)(gm->n * es));
            }
        } else {
            cudaStream_t zs;
            DMC_BLAS(cublasGetStream(blas, &zs));
            DMC_CUDA(cudaMemset2DAsync(za, (size_t)(gm->lda * es), 0, (size_t)(gm->m * es), rows, zs));
            DMC_CUDA(cudaMemset2DAsync(zb, (size_t)(gm->ldb * es), 0, (size_t)(gm->n * es), rows, zs));
        }
    }
    int64_t outer = bt.count / (inner > 0 ? inner : 1);
    dmc_batches ob_ = bt; /* the outer dims alone */
    ob_.nd = nd > 0 ? nd - 1 : 0;
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa, ob, oc;
        dmc_batch_offsets(&ob_, o, &oa, &ob, &oc);
        if (dmx_emulated(ex)) {
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
dm_status dmx_run_steps(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows, int side) {
    const dmc_group *eg = &ex->groups[gi];
    cudaStream_t stream = side ? ex->side_stream : ex->stream;
    cublasHandle_t blas = side ? ex->blas2 : ex->blas;
    float *partials = side ? ex->side_partials : ex->partials;
    for (int s = 0; s < eg->nsteps; s++) {
        const dmc_step *st = &eg->steps[s];
        if (s > 0 && (ex->flags & DM_CUDA_SYNC_EACH) && !dmx_emulated(ex)) {
            cudaError_t e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess)
                return dm_fail(DM_ERR_BACKEND, "group %d (%s), step %d: %s (%s)", gi,
                               dmx_op_at(ex->plan, &ex->plan->groups[gi], 0)->name, s - 1,
                               cudaGetErrorString(e), cudaGetErrorName(e));
        }
        if (st->gemm) {
            DM_TRY(dmx_run_gemm(ex, st, blas));
        } else if (st->scatter) { /* (as the CPU: run with only_contractions too) */
            if (dmx_emulated(ex)) dmc_emu_scatter(&st->sc);
            else DM_TRY(dmc_scatter_launch(&st->sc, stream));
        } else if (st->varlen) {
            DM_TRY(dmc_varlen_run(&st->vl, seed, dmx_emulated(ex), blas, stream));
        } else if (st->xent) { /* a contraction: run with only_contractions too */
            DM_TRY(dmc_xent_run(&st->xe, dmx_emulated(ex), blas, stream));
        } else if (!skip_rows && ex->gen_of && ex->gen_of[st->prog] >= 0 && !ex->evaluating) {
            const dmc_rowprog *hp = &ex->hprogs[st->prog];
            const dmc_genk *k = dmc_gen_kernel(ex->gen, ex->gen_of[st->prog]);
            DM_TRY(dmc_gen_launch(ex->gen, ex->gen_of[st->prog], seed, partials, stream));
            if (hp->nacc && dmx_emulated(ex)) dmc_emu_colacc(hp, partials, k->blocks);
            else if (hp->nacc)
                DM_TRY(dmc_colacc_launch(ex->dprogs + st->prog, hp, partials, k->blocks, stream));
        } else if (!skip_rows && dmx_emulated(ex)) {
            DM_TRY(dmc_emu_rows(&ex->hprogs[st->prog], &ex->launch[st->prog], seed, ex->gscratch,
                                partials));
        } else if (!skip_rows) {
            DM_TRY(dmc_rows_launch(ex->dprogs + st->prog, &ex->hprogs[st->prog], &ex->launch[st->prog],
                                   seed, ex->gscratch, partials, stream));
        }
    }
    if (!skip_rows) DM_TRY(dmx_zero_tail(ex, gi, stream));
    if ((ex->flags & DM_CUDA_SYNC_EACH) && !dmx_emulated(ex) && eg->nsteps > 0) {
        cudaError_t e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess)
            return dm_fail(DM_ERR_BACKEND, "group %d (%s), step %d: %s (%s)", gi,
                           dmx_op_at(ex->plan, &ex->plan->groups[gi], 0)->name, eg->nsteps - 1,
                           cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return DM_OK;
}

static dm_status group_work(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows);

dm_status dm_cuda_exec_set_training(dm_cuda_exec *ex, int training) {
    if (!ex) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_set_training: NULL executor");
    if (ex->evaluating == !training) return DM_OK;
    DM_TRY(dmx_join_all(ex)); /* the side stream's groups read the programs too */
    if (!ex->drop_scale) { /* the scales as made: training's */
        if (!(ex->drop_scale = (float *)malloc(sizeof(float) * (size_t)(ex->nprogs > 0 ? ex->nprogs : 1) * DMC_MAX_ROWOPS)))
            return dm_fail(DM_ERR_OOM, "out of memory for evaluation mode");
        for (int i = 0; i < ex->nprogs; i++)
            for (int k = 0; k < ex->hprogs[i].nops; k++) ex->drop_scale[i * DMC_MAX_ROWOPS + k] = ex->hprogs[i].ops[k].drop_scale;
    }
    for (int i = 0; i < ex->nprogs; i++) /* off: as with p = 0 (no mask, scale 1) */
        for (int k = 0; k < ex->hprogs[i].nops; k++) {
            dmc_rowop *op = &ex->hprogs[i].ops[k];
            op->drop_on = training && op->drop_thr != 0;
            op->drop_scale = training ? ex->drop_scale[i * DMC_MAX_ROWOPS + k] : 1.0f;
        }
    for (int gi = 0; gi < ex->ngroups; gi++)
        for (int k = 0; k < ex->groups[gi].nsteps; k++) {
            dmc_varlen *v = &ex->groups[gi].steps[k].vl;
            if (ex->groups[gi].steps[k].varlen) v->drop = training && v->thr != 0;
        }
    /* the device's copy, after the work before it (the programs' last users); emulating,
     * the host copies serve. Set first, as the host copies are: after a failed copy
     * the next call still switches (and sends) them */
    ex->evaluating = !training;
    if (ex->nprogs && !dmx_emulated(ex))
        DM_TRY(dmx_dev_copy(ex, ex->dprogs, ex->hprogs, sizeof(dmc_rowprog) * (size_t)ex->nprogs,
                            cudaMemcpyHostToDevice));
    return DM_OK;
}

dm_status dm_cuda_exec_profile(dm_cuda_exec *ex, int on, int *by_events) {
    if (!ex || !by_events) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_profile: NULL argument");
    *by_events = 0;
    ex->prof_on = 0;
    if (!on || dmx_emulated(ex)) return DM_OK;
    if (!ex->prof_ev) {
        const int n = 2 * (ex->ngroups > 0 ? ex->ngroups : 1);
        ex->prof_ev = (cudaEvent_t *)calloc((size_t)n, sizeof *ex->prof_ev);
        ex->prof_rec = (char *)calloc((size_t)n / 2, 1);
        if (!ex->prof_ev || !ex->prof_rec) {
            prof_release(ex);
            return dm_fail(DM_ERR_OOM, "out of memory for the profiling events");
        }
        for (; ex->nprof_ev < n; ex->nprof_ev++) {
            cudaError_t e = cudaEventCreate(&ex->prof_ev[ex->nprof_ev]);
            if (e != cudaSuccess) {
                prof_release(ex);
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
    if (ex->on_side && ex->on_side[gi] && !only_contractions) return dmx_launch_side(ex, gi, seed);
    DM_TRY(dmx_resolve_hazards(ex, gi));
    if (eg->epi) DM_TRY(dmx_resolve_hazards(ex, gi + 1)); /* it writes the bias group's output */
    /* the start event after the waits: a group's time is its own work */
    DM_TRY(dmx_prof_mark(ex, gi, 0, ex->stream));
    DM_TRY(group_work(ex, gi, seed, skip_rows));
    return dmx_prof_mark(ex, gi, 1, ex->stream);
}

/* The work of group gi on the main stream, its hazards resolved. */
static dm_status group_work(dm_cuda_exec *ex, int gi, uint64_t seed, int skip_rows) {
    const dmc_group *eg = &ex->groups[gi];
    if (eg->epi) {
        DM_TRY(dmx_run_epi(ex, eg));
        if ((ex->flags & DM_CUDA_SYNC_EACH) && !dmx_emulated(ex)) DMC_CUDA(cudaStreamSynchronize(ex->stream));
        return DM_OK;
    }
    if (eg->fused && !skip_rows && !ex->evaluating) {
        DM_TRY(dmc_gen_launch(ex->gen, eg->fused - 1, seed, ex->partials, ex->stream));
        if (eg->tail) DM_TRY(dmx_run_gemm(ex, &eg->steps[eg->tail], ex->blas));
        if ((ex->flags & DM_CUDA_SYNC_EACH) && !dmx_emulated(ex)) {
            cudaError_t e = cudaStreamSynchronize(ex->stream);
            if (e != cudaSuccess)
                return dm_fail(DM_ERR_BACKEND, "group %d (%s), fused kernel: %s (%s)", gi,
                               dmx_op_at(ex->plan, &ex->plan->groups[gi], 0)->name, cudaGetErrorString(e),
                               cudaGetErrorName(e));
        }
        return DM_OK;
    }
    return dmx_run_steps(ex, gi, seed, skip_rows, 0);
}

dm_status dm_cuda_sync(dm_cuda_exec *ex) {
    if (!ex) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_sync: NULL executor");
    DM_TRY(dmx_join_all(ex)); /* the main stream then covers the side stream's work */
    if (dmx_emulated(ex)) return DM_OK;
    DMC_CUDA(cudaStreamSynchronize(ex->stream));
    return DM_OK;
}
