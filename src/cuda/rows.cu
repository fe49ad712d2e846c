/* rows.cu: the element-wise and normalization families on the GPU: one generic kernel
 * that interprets a row program (cuda_internal.h) for every op kind of ops.def, with the
 * math of src/cpu/eltwise.c and src/cpu/norm.c (inverted dropout on Philox uniforms, softmax
 * with the row max subtracted, two-pass LayerNorm in fp32 with rstd in double, as the
 * CPU), and the second kernel of the column reductions. A kind added to ops.def needs
 * a case here (and in emulate.cu and cudagen/gen.cu); tests/test_ops.c runs every kind.
 *
 * A thread block runs one row at a time (grid-stride over rows). Thread t always handles
 * the 8-column chunks t, t + blockDim, ... in every op, so a column accumulator is only
 * ever touched by one thread; block-wide sums use warp shuffles. Tensors internal to a
 * fused group live in the block's scratch: padded rows in dynamic shared memory, or in a
 * per-block slice of a global buffer when they do not fit. Column reductions (bias and
 * LayerNorm parameter gradients) accumulate per block in that scratch, are written out
 * as per-block partials and summed in a fixed order by a second kernel: deterministic.
 *
 * Rows go in chunks of 8 columns per thread (16-byte loads and stores of bf16/fp16, two
 * of fp32, when the program's operands are aligned), a row per block, or a row per team
 * of 8/16/32 lanes when rows are short (at most 512 columns) and nothing is summed over
 * columns. */
#include <float.h>
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_internal.h"
#include "cuda/philox.cuh"
#include "cuda/rowmath.cuh"

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

/* Who runs a row: the whole block (lt = threadIdx.x, n = blockDim.x), or a team of
 * `warp` = 8, 16 or 32 lanes of one warp (warp_rows programs: rows of at most `warp`
 * chunks, or 64 for 32 lanes; no column accumulators; lt = lane % warp). Reductions over the row's threads
 * follow; a team's shuffles and barriers name its own lanes (mask), as the teams of a
 * warp may leave the row loop at different times. */
