/* varlen.cu: ATTN and ATTN_BWD on the device (ops.def; issue 25's unpadded batches):
 * attention over packed sequences, each over its own tokens, with the CPU's dropout masks
 * (the 16-bit uniforms of the padded layer's element indices (b, h, j, k), so every backend
 * and the padded layer draw the same). This first version works at the padded length:
 *  1. each sequence's token rows are copied into a padded, head-major work copy (b, h, j,
 *     p), zero past the sequence's length;
 *  2. the scores, the context and the backward's four products are strided-batched cuBLAS
 *     GEMMs over all (sequence, head) pairs at once;
 *  3. a warp per score row does the softmax, the dropout and their backward over the
 *     row's own keys (causal: those up to the row), every element past them 0 (vl_row,
 *     which the emulation runs with one lane a row);
 *  4. the results go back to the token rows. As on the CPU, the op writes the
 *     sequences' tokens and each row's probabilities over its sequence alone.
 * The token-wise work around the attention (projections, FFN, LayerNorms) is what the
 * unpadded layer saves; the attention's GEMMs here still run over the padding (2-8% of a
 * BERT step at half fill). A fused kernel (online softmax, no padding) is issue 25's next
 * step. Emulation (DM_CUDA_EMULATE): the same steps on the host, the GEMMs by
 * dmc_emu_gemm, each row by the same formulas in order (the device sums a row's terms in
 * the warp's order: results agree to rounding, not bit for bit). */
#include <math.h>
#include <string.h>

#include "cuda/philox.cuh"
#include "cuda/rowmath.cuh"

enum { VL_THREADS = 256, VL_ROWS = VL_THREADS / 32 /* a warp per score row */ };

