/* vmath.h: exp, erfc and the activations as static inline functions gcc vectorizes
 * (no libm calls, branches become blends), for the element-wise and normalization
 * kernels. exp: relative error ~2 ulp; erfc: fractional error < 1.2e-7 (+ rounding). */
#ifndef DM_VMATH_H
#define DM_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dmove.h"

/* exp(x) = 2^n * exp(r), r = x - n ln2 in [-ln2/2, ln2/2]; degree-7 Taylor for exp(r)
 * (truncation < 4e-9 relative); flushes to 0 below -87.3 (softmax of masked scores). */
static inline float dm_expf(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.7f ? 88.7f : xc;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = fmaf(n, -0.693145751953125f, xc);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    float v = p * s;
    return x < -87.3f ? 0.0f : v;
}

/* erfc(z) for z >= 0 by the Chebyshev-fitted form t*exp(-z^2 + P(t)), t = 1/(1+z/2)
 * (Press et al., Numerical Recipes, fractional error < 1.2e-7). */
static inline float erfc_pos(float z) {
    float t = 1.0f / fmaf(0.5f, z, 1.0f);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    return t * dm_expf(fmaf(-z, z, p));
}

/* Phi(x), the standard normal CDF, accurate in relative terms for negative x too. */
static inline float phi_cdf(float x) {
    float z = (x < 0 ? -x : x) * 0.70710678118654752f;
    float h = 0.5f * erfc_pos(z);
    return x < 0 ? h : 1.0f - h;
}

static inline float tanh_f(float y) {
    float e = dm_expf(-2.0f * (y < 0 ? -y : y));
    float t = (1.0f - e) / (1.0f + e);
    return y < 0 ? -t : t;
}

#define GELU_TANH_C 0.7978845608028654f /* sqrt(2/pi) */

/* gelu(x) = x * Phi(x) (exact, erf-based) */
static inline float dm_gelu_erf(float x) { return x * phi_cdf(x); }
static inline float dm_gelu_erf_grad(float x) {
    return phi_cdf(x) + x * 0.3989422804014327f * dm_expf(-0.5f * x * x);
}
/* gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static inline float dm_gelu_tanh(float x) {
    float s = GELU_TANH_C * fmaf(0.044715f * x * x, x, x);
    return 0.5f * x * (1.0f + tanh_f(s));
}
static inline float dm_gelu_tanh_grad(float x) {
    float s = GELU_TANH_C * fmaf(0.044715f * x * x, x, x);
    float t = tanh_f(s);
    float ds = GELU_TANH_C * fmaf(3.0f * 0.044715f, x * x, 1.0f);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * ds;
}
static inline float dm_relu(float x) { return x > 0 ? x : 0.0f; }
static inline float dm_relu_grad(float x) { return x > 0 ? 1.0f : 0.0f; }

static inline float dm_act_f(float x, dm_act a) {
    return a == DM_ACT_RELU ? dm_relu(x) : a == DM_ACT_GELU_TANH ? dm_gelu_tanh(x) : dm_gelu_erf(x);
}
static inline float dm_act_grad(float x, dm_act a) {
    return a == DM_ACT_RELU ? dm_relu_grad(x)
           : a == DM_ACT_GELU_TANH ? dm_gelu_tanh_grad(x) : dm_gelu_erf_grad(x);
}

#endif
