/* test_tools.c: the public API of dmove_tools.h used as a program outside dmove would
 * use it (only include/ headers): tensor files written and read back, the parameter
 * table, device models and the roofline, the analysis and its reports, a training run's
 * data (batches, wrapping, checks) and teacher (deterministic batches), and a CPU layer's
 * backend report. The CLI tests (the tests/ shell scripts) run the same functions through `dmove`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dmove.h"
#include "dmove_tools.h"
#include "testutil.h"

static char g_dir[] = "/tmp/dmove_tools.XXXXXX";

/* Allocation failures on demand: the Makefile links this test with the C library's malloc,
 * calloc, realloc and strdup wrapped (-Wl,--wrap), dmove's calls to them included.
 * fail_alloc(n): the allocation n from now (0: the next one) fails, once; -1: none. */
static long g_alloc_left = -1;
static void fail_alloc(long n) { __atomic_store_n(&g_alloc_left, n, __ATOMIC_SEQ_CST); }
static int alloc_fails(void) {
    return __atomic_load_n(&g_alloc_left, __ATOMIC_SEQ_CST) >= 0 &&
           __atomic_fetch_sub(&g_alloc_left, 1, __ATOMIC_SEQ_CST) == 0;
}
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n) { return alloc_fails() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return alloc_fails() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return alloc_fails() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return alloc_fails() ? NULL : __real_strdup(s); }

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static void test_tensor_file(void) {
    char path[256];
    path_of(path, sizeof path, "t.safetensors");
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {-1.5f, 0.25f};
    dm_tensor_writer *w = NULL;
    CHECK_OK(dm_tensor_writer_new(&w));
    CHECK_OK(dm_tensor_writer_add_f32(w, "a", 2, (int64_t[]){2, 3}, a));
    CHECK_OK(dm_tensor_writer_add_f32(w, "b", 1, (int64_t[]){2}, b));
    CHECK_OK(dm_tensor_writer_set_metadata(w, "heads", "4"));
    CHECK_OK(dm_tensor_writer_write(w, path));
    dm_tensor_writer_free(w);

    dm_tensor_file *f = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    if (!f) return;
    CHECK(dm_tensor_file_count(f) == 2);
    CHECK(!strcmp(dm_tensor_file_path(f), path));
    CHECK(dm_tensor_file_find(f, "c") == -1);
    const int ka = dm_tensor_file_find(f, "a");
    CHECK(ka >= 0);
    dm_tensor_info t;
    CHECK_OK(dm_tensor_file_info(f, ka, &t));
    CHECK(!strcmp(t.name, "a") && t.dtype == DM_FILE_F32 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
    CHECK(!strcmp(dm_file_dtype_name(t.dtype), "F32"));
    float got[6] = {0};
    CHECK_OK(dm_tensor_file_read_f32(f, ka, got, 6));
    CHECK(!memcmp(got, a, sizeof a));
    CHECK(dm_tensor_file_read_f32(f, ka, got, 5) != DM_OK); /* the element count must match */
    CHECK(dm_tensor_file_info(f, 2, &t) != DM_OK);
    CHECK(dm_tensor_file_metadata(f, "heads") && !strcmp(dm_tensor_file_metadata(f, "heads"), "4"));
    CHECK(dm_tensor_file_metadata(f, "seed") == NULL);
    dm_tensor_file_free(f);
    path_of(path, sizeof path, "missing.safetensors");
    f = (dm_tensor_file *)1;
    CHECK(dm_tensor_file_open(&f, path) != DM_OK && f == NULL);
}

static void test_param_specs(void) {
    CHECK(dm_param_spec_count() == 16);
    int weights = 0;
    for (int k = 0; k < dm_param_spec_count(); k++) {
        dm_param_spec p;
        CHECK_OK(dm_param_spec_get(k, &p));
        weights += p.ndim == 2;
        if (!strcmp(p.name, "intermediate.dense.weight")) CHECK(p.ndim == 2 && p.dims[0] == 'u' && p.dims[1] == 'i');
        if (!strcmp(p.name, "output.dense.weight")) CHECK(p.ndim == 2 && p.dims[0] == 'i' && p.dims[1] == 'u');
        if (!strcmp(p.name, "intermediate.dense.bias")) CHECK(p.ndim == 1 && p.dims[0] == 'u');
        if (!strcmp(p.name, "attention.self.query.weight")) CHECK(p.ndim == 2 && p.dims[0] == 'i' && p.dims[1] == 'i');
    }
    CHECK(weights == 6);
    dm_param_spec p;
    CHECK(dm_param_spec_get(16, &p) != DM_OK);
}

static void test_device_and_analysis(void) {
    dm_device_model *m = NULL;
    CHECK(dm_device_model_preset(&m, "h99") != DM_OK && m == NULL);
    CHECK_OK(dm_device_model_preset(&m, "h100"));
    if (!m) return;
    CHECK(!strcmp(dm_device_model_name(m), "h100") && !dm_device_model_is_cpu(m));
    CHECK(dm_device_model_contract_peak(m, 2) > dm_device_model_contract_peak(m, 4));
    const double bw = dm_device_model_bandwidth(m);
    CHECK(bw > 0 && dm_device_model_vector_peak(m, 4) > 0);
    /* one flop and a gigabyte: memory-bound, the bytes at the bandwidth */
    CHECK(fabs(dm_device_model_roofline(m, 4, 0, 1, 1e9) - 1e9 / bw) < 1e-12);

    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32;
    dm_analysis *a = NULL;
    CHECK(dm_analysis_new(&a, &cfg, m, 3, 0) != DM_OK && a == NULL);
    CHECK_OK(dm_analysis_new(&a, &cfg, m, 2, 0));
    if (a) {
        const int nops = dm_analysis_num_ops(a);
        CHECK(nops > 20);
        char *text = NULL;
        CHECK_OK(dm_analysis_table(a, &text));
        CHECK(text && !strncmp(text, "dmove analyze: b=2 j=8 i=16 h=2 u=32, bf16/fp16,", 48) &&
              strstr(text, "memory between the passes"));
        free(text);
        text = NULL;
        CHECK_OK(dm_analysis_json(a, &text));
        CHECK(text && text[0] == '{' && strstr(text, "\"memory\"") && !strstr(text, "\"plan\""));
        free(text);
        text = NULL;
        CHECK_OK(dm_analysis_csv(a, &text));
        int lines = 0;
        for (const char *c = text; c && *c; c++) lines += *c == '\n';
        CHECK(lines == nops + 1); /* a header and one line per operator */
        free(text);
        text = NULL;
        CHECK(dm_analysis_plan_text(a, &text) != DM_OK && !text); /* no plan applied */
        dm_analysis_free(a);
    }
    double un = 0, fu = 0;
    CHECK_OK(dm_analysis_floors(&cfg, m, 2, 0, &un, &fu));
    CHECK(un > 0 && fu > 0 && fu < un);
    dm_device_model_free(m);
}

/* A data file of n samples of (j, i) whose values say where they come from; the mask's
 * tokens are mask_one (1: valid; anything else a mask refuses). */
static float mask_one = 1.0f;
static void write_data(const char *path, int n, int j, int i, int nan_at, int with_target) {
    float *x = malloc(sizeof(float) * (size_t)(n * j * i)), *y = malloc(sizeof(float) * (size_t)(n * j * i));
    float *m = malloc(sizeof(float) * (size_t)(n * j));
    for (int e = 0; e < n * j * i; e++) x[e] = (float)e, y[e] = -(float)e;
    for (int e = 0; e < n * j; e++) m[e] = e % j < j - 1 ? mask_one : 0.0f; /* 1: a token (else refused) */
    if (nan_at >= 0) y[nan_at] = NAN;
    dm_tensor_writer *w = NULL;
    CHECK_OK(dm_tensor_writer_new(&w));
    CHECK_OK(dm_tensor_writer_add_f32(w, "hidden_states", 3, (int64_t[]){n, j, i}, x));
    if (with_target) CHECK_OK(dm_tensor_writer_add_f32(w, "target", 3, (int64_t[]){n, j, i}, y));
    CHECK_OK(dm_tensor_writer_add_f32(w, "attention_mask", 2, (int64_t[]){n, j}, m));
    CHECK_OK(dm_tensor_writer_write(w, path));
    dm_tensor_writer_free(w);
    free(x);
    free(y);
    free(m);
}

static void test_train_data(void) {
    enum { N = 3, J = 4, I = 8 };
    char path[256];
    path_of(path, sizeof path, "data.safetensors");
    write_data(path, N, J, I, -1, 1);
    dm_tensor_file *f = NULL;
    dm_train_data *d = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    CHECK_OK(dm_train_data_new(&d, f));
    if (d) {
        int64_t n, j, i;
        dm_train_data_sizes(d, &n, &j, &i);
        CHECK(n == N && j == J && i == I);
        CHECK_OK(dm_train_data_check_dtypes(d));
        CHECK_OK(dm_train_data_check_finite(d));
        float x[2 * J * I], y[2 * J * I], m[2 * J];
        /* step 2 of batches of 2: samples 2 and 0 (wrapping around) */
        CHECK_OK(dm_train_data_batch(d, 2, 2, x, y, m));
        CHECK(x[0] == (float)(2 * J * I) && y[1] == -(float)(2 * J * I + 1) && x[J * I] == 0.0f);
        CHECK(m[0] == 1.0f && m[J - 1] == 0.0f && m[J] == 1.0f);
        /* steps from 1, batches of 1 sample or more, every buffer given: anything else is
         * refused before a byte is read (step 0 read before the data, b 0 or below too) */
        const int64_t bad[][2] = {{0, 2}, {-5, 2}, {INT64_MIN, 1}, {1, 0}, {1, -1}, {2, INT64_MIN}};
        for (int k = 0; k < 6; k++)
            CHECK(dm_train_data_batch(d, bad[k][0], bad[k][1], x, y, m) == DM_ERR_INVALID_ARG &&
                  strstr(dm_last_error(), "dm_train_data_batch: step"));
        CHECK(dm_train_data_batch(d, 1, INT64_MAX, x, y, m) == DM_ERR_INVALID_ARG &&
              strstr(dm_last_error(), "overflows"));
        CHECK(dm_train_data_batch(NULL, 1, 1, x, y, m) == DM_ERR_INVALID_ARG &&
              strstr(dm_last_error(), "dm_train_data_batch: NULL argument"));
        CHECK(dm_train_data_batch(d, 1, 1, NULL, y, m) == DM_ERR_INVALID_ARG);
        CHECK(dm_train_data_batch(d, 1, 1, x, NULL, m) == DM_ERR_INVALID_ARG);
        CHECK(dm_train_data_batch(d, 1, 1, x, y, NULL) == DM_ERR_INVALID_ARG);
        /* a step far on wraps around as a near one does: step s of 2 takes samples
         * 2(s-1) mod 3 and 2(s-1)+1 mod 3 (INT64_MAX - 1 = 3 * 3074457345618258602) */
        CHECK_OK(dm_train_data_batch(d, INT64_MAX, 2, x, y, m));
        CHECK(x[0] == 0.0f && x[J * I] == (float)(J * I));
        CHECK_OK(dm_train_data_batch(d, INT64_MAX - 1, 2, x, y, m));
        CHECK(x[0] == (float)(J * I) && x[J * I] == (float)(2 * J * I));
        /* the sizes of nothing are 0; NULL outputs are not wanted */
        dm_train_data_sizes(d, NULL, NULL, NULL);
        n = j = i = 9;
        dm_train_data_sizes(NULL, &n, &j, &i);
        CHECK(n == 0 && j == 0 && i == 0);
        CHECK(dm_train_data_check_dtypes(NULL) == DM_ERR_INVALID_ARG &&
              strstr(dm_last_error(), "dm_train_data_check_dtypes: NULL argument"));
        CHECK(dm_train_data_check_finite(NULL) == DM_ERR_INVALID_ARG &&
              strstr(dm_last_error(), "dm_train_data_check_finite: NULL argument"));
        dm_train_data_free(d);
    }
    dm_tensor_file_free(f);
    /* a NaN in the targets is found when the data is checked, with its sample */
    write_data(path, N, J, I, J * I + 5, 1);
    f = NULL, d = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    CHECK_OK(dm_train_data_new(&d, f));
    CHECK(d && dm_train_data_check_finite(d) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "sample 1 "));
    dm_train_data_free(d);
    dm_tensor_file_free(f);
    /* a mask of another value than 0 and 1 is refused when the data is checked, where */
    mask_one = 2.0f;
    write_data(path, N, J, I, -1, 1);
    f = NULL, d = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    CHECK_OK(dm_train_data_new(&d, f));
    CHECK(d && dm_train_data_check_finite(d) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "attention_mask holds 2 at sample 0, position 0"));
    dm_train_data_free(d);
    dm_tensor_file_free(f);
    mask_one = 1.0f;
    /* no target: refused, naming what is missing */
    write_data(path, N, J, I, -1, 0);
    f = NULL, d = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    CHECK(dm_train_data_new(&d, f) != DM_OK && !d && strstr(dm_last_error(), "target is missing"));
    dm_tensor_file_free(f);
    /* no samples: refused when opened (a batch would take them modulo 0) */
    write_data(path, 0, J, I, -1, 1);
    f = NULL, d = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    CHECK(f && dm_train_data_new(&d, f) == DM_ERR_SHAPE && !d && strstr(dm_last_error(), "need a sample"));
    dm_tensor_file_free(f);
    d = (dm_train_data *)1;
    CHECK(dm_train_data_new(&d, NULL) == DM_ERR_INVALID_ARG && d == NULL);
    CHECK(dm_train_data_new(NULL, NULL) == DM_ERR_INVALID_ARG);
    dm_train_data_free(NULL);
}

