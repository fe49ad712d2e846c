/* rows.cu: the element-wise and normalization families on the GPU: one generic kernel
 * that interprets a row program (cuda_internal.h) for every op kind of ops.def, with the
 * math of src/cpu/eltwise.c and src/cpu/norm.c (inverted dropout on Philox words, softmax
 * with the row max subtracted, two-pass LayerNorm in fp32 with rstd in double, as the
 * CPU), and the second kernel of the column reductions. A kind added to ops.def needs
 * a case here and in row_kind_supported (exec.cu).
 *
 * A thread block runs one row at a time (grid-stride over rows). Thread t always handles
 * columns t, t + blockDim, ... in the per-column ops, so a column accumulator is only
 * ever touched by one thread; block-wide sums use warp shuffles. Tensors internal to a
 * fused group live in the block's scratch: padded rows in dynamic shared memory, or in a
 * per-block slice of a global buffer when they do not fit. Column reductions (bias and
 * LayerNorm parameter gradients) accumulate per block in that scratch, are written out
 * as per-block partials and summed in block order by a second kernel: deterministic.
 *
 * First version, written for correctness: one row per block even for short rows,
 * __syncthreads between ops, a full Philox block per 4 dropout elements. */
#include <float.h>
#include <math.h>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_backend.h"
#include "cuda/philox.cuh"

namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Block-wide sum or max of v (blockDim.x a multiple of 32); every thread gets the
 * result. red: 33 floats of shared memory. The first barrier keeps a previous call's
 * readers of red[32] ahead of this call's writers. */
__device__ float block_reduce(float v, int is_max, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
        w = is_max ? warp_max(w) : warp_sum(w);
        if (lane == 0) red[32] = w;
    }
    __syncthreads();
    return red[32];
}

/* Operand address for row r (as resolve() in cpu/exec.c). */
__device__ __forceinline__ float *operand(const dmc_operand *d, float *scr, int64_t r,
                                          int64_t cols) {
    if (d->loc == DMC_LOC_SCRATCH) return scr + d->slot;
    switch (d->kind) {
    case DM_ARG_FULL: return d->base + r * cols;
    case DM_ARG_GROUPED: return d->base + (r / d->rdiv) * cols;
    case DM_ARG_ROWSCALAR: return d->base + r;
    default: return d->base; /* COLVEC */
    }
}

/* act(x), and act'(x) in *grad, in fp32 with CUDA's accurate functions (the CPU uses
 * its own polynomials, cpu/vmath.h: both within a few ulp of the exact values), in forms
 * that do not cancel for x << 0, as the CPU's:
 *   GELU (erf):  x Phi(x);  Phi(x) + x phi(x)        (normcdff is accurate for x < 0)
 *   GELU (tanh): x sg;  sg + 2 x ds sg (1 - sg),  sg = sigmoid(2s) = (1 + tanh(s)) / 2,
 *                s = sqrt(2/pi) (x + 0.044715 x^3), e = exp(-2|s|) never overflows. */
__device__ __forceinline__ float act_both(float x, int act, float *grad) {
    if (act == DM_ACT_RELU) {
        *grad = x > 0 ? 1.0f : 0.0f;
        return x > 0 ? x : 0.0f;
    }
    if (act == DM_ACT_GELU_TANH) {
        float x2 = x * x;
        float s = 0.7978845608028654f * fmaf(0.044715f * x2, x, x);
        float ds = 0.7978845608028654f * fmaf(3.0f * 0.044715f, x2, 1.0f);
        float e = expf(-2.0f * fabsf(s));
        float inv = 1.0f / (1.0f + e), einv = e * inv; /* sigmoid(2|s|), sigmoid(-2|s|) */
        float sg = s < 0 ? einv : inv;
        *grad = fmaf(2.0f * x * ds, inv * einv, sg);
        return x * sg;
    }
    float cdf = normcdff(x);
    *grad = fmaf(x * expf(-0.5f * x * x), 0.3989422804014327f, cdf); /* 1/sqrt(2 pi) */
    return x * cdf;
}