struct rowteam {
    int lt, n, warp;
    unsigned mask;
    int64_t kr; /* the row whose dropout words the current row draws (dmc_key_row) */
    float *red;
    __device__ float team_red(float v, int is_max) const {
        for (int o = warp >> 1; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(mask, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        return v;
    }
    __device__ float sum(float v) const { return warp ? team_red(v, 0) : block_reduce(v, 0, red); }
    __device__ float max(float v) const { return warp ? team_red(v, 1) : block_reduce(v, 1, red); }
    __device__ void sync() const {
        if (warp) __syncwarp(mask);
        else __syncthreads();
    }
};

/* A row of an operand in memory: its first element and its element type. Loads widen to
 * fp32, stores round to the type (nearest even). */
struct dptr {
    char *p;
    int dt;
};

/* Element conversions; T is the storage type of the program's kernel (float, bf16, half):
 * an operand is either fp32 (dt == DMC_F32: scratch, row statistics, or fp32 storage) or
 * of type T, so each access has at most two paths. */
__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float tof(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T fromf(float v);
template <> __device__ __forceinline__ float fromf<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 fromf<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half fromf<__half>(float v) { return __float2half_rn(v); }

template <typename T> __device__ __forceinline__ float ld(const dptr &a, int64_t c) {
    if (a.dt == DMC_F32) return ((const float *)a.p)[c];
    return tof(((const T *)a.p)[c]);
}

template <typename T> __device__ __forceinline__ void st(const dptr &a, int64_t c, float v) {
    if (a.dt == DMC_F32) ((float *)a.p)[c] = v;
    else ((T *)a.p)[c] = fromf<T>(v);
}

/* Any element type (the column sums' destinations). */
__device__ __forceinline__ void st_any(const dptr &a, int64_t c, float v) {
    if (a.dt == DMC_BF16) st<__nv_bfloat16>(a, c, v);
    else if (a.dt == DMC_F16) st<__half>(a, c, v);
    else st<float>(a, c, v);
}

/* Rows are processed in chunks of VEC consecutive columns, a chunk per thread at a time:
 * the same thread owns the same chunk in every op of the program. n = the chunk's valid
 * columns (VEC but at the row's end); vec: the program's operands are 16-byte aligned
 * with rows a multiple of 16 bytes, so a full chunk is one or two 16-byte accesses. */
enum { VEC = 8 };

template <typename T>
__device__ __forceinline__ void ld8(const dptr &a, int64_t c0, int n, int vec, float v[VEC]) {
    if (vec && n == VEC) {
        if (a.dt == DMC_F32 || sizeof(T) == 4) {
            float4 x = *(const float4 *)(a.p + c0 * 4), y = *(const float4 *)(a.p + c0 * 4 + 16);
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
            v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
            return;
        }
        uint4 u = *(const uint4 *)(a.p + c0 * 2);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const T *h = (const T *)&w[k];
            v[2 * k] = tof(h[0]);
            v[2 * k + 1] = tof(h[1]);
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) v[e] = e < n ? ld<T>(a, c0 + e) : 0.0f;
}

template <typename T>
__device__ __forceinline__ void st8(const dptr &a, int64_t c0, int n, int vec, const float v[VEC]) {
    if (vec && n == VEC) {
        if (a.dt == DMC_F32 || sizeof(T) == 4) {
            *(float4 *)(a.p + c0 * 4) = make_float4(v[0], v[1], v[2], v[3]);
            *(float4 *)(a.p + c0 * 4 + 16) = make_float4(v[4], v[5], v[6], v[7]);
            return;
        }
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            T h[2] = {fromf<T>(v[2 * k]), fromf<T>(v[2 * k + 1])};
            w[k] = *(const uint32_t *)h;
        }
        *(uint4 *)(a.p + c0 * 2) = make_uint4(w[0], w[1], w[2], w[3]);
        return;
    }
#pragma unroll
    for (int e = 0; e < VEC; e++)
        if (e < n) st<T>(a, c0 + e, v[e]);
}

/* Operand row r. */
__device__ __forceinline__ dptr operand(const dmc_operand *d, float *scr, int64_t r,
                                        int64_t cols) {
    if (d->loc == DMC_LOC_SCRATCH) return dptr{(char *)(scr + d->slot), DMC_F32};
    const int64_t e = dmc_row_elem(d, r, cols);
    return dptr{(char *)d->base + e * dmc_esize(d->dt), d->dt};
}

/* Dropout of one chunk: v[e] = keep ? v[e] * scale : 0, for the row's element indices
 * r * cols + c0 + e; Philox block q = index >> 3 holds the uniforms of 8 (a chunk of 8
 * aligned to 8 needs one block, another two). */
__device__ __forceinline__ void dropout_chunk(const dmc_rowop *op, int64_t r, int64_t cols,
                                              int64_t c0, int n, uint64_t seed, float v[VEC]) {
    if (!op->drop_on) return;
    const uint64_t e0 = (uint64_t)r * (uint64_t)cols + (uint64_t)c0;
    uint64_t q = e0 >> 3;
    uint4 w = dmc_philox_block(seed, op->stream, q);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        if (e >= n) break;
        uint64_t idx = e0 + (uint64_t)e;
        if ((idx >> 3) != q) {
            q = idx >> 3;
            w = dmc_philox_block(seed, op->stream, q);
        }
        v[e] = dmc_uniform_of(w, idx) >= op->drop_thr ? v[e] * op->drop_scale : 0.0f;
    }
}

/* The chunk loop of one row: c0 over this thread's chunks, n their valid columns. */
#define FOR_CHUNKS(T, cols)                                                              \
    for (int64_t c0 = (int64_t)(T).lt * VEC; c0 < (cols); c0 += (int64_t)(T).n * VEC)   \
        for (int n = (int)((cols) - c0 < VEC ? (cols) - c0 : VEC), once_ = 1; once_; once_ = 0)

/* Softmax of the row, its max subtracted: three passes (max, sum, write). */
template <typename S>
__device__ __forceinline__ void rowop_softmax(const dptr *in, const dptr *out, int64_t cols,
                                              const rowteam &T, int vec) {
    float a[VEC], y[VEC];
    float m = -INFINITY, s = 0.0f;
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (e < n) m = fmaxf(m, a[e]);
    }
    m = T.max(m);
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (e < n) s += expf(a[e] - m);
    }
    const float inv = 1.0f / T.sum(s);
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++) y[e] = expf(a[e] - m) * inv;
        st8<S>(out[0], c0, n, vec, y);
    }
}

