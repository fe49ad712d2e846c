/* rowmath.cuh: the per-element pieces of the row programs that the row kernel (rows.cu)
 * and its host emulation (emulate.cu) share, as __host__ __device__ functions, so the
 * emulation checks the very formulas the device runs. CUDA C++ only. */
#ifndef DM_CUDA_ROWMATH_CUH
#define DM_CUDA_ROWMATH_CUH

#include <float.h>
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_internal.h"
#include "cuda/philox.cuh"
#include "cuda/rowcore.cuh"

/* Bytes per element of a storage type. */
__host__ __device__ __forceinline__ int dmc_esize(int dt) { return dt == DMC_F32 ? 4 : 2; }

/* Element i of an array of type dt (DMC_F32, DMC_BF16, DMC_F16) as fp32, and v stored
 * there rounded to nearest even: the device's conversions, on the host too. */
__host__ __device__ __forceinline__ float dmc_load(const void *p, int dt, int64_t i) {
    if (dt == DMC_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == DMC_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__host__ __device__ __forceinline__ void dmc_store(void *p, int dt, int64_t i, float v) {
    if (dt == DMC_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == DMC_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

/* The most negative finite value of a type: MASK_ADD's (1 - mask) * -FLT_MAX would round
 * to -inf in bf16/fp16, and a row masked everywhere would then give NaN in softmax. */
__host__ __device__ __forceinline__ float dmc_lowest(int dt) {
    return dt == DMC_BF16 ? -3.38953139e38f : dt == DMC_F16 ? -65504.0f : -FLT_MAX;
}

/* Element offset of row r of a global operand (as resolve() in cpu/exec.c). */
__host__ __device__ __forceinline__ int64_t dmc_row_elem(const dmc_operand *d, int64_t r,
                                                         int64_t cols) {
    switch (d->kind) {
    case DM_ARG_FULL: return r * cols;
    case DM_ARG_GROUPED: return (r / d->rdiv) * cols;
    case DM_ARG_ROWSCALAR: return r;
    default: return 0; /* COLVEC */
    }
}

/* A sum or a maximum over the `lanes` lanes of a warp that share a row (the whole warp
 * calls it): the warp's shuffles on the device, nothing to combine on the host, whose
 * emulation runs a row as one lane (varlen.cu, xent.cu). */
__host__ __device__ __forceinline__ float dmc_lanes_max(float x, int lanes) {
#ifdef __CUDA_ARCH__
    for (int d = lanes / 2; d > 0; d >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, d));
#endif
    (void)lanes;
    return x;
}
__host__ __device__ __forceinline__ float dmc_lanes_sum(float x, int lanes) {
#ifdef __CUDA_ARCH__
    for (int d = lanes / 2; d > 0; d >>= 1) x += __shfl_xor_sync(0xffffffffu, x, d);
#endif
    (void)lanes;
    return x;
}

/* The rows program p runs this step (its live rows, set_rows), and the row whose dropout
 * words row r draws. */
__host__ __device__ __forceinline__ int64_t dmc_prog_rows(const dmc_rowprog *p) {
    return p->live ? (int64_t)*p->live * p->live_rpt : p->rows;
}
__host__ __device__ __forceinline__ int64_t dmc_key_row(const dmc_rowprog *p, int64_t r) {
    return p->rowkey ? (int64_t)p->rowkey[r / p->live_rpt] * p->live_rpt + r % p->live_rpt : r;
}

/* Is element e (its padded index (s, h, j, k)) of the unpadded attention kept by the
 * dropout? varlen.cu's cuBLAS path and flash.cu's kernels draw the same uniforms. */
__host__ __device__ __forceinline__ int dmc_varlen_kept(const dmc_varlen *v, uint64_t seed, uint64_t e) {
    return !v->drop || dmc_dropout_uniform(seed, v->stream, e) >= v->thr;
}

/* keymask: the term the attention mask adds to key k's scores in sequence s, as MASK_ADD
 * adds it ((1 - mask) * -FLT_MAX, fp32) */
__host__ __device__ __forceinline__ float dmc_mask_term(const dmc_varlen *v, int64_t s, int64_t k) {
    return (1.0f - dmc_load(v->lengths, v->len_dt, s * v->J + k)) * -FLT_MAX;
}

/* act(x), and act'(x) in *grad, in fp32 (rowcore.cuh). */
__host__ __device__ __forceinline__ float dmc_act_both(float x, int act, float *grad) {
    if (act == DM_ACT_RELU) return dmc_relu_both(x, grad);
    if (act == DM_ACT_GELU_TANH) return dmc_gelu_tanh_both(x, grad);
    if (act == DM_ACT_TANH) return dmc_tanh_both(x, grad);
    return dmc_gelu_both(x, grad);
}

#endif
