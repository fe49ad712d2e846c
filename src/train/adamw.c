/* adamw.c: the optimizer of `dmove train`: AdamW as torch.optim.AdamW computes it, fused
 * into one pass over the parameter, its gradient and its two moments, and its learning
 * rate schedule (linear warm-up, then linear decay). */
#include <math.h>

#include "core/status.h"
#include "train/train.h"

void dm_adamw_config_default(dm_adamw_config *c) {
    c->lr = 1e-4;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-6;
    c->weight_decay = 0.01;
    c->warmup = 0;
    c->total = 0;
}

dm_status dm_adamw_config_check(const dm_adamw_config *c) {
    if (!c) return dm_fail(DM_ERR_INVALID_ARG, "AdamW: no configuration given");
    if (!(c->lr > 0.0 && c->lr < 10.0))
        return dm_fail(DM_ERR_INVALID_ARG, "AdamW: learning rate %g is outside (0, 10): BERT trains "
                       "with 1e-4 and fine-tunes with 2e-5 to 5e-5", c->lr);
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0) || !(c->beta2 >= 0.0 && c->beta2 < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "AdamW: beta1 %g and beta2 %g must lie in [0, 1) (usual: 0.9, "
                       "0.999)", c->beta1, c->beta2);
    if (!(c->eps > 0.0 && c->eps < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "AdamW: eps %g must lie in (0, 1) (BERT: 1e-6)", c->eps);
    if (!(c->weight_decay >= 0.0 && c->weight_decay < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "AdamW: weight decay %g must lie in [0, 1) (BERT: 0.01)",
                       c->weight_decay);
    if (c->warmup < 0 || c->total < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "AdamW: warm-up (%lld) and total steps (%lld) must not be "
                       "negative", (long long)c->warmup, (long long)c->total);
    if (c->total > 0 && c->warmup >= c->total)
        return dm_fail(DM_ERR_INVALID_ARG, "AdamW: %lld warm-up steps leave none of the %lld steps to "
                       "decay over: use fewer warm-up steps", (long long)c->warmup, (long long)c->total);
    return DM_OK;
}

double dm_adamw_lr(const dm_adamw_config *c, int64_t step) {
    if (step < 1) step = 1;
    if (c->warmup > 0 && step <= c->warmup) return c->lr * (double)step / (double)c->warmup;
    if (c->total > 0) {
        /* step warmup+1 takes lr, step total lr / (total - warmup): no update is wasted */
        if (step > c->total) return 0.0;
        return c->lr * (double)(c->total - step + 1) / (double)(c->total - c->warmup);
    }
    return c->lr;
}

void dm_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, double lr, double decay,
                     const dm_adamw_config *c, int64_t step) {
    /* torch: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g*g;
     * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
    const float shrink = (float)(1.0 - lr * decay);
    const float w1 = (float)(1.0 - c->beta1), b2 = (float)c->beta2, w2 = (float)(1.0 - c->beta2);
    const float step_size = (float)(lr / (1.0 - pow(c->beta1, (double)step)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, (double)step));
    const float eps = (float)c->eps;
#pragma omp parallel for simd schedule(static)
    for (int64_t k = 0; k < n; k++) {
        const float gk = g[k];
        const float mk = m[k] + w1 * (gk - m[k]);
        const float vk = b2 * v[k] + w2 * gk * gk;
        const float denom = sqrtf(vk) / bc2_sqrt + eps;
        m[k] = mk;
        v[k] = vk;
        p[k] = p[k] * shrink - step_size * (mk / denom);
    }
}

uint64_t dm_train_layer_seed(uint64_t seed, int layer, int64_t step) {
    uint64_t z = seed ^ ((uint64_t)step * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(layer + 1) * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
