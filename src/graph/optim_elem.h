/* optim_elem.h: the optimizers' arithmetic on one element (AdamW; LAMB's two passes),
 * shared by the CPU (cpu/backend.c) and the GPU (cuda/train.cu) so that all run the very
 * same formulas; C and CUDA C++. */
#ifndef DM_OPTIM_ELEM_H
#define DM_OPTIM_ELEM_H

#include <math.h>
#include <stdint.h>

#include "dmove.h"

#ifdef __CUDACC__
#define DM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DM_HOST_DEVICE static inline
#endif

/* The constants of one update of one tensor (dm_optim_coef_make, train/train.h). */
typedef struct {
    float gscale;    /* the gradient's factor: 1 / micro-batches, times the clipping's */
    float shrink;    /* AdamW: 1 - lr * decay */
    float w1;        /* 1 - beta1 */
    float b2, w2;    /* beta2, 1 - beta2 */
    float step_size; /* AdamW: lr / (1 - beta1^step); LAMB: 1 / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float eps;
    float decay;     /* LAMB: the weight decay of this tensor */
    float lr_ratio;  /* LAMB's apply pass: lr times the tensor's trust ratio */
} dm_optim_coef;

/* The passes of an optimizer over one tensor (dm_backend.optimize). */
typedef enum {
    DM_PASS_ADAMW = 0,  /* the whole AdamW update */
    DM_PASS_LAMB_MOMENTS, /* LAMB 1: the moments, and the partial sums of w^2 and u^2 */
    DM_PASS_LAMB_APPLY    /* LAMB 2: w -= lr_ratio * u (u again from the new moments) */
} dm_optim_pass_kind;

/* torch: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g*g;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). Returns the new p; g is the
 * gradient as stored (gscale applies here). */
DM_HOST_DEVICE float dm_adamw_elem(const dm_optim_coef *k, float p, float g, float *m, float *v) {
    g *= k->gscale;
    const float mk = *m + k->w1 * (g - *m);
    const float vk = k->b2 * *v + k->w2 * g * g;
    const float denom = sqrtf(vk) / k->bc2_sqrt + k->eps;
    *m = mk;
    *v = vk;
    return p * k->shrink - k->step_size * (mk / denom);
}

/* LAMB's direction from the (new) moments: m^ / (sqrt(v^) + eps) + decay * w. */
DM_HOST_DEVICE float dm_lamb_dir(const dm_optim_coef *k, float p, float m, float v) {
    return k->step_size * m / (sqrtf(v) / k->bc2_sqrt + k->eps) + k->decay * p;
}

/* LAMB 1: the moments of one element; returns its direction u. */
DM_HOST_DEVICE float dm_lamb_moments_elem(const dm_optim_coef *k, float p, float g, float *m, float *v) {
    g *= k->gscale;
    const float mk = *m + k->w1 * (g - *m);
    const float vk = k->b2 * *v + k->w2 * g * g;
    *m = mk;
    *v = vk;
    return dm_lamb_dir(k, p, mk, vk);
}

/* LAMB 2: the new parameter. */
DM_HOST_DEVICE float dm_lamb_apply_elem(const dm_optim_coef *k, float p, float m, float v) {
    return p - k->lr_ratio * dm_lamb_dir(k, p, m, v);
}

/* The sums of squares (gradient norms, LAMB's tensor norms) come as DM_NORM_PARTS partial
 * sums in double, each over its own fixed share of the elements (element e in part
 * e / ceil(n / DM_NORM_PARTS)), which the caller adds in order: the same bits for any
 * thread count (each backend fixes the order within a part). */
#define DM_NORM_PARTS 256

#endif
