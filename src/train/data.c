/* data.c: the samples a training run reads from a tensor file (dm_train_data of
 * dmove_tools.h): hidden_states (N, j, i), target (N, j, i) and optionally attention_mask
 * (N, j), checked when opened (names, shapes, dtypes, every value finite), and step s's
 * batch: samples (s-1)*b .. s*b-1 modulo N, converted to floats. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/tensorfile.h"
#include "train/trainer_internal.h"

struct dm_train_data {
    const char *path;
    const dm_st_tensor *x, *y, *mask;
    int64_t n; /* samples */
};

dm_status dm_train_data_new(dm_train_data **out, const dm_tensor_file *file) {
    if (out) *out = NULL;
    if (!out || !file) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_new: NULL argument");
    const dm_st_file *f = dm_tensor_file_st(file);
    const char *path = dm_tensor_file_path(file);
    const dm_st_tensor *x = dm_st_find(f, "hidden_states"), *y = dm_st_find(f, "target");
    const dm_st_tensor *mask = dm_st_find(f, "attention_mask");
    if (!x || !y)
        return dm_fail(DM_ERR_NOT_FOUND, "%s: needs tensors 'hidden_states' (N, j, i) and 'target' (N, j, i)%s%s",
                       path, x ? "" : "; hidden_states is missing", y ? "" : "; target is missing");
    if (x->ndim != 3 || y->ndim != 3 || memcmp(x->shape, y->shape, 3 * sizeof(int64_t)) != 0)
        return dm_fail(DM_ERR_SHAPE, "%s: hidden_states and target must both be (N, j, i), the same shape", path);
    if (x->shape[0] < 1 || x->shape[1] < 1 || x->shape[2] < 1)
        return dm_fail(DM_ERR_SHAPE, "%s: hidden_states and target are (%" PRId64 ", %" PRId64 ", %" PRId64 "): they "
                       "need a sample, a token and a feature at least", path, x->shape[0], x->shape[1], x->shape[2]);
    if (mask && (mask->ndim != 2 || mask->shape[0] != x->shape[0] || mask->shape[1] != x->shape[1]))
        return dm_fail(DM_ERR_SHAPE, "%s: attention_mask must be (N, j) = (%" PRId64 ", %" PRId64 ")", path,
                       x->shape[0], x->shape[1]);
    dm_train_data *d = calloc(1, sizeof *d);
    if (!d) return dm_fail(DM_ERR_OOM, "out of memory");
    *d = (dm_train_data){path, x, y, mask, x->shape[0]};
    *out = d;
    return DM_OK;
}

void dm_train_data_free(dm_train_data *d) { free(d); }

uint64_t dm_train_data_fingerprint(const dm_train_data *d) {
    if (!d) return 0;
    uint64_t h = 14695981039346656037ull;
    const dm_st_tensor *t[3] = {d->x, d->y, d->mask};
    for (int q = 0; q < 3; q++) {
        int64_t head[2 + DM_ST_MAX_DIMS] = {t[q] ? (int64_t)t[q]->dtype : -1, t[q] ? t[q]->ndim : 0};
        if (t[q]) memcpy(head + 2, t[q]->shape, sizeof t[q]->shape);
        h = dm_train_hash_bytes(h, head, sizeof head, 2);
        if (t[q] && t[q]->data) h = dm_train_hash_bytes(h, t[q]->data, t[q]->nbytes, 2);
    }
    return h;
}

void dm_train_data_sizes(const dm_train_data *d, int64_t *samples, int64_t *seq, int64_t *hidden) {
    if (samples) *samples = d ? d->n : 0;
    if (seq) *seq = d ? d->x->shape[1] : 0;
    if (hidden) *hidden = d ? d->x->shape[2] : 0;
}

/* Elements [e0, e0 + n) of a file tensor into out as floats: dm_st_to_f32 on a view of
 * them (every dtype the data may have). */
static dm_status slice_f32(const dm_st_tensor *t, int64_t e0, int64_t n, float *out) {
    const size_t es = dm_st_dtype_size(t->dtype);
    dm_st_tensor v = *t;
    v.data = (const unsigned char *)t->data + (size_t)e0 * es;
    v.nbytes = (size_t)n * es;
    v.ndim = 1;
    v.shape[0] = n;
    return dm_st_to_f32(&v, out, (size_t)n);
}

static int data_dtype_ok(const dm_st_tensor *t) {
    return t->dtype == DM_ST_F32 || t->dtype == DM_ST_F64 || t->dtype == DM_ST_BF16 || t->dtype == DM_ST_F16;
}

dm_status dm_train_data_check_dtypes(const dm_train_data *d) {
    if (!d) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_check_dtypes: NULL argument");
    if (!data_dtype_ok(d->x) || !data_dtype_ok(d->y) || (d->mask && !data_dtype_ok(d->mask) &&
                                                         d->mask->dtype != DM_ST_I64 && d->mask->dtype != DM_ST_I32 &&
                                                         d->mask->dtype != DM_ST_U8 && d->mask->dtype != DM_ST_BOOL))
        return dm_fail(DM_ERR_FORMAT, "hidden_states and target must be f32, f64, bf16 or f16 (attention_mask may "
                       "also be i64, i32, u8 or bool)");
    return DM_OK;
}

