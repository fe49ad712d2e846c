/* test_safetensors.c: the safetensors reader and writer: round trips of every dtype with
 * metadata, atomic writes, every kind of bad file refused with a message, and a
 * deterministic mutation loop (bit flips, byte overwrites, truncations) that must never
 * crash; `make test-asan` runs it under AddressSanitizer and UBSan. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/status.h"
#include "testutil.h"

static char g_dir[512];

static void path_in(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_dir, name);
}

/* Number of entries in the temp dir (excluding . and ..), and whether any is a leftover
 * temporary file of the writer. */
static int dir_entries(int *tmp_leftovers) {
    DIR *d = opendir(g_dir);
    int n = 0;
    *tmp_leftovers = 0;
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        if (strstr(e->d_name, ".tmp.")) (*tmp_leftovers)++;
    }
    closedir(d);
    return n;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            remove_tree(p);
        else if (unlink(p) != 0)
            fprintf(stderr, "warning: cannot remove %s: %s\n", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(dir) != 0) fprintf(stderr, "warning: cannot remove %s: %s\n", dir, strerror(errno));
}

static int write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* A raw file: declared header length, header text, `data_len` bytes of data. */
static unsigned char *raw_file(uint64_t declared, const char *hdr, size_t data_len, size_t *size) {
    size_t h = strlen(hdr);
    *size = 8 + h + data_len;
    unsigned char *b = malloc(*size);
    if (!b) abort();
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)(declared >> (8 * k));
    memcpy(b + 8, hdr, h);
    for (size_t k = 0; k < data_len; k++) b[8 + h + k] = (unsigned char)(k * 37 + 11);
    return b;
}

static int g_bad_cases = 0;

/* The header read alone (dm_st_read_header) of the file holding bytes gives parse's verdict
 * (the data section is never judged by its contents), the same names and shapes, no data,
 * and a read of any non-empty tensor refused. */
static void expect_header_agrees(const void *bytes, size_t size, int parsed_ok) {
    char path[600];
    path_in(path, sizeof path, "header_only.safetensors");
    if (!write_bytes(path, bytes, size)) abort();
    dm_st_file *h = (dm_st_file *)0x1, *f = NULL;
    dm_status s = dm_st_read_header(path, &h);
    CHECK((s == DM_OK) == (parsed_ok != 0));
    if (s != DM_OK) {
        CHECK(h == NULL);
    } else {
        CHECK(dm_st_parse(bytes, size, &f) == DM_OK);
        CHECK(dm_st_count(h) == dm_st_count(f));
        for (int i = 0; i < dm_st_count(h) && i < dm_st_count(f); i++) {
            const dm_st_tensor *a = dm_st_get(h, i), *b = dm_st_get(f, i);
            CHECK(!strcmp(a->name, b->name) && a->dtype == b->dtype && a->ndim == b->ndim);
            CHECK(a->nbytes == b->nbytes && a->data == NULL);
            CHECK(!memcmp(a->shape, b->shape, sizeof a->shape));
            float one;
            if (a->nbytes) CHECK(dm_st_to_f32(a, &one, a->nbytes / dm_st_dtype_size(a->dtype)) != DM_OK);
        }
        dm_st_free(f);
        dm_st_free(h);
    }
    unlink(path);
}

/* Parses bytes that must be refused with a message. */
static void expect_bad(const char *label, const void *bytes, size_t size) {
    dm_st_file *f = (dm_st_file *)0x1;
    dm_clear_error();
    dm_status s = dm_st_parse(bytes, size, &f);
    g_bad_cases++;
    CHECK(s != DM_OK);
    CHECK(f == NULL);
    CHECK(strcmp(dm_last_error(), "no error") != 0 && strlen(dm_last_error()) > 10);
    expect_header_agrees(bytes, size, 0);
    if (s == DM_OK) {
        fprintf(stderr, "FAIL: bad input '%s' was accepted\n", label);
        dm_st_free(f);
    } else {
        printf("  refused %-28s %s: %s\n", label, dm_status_name(s), dm_last_error());
    }
}

static void expect_bad_hdr(const char *label, const char *hdr, size_t data_len) {
    size_t n;
    unsigned char *b = raw_file(strlen(hdr), hdr, data_len, &n);
    expect_bad(label, b, n);
    free(b);
}

/* ------------------------------------------------------------------------------------- */

