/* adamw.c: the optimizer of `dmove train`: AdamW as torch.optim.AdamW computes it, fused
 * into one pass over the parameter, its gradient and its two moments, and its learning
 * rate schedule (linear warm-up, then linear decay). */
#include <math.h>

#include "core/status.h"
#include "graph/adamw_elem.h"
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

void dm_adamw_coef_make(dm_adamw_coef *k, double lr, double decay, const dm_adamw_config *c, int64_t step) {
    k->shrink = (float)(1.0 - lr * decay);
    k->w1 = (float)(1.0 - c->beta1);
    k->b2 = (float)c->beta2;
    k->w2 = (float)(1.0 - c->beta2);
    k->step_size = (float)(lr / (1.0 - pow(c->beta1, (double)step)));
    k->bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, (double)step));
    k->eps = (float)c->eps;
}

void dm_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, double lr, double decay,
                     const dm_adamw_config *c, int64_t step) {
    dm_adamw_coef k;
    dm_adamw_coef_make(&k, lr, decay, c, step);
#pragma omp parallel for simd schedule(static)
    for (int64_t e = 0; e < n; e++) p[e] = dm_adamw_elem(&k, p[e], g[e], &m[e], &v[e]);
}

uint64_t dm_train_layer_seed(uint64_t seed, int layer, int64_t step) {
    uint64_t z = seed ^ ((uint64_t)step * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(layer + 1) * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