static void test_teacher_and_layer(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32, cfg.seed = 7;
    const dm_layer_options opt = {.threads = 1};
    enum { N = 2 * 8 * 16 };
    dm_teacher *t = NULL;
    CHECK_OK(dm_teacher_new(&t, &cfg, 1, &opt, 5.0));
    if (t) {
        static float x1[N], y1[N], m1[16], x2[N], y2[N], m2[16];
        CHECK_OK(dm_teacher_batch(t, 3, x1, y1, m1));
        CHECK_OK(dm_teacher_batch(t, 4, x2, y2, m2));
        CHECK(memcmp(x1, x2, sizeof x1) != 0);
        CHECK_OK(dm_teacher_batch(t, 3, x2, y2, m2)); /* the same step, the same batch */
        CHECK(!memcmp(x1, x2, sizeof x1) && !memcmp(y1, y2, sizeof y1) && !memcmp(m1, m2, sizeof m1));
        int finite = 1, whole = 1;
        for (int e = 0; e < N; e++) finite &= isfinite(y1[e]) && y1[e] != x1[e];
        for (int e = 0; e < 8; e++) whole &= m1[e] == 1.0f; /* the first sequence has no padding */
        CHECK(finite && whole);
        CHECK(dm_teacher_batch(t, 0, x2, y2, m2) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "from 1"));
        CHECK(dm_teacher_batch(t, -1, x2, y2, m2) == DM_ERR_INVALID_ARG);
        CHECK(dm_teacher_batch(NULL, 1, x2, y2, m2) == DM_ERR_INVALID_ARG &&
              strstr(dm_last_error(), "dm_teacher_batch: NULL argument"));
        CHECK(dm_teacher_batch(t, 1, NULL, y2, m2) == DM_ERR_INVALID_ARG);
        CHECK(dm_teacher_batch(t, 1, x2, NULL, m2) == DM_ERR_INVALID_ARG);
        CHECK(dm_teacher_batch(t, 1, x2, y2, NULL) == DM_ERR_INVALID_ARG);
        CHECK_OK(dm_teacher_batch(t, INT64_MAX, x2, y2, m2)); /* far steps too (counters wrap) */
        dm_teacher_free(t);
    }
    dm_layer *L = NULL;
    CHECK_OK(dm_layer_new(&L, &cfg, &opt));
    if (L) {
        char note[64] = "x";
        CHECK(dm_layer_note_value(L, "row_programs", 0) == 0 && dm_layer_note_value(L, "no such", 0) == 0);
        snprintf(note, sizeof note, "%s", dm_layer_note_text(L, "gen_unavailable"));
        CHECK(note[0] == 0);
        dm_layer_free(L);
    }
    dm_layer_options e;
    CHECK_OK(dm_layer_options_resolve(&opt, &e));
    CHECK(e.threads == 1 && e.device == DM_DEVICE_CPU);
}

