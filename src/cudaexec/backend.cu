/* backend.cu: the CUDA backend behind the backend interface (plan/backend.h): the
 * executor of cuda_backend.h for a layer's plan (its storage type, row kernels and
 * streams resolved here from the options and the environment: DMOVE_CUDA_ROWS,
 * DMOVE_CUDA_STREAMS, DMOVE_CUDA_EMULATE), what it chose as the layer's notes, and the
 * trainer's buffers, copies, AdamW and loss on the device (cuda/train.cu). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/status.h"
}
#include "cuda/cuda_backend.h"
#include "plan/backend.h"

typedef struct {
    dm_cuda_exec *ex;
    const dm_plan *plan;
    int profile, by_events;
    dm_layer_note notes[9];
    int nnotes;
} cuda_state;

static cuda_state *S(dm_backend_state *st) { return (cuda_state *)st; }
static const cuda_state *CS(const dm_backend_state *st) { return (const cuda_state *)st; }
static dm_cuda_exec *EX(dm_backend_state *st) { return S(st)->ex; }

/* --- the environment ------------------------------------------------------------------- */

/* Is the CUDA backend emulated on the host (DMOVE_CUDA_EMULATE=1 or lanes)? A bad variable
 * counts as no: layer creation reports it. */
static int emulating(void) {
    int on = 0;
    if (dm_cuda_emulate_resolve(&on) != DM_OK) {
        dm_clear_error();
        on = 0;
    }
    return on;
}

/* The defaults are what measured fastest on an H100 (bench/results/gpu-h100-2026-11-24.txt:
 * auto with two streams, 1.94x PyTorch eager at b=8 j=512 and 1.05x at b=96 j=128, against
 * 1.20x and 0.68x interpreting on one stream); emulating on the host, where auto's timings
 * say nothing about a GPU and every generated kernel is a host compile, interp on one. */
dm_status dm_cuda_rows_resolve(dm_rows r, dm_rows *out) {
    const char *env = getenv("DMOVE_CUDA_ROWS");
    *out = r != DM_ROWS_DEFAULT ? r : emulating() ? DM_ROWS_INTERP : DM_ROWS_AUTO;
    if (r != DM_ROWS_DEFAULT || !env || !*env) return DM_OK;
    if (dm_rows_parse(env, out) != DM_OK)
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_ROWS='%s': use interp, gen or auto", env);
    return DM_OK;
}

dm_status dm_cuda_streams_resolve(int streams, int *out) {
    const char *env = getenv("DMOVE_CUDA_STREAMS");
    *out = emulating() ? 1 : 2;
    if (streams == 1 || streams == 2) {
        *out = streams;
        return DM_OK;
    }
    if (streams != 0) return dm_fail(DM_ERR_INVALID_ARG, "streams %d: use 1 or 2", streams);
    if (!env || !*env) return DM_OK;
    if (strcmp(env, "1") != 0 && strcmp(env, "2") != 0)
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_STREAMS='%s': use 1 or 2", env);
    *out = env[0] - '0';
    return DM_OK;
}

dm_status dm_cuda_emulate_resolve(int *on) {
    const char *env = getenv("DMOVE_CUDA_EMULATE");
    *on = 0;
    if (!env || !*env || !strcmp(env, "0")) return DM_OK;
    if (strcmp(env, "1") != 0 && strcmp(env, "lanes") != 0)
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_EMULATE='%s': use 1 (run --device cuda on the host, "
                       "emulated, for tests), lanes (the same, the generated kernels run lane by lane) or 0", env);
    *on = env[0] == 'l' ? 2 : 1;
    return DM_OK;
}

/* --- the interface ----------------------------------------------------------------------- */

static dm_status check_options(const dm_layer_options *opt) {
    (void)opt;
    return DM_OK; /* every storage type, row kernel and stream count */
}

/* *opt changes only when both resolve. */
static dm_status resolve_options(dm_layer_options *opt) {
    dm_rows rows = opt->rows;
    int streams = opt->streams;
    DM_TRY(dm_cuda_rows_resolve(opt->rows, &rows));
    DM_TRY(dm_cuda_streams_resolve(opt->streams, &streams));
    opt->rows = rows;
    opt->streams = streams;
    return DM_OK;
}