static void test_round_trip(void) {
    const float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -7e20f};
    const double f64[4] = {1.0, -0.1, 1e300, -1e-300};
    /* 1, -2, 65504 (max), 2^-24 (min subnormal), inf, nan, -0, 0.5 */
    const uint16_t f16[8] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x7e00, 0x8000, 0x3800};
    const uint16_t bf16[3] = {0x3f80, 0xc040, 0x0000}; /* 1, -3, 0 */
    const int64_t i64[3] = {-5, 0, (int64_t)1 << 40};
    const int32_t i32[2] = {-7, 123456};
    const int16_t i16[2] = {-32768, 32767};
    const int8_t i8[3] = {-128, 0, 127};
    const uint8_t u8[2] = {0, 255};
    const uint8_t bl[3] = {1, 0, 1};
    const float scalar = 42.0f;

    dm_st_writer *w = NULL;
    CHECK_OK(dm_st_writer_new(&w));
    if (!w) return;
    /* deliberately odd sizes so later tensors start unaligned */
    CHECK_OK(dm_st_writer_add(w, "u8", DM_ST_U8, 1, (int64_t[]){2}, u8));
    CHECK_OK(dm_st_writer_add(w, "f32", DM_ST_F32, 2, (int64_t[]){2, 3}, f32));
    CHECK_OK(dm_st_writer_add(w, "i8", DM_ST_I8, 1, (int64_t[]){3}, i8));
    CHECK_OK(dm_st_writer_add(w, "f64", DM_ST_F64, 2, (int64_t[]){2, 2}, f64));
    CHECK_OK(dm_st_writer_add(w, "f16", DM_ST_F16, 1, (int64_t[]){8}, f16));
    CHECK_OK(dm_st_writer_add(w, "bf16", DM_ST_BF16, 1, (int64_t[]){3}, bf16));
    CHECK_OK(dm_st_writer_add(w, "i64", DM_ST_I64, 1, (int64_t[]){3}, i64));
    CHECK_OK(dm_st_writer_add(w, "i32", DM_ST_I32, 1, (int64_t[]){2}, i32));
    CHECK_OK(dm_st_writer_add(w, "i16", DM_ST_I16, 1, (int64_t[]){2}, i16));
    CHECK_OK(dm_st_writer_add(w, "bool", DM_ST_BOOL, 1, (int64_t[]){3}, bl));
    CHECK_OK(dm_st_writer_add(w, "scalar", DM_ST_F32, 0, NULL, &scalar));
    CHECK_OK(dm_st_writer_add(w, "empty", DM_ST_F32, 2, (int64_t[]){0, 3}, NULL));
    CHECK_OK(dm_st_writer_add(w, "attention.self.query.weight", DM_ST_F32, 1, (int64_t[]){1},
                              f32));
    CHECK_OK(dm_st_writer_set_metadata(w, "format", "pt"));
    CHECK_OK(dm_st_writer_set_metadata(w, "note", "first"));
    CHECK_OK(dm_st_writer_set_metadata(w, "note", "quote \" and \\ and \xc3\xa9"));

    /* writer refuses bad additions and stays usable */
    CHECK(dm_st_writer_add(w, "f32", DM_ST_F32, 1, (int64_t[]){1}, f32) != DM_OK);
    CHECK(dm_st_writer_add(w, "__metadata__", DM_ST_F32, 1, (int64_t[]){1}, f32) != DM_OK);
    CHECK(dm_st_writer_add(w, "neg", DM_ST_F32, 1, (int64_t[]){-1}, f32) != DM_OK);
    CHECK(dm_st_writer_add(w, "", DM_ST_F32, 1, (int64_t[]){1}, f32) != DM_OK);
    CHECK(dm_st_writer_add(w, "nine", DM_ST_F32, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1},
                           f32) != DM_OK);
    CHECK(dm_st_writer_add(w, "huge", DM_ST_F32, 3,
                           (int64_t[]){INT64_MAX, INT64_MAX, 2}, f32) != DM_OK);
    CHECK(dm_st_writer_add(w, "nodata", DM_ST_F32, 1, (int64_t[]){2}, NULL) != DM_OK);
    CHECK(dm_st_writer_add(w, "baddtype", (dm_st_dtype)99, 1, (int64_t[]){1}, f32) != DM_OK);

    char path[1024];
    path_in(path, sizeof path, "rt.safetensors");
    CHECK_OK(dm_st_writer_write(w, path));
    dm_st_writer_free(w);
    int tmps;
    CHECK(dir_entries(&tmps) == 1);
    CHECK(tmps == 0);

    /* the header is padded so the data section starts 8-aligned */
    FILE *fp = fopen(path, "rb");
    unsigned char lb[8] = {0};
    CHECK(fp && fread(lb, 1, 8, fp) == 8);
    if (fp) fclose(fp);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = (hl << 8) | lb[k];
    CHECK(hl % 8 == 0);

    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(path, &f));
    if (!f) return;
    CHECK(dm_st_count(f) == 13);
    CHECK(dm_st_get(f, -1) == NULL && dm_st_get(f, 13) == NULL);
    CHECK(dm_st_find(f, "nope") == NULL);
    CHECK(dm_st_metadata(f, "format") && !strcmp(dm_st_metadata(f, "format"), "pt"));
    CHECK(dm_st_metadata(f, "note") &&
          !strcmp(dm_st_metadata(f, "note"), "quote \" and \\ and \xc3\xa9"));
    CHECK(dm_st_metadata(f, "absent") == NULL);
    /* insertion order is kept */
    CHECK(dm_st_get(f, 0) && !strcmp(dm_st_get(f, 0)->name, "u8"));
    CHECK(dm_st_get(f, 12) && !strcmp(dm_st_get(f, 12)->name, "attention.self.query.weight"));

    const dm_st_tensor *t;
    float out[16];
    t = dm_st_find(f, "f32");
    CHECK(t && t->dtype == DM_ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t && t->nbytes == 24 && !memcmp(t->data, f32, 24));
    CHECK(t && dm_st_to_f32(t, out, 6) == DM_OK && !memcmp(out, f32, 24));
    CHECK(t && dm_st_to_f32(t, out, 5) == DM_ERR_SHAPE);

    t = dm_st_find(f, "f64");
    CHECK(t && t->dtype == DM_ST_F64 && t->ndim == 2 && t->nbytes == 32);
    CHECK(t && dm_st_to_f32(t, out, 4) == DM_OK);
    CHECK(out[0] == 1.0f && out[1] == -0.1f && isinf(out[2]) && out[2] > 0 && out[3] == -0.0f);

    t = dm_st_find(f, "f16");
    CHECK(t && t->dtype == DM_ST_F16 && dm_st_to_f32(t, out, 8) == DM_OK);
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 65504.0f && out[3] == 0x1p-24f);
    CHECK(isinf(out[4]) && isnan(out[5]) && out[6] == 0.0f && signbit(out[6]) && out[7] == 0.5f);

    t = dm_st_find(f, "bf16");
    CHECK(t && t->dtype == DM_ST_BF16 && dm_st_to_f32(t, out, 3) == DM_OK);
    CHECK(out[0] == 1.0f && out[1] == -3.0f && out[2] == 0.0f);

    t = dm_st_find(f, "i64");
    CHECK(t && t->dtype == DM_ST_I64 && dm_st_to_f32(t, out, 3) == DM_OK);
    CHECK(out[0] == -5.0f && out[1] == 0.0f && out[2] == 0x1p40f);
    t = dm_st_find(f, "i32");
    CHECK(t && dm_st_to_f32(t, out, 2) == DM_OK && out[0] == -7.0f && out[1] == 123456.0f);
    t = dm_st_find(f, "i16");
    CHECK(t && dm_st_to_f32(t, out, 2) == DM_OK && out[0] == -32768.0f && out[1] == 32767.0f);
    t = dm_st_find(f, "i8");
    CHECK(t && dm_st_to_f32(t, out, 3) == DM_OK && out[0] == -128.0f && out[2] == 127.0f);
    t = dm_st_find(f, "u8");
    CHECK(t && dm_st_to_f32(t, out, 2) == DM_OK && out[0] == 0.0f && out[1] == 255.0f);
    t = dm_st_find(f, "bool");
    CHECK(t && t->dtype == DM_ST_BOOL && dm_st_to_f32(t, out, 3) == DM_OK);
    CHECK(out[0] == 1.0f && out[1] == 0.0f && out[2] == 1.0f);
    t = dm_st_find(f, "scalar");
    CHECK(t && t->ndim == 0 && t->nbytes == 4 && dm_st_to_f32(t, out, 1) == DM_OK &&
          out[0] == 42.0f);
    t = dm_st_find(f, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->nbytes == 0 &&
          dm_st_to_f32(t, out, 0) == DM_OK);
    dm_st_free(f);

    /* overwriting an existing file replaces it whole */
    CHECK_OK(dm_st_writer_new(&w));
    CHECK_OK(dm_st_writer_add(w, "only", DM_ST_I32, 1, (int64_t[]){2}, i32));
    CHECK_OK(dm_st_writer_write(w, path));
    dm_st_writer_free(w);
    CHECK_OK(dm_st_read(path, &f));
    CHECK(f && dm_st_count(f) == 1 && dm_st_find(f, "only") && !dm_st_find(f, "f32"));
    CHECK(f && dm_st_metadata(f, "format") == NULL);
    dm_st_free(f);

    /* an empty file (no tensors, no metadata) is valid */
    CHECK_OK(dm_st_writer_new(&w));
    path_in(path, sizeof path, "empty.safetensors");
    CHECK_OK(dm_st_writer_write(w, path));
    dm_st_writer_free(w);
    CHECK_OK(dm_st_read(path, &f));
    CHECK(f && dm_st_count(f) == 0);
    dm_st_free(f);
    CHECK(unlink(path) == 0);
}

