/* hfload.c: a whole model's parameters from a Hugging Face checkpoint (hfload.h): the
 * model's parameters walked by their BertFor... names and found in the file under the
 * prefix it keeps the encoder under, validated whole before anything changes. */
#include "train/hfload.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensorfile.h"
#include "layer/layer_internal.h"

/* One parameter to take: where it goes, and the file's tensor (NULL: not in the file). */
typedef struct {
    float *dst;
    int64_t n;
    const dm_st_tensor *src;
    char name[160]; /* the model's name */
    int head;       /* a head parameter: may be absent */
} load_item;

/* The model's name of segment L's parameter pname (L: the embeddings, encoder layer l, or
 * the head, whose names are the model's already). */
static void model_name(const dm_model *m, const dm_layer *L, int l, const char *pname, char *out, size_t n) {
    if (L == m->emb) snprintf(out, n, "bert.%s", pname);
    else if (L == m->head) snprintf(out, n, "%s", pname);
    else snprintf(out, n, "bert.encoder.layer.%d.%s", l, pname);
}

/* The file's tensor for model name `name` (encoder layer numbers already the file's):
 * "bert.X" as prefix + X, a head's name as it is; LayerNorm.weight / .bias also as
 * LayerNorm.gamma / .beta. *found gets the name it has in the file. */
static const dm_st_tensor *find(const dm_st_file *st, const char *prefix, const char *name, char *found, size_t fn) {
    char base[192], alt[192] = "";
    if (!strncmp(name, "bert.", 5)) snprintf(base, sizeof base, "%s%s", prefix, name + 5);
    else snprintf(base, sizeof base, "%s", name);
    const size_t len = strlen(base);
    if (len > 17 && !strcmp(base + len - 17, ".LayerNorm.weight"))
        snprintf(alt, sizeof alt, "%.*s.LayerNorm.gamma", (int)(len - 17), base);
    else if (len > 15 && !strcmp(base + len - 15, ".LayerNorm.bias"))
        snprintf(alt, sizeof alt, "%.*s.LayerNorm.beta", (int)(len - 15), base);
    else if (!strcmp(base, "cls.predictions.bias"))
        snprintf(alt, sizeof alt, "cls.predictions.decoder.bias"); /* the same tensor, tied */
    const dm_st_tensor *t = dm_st_find(st, base);
    if (!t && alt[0]) t = dm_st_find(st, alt);
    snprintf(found, fn, "%s", t ? t->name : base);
    return t;
}

static dm_status check_item(const load_item *it, const dm_st_tensor *t, const char *fname, int nd,
                            const int64_t sh[4]) {
    if (t->dtype != DM_ST_F32 && t->dtype != DM_ST_F64 && t->dtype != DM_ST_F16 && t->dtype != DM_ST_BF16)
        return dm_fail(DM_ERR_SHAPE, "'%s' is %s: parameters must be floating point (f32, f64, f16, bf16)", fname,
                       dm_st_dtype_name(t->dtype));
    if (t->ndim == nd && t->shape[0] == sh[0] && (nd == 1 || t->shape[1] == sh[1])) {
        return dm_param_values_check(t, fname);
    }
    char got[96] = "(", want[64];
    for (int d = 0; d < t->ndim && d < 4; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, d ? ", " : "", t->shape[d]);
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s)", t->ndim > 4 ? ", ..." : "");
    if (nd == 1) snprintf(want, sizeof want, "(%" PRId64 ")", sh[0]);
    else snprintf(want, sizeof want, "(%" PRId64 ", %" PRId64 ")", sh[0], sh[1]);
    return dm_fail(DM_ERR_SHAPE, "'%s' has shape %s, the model's %s needs %s: give the sizes of the model (its "
                   "config.json)", fname, got, it->name, want);
}

dm_status dm_param_values_check(const dm_st_tensor *t, const char *fname) {
    const int64_t bad = dm_st_first_bad(t, 0);
    if (bad < 0) return DM_OK;
    return dm_fail(DM_ERR_FORMAT, "'%s' holds a value that is not finite (NaN or infinite) at element %" PRId64
                   ": the file is damaged or the model diverged; nothing was loaded", fname, bad);
}

/* A decoder in the file (transformers leaves a tied one out) must be the word table: dmove
 * ties them, and would otherwise train another model than the file's without a word. (A
 * config's tie_word_embeddings false with no decoder in the file: tied, the file's model
 * having no decoder to keep.) */
static dm_status check_tied(const dm_st_file *st, const char *prefix) {
    char fname[192], wname[192];
    const dm_st_tensor *d = find(st, prefix, "cls.predictions.decoder.weight", fname, sizeof fname);
    const dm_st_tensor *w = find(st, prefix, "bert.embeddings.word_embeddings.weight", wname, sizeof wname);
    if (!d || !w) return DM_OK; /* no decoder: tied; no word table: collect names it */
    if (d->dtype == w->dtype && d->nbytes == w->nbytes && d->ndim == w->ndim &&
        (d->nbytes == 0 || memcmp(d->data, w->data, d->nbytes) == 0))
        return DM_OK;
    return dm_fail(DM_ERR_UNSUPPORTED, "'%s' differs from the word embeddings '%s': the model's MLM decoder is "
                   "untied (its own matrix), and dmove's MLM head ties it to the word table: pretrain a tied "
                   "model, or take the encoder alone (dmove finetune, embed)", fname, wname);
}

