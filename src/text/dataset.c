/* dataset.c: reading a dataset directory's manifest, dataset.json (include/dmove_data.h,
 * DATASET): the tokenizer it was made with and each split's shards and counts, checked
 * before any shard is opened. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "core/file.h"
#include "dmove_data.h"

#define MANIFEST_MAX (64u << 20)

typedef struct {
    char **paths;
    size_t n;
    dm_shard_info info;
} split_t;

struct dm_dataset {
    uint64_t hash;
    char *tokenizer;
    split_t train, valid;
};

static void split_free(split_t *s) {
    for (size_t k = 0; k < s->n; k++) free(s->paths[k]);
    free(s->paths);
}

void dm_dataset_free(dm_dataset *d) {
    if (!d) return;
    split_free(&d->train);
    split_free(&d->valid);
    free(d->tokenizer);
    free(d);
}

/* A whole number in [0, 2^53] from item `name` of o: 0, else -1. */
static int get_count(const cJSON *o, const char *name, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static int get_info(const cJSON *o, dm_shard_info *in) {
    return get_count(o, "documents", &in->documents) || get_count(o, "sentences", &in->sentences) ||
           get_count(o, "tokens", &in->tokens) || get_count(o, "unknown", &in->unknown);
}

static dm_status read_split(split_t *sp, const cJSON *splits, const char *name, const char *dir) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(splits, name);
    if (!o) return DM_OK; /* absent: no such split */
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "shards");
    if (!cJSON_IsObject(o) || !cJSON_IsArray(arr) || get_info(o, &sp->info))
        return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json': split %s is malformed", dir, name);
    size_t n = (size_t)cJSON_GetArraySize(arr);
    sp->paths = calloc(n ? n : 1, sizeof *sp->paths);
    if (!sp->paths) return dm_fail(DM_ERR_OOM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "file");
        const char *s = cJSON_IsString(f) ? f->valuestring : NULL;
        if (!s || !*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
            return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json': split %s names a shard that is not a plain "
                           "file name", dir, name);
        size_t len = strlen(dir) + strlen(s) + 2;
        char *p = malloc(len);
        if (!p) return dm_fail(DM_ERR_OOM, "out of memory");
        snprintf(p, len, "%s/%s", dir, s);
        sp->paths[sp->n++] = p;
    }
    return DM_OK;
}

static dm_status read_text(const char *path, char **out) {
    if (dm_input_regular(path) != DM_OK) return dm_fail_context(dm_last_status(), "dataset: ");
    FILE *f = fopen(path, "rb");
    if (!f)
        return dm_fail(DM_ERR_IO, "cannot open '%s': %s (is it a dataset directory written by dmove "
                       "prepare?)", path, strerror(errno));
    struct stat sb;
    size_t n = 0;
    int too_large = 0;
    const size_t size = fstat(fileno(f), &sb) == 0 && sb.st_size > 0 ? (size_t)sb.st_size : 0;
    const dm_status s = dm_read_stream(f, size, MANIFEST_MAX, out, &n, &too_large);
    fclose(f);
    if (s == DM_ERR_OOM) return dm_fail(DM_ERR_OOM, "out of memory");
    if (s != DM_OK)
        return dm_fail(too_large ? DM_ERR_FORMAT : DM_ERR_IO, "cannot read '%s' (%s)", path,
                       too_large ? "larger than 64 MiB" : "read error");
    return DM_OK;
}

static dm_status parse_manifest(dm_dataset *d, const cJSON *root, const char *dir) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dmove-dataset") != 0)
        return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json' is not a dmove dataset manifest", dir);
    if (!cJSON_IsNumber(ver) || ver->valuedouble != 1)
        return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json': version %g; this dmove reads version 1", dir,
                       cJSON_IsNumber(ver) ? ver->valuedouble : -1.0);
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(tok, "hash");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(tok, "description");
    char *end = NULL;
    if (!cJSON_IsString(h) || strlen(h->valuestring) != 16)
        return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json': tokenizer.hash is not 16 hex digits", dir);
    errno = 0;
    d->hash = strtoull(h->valuestring, &end, 16);
    if (errno || *end || h->valuestring[0] == '-' || h->valuestring[0] == '+')
        return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json': tokenizer.hash is not 16 hex digits", dir);
    d->tokenizer = strdup(cJSON_IsString(desc) ? desc->valuestring : "");
    if (!d->tokenizer) return dm_fail(DM_ERR_OOM, "out of memory");
    const cJSON *splits = cJSON_GetObjectItemCaseSensitive(root, "splits");
    if (!cJSON_IsObject(splits))
        return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json' has no splits", dir);
    DM_TRY(read_split(&d->train, splits, "train", dir));
    DM_TRY(read_split(&d->valid, splits, "valid", dir));
    return DM_OK;
}

dm_status dm_dataset_open(dm_dataset **out, const char *dir) {
    if (out) *out = NULL;
    if (!out || !dir) return dm_fail(DM_ERR_INVALID_ARG, "dm_dataset_open: NULL argument");
    struct stat st;
    if (stat(dir, &st) != 0)
        return dm_fail(DM_ERR_IO, "cannot open dataset '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dm_fail(DM_ERR_INVALID_ARG, "'%s' is not a directory: give the directory dmove prepare "
                       "--out wrote", dir);
    size_t len = strlen(dir) + 16;
    char *path = malloc(len), *text = NULL;
    if (!path) return dm_fail(DM_ERR_OOM, "out of memory");
    snprintf(path, len, "%s/dataset.json", dir);
    dm_status s = read_text(path, &text);
    free(path);
    if (s != DM_OK) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return dm_fail(DM_ERR_FORMAT, "'%s/dataset.json' is not valid JSON", dir);
    dm_dataset *d = calloc(1, sizeof *d);
    s = d ? parse_manifest(d, root, dir) : dm_fail(DM_ERR_OOM, "out of memory");
    cJSON_Delete(root);
    if (s != DM_OK) {
        dm_dataset_free(d);
        return s;
    }
    d->train.info.vocab_hash = d->valid.info.vocab_hash = d->hash;
    *out = d;
    return DM_OK;
}

static const split_t *find_split(const dm_dataset *d, const char *split) {
    if (!d || !split) return NULL;
    if (!strcmp(split, "train")) return &d->train;
    if (!strcmp(split, "valid")) return &d->valid;
    return NULL;
}

uint64_t dm_dataset_vocab_hash(const dm_dataset *d) { return d ? d->hash : 0; }
const char *dm_dataset_tokenizer(const dm_dataset *d) { return d && d->tokenizer ? d->tokenizer : ""; }

size_t dm_dataset_shard_count(const dm_dataset *d, const char *split) {
    const split_t *s = find_split(d, split);
    return s ? s->n : 0;
}

const char *dm_dataset_shard_path(const dm_dataset *d, const char *split, size_t k) {
    const split_t *s = find_split(d, split);
    return s && k < s->n ? s->paths[k] : NULL;
}

dm_status dm_dataset_split_info(const dm_dataset *d, const char *split, dm_shard_info *out) {
    if (!d || !split || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_dataset_split_info: NULL argument");
    const split_t *s = find_split(d, split);
    if (!s) return dm_fail(DM_ERR_NOT_FOUND, "no split '%s' (train or valid)", split);
    *out = s->info;
    return DM_OK;
}