/* The tuner's repetitions: 1 to 63, as `dmove tune --reps` takes them (0 left the median
 * unset, a negative count crashed the sort, more than 64 were cut silently). */
static void test_tuning_reps(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 4, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 16;
    const dm_layer_options opt = {.threads = 1};
    const int bad[] = {0, -1, 64, 1000};
    for (int k = 0; k < 4; k++) {
        dm_tuning *t = (dm_tuning *)1;
        CHECK(dm_tuning_new(&t, &cfg, &opt, bad[k]) == DM_ERR_INVALID_ARG && t == NULL &&
              strstr(dm_last_error(), "reps") && strstr(dm_last_error(), "1 to 63"));
    }
    dm_tuning *t = NULL;
    CHECK_OK(dm_tuning_new(&t, &cfg, &opt, 63));
    dm_tuning_free(t);
    t = NULL;
    CHECK_OK(dm_tuning_new(&t, &cfg, &opt, 1));
    if (t) {
        CHECK_OK(dm_tuning_measure(t, NULL, NULL, NULL)); /* one timed run per candidate */
        CHECK_OK(dm_tuning_select(t));
        dm_tuning_info info;
        dm_tuning_get_info(t, &info);
        CHECK(info.reps == 1 && info.retime_runs == 1 && info.tuned_s > 0 && info.default_s > 0);
        dm_tuning_free(t);
    }
}

