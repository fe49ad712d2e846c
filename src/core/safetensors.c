/* safetensors.c: reading safetensors files (validated in full before anything is used)
 * and converting their tensors to float32; the writer is in safetensors_write.c. JSON is
 * handled by cJSON.
 *
 * Layout: u64 little-endian N, N bytes of UTF-8 JSON (an object: tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__"
 * object of strings), then the data section. Offsets are relative to the data section,
 * which tensors must cover exactly: no overlaps, no holes, nothing after the last one
 * (as the format's specification requires, so polyglot or damaged files are refused). */
#include "safetensors.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "status.h"
#include "file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dmove's safetensors code assumes a little-endian host (as is the file format)"
#endif

/* Integers in the header are JSON numbers; cJSON holds them as doubles, exact to 2^53. */
#define DM_ST_MAX_INT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} g_dtypes[DM_ST_NUM_DTYPES] = {
    [DM_ST_F32] = {"F32", 4}, [DM_ST_F64] = {"F64", 8}, [DM_ST_F16] = {"F16", 2},
    [DM_ST_BF16] = {"BF16", 2}, [DM_ST_I64] = {"I64", 8}, [DM_ST_I32] = {"I32", 4},
    [DM_ST_I16] = {"I16", 2}, [DM_ST_I8] = {"I8", 1}, [DM_ST_U8] = {"U8", 1},
    [DM_ST_BOOL] = {"BOOL", 1},
};

const char *dm_st_dtype_name(dm_st_dtype d) {
    return (unsigned)d < DM_ST_NUM_DTYPES ? g_dtypes[d].name : "?";
}

size_t dm_st_dtype_size(dm_st_dtype d) {
    return (unsigned)d < DM_ST_NUM_DTYPES ? g_dtypes[d].size : 0;
}

struct dm_st_file {
    unsigned char *buf; /* the whole file, owned */
    size_t size;
    int count;
    dm_st_tensor *tensors; /* header order; names owned */
    int *by_name;          /* indices sorted by name, for lookups and duplicate checks */
    int nmeta;
    char **meta_key, **meta_val; /* owned */
};

/* ---------------------------------------------------------------------------------------
 * small helpers */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* A printable, bounded copy of a name from a file, for messages: a damaged header can
 * hold control characters or megabyte-long names. */
