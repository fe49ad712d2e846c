/* rowcore.cuh: the activation math every row kernel shares, as __host__ __device__
 * functions of fp32: the interpreting row kernel (rows.cu, through rowmath.cuh), its host
 * emulation (emulate.cu), and the kernels generated per fused group (src/cudagen/), which NVRTC
 * compiles with this text. No includes under NVRTC (its math functions are built in).
 *
 * act(x) is returned, act'(x) goes to *grad; forms that do not cancel for x << 0, as the
 * CPU's (cpu/vmath.h, whose polynomials are within a few ulp of these):
 *   GELU (erf):  x Phi(x);  Phi(x) + x phi(x)   (on the host erfc(-x / sqrt 2) / 2,
 *                accurate for x << 0; on the device (1 + erf(x / sqrt 2)) / 2, PyTorch's
 *                form: its absolute error stays below 1e-7, and normcdff made the FFN's
 *                GELU pass compute-bound on an H100 (bench/gpu/gelu_probe.cu, 96 x 128 x
 *                4096 bf16: forward 0.130 ms with normcdff, 0.085 with erff, a plain
 *                copy 0.080; GELU and its derivative 0.144 and 0.128)
 *   GELU (tanh): x sg;  sg + 2 x ds sg (1 - sg),  sg = sigmoid(2s) = (1 + tanh(s)) / 2,
 *                s = sqrt(2/pi) (x + 0.044715 x^3), e = exp(-2|s|) never overflows. */
#ifndef DM_CUDA_ROWCORE_CUH
#define DM_CUDA_ROWCORE_CUH

#ifndef __CUDACC_RTC__
#include <math.h>
#endif

__host__ __device__ __forceinline__ float dmc_relu_both(float x, float *grad) {
    *grad = x > 0 ? 1.0f : 0.0f;
    return x > 0 ? x : 0.0f;
}

/* tanh (the pooler's), as cpu/vmath.h's dm_tanh2: e = exp(-2|x|), 1 - tanh|x| = 2e / (1 + e). */
__host__ __device__ __forceinline__ float dmc_tanh_both(float x, float *grad) {
    float ax = fabsf(x), e = expf(-2.0f * ax), inv = 1.0f / (1.0f + e);
    float om = 2.0f * e * inv, t = -expm1f(-2.0f * ax) * inv;
    *grad = om * (2.0f - om);
    return x < 0 ? -t : t;
}

__host__ __device__ __forceinline__ float dmc_gelu_tanh_both(float x, float *grad) {
    float x2 = x * x;
    float s = 0.7978845608028654f * fmaf(0.044715f * x2, x, x);
    float ds = 0.7978845608028654f * fmaf(3.0f * 0.044715f, x2, 1.0f);
    float e = expf(-2.0f * fabsf(s));
    float inv = 1.0f / (1.0f + e), einv = e * inv; /* sigmoid(2|s|), sigmoid(-2|s|) */
    float sg = s < 0 ? einv : inv;
    *grad = fmaf(2.0f * x * ds, inv * einv, sg);
    return x * sg;
}

__host__ __device__ __forceinline__ float dmc_gelu_both(float x, float *grad) {
#ifdef __CUDA_ARCH__
    float cdf = fmaf(0.5f, erff(x * 0.70710678118654752f), 0.5f);
#else
    float cdf = 0.5f * erfcf(-x * 0.70710678118654752f);
#endif
    *grad = fmaf(x * expf(-0.5f * x * x), 0.3989422804014327f, cdf); /* 1/sqrt(2 pi) */
    return x * cdf;
}

/* The column a cross-entropy label selects in a row of n columns, or -1 (ignored: -100,
 * any negative, beyond the row, not an integer, NaN): graph/ops.h's dm_index_row. */
__host__ __device__ __forceinline__ long long dmc_index_row(float v, long long n) {
    return v >= 0.0f && v < (float)n && v < 16777216.0f && v == (float)(long long)v ? (long long)v : -1LL;
}

#endif
