/* adamw_elem.h: AdamW's update of one element, shared by the CPU (train/adamw.c and the
 * CPU backend's cpu/backend.c) and the GPU (cuda/train.cu) so that all run the very same
 * formula; C and CUDA C++. */
#ifndef DM_ADAMW_ELEM_H
#define DM_ADAMW_ELEM_H

#include <math.h>
#include <stdint.h>

#include "dmove.h"

#ifdef __CUDACC__
#define DM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DM_HOST_DEVICE static inline
#endif

/* The constants of one update of one tensor (dm_adamw_coef_make, train/train.h). */
typedef struct {
    float shrink;    /* 1 - lr * decay */
    float w1;        /* 1 - beta1 */
    float b2, w2;    /* beta2, 1 - beta2 */
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float eps;
} dm_adamw_coef;

/* torch: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g*g;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). Returns the new p. */
DM_HOST_DEVICE float dm_adamw_elem(const dm_adamw_coef *k, float p, float g, float *m, float *v) {
    const float mk = *m + k->w1 * (g - *m);
    const float vk = k->b2 * *v + k->w2 * g * g;
    const float denom = sqrtf(vk) / k->bc2_sqrt + k->eps;
    *m = mk;
    *v = vk;
    return p * k->shrink - k->step_size * (mk / denom);
}

#endif