static const char *printable(const char *s, char out[96]) {
    size_t k = 0;
    for (; s[k] && k < 80; k++) {
        unsigned char c = (unsigned char)s[k];
        out[k] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (s[k]) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return out;
}

static const char *json_type_name(const cJSON *j) {
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    return "an invalid value";
}

/* A JSON number that is a non-negative integer representable exactly. */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > DM_ST_MAX_INT || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

typedef struct {
    const dm_st_tensor *t;
    uint64_t begin, end;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

typedef struct {
    const char *name;
    int index;
} name_ix;

static int cmp_name_ix(const void *a, const void *b) {
    const name_ix *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return (x->index > y->index) - (x->index < y->index);
}

/* ---------------------------------------------------------------------------------------
 * reading */

void dm_st_free(dm_st_file *f) {
    if (!f) return;
    if (f->tensors)
        for (int i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->nmeta; i++) {
        free(f->meta_key ? f->meta_key[i] : NULL);
        free(f->meta_val ? f->meta_val[i] : NULL);
    }
    free(f->meta_key);
    free(f->meta_val);
    free(f->tensors);
    free(f->by_name);
    free(f->buf);
    free(f);
}

static dm_status parse_metadata(dm_st_file *f, const cJSON *meta) {
    char pn[96];
    if (!cJSON_IsObject(meta))
        return dm_fail(DM_ERR_FORMAT,
                       "header entry \"__metadata__\" is %s; the format requires an object "
                       "of strings",
                       json_type_name(meta));
    int n = cJSON_GetArraySize(meta);
    if (n == 0) return DM_OK;
    f->meta_key = calloc((size_t)n, sizeof *f->meta_key);
    f->meta_val = calloc((size_t)n, sizeof *f->meta_val);
    if (!f->meta_key || !f->meta_val)
        return dm_fail(DM_ERR_OOM, "out of memory reading %d metadata entries", n);
    const cJSON *m;
    cJSON_ArrayForEach(m, meta) {
        if (!cJSON_IsString(m) || !m->valuestring)
            return dm_fail(DM_ERR_FORMAT,
                           "metadata entry \"%s\" is %s; the format allows only strings",
                           printable(m->string ? m->string : "", pn), json_type_name(m));
        for (int i = 0; i < f->nmeta; i++)
            if (strcmp(f->meta_key[i], m->string) == 0)
                return dm_fail(DM_ERR_FORMAT, "metadata key \"%s\" appears twice in the header",
                               printable(m->string, pn));
        f->meta_key[f->nmeta] = dup_str(m->string);
        f->meta_val[f->nmeta] = dup_str(m->valuestring);
        f->nmeta++; /* counted before checking so dm_st_free releases a half-made pair */
        if (!f->meta_key[f->nmeta - 1] || !f->meta_val[f->nmeta - 1])
            return dm_fail(DM_ERR_OOM, "out of memory copying metadata");
    }
    return DM_OK;
}

/* Validates one tensor entry and fills t (not t->data) and its byte span. */
static dm_status parse_entry(const cJSON *e, size_t data_size, dm_st_tensor *t, span *sp) {
    char pn[96];
    const char *name = printable(e->string, pn);
    if (!cJSON_IsObject(e))
        return dm_fail(DM_ERR_FORMAT,
                       "tensor \"%s\" is %s in the header; expected an object with dtype, "
                       "shape and data_offsets",
                       name, json_type_name(e));

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!dt) return dm_fail(DM_ERR_FORMAT, "tensor \"%s\" has no \"dtype\"", name);
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": \"dtype\" is %s, expected a string",
                       name, json_type_name(dt));
    int d = -1;
    for (int k = 0; k < DM_ST_NUM_DTYPES; k++)
        if (strcmp(dt->valuestring, g_dtypes[k].name) == 0) d = k;
    if (d < 0) {
        char pd[96];
        return dm_fail(DM_ERR_FORMAT,
                       "tensor \"%s\" has dtype \"%s\", which dmove does not know (known: F32 "
                       "F64 F16 BF16 I64 I32 I16 I8 U8 BOOL)",
                       name, printable(dt->valuestring, pd));
    }
    t->dtype = (dm_st_dtype)d;

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!sh) return dm_fail(DM_ERR_FORMAT, "tensor \"%s\" has no \"shape\"", name);
    if (!cJSON_IsArray(sh))
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": \"shape\" is %s, expected an array",
                       name, json_type_name(sh));
    int nd = cJSON_GetArraySize(sh);
    if (nd > DM_ST_MAX_DIMS)
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\" has %d dimensions; dmove supports at most %d",
                       name, nd, DM_ST_MAX_DIMS);
    t->ndim = nd;
    size_t elems = 1;
    int k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, sh) {
        uint64_t v;
        if (!json_u64(x, &v)) {
            if (cJSON_IsNumber(x) && x->valuedouble < 0)
                return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": shape dimension %d is negative (%g)",
                               name, k, x->valuedouble);
            if (cJSON_IsNumber(x))
                return dm_fail(DM_ERR_FORMAT,
                               "tensor \"%s\": shape dimension %d (%g) is not a whole number "
                               "below 2^53",
                               name, k, x->valuedouble);
            return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": shape dimension %d is %s, expected an "
                           "integer", name, k, json_type_name(x));
        }
        t->shape[k++] = (int64_t)v;
        if (!dm_mul_ok(elems, (size_t)v, &elems))
            return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": the element count of its shape "
                           "overflows (dimension %d is %" PRIu64 ")", name, k - 1, v);
    }
    size_t nbytes;
    if (!dm_mul_ok(elems, g_dtypes[d].size, &nbytes))
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": the byte size of its shape overflows",
                       name);
    t->nbytes = nbytes;

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!off) return dm_fail(DM_ERR_FORMAT, "tensor \"%s\" has no \"data_offsets\"", name);
    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_u64(cJSON_GetArrayItem(off, 0), &b) || !json_u64(cJSON_GetArrayItem(off, 1), &en))
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": \"data_offsets\" must be an array of two "
                       "non-negative integers [begin, end]", name);
    if (en < b)
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] end "
                       "before they begin", name, b, en);
    if (en > data_size)
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] "
                       "reach past the end of the data section (%zu bytes): the file is "
                       "truncated or its header is corrupted", name, b, en, data_size);
    if (en - b != nbytes) {
        char shp[160];
        int p = snprintf(shp, sizeof shp, "[");
        for (int q = 0; q < nd && p < (int)sizeof shp - 24; q++)
            p += snprintf(shp + p, sizeof shp - (size_t)p, q ? ", %" PRId64 : "%" PRId64,
                          t->shape[q]);
        snprintf(shp + p, sizeof shp - (size_t)p, "]");
        return dm_fail(DM_ERR_FORMAT, "tensor \"%s\": shape %s of %s needs %zu bytes but "
                       "data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes",
                       name, shp, g_dtypes[d].name, nbytes, b, en, en - b);
    }
    sp->t = t;
    sp->begin = b;
    sp->end = en;
    return DM_OK;
}