/* Softmax backward of the row; in: dy, y; dx = y * (dy - sum(dy * y)). */
template <typename S>
__device__ __forceinline__ void rowop_softmax_bwd(const dptr *in, const dptr *out, int64_t cols,
                                                  const rowteam &T, int vec) {
    float a[VEC], b[VEC], y[VEC];
    float s = 0.0f;
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
        ld8<S>(in[1], c0, n, vec, b);
#pragma unroll
        for (int e = 0; e < VEC; e++) s += a[e] * b[e]; /* zero past n */
    }
    s = T.sum(s);
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
        ld8<S>(in[1], c0, n, vec, b);
#pragma unroll
        for (int e = 0; e < VEC; e++) y[e] = b[e] * (a[e] - s);
        st8<S>(out[0], c0, n, vec, y);
    }
}

/* LayerNorm of the row (mean, then the variance about it); in: x, gamma, beta; out: y,
 * mean, rstd. */
template <typename S>
__device__ __forceinline__ void rowop_layernorm(const dmc_rowop *op, const dptr *in,
                                                const dptr *out, int64_t cols, const rowteam &T,
                                                int vec) {
    float a[VEC], y[VEC];
    float s = 0.0f, v = 0.0f;
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++) s += a[e];
    }
    const float mean = T.sum(s) / (float)cols;
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (e < n) v += (a[e] - mean) * (a[e] - mean);
    }
    v = T.sum(v);
    const float rstd = (float)(1.0 / sqrt((double)(v / (float)cols) + op->eps));
    FOR_CHUNKS(T, cols) {
        float gm[VEC], bt[VEC];
        ld8<S>(in[0], c0, n, vec, a);
        ld8<S>(in[1], c0, n, vec, gm);
        ld8<S>(in[2], c0, n, vec, bt);
#pragma unroll
        for (int e = 0; e < VEC; e++) y[e] = (a[e] - mean) * rstd * gm[e] + bt[e];
        st8<S>(out[0], c0, n, vec, y);
    }
    if (T.lt == 0) {
        st<S>(out[1], 0, mean);
        st<S>(out[2], 0, rstd);
    }
}

/* LayerNorm backward of the row, its parameter gradients summed over the rows in the
 * scratch accumulators. */
template <typename S>
__device__ __forceinline__ void rowop_layernorm_bwd(const dptr *in, const dptr *out, int64_t cols,
                                                    const rowteam &T, int vec) {
    /* in: dy, x, mean, rstd, gamma; out: dx, dgamma (acc), dbeta (acc).
     * xh = (x - mean) rstd; g = dy gamma; dx = rstd (g - mean(g) - xh mean(g xh)) */
    float a[VEC], b[VEC], y[VEC];
    const float mean = ld<S>(in[2], 0), rstd = ld<S>(in[3], 0);
    float *dg = (float *)out[1].p, *db = (float *)out[2].p; /* scratch accumulators */
    float sg = 0.0f, sgx = 0.0f;
    FOR_CHUNKS(T, cols) {
        float gm[VEC];
        ld8<S>(in[0], c0, n, vec, a);
        ld8<S>(in[1], c0, n, vec, b);
        ld8<S>(in[4], c0, n, vec, gm);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            if (e >= n) break;
            float xh = (b[e] - mean) * rstd, g = a[e] * gm[e];
            sg += g;
            sgx += g * xh;
            dg[c0 + e] += a[e] * xh;
            db[c0 + e] += a[e];
        }
    }
    const float inv_n = 1.0f / (float)cols;
    sg = T.sum(sg) * inv_n;
    sgx = T.sum(sgx) * inv_n;
    FOR_CHUNKS(T, cols) {
        float gm[VEC];
        ld8<S>(in[0], c0, n, vec, a);
        ld8<S>(in[1], c0, n, vec, b);
        ld8<S>(in[4], c0, n, vec, gm);
#pragma unroll
        for (int e = 0; e < VEC; e++) y[e] = rstd * (a[e] * gm[e] - sg - (b[e] - mean) * rstd * sgx);
        st8<S>(out[0], c0, n, vec, y);
    }
}

/* Cross-entropy of the row (in: logits, label; out: loss, lse): the max, then the sum of
 * exp(x - max) with the label's logit picked up in the same pass; loss = (max - x[l]) +
 * log(sum) as the CPU, 0 where the label selects no column. */