static void test_write_failures(void) {
    dm_st_writer *w = NULL;
    float x[2] = {1, 2};
    CHECK_OK(dm_st_writer_new(&w));
    if (!w) return;
    CHECK_OK(dm_st_writer_add(w, "x", DM_ST_F32, 1, (int64_t[]){2}, x));
    char path[1024];
    int before, after, tmps;
    before = dir_entries(&tmps);

    /* a directory that does not exist */
    path_in(path, sizeof path, "no/such/dir/out.safetensors");
    dm_clear_error();
    CHECK(dm_st_writer_write(w, path) == DM_ERR_IO);
    printf("  write into missing dir: %s\n", dm_last_error());
    after = dir_entries(&tmps);
    CHECK(after == before && tmps == 0);

    /* the target is a directory: rename fails, the temp file is removed */
    path_in(path, sizeof path, "adir");
    CHECK(mkdir(path, 0700) == 0);
    char inner[1100];
    snprintf(inner, sizeof inner, "%s/keep", path);
    CHECK(write_bytes(inner, "k", 1));
    before = dir_entries(&tmps);
    dm_clear_error();
    CHECK(dm_st_writer_write(w, path) == DM_ERR_IO);
    printf("  write over a directory: %s\n", dm_last_error());
    after = dir_entries(&tmps);
    CHECK(after == before && tmps == 0);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    dm_st_writer_free(w);
}