/* The header length that starts the file (u64 little-endian), checked against the file's
 * size and the format's limit; the header must open a JSON object. */
static dm_status header_length(const unsigned char *buf, size_t size, uint64_t *hlen_out) {
    if (size == 0)
        return dm_fail(DM_ERR_FORMAT, "the file is empty (0 bytes): not a safetensors file");
    if (size < 8)
        return dm_fail(DM_ERR_FORMAT, "the file is only %zu bytes, shorter than the 8-byte "
                       "header length that starts a safetensors file: truncated?", size);
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | buf[k];
    if (hlen > DM_ST_MAX_HEADER_BYTES)
        return dm_fail(DM_ERR_FORMAT, "the header length field says %" PRIu64 " bytes, above the "
                       "format's 100 MB limit: not a safetensors file, or corrupted", hlen);
    if (hlen > size - 8)
        return dm_fail(DM_ERR_FORMAT, "the header length field says %" PRIu64 " bytes but only "
                       "%zu bytes follow it: the file is truncated or not a safetensors file",
                       hlen, size - 8);
    if (hlen < 2)
        return dm_fail(DM_ERR_FORMAT, "the header length field says %" PRIu64 " bytes, too short "
                       "for a JSON header: not a safetensors file, or corrupted", hlen);
    if (buf[8] != '{')
        return dm_fail(DM_ERR_FORMAT, "the header does not start with a JSON object ('{'): "
                       "not a safetensors file, or corrupted");
    *hlen_out = hlen;
    return DM_OK;
}

/* Parses the header (hdr: hlen bytes and a NUL) into *root, which the caller deletes, also
 * on failure: one JSON object, then only whitespace. */
static dm_status parse_header_json(const char *hdr, uint64_t hlen, cJSON **root) {
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!*root) {
        size_t at = end && end >= hdr ? (size_t)(end - hdr) : 0;
        return dm_fail(DM_ERR_FORMAT, "the header is not valid JSON (error near byte %zu of the "
                       "%" PRIu64 "-byte header): corrupted file", at, hlen);
    }
    /* Only whitespace (the format pads with spaces) may follow the object. */
    for (size_t k = end ? (size_t)(end - hdr) : (size_t)hlen; k < (size_t)hlen; k++) {
        char c = hdr[k];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return dm_fail(DM_ERR_FORMAT, "the header has unexpected bytes after its JSON object "
                           "(at byte %zu): corrupted file", k);
    }
    if (!cJSON_IsObject(*root))
        return dm_fail(DM_ERR_FORMAT, "the header is %s, not a JSON object: not a safetensors "
                       "file", json_type_name(*root));
    return DM_OK;
}

/* Reads the header's entries into f (tensors in header order, their names copied; the
 * metadata), each tensor's byte span into sp and its name into ix (room for every entry). */
static dm_status parse_entries(dm_st_file *f, const cJSON *root, size_t data_size, span *sp,
                               name_ix *ix) {
    int nmeta_entries = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!e->string) /* cannot happen for a parsed object; never trust it anyway */
            return dm_fail(DM_ERR_FORMAT, "a header entry has no name");
        if (strcmp(e->string, "__metadata__") == 0) {
            if (nmeta_entries++)
                return dm_fail(DM_ERR_FORMAT, "\"__metadata__\" appears twice in the header");
            dm_status st = parse_metadata(f, e);
            if (st) return st;
            continue;
        }
        dm_st_tensor *t = &f->tensors[f->count];
        dm_status st = parse_entry(e, data_size, t, &sp[f->count]);
        if (st) return st;
        t->name = dup_str(e->string);
        if (!t->name) return dm_fail(DM_ERR_OOM, "out of memory copying tensor names");
        ix[f->count].name = t->name;
        ix[f->count].index = f->count;
        f->count++;
    }
    return DM_OK;
}