template <typename S>
__device__ __forceinline__ void rowop_xent(const dptr *in, const dptr *out, int64_t cols, const rowteam &T,
                                           int vec) {
    float a[VEC];
    const long long l = dmc_index_row(ld<S>(in[1], 0), cols);
    float m = -INFINITY, s = 0.0f, p = 0.0f;
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (e < n) m = fmaxf(m, a[e]);
    }
    m = T.max(m);
    FOR_CHUNKS(T, cols) {
        ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (e < n) {
                s += expf(a[e] - m);
                if (c0 + e == l) p += a[e];
            }
    }
    s = T.sum(s);
    p = T.sum(p);
    if (T.lt == 0) {
        st<S>(out[0], 0, l >= 0 ? (m - p) + logf(s) : 0.0f);
        st<S>(out[1], 0, m + logf(s));
    }
}

/* One op on row r. Every thread of the team takes the same branch (the op is uniform),
 * so the team reductions inside are legal. Arithmetic in fp32; loads and stores in each
 * operand's element type. */
template <typename S>
__device__ void run_rowop(const dmc_rowop *op, int64_t r, int64_t cols, float *scr,
                          uint64_t seed, const rowteam &T, int vec) {
    /* fixed trip counts, so the operand rows stay in registers */
    dptr in[DM_MAX_IN], out[DM_MAX_OUT];
#pragma unroll
    for (int s = 0; s < DM_MAX_IN; s++)
        in[s] = s < op->nin ? operand(&op->in[s], scr, r, cols) : dptr{nullptr, DMC_F32};
#pragma unroll
    for (int s = 0; s < DM_MAX_OUT; s++)
        out[s] = s < op->nout ? operand(&op->out[s], scr, r, cols) : dptr{nullptr, DMC_F32};
    float a[VEC], b[VEC], y[VEC];
    switch (op->kind) {
    case DM_OP_BIAS_ADD:
    case DM_OP_ADD:
    case DM_OP_MUL:
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
            ld8<S>(in[1], c0, n, vec, b);
#pragma unroll
            for (int e = 0; e < VEC; e++) y[e] = op->kind == DM_OP_MUL ? a[e] * b[e] : a[e] + b[e];
            st8<S>(out[0], c0, n, vec, y);
        }
        break;
    case DM_OP_MASK_ADD: { /* as Hugging Face: scores + (1 - mask) * finfo.min */
        const float lo = dmc_lowest(out[0].dt);
        const int64_t keep = op->causal ? r % cols + 1 : cols; /* causal: keys <= the query */
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
            ld8<S>(in[1], c0, n, vec, b);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                y[e] = fmaxf(a[e] + (c0 + e < keep ? 1.0f - b[e] : 1.0f) * -FLT_MAX, lo);
            st8<S>(out[0], c0, n, vec, y);
        }
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD:
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
            dropout_chunk(op, T.kr, cols, c0, n, seed, a);
            st8<S>(out[0], c0, n, vec, a);
        }
        break;
    case DM_OP_DROPOUT_BWD_NZ: /* in: dy, the forward output: kept where it is non-zero */
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
            ld8<S>(in[1], c0, n, vec, b);