/* y = keep ? x * scale : 0 over the row's element indices [r*cols, (r+1)*cols): each
 * thread takes whole Philox blocks (4 consecutive indices), so a block's 10 rounds are
 * computed once; a row may start or end inside a block. */
__device__ void dropout_row(const dmc_rowop *op, int64_t r, int64_t cols, uint64_t seed,
                            const float *x, float *y) {
    if (!op->drop_on) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] = x[c];
        return;
    }
    uint64_t start = (uint64_t)r * (uint64_t)cols, end = start + (uint64_t)cols;
    uint64_t q0 = start >> 2, q1 = (end - 1) >> 2;
    uint32_t thr = op->drop_thr;
    float scale = op->drop_scale;
    for (uint64_t q = q0 + threadIdx.x; q <= q1; q += blockDim.x) {
        uint4 w = dmc_philox_block(seed, op->stream, q);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint64_t e = 4 * q + (uint64_t)j;
            if (e < start || e >= end) continue;
            int64_t c = (int64_t)(e - start);
            y[c] = dmc_uint4_word(w, j) >= thr ? x[c] * scale : 0.0f;
        }
    }
}

/* One op on row r. Every thread of the block takes the same branch (the op is uniform),
 * so the block reductions inside are legal. */
__device__ void run_rowop(const dmc_rowop *op, int64_t r, int64_t cols, float *scr,
                          uint64_t seed, float *red) {
    const float *in[DM_MAX_IN];
    float *out[DM_MAX_OUT];
    for (int s = 0; s < op->nin; s++) in[s] = operand(&op->in[s], scr, r, cols);
    for (int s = 0; s < op->nout; s++) out[s] = operand(&op->out[s], scr, r, cols);
    const int tid = threadIdx.x, bs = blockDim.x;
    switch (op->kind) {
    case DM_OP_BIAS_ADD:
    case DM_OP_ADD: {
        const float *a = in[0], *b = in[1];
        float *y = out[0];
        for (int64_t c = tid; c < cols; c += bs) y[c] = a[c] + b[c];
        break;
    }
    case DM_OP_MASK_ADD: { /* as Hugging Face: scores + (1 - mask) * finfo.min */
        const float *a = in[0], *m = in[1];
        float *y = out[0];
        for (int64_t c = tid; c < cols; c += bs) y[c] = a[c] + (1.0f - m[c]) * -FLT_MAX;
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD:
        dropout_row(op, r, cols, seed, in[0], out[0]);
        break;
    case DM_OP_DROPOUT_BWD_NZ: { /* in: dy, the forward output: kept where it is non-zero */
        const float *dy = in[0], *yf = in[1];
        float *dx = out[0];
        const float scale = op->drop_scale; /* 1 when p = 0, as the CPU */
        for (int64_t c = tid; c < cols; c += bs) dx[c] = yf[c] != 0.0f ? dy[c] * scale : 0.0f;
        break;
    }
    case DM_OP_MUL: {
        const float *a = in[0], *b = in[1];
        float *y = out[0];
        for (int64_t c = tid; c < cols; c += bs) y[c] = a[c] * b[c];
        break;
    }
    case DM_OP_ACT: {
        const float *a = in[0];
        float *y = out[0], g;
        for (int64_t c = tid; c < cols; c += bs) y[c] = act_both(a[c], op->act, &g);
        break;
    }
    case DM_OP_ACT_DERIV: { /* in: x; out: act(x), act'(x) from one evaluation */
        const float *a = in[0];
        float *y = out[0], *d = out[1];
        for (int64_t c = tid; c < cols; c += bs) {
            float g;
            y[c] = act_both(a[c], op->act, &g);
            d[c] = g;
        }
        break;
    }
    case DM_OP_ACT_BWD: { /* in: dy, x */
        const float *dy = in[0], *x = in[1];
        float *y = out[0];
        for (int64_t c = tid; c < cols; c += bs) {
            float g;
            (void)act_both(x[c], op->act, &g);
            y[c] = dy[c] * g;
        }
        break;
    }
    case DM_OP_SOFTMAX: {
        const float *x = in[0];
        float *y = out[0];
        float m = -INFINITY;
        for (int64_t c = tid; c < cols; c += bs) m = x[c] > m ? x[c] : m;
        m = block_reduce(m, 1, red);
        float s = 0.0f;
        for (int64_t c = tid; c < cols; c += bs) {
            float e = expf(x[c] - m);
            y[c] = e;
            s += e;
        }
        s = block_reduce(s, 0, red);
        float inv = 1.0f / s;
        for (int64_t c = tid; c < cols; c += bs) y[c] *= inv; /* this thread's own y[c] */
        break;
    }
    case DM_OP_SOFTMAX_BWD: { /* in: dy, y; dx = y * (dy - sum(dy * y)) */
        const float *dy = in[0], *y = in[1];
        float *dx = out[0];
        float s = 0.0f;
        for (int64_t c = tid; c < cols; c += bs) s += dy[c] * y[c];
        s = block_reduce(s, 0, red);
        for (int64_t c = tid; c < cols; c += bs) dx[c] = y[c] * (dy[c] - s);
        break;
    }
    case DM_OP_LAYERNORM: { /* in: x, gamma, beta; out: y, mean, rstd */
        const float *x = in[0], *gm = in[1], *bt = in[2];
        float *y = out[0];
        float s = 0.0f;
        for (int64_t c = tid; c < cols; c += bs) s += x[c];
        float mean = block_reduce(s, 0, red) / (float)cols;
        float v = 0.0f;
        for (int64_t c = tid; c < cols; c += bs) {
            float d = x[c] - mean;
            v += d * d;
        }
        v = block_reduce(v, 0, red);
        float rstd = (float)(1.0 / sqrt((double)(v / (float)cols) + op->eps));
        for (int64_t c = tid; c < cols; c += bs) y[c] = (x[c] - mean) * rstd * gm[c] + bt[c];
        if (tid == 0) {
            *out[1] = mean;
            *out[2] = rstd;
        }
        break;
    }
    case DM_OP_LAYERNORM_BWD: {
        /* in: dy, x, mean, rstd, gamma; out: dx, dgamma (acc), dbeta (acc).
         * xh = (x - mean) rstd; g = dy gamma; dx = rstd (g - mean(g) - xh mean(g xh)) */
        const float *dy = in[0], *x = in[1], *gm = in[4];
        const float mean = *in[2], rstd = *in[3];
        float *dx = out[0], *dg = out[1], *db = out[2];
        float sg = 0.0f, sgx = 0.0f;
        for (int64_t c = tid; c < cols; c += bs) {
            float xh = (x[c] - mean) * rstd;
            float g = dy[c] * gm[c];
            sg += g;
            sgx += g * xh;
            dg[c] += dy[c] * xh;
            db[c] += dy[c];
        }
        float inv_n = 1.0f / (float)cols;
        sg = block_reduce(sg, 0, red) * inv_n;
        sgx = block_reduce(sgx, 0, red) * inv_n;
        for (int64_t c = tid; c < cols; c += bs) {
            float xh = (x[c] - mean) * rstd;
            dx[c] = rstd * (dy[c] * gm[c] - sg - xh * sgx);
        }
        break;
    }
    case DM_OP_COLSUM: {
        const float *x = in[0];
        float *acc = out[0];
        for (int64_t c = tid; c < cols; c += bs) acc[c] += x[c];
        break;
    }
    default:
        break; /* contractions never reach a row program (checked on the host) */
    }
}

__global__ void __launch_bounds__(1024)
row_kernel(const dmc_rowprog *__restrict__ prog, uint64_t seed, float *gscratch,
           float *partials, int use_global) {
    extern __shared__ __align__(16) float dyn_smem[];
    __shared__ float red[33];
    float *scr = use_global ? gscratch + (size_t)blockIdx.x * (size_t)prog->scratch_floats
                            : dyn_smem;
    const int64_t rows = prog->rows, cols = prog->cols, acc_off = prog->acc_off,
                  acc_floats = prog->acc_floats;
    const int nops = prog->nops;
    for (int64_t c = threadIdx.x; c < acc_floats; c += blockDim.x) scr[acc_off + c] = 0.0f;
    __syncthreads();
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        for (int k = 0; k < nops; k++) {
            run_rowop(&prog->ops[k], r, cols, scr, seed, red);
            /* the next op may read what other threads wrote (reductions, row statistics,
             * dropout's block-wise columns); the next row reuses the scratch rows */
            __syncthreads();
        }
    }
    float *mine = partials ? partials + (size_t)blockIdx.x * (size_t)acc_floats : NULL;
    for (int64_t c = threadIdx.x; mine && c < acc_floats; c += blockDim.x)
        mine[c] = scr[acc_off + c];
}

