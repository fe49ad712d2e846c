/* xent.cu: the fused decoder and cross-entropy (LINEAR_XENT, LINEAR_XENT_BWD; ops.def) on
 * the device, as the CPU's (cpu/xent.c): the logits of the m rows scored (m x v, v the
 * vocabulary) are never written whole. The vocabulary is walked in chunks of `chunk`
 * columns; a chunk's logits (m x chunk, fp32) come from one cuBLAS GEMM into the op's
 * work space and a warp per row uses them at once.
 *   forward: per row an online logsumexp (the running max and the sum of exp below it,
 *     rescaled when the max grows), the argmax (the first column holding the max: ties to
 *     the lowest id, as torch.argmax) and the label's logit, carried in fp32 across the
 *     chunks; the last chunk writes loss, lse and pred.
 *   backward: the chunk's logits again, dl = dloss * (exp(logit - lse) - onehot) in fp32
 *     in place (and a copy in the storage type for the GEMMs), dbias = its column sums
 *     (rows in order), the chunk's dW rows = dl^T t (written once), dt += dl W_chunk into
 *     an fp32 accumulator (dt itself in fp32 storage), stored at the end.
 * The order of every sum is fixed: the results repeat bit for bit on one device.
 * Emulation (DM_CUDA_EMULATE): the same steps on the host, the GEMMs by dmc_emu_gemm_ex,
 * each row by the same function with one lane (the warp's sums in another order: results
 * agree to rounding). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/rowmath.cuh"

enum { XE_THREADS = 256, XE_ROWS = XE_THREADS / 32 /* a warp per row */ };

/* The chunk width for m rows: at most 4096 columns (or DMOVE_CUDA_XENT_CHUNK, for tests),
 * the logits of a chunk at most 16M floats, a multiple of 32. */
static int64_t xe_chunk(int64_t m, int64_t v) {
    int64_t c = 4096;
    const char *env = getenv("DMOVE_CUDA_XENT_CHUNK");
    if (env && atoll(env) >= 1) c = atoll(env);
    const int64_t cap = ((int64_t)1 << 24) / (m > 0 ? m : 1);
    if (c > cap) c = cap;
    if (c > 32) c -= c % 32;
    if (c < 32) c = 32;
    return c < v ? c : v;
}

dm_status dmc_xent_plan(dmc_xent *x) {
    if (x->m < 1 || x->e < 1 || x->v < 1 || x->m > INT32_MAX || x->e > INT32_MAX || x->v > INT32_MAX ||
        x->v > INT64_MAX / x->e || (x->m + XE_ROWS - 1) / XE_ROWS > INT32_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused cross-entropy over %lld rows, %lld columns, %lld inner: beyond "
                       "cuBLAS's and the kernels' sizes", (long long)x->m, (long long)x->v, (long long)x->e);
    x->chunk = xe_chunk(x->m, x->v);
    return DM_OK;
}

static size_t xe_line(size_t b) { return (b + 255) / 256 * 256; }

size_t dmc_xent_work_bytes(const dmc_xent *x) {
    const size_t L = (size_t)(x->m * x->chunk), es = (size_t)dmc_esize(x->dt);
    size_t b = xe_line(L * sizeof(float)) + xe_line(5 * (size_t)x->m * sizeof(float));
    if (x->bwd && x->dt != DMC_F32) b += xe_line(L * es) + xe_line((size_t)(x->m * x->e) * sizeof(float));
    return b;
}

void dmc_xent_bind(dmc_xent *x, void *work) {
    char *p = (char *)work;
    const size_t L = (size_t)(x->m * x->chunk), es = (size_t)dmc_esize(x->dt);
    x->logits = (float *)p;
    p += xe_line(L * sizeof(float));
    x->part = (float *)p;
    p += xe_line(5 * (size_t)x->m * sizeof(float));
    x->dl = x->logits, x->acc = (float *)x->dt_out; /* fp32: in place, and dt itself */
    if (x->bwd && x->dt != DMC_F32) {
        x->dl = p;
        p += xe_line(L * es);
        x->acc = (float *)p;
    }
}

/* The (value, lowest index) maximum over the lanes that share a row (as dmc_lanes_max). */
static __host__ __device__ __forceinline__ void xe_argmax(float *v, int64_t *i, int lanes) {
#ifdef __CUDA_ARCH__
    for (int d = lanes / 2; d > 0; d >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *v, d);
        const long long oi = __shfl_xor_sync(0xffffffffu, (long long)*i, d);
        if (ov > *v || (ov == *v && oi < *i)) *v = ov, *i = oi;
    }
#endif
    (void)v, (void)i, (void)lanes;
}

