/* train.cu: the trainer's own device work beside the layers' plans (cudaexec/backend.cu):
 * the optimizers over one parameter tensor of an arena (AdamW, LAMB's two passes; fp32
 * master weights and moments beside a 2-byte storage), gradient norms and accumulation,
 * and the mean squared error with its gradient. Each element's arithmetic
 * is one __host__ __device__ function, which the emulation (DM_CUDA_EMULATE) runs on the
 * host in the same order of elements; sums over a row are fixed trees, so a step gives
 * the same numbers every run. */
#include <limits.h>
#include <time.h>

#include "cuda/cuda_internal.h"
#include "cuda/rowmath.cuh"

extern "C" {
#include "dist/dist.h"
}
#ifdef DM_HAVE_NCCL
#include <nccl.h>
#endif

/* --- the optimizers ------------------------------------------------------------------ */

/* Part q's share of n elements (graph/optim_elem.h): [*lo, *hi). */
__host__ __device__ __forceinline__ void part_range(int64_t n, int q, int64_t *lo, int64_t *hi) {
    const int64_t per = (n + DM_NORM_PARTS - 1) / DM_NORM_PARTS;
    *lo = per * q < n ? per * q : n;
    *hi = per * (q + 1) < n ? per * (q + 1) : n;
}

/* The gradient's element e in fp32: from acc when given, else tensor g in storage dt. */
__host__ __device__ __forceinline__ float grad_at(const void *g, int dt, const float *acc, int64_t e) {
    return acc ? acc[e] : dmc_load(g, dt, e);
}

/* Element e of an AdamW or LAMB-apply pass, or of LAMB's moments pass (returning w^2 and
 * u^2 through sw, su): the master weight (or, without one, the parameter itself in fp32
 * storage) steps; the parameter is written as it rounds to the storage type. */
__host__ __device__ __forceinline__ void optim_one(int kind, void *p, const void *g, int dt, const float *acc,
                                                   float *master, float *m, float *v, const dm_optim_coef &k,
                                                   int64_t e, double *sw, double *su) {
    const float w = master ? master[e] : dmc_load(p, dt, e);
    if (kind == DM_PASS_LAMB_MOMENTS) {
        const float u = dm_lamb_moments_elem(&k, w, grad_at(g, dt, acc, e), &m[e], &v[e]);
        *sw += (double)w * (double)w;
        *su += (double)u * (double)u;
        return;
    }
    const float nw = kind == DM_PASS_ADAMW ? dm_adamw_elem(&k, w, grad_at(g, dt, acc, e), &m[e], &v[e])
                                           : dm_lamb_apply_elem(&k, w, m[e], v[e]);
    if (master) master[e] = nw;
    dmc_store(p, dt, e, nw);
}

enum { OPT_THREADS = 256 };