/* Column sums of the per-block partials, in block order: acc_dst[a][c]. */
__global__ void colacc_kernel(const dmc_rowprog *__restrict__ prog, const float *partials,
                              int nblocks) {
    const int64_t cols = prog->cols, n = (int64_t)prog->nacc * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int a = (int)(i / cols);
        int64_t c = i % cols;
        const float *p = partials + (prog->acc_slot[a] - prog->acc_off) + c;
        float s = 0.0f;
        for (int b = 0; b < nblocks; b++) s += p[(size_t)b * (size_t)prog->acc_floats];
        prog->acc_dst[a][c] = s;
    }
}

__global__ void philox_kernel(uint64_t seed, uint32_t stream, uint64_t start, int64_t n,
                              uint32_t *out) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n;
         t += (int64_t)gridDim.x * blockDim.x) {
        uint64_t idx = start + (uint64_t)t;
        out[t] = dmc_uint4_word(dmc_philox_block(seed, stream, idx >> 2), (int)(idx & 3));
    }
}

} // namespace

dm_status dmc_rows_allow_smem(size_t bytes) {
    DMC_CUDA(cudaFuncSetAttribute(row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)bytes));
    return DM_OK;
}

dm_status dmc_rows_launch(const dmc_rowprog *dprog, const dmc_rowprog *hprog,
                          const dmc_launch *lc, uint64_t seed, float *gscratch,
                          float *partials, cudaStream_t stream) {
    if (hprog->rows <= 0) return DM_OK;
    float *part = hprog->nacc ? partials : NULL;
    row_kernel<<<lc->blocks, lc->threads, lc->smem_bytes, stream>>>(
        dprog, seed, lc->global_scratch ? gscratch : NULL, part, lc->global_scratch);
    DMC_LAUNCHED("the row kernel");
    if (hprog->nacc) {
        int64_t n = (int64_t)hprog->nacc * hprog->cols;
        int blocks = (int)((n + 255) / 256);
        colacc_kernel<<<blocks, 256, 0, stream>>>(dprog, partials, lc->blocks);
        DMC_LAUNCHED("the column-sum kernel");
    }
    return DM_OK;
}

dm_status dm_cuda_philox_words(uint64_t seed, uint32_t stream, uint64_t start,
                                          int64_t n, uint32_t *host_out) {
    if (n <= 0) return DM_OK;
    uint32_t *d = NULL;
    DMC_CUDA(cudaMalloc((void **)&d, (size_t)n * sizeof(uint32_t)));
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    philox_kernel<<<blocks, 256>>>(seed, stream, start, n, d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpy(host_out, d, (size_t)n * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    cudaError_t e_free = cudaFree(d);
    if (e == cudaSuccess) e = e_free;
    if (e != cudaSuccess)
        return dm_fail(DM_ERR_BACKEND, "Philox words on the device failed: %s (%s)",
                       cudaGetErrorString(e), cudaGetErrorName(e));
    return DM_OK;
}