#pragma unroll
            for (int e = 0; e < VEC; e++) y[e] = b[e] != 0.0f ? a[e] * op->drop_scale : 0.0f;
            st8<S>(out[0], c0, n, vec, y);
        }
        break;
    case DM_OP_ACT:
    case DM_OP_ACT_DERIV: /* in: x; out: act(x) [, act'(x)] from one evaluation */
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
            for (int e = 0; e < VEC; e++) y[e] = dmc_act_both(a[e], op->act, &b[e]);
            st8<S>(out[0], c0, n, vec, y);
            if (op->kind == DM_OP_ACT_DERIV) st8<S>(out[1], c0, n, vec, b);
        }
        break;
    case DM_OP_ACT_BWD: /* in: dy, x */
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
            ld8<S>(in[1], c0, n, vec, b);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float g;
                (void)dmc_act_both(b[e], op->act, &g);
                y[e] = a[e] * g;
            }
            st8<S>(out[0], c0, n, vec, y);
        }
        break;
    case DM_OP_SOFTMAX:
        rowop_softmax<S>(in, out, cols, T, vec);
        break;
    case DM_OP_SOFTMAX_BWD: /* in: dy, y; dx = y * (dy - sum(dy * y)) */
        rowop_softmax_bwd<S>(in, out, cols, T, vec);
        break;
    case DM_OP_LAYERNORM: /* in: x, gamma, beta; out: y, mean, rstd */
        rowop_layernorm<S>(op, in, out, cols, T, vec);
        break;
    case DM_OP_LAYERNORM_BWD:
        rowop_layernorm_bwd<S>(in, out, cols, T, vec);
        break;
    case DM_OP_EMBED: { /* in: table (its first row), idx: row idx[r] of it, or zeros */
        const long long nr = dmc_index_row(ld<S>(in[1], 0), op->nindex);
        dptr t = in[0];
        if (nr >= 0) t.p += nr * cols * dmc_esize(t.dt);
        FOR_CHUNKS(T, cols) {
            if (nr >= 0) ld8<S>(t, c0, n, vec, a);
#pragma unroll
            for (int e = 0; e < VEC; e++) y[e] = nr >= 0 ? a[e] : 0.0f;
            st8<S>(out[0], c0, n, vec, y);
        }
        break;
    }
    case DM_OP_XENT:
        rowop_xent<S>(in, out, cols, T, vec);
        break;
    case DM_OP_XENT_BWD: { /* in: logits, lse, label, dloss: dloss (softmax - onehot) */
        const float lse = ld<S>(in[1], 0), d = ld<S>(in[3], 0);
        const long long l = dmc_index_row(ld<S>(in[2], 0), cols);
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
            for (int e = 0; e < VEC; e++) y[e] = l < 0 ? 0.0f : d * (expf(a[e] - lse) - (c0 + e == l ? 1.0f : 0.0f));
            st8<S>(out[0], c0, n, vec, y);
        }
        break;
    }
    case DM_OP_COLSUM: {
        float *acc = (float *)out[0].p; /* a scratch accumulator */
        FOR_CHUNKS(T, cols) {
            ld8<S>(in[0], c0, n, vec, a);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (e < n) acc[c0 + e] += a[e];
        }
        break;
    }
    default:
        break; /* contractions never reach a row program (checked on the host) */
    }
}

/* A block runs rows in a grid-stride loop: one row at a time with all its threads, or
 * (warp_rows) one row per warp with per-warp scratch. Column accumulators live in the
 * block's scratch, written out as per-block partials at the end. */
/* The row kernel's launch bounds: 256 threads, 4 blocks per SM (64 registers; a little
 * spilling to L1). Measured on an H100 (bf16, BERT-large, 2026-11-22) against 512 threads
 * without spills (~104 registers) and 3 blocks of 256 (80): within 3% of each other, this
 * one the fastest at both sizes. */
enum { ROW_MAXT = 256, ROW_MINB = 4 };

template <typename S>
__global__ void __launch_bounds__(ROW_MAXT, ROW_MINB)
row_kernel(const dmc_rowprog *__restrict__ prog, uint64_t seed, float *gscratch,
           float *partials, int use_global) {
    extern __shared__ __align__(16) float dyn_smem[];
    __shared__ float red[33];
    float *scr = use_global ? gscratch + (size_t)blockIdx.x * (size_t)prog->scratch_floats
                            : dyn_smem;
    const int64_t rows = dmc_prog_rows(prog), cols = prog->cols, acc_off = prog->acc_off,
                  acc_floats = prog->acc_floats;
    const int nops = prog->nops, vec = prog->vec;
    rowteam T;
    T.red = red;
    T.warp = prog->warp_rows;
    int64_t r0 = blockIdx.x, rstep = gridDim.x;
    if (T.warp) {
        const int w = (int)threadIdx.x / T.warp, nw = (int)blockDim.x / T.warp;
        T.lt = (int)threadIdx.x % T.warp;
        T.n = T.warp;
        const int lane0 = (int)(threadIdx.x & 31) / T.warp * T.warp;
        T.mask = T.warp == 32 ? 0xffffffffu : ((1u << T.warp) - 1u) << lane0;
        scr += (size_t)w * (size_t)acc_off; /* acc_off: one row's scratch */
        r0 = (int64_t)blockIdx.x * nw + w;
        rstep = (int64_t)gridDim.x * nw;
    } else {
        T.lt = (int)threadIdx.x;
        T.n = (int)blockDim.x;
        for (int64_t c = threadIdx.x; c < acc_floats; c += blockDim.x) scr[acc_off + c] = 0.0f;
        __syncthreads();
    }
    for (int64_t r = r0; r < rows; r += rstep) {
        T.kr = dmc_key_row(prog, r);
        for (int k = 0; k < nops; k++) {
            run_rowop<S>(&prog->ops[k], r, cols, scr, seed, T, vec);
            /* the next op may read a row statistic another thread wrote; the next row
             * reuses the scratch rows */
            T.sync();
        }
    }
    if (T.warp || !partials) return;
    float *mine = partials + (size_t)blockIdx.x * (size_t)acc_floats;
    for (int64_t c = threadIdx.x; c < acc_floats; c += blockDim.x) mine[c] = scr[acc_off + c];
}