/* The padded attention as one op where flash.cu's kernels take it (dmc_flash_ok's cases
 * that the layer's sizes decide; an operand's alignment, known when the group is built,
 * may still send it to varlen.cu's cuBLAS steps, which the layer notes say), in the fused
 * schedule (the unfused one is the op-by-op baseline) -- but only with
 * DMOVE_CUDA_ATTN_OP=1: measured on an H200 (bench/results/gpu-h200-2026-11-28.txt) the
 * padded BERT-large layer's step took 2.64 ms with it against 2.17 ms with its attention as
 * ops (b=96 j=128) and 1.75 against 1.01 (b=8 j=512): the flash kernels (26-27 TFLOP/s
 * forward with dropout) lose to cuBLAS and the fused row kernels there, so the default keeps
 * the ops until they win. DMOVE_CUDA_FLASH=0 turns the kernels off everywhere. */
static int attn_op(const dm_layer_config *cfg, const dm_layer_options *opt) {
    const char *ao = getenv("DMOVE_CUDA_ATTN_OP");
    const int dt = opt->dtype == DM_DTYPE_BF16 ? DM_CUDA_BF16 : opt->dtype == DM_DTYPE_FP16 ? DM_CUDA_FP16 : DM_CUDA_FP32;
    const int64_t P = cfg->heads > 0 ? cfg->hidden / cfg->heads : 0;
    return !dm_cuda_flash_off() && ao && !strcmp(ao, "1") && opt->schedule == DM_SCHED_FUSED && !opt->recompute &&
           !opt->plan && !dm_cuda_flash_shape_why(dt, P, cfg->seq, cfg->causal, 1);
}

static void note(cuda_state *c, const char *key, double value, const char *text) {
    dm_layer_note *n = &c->notes[c->nnotes++];
    n->key = key;
    n->value = value;
    n->text = text;
}

static dm_status create(dm_backend_state **out, const dm_plan *plan, char *host, char *host_act,
                        const dm_layer_options *opt, unsigned flags, dm_backend_pool *pool) {
    (void)host, (void)flags; /* the host arena is the staging copy; nothing here is lenient */
    *out = NULL;
    if (host_act) /* (activations_apart is 0: the layer never passes it) */
        return dm_fail(DM_ERR_INTERNAL, "the CUDA backend keeps a plan's activations in its own arena");
    const int dt = opt->dtype == DM_DTYPE_BF16   ? DM_CUDA_BF16
                   : opt->dtype == DM_DTYPE_FP16 ? DM_CUDA_FP16
                                                 : DM_CUDA_FP32;
    dm_rows rows = DM_ROWS_INTERP;
    int streams = 1, emulate = 0;
    DM_TRY(dm_cuda_rows_resolve(opt->rows, &rows));
    DM_TRY(dm_cuda_streams_resolve(opt->streams, &streams));
    DM_TRY(dm_cuda_emulate_resolve(&emulate));
    cuda_state *c = (cuda_state *)calloc(1, sizeof *c);
    if (!c) return dm_fail(DM_ERR_OOM, "out of memory");
    c->plan = plan;
    const unsigned f = (rows == DM_ROWS_GEN    ? DM_CUDA_GEN | DM_CUDA_EPILOGUE
                        : rows == DM_ROWS_AUTO ? DM_CUDA_GEN | DM_CUDA_EPILOGUE | DM_CUDA_AUTO
                                               : 0) |
                       (streams == 2 ? DM_CUDA_OVERLAP : 0) | (emulate ? DM_CUDA_EMULATE : 0) |
                       (emulate == 2 ? DM_CUDA_SIM_LANES : 0);
    dm_status s = dm_cuda_exec_init_pooled(&c->ex, plan, dt, f, (dm_cuda_pool *)pool);
    if (s != DM_OK) {
        free(c);
        return s;
    }
    int programs = 0;
    const int generated = dm_cuda_exec_generated(c->ex, &programs);
    note(c, "row_programs", programs, NULL);
    note(c, "row_programs_generated", generated, NULL);
    note(c, "attention_fused", dm_cuda_exec_fused(c->ex), NULL);
    note(c, "attention_flash", dm_cuda_exec_flash(c->ex), NULL);
    note(c, "flash_unavailable", 0, dm_cuda_exec_flash_note(c->ex));
    note(c, "bias_epilogues", dm_cuda_exec_epilogues(c->ex), NULL);
    note(c, "second_stream", dm_cuda_exec_side_groups(c->ex), NULL);
    note(c, "gen_unavailable", 0, dm_cuda_exec_gen_note(c->ex));
    note(c, "gpu", 0, dm_cuda_exec_gpu_name(c->ex));
    *out = (dm_backend_state *)c;
    return DM_OK;
}

