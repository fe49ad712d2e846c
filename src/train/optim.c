/* optim.c: the optimizers' settings and constants (AdamW as torch.optim.AdamW computes it,
 * LAMB as NVIDIA's FusedLAMB), and the learning-rate schedule (linear warm-up, then linear
 * or polynomial decay). The passes over memory are the backends' (plan/backend.h), the
 * arithmetic graph/optim_elem.h's. */
#include <math.h>

#include "core/status.h"
#include "graph/optim_elem.h"
#include "train/train.h"

const char *dm_optimizer_name(dm_optimizer o) {
    return o == DM_OPT_ADAMW ? "adamw" : o == DM_OPT_LAMB ? "lamb" : "?";
}

void dm_optim_config_default(dm_optim_config *c) {
    if (!c) return;
    c->kind = DM_OPT_ADAMW;
    c->lr = 1e-4;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-6;
    c->weight_decay = 0.01;
    c->warmup = 0;
    c->total = 0;
    c->power = 1.0;
    c->lr_end = 0.0;
    c->clip_norm = 0.0;
    c->accumulate = 1;
}

#define DM_MAX_ACCUMULATE 65536

/* The schedule's and the gradient's settings (the moments' are checked by the caller). */
static dm_status check_schedule(const dm_optim_config *c, const char *who) {
    if (c->warmup < 0 || c->total < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "%s: warm-up (%lld) and total steps (%lld) must not be negative", who,
                       (long long)c->warmup, (long long)c->total);
    if (c->total > 0 && c->warmup >= c->total)
        return dm_fail(DM_ERR_INVALID_ARG, "%s: %lld warm-up steps leave none of the %lld steps to decay over: use "
                       "fewer warm-up steps", who, (long long)c->warmup, (long long)c->total);
    if (!(c->power > 0.0 && c->power <= 100.0))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: the decay's power %g must lie in (0, 100] (1: linear decay; "
                       "Hugging Face's polynomial schedule takes 1 by default)", who, c->power);
    if (!(c->lr_end >= 0.0 && c->lr_end <= c->lr))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: the final learning rate %g must lie in [0, lr = %g]", who, c->lr_end,
                       c->lr);
    if (!(c->clip_norm >= 0.0 && isfinite(c->clip_norm)))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: the gradient-norm clip %g must be finite and not negative (0: no "
                       "clipping; BERT: 1)", who, c->clip_norm);
    if (c->accumulate < 1 || c->accumulate > DM_MAX_ACCUMULATE)
        return dm_fail(DM_ERR_INVALID_ARG, "%s: %d micro-batches per update: give 1 to %d", who, c->accumulate,
                       DM_MAX_ACCUMULATE);
    return DM_OK;
}

dm_status dm_optim_config_check(const dm_optim_config *c) {
    if (!c) return dm_fail(DM_ERR_INVALID_ARG, "optimizer: no configuration given");
    if (c->kind != DM_OPT_ADAMW && c->kind != DM_OPT_LAMB)
        return dm_fail(DM_ERR_INVALID_ARG, "optimizer %d unknown: adamw or lamb", (int)c->kind);
    const char *who = c->kind == DM_OPT_LAMB ? "LAMB" : "AdamW";
    if (!(c->lr > 0.0 && c->lr < 10.0))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: learning rate %g is outside (0, 10): BERT trains with 1e-4 "
                       "(LAMB at large batches: 1e-3 and more) and fine-tunes with 2e-5 to 5e-5", who, c->lr);
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0) || !(c->beta2 >= 0.0 && c->beta2 < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: beta1 %g and beta2 %g must lie in [0, 1) (usual: 0.9, 0.999)", who,
                       c->beta1, c->beta2);
    if (!(c->eps > 0.0 && c->eps < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: eps %g must lie in (0, 1) (BERT: 1e-6)", who, c->eps);
    if (!(c->weight_decay >= 0.0 && c->weight_decay < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "%s: weight decay %g must lie in [0, 1) (BERT: 0.01)", who,
                       c->weight_decay);
    return check_schedule(c, who);
}

double dm_optim_lr(const dm_optim_config *c, int64_t step) {
    if (!c) return 0.0;
    if (step < 1) step = 1;
    if (c->warmup > 0 && step <= c->warmup) return c->lr * (double)step / (double)c->warmup;
    if (c->total > 0) {
        /* update warmup+1 takes lr, update total lr_end + (lr - lr_end) / (total - warmup)^power:
         * no update is wasted */
        if (step > c->total) return c->lr_end;
        const double left = (double)(c->total - step + 1) / (double)(c->total - c->warmup);
        return c->lr_end + (c->lr - c->lr_end) * (c->power == 1.0 ? left : pow(left, c->power));
    }
    return c->lr;
}

void dm_optim_coef_make(dm_optim_coef *k, double lr, double decay, double gscale, const dm_optim_config *c,
                        int64_t step) {
    const double bc1 = 1.0 - pow(c->beta1, (double)step);
    k->gscale = (float)gscale;
    k->shrink = (float)(1.0 - lr * decay);
    k->w1 = (float)(1.0 - c->beta1);
    k->b2 = (float)c->beta2;
    k->w2 = (float)(1.0 - c->beta2);
    k->step_size = (float)(c->kind == DM_OPT_LAMB ? 1.0 / bc1 : lr / bc1);
    k->bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, (double)step));
    k->eps = (float)c->eps;
    k->decay = (float)decay;
    k->lr_ratio = (float)lr;
}

void dm_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, double lr, double decay,
                     const dm_optim_config *c, int64_t step) {
    dm_optim_coef k;
    dm_optim_coef_make(&k, lr, decay, 1.0, c, step);
#pragma omp parallel for simd schedule(static)
    for (int64_t e = 0; e < n; e++) p[e] = dm_adamw_elem(&k, p[e], g[e], &m[e], &v[e]);
}

uint64_t dm_train_layer_seed(uint64_t seed, int layer, int64_t step) {
    uint64_t z = seed ^ ((uint64_t)step * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(layer + 1) * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
