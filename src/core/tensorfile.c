/* tensorfile.c: the public tensor-file API of dmove_tools.h (dm_tensor_file,
 * dm_tensor_writer): thin wrappers over the safetensors reader and writer. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/tensorfile.h"

/* The public dtype codes are the reader's, in the same order. */
_Static_assert((int)DM_FILE_BOOL == (int)DM_ST_BOOL && (int)DM_ST_NUM_DTYPES == (int)DM_FILE_BOOL + 1,
               "dm_file_dtype follows dm_st_dtype");

struct dm_tensor_file {
    dm_st_file *f;
    char *path;
};

const char *dm_file_dtype_name(dm_file_dtype d) { return dm_st_dtype_name((dm_st_dtype)d); }

static dm_status open_file(dm_tensor_file **out, const char *path, int header_only) {
    if (out) *out = NULL;
    if (!out || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_file_open: NULL argument");
    dm_tensor_file *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return dm_fail(DM_ERR_OOM, "out of memory opening '%s'", path);
    }
    dm_status s = header_only ? dm_st_read_header(path, &t->f) : dm_st_read(path, &t->f);
    if (s != DM_OK) {
        dm_tensor_file_free(t);
        return s;
    }
    *out = t;
    return DM_OK;
}

dm_status dm_tensor_file_open(dm_tensor_file **out, const char *path) { return open_file(out, path, 0); }

dm_status dm_tensor_file_open_header(dm_tensor_file **out, const char *path) { return open_file(out, path, 1); }

void dm_tensor_file_free(dm_tensor_file *f) {
    if (!f) return;
    dm_st_free(f->f);
    free(f->path);
    free(f);
}

const dm_st_file *dm_tensor_file_st(const dm_tensor_file *f) { return f ? f->f : NULL; }

const char *dm_tensor_file_path(const dm_tensor_file *f) { return f ? f->path : NULL; }

int dm_tensor_file_count(const dm_tensor_file *f) { return f ? dm_st_count(f->f) : 0; }

int dm_tensor_file_find(const dm_tensor_file *f, const char *name) {
    if (!name) return -1;
    const int n = dm_tensor_file_count(f);
    for (int k = 0; k < n; k++)
        if (!strcmp(dm_st_get(f->f, k)->name, name)) return k;
    return -1;
}

dm_status dm_tensor_file_info(const dm_tensor_file *f, int index, dm_tensor_info *out) {
    if (!f || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_file_info: NULL argument");
    if (index < 0 || index >= dm_st_count(f->f))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_file_info: no tensor %d", index);
    const dm_st_tensor *t = dm_st_get(f->f, index);
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = (dm_file_dtype)t->dtype;
    out->ndim = t->ndim;
    for (int k = 0; k < t->ndim && k < 8; k++) out->shape[k] = t->shape[k];
    return DM_OK;
}

dm_status dm_tensor_file_read_f32(const dm_tensor_file *f, int index, float *out, size_t n) {
    if (!f || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_file_read_f32: NULL argument");
    if (index < 0 || index >= dm_st_count(f->f))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_file_read_f32: no tensor %d", index);
    return dm_st_to_f32(dm_st_get(f->f, index), out, n);
}

const char *dm_tensor_file_metadata(const dm_tensor_file *f, const char *key) {
    return f ? dm_st_metadata(f->f, key) : NULL;
}

/* The writer is the safetensors writer itself. */
struct dm_tensor_writer {
    dm_st_writer *w;
};

dm_status dm_tensor_writer_new(dm_tensor_writer **out) {
    if (out) *out = NULL;
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_writer_new: NULL argument");
    dm_tensor_writer *w = calloc(1, sizeof *w);
    if (!w) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = dm_st_writer_new(&w->w);
    if (s != DM_OK) {
        free(w);
        return s;
    }
    *out = w;
    return DM_OK;
}

void dm_tensor_writer_free(dm_tensor_writer *w) {
    if (!w) return;
    dm_st_writer_free(w->w);
    free(w);
}

dm_status dm_tensor_writer_add_f32(dm_tensor_writer *w, const char *name, int ndim, const int64_t *shape,
                                   const float *data) {
    if (!w || !name) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_writer_add_f32: NULL argument");
    return dm_st_writer_add(w->w, name, DM_ST_F32, ndim, shape, data);
}

dm_status dm_tensor_writer_set_metadata(dm_tensor_writer *w, const char *key, const char *value) {
    if (!w || !key || !value) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_writer_set_metadata: NULL argument");
    return dm_st_writer_set_metadata(w->w, key, value);
}

dm_status dm_tensor_writer_write(dm_tensor_writer *w, const char *path) {
    if (!w || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_tensor_writer_write: NULL argument");
    return dm_st_writer_write(w->w, path);
}