static void destroy(dm_backend_state *st) {
    if (!st) return;
    dm_cuda_exec_free(EX(st));
    free(st);
}

static int notes(const dm_backend_state *st, const dm_layer_note **out) {
    *out = CS(st)->notes;
    return CS(st)->nnotes;
}

static size_t workspace_bytes(const dm_backend_state *st) { return dm_cuda_exec_workspace_bytes(CS(st)->ex); }

static int timed_with(const dm_backend_state *st, int gi) {
    return dm_cuda_exec_group_absorbed(CS(st)->ex, gi) ? gi - 1 : -1;
}

static dm_status upload(dm_backend_state *st, int t, const float *host) { return dm_cuda_upload(EX(st), t, host); }
static dm_status download(dm_backend_state *st, int t, float *host) { return dm_cuda_download(EX(st), t, host); }

static void *tensor_addr(dm_backend_state *st, int t, int *dtype) {
    int dt = DM_CUDA_FP32;
    void *p = dm_cuda_tensor_addr(EX(st), t, &dt);
    *dtype = dt == DM_CUDA_BF16 ? DM_DTYPE_BF16 : dt == DM_CUDA_FP16 ? DM_DTYPE_FP16 : DM_DTYPE_FP32;
    return p;
}

/* Profiled on the host's clock (emulating), a group is waited for, so that the time taken
 * around it is its own; on a GPU its CUDA events time it. */
static dm_status set_rows(dm_backend_state *st, int64_t rows, const float *lengths) {
    return dm_cuda_exec_set_rows(EX(st), rows, lengths);
}

static dm_status set_training(dm_backend_state *st, int training) {
    return dm_cuda_exec_set_training(EX(st), training);
}

static dm_status run_group(dm_backend_state *st, int gi, uint64_t seed, int contractions_only) {
    const dm_plan *plan = S(st)->plan;
    /* only a batched group runs just its GEMMs when the pass runs contractions alone */
    const int only_c = contractions_only && gi >= 0 && gi < plan->ngroups && plan->groups[gi].nbatch > 1;
    DM_TRY(dm_cuda_exec_group(EX(st), gi, seed, only_c));
    return S(st)->profile && !S(st)->by_events ? dm_cuda_sync(EX(st)) : DM_OK;
}

static dm_status sync(dm_backend_state *st) { return dm_cuda_sync(EX(st)); }

static dm_status profile(dm_backend_state *st, int on, int *by_events) {
    DM_TRY(dm_cuda_exec_profile(EX(st), on, by_events));
    S(st)->profile = on;
    S(st)->by_events = *by_events;
    return DM_OK;
}

static dm_status profile_take(dm_backend_state *st, double *secs) { return dm_cuda_exec_profile_take(EX(st), secs); }

static dm_status pool_new(dm_backend_pool **pool) {
    int emulate = 0;
    *pool = NULL;
    DM_TRY(dm_cuda_emulate_resolve(&emulate));
    dm_cuda_pool *p = NULL;
    DM_TRY(dm_cuda_pool_new(&p, emulate));
    *pool = (dm_backend_pool *)p;
    return DM_OK;
}

