/* safetensors_write.c: the safetensors writer: tensors and metadata are copied in, then
 * written in insertion order behind a header padded with spaces to a multiple of 8 bytes
 * (so the data section is 8-aligned), through dm_out_file (core/file.h): a temporary file
 * flushed, fsynced and renamed over the target (a pipe or device written directly). On any
 * failure the temporary file is removed and the target is left as it was. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "status.h"
#include "file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dmove's safetensors code assumes a little-endian host (as is the file format)"
#endif

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

typedef struct {
    char *name;
    dm_st_dtype dtype;
    int ndim;
    int64_t shape[DM_ST_MAX_DIMS];
    void *data;
    size_t nbytes;
} wentry;

struct dm_st_writer {
    wentry *e;
    int n, cap;
    char **mkey, **mval;
    int nmeta, mcap;
};

dm_status dm_st_writer_new(dm_st_writer **out) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_writer_new: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return dm_fail(DM_ERR_OOM, "out of memory creating a safetensors writer");
    return DM_OK;
}

void dm_st_writer_free(dm_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    for (int i = 0; i < w->nmeta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->e);
    free(w->mkey);
    free(w->mval);
    free(w);
}

dm_status dm_st_writer_add(dm_st_writer *w, const char *name, dm_st_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
    if (!w || !name) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_writer_add: NULL argument");
    if (!*name) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_writer_add: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return dm_fail(DM_ERR_INVALID_ARG, "\"__metadata__\" is reserved and cannot name a "
                       "tensor");
    if ((unsigned)dtype >= DM_ST_NUM_DTYPES)
        return dm_fail(DM_ERR_INVALID_ARG, "tensor \"%s\": invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > DM_ST_MAX_DIMS || (ndim && !shape))
        return dm_fail(DM_ERR_INVALID_ARG, "tensor \"%s\": %d dimensions (0..%d allowed)", name,
                       ndim, DM_ST_MAX_DIMS);
    size_t elems = 1, nbytes;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0)
            return dm_fail(DM_ERR_INVALID_ARG, "tensor \"%s\": dimension %d is negative", name, k);
        if ((uint64_t)shape[k] > (uint64_t)SIZE_MAX || !dm_mul_ok(elems, (size_t)shape[k], &elems))
            return dm_fail(DM_ERR_OOM, "tensor \"%s\": its size overflows", name);
    }
    if (!dm_mul_ok(elems, dm_st_dtype_size(dtype), &nbytes))
        return dm_fail(DM_ERR_OOM, "tensor \"%s\": its size overflows", name);
    if (nbytes && !data)
        return dm_fail(DM_ERR_INVALID_ARG, "tensor \"%s\": data is NULL", name);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return dm_fail(DM_ERR_INVALID_ARG, "tensor \"%s\" was added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        wentry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) return dm_fail(DM_ERR_OOM, "out of memory adding tensor \"%s\"", name);
        w->e = e;
        w->cap = cap;
    }
    wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = dup_str(name);
    e->data = malloc(nbytes ? nbytes : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        return dm_fail(DM_ERR_OOM, "out of memory copying tensor \"%s\" (%zu bytes)", name,
                       nbytes);
    }
    if (nbytes) memcpy(e->data, data, nbytes);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int k = 0; k < ndim; k++) e->shape[k] = shape[k];
    e->nbytes = nbytes;
    w->n++;
    return DM_OK;
}

dm_status dm_st_writer_set_metadata(dm_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_st_writer_set_metadata: NULL argument");
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->mkey[i], key) == 0) {
            char *v = dup_str(value);
            if (!v) return dm_fail(DM_ERR_OOM, "out of memory copying metadata");
            free(w->mval[i]);
            w->mval[i] = v;
            return DM_OK;
        }
    if (w->nmeta == w->mcap) {
        int cap = w->mcap ? 2 * w->mcap : 8;
        char **k = realloc(w->mkey, (size_t)cap * sizeof *k);
        if (!k) return dm_fail(DM_ERR_OOM, "out of memory adding metadata");
        w->mkey = k;
        char **v = realloc(w->mval, (size_t)cap * sizeof *v);
        if (!v) return dm_fail(DM_ERR_OOM, "out of memory adding metadata");
        w->mval = v;
        w->mcap = cap;
    }
    char *k = dup_str(key), *v = dup_str(value);
    if (!k || !v) {
        free(k);
        free(v);
        return dm_fail(DM_ERR_OOM, "out of memory copying metadata");
    }
    w->mkey[w->nmeta] = k;
    w->mval[w->nmeta] = v;
    w->nmeta++;
    return DM_OK;
}

/* Adds a raw integer: cJSON's own numbers are doubles and print large values in
 * exponent form. */