/* x as stored in type dt and read back */
static __host__ __device__ __forceinline__ float vl_round(int dt, float x) {
    if (dt == DMC_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    if (dt == DMC_F16) return __half2float(__float2half_rn(x));
    return x;
}

static __host__ __device__ void vl_offsets(const dmc_varlen *v) {
    int acc = 0;
    v->off[0] = 0;
    for (int64_t s = 0; s < v->B; s++) { /* the host checked them; anything else counts as 0 or J */
        const float l = v->keymask ? (float)v->J : dmc_load(v->lengths, v->len_dt, s);
        acc += l >= (float)v->J ? (int)v->J : l >= 1.0f ? (int)l : 0;
        v->off[s + 1] = acc;
    }
}

/* Up to 4 tensors between token rows and padded copies. */
typedef struct {
    const void *src[4];
    void *dst[4];
    int64_t ld[4]; /* the token rows' */
    int n, unpack; /* unpack: padded copy -> token rows */
} vl_copies;

/* Column col of padded row r (sequence r / J, position r % J). Unpacking writes the
 * sequences' tokens alone (the rows past them are the executor's, as on the CPU). */
static __host__ __device__ void vl_copy(const dmc_varlen *v, const vl_copies *c, int64_t r, int64_t col) {
    const int64_t s = r / v->J, j = r % v->J, o = v->off[s], L = v->off[s + 1] - o;
    const int64_t pi = ((s * v->H + col / v->P) * v->J + j) * v->P + col % v->P;
    for (int q = 0; q < c->n; q++) {
        if (!c->unpack) {
            dmc_store(c->dst[q], v->dt, pi, j < L ? dmc_load(c->src[q], v->dt, (o + j) * c->ld[q] + col) : 0.0f);
            continue;
        }
        if (j < L) dmc_store(c->dst[q], v->dt, (o + j) * c->ld[q] + col, dmc_load(c->src[q], v->dt, pi));
    }
}

/* Score row `row` = (s h j): the keys it sees (0 past its sequence); *written: the
 * probabilities the op writes in the row (the sequence's length; 0 past it), as the CPU. */
static __host__ __device__ __forceinline__ int64_t vl_keys(const dmc_varlen *v, int64_t row, int64_t *written) {
    const int64_t s = row / (v->H * v->J), j = row % v->J, L = v->off[s + 1] - v->off[s];
    *written = j < L ? L : 0;
    return j >= L ? 0 : v->causal && j + 1 < L ? j + 1 : L;
}

/* Score c of row `row` (at base) as the softmax takes it: keymask, the attention mask added
 * as MASK_ADD does (sequence s = row / (H J)) */
static __host__ __device__ __forceinline__ float vl_score(const dmc_varlen *v, const void *x, int64_t row,
                                                          int64_t base, int64_t c) {
    const float y = dmc_load(x, v->dt, base + c);
    if (!v->keymask) return y;
    return y + dmc_mask_term(v, row / (v->H * v->J), c);
}

/* The row steps. FWD: scores (sq[0]) -> probabilities (probs) and their dropped copy
 * (sq[0]); DROP: probs -> the dropped copy (sq[0]); BWD: dP (sq[1]) -> dS (sq[1]). */
enum { VL_FWD = 0, VL_DROP = 1, VL_BWD = 2 };


/* One score row, lane `lane` of the `lanes` that share it taking columns lane, lane +
 * lanes, ...: a warp per row on the device (32), the host's emulation one lane a row. */
static __host__ __device__ void vl_row(const dmc_varlen *v, uint64_t seed, int mode, int64_t row, int lane,
                                       int lanes) {
    int64_t L;
    const int64_t J = v->J, n = vl_keys(v, row, &L), base = row * J;
    const float sc = v->drop ? v->scale : 1.0f; /* evaluation: no dropout, scale 1 */
    void *x = v->sq[mode == VL_BWD];
    float m = -INFINITY, sum = 0.0f;
    if (mode == VL_FWD) {
        for (int64_t c = lane; c < n; c += lanes) m = fmaxf(m, vl_score(v, x, row, base, c));
        m = dmc_lanes_max(m, lanes);
        for (int64_t c = lane; c < n; c += lanes) sum += expf(vl_score(v, x, row, base, c) - m);
    } else if (mode == VL_BWD) {
        for (int64_t c = lane; c < n; c += lanes) {
            const float g = dmc_load(x, v->dt, base + c);
            sum += (dmc_varlen_kept(v, seed, (uint64_t)(base + c)) ? g * sc : 0.0f) * dmc_load(v->probs, v->dt, base + c);
        }
    }
    sum = dmc_lanes_sum(sum, lanes);
    for (int64_t c = lane; c < J; c += lanes) {
        const uint64_t e = (uint64_t)(base + c);
        if (mode == VL_BWD) {
            const float g = c < n && dmc_varlen_kept(v, seed, e) ? dmc_load(x, v->dt, base + c) * sc : 0.0f;
            dmc_store(x, v->dt, base + c, c < n ? dmc_load(v->probs, v->dt, base + c) * (g - sum) : 0.0f);
            continue;
        }
        float p = c >= n ? 0.0f : mode == VL_DROP ? dmc_load(v->probs, v->dt, base + c)
                                                  : vl_round(v->dt, expf(vl_score(v, x, row, base, c) - m) / sum);
        if (mode == VL_FWD && c < L) dmc_store(v->probs, v->dt, base + c, p);
        dmc_store(x, v->dt, base + c, dmc_varlen_kept(v, seed, e) ? p * sc : 0.0f);
    }
}

__global__ void __launch_bounds__(VL_THREADS) vl_rows_kernel(dmc_varlen v, uint64_t seed, int mode) {
    const int64_t row = (int64_t)blockIdx.x * VL_ROWS + threadIdx.x / 32;
    if (row < v.B * v.H * v.J) vl_row(&v, seed, mode, row, (int)(threadIdx.x % 32), 32);
}

__global__ void vl_offsets_kernel(dmc_varlen v) { vl_offsets(&v); }

/* a block per padded row, its threads over the row's columns */
__global__ void vl_copy_kernel(dmc_varlen v, vl_copies c) {
    const int64_t W = v.H * v.P;
    for (int64_t col = threadIdx.x; col < W; col += blockDim.x) vl_copy(&v, &c, blockIdx.x, col);
}

size_t dmc_varlen_work_bytes(const dmc_varlen *v) {
    const size_t es = (size_t)dmc_esize(v->dt), pad = (size_t)(v->B * v->H * v->J * v->P) * es,
                 sq = (size_t)(v->B * v->H * v->J * v->J) * es;
    const size_t line = 256, off = ((size_t)(v->B + 1) * sizeof(int) + line - 1) / line * line;
    if (v->flash) return off + dmc_flash_work_bytes(v);
    return off + (v->bwd ? 5 : 4) * ((pad + line - 1) / line * line) + (v->bwd ? 2 : 1) * ((sq + line - 1) / line * line);
}

void dmc_varlen_bind(dmc_varlen *v, void *work) {
    const size_t es = (size_t)dmc_esize(v->dt), line = 256;
    const size_t pad = ((size_t)(v->B * v->H * v->J * v->P) * es + line - 1) / line * line,
                 sq = ((size_t)(v->B * v->H * v->J * v->J) * es + line - 1) / line * line;
    char *p = (char *)work;
    v->off = (int *)p;
    p += ((size_t)(v->B + 1) * sizeof(int) + line - 1) / line * line;
    if (v->flash) {
        dmc_flash_bind(v, p);
        return;
    }
    for (int q = 0; q < 5; q++) {
        v->pad[q] = q < (v->bwd ? 5 : 4) ? p : NULL;
        if (v->pad[q]) p += pad;
    }
    for (int q = 0; q < 2; q++) {
        v->sq[q] = q < (v->bwd ? 2 : 1) ? p : NULL;
        if (v->sq[q]) p += sq;
    }
}

/* Row-major C = alpha op(A) op(B) for each (sequence, head): A m x k (ta: stored k x m),
 * B k x n (tb: stored n x k), strides sA, sB, sC between the pairs. As cuBLAS's
 * column-major C^T = op(B)^T op(A)^T. */
static dm_status vl_gemm(const dmc_varlen *v, int emu, cublasHandle_t blas, int ta, int tb, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *A, int64_t lda, int64_t sA, const void *Bm, int64_t ldb,
                         int64_t sB, void *C, int64_t ldc, int64_t sC) {
    const int batch = (int)(v->B * v->H);
    if (emu) {
        dmc_emu_gemm(v->dt, tb, ta, (int)n, (int)m, (int)k, alpha, Bm, (int)ldb, sB, A, (int)lda, sA, 0.0f, C,
                     (int)ldc, sC, batch);
        return DM_OK;
    }
    const cudaDataType_t ty = v->dt == DMC_BF16 ? CUDA_R_16BF : v->dt == DMC_F16 ? CUDA_R_16F : CUDA_R_32F;
    const float beta = 0.0f;
    DMC_BLAS(cublasGemmStridedBatchedEx(blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
                                        (int)m, (int)k, &alpha, Bm, ty, (int)ldb, sB, A, ty, (int)lda, sA, &beta, C,
                                        ty, (int)ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DM_OK;
}

static dm_status vl_copies_run(const dmc_varlen *v, const vl_copies *c, int emu, cudaStream_t stream) {
    const int64_t rows = v->B * v->J, W = v->H * v->P;
    if (emu) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t col = 0; col < W; col++) vl_copy(v, c, r, col);
        return DM_OK;
    }
    vl_copy_kernel<<<(unsigned)rows, W < 256 ? (unsigned)((W + 31) / 32 * 32) : 256u, 0, stream>>>(*v, *c);
    DMC_CUDA(cudaGetLastError());
    return DM_OK;
}

static dm_status vl_rows_run(const dmc_varlen *v, uint64_t seed, int mode, int emu, cudaStream_t stream) {
    const int64_t rows = v->B * v->H * v->J;
    if (emu) {
        for (int64_t r = 0; r < rows; r++) vl_row(v, seed, mode, r, 0, 1);
        return DM_OK;
    }
    vl_rows_kernel<<<(unsigned)((rows + VL_ROWS - 1) / VL_ROWS), VL_THREADS, 0, stream>>>(*v, seed, mode);
    DMC_CUDA(cudaGetLastError());
    return DM_OK;
}

dm_status dmc_varlen_run(const dmc_varlen *v, uint64_t seed, int emu, cublasHandle_t blas, cudaStream_t stream) {
    const int64_t J = v->J, P = v->P, sp = J * P, ss = J * J;
    if (v->B * v->J > INT32_MAX || v->B * v->H > INT32_MAX ||
        (v->B * v->H * v->J + VL_ROWS - 1) / VL_ROWS > INT32_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "attention over %lld sequences of %lld tokens, %lld heads: beyond "
                       "the CUDA kernel's launch sizes", (long long)v->B, (long long)v->J, (long long)v->H);
    if (emu) vl_offsets(v);
    else {
        vl_offsets_kernel<<<1, 1, 0, stream>>>(*v);
        DMC_CUDA(cudaGetLastError());
    }
    if (v->flash) return dmc_flash_run(v, seed, emu, stream);
    vl_copies in = {{v->q, v->k, v->v, v->dctx}, {v->pad[0], v->pad[1], v->pad[2], v->pad[3]},
                    {v->ldq, v->ldq, v->ldq, v->ldc}, v->bwd ? 4 : 3, 0};
    DM_TRY(vl_copies_run(v, &in, emu, stream));
    if (!v->bwd) { /* S = alpha Q K^T; probabilities and their dropped copy; C = dropped V */
        DM_TRY(vl_gemm(v, emu, blas, 0, 1, J, J, P, v->alpha, v->pad[0], P, sp, v->pad[1], P, sp, v->sq[0], J, ss));
        DM_TRY(vl_rows_run(v, seed, VL_FWD, emu, stream));
        DM_TRY(vl_gemm(v, emu, blas, 0, 0, J, P, J, 1.0f, v->sq[0], J, ss, v->pad[2], P, sp, v->pad[3], P, sp));
        const vl_copies out = {{v->pad[3]}, {v->ctx}, {v->ldc}, 1, 1};
        return vl_copies_run(v, &out, emu, stream);
    }
    /* the dropped probabilities D; dP = dC V^T; dV = D^T dC; dS; dQ = alpha dS K into V's
     * copy, dK = alpha dS^T Q into dC's */
    DM_TRY(vl_rows_run(v, seed, VL_DROP, emu, stream));
    DM_TRY(vl_gemm(v, emu, blas, 0, 1, J, J, P, 1.0f, v->pad[3], P, sp, v->pad[2], P, sp, v->sq[1], J, ss));
    DM_TRY(vl_gemm(v, emu, blas, 1, 0, J, P, J, 1.0f, v->sq[0], J, ss, v->pad[3], P, sp, v->pad[4], P, sp));
    DM_TRY(vl_rows_run(v, seed, VL_BWD, emu, stream));
    DM_TRY(vl_gemm(v, emu, blas, 0, 0, J, P, J, v->alpha, v->sq[1], J, ss, v->pad[1], P, sp, v->pad[2], P, sp));
    DM_TRY(vl_gemm(v, emu, blas, 1, 0, J, P, J, v->alpha, v->sq[1], J, ss, v->pad[0], P, sp, v->pad[3], P, sp));
    const vl_copies out = {{v->pad[2], v->pad[3], v->pad[4]}, {v->dq, v->dk, v->dv}, {v->ldd, v->ldd, v->ldd}, 3, 1};
    return vl_copies_run(v, &out, emu, stream);
}