static void pool_free(dm_backend_pool *pool) { dm_cuda_pool_free((dm_cuda_pool *)pool); }
static size_t pool_bytes(const dm_backend_pool *pool) { return dm_cuda_pool_bytes((const dm_cuda_pool *)pool); }

static dm_status buf_new(dm_backend_state *st, size_t bytes, void *host, void **buf, const char *what) {
    (void)host; /* the device buffer is apart from it */
    return dm_cuda_alloc(EX(st), bytes, buf, what);
}

static void buf_free(dm_backend_state *st, void *buf, void *host) {
    (void)host;
    dm_cuda_free(EX(st), buf);
}

static dm_status buf_copy(dm_backend_state *st, void *dst, const void *src, size_t bytes, int to_backend) {
    return dm_cuda_memcpy(EX(st), dst, src, bytes, to_backend);
}

static dm_status copy_tensor(dm_backend_state *dst, int td, dm_backend_state *src, int ts) {
    return dm_cuda_copy_tensor(EX(dst), td, EX(src), ts);
}

static dm_status add_tensor(dm_backend_state *dst, int td, dm_backend_state *src, int ts) {
    return dm_cuda_add_tensor(EX(dst), td, EX(src), ts);
}

static dm_status sumsq(dm_backend_state *st, int tg, const float *src, int64_t n, double *out) {
    return dm_cuda_sumsq(EX(st), tg, src, n, out);
}

static dm_status reduce(dm_backend_state *st, int tg, float *buf, int64_t n, int root, dm_dist *d) {
    return dm_cuda_reduce(EX(st), tg, buf, n, root, 0, d);
}

static dm_status bcast(dm_backend_state *st, int t, float *buf, int64_t n, int root, dm_dist *d) {
    return dm_cuda_reduce(EX(st), t, buf, n, root, 1, d);
}

static dm_status reduce_wait(dm_backend_state *st, dm_dist *d) { return dm_cuda_reduce_wait(EX(st), d); }

static dm_status accumulate(dm_backend_state *st, int tg, int64_t n, float *acc, int first) {
    return dm_cuda_accumulate(EX(st), tg, n, acc, first);
}

static dm_status optimize(dm_backend_state *st, dm_optim_pass_kind kind, int tp, int tg, int64_t n, float *master,
                          float *m, float *v, const float *acc, const dm_optim_coef *k, double *norms) {
    return dm_cuda_optimize(EX(st), (int)kind, tp, tg, n, master, m, v, acc, k, norms);
}

static dm_status mse(dm_backend_state *st, int ty, int tdy, const float *target, const float *mask, int64_t tokens,
                     int64_t width, float scale, double *partial, double *host_partial) {
    return dm_cuda_mse(EX(st), ty, tdy, target, mask, tokens, width, scale, partial, host_partial);
}

/* dm_backend_cuda is initialised by position, in the order of dm_backend's fields (C++17 has
 * no designated initializers). So that a field added to dm_backend (plan/backend.h) cannot
 * shift the entries below, or be left zero at the end, unnoticed, the fields listed here
 * must follow each other with nothing between them, name first and mse last, and there must
 * be no others: a field added fails one of these checks until it is named here and
 * initialised at its place below. */
#define DM_BACKEND_AFTER(a) (offsetof(dm_backend, a) + sizeof(((dm_backend *)0)->a))
#define DM_BACKEND_ALIGN(n, b) (((n) + alignof(decltype(((dm_backend *)0)->b)) - 1) / \
                                alignof(decltype(((dm_backend *)0)->b)) * alignof(decltype(((dm_backend *)0)->b)))
