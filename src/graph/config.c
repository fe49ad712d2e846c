/* config.c: the layer configuration (include/dmove.h's dm_layer_config): its defaults,
 * the BERT presets, the names of its variants, and the checks every builder of its graph
 * runs first. */
#include <math.h>
#include <string.h>

#include "core/status.h"
#include "dmove.h"

/* Largest tensor dmove accepts: 2^36 elements (256 GiB of fp32); beyond it a size is a
 * typo, not a model. */
#define DM_MAX_ELEMS ((int64_t)1 << 36)

void dm_layer_config_default(dm_layer_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->batch = 8;
    cfg->seq = 128;
    cfg->hidden = 768;
    cfg->heads = 12;
    cfg->ffn = 3072;
    cfg->dropout = 0.1;
    cfg->eps = 1e-12;
    cfg->act = DM_ACT_GELU;
    cfg->seed = 0;
}

dm_status dm_layer_config_preset(dm_layer_config *cfg, const char *name) {
    if (!name) return dm_fail(DM_ERR_INVALID_ARG, "no preset name given");
    if (!strcmp(name, "bert-base")) {
        cfg->batch = 8, cfg->seq = 128, cfg->hidden = 768, cfg->heads = 12, cfg->ffn = 3072;
    } else if (!strcmp(name, "bert-large")) {
        cfg->batch = 8, cfg->seq = 512, cfg->hidden = 1024, cfg->heads = 16, cfg->ffn = 4096;
    } else {
        return dm_fail(DM_ERR_INVALID_ARG,
                       "unknown preset '%s': use bert-base (b=8 j=128 i=768 h=12 u=3072) or "
                       "bert-large (b=8 j=512 i=1024 h=16 u=4096)", name);
    }
    return DM_OK;
}

const char *dm_act_name(dm_act a) {
    switch (a) {
    case DM_ACT_GELU: return "gelu";
    case DM_ACT_GELU_TANH: return "gelu_tanh";
    case DM_ACT_RELU: return "relu";
    case DM_ACT_TANH: return "tanh";
    }
    return "?";
}

dm_status dm_act_parse(const char *s, dm_act *out) {
    if (s && !strcmp(s, "gelu")) *out = DM_ACT_GELU;
    else if (s && !strcmp(s, "gelu_tanh")) *out = DM_ACT_GELU_TANH;
    else if (s && !strcmp(s, "relu")) *out = DM_ACT_RELU;
    else
        return dm_fail(DM_ERR_INVALID_ARG, "unknown activation '%s': use gelu, gelu_tanh or relu",
                       s ? s : "(null)");
    return DM_OK;
}

const char *dm_norm_name(dm_norm n) {
    switch (n) {
    case DM_NORM_POST: return "post";
    case DM_NORM_PRE: return "pre";
    }
    return "?";
}

dm_status dm_norm_parse(const char *s, dm_norm *out) {
    if (s && !strcmp(s, "post")) *out = DM_NORM_POST;
    else if (s && !strcmp(s, "pre")) *out = DM_NORM_PRE;
    else
        return dm_fail(DM_ERR_INVALID_ARG, "unknown LayerNorm placement '%s': use post (BERT) or pre",
                       s ? s : "(null)");
    return DM_OK;
}

static dm_status check_prod(const char *what, const int64_t *v, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (__builtin_mul_overflow(p, v[i], &p) || p > DM_MAX_ELEMS)
            return dm_fail(DM_ERR_INVALID_ARG,
                           "the %s tensor would have more than 2^36 elements: reduce the sizes",
                           what);
    return DM_OK;
}

dm_status dm_layer_config_check(const dm_layer_config *c) {
    if (!c) return dm_fail(DM_ERR_INVALID_ARG, "no configuration given");
    const char *nm[5] = {"batch", "seq", "hidden", "heads", "ffn"};
    int64_t v[5] = {c->batch, c->seq, c->hidden, c->heads, c->ffn};
    for (int i = 0; i < 5; i++) {
        if (v[i] <= 0) return dm_fail(DM_ERR_INVALID_ARG, "%s must be positive (got %lld)", nm[i], (long long)v[i]);
        if (v[i] > ((int64_t)1 << 30))
            return dm_fail(DM_ERR_INVALID_ARG, "%s = %lld is absurdly large (limit 2^30)", nm[i], (long long)v[i]);
    }
    if (c->hidden % c->heads)
        return dm_fail(DM_ERR_INVALID_ARG,
                       "hidden size %lld is not divisible by heads %lld: the head size must be whole",
                       (long long)c->hidden, (long long)c->heads);
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        return dm_fail(DM_ERR_INVALID_ARG, "dropout must be in [0, 1) (got %g)", c->dropout);
    if (!(c->eps > 0.0 && isfinite(c->eps)))
        return dm_fail(DM_ERR_INVALID_ARG, "LayerNorm eps must be positive and finite (got %g)", c->eps);
    if (c->act != DM_ACT_GELU && c->act != DM_ACT_GELU_TANH && c->act != DM_ACT_RELU)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown activation %d", (int)c->act);
    if (c->norm != DM_NORM_POST && c->norm != DM_NORM_PRE)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown LayerNorm placement %d (use DM_NORM_POST or DM_NORM_PRE)",
                       (int)c->norm);
    if (c->causal != 0 && c->causal != 1)
        return dm_fail(DM_ERR_INVALID_ARG, "causal must be 0 or 1 (got %d)", c->causal);
    DM_TRY(check_prod("attention scores (b,h,j,k)", (int64_t[]){c->batch, c->heads, c->seq, c->seq}, 4));
    DM_TRY(check_prod("feed-forward (b,j,u)", (int64_t[]){c->batch, c->seq, c->ffn}, 3));
    DM_TRY(check_prod("projection (b,j,3i)", (int64_t[]){c->batch, c->seq, 3 * c->hidden}, 3));
    DM_TRY(check_prod("weight (u,i)", (int64_t[]){c->ffn, c->hidden}, 2));
    DM_TRY(check_prod("weight (3i,i)", (int64_t[]){3 * c->hidden, c->hidden}, 2));
    return DM_OK;
}
