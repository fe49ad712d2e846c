/* stmodel.c: a sentence-transformers model directory (modules.json): where its encoder's
 * files are, how it pools, whether it normalizes, its max_seq_length; what `dmove embed`
 * takes as its defaults, so that a model gives sentence-transformers' numbers as it is. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/status.h"
#include "dmove_tools.h"

#define ST_JSON_MAX ((size_t)1 << 20)

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* path's JSON (absent: *out NULL, DM_OK). */
static dm_status read_json(const char *path, cJSON **out) {
    *out = NULL;
    if (!is_file(path)) return DM_OK;
    char *text = NULL;
    size_t len = 0;
    DM_TRY(dm_read_file(path, ST_JSON_MAX, &text, &len));
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*out) return dm_fail(DM_ERR_FORMAT, "'%s' is not valid JSON", path);
    return DM_OK;
}

/* The type's last part: "sentence_transformers.models.Pooling" -> "Pooling". */
static const char *short_type(const char *t) {
    const char *dot = strrchr(t, '.');
    return dot ? dot + 1 : t;
}

/* A module's folder under dir ("" or "." : dir itself), checked to stay inside it. */
static dm_status module_dir(const char *dir, const char *sub, char *out, size_t n) {
    if (strstr(sub, "..") || sub[0] == '/')
        return dm_fail(DM_ERR_FORMAT, "%s/modules.json: a module's path '%.100s' leaves the model's directory", dir, sub);
    const int here = !*sub || !strcmp(sub, ".");
    if ((size_t)snprintf(out, n, here ? "%s" : "%s/%s", dir, sub) >= n)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s/%s'", dir, sub);
    return DM_OK;
}

/* The pooling of a Pooling module's config.json: mean or cls alone; else the mode named. */
static dm_status read_pooling(const char *dir, const char *sub, dm_st_model *m) {
    char path[4096], mdir[4096];
    DM_TRY(module_dir(dir, sub, mdir, sizeof mdir));
    snprintf(path, sizeof path, "%s/config.json", mdir);
    cJSON *j = NULL;
    DM_TRY(read_json(path, &j));
    if (!j) return DM_OK; /* sentence-transformers' default: mean */
    static const char *const modes[] = {"pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                                        "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                        "pooling_mode_lasttoken"};
    /* sentence-transformers 5 and later: "pooling_mode", a name (or a list of them) */
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(j, "pooling_mode");
    if (cJSON_IsString(pm) || cJSON_IsArray(pm)) {
        const cJSON *one = cJSON_IsArray(pm) && cJSON_GetArraySize(pm) == 1 ? cJSON_GetArrayItem(pm, 0) : pm;
        const char *name = cJSON_IsString(one) ? one->valuestring : NULL;
        m->pooling = name && !strcmp(name, "mean") ? DM_POOL_MEAN : name && !strcmp(name, "cls") ? DM_POOL_CLS : -1;
        if (m->pooling < 0) {
            char *t = cJSON_PrintUnformatted(pm);
            snprintf(m->pooling_name, sizeof m->pooling_name, "%s", t ? t : "?");
            free(t);
        }
        cJSON_Delete(j);
        return DM_OK;
    }
    int on[6] = {0}, count = 0;
    for (int k = 0; k < 6; k++) { /* absent: sentence-transformers' default, mean alone */
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, modes[k]);
        on[k] = x ? cJSON_IsTrue(x) : k == 1;
        count += on[k];
    }
    cJSON_Delete(j);
    if (count == 1 && (on[0] || on[1])) {
        m->pooling = on[0] ? DM_POOL_CLS : DM_POOL_MEAN;
        return DM_OK;
    }
    m->pooling = -1;
    if (!count) snprintf(m->pooling_name, sizeof m->pooling_name, "none");
    for (int k = 0, at = 0; k < 6; k++)
        if (on[k])
            at += snprintf(m->pooling_name + at, sizeof m->pooling_name - (size_t)at, "%s%s", at ? " + " : "",
                           modes[k] + 13);
    return DM_OK;
}

dm_status dm_st_model_read(const char *dir, dm_st_model *m) {
    if (!dir || !m) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_model_read: NULL argument");
    memset(m, 0, sizeof *m);
    m->pooling = DM_POOL_MEAN;
    snprintf(m->encoder_dir, sizeof m->encoder_dir, "%s", dir);
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/modules.json", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    cJSON *j = NULL;
    DM_TRY(read_json(path, &j));
    if (!j) return DM_OK;
    m->found = 1;
    dm_status s = cJSON_IsArray(j) ? DM_OK : dm_fail(DM_ERR_FORMAT, "%s: not a list of modules", path);
    int transformers = 0, poolings = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (s != DM_OK) break;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type"), *p = cJSON_GetObjectItemCaseSensitive(e, "path");
        if (!cJSON_IsString(t) || (p && !cJSON_IsString(p))) {
            s = dm_fail(DM_ERR_FORMAT, "%s: a module without a \"type\" string", path);
            break;
        }
        const char *type = short_type(t->valuestring), *sub = p ? p->valuestring : "";
        if (!strcmp(type, "Transformer")) {
            char mdir[4096];
            s = module_dir(dir, sub, mdir, sizeof mdir);
            if (s == DM_OK) snprintf(m->encoder_dir, sizeof m->encoder_dir, "%s", mdir);
            transformers++;
        } else if (!strcmp(type, "Pooling")) {
            s = read_pooling(dir, sub, m);
            poolings++;
        } else if (!strcmp(type, "Normalize")) {
            m->normalize = 1;
        } else {
            snprintf(m->other, sizeof m->other, "%.100s", t->valuestring);
        }
    }
    cJSON_Delete(j);
    if (s == DM_OK && (transformers != 1 || poolings > 1))
        s = dm_fail(DM_ERR_UNSUPPORTED, "%s: %d Transformer and %d Pooling modules: dmove embed runs one encoder "
                    "and one pooling", path, transformers, poolings);
    if (s != DM_OK) return s;
    /* max_seq_length: the encoder module's sentence_bert_config.json (the root's in the
     * usual layout, where the encoder's path is "") */
    snprintf(path, sizeof path, "%s/sentence_bert_config.json", m->encoder_dir);
    DM_TRY(read_json(path, &j));
    if (j) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "max_seq_length");
        if (cJSON_IsNumber(x) && x->valuedouble >= 2 && x->valuedouble <= 1e6) m->max_seq_length = (int64_t)x->valuedouble;
        m->do_lower_case = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "do_lower_case"));
        cJSON_Delete(j);
    }
    if (!m->max_seq_length) { /* none there: the tokenizer's model_max_length, as sentence-transformers
                               * takes it (the caller caps it at the positions) */
        snprintf(path, sizeof path, "%s/tokenizer_config.json", m->encoder_dir);
        DM_TRY(read_json(path, &j));
        const cJSON *x = j ? cJSON_GetObjectItemCaseSensitive(j, "model_max_length") : NULL;
        if (cJSON_IsNumber(x) && x->valuedouble >= 2 && x->valuedouble <= 1e6) m->max_seq_length = (int64_t)x->valuedouble;
        cJSON_Delete(j);
    }
    return DM_OK;
}