static void test_read_failures(void) {
    char path[1024];
    dm_st_file *f = NULL;

    path_in(path, sizeof path, "missing.safetensors");
    dm_clear_error();
    CHECK(dm_st_read(path, &f) == DM_ERR_IO && f == NULL);
    CHECK(strstr(dm_last_error(), "missing.safetensors") != NULL);
    printf("  refused %-28s %s\n", "missing file", dm_last_error());

    path_in(path, sizeof path, "empty.bin");
    CHECK(write_bytes(path, "", 0));
    dm_clear_error();
    CHECK(dm_st_read(path, &f) == DM_ERR_FORMAT && f == NULL);
    CHECK(strstr(dm_last_error(), "empty") != NULL);
    printf("  refused %-28s %s\n", "empty file (read)", dm_last_error());

    path_in(path, sizeof path, "short.bin");
    CHECK(write_bytes(path, "\x10\0\0", 3));
    dm_clear_error();
    CHECK(dm_st_read(path, &f) == DM_ERR_FORMAT && f == NULL);
    printf("  refused %-28s %s\n", "3-byte file (read)", dm_last_error());

    dm_clear_error();
    CHECK(dm_st_read(g_dir, &f) == DM_ERR_IO && f == NULL);
    printf("  refused %-28s %s\n", "a directory", dm_last_error());

    CHECK(dm_st_read(NULL, &f) != DM_OK);
    CHECK(dm_st_parse(NULL, 5, &f) != DM_OK);
}