/* Forward, row r of the chunk at column c0 (n columns): fold its logits into the row's
 * partials (max, sum, argmax, its value, the label's logit); the first chunk starts
 * them, the last writes the outputs. */
static __host__ __device__ void xe_fold(const dmc_xent *x, int64_t r, int64_t c0, int64_t n, int lane, int lanes) {
    const float *L = x->logits + r * n;
    float *P = x->part; /* max, sum, argmax, its value, the label's logit: m each */
    const int64_t m = x->m, l = dmc_index_row(dmc_load(x->labels, x->lab_dt, r), x->v);
    float cm = -INFINITY;
    int64_t arg = c0 + n; /* none yet: above every column of the chunk */
    for (int64_t c = lane; c < n; c += lanes) {
        const float y = L[c] + dmc_load(x->bias, x->dt, c0 + c);
        if (y > cm) cm = y, arg = c0 + c;
    }
    xe_argmax(&cm, &arg, lanes);
    const int first = c0 == 0;
    float M = first ? -INFINITY : P[r], S = first ? 0.0f : P[m + r];
    if (cm > M) {
        S = M == -INFINITY ? 0.0f : S * expf(M - cm);
        M = cm;
    }
    float s = 0.0f;
    for (int64_t c = lane; c < n; c += lanes) s += expf(L[c] + dmc_load(x->bias, x->dt, c0 + c) - M);
    s = dmc_lanes_sum(s, lanes);
    if (lane) return;
    float am = first ? 0.0f : P[2 * m + r], av = first ? -INFINITY : P[3 * m + r], lab = first ? 0.0f : P[4 * m + r];
    if (cm > av) av = cm, am = (float)arg; /* ties: the earlier chunk's id */
    if (l >= c0 && l < c0 + n) lab = L[l - c0] + dmc_load(x->bias, x->dt, l);
    S += s;
    if (c0 + n < x->v) {
        P[r] = M, P[m + r] = S, P[2 * m + r] = am, P[3 * m + r] = av, P[4 * m + r] = lab;
        return;
    }
    const float ls = logf(S);
    dmc_store(x->lse, x->out_dt[1], r, M + ls);
    dmc_store(x->pred, x->out_dt[2], r, am);
    dmc_store(x->loss, x->out_dt[0], r, l >= 0 ? (M - lab) + ls : 0.0f);
}

/* Backward, row r of the chunk: its logits into dl = dloss (exp(logit - lse) - onehot),
 * 0 on a row whose label is no column; fp32 in place, and in the storage type at dl. */
static __host__ __device__ void xe_grad(const dmc_xent *x, int64_t r, int64_t c0, int64_t n, int lane, int lanes) {
    float *L = x->logits + r * n;
    const int64_t l = dmc_index_row(dmc_load(x->labels, x->lab_dt, r), x->v);
    const float w = dmc_load(x->dloss, x->in_dt[1], r), ls = dmc_load(x->lse_in, x->in_dt[0], r);
    for (int64_t c = lane; c < n; c += lanes) {
        float g = 0.0f;
        if (l >= 0) g = w * (expf(L[c] + dmc_load(x->bias, x->dt, c0 + c) - ls) - (c0 + c == l ? 1.0f : 0.0f));
        L[c] = g;
        if (x->dl != x->logits) dmc_store(x->dl, x->dt, r * n + c, g);
    }
}

/* dbias of the chunk's column c: dl's column sum, rows in order. */
static __host__ __device__ void xe_colsum(const dmc_xent *x, int64_t c0, int64_t n, int64_t c, int64_t rows) {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s += x->logits[r * n + c];
    dmc_store(x->dbias, x->dt, c0 + c, s);
}

enum { XE_FOLD = 0, XE_GRAD = 1 };

__global__ void __launch_bounds__(XE_THREADS) xe_rows_kernel(dmc_xent x, int64_t rows, int64_t c0, int64_t n, int mode) {
    const int64_t r = (int64_t)blockIdx.x * XE_ROWS + threadIdx.x / 32;
    if (r >= rows) return;
    if (mode == XE_FOLD) xe_fold(&x, r, c0, n, (int)(threadIdx.x % 32), 32);
    else xe_grad(&x, r, c0, n, (int)(threadIdx.x % 32), 32);
}

__global__ void xe_colsum_kernel(dmc_xent x, int64_t c0, int64_t n, int64_t rows) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c < n) xe_colsum(&x, c0, n, c, rows);
}

/* the fp32 accumulator's rows run into dt (storage type); rows past them are the
 * executor's to zero (dmx_zero_tail), as the CPU's */
__global__ void xe_store_kernel(dmc_xent x, int64_t rows) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * x.e) dmc_store(x.dt_out, x.dt, i, x.acc[i]);
}