/* The flat index of the first NaN or infinity of t, a tensor of `samples` samples of `per`
 * elements, or -1 (-2: out of memory): found when the file is opened, not when training
 * reaches that sample. */
static int64_t first_nonfinite(const dm_st_tensor *t, int64_t samples, int64_t per) {
    float *buf = malloc((size_t)per * sizeof(float));
    if (!buf) return -2;
    int64_t at = -1;
    for (int64_t q = 0; q < samples && at < 0; q++) {
        if (slice_f32(t, q * per, per, buf) != DM_OK) {
            at = q * per; /* not expected: the dtype and size were checked */
            break;
        }
        for (int64_t e = 0; e < per; e++)
            if (!isfinite(buf[e])) {
                at = q * per + e;
                break;
            }
    }
    free(buf);
    return at;
}

dm_status dm_train_data_check_finite(const dm_train_data *d) {
    if (!d) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_check_finite: NULL argument");
    const int64_t seq = d->x->shape[1], hid = d->x->shape[2];
    for (int q = 0; q < 2; q++) {
        const dm_st_tensor *t = q ? d->y : d->x;
        const int64_t at = first_nonfinite(t, d->n, seq * hid);
        if (at == -2) return dm_fail(DM_ERR_OOM, "out of memory checking the data");
        if (at >= 0)
            return dm_fail(DM_ERR_INVALID_ARG, "%s: %s has a NaN or infinity in sample %" PRId64 " (flat index %" PRId64
                           "): training on it would stop there", d->path, t->name, at / (seq * hid), at);
    }
    if (!d->mask) return DM_OK;
    /* the mask: 0 (padding) or 1 (a token) each, and some token to train on */
    float *m = malloc((size_t)seq * sizeof(float));
    if (!m) return dm_fail(DM_ERR_OOM, "out of memory checking the data");
    dm_status s = DM_OK;
    int64_t kept = 0;
    for (int64_t q = 0; q < d->n && s == DM_OK; q++) {
        s = slice_f32(d->mask, q * seq, seq, m);
        for (int64_t t = 0; s == DM_OK && t < seq; t++) {
            if (m[t] != 0.0f && m[t] != 1.0f)
                s = dm_fail(DM_ERR_INVALID_ARG, "%s: attention_mask holds %g at sample %" PRId64 ", position %" PRId64
                            ": a mask is 1 (a token) or 0 (padding)", d->path, (double)m[t], q, t);
            kept += m[t] == 1.0f;
        }
    }
    free(m);
    if (s == DM_OK && kept == 0)
        s = dm_fail(DM_ERR_INVALID_ARG, "%s: attention_mask is 0 everywhere: no token to train on", d->path);
    return s;
}

/* Step s's batch from the file: samples (s-1)*b .. s*b-1 modulo N (the first of them
 * taken modulo N factor by factor, so that no step overflows). */
dm_status dm_train_data_batch(const dm_train_data *d, int64_t step, int64_t b, float *x, float *y, float *mask) {
    return dm_train_data_batch_part(d, step, b, 0, 1, x, y, mask);
}

dm_status dm_train_data_batch_part(const dm_train_data *d, int64_t step, int64_t b, int part, int parts, float *x,
                                   float *y, float *mask) {
    if (!d || !x || !y || !mask) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_batch: NULL argument");
    if (step < 1 || b < 1)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_batch: step %" PRId64 " of %" PRId64 " samples: steps "
                       "count from 1, batches hold 1 sample or more", step, b);
    if (parts < 1 || part < 0 || part >= parts)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_batch: part %d of %d", part, parts);
    const int64_t j = d->x->shape[1], i = d->x->shape[2];
    const int64_t per = j * i;
    if ((uint64_t)b > (uint64_t)SIZE_MAX / sizeof(float) / (uint64_t)per)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_train_data_batch: a batch of %" PRId64 " samples of (%" PRId64
                       ", %" PRId64 ") overflows the address space", b, j, i);
    /* ((step - 1) * b * parts + part * b) mod n: the global batch's first sample, then
     * this part's (products of two residues below 2^63 fit 128 bits) */
    const __int128 n = d->n, bn = b % d->n, g = bn * parts % n;
    const int64_t first = (int64_t)((((step - 1) % n) * g + (__int128)part * bn) % n);
    for (int64_t q = 0; q < b; q++) {
        const int64_t smp = (first + q % d->n) % d->n;
        DM_TRY(slice_f32(d->x, smp * per, per, x + q * per));
        DM_TRY(slice_f32(d->y, smp * per, per, y + q * per));
        float *m = mask + q * j;
        if (d->mask) {
            DM_TRY(slice_f32(d->mask, smp * j, j, m));
            for (int64_t t = 0; t < j; t++) m[t] = m[t] != 0.0f;
        } else {
            for (int64_t t = 0; t < j; t++) m[t] = 1.0f;
        }
    }
    return DM_OK;
}