static void test_bad_inputs(void) {
    size_t n;
    unsigned char *b;
    const char *ok1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";

    expect_bad("empty", "", 0);
    expect_bad("shorter than 8 bytes", "\x02\0\0\0\0", 5);
    b = raw_file(1000, ok1, 8, &n);
    expect_bad("header length > file", b, n);
    free(b);
    b = raw_file(UINT64_MAX, ok1, 8, &n);
    expect_bad("header length 2^64-1", b, n);
    free(b);
    b = raw_file(200u * 1000 * 1000, ok1, 8, &n);
    expect_bad("header length 200 MB", b, n);
    free(b);
    b = raw_file(0, ok1, 8, &n);
    expect_bad("header length 0", b, n);
    free(b);
    b = raw_file(strlen(ok1), ok1, 7, &n);
    expect_bad("truncated data", b, n);
    free(b);
    b = raw_file(strlen(ok1), ok1, 9, &n);
    expect_bad("data after the last tensor", b, n);
    free(b);
    /* the same header declared one byte short: JSON cut off */
    b = raw_file(strlen(ok1) - 1, ok1, 8, &n);
    expect_bad("header length 1 short", b, n);
    free(b);

    expect_bad_hdr("corrupted JSON", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_off", 8);
    expect_bad_hdr("JSON array", "[1, 2, 3]", 0);
    expect_bad_hdr("JSON string", "\"abc\"", 0);
    expect_bad_hdr("garbage after JSON", "{}  x", 0);
    expect_bad_hdr("two objects", "{}{}", 0);
    {
        const char hdr[8] = {'{', '}', ' ', 0, 'x', ' ', ' ', ' '};
        unsigned char buf[16] = {8, 0, 0, 0, 0, 0, 0, 0};
        memcpy(buf + 8, hdr, 8);
        expect_bad("NUL byte inside header", buf, 16);
    }
    expect_bad_hdr("unknown dtype",
                   "{\"a\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    expect_bad_hdr("dtype not a string",
                   "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_bad_hdr("missing dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_bad_hdr("missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8);
    expect_bad_hdr("missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8);
    expect_bad_hdr("entry not an object", "{\"a\":[1,2]}", 0);
    expect_bad_hdr("shape not an array",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8);
    expect_bad_hdr("shape/offset mismatch",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12);
    expect_bad_hdr("dtype size mismatch",
                   "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_bad_hdr("offsets outside file",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}", 16);
    expect_bad_hdr("offsets end < begin",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8);
    expect_bad_hdr("negative offset",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8);
    expect_bad_hdr("three offsets",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4);
    expect_bad_hdr("offsets as strings",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 4);
    expect_bad_hdr("overlapping offsets",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12);
    expect_bad_hdr("identical offsets",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                   8);
    expect_bad_hdr("hole between tensors",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                   12);
    expect_bad_hdr("duplicate names",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   8);
    expect_bad_hdr("duplicate __metadata__",
                   "{\"__metadata__\":{},\"__metadata__\":{}}", 0);
    expect_bad_hdr("duplicate metadata key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0);
    expect_bad_hdr("metadata not an object", "{\"__metadata__\":[\"x\"]}", 0);
    expect_bad_hdr("metadata value a number", "{\"__metadata__\":{\"k\":1}}", 0);
    expect_bad_hdr("negative dim",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0);
    expect_bad_hdr("fractional dim",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", 6);
    expect_bad_hdr("dim 1e300",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4);
    expect_bad_hdr("dim 1e400 (inf)",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e400],\"data_offsets\":[0,4]}}", 4);
    expect_bad_hdr("overflowing shape product",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                   "\"data_offsets\":[0,4]}}",
                   4);
    expect_bad_hdr("overflowing byte count",
                   "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],"
                   "\"data_offsets\":[0,0]}}",
                   0);
    expect_bad_hdr("9 dims",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                   "\"data_offsets\":[0,4]}}",
                   4);
    expect_bad_hdr("dim is a string",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8);
    expect_bad_hdr("zero dim but bytes",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4);

    /* deeply nested JSON: cJSON's nesting limit, not our stack */
    {
        size_t depth = 5000;
        char *h = malloc(2 * depth + 32);
        if (!h) abort();
        size_t p = 0;
        p += (size_t)sprintf(h + p, "{\"__metadata__\":");
        for (size_t k = 0; k < depth; k++) h[p++] = '[';
        for (size_t k = 0; k < depth; k++) h[p++] = ']';
        h[p++] = '}';
        h[p] = 0;
        expect_bad_hdr("nesting 5000 deep", h, 0);
        free(h);
    }
    /* a control character in a name is printed safely */
    expect_bad_hdr("control chars in name",
                   "{\"a\\u0001\\u001b[31m\":"
                   "{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}",
                   0);
}

/* A valid file of a few tensors and metadata, for the mutation loop. */
static unsigned char *valid_file(size_t *size) {
    dm_st_writer *w = NULL;
    char path[1024];
    float a[6] = {1, 2, 3, 4, 5, 6};
    int64_t c[2] = {7, 8};
    uint16_t h[3] = {0x3c00, 0x4000, 0x4200};
    if (dm_st_writer_new(&w)) abort();
    if (dm_st_writer_set_metadata(w, "format", "pt") ||
        dm_st_writer_add(w, "hidden_states", DM_ST_F32, 3, (int64_t[]){1, 2, 3}, a) ||
        dm_st_writer_add(w, "ids", DM_ST_I64, 1, (int64_t[]){2}, c) ||
        dm_st_writer_add(w, "h", DM_ST_F16, 1, (int64_t[]){3}, h) ||
        dm_st_writer_add(w, "m", DM_ST_BOOL, 2, (int64_t[]){1, 2}, "\1\0"))
        abort();
    path_in(path, sizeof path, "valid.safetensors");
    if (dm_st_writer_write(w, path)) abort();
    dm_st_writer_free(w);
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    unsigned char *b = malloc(4096);
    *size = fread(b, 1, 4096, f);
    fclose(f);
    unlink(path);
    return b;
}

/* Parses mutated bytes; when accepted, touches every tensor's data. */
static int parse_and_touch(const unsigned char *b, size_t n) {
    dm_st_file *f = NULL;
    if (dm_st_parse(b, n, &f) != DM_OK) {
        CHECK(f == NULL);
        expect_header_agrees(b, n, 0);
        return 0;
    }
    expect_header_agrees(b, n, 1);
    for (int i = 0; i < dm_st_count(f); i++) {
        const dm_st_tensor *t = dm_st_get(f, i);
        size_t es = dm_st_dtype_size(t->dtype), ne = t->nbytes / es;
        float *tmp = malloc(ne ? ne * sizeof *tmp : 1);
        if (!tmp) abort();
        CHECK(dm_st_to_f32(t, tmp, ne) == DM_OK);
        CHECK(dm_st_find(f, t->name) == t);
        free(tmp);
    }
    dm_st_free(f);
    return 1;
}

static void test_mutations(void) {
    size_t n;
    unsigned char *orig = valid_file(&n);
    unsigned char *b = malloc(n);
    if (!b) abort();
    CHECK(parse_and_touch(orig, n) == 1);

    /* every truncation loses data bytes, so every one must be refused */
    int accepted_trunc = 0;
    for (size_t len = 0; len < n; len++) accepted_trunc += parse_and_touch(orig, len);
    CHECK(accepted_trunc == 0);

    /* single-byte changes at every position */
    const int kinds = 8;
    int tried = 0, accepted = 0;
    for (size_t p = 0; p < n; p++) {
        for (int k = 0; k < kinds; k++) {
            memcpy(b, orig, n);
            switch (k) {
            case 0: b[p] ^= 0x01; break;
            case 1: b[p] ^= 0x80; break;
            case 2: b[p] = 0x00; break;
            case 3: b[p] = 0xff; break;
            case 4: b[p] = '9'; break;
            case 5: b[p] = '"'; break;
            case 6: b[p] = '-'; break;
            case 7: b[p] = '}'; break;
            }
            tried++;
            accepted += parse_and_touch(b, n);
        }
    }
    /* random multi-byte changes (a fixed LCG, so runs are identical) */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 20000; it++) {
        memcpy(b, orig, n);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int changes = 1 + (int)((s >> 33) % 4);
        for (int c = 0; c < changes; c++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t p = (size_t)((s >> 33) % n);
            b[p] = (unsigned char)(s >> 24);
        }
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = (s >> 40) % 8 == 0 ? (size_t)((s >> 20) % n) : n;
        tried++;
        accepted += parse_and_touch(b, len);
    }
    printf("  mutations: %d parsed, %d accepted (data bytes or names changed), %zu truncations "
           "refused\n",
           tried, accepted, n);
    CHECK(accepted < tried);
    free(b);
    free(orig);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/dmove_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "cannot create a temporary directory under %s: %s\n",
                tmp && *tmp ? tmp : "/tmp", strerror(errno));
        return 1;
    }
    test_round_trip();
    test_write_failures();
    test_read_failures();
    test_bad_inputs();
    test_mutations();
    printf("  %d bad inputs refused\n", g_bad_cases);
    remove_tree(g_dir);
    TEST_END();
}