/* A tuned plan applied to an analysis: a failure at any step (here: each allocation of
 * dm_analysis_load_plan in turn) leaves the analysis as it was, its reports the same and
 * no plan applied, and a later try applies it (it was marked applied before the plan was
 * complete: the reports then read a missing path and missing pairs). */
static void test_analysis_load_plan(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 4, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 8;
    char plan[256], missing[256];
    path_of(plan, sizeof plan, "plan.json");
    path_of(missing, sizeof missing, "no-plan.json");
    /* a plan with side-by-side pairs (the tuner's test hook keeps them) */
    const dm_layer_options opt = {.threads = 2};
    dm_tuning *t = NULL;
    CHECK_OK(dm_tuning_new(&t, &cfg, &opt, 1));
    if (!t) return;
    setenv("DMOVE_TEST_PAIRS", "keep", 1);
    CHECK_OK(dm_tuning_measure(t, NULL, NULL, NULL));
    CHECK_OK(dm_tuning_select(t));
    CHECK_OK(dm_tuning_pairs(t));
    unsetenv("DMOVE_TEST_PAIRS");
    CHECK_OK(dm_tuning_save(t, plan));
    dm_tuning_free(t);

    dm_device_model *m = NULL;
    CHECK_OK(dm_device_model_preset(&m, "v100"));
    dm_analysis *a = NULL, *b = NULL;
    if (m) CHECK_OK(dm_analysis_new(&a, &cfg, m, 4, 0));
    if (m) CHECK_OK(dm_analysis_new(&b, &cfg, m, 4, 0));
    if (a && b) {
        char *json0 = NULL, *table0 = NULL, *text = NULL;
        CHECK_OK(dm_analysis_json(a, &json0));
        CHECK_OK(dm_analysis_table(a, &table0));
        CHECK(dm_analysis_load_plan(a, missing) == DM_ERR_NOT_FOUND && strstr(dm_last_error(), "cannot open plan"));
        int failures = 0, same = 1;
        dm_status s = DM_ERR_OOM;
        for (long k = 0; k < 100000 && s != DM_OK; k++) {
            fail_alloc(k);
            s = dm_analysis_load_plan(a, plan);
            fail_alloc(-1);
            if (s == DM_OK) break;
            failures++;
            CHECK(s == DM_ERR_OOM);
            /* as it was: the same reports, no plan */
            char *j = NULL, *tb = NULL;
            CHECK_OK(dm_analysis_json(a, &j));
            CHECK_OK(dm_analysis_table(a, &tb));
            same &= j && tb && json0 && table0 && !strcmp(j, json0) && !strcmp(tb, table0);
            free(j);
            free(tb);
            text = NULL;
            CHECK(dm_analysis_plan_text(a, &text) == DM_ERR_INVALID_ARG && !text &&
                  strstr(dm_last_error(), "no plan applied"));
        }
        CHECK(s == DM_OK && failures >= 5 && same);
        /* applied after all those failures as on an analysis that never failed */
        CHECK_OK(dm_analysis_load_plan(b, plan));
        char *ja = NULL, *jb = NULL, *ta = NULL, *tb = NULL;
        CHECK_OK(dm_analysis_json(a, &ja));
        CHECK_OK(dm_analysis_json(b, &jb));
        CHECK(ja && jb && !strcmp(ja, jb) && strstr(ja, "\"plan\"") && strstr(ja, "\"side_by_side\"") &&
              strstr(ja, plan));
        CHECK_OK(dm_analysis_plan_text(a, &ta));
        CHECK_OK(dm_analysis_plan_text(b, &tb));
        CHECK(ta && tb && !strcmp(ta, tb) && strstr(ta, plan) && strstr(ta, "runs beside"));
        free(ja), free(jb), free(ta), free(tb);
        /* once applied, a second plan is refused and the first stays */
        CHECK(dm_analysis_load_plan(a, plan) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "applied already"));
        CHECK(dm_analysis_load_plan(NULL, plan) == DM_ERR_INVALID_ARG);
        CHECK(dm_analysis_load_plan(a, NULL) == DM_ERR_INVALID_ARG);
        free(json0);
        free(table0);
    }
    dm_analysis_free(a);
    dm_analysis_free(b);
    dm_device_model_free(m);
}