/* Sorts the names (ix) and refuses one that appears twice. */
static dm_status check_unique_names(name_ix *ix, int count) {
    char pn[96];
    qsort(ix, (size_t)count, sizeof *ix, cmp_name_ix);
    for (int i = 1; i < count; i++)
        if (strcmp(ix[i - 1].name, ix[i].name) == 0)
            return dm_fail(DM_ERR_FORMAT, "tensor \"%s\" appears twice in the header",
                           printable(ix[i].name, pn));
    return DM_OK;
}

/* Tensors must tile the data section: sorted by offset (sp is sorted) each begins where the
 * previous one ended (empty tensors may share an offset). */
static dm_status check_tiling(span *sp, int count, size_t data_size) {
    char pn[96], pm[96];
    dm_status st = DM_OK;
    qsort(sp, (size_t)count, sizeof *sp, cmp_span);
    uint64_t at = 0;
    const dm_st_tensor *prev = NULL;
    for (int i = 0; i < count && !st; i++) {
        if (sp[i].begin < at)
            st = dm_fail(DM_ERR_FORMAT, "tensors \"%s\" and \"%s\" overlap in the data "
                         "section (offset %" PRIu64 " < %" PRIu64 "): corrupted header",
                         printable(prev ? prev->name : "?", pn), printable(sp[i].t->name, pm),
                         sp[i].begin, at);
        else if (sp[i].begin > at)
            st = dm_fail(DM_ERR_FORMAT, "bytes %" PRIu64 "..%" PRIu64 " of the data section "
                         "belong to no tensor (before \"%s\"); the format forbids holes: "
                         "corrupted header", at, sp[i].begin, printable(sp[i].t->name, pn));
        if (sp[i].end > at) {
            at = sp[i].end;
            prev = sp[i].t;
        } else if (!prev) {
            prev = sp[i].t;
        }
    }
    if (!st && at != data_size)
        st = dm_fail(DM_ERR_FORMAT, "the data section has %zu bytes but the tensors in the "
                     "header cover only %" PRIu64 ": extra bytes at the end, or a corrupted "
                     "header", data_size, at);
    return st;
}

/* Points each tensor at its bytes in the data section (none when data is NULL: a header
 * read alone) and keeps the by-name order of ix. */
static dm_status index_tensors(dm_st_file *f, const span *sp, const name_ix *ix,
                               const unsigned char *data) {
    for (int i = 0; i < f->count; i++) ((dm_st_tensor *)sp[i].t)->data = data ? data + sp[i].begin : NULL;
    f->by_name = malloc(((size_t)f->count + 1) * sizeof *f->by_name);
    if (!f->by_name) return dm_fail(DM_ERR_OOM, "out of memory for the tensor index");
    for (int i = 0; i < f->count; i++) f->by_name[i] = ix[i].index;
    return DM_OK;
}

/* Takes ownership of buf (freed on failure too), which holds the file's size bytes, or with
 * header_only its first 8 + header-length bytes only (the tensors then have no data). */
static dm_status parse_owned(unsigned char *buf, size_t size, int header_only, dm_st_file **out) {
    *out = NULL;
    uint64_t hlen = 0;
    dm_status st = header_length(buf, size, &hlen);
    if (st) {
        free(buf);
        return st;
    }

    dm_st_file *f = calloc(1, sizeof *f);
    char *hdr = malloc((size_t)hlen + 1); /* NUL-terminated copy for the parser */
    if (!f || !hdr) {
        free(f);
        free(hdr);
        free(buf);
        return dm_fail(DM_ERR_OOM, "out of memory for a %" PRIu64 "-byte header", hlen);
    }
    f->buf = buf;
    f->size = size;
    memcpy(hdr, buf + 8, (size_t)hlen);
    hdr[hlen] = 0;

    cJSON *root = NULL;
    st = parse_header_json(hdr, hlen, &root);
    if (st) goto done;

    size_t data_size = size - 8 - (size_t)hlen;
    const unsigned char *data = header_only ? NULL : buf + 8 + hlen;
    int n = cJSON_GetArraySize(root);
    f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
    span *sp = calloc((size_t)n + 1, sizeof *sp);
    name_ix *ix = calloc((size_t)n + 1, sizeof *ix);
    if (!f->tensors || !sp || !ix) {
        free(sp);
        free(ix);
        st = dm_fail(DM_ERR_OOM, "out of memory for %d header entries", n);
        goto done;
    }
    st = parse_entries(f, root, data_size, sp, ix);
    if (!st) st = check_unique_names(ix, f->count);
    if (!st) st = check_tiling(sp, f->count, data_size);
    if (!st) st = index_tensors(f, sp, ix, data);
    free(sp);
    free(ix);

done:
    cJSON_Delete(root);
    free(hdr);
    if (st) {
        dm_st_free(f);
        return st;
    }
    *out = f;
    return DM_OK;
}

