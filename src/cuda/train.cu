/* train.cu: the trainer's own device work beside the layers' plans (cudaexec/backend.cu):
 * AdamW over one parameter tensor of an arena (fp32 master weights and moments beside a
 * 2-byte storage), and the mean squared error with its gradient. Each element's arithmetic
 * is one __host__ __device__ function, which the emulation (DM_CUDA_EMULATE) runs on the
 * host in the same order of elements; sums over a row are fixed trees, so a step gives
 * the same numbers every run. */
#include <limits.h>

#include "cuda/cuda_internal.h"
#include "cuda/rowmath.cuh"

/* --- AdamW ------------------------------------------------------------------------- */

/* Element e of the update: the master weight (or, without one, the parameter itself in
 * fp32 storage) steps, the parameter is written as it rounds to the storage type. */
__host__ __device__ __forceinline__ void adamw_one(void *p, const void *g, int dt, float *master,
                                                   float *m, float *v, dm_adamw_coef k, int64_t e) {
    const float w = master ? master[e] : dmc_load(p, dt, e);
    const float nw = dm_adamw_elem(&k, w, dmc_load(g, dt, e), &m[e], &v[e]);
    if (master) master[e] = nw;
    dmc_store(p, dt, e, nw);
}

__global__ void adamw_kernel(void *p, const void *g, int dt, float *master, float *m, float *v,
                             dm_adamw_coef k, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        adamw_one(p, g, dt, master, m, v, k, e);
}

dm_status dm_cuda_adamw(dm_cuda_exec *ex, int tp, int tg, int64_t n, float *master, float *m, float *v,
                        const dm_adamw_coef *k) {
    if (!ex || !m || !v || !k) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_adamw: NULL argument");
    char *p = NULL, *g = NULL;
    int dtp = DMC_F32, dtg = DMC_F32;
    size_t np = 0, ng = 0;
    DM_TRY(dmc_tensor_span(ex, tp, &p, &dtp, &np));
    DM_TRY(dmc_tensor_span(ex, tg, &g, &dtg, &ng));
    /* a strided view would have gaps: the master weights and moments are dense */
    if (np != ng || dtp != dtg || (int64_t)np != n)
        return dm_fail(DM_ERR_INTERNAL, "AdamW: a parameter of %lld elements spans %zu in the arena, its "
                       "gradient %zu: a laid-out (strided) parameter is not supported", (long long)n, np, ng);
    if (!master && dtp != DMC_F32)
        return dm_fail(DM_ERR_INTERNAL, "AdamW: a parameter in 16-bit storage needs fp32 master weights");
    if (!n) return DM_OK;
    DM_TRY(dmc_join(ex)); /* after the side stream's gradients */
    if (dmc_emulated(ex)) {
        for (int64_t e = 0; e < n; e++) adamw_one(p, g, dtp, master, m, v, *k, e);
        return DM_OK;
    }
    const int threads = 256;
    const int64_t want = (n + threads - 1) / threads;
    const int blocks = (int)(want < 4096 ? want : 4096);
    adamw_kernel<<<blocks, threads, 0, dmc_stream(ex)>>>(p, g, dtp, master, m, v, *k, n);
    DMC_LAUNCHED("the AdamW kernel");
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
