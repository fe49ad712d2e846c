/* rowmath.cuh: the per-element pieces of the row programs that the row kernel (rows.cu)
 * and its host emulation (emulate.cu) share, as __host__ __device__ functions, so the
 * emulation checks the very formulas the device runs. CUDA C++ only. */
#ifndef DM_CUDA_ROWMATH_CUH
#define DM_CUDA_ROWMATH_CUH

#include <float.h>
#include <math.h>

#include "cuda/cuda_internal.h"

/* Bytes per element of a storage type. */
__host__ __device__ __forceinline__ int dmc_esize(int dt) { return dt == DMC_F32 ? 4 : 2; }

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

/* act(x), and act'(x) in *grad, in fp32 (the CPU uses its own polynomials, cpu/vmath.h:
 * both within a few ulp of the exact values), in forms that do not cancel for x << 0, as
 * the CPU's:
 *   GELU (erf):  x Phi(x);  Phi(x) + x phi(x)   (normcdff on the device, accurate for
 *                x < 0; erfc(-x / sqrt 2) / 2 on the host)
 *   GELU (tanh): x sg;  sg + 2 x ds sg (1 - sg),  sg = sigmoid(2s) = (1 + tanh(s)) / 2,
 *                s = sqrt(2/pi) (x + 0.044715 x^3), e = exp(-2|s|) never overflows. */
__host__ __device__ __forceinline__ float dmc_act_both(float x, int act, float *grad) {
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
#ifdef __CUDA_ARCH__
    float cdf = normcdff(x);
#else
    float cdf = 0.5f * erfcf(-x * 0.70710678118654752f);
#endif
    *grad = fmaf(x * expf(-0.5f * x * x), 0.3989422804014327f, cdf); /* 1/sqrt(2 pi) */
    return x * cdf;
}

#endif