/* Block q of DM_NORM_PARTS sums its part's squares in a fixed tree. */
__device__ __forceinline__ double block_sum(double x, double *red) {
    red[threadIdx.x] = x;
    __syncthreads();
    for (int w = OPT_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    const double r = red[0];
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(OPT_THREADS) sumsq_kernel(const void *g, int dt, const float *src, int64_t n,
                                                            double *out) {
    __shared__ double red[OPT_THREADS];
    int64_t lo, hi;
    part_range(n, blockIdx.x, &lo, &hi);
    double s = 0.0;
    for (int64_t e = lo + threadIdx.x; e < hi; e += OPT_THREADS) {
        const double x = grad_at(g, dt, src, e);
        s += x * x;
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void accumulate_kernel(const void *g, int dt, int64_t n, float *acc, int first) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        acc[e] = (first ? 0.0f : acc[e]) + dmc_load(g, dt, e);
}

__global__ void optim_kernel(int kind, void *p, const void *g, int dt, const float *acc, float *master, float *m,
                             float *v, dm_optim_coef k, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    double sw = 0.0, su = 0.0;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        optim_one(kind, p, g, dt, acc, master, m, v, k, e, &sw, &su);
}

/* LAMB's moments pass: block q walks part q, so its norms' partial sums are fixed trees. */
__global__ void __launch_bounds__(OPT_THREADS) lamb_moments_kernel(void *p, const void *g, int dt, const float *acc,
                                                                   float *master, float *m, float *v, dm_optim_coef k,
                                                                   int64_t n, double *norms) {
    __shared__ double red[OPT_THREADS];
    int64_t lo, hi;
    part_range(n, blockIdx.x, &lo, &hi);
    double sw = 0.0, su = 0.0;
    for (int64_t e = lo + threadIdx.x; e < hi; e += OPT_THREADS)
        optim_one(DM_PASS_LAMB_MOMENTS, p, g, dt, acc, master, m, v, k, e, &sw, &su);
    sw = block_sum(sw, red);
    su = block_sum(su, red);
    if (threadIdx.x == 0) {
        norms[blockIdx.x] = sw;
        norms[DM_NORM_PARTS + blockIdx.x] = su;
    }
}

/* The dense span of tensor t, n elements (the trainer's parameters and gradients). */
static dm_status dense(dm_cuda_exec *ex, int t, int64_t n, char **at, int *dt, const char *what) {
    size_t np = 0;
    DM_TRY(dmc_tensor_span(ex, t, at, dt, &np));
    if ((int64_t)np != n)
        return dm_fail(DM_ERR_INTERNAL, "%s: a tensor of %lld elements spans %zu in the arena: a laid-out "
                       "(strided) parameter is not supported", what, (long long)n, np);
    return DM_OK;
}

static int grid_for(int64_t n) {
    const int64_t want = (n + OPT_THREADS - 1) / OPT_THREADS;
    return (int)(want < 4096 ? want : want > 0 ? 4096 : 1);
}

/* The emulation's order within a part: each of OPT_THREADS lanes sums its strided
 * elements, then the lanes add up in the kernel's tree. */
static double emulated_part(int64_t lo, int64_t hi, double (*term)(void *, int64_t), void *arg) {
    double lane[OPT_THREADS];
    for (int t = 0; t < OPT_THREADS; t++) {
        double s = 0.0;
        for (int64_t e = lo + t; e < hi; e += OPT_THREADS) s += term(arg, e);
        lane[t] = s;
    }
    for (int w = OPT_THREADS / 2; w > 0; w >>= 1)
        for (int t = 0; t < w; t++) lane[t] += lane[t + w];
    return lane[0];
}

typedef struct {
    const void *g;
    int dt;
    const float *src;
} sq_arg;

static double sq_term(void *a, int64_t e) {
    const sq_arg *s = (const sq_arg *)a;
    const double x = grad_at(s->g, s->dt, s->src, e);
    return x * x;
}

dm_status dm_cuda_sumsq(dm_cuda_exec *ex, int tg, const float *src, int64_t n, double *out) {
    if (!ex || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_sumsq: NULL argument");
    char *g = NULL;
    int dt = DMC_F32;
    if (!src) DM_TRY(dense(ex, tg, n, &g, &dt, "the gradient norm"));
    DM_TRY(dmc_join(ex)); /* after the side stream's gradients */
    if (dmc_emulated(ex)) {
        sq_arg a = {g, dt, src};
        for (int q = 0; q < DM_NORM_PARTS; q++) {
            int64_t lo, hi;
            part_range(n, q, &lo, &hi);
            out[q] = emulated_part(lo, hi, sq_term, &a);
        }
        return DM_OK;
    }
    sumsq_kernel<<<DM_NORM_PARTS, OPT_THREADS, 0, dmc_stream(ex)>>>(g, dt, src, n, out);
    DMC_LAUNCHED("the gradient-norm kernel");
    return DM_OK;
}

dm_status dm_cuda_accumulate(dm_cuda_exec *ex, int tg, int64_t n, float *acc, int first) {
    if (!ex || !acc) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_accumulate: NULL argument");
    char *g = NULL;
    int dt = DMC_F32;
    DM_TRY(dense(ex, tg, n, &g, &dt, "gradient accumulation"));
    if (!n) return DM_OK;
    DM_TRY(dmc_join(ex));
    if (dmc_emulated(ex)) {
        for (int64_t e = 0; e < n; e++) acc[e] = (first ? 0.0f : acc[e]) + dmc_load(g, dt, e);
        return DM_OK;
    }
    accumulate_kernel<<<grid_for(n), OPT_THREADS, 0, dmc_stream(ex)>>>(g, dt, n, acc, first);
    DMC_LAUNCHED("the gradient-accumulation kernel");
    return DM_OK;
}

dm_status dm_cuda_optimize(dm_cuda_exec *ex, int kind, int tp, int tg, int64_t n, float *master, float *m, float *v,
                           const float *acc, const dm_optim_coef *k, double *norms) {
    if (!ex || !m || !v || !k) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_optimize: NULL argument");
    if (kind == DM_PASS_LAMB_MOMENTS && !norms) return dm_fail(DM_ERR_INTERNAL, "LAMB: no buffer for the norms");
    char *p = NULL, *g = NULL;
    int dtp = DMC_F32, dtg = DMC_F32;
    DM_TRY(dense(ex, tp, n, &p, &dtp, "the optimizer"));
    if (!acc) {
        DM_TRY(dense(ex, tg, n, &g, &dtg, "the optimizer"));
        if (dtg != dtp) return dm_fail(DM_ERR_INTERNAL, "the optimizer: a parameter and its gradient differ in type");
    }
    if (!master && dtp != DMC_F32)
        return dm_fail(DM_ERR_INTERNAL, "the optimizer: a parameter in 16-bit storage needs fp32 master weights");
    DM_TRY(dmc_join(ex)); /* after the side stream's gradients */
    if (dmc_emulated(ex)) {
        if (kind != DM_PASS_LAMB_MOMENTS) {
            double sw = 0.0, su = 0.0;
            for (int64_t e = 0; e < n; e++) optim_one(kind, p, g, dtp, acc, master, m, v, *k, e, &sw, &su);
            return DM_OK;
        }
        /* the kernel's order: per part, lanes strided, then the tree */
        for (int q = 0; q < DM_NORM_PARTS; q++) {
            int64_t lo, hi;
            part_range(n, q, &lo, &hi);
            double lw[OPT_THREADS], lu[OPT_THREADS];
            for (int t = 0; t < OPT_THREADS; t++) {
                lw[t] = lu[t] = 0.0;
                for (int64_t e = lo + t; e < hi; e += OPT_THREADS)
                    optim_one(kind, p, g, dtp, acc, master, m, v, *k, e, &lw[t], &lu[t]);
            }
            for (int w = OPT_THREADS / 2; w > 0; w >>= 1)
                for (int t = 0; t < w; t++) lw[t] += lw[t + w], lu[t] += lu[t + w];
            norms[q] = lw[0];
            norms[DM_NORM_PARTS + q] = lu[0];
        }
        return DM_OK;
    }
    if (kind == DM_PASS_LAMB_MOMENTS)
        lamb_moments_kernel<<<DM_NORM_PARTS, OPT_THREADS, 0, dmc_stream(ex)>>>(p, g, dtp, acc, master, m, v, *k, n,
                                                                              norms);
    else if (n)
        optim_kernel<<<grid_for(n), OPT_THREADS, 0, dmc_stream(ex)>>>(kind, p, g, dtp, acc, master, m, v, *k, n);
    DMC_LAUNCHED("the optimizer's kernel");
    return DM_OK;
}

/* --- the mean squared error ---------------------------------------------------------- */

enum { MSE_THREADS = 256 };

/* Lane `lane` of MSE_THREADS over token t's row: its share of the squared error (columns
 * lane, lane + MSE_THREADS, ...) in double, the gradient of those columns written. */
__host__ __device__ __forceinline__ double mse_lane(const void *y, void *dy, int dt, const float *target,
                                                    int keep, int64_t t, int64_t width, float scale,
                                                    int lane) {
    double s = 0.0;
    for (int64_t c = lane; c < width; c += MSE_THREADS) {
        const int64_t e = t * width + c;
        const float d = dmc_load(y, dt, e) - target[e];
        if (keep) s += (double)d * d;
        if (dy) dmc_store(dy, dt, e, keep ? scale * d : 0.0f);
    }
    return s;
}

__global__ void __launch_bounds__(MSE_THREADS) mse_kernel(const void *y, void *dy, int dt, const float *target,
                                                          const float *mask, int64_t width, float scale,
                                                          double *partial) {
    __shared__ double part[MSE_THREADS];
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x;
    part[lane] = mse_lane(y, dy, dt, target, mask[t] != 0.0f, t, width, scale, lane);
    for (int h = MSE_THREADS / 2; h > 0; h /= 2) {
        __syncthreads();
        if (lane < h) part[lane] += part[lane + h];
    }
    if (lane == 0) partial[t] = part[0];
}

dm_status dm_cuda_mse(dm_cuda_exec *ex, int ty, int tdy, const float *target, const float *mask,
                      int64_t tokens, int64_t width, float scale, double *partial, double *host_partial) {
    if (!ex || !target || !mask || !partial || !host_partial)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_mse: NULL argument");
    char *y = NULL, *dy = NULL;
    int dt = DMC_F32, dtd = DMC_F32;
    size_t n = 0, nd = 0;
    DM_TRY(dmc_tensor_span(ex, ty, &y, &dt, &n));
    if (tdy >= 0) DM_TRY(dmc_tensor_span(ex, tdy, &dy, &dtd, &nd));
    size_t want;
    if (tokens < 1 || width < 1 || tokens > INT_MAX || !dm_mul_ok((size_t)tokens, (size_t)width, &want) ||
        n != want || (dy && (nd != want || dtd != dt)))
        return dm_fail(DM_ERR_INTERNAL, "the loss: the output holds %zu elements, not %lld tokens of %lld", n,
                       (long long)tokens, (long long)width);
    DM_TRY(dmc_join(ex));
    if (dmc_emulated(ex)) {
        double part[MSE_THREADS];
        for (int64_t t = 0; t < tokens; t++) {
            for (int lane = 0; lane < MSE_THREADS; lane++)
                part[lane] = mse_lane(y, dy, dt, target, mask[t] != 0.0f, t, width, scale, lane);
            for (int h = MSE_THREADS / 2; h > 0; h /= 2)
                for (int lane = 0; lane < h; lane++) part[lane] += part[lane + h];
            partial[t] = part[0];
        }
    } else {
        mse_kernel<<<(unsigned)tokens, MSE_THREADS, 0, dmc_stream(ex)>>>(y, dy, dt, target, mask, width, scale,
                                                                        partial);
        DMC_LAUNCHED("the loss kernel");
    }
    return dm_cuda_memcpy(ex, host_partial, partial, (size_t)tokens * sizeof(double), 0);
}

/* --- data parallelism: the gradients summed over the ranks ---------------------------- */

#ifdef DM_HAVE_NCCL
#define DMC_NCCL(call)                                                                        \
    do {                                                                                      \
        ncclResult_t dmc_r_ = (call);                                                         \
        if (dmc_r_ != ncclSuccess)                                                            \
            return dm_fail(DM_ERR_BACKEND, "%s failed: %s", #call, ncclGetErrorString(dmc_r_)); \
    } while (0)

enum { NCCL_MARKS = 1024 };

/* One per launch (kept in dm_dist's backend slot): the communicator over the ranks' GPUs,
 * its stream (the sums run there, beside the backward pass on the layers' streams), and
 * start/end events of each sum of a step, for its busy time. */
typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t start[NCCL_MARKS], end[NCCL_MARKS], ready;
    int marks;    /* events created */
    int used;     /* sums this step */
    int device;
    int aborted;  /* ncclCommAbort'ed (it freed the communicator) */
} dmc_nccl;

static void nccl_release(void *p) {
    dmc_nccl *c = (dmc_nccl *)p;
    if (!c) return;
    if (!c->aborted) {
        (void)cudaStreamSynchronize(c->stream);
        (void)ncclCommDestroy(c->comm);
    }
    for (int k = 0; k < c->marks; k++) (void)cudaEventDestroy(c->start[k]), (void)cudaEventDestroy(c->end[k]);
    (void)cudaEventDestroy(c->ready);
    (void)cudaStreamDestroy(c->stream);
    free(c);
}

/* The launch's communicator, made at the first sum: rank 0's id to every rank over MPI. */
static dm_status nccl_of(dm_dist *d, dmc_nccl **out) {
    dmc_nccl *c = (dmc_nccl *)dm_dist_backend_slot(d);
    if (c) {
        *out = c;
        return DM_OK;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (dm_dist_rank(d) == 0) DMC_NCCL(ncclGetUniqueId(&id));
    DM_TRY(dm_dist_bcast(d, &id, sizeof id, 0, "NCCL's id"));
    c = (dmc_nccl *)calloc(1, sizeof *c);
    if (!c) return dm_fail(DM_ERR_OOM, "out of memory");
    cudaError_t e = cudaGetDevice(&c->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(c);
        return dm_fail(DM_ERR_BACKEND, "the NCCL stream: %s", cudaGetErrorString(e));
    }
    ncclResult_t r = ncclCommInitRank(&c->comm, dm_dist_size(d), id, dm_dist_rank(d));
    if (r != ncclSuccess) {
        const int dev = c->device;
        (void)cudaEventDestroy(c->ready);
        (void)cudaStreamDestroy(c->stream);
        free(c);
        return dm_fail(DM_ERR_BACKEND, "ncclCommInitRank (rank %d of %d, GPU %d) failed: %s", dm_dist_rank(d),
                       dm_dist_size(d), dev, ncclGetErrorString(r));
    }
    dm_dist_set_backend_slot(d, c, nccl_release);
    *out = c;
    return DM_OK;
}
#endif

dm_status dm_cuda_reduce(dm_cuda_exec *ex, int t, float *buf, int64_t n, int root, int bcast, dm_dist *d) {
    if (!ex || !d) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_reduce: NULL argument");
    char *g = (char *)buf;
    int dt = DMC_F32;
    if (!g) DM_TRY(dense(ex, t, n, &g, &dt, bcast ? "the parameters' broadcast" : "the gradient reduction"));
    /* after this layer's work on both of its streams (emulated too: the second stream's
     * groups run at the join) */
    DM_TRY(dmc_join(ex));
    if (dmc_emulated(ex)) { /* host memory: MPI on dist's thread, as the CPU's */
        if (dt != DMC_F32)
            return dm_fail(DM_ERR_UNSUPPORTED, "the emulated CUDA backend sums fp32 gradients over ranks only");
        return bcast ? dm_dist_bcast_start(d, (float *)g, n, root, "the updated parameters from their rank")
                     : dm_dist_reduce_start(d, (float *)g, n, root, "summing the gradients over the ranks");
    }
#ifdef DM_HAVE_NCCL
    dmc_nccl *c = NULL;
    DM_TRY(nccl_of(d, &c));
    if (c->aborted) return dm_fail(DM_ERR_BACKEND, "NCCL's communicator was aborted after a failure");
    /* timed: the first NCCL_MARKS of a step (the busy time of the rest is not counted) */
    const int timed = c->used < NCCL_MARKS;
    if (timed && c->used == c->marks) {
        DMC_CUDA(cudaEventCreate(&c->start[c->marks]));
        DMC_CUDA(cudaEventCreate(&c->end[c->marks]));
        c->marks++;
    }
    /* after the work enqueued on this layer's stream, beside what follows */
    DMC_CUDA(cudaEventRecord(c->ready, dmc_stream(ex)));
    DMC_CUDA(cudaStreamWaitEvent(c->stream, c->ready, 0));
    const ncclDataType_t type = dt == DMC_BF16 ? ncclBfloat16 : dt == DMC_F16 ? ncclFloat16 : ncclFloat32;
    if (timed) DMC_CUDA(cudaEventRecord(c->start[c->used], c->stream));
    if (bcast) DMC_NCCL(ncclBroadcast(g, g, (size_t)n, type, root, c->comm, c->stream));
    else if (root >= 0) DMC_NCCL(ncclReduce(g, g, (size_t)n, type, ncclSum, root, c->comm, c->stream));
    else DMC_NCCL(ncclAllReduce(g, g, (size_t)n, type, ncclSum, c->comm, c->stream));
    if (timed) DMC_CUDA(cudaEventRecord(c->end[c->used], c->stream));
    c->used++;
    return DM_OK;
#else
    return dm_fail(DM_ERR_UNSUPPORTED, "this dmove's CUDA backend was built without NCCL: rebuild with NCCL "
                   "(nccl.h and libnccl.so beside the CUDA toolkit) to train on several GPUs");
#endif
}

dm_status dm_cuda_reduce_wait(dm_cuda_exec *ex, dm_dist *d) {
    if (!ex || !d) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_reduce_wait: NULL argument");
    if (dmc_emulated(ex)) return dm_dist_reduce_wait(d);
#ifdef DM_HAVE_NCCL
    dmc_nccl *c = (dmc_nccl *)dm_dist_backend_slot(d);
    if (!c) return DM_OK; /* nothing summed yet */
    if (c->aborted) return dm_fail(DM_ERR_BACKEND, "NCCL's communicator was aborted after a failure");
    /* the host waits for the sums (the optimizer's kernels are enqueued after), polling
     * against dist's deadline: a rank that died or hangs stops this one (NCCL aborted) */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        const cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) DMC_CUDA(e);
        ncclResult_t ar = ncclSuccess;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if ((ncclCommGetAsyncError(c->comm, &ar) == ncclSuccess && ar != ncclSuccess) || waited > dm_dist_timeout(d)) {
            (void)ncclCommAbort(c->comm);
            c->aborted = 1;
            return ar != ncclSuccess
                       ? dm_fail(DM_ERR_BACKEND, "rank %d: NCCL failed while summing the gradients: %s",
                                 dm_dist_rank(d), ncclGetErrorString(ar))
                       : dm_fail(DM_ERR_BACKEND, "rank %d of %d waited %.0f s for NCCL's sums over the ranks: one of "
                                 "them died or hangs (DMOVE_DIST_TIMEOUT sets the wait)", dm_dist_rank(d),
                                 dm_dist_size(d), waited);
        }
        const struct timespec nap = {0, 100000};
        if (waited > 0.05) nanosleep(&nap, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double busy = 0;
    for (int k = 0; k < c->used && k < NCCL_MARKS; k++) {
        float ms = 0;
        DMC_CUDA(cudaEventElapsedTime(&ms, c->start[k], c->end[k]));
        busy += 1e-3 * ms;
    }
    c->used = 0;
    dm_dist_add_reduce_times(d, busy, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return DM_OK;
#else
    return DM_OK;
#endif
}