/* A NULL handle, out-pointer or required string: DM_ERR_INVALID_ARG naming the function
 * (constructors leave *out NULL); the value functions give their neutral values. */
#define CHECK_NULL_ARG(call, fn) CHECK((call) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), fn ": NULL argument"))

static void test_null_arguments_files_devices(void) {
    char path[256], buf[64];
    path_of(path, sizeof path, "null.safetensors");
    /* helpers */
    dm_fmt_exact(NULL, 8, 0.1);
    dm_fmt_exact(buf, 0, 0.1);
    dm_cpu_model_name(NULL, 8, "x");
    dm_cpu_model_name(buf, sizeof buf, NULL);
    CHECK(!strcmp(dm_ratio_text(2.0, NULL, 8), "") && !strcmp(dm_ratio_text(2.0, buf, 0), ""));
    CHECK_NULL_ARG(dm_param_spec_get(0, NULL), "dm_param_spec_get");
    /* tensor files */
    dm_tensor_writer *w = (dm_tensor_writer *)1;
    CHECK_NULL_ARG(dm_tensor_writer_new(NULL), "dm_tensor_writer_new");
    CHECK_OK(dm_tensor_writer_new(&w));
    const float one = 1;
    CHECK_NULL_ARG(dm_tensor_writer_add_f32(NULL, "a", 1, (int64_t[]){1}, &one), "dm_tensor_writer_add_f32");
    CHECK_NULL_ARG(dm_tensor_writer_add_f32(w, NULL, 1, (int64_t[]){1}, &one), "dm_tensor_writer_add_f32");
    CHECK(dm_tensor_writer_add_f32(w, "a", 1, NULL, &one) == DM_ERR_INVALID_ARG);
    CHECK(dm_tensor_writer_add_f32(w, "a", 1, (int64_t[]){1}, NULL) == DM_ERR_INVALID_ARG);
    CHECK_NULL_ARG(dm_tensor_writer_set_metadata(NULL, "k", "v"), "dm_tensor_writer_set_metadata");
    CHECK_NULL_ARG(dm_tensor_writer_set_metadata(w, NULL, "v"), "dm_tensor_writer_set_metadata");
    CHECK_NULL_ARG(dm_tensor_writer_set_metadata(w, "k", NULL), "dm_tensor_writer_set_metadata");
    CHECK_OK(dm_tensor_writer_add_f32(w, "a", 1, (int64_t[]){1}, &one));
    CHECK_NULL_ARG(dm_tensor_writer_write(NULL, path), "dm_tensor_writer_write");
    CHECK_NULL_ARG(dm_tensor_writer_write(w, NULL), "dm_tensor_writer_write");
    CHECK_OK(dm_tensor_writer_write(w, path));
    dm_tensor_writer_free(w);
    dm_tensor_writer_free(NULL);
    dm_tensor_file *f = (dm_tensor_file *)1;
    CHECK_NULL_ARG(dm_tensor_file_open(&f, NULL), "dm_tensor_file_open");
    CHECK(f == NULL);
    CHECK_NULL_ARG(dm_tensor_file_open(NULL, path), "dm_tensor_file_open");
    CHECK_OK(dm_tensor_file_open(&f, path));
    dm_tensor_info ti;
    float got = 0;
    CHECK(dm_tensor_file_find(f, NULL) == -1 && dm_tensor_file_find(NULL, "a") == -1 && dm_tensor_file_find(f, "a") == 0);
    CHECK(dm_tensor_file_count(NULL) == 0 && dm_tensor_file_path(NULL) == NULL);
    CHECK(dm_tensor_file_metadata(NULL, "k") == NULL && dm_tensor_file_metadata(f, NULL) == NULL);
    CHECK_NULL_ARG(dm_tensor_file_info(NULL, 0, &ti), "dm_tensor_file_info");
    CHECK_NULL_ARG(dm_tensor_file_info(f, 0, NULL), "dm_tensor_file_info");
    CHECK_NULL_ARG(dm_tensor_file_read_f32(NULL, 0, &got, 1), "dm_tensor_file_read_f32");
    CHECK_NULL_ARG(dm_tensor_file_read_f32(f, 0, NULL, 1), "dm_tensor_file_read_f32");
    CHECK(dm_tensor_file_read_f32(f, 0, &got, 1) == DM_OK && got == 1.0f);
    dm_tensor_file_free(f);
    dm_tensor_file_free(NULL);
    /* profiles and device models */
    dm_profile *p = (dm_profile *)1;
    CHECK_NULL_ARG(dm_profile_default_path(NULL, 64), "dm_profile_default_path");
    CHECK_NULL_ARG(dm_profile_measure(NULL, 1, NULL), "dm_profile_measure");
    CHECK_NULL_ARG(dm_profile_open(&p, NULL), "dm_profile_open");
    CHECK(p == NULL);
    CHECK_NULL_ARG(dm_profile_open(NULL, path), "dm_profile_open");
    CHECK_NULL_ARG(dm_profile_write(NULL, path), "dm_profile_write");
    dm_profile_info info;
    memset(&info, 0x55, sizeof info);
    dm_profile_get_info(NULL, &info);
    CHECK(info.threads == 0 && info.machine[0] == 0 && info.triad_bw == 0);
    dm_profile_get_info(NULL, NULL);
    dm_profile_free(NULL);
    dm_device_model *m = (dm_device_model *)1;
    CHECK_NULL_ARG(dm_device_model_preset(&m, NULL), "dm_device_model_preset");
    CHECK(m == NULL);
    CHECK_NULL_ARG(dm_device_model_preset(NULL, "h100"), "dm_device_model_preset");
    m = (dm_device_model *)1;
    CHECK_NULL_ARG(dm_device_model_cpu(&m, NULL, 0), "dm_device_model_cpu");
    CHECK(m == NULL);
    CHECK(!strcmp(dm_device_model_name(NULL), "") && !strcmp(dm_device_model_desc(NULL), "") &&
          dm_device_model_is_cpu(NULL) == 0 && dm_device_model_bandwidth(NULL) == 0 &&
          dm_device_model_contract_peak(NULL, 4) == 0 && dm_device_model_vector_peak(NULL, 4) == 0 &&
          dm_device_model_roofline(NULL, 4, 1, 1, 1) == 0);
    CHECK(dm_device_for_gpu(NULL) == NULL);
    dm_device_model_free(NULL);
}