/* Column sums of the per-block partials: acc_dst[a][c]. Block (32 x CY threads): 32
 * consecutive columns (coalesced), CY lanes each summing every CY-th partial in block
 * order, then the CY sums added in lane order: a fixed order, so the result is the same
 * on every run. */
enum { CY = 16 };
__global__ void __launch_bounds__(32 * CY)
colacc_kernel(const dmc_rowprog *__restrict__ prog, const float *partials, int nblocks) {
    __shared__ float part[CY][33];
    const int64_t cols = prog->cols, n = (int64_t)prog->nacc * cols;
    const int64_t i = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    int a = 0;
    int64_t c = 0;
    if (i < n) {
        a = (int)(i / cols);
        c = i % cols;
        const float *p = partials + (prog->acc_slot[a] - prog->acc_off) + c;
        for (int b = (int)threadIdx.y; b < nblocks; b += CY) s += p[(size_t)b * (size_t)prog->acc_floats];
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || i >= n) return;
    float t = part[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < CY; y++) t += part[y][threadIdx.x];
    st_any(dptr{(char *)prog->acc_dst[a], prog->acc_dt[a]}, c, t);
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

int dmc_rows_max_threads(void) { return ROW_MAXT; }

template <typename S> static dm_status allow_smem_one(size_t bytes) {
    DMC_CUDA(cudaFuncSetAttribute(row_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)bytes));
    return DM_OK;
}

/* The limit is the kernel's on the current device, for the whole process: only ever
 * raised, so an executor made later with smaller needs does not take it away from an
 * earlier one; kept per device, since each device has its own. */
dm_status dmc_rows_allow_smem(size_t bytes) {
    enum { MAXDEV = 64 };
    static size_t high[MAXDEV];
    int dev = 0;
    DMC_CUDA(cudaGetDevice(&dev));
    if (dev >= 0 && dev < MAXDEV && bytes <= high[dev]) return DM_OK;
    DM_TRY(allow_smem_one<float>(bytes));
    DM_TRY(allow_smem_one<__nv_bfloat16>(bytes));
    DM_TRY(allow_smem_one<__half>(bytes));
    if (dev >= 0 && dev < MAXDEV) high[dev] = bytes;
    return DM_OK;
}

template <typename S>
static void launch_rows(const dmc_launch *lc, const dmc_rowprog *dprog, uint64_t seed,
                        float *gs, float *part, cudaStream_t stream) {
    row_kernel<S><<<lc->blocks, lc->threads, lc->smem_bytes, stream>>>(dprog, seed, gs, part,
                                                                        lc->global_scratch);
}

dm_status dmc_rows_launch(const dmc_rowprog *dprog, const dmc_rowprog *hprog,
                          const dmc_launch *lc, uint64_t seed, float *gscratch,
                          float *partials, cudaStream_t stream) {
    if (hprog->rows <= 0) return DM_OK;
    float *part = hprog->nacc ? partials : NULL;
    float *gs = lc->global_scratch ? gscratch : NULL;
    if (lc->dt == DMC_BF16) launch_rows<__nv_bfloat16>(lc, dprog, seed, gs, part, stream);
    else if (lc->dt == DMC_F16) launch_rows<__half>(lc, dprog, seed, gs, part, stream);
    else launch_rows<float>(lc, dprog, seed, gs, part, stream);
    DMC_LAUNCHED("the row kernel");
    if (hprog->nacc) return dmc_colacc_launch(dprog, hprog, partials, lc->blocks, stream);
    return DM_OK;
}

dm_status dmc_colacc_launch(const dmc_rowprog *dprog, const dmc_rowprog *hprog, const float *partials,
                            int nblocks, cudaStream_t stream) {
    int64_t n = (int64_t)hprog->nacc * hprog->cols;
    int blocks = (int)((n + 31) / 32);
    colacc_kernel<<<blocks, dim3(32, CY), 0, stream>>>(dprog, partials, nblocks);
    DMC_LAUNCHED("the column-sum kernel");
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
