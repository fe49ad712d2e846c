/* safetensors.h: read and write the safetensors format (8-byte little-endian header
 * length, a JSON header, then the raw little-endian tensor data), validated before use
 * and written atomically (temporary file, fsync, rename). */
#ifndef DM_SAFETENSORS_H
#define DM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"

#define DM_ST_MAX_DIMS 8
/* The official implementation refuses headers over 100 MB; so do reader and writer. */
#define DM_ST_MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000)

typedef enum {
    DM_ST_F32 = 0, DM_ST_F64, DM_ST_F16, DM_ST_BF16, DM_ST_I64, DM_ST_I32, DM_ST_I16,
    DM_ST_I8, DM_ST_U8, DM_ST_BOOL, DM_ST_NUM_DTYPES
} dm_st_dtype;

typedef struct {
    const char *name;
    dm_st_dtype dtype;
    int ndim;
    int64_t shape[DM_ST_MAX_DIMS];
    const void *data; /* points into the file's buffer; may be unaligned; NULL for a header read alone */
    size_t nbytes;
} dm_st_tensor;

typedef struct dm_st_file dm_st_file;

const char *dm_st_dtype_name(dm_st_dtype d);
size_t dm_st_dtype_size(dm_st_dtype d);

/* Reads and validates the whole file: header length within the file, JSON well-formed,
 * every entry has a known dtype, a shape whose byte count (overflow-checked) equals its
 * data_offsets span, offsets inside the data section, no overlaps, no duplicates. */
dm_status dm_st_read(const char *path, dm_st_file **out);
dm_status dm_st_parse(const void *bytes, size_t size, dm_st_file **out); /* copies bytes */
/* The header alone, validated as dm_st_read validates it (against the file's size), for
 * names and shapes without reading the data: the tensors' data are NULL. */
dm_status dm_st_read_header(const char *path, dm_st_file **out);
void dm_st_free(dm_st_file *f);
int dm_st_count(const dm_st_file *f);
const dm_st_tensor *dm_st_get(const dm_st_file *f, int index);
const dm_st_tensor *dm_st_find(const dm_st_file *f, const char *name); /* NULL if absent */
/* The value of `key` in the optional "__metadata__" object (string -> string); NULL if
 * absent. The string lives as long as f. */
const char *dm_st_metadata(const dm_st_file *f, const char *key);

/* Copies a tensor into float32 `out` (n elements), converting from f32/f64/f16/bf16 or
 * integer/bool dtypes; checks n equals its element count. */
dm_status dm_st_to_f32(const dm_st_tensor *t, float *out, size_t n);
/* The index of the first element that is not finite (NaN or infinite; with nonneg, also
 * one below zero), or -1: floating-point dtypes read by their bits, integer dtypes -1. */
int64_t dm_st_first_bad(const dm_st_tensor *t, int nonneg);

typedef struct dm_st_writer dm_st_writer;
dm_status dm_st_writer_new(dm_st_writer **out);
/* Copies name, shape and data. */
dm_status dm_st_writer_add(dm_st_writer *w, const char *name, dm_st_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* Records "__metadata__"[key] = value (both copied; an existing key is replaced). */
dm_status dm_st_writer_set_metadata(dm_st_writer *w, const char *key, const char *value);
/* Writes to path + ".tmp.<pid>", fsyncs, renames over path. On failure nothing at path
 * changes and the temporary file is removed. */
dm_status dm_st_writer_write(dm_st_writer *w, const char *path);
void dm_st_writer_free(dm_st_writer *w);

#endif