/* Column-major C (m x n, ldc; type ctype) = alpha op(A) op(B) + beta C with A and B of
 * the storage type: cublasGemmEx, or its definition on the host. */
static dm_status xe_gemm(const dmc_xent *x, int emu, cublasHandle_t blas, int ta, int tb, int64_t m, int64_t n,
                         int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
                         int ctype, int64_t ldc) {
    if (emu) {
        dmc_emu_gemm_ex(x->dt, ctype, ta, tb, (int)m, (int)n, (int)k, 1.0f, A, (int)lda, 0, B, (int)ldb, 0, beta, C,
                        (int)ldc, 0, 1);
        return DM_OK;
    }
    const cudaDataType_t ty = x->dt == DMC_BF16 ? CUDA_R_16BF : x->dt == DMC_F16 ? CUDA_R_16F : CUDA_R_32F;
    const cudaDataType_t cy = ctype == DMC_BF16 ? CUDA_R_16BF : ctype == DMC_F16 ? CUDA_R_16F : CUDA_R_32F;
    const float alpha = 1.0f;
    DMC_BLAS(cublasGemmEx(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)m, (int)n,
                          (int)k, &alpha, A, ty, (int)lda, B, ty, (int)ldb, &beta, C, cy, (int)ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DM_OK;
}

static dm_status xe_rows(const dmc_xent *x, int64_t rows, int64_t c0, int64_t n, int mode, int emu,
                         cudaStream_t stream) {
    if (emu) {
        for (int64_t r = 0; r < rows; r++)
            if (mode == XE_FOLD) xe_fold(x, r, c0, n, 0, 1);
            else xe_grad(x, r, c0, n, 0, 1);
        return DM_OK;
    }
    xe_rows_kernel<<<(unsigned)((rows + XE_ROWS - 1) / XE_ROWS), XE_THREADS, 0, stream>>>(*x, rows, c0, n, mode);
    DMC_LAUNCHED("the fused cross-entropy's row kernel");
    return DM_OK;
}

dm_status dmc_xent_run(const dmc_xent *x, int emu, cublasHandle_t blas, cudaStream_t stream) {
    const int64_t rows = x->m_run, e = x->e, v = x->v;
    if (rows < 1 || rows > x->m) return dm_fail(DM_ERR_INTERNAL, "fused cross-entropy: %lld rows of %lld", (long long)rows, (long long)x->m);
    for (int64_t c0 = 0; c0 < v; c0 += x->chunk) {
        const int64_t n = v - c0 < x->chunk ? v - c0 : x->chunk;
        const char *Wc = (const char *)x->W + (size_t)(c0 * e) * (size_t)dmc_esize(x->dt);
        /* the chunk's logits, row-major rows x n: column-major L^T = W_c t^T */
        DM_TRY(xe_gemm(x, emu, blas, 1, 0, n, rows, e, Wc, e, x->t, e, 0.0f, x->logits, DMC_F32, n));
        if (!x->bwd) {
            DM_TRY(xe_rows(x, rows, c0, n, XE_FOLD, emu, stream));
            continue;
        }
        DM_TRY(xe_rows(x, rows, c0, n, XE_GRAD, emu, stream));
        if (emu) {
            for (int64_t c = 0; c < n; c++) xe_colsum(x, c0, n, c, rows);
        } else {
            xe_colsum_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(*x, c0, n, rows);
            DMC_LAUNCHED("the fused cross-entropy's bias gradient");
        }
        /* dW rows c0.. (n x e row-major; column-major e x n) = t^T dl; dt (m x e) += dl W_c */
        char *dWc = (char *)x->dW + (size_t)(c0 * e) * (size_t)dmc_esize(x->dt);
        DM_TRY(xe_gemm(x, emu, blas, 0, 1, e, n, rows, x->t, e, x->dl, n, 0.0f, dWc, x->dt, e));
        DM_TRY(xe_gemm(x, emu, blas, 0, 0, e, rows, n, Wc, e, x->dl, n, c0 ? 1.0f : 0.0f, x->acc,
                       DMC_F32, e));
    }
    if (!x->bwd || x->dt == DMC_F32) return DM_OK;
    if (emu) {
        for (int64_t i = 0; i < rows * e; i++) dmc_store(x->dt_out, x->dt, i, x->acc[i]);
        return DM_OK;
    }
    const int64_t blocks = (rows * e + 255) / 256;
    if (blocks > INT32_MAX) return dm_fail(DM_ERR_UNSUPPORTED, "fused cross-entropy: %lld x %lld gradient beyond the kernel's grid", (long long)rows, (long long)e);
    xe_store_kernel<<<(unsigned)blocks, 256, 0, stream>>>(*x, rows);
    DMC_LAUNCHED("the fused cross-entropy's input gradient");
    return DM_OK;
}