dm_status dm_st_parse(const void *bytes, size_t size, dm_st_file **out) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_parse: out is NULL");
    *out = NULL;
    if (!bytes && size) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_parse: bytes is NULL");
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) return dm_fail(DM_ERR_OOM, "out of memory copying a %zu-byte file", size);
    if (size) memcpy(buf, bytes, size);
    return parse_owned(buf, size, 0, out);
}

/* Reads n bytes at the stream's position into buf: 0, or an errno (EIO when the file
 * ended early: it shrank while it was read). */
static int read_exact(FILE *fp, unsigned char *buf, size_t n) {
    size_t got = n ? fread(buf, 1, n, fp) : 0;
    if (got == n) return 0;
    return ferror(fp) && errno ? errno : EIO;
}

/* dm_st_read and dm_st_read_header: the whole file, or its header alone. */
static dm_status read_file(const char *path, int header_only, dm_st_file **out) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_read: out is NULL");
    *out = NULL;
    if (!path || !*path) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_read: no file name given");
    DM_TRY(dm_input_regular(path)); /* a FIFO would block the open */
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return dm_fail(DM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) {
        int e = errno;
        fclose(fp);
        return dm_fail(DM_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(fp);
        return dm_fail(DM_ERR_IO, "'%s' is not a regular file%s", path,
                       S_ISDIR(sb.st_mode) ? " (it is a directory)" : "");
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX - 1) {
        fclose(fp);
        return dm_fail(DM_ERR_IO, "'%s' is too large to read into memory", path);
    }
    const size_t size = (size_t)sb.st_size;
    size_t n = size; /* the bytes to read */
    unsigned char head[8];
    int e = 0;
    if (header_only && size >= 8) {
        /* the length field, then as much of the header as it says (if the file has that
         * much and the format allows it: else header_length says what is wrong) */
        e = read_exact(fp, head, 8);
        uint64_t hlen = 0;
        for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | head[k];
        n = 8 + (hlen <= DM_ST_MAX_HEADER_BYTES && hlen <= size - 8 ? (size_t)hlen : 0);
    }
    unsigned char *buf = e ? NULL : malloc(n ? n : 1);
    if (!buf && !e) {
        fclose(fp);
        return dm_fail(DM_ERR_OOM, "out of memory reading '%s' (%zu bytes)", path, n);
    }
    if (!e && header_only && size >= 8) {
        memcpy(buf, head, 8);
        e = read_exact(fp, buf + 8, n - 8);
    } else if (!e) {
        e = read_exact(fp, buf, n);
    }
    fclose(fp); /* closing a stream we only read cannot lose data */
    if (e) {
        free(buf);
        if (e == EIO) return dm_fail(DM_ERR_IO, "'%s' shrank while it was read", path);
        return dm_fail(DM_ERR_IO, "error reading '%s': %s", path, strerror(e));
    }
    dm_status st = parse_owned(buf, size, header_only, out);
    if (st) return dm_fail_context(st, "%s: ", path);
    return DM_OK;
}

dm_status dm_st_read(const char *path, dm_st_file **out) { return read_file(path, 0, out); }

dm_status dm_st_read_header(const char *path, dm_st_file **out) { return read_file(path, 1, out); }

int dm_st_count(const dm_st_file *f) { return f ? f->count : 0; }

const dm_st_tensor *dm_st_get(const dm_st_file *f, int index) {
    if (!f || index < 0 || index >= f->count) return NULL;
    return &f->tensors[index];
}