static void test_null_arguments_analysis_tuning(void) {
    char path[256];
    path_of(path, sizeof path, "null.safetensors");
    dm_device_model *m = NULL;
    /* the analysis */
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 4, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 16;
    CHECK_OK(dm_device_model_preset(&m, "h100"));
    dm_analysis *a = (dm_analysis *)1;
    char *text = NULL;
    double un, fu;
    CHECK_NULL_ARG(dm_analysis_new(&a, NULL, m, 4, 0), "dm_analysis_new");
    CHECK(a == NULL);
    CHECK_NULL_ARG(dm_analysis_new(&a, &cfg, NULL, 4, 0), "dm_analysis_new");
    CHECK_OK(dm_analysis_new(&a, &cfg, m, 4, 0));
    CHECK(dm_analysis_num_ops(NULL) == 0);
    CHECK_NULL_ARG(dm_analysis_measure(NULL, 1, 0, 1), "dm_analysis_measure");
    CHECK_NULL_ARG(dm_analysis_table(a, NULL), "dm_analysis_table");
    CHECK_NULL_ARG(dm_analysis_table(NULL, &text), "dm_analysis_table");
    CHECK_NULL_ARG(dm_analysis_json(a, NULL), "dm_analysis_json");
    CHECK_NULL_ARG(dm_analysis_csv(a, NULL), "dm_analysis_csv");
    CHECK_NULL_ARG(dm_analysis_plan_text(a, NULL), "dm_analysis_plan_text");
    CHECK_NULL_ARG(dm_analysis_write_svg(NULL, "t", path), "dm_analysis_write_svg");
    CHECK_NULL_ARG(dm_analysis_write_svg(a, "t", NULL), "dm_analysis_write_svg");
    CHECK_NULL_ARG(dm_analysis_floors(&cfg, m, 4, 0, NULL, &fu), "dm_analysis_floors");
    CHECK_NULL_ARG(dm_analysis_floors(&cfg, NULL, 4, 0, &un, &fu), "dm_analysis_floors");
    CHECK(!text);
    dm_analysis_free(a);
    dm_analysis_free(NULL);
    dm_device_model_free(m);
    /* charts */
    const double loss[2] = {2, 1};
    CHECK_NULL_ARG(dm_loss_svg(NULL, 2, 1, NULL, path), "dm_loss_svg");
    CHECK_NULL_ARG(dm_loss_svg(loss, 2, 1, NULL, NULL), "dm_loss_svg");
    CHECK(dm_loss_svg(loss, 2, INT64_MAX, NULL, path) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "overflow"));
    const dm_group_bar bar = {NULL, 0, DM_CLASS_ELEMENTWISE, 1.0, 0.5, NULL};
    dm_group_chart sec = {NULL, NULL, NULL, 1};
    CHECK_NULL_ARG(dm_group_chart_write_svg(NULL, NULL, &sec, 1, NULL), "dm_group_chart_write_svg");
    CHECK(dm_group_chart_write_svg(NULL, NULL, &sec, 1, path) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "section 0 has 1 bars and NULL"));
    sec.nbars = -1;
    CHECK(dm_group_chart_write_svg(NULL, NULL, &sec, 1, path) == DM_ERR_INVALID_ARG);
    sec.bars = &bar, sec.nbars = 1;
    path_of(path, sizeof path, "null.svg");
    CHECK_OK(dm_group_chart_write_svg(NULL, NULL, &sec, 1, path)); /* every text NULL */
    CHECK_OK(dm_loss_svg(loss, 2, 1, NULL, path));
    /* tuning */
    dm_tuning *t = (dm_tuning *)1;
    const dm_layer_options opt = {.threads = 1};
    int nchanged = 0;
    CHECK_NULL_ARG(dm_tune_cache_default_path(NULL, 64), "dm_tune_cache_default_path");
    CHECK_NULL_ARG(dm_tuning_new(&t, NULL, &opt, 1), "dm_tuning_new");
    CHECK(t == NULL);
    CHECK_NULL_ARG(dm_tuning_new(&t, &cfg, NULL, 1), "dm_tuning_new");
    CHECK_NULL_ARG(dm_tuning_candidates(NULL, &text), "dm_tuning_candidates");
    CHECK_NULL_ARG(dm_tuning_measure(NULL, NULL, NULL, NULL), "dm_tuning_measure");
    CHECK_NULL_ARG(dm_tuning_select(NULL), "dm_tuning_select");
    CHECK_NULL_ARG(dm_tuning_refine(NULL, NULL, &nchanged), "dm_tuning_refine");
    CHECK_NULL_ARG(dm_tuning_pairs(NULL), "dm_tuning_pairs");
    CHECK_NULL_ARG(dm_tuning_rows(NULL), "dm_tuning_rows");
    CHECK_NULL_ARG(dm_tuning_report(NULL, &text), "dm_tuning_report");
    CHECK_NULL_ARG(dm_tuning_save(NULL, path), "dm_tuning_save");
    CHECK_NULL_ARG(dm_tuning_write_svg(NULL, path), "dm_tuning_write_svg");
    CHECK(dm_tuning_uses_direct(NULL) == 0);
    dm_tuning_info ti2;
    memset(&ti2, 0x55, sizeof ti2);
    dm_tuning_get_info(NULL, &ti2);
    CHECK(ti2.machine && !strcmp(ti2.machine, "") && ti2.groups == 0 && ti2.reps == 0 && ti2.tuned_s == 0);
    dm_tuning_get_info(NULL, NULL);
    dm_tuning_free(NULL);
    CHECK_OK(dm_tuning_new(&t, &cfg, &opt, 1));
    if (t) {
        dm_tuning_get_info(t, NULL);
        CHECK_NULL_ARG(dm_tuning_candidates(t, NULL), "dm_tuning_candidates");
        CHECK_NULL_ARG(dm_tuning_report(t, NULL), "dm_tuning_report");
        CHECK_NULL_ARG(dm_tuning_refine(t, NULL, NULL), "dm_tuning_refine");
        CHECK_NULL_ARG(dm_tuning_save(t, NULL), "dm_tuning_save");
        CHECK_NULL_ARG(dm_tuning_write_svg(t, NULL), "dm_tuning_write_svg");
        CHECK(dm_tuning_save(t, path) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "no selection yet"));
        dm_tuning_free(t);
    }
    /* the teacher (the data's NULLs: test_train_data) */
    dm_teacher *te = (dm_teacher *)1;
    CHECK_NULL_ARG(dm_teacher_new(&te, NULL, 1, &opt, 1.0), "dm_teacher_new");
    CHECK(te == NULL);
    CHECK_NULL_ARG(dm_teacher_new(NULL, &cfg, 1, &opt, 1.0), "dm_teacher_new");
    dm_teacher_free(NULL);
    CHECK(!text);
}