/* Segment L's parameters (encoder layer l; the file's layer fl) into items[*k ...]. */
static dm_status collect(dm_model *m, dm_layer *L, int l, int fl, const dm_st_file *st, const char *prefix,
                         int flags, load_item *items, int *k) {
    const int np = dm_layer_num_params(L);
    for (int q = 0; q < np; q++) {
        const char *pname = dm_layer_param_name(L, q);
        if ((flags & DM_LOAD_NEW_CLASSIFIER) && L == m->head && !strncmp(pname, "classifier.", 11)) continue;
        if (!strcmp(pname, "cls.predictions.decoder.weight")) { /* the word table, tied */
            DM_TRY(check_tied(st, prefix));
            continue;
        }
        load_item *it = &items[*k];
        int nd = 0;
        int64_t sh[4] = {0, 0, 0, 0};
        DM_TRY(dm_layer_tensor(L, pname, &it->dst, &nd, sh));
        it->n = nd == 1 ? sh[0] : sh[0] * sh[1];
        it->head = L == m->head;
        model_name(m, L, l, pname, it->name, sizeof it->name);
        char fname[192], lookup[160];
        model_name(m, L, fl, pname, lookup, sizeof lookup);
        it->src = find(st, prefix, lookup, fname, sizeof fname);
        if (!it->src && !it->head)
            return dm_fail(DM_ERR_NOT_FOUND, "no tensor '%s' in the file (looked for under the prefix '%s'%s): the "
                           "embeddings and every encoder layer must be there", fname, prefix,
                           strstr(fname, "LayerNorm") ? ", also as gamma/beta" : "");
        if (it->src) DM_TRY(check_item(it, it->src, fname, nd, sh));
        (*k)++;
    }
    return DM_OK;
}

static dm_status load_checked(dm_model *m, const dm_tensor_file *f, int first, int flags, load_item *items,
                              char *note, size_t nn) {
    const dm_st_file *st = dm_tensor_file_st(f);
    char prefix[32];
    DM_TRY(dm_hf_encoder_prefix(f, prefix, sizeof prefix));
    int have = 0;
    for (char nm[192]; have < 100000; have++) {
        snprintf(nm, sizeof nm, "%sencoder.layer.%d.attention.self.query.weight", prefix, have);
        if (!dm_st_find(st, nm)) break;
    }
    if (first + m->c.layers > have)
        return dm_fail(DM_ERR_NOT_FOUND, "the file holds %d encoder layer(s), and layers %d to %d were asked for "
                       "(%d layers from layer %d): use fewer layers or an earlier first one", have, first,
                       first + m->c.layers - 1, m->c.layers, first);
    int k = 0;
    DM_TRY(collect(m, m->emb, 0, 0, st, prefix, flags, items, &k));
    for (int l = 0; l < m->c.layers; l++) DM_TRY(collect(m, m->enc[l], l, first + l, st, prefix, flags, items, &k));
    if (m->head) DM_TRY(collect(m, m->head, 0, 0, st, prefix, flags, items, &k));
    /* valid: now the parameters change */
    size_t used = 0;
    if (note && nn) note[0] = 0;
    for (int q = 0; q < k; q++) {
        if (items[q].src) {
            DM_TRY(dm_st_to_f32(items[q].src, items[q].dst, (size_t)items[q].n));
        } else if (note && used + 1 < nn) {
            int w = snprintf(note + used, nn - used, "%s%s", used ? ", " : "", items[q].name);
            used = w > 0 && (size_t)w < nn - used ? used + (size_t)w : nn - 1;
        }
    }
    return DM_OK;
}

dm_status dm_model_load_hf(dm_model *m, const dm_tensor_file *f, int first, int flags, char *note, size_t nn) {
    if (!m || !f) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_load_hf: NULL argument");
    if (first < 0 || first > 100000) return dm_fail(DM_ERR_INVALID_ARG, "first layer %d: give 0 or more", first);
    int total = dm_layer_num_params(m->emb) + (m->head ? dm_layer_num_params(m->head) : 0);
    for (int l = 0; l < m->c.layers; l++) total += dm_layer_num_params(m->enc[l]);
    load_item *items = calloc((size_t)total, sizeof *items);
    if (!items) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = load_checked(m, f, first, flags, items, note, nn);
    free(items);
    return s;
}

dm_status dm_model_load_path(dm_model *m, const char *path, int first, int flags, char *note, size_t nn) {
    if (!m || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_load_path: NULL argument");
    char weights[4096], config[4096];
    DM_TRY(dm_hf_model_files(path, weights, sizeof weights, config, sizeof config));
    dm_tensor_file *f = NULL;
    dm_status s = dm_tensor_file_open(&f, weights);
    if (s == DM_OK && config[0]) {
        dm_hf_config hc;
        s = dm_hf_config_read(config, &hc);
        if (s == DM_OK) s = dm_hf_config_check_tensors(&hc, f);
    }
    if (s == DM_OK) s = dm_model_load_hf(m, f, first, flags, note, nn);
    dm_tensor_file_free(f);
    if (s != DM_OK) dm_fail_context(s, "'%s': ", path);
    return s;
}