static int add_raw_u64(cJSON *arr, uint64_t v) {
    char s[24];
    snprintf(s, sizeof s, "%" PRIu64, v);
    cJSON *r = cJSON_CreateRaw(s);
    if (!r) return 0;
    if (!cJSON_AddItemToArray(arr, r)) {
        cJSON_Delete(r);
        return 0;
    }
    return 1;
}

static int add_item(cJSON *obj, const char *key, cJSON *item) {
    if (!item) return 0;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return 0;
    }
    return 1;
}

/* The padded header text (a multiple of 8 bytes, so the data section is 8-aligned). */
static dm_status build_header(const dm_st_writer *w, char **text, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->nmeta) {
        cJSON *m = cJSON_CreateObject();
        ok = add_item(root, "__metadata__", m);
        for (int i = 0; ok && i < w->nmeta; i++)
            ok = add_item(m, w->mkey[i], cJSON_CreateString(w->mval[i]));
    }
    uint64_t at = 0;
    for (int i = 0; ok && i < w->n; i++) {
        const wentry *e = &w->e[i];
        cJSON *t = cJSON_CreateObject();
        ok = add_item(root, e->name, t);
        ok = ok && add_item(t, "dtype", cJSON_CreateString(dm_st_dtype_name(e->dtype)));
        cJSON *sh = ok ? cJSON_CreateArray() : NULL;
        ok = ok && add_item(t, "shape", sh);
        for (int k = 0; ok && k < e->ndim; k++) ok = add_raw_u64(sh, (uint64_t)e->shape[k]);
        cJSON *off = ok ? cJSON_CreateArray() : NULL;
        ok = ok && add_item(t, "data_offsets", off) && add_raw_u64(off, at) &&
             add_raw_u64(off, at + e->nbytes);
        at += e->nbytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return dm_fail(DM_ERR_OOM, "out of memory building the safetensors header");
    size_t n = strlen(json), padded = (n + 7) & ~(size_t)7;
    if (padded > DM_ST_MAX_HEADER_BYTES) {
        cJSON_free(json);
        return dm_fail(DM_ERR_INVALID_ARG, "the safetensors header would be %zu bytes, above "
                       "the format's 100 MB limit (too many tensors or too long names)", padded);
    }
    char *buf = malloc(padded + 1);
    if (!buf) {
        cJSON_free(json);
        return dm_fail(DM_ERR_OOM, "out of memory building the safetensors header");
    }
    memcpy(buf, json, n);
    memset(buf + n, ' ', padded - n);
    buf[padded] = 0;
    cJSON_free(json);
    *text = buf;
    *len = padded;
    return DM_OK;
}

dm_status dm_st_writer_write(dm_st_writer *w, const char *path) {
    if (!w || !path || !*path)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_st_writer_write: no file name given");
    char *hdr = NULL;
    size_t hlen = 0;
    DM_TRY(build_header(w, &hdr, &hlen));

    dm_out_file o;
    dm_status st = dm_out_open(&o, path);
    if (st != DM_OK) {
        free(hdr);
        return st;
    }
    unsigned char lenbytes[8];
    for (int k = 0; k < 8; k++) lenbytes[k] = (unsigned char)((uint64_t)hlen >> (8 * k));
    st = dm_out_write(&o, lenbytes, 8);
    if (st == DM_OK) st = dm_out_write(&o, hdr, hlen);
    for (int i = 0; st == DM_OK && i < w->n; i++) st = dm_out_write(&o, w->e[i].data, w->e[i].nbytes);
    if (st != DM_OK) dm_out_abort(&o);
    else st = dm_out_commit(&o);
    free(hdr);
    return st;
}