#define DM_BACKEND_NEXT(a, b)                                                                \
    static_assert(offsetof(dm_backend, b) == DM_BACKEND_ALIGN(DM_BACKEND_AFTER(a), b),      \
                  "dm_backend's fields changed at " #a ", " #b ": initialise dm_backend_cuda in field order")
static_assert(offsetof(dm_backend, name) == 0,
              "dm_backend has a field before name: initialise dm_backend_cuda in field order");
DM_BACKEND_NEXT(name, device); DM_BACKEND_NEXT(device, merge_siblings); DM_BACKEND_NEXT(merge_siblings, runs_pairs);
DM_BACKEND_NEXT(runs_pairs, activations_apart); DM_BACKEND_NEXT(activations_apart, algos);
DM_BACKEND_NEXT(algos, check_options);
DM_BACKEND_NEXT(check_options, resolve_options); DM_BACKEND_NEXT(resolve_options, attn_op);
DM_BACKEND_NEXT(attn_op, create);
DM_BACKEND_NEXT(create, destroy); DM_BACKEND_NEXT(destroy, notes); DM_BACKEND_NEXT(notes, workspace_bytes);
DM_BACKEND_NEXT(workspace_bytes, timed_with); DM_BACKEND_NEXT(timed_with, upload); DM_BACKEND_NEXT(upload, download);
DM_BACKEND_NEXT(download, tensor_addr); DM_BACKEND_NEXT(tensor_addr, run_group); DM_BACKEND_NEXT(run_group, set_rows); DM_BACKEND_NEXT(set_rows, set_training); DM_BACKEND_NEXT(set_training, sync); DM_BACKEND_NEXT(sync, profile);
DM_BACKEND_NEXT(profile, profile_take); DM_BACKEND_NEXT(profile_take, pool_new); DM_BACKEND_NEXT(pool_new, pool_free);
DM_BACKEND_NEXT(pool_free, pool_bytes); DM_BACKEND_NEXT(pool_bytes, buf_new); DM_BACKEND_NEXT(buf_new, buf_free);
DM_BACKEND_NEXT(buf_free, buf_copy); DM_BACKEND_NEXT(buf_copy, copy_tensor); DM_BACKEND_NEXT(copy_tensor, add_tensor);
DM_BACKEND_NEXT(add_tensor, sumsq);
DM_BACKEND_NEXT(sumsq, reduce); DM_BACKEND_NEXT(reduce, bcast); DM_BACKEND_NEXT(bcast, reduce_wait); DM_BACKEND_NEXT(reduce_wait, accumulate); DM_BACKEND_NEXT(accumulate, optimize); DM_BACKEND_NEXT(optimize, mse);
static_assert(sizeof(dm_backend) ==
                  (DM_BACKEND_AFTER(mse) + alignof(dm_backend) - 1) / alignof(dm_backend) * alignof(dm_backend),
              "dm_backend has a field after mse: initialise dm_backend_cuda in field order");
/* and none hides in the padding between two of them: a structured binding takes exactly
 * as many names as the struct has fields */
[[maybe_unused]] static void dm_backend_fields_all_named(const dm_backend &b) {
    [[maybe_unused]] const auto &[name, device, merge_siblings, runs_pairs, activations_apart, algos, check_options,
                                  resolve_options, attn_op, create, destroy, notes, workspace_bytes, timed_with,
                                  upload, download, tensor_addr, run_group, set_rows, set_training, sync, profile,
                                  profile_take, pool_new, pool_free, pool_bytes, buf_new, buf_free, buf_copy,
                                  copy_tensor, add_tensor, sumsq, reduce, bcast, reduce_wait, accumulate, optimize,
                                  mse] = b;
}
#undef DM_BACKEND_NEXT
#undef DM_BACKEND_ALIGN
#undef DM_BACKEND_AFTER

/* in the order of dm_backend's fields, which the asserts above check */
extern "C" const dm_backend dm_backend_cuda = {
    "cuda", DM_DEVICE_CUDA,
    0, /* merge_siblings: the fused attention kernels take the groups without */
    0, /* runs_pairs: its second stream instead */
    0, /* activations_apart: a plan's activations in its device arena */
    NULL, /* algos: none of its own; a plan file's are the CPU's */
    check_options, resolve_options, attn_op,
    create, destroy, notes, workspace_bytes, timed_with,
    upload, download, tensor_addr, run_group,
    set_rows, set_training,
    sync, profile, profile_take,
    pool_new, pool_free, pool_bytes, buf_new, buf_free, buf_copy, copy_tensor, add_tensor, sumsq, reduce, bcast,
    reduce_wait, accumulate, optimize, mse,
};
