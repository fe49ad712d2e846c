/* vmath.h: exp and the activations (with their derivatives) as static inline functions
 * gcc vectorizes (no libm calls, branches become blends), for the element-wise and
 * normalization kernels. Polynomials are evaluated by Estrin's scheme: the kernels are
 * bound by the FMA pipes and by dependency chains, not by memory.
 * exp: relative error ~2 ulp. GELU: Phi from erfc(z) = exp(-z^2) * erfcx(z), with erfcx
 * fitted to 3e-8 relative, so Phi(x) and phi(x) share one exp. Each activation comes as
 * one function giving act(x) and act'(x) (dm_*2); the single-output wrappers are the same
 * code with the unused half dropped by the compiler, so the schedule that keeps act'(x)
 * from the forward pass (ACT_DERIV) and the one that recomputes it (ACT_BWD) agree
 * bit for bit. */
#ifndef DM_VMATH_H
#define DM_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dmove.h"

/* 2^n * exp(r), r = x - n ln2 in [-ln2/2, ln2/2], for x in [-87.3, 88.7] (callers clamp);
 * degree-7 Taylor for exp(r) (truncation < 4e-9 relative). n comes out of the rounding
 * constant's low mantissa bits. */
static inline float dm_exp_core(float x) {
    float k = fmaf(x, 1.44269504088896341f, 12582912.0f); /* 1.5 * 2^23 + n */
    float n = k - 12582912.0f;
    float r = fmaf(n, -0.693145751953125f, x);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float r2 = r * r, r4 = r2 * r2;
    float p01 = fmaf(r, 1.0f, 1.0f), p23 = fmaf(r, 1.0f / 6.0f, 0.5f);
    float p45 = fmaf(r, 1.0f / 120.0f, 1.0f / 24.0f), p67 = fmaf(r, 1.0f / 5040.0f, 1.0f / 720.0f);
    float p = fmaf(fmaf(p67, r2, p45), r4, fmaf(p23, r2, p01));
    uint32_t kb;
    memcpy(&kb, &k, sizeof kb);
    uint32_t eb = (kb << 23) + 0x3f800000u; /* (n + 127) << 23 */
    float s;
    memcpy(&s, &eb, sizeof s);
    return p * s;
}

/* exp(x); flushes to 0 below -87.3 (softmax of masked scores). */
static inline float dm_expf(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.7f ? 88.7f : xc;
    float v = dm_exp_core(xc);
    return x < -87.3f ? 0.0f : v;
}

/* exp(x) for x <= 0 (one clamp fewer); flushes to 0 below -87.3. */
static inline float dm_exp_neg(float x) {
    float v = dm_exp_core(x < -87.3f ? -87.3f : x);
    return x < -87.3f ? 0.0f : v;
}

/* GELU, exact (erf-based): gelu(x) = x Phi(x), gelu'(x) = Phi(x) + x phi(x).
 * With z = |x|/sqrt2 and e = exp(-z^2) = sqrt(2 pi) phi(x): 0.5 erfc(z) = e * t * Q(t),
 * t = 1/(1 + z/2), where 0.5 erfcx(z) / t = Q(t) is a degree-10 polynomial on t in (0, 1]
 * (Chebyshev fit, relative error 3e-8: erfcx is smooth in t up to t = 0, z = inf). Phi is
 * accurate in relative terms for negative x too (no 1 - erf cancellation). */
static inline float dm_gelu_erf2(float x, float *grad) {
    float e = dm_exp_neg(-0.5f * x * x);
    float t = 1.0f / fmaf(0.35355339059327376f, fabsf(x), 1.0f);
    float t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    float q01 = fmaf(1.410464337e-01f, t, 1.410473998e-01f);
    float q23 = fmaf(8.747429816e-02f, t, 1.234567806e-01f);
    float q45 = fmaf(-3.397913766e-02f, t, 4.791359970e-02f);
    float q67 = fmaf(-2.412373803e-01f, t, 7.594258981e-02f);
    float q89 = fmaf(-1.227900181e-01f, t, 2.584497701e-01f);
    float r0 = fmaf(q23, t2, q01), r1 = fmaf(q67, t2, q45), r2 = fmaf(2.267566831e-02f, t2, q89);
    float q = fmaf(r2, t8, fmaf(r1, t4, r0));
    float h = t * q * e; /* 0.5 erfc(|x| / sqrt2) = Phi(-|x|) */
    float cdf = x < 0 ? h : 1.0f - h;
    *grad = fmaf(x * e, 0.3989422804014327f, cdf); /* 1/sqrt(2 pi) */
    return x * cdf;
}

/* GELU, tanh form: gelu(x) = x/2 (1 + tanh(s)) = x sigmoid(2s), s = sqrt(2/pi)(x + 0.044715 x^3);
 * gelu'(x) = sg + x * 2 sg (1 - sg) * ds/dx. With e = exp(-2|s|) (never overflows) and
 * inv = 1/(1+e): sigmoid(2|s|) = inv, sigmoid(-2|s|) = e inv, and sg (1 - sg) = e inv^2 for
 * either sign, so neither side cancels. */
static inline float dm_gelu_tanh2(float x, float *grad) {
    float x2 = x * x;
    float s = 0.7978845608028654f * fmaf(0.044715f * x2, x, x);
    float ds = 0.7978845608028654f * fmaf(3.0f * 0.044715f, x2, 1.0f);
    float e = dm_exp_neg(-2.0f * fabsf(s));
    float inv = 1.0f / (1.0f + e), einv = e * inv;
    float sg = s < 0 ? einv : inv;
    *grad = fmaf(2.0f * x * ds, inv * einv, sg);
    return x * sg;
}

/* tanh (the pooler's): with e = exp(-2|x|), 1 - tanh|x| = 2e / (1 + e) and tanh|x| =
 * -expm1(-2|x|) / (1 + e), so neither tanh near 0 nor tanh' = (1 - t)(1 + t) near 1 cancels. */
static inline float dm_tanh2(float x, float *grad) {
    float ax = fabsf(x), e = expf(-2.0f * ax), inv = 1.0f / (1.0f + e);
    float om = 2.0f * e * inv, t = -expm1f(-2.0f * ax) * inv;
    *grad = om * (2.0f - om);
    return x < 0 ? -t : t;
}
static inline float dm_tanh(float x) {
    float d;
    return dm_tanh2(x, &d);
}
static inline float dm_tanh_grad(float x) {
    float d;
    (void)dm_tanh2(x, &d);
    return d;
}

static inline float dm_relu2(float x, float *grad) {
    *grad = x > 0 ? 1.0f : 0.0f;
    return x > 0 ? x : 0.0f;
}

static inline float dm_gelu_erf(float x) {
    float d;
    return dm_gelu_erf2(x, &d);
}
static inline float dm_gelu_erf_grad(float x) {
    float d;
    (void)dm_gelu_erf2(x, &d);
    return d;
}
static inline float dm_gelu_tanh(float x) {
    float d;
    return dm_gelu_tanh2(x, &d);
}
static inline float dm_gelu_tanh_grad(float x) {
    float d;
    (void)dm_gelu_tanh2(x, &d);
    return d;
}
static inline float dm_relu(float x) { return x > 0 ? x : 0.0f; }
static inline float dm_relu_grad(float x) { return x > 0 ? 1.0f : 0.0f; }

#endif