/* Resolving options fills in all of them or none: a bad DMOVE_CUDA_STREAMS after a
 * good row kernel choice leaves *out as given (the CUDA resolver wrote rows first). A
 * build without CUDA refuses the device, *out as given too. */
static int same_options(const dm_layer_options *a, const dm_layer_options *b) {
    return a->schedule == b->schedule && a->forward_only == b->forward_only && a->threads == b->threads &&
           a->no_reuse == b->no_reuse && a->plan == b->plan && a->device == b->device && a->dtype == b->dtype &&
           a->rows == b->rows && a->streams == b->streams && a->no_input_grad == b->no_input_grad &&
           a->recompute == b->recompute;
}

static void test_options_resolve(void) {
    const dm_layer_options opt = {.threads = 1, .device = DM_DEVICE_CUDA}; /* rows and streams: defaults */
    dm_layer_options out = {.threads = 7, .rows = DM_ROWS_GEN, .streams = 2};
    setenv("DMOVE_CUDA_STREAMS", "3", 1);
    dm_status s = dm_layer_options_resolve(&opt, &out);
    CHECK((s == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "DMOVE_CUDA_STREAMS='3'")) || s == DM_ERR_UNSUPPORTED);
    CHECK(same_options(&out, &opt) && out.rows == DM_ROWS_DEFAULT && out.streams == 0);
    unsetenv("DMOVE_CUDA_STREAMS");
    setenv("DMOVE_CUDA_ROWS", "fast", 1);
    out = (dm_layer_options){.rows = DM_ROWS_GEN};
    s = dm_layer_options_resolve(&opt, &out);
    CHECK((s == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "DMOVE_CUDA_ROWS='fast'")) || s == DM_ERR_UNSUPPORTED);
    CHECK(same_options(&out, &opt));
    unsetenv("DMOVE_CUDA_ROWS");
    /* resolved in place (out = opt): everything, or on an error nothing */
    dm_layer_options io = opt;
    s = dm_layer_options_resolve(&io, &io);
    CHECK(s == DM_OK || s == DM_ERR_UNSUPPORTED);
    if (s == DM_OK) CHECK(io.rows != DM_ROWS_DEFAULT && (io.streams == 1 || io.streams == 2) && io.threads == 1);
    else CHECK(same_options(&io, &opt));
    CHECK_NULL_ARG(dm_layer_options_resolve(NULL, &out), "dm_layer_options_resolve");
    CHECK_NULL_ARG(dm_layer_options_resolve(&opt, NULL), "dm_layer_options_resolve");
}