const dm_st_tensor *dm_st_find(const dm_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const dm_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *dm_st_metadata(const dm_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * conversion */

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t ex = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (ex == 0) {
        float v = (float)man * 0x1p-24f; /* zero or subnormal: exact in float */
        return sign ? -v : v;
    }
    if (ex == 31)
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan (payload kept) */
    else
        bits = sign | ((ex + 112u) << 23) | (man << 13);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static float f64_to_f32(double x) {
    /* An out-of-range conversion is undefined in C; saturate to infinity as IEEE does. */
    if (x > FLT_MAX) return INFINITY;
    if (x < -FLT_MAX) return -INFINITY;
    return (float)x;
}

int64_t dm_st_first_bad(const dm_st_tensor *t, int nonneg) {
    if (!t || !t->data) return -1;
    const unsigned char *p = t->data;
    /* per dtype: the element size, the exponent field's mask, the sign bit */
    size_t es;
    uint64_t expo, sign;
    switch (t->dtype) {
    case DM_ST_F64: es = 8, expo = 0x7FF0000000000000ull, sign = 1ull << 63; break;
    case DM_ST_F32: es = 4, expo = 0x7F800000u, sign = 1u << 31; break;
    case DM_ST_F16: es = 2, expo = 0x7C00u, sign = 0x8000u; break;
    case DM_ST_BF16: es = 2, expo = 0x7F80u, sign = 0x8000u; break;
    default: return -1;
    }
    const size_t n = t->nbytes / es;
    for (size_t k = 0; k < n; k++) {
        uint64_t v; /* the element's bits (the file and the hosts dmove builds for are little-endian) */
        if (es == 8) memcpy(&v, p + k * 8, 8);
        else if (es == 4) {
            uint32_t w;
            memcpy(&w, p + k * 4, 4);
            v = w;
        } else {
            uint16_t h;
            memcpy(&h, p + k * 2, 2);
            v = h;
        }
        if ((v & expo) == expo || (nonneg && (v & sign) && (v & ~sign) != 0)) return (int64_t)k;
        if (es == 8) { /* finite in f64, but past float's range: infinite once read as f32 */
            double x;
            memcpy(&x, &v, 8);
            if (fabs(x) > FLT_MAX) return (int64_t)k;
        }
    }
    return -1;
}

dm_status dm_st_to_f32(const dm_st_tensor *t, float *out, size_t n) {
    if (!t || (!out && n)) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_to_f32: NULL argument");
    size_t es = dm_st_dtype_size(t->dtype);
    if (!es) return dm_fail(DM_ERR_INVALID_ARG, "dm_st_to_f32: tensor has an invalid dtype");
    size_t count = t->nbytes / es;
    if (!t->data && t->nbytes)
        return dm_fail(DM_ERR_INVALID_ARG, "tensor \"%s\": only its file's header was read",
                       t->name ? t->name : "?");
    if (count != n)
        return dm_fail(DM_ERR_SHAPE, "tensor \"%s\" has %zu elements, expected %zu",
                       t->name ? t->name : "?", count, n);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case DM_ST_F32:
        if (n) memcpy(out, p, n * 4);
        break;
    case DM_ST_F64:
        for (size_t k = 0; k < n; k++) {
            double v;
            memcpy(&v, p + 8 * k, 8);
            out[k] = f64_to_f32(v);
        }
        break;
    case DM_ST_F16:
        for (size_t k = 0; k < n; k++) {
            uint16_t v;
            memcpy(&v, p + 2 * k, 2);
            out[k] = f16_to_f32(v);
        }
        break;
    case DM_ST_BF16:
        for (size_t k = 0; k < n; k++) {
            uint16_t v;
            memcpy(&v, p + 2 * k, 2);
            uint32_t bits = (uint32_t)v << 16;
            memcpy(&out[k], &bits, 4);
        }
        break;
    case DM_ST_I64:
        for (size_t k = 0; k < n; k++) {
            int64_t v;
            memcpy(&v, p + 8 * k, 8);
            out[k] = (float)v;
        }
        break;
    case DM_ST_I32:
        for (size_t k = 0; k < n; k++) {
            int32_t v;
            memcpy(&v, p + 4 * k, 4);
            out[k] = (float)v;
        }
        break;
    case DM_ST_I16:
        for (size_t k = 0; k < n; k++) {
            int16_t v;
            memcpy(&v, p + 2 * k, 2);
            out[k] = (float)v;
        }
        break;
    case DM_ST_I8:
        for (size_t k = 0; k < n; k++) out[k] = (float)(int8_t)p[k];
        break;
    case DM_ST_U8:
        for (size_t k = 0; k < n; k++) out[k] = (float)p[k];
        break;
    case DM_ST_BOOL:
        for (size_t k = 0; k < n; k++) out[k] = p[k] ? 1.0f : 0.0f;
        break;
    default:
        return dm_fail(DM_ERR_INVALID_ARG, "dm_st_to_f32: tensor has an invalid dtype");
    }
    return DM_OK;
}