/* dm_profile_measure_direct on a small profile (a 96^3 problem at 1 and 2 threads): a
 * positive rate at each count and the variant's name where the direct kernel runs, nothing
 * where it does not; the device model then takes the faster rate */
static void test_profile_direct(void) {
    char path[512];
    path_of(path, sizeof path, "small-profile.json");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"version\": 1, \"machine\": {\"cpu\": \"t\"}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 10, "
          "\"read\": 10}, \"vector_gflops\": 10, \"sgemm_n\": 96, \"sgemm\": [{\"threads\": 1, \"gflops\": 0.001}, "
          "{\"threads\": 2, \"gflops\": 0.002}]}",
          f);
    fclose(f);
    dm_profile *p = NULL;
    CHECK_OK(dm_profile_open(&p, path));
    if (!p) return;
    CHECK_NULL_ARG(dm_profile_measure_direct(NULL, NULL), "dm_profile_measure_direct");
    CHECK_OK(dm_profile_measure_direct(p, NULL));
    dm_profile_info info;
    dm_profile_get_info(p, &info);
    const char *use;
    dm_cpu_kernel_isa(&use, NULL, NULL);
    if (strcmp(use, "none")) {
        CHECK(info.direct_flops[0] > 1e6 && info.direct_flops[1] > 1e6 && !strcmp(info.direct_kernel, use));
        dm_device_model *m = NULL;
        CHECK_OK(dm_device_model_cpu(&m, p, 2));
        CHECK(m && dm_device_model_contract_peak(m, 4) == info.direct_flops[1]); /* past 2 MFLOP/s SGEMM */
        dm_device_model_free(m);
    } else
        CHECK(info.direct_flops[0] == 0 && info.direct_kernel[0] == 0);
    printf("  profile: dmove's kernel (%s) timed beside SGEMM at 96^3: %.1f and %.1f GFLOP/s\n", use,
           info.direct_flops[0] / 1e9, info.direct_flops[1] / 1e9);
    dm_profile_free(p);
}

/* The tests' running maxima see a NaN: a kernel that writes one fails `worst < tol`. */
static void test_worst_of(void) {
    const double errs[4] = {1e-7, NAN, 2e-7, 1e-8};
    double w = 0;
    for (int k = 0; k < 4; k++) w = worst_of(w, errs[k]);
    CHECK(!(w < 1e-5) && isinf(w));
    const float a[3] = {1, NAN, 3}, b[3] = {1, 2, 3};
    CHECK(!(worst_of(0, rel_err(a, b, 3)) < 1e-5));
    CHECK(worst_of(worst_of(0, 3e-7), 1e-7) == 3e-7);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_worst_of();
    test_tensor_file();
    test_param_specs();
    test_device_and_analysis();
    test_train_data();
    test_teacher_and_layer();
    test_tuning_reps();
    test_analysis_load_plan();
    test_null_arguments_files_devices();
    test_null_arguments_analysis_tuning();
    test_options_resolve();
    test_profile_direct();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_tools: could not remove %s\n", g_dir);
    TEST_END();
}
