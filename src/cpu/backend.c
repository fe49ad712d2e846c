/* backend.c: the CPU backend behind the backend interface (plan/backend.h): the group
 * executor of exec.c over the layer's host arena, which is its memory (upload and
 * download move nothing; the trainer's buffers are its host buffers), the BLAS threads,
 * and the trainer's work beside the plans: copies between layers, AdamW and the mean
 * squared error, in the arithmetic and order the trainer always had on the CPU. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>

#include "core/status.h"
#include "cpu/backend.h"
#include "cpu/exec.h"
#include "plan/compile.h"
#include "dist/dist.h"

typedef struct {
    dm_cpu_exec ex;
    dm_cpu_mem mem; /* the layer's host arena (and its activations, apart where shared) */
} cpu_state;

static cpu_state *S(dm_backend_state *st) { return (cpu_state *)st; }
static const cpu_state *CS(const dm_backend_state *st) { return (const cpu_state *)st; }

dm_cpu_exec *dm_cpu_backend_exec(const dm_backend *bk, dm_backend_state *st) {
    return bk == &dm_backend_cpu && st ? &S(st)->ex : NULL;
}

static dm_status check_options(const dm_layer_options *opt) {
    if (opt->dtype != DM_DTYPE_FP32)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s storage needs the CUDA device (--device cuda): "
                       "the CPU backend computes and stores fp32", dm_dtype_name(opt->dtype));
    if (opt->streams != 0)
        return dm_fail(DM_ERR_UNSUPPORTED, "--streams %d chooses the CUDA backend's streams: it "
                       "needs --device cuda", opt->streams);
    if (opt->rows != DM_ROWS_DEFAULT)
        return dm_fail(DM_ERR_UNSUPPORTED, "--rows %s chooses the CUDA backend's row kernels: it "
                       "needs --device cuda", dm_rows_name(opt->rows));
    return DM_OK;
}

static dm_status resolve_options(dm_layer_options *opt) {
    (void)opt;
    return DM_OK;
}

/* the padded attention as one op (attn.c) where plan/compile.c's rule says */
static int attn_op(const dm_layer_config *cfg, const dm_layer_options *opt) {
    return dm_cpu_attn_op_default(cfg, opt->schedule, opt->forward_only, opt->recompute, opt->plan != NULL);
}

/* OpenBLAS's OpenMP threads wait for one another: a team smaller than it was told to use
 * (OMP_THREAD_LIMIT below the threads asked for, or OMP_DYNAMIC shrinking it on a busy
 * machine) spins for ever. So the threads are at most the limit, and the calling thread's
 * teams are never shrunk (omp_set_dynamic is the calling thread's setting: each run sets
 * it again, for callers on other threads). */
static int usable_threads(int n) {
    const int lim = omp_get_thread_limit();
    if (omp_get_dynamic()) omp_set_dynamic(0);
    return n > lim ? (lim > 0 ? lim : 1) : n;
}

static dm_status create(dm_backend_state **out, const dm_plan *plan, char *host, char *host_act,
                        const dm_layer_options *opt, unsigned flags, dm_backend_pool *pool) {
    (void)pool;
    *out = NULL;
    cpu_state *c = calloc(1, sizeof *c);
    if (!c) return dm_fail(DM_ERR_OOM, "out of memory");
    const int nthreads = usable_threads(opt->threads > 0 ? opt->threads : omp_get_max_threads());
    dm_status s = dm_cpu_exec_init_apart(&c->ex, plan, host, host_act, nthreads, (flags & DM_BACKEND_LENIENT) != 0);
    c->mem = dm_cpu_mem_of(plan, host, host_act);
    if (s != DM_OK) {
        if (opt->plan) dm_fail_context(s, "plan '%s' does not fit this layer: ", opt->plan);
        free(c);
        return s;
    }
    openblas_set_num_threads(nthreads);
    *out = (dm_backend_state *)c;
    return DM_OK;
}

static void destroy(dm_backend_state *st) {
    if (!st) return;
    dm_cpu_exec_free(&S(st)->ex);
    free(st);
}

static int notes(const dm_backend_state *st, const dm_layer_note **out) {
    (void)st;
    *out = NULL;
    return 0;
}

static size_t workspace_bytes(const dm_backend_state *st) {
    return ((size_t)CS(st)->ex.nthreads * (size_t)CS(st)->ex.per_thread + (size_t)CS(st)->ex.xwork_floats) *
           sizeof(float);
}

static int timed_with(const dm_backend_state *st, int gi) {
    const dm_cpu_exec *ex = &CS(st)->ex;
    int w = -1;
    if (gi < ex->ngroups && ex->groups[gi].rows_of >= 0) w = ex->groups[gi].rows_of;
    if (gi < ex->ngroups && ex->groups[gi].beside >= 0) w = ex->groups[gi].beside;
    return w;
}

/* Elements of tensor t's span in the arena (its first to its last element), and where it
 * starts; DM_ERR_INVALID_ARG if it has no memory. */
static dm_status span(cpu_state *c, int t, float **at, size_t *n) {
    const dm_graph *g = c->mem.plan->g;
    if (t < 0 || t >= g->nt) return dm_fail(DM_ERR_INVALID_ARG, "no tensor %d in the plan", t);
    *at = dm_cpu_mem_ptr(&c->mem, t);
    if (!*at) return dm_fail(DM_ERR_INVALID_ARG, "tensor %s is not materialized in the arena", g->t[t].name);
    const dm_tensor *x = &g->t[t];
    int64_t last = 0;
    *n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (x->size[d] < 1) return DM_OK;
        last += (x->size[d] - 1) * x->stride[d];
    }
    *n = (size_t)(last + 1);
    return DM_OK;
}

/* The host arena is the backend's memory: a tensor handed in at its own address moves
 * nothing; elsewhere it is copied. */
static dm_status upload(dm_backend_state *st, int t, const float *host) {
    float *at;
    size_t n;
    DM_TRY(span(S(st), t, &at, &n));
    if (at != host) memmove(at, host, n * sizeof(float));
    return DM_OK;
}

static dm_status download(dm_backend_state *st, int t, float *host) {
    float *at;
    size_t n;
    DM_TRY(span(S(st), t, &at, &n));
    if (at != host) memmove(host, at, n * sizeof(float));
    return DM_OK;
}

static void *tensor_addr(dm_backend_state *st, int t, int *dtype) {
    *dtype = DM_DTYPE_FP32;
    return dm_cpu_mem_ptr(&S(st)->mem, t);
}

static dm_status run_group(dm_backend_state *st, int gi, uint64_t seed, int contractions_only) {
    if (omp_get_dynamic()) omp_set_dynamic(0); /* usable_threads */
    return dm_cpu_exec_group(&S(st)->ex, gi, seed, contractions_only);
}

static dm_status set_rows(dm_backend_state *st, int64_t rows, const float *lengths) {
    return dm_cpu_exec_set_rows(&S(st)->ex, rows, lengths);
}

static dm_status sync(dm_backend_state *st) {
    (void)st;
    return DM_OK;
}

static dm_status profile(dm_backend_state *st, int on, int *by_events) {
    (void)st, (void)on;
    *by_events = 0; /* the layer times each group on the host's clock */
    return DM_OK;
}

static dm_status profile_take(dm_backend_state *st, double *secs) {
    for (int gi = 0; gi < S(st)->mem.plan->ngroups; gi++) secs[gi] = 0;
    return DM_OK;
}

static dm_status pool_new(dm_backend_pool **pool) {
    *pool = NULL; /* nothing to share: each executor's scratch is its threads' */
    return DM_OK;
}

static void pool_free(dm_backend_pool *pool) { (void)pool; }

static size_t pool_bytes(const dm_backend_pool *pool) {
    (void)pool;
    return 0;
}

static dm_status buf_new(dm_backend_state *st, size_t bytes, void *host, void **buf, const char *what) {
    (void)st;
    *buf = host ? host : malloc(bytes ? bytes : 1);
    if (!*buf) return dm_fail(DM_ERR_OOM, "out of memory for %s (%.2f GiB)", what, (double)bytes / (1 << 30));
    return DM_OK;
}

static void buf_free(dm_backend_state *st, void *buf, void *host) {
    (void)st;
    if (buf != host) free(buf);
}

static dm_status buf_copy(dm_backend_state *st, void *dst, const void *src, size_t bytes, int to_backend) {
    (void)st, (void)to_backend;
    if (dst != src && bytes) memmove(dst, src, bytes);
    return DM_OK;
}

static dm_status copy_tensor(dm_backend_state *dst, int td, dm_backend_state *src, int ts) {
    const dm_graph *gd = S(dst)->mem.plan->g, *gs = S(src)->mem.plan->g;
    if (td < 0 || td >= gd->nt || ts < 0 || ts >= gs->nt)
        return dm_fail(DM_ERR_INVALID_ARG, "copy_tensor: no tensor %d or %d", td, ts);
    const dm_tensor *xd = &gd->t[td], *xs = &gs->t[ts];
    int same = xd->ndim == xs->ndim;
    for (int d = 0; same && d < xd->ndim; d++) same = xd->size[d] == xs->size[d] && xd->stride[d] == xs->stride[d];
    if (!same)
        return dm_fail(DM_ERR_INVALID_ARG, "copy_tensor: %s and %s differ in shape or layout", xs->name, xd->name);
    float *a, *b;
    size_t n, m;
    DM_TRY(span(S(dst), td, &a, &n));
    DM_TRY(span(S(src), ts, &b, &m));
    if (a == b) return DM_OK;
    /* by the team, in blocks of 64 KB: the tied decoder's refresh is BERT's 94 MB word
     * table each step, 13 ms on one thread */
    const size_t block = 16384; /* floats */
    const int64_t nb = (int64_t)((n + block - 1) / block);
#pragma omp parallel for num_threads(S(dst)->ex.nthreads) schedule(static) if (nb > 1)
    for (int64_t q = 0; q < nb; q++) {
        const size_t lo = (size_t)q * block, len = n - lo < block ? n - lo : block;
        memcpy(a + lo, b + lo, len * sizeof(float));
    }
    return DM_OK;
}

static dm_status add_tensor(dm_backend_state *dst, int td, dm_backend_state *src, int ts) {
    const dm_graph *gd = S(dst)->mem.plan->g, *gs = S(src)->mem.plan->g;
    if (td < 0 || td >= gd->nt || ts < 0 || ts >= gs->nt)
        return dm_fail(DM_ERR_INVALID_ARG, "add_tensor: no tensor %d or %d", td, ts);
    const dm_tensor *xd = &gd->t[td], *xs = &gs->t[ts];
    int same = xd->ndim == xs->ndim;
    for (int d = 0; same && d < xd->ndim; d++) same = xd->size[d] == xs->size[d] && xd->stride[d] == xs->stride[d];
    if (!same)
        return dm_fail(DM_ERR_INVALID_ARG, "add_tensor: %s and %s differ in shape or layout", xs->name, xd->name);
    float *a, *b;
    size_t n, m;
    DM_TRY(span(S(dst), td, &a, &n));
    DM_TRY(span(S(src), ts, &b, &m));
    if (a == b) return dm_fail(DM_ERR_INVALID_ARG, "add_tensor: %s added to itself", xs->name);
#pragma omp parallel for simd num_threads(S(dst)->ex.nthreads) schedule(static)
    for (size_t e = 0; e < n; e++) a[e] += b[e];
    return DM_OK;
}

/* Tensor t of n dense fp32 elements (the trainer's parameters and gradients). */
static dm_status dense(dm_backend_state *st, int t, int64_t n, float **p, const char *what) {
    size_t np;
    DM_TRY(span(S(st), t, p, &np));
    if ((int64_t)np != n)
        return dm_fail(DM_ERR_INTERNAL, "%s: a tensor of %lld elements spans %zu in the arena: a laid-out "
                       "(strided) parameter is not supported", what, (long long)n, np);
    return DM_OK;
}

/* Part k's share of n elements (graph/optim_elem.h): [*lo, *hi). */
static void part_range(int64_t n, int k, int64_t *lo, int64_t *hi) {
    const int64_t per = (n + DM_NORM_PARTS - 1) / DM_NORM_PARTS;
    *lo = per * k < n ? per * k : n;
    *hi = per * (k + 1) < n ? per * (k + 1) : n;
}

/* A part's sums in NORM_LANES running sums, element e of a whole block of NORM_LANES in
 * lane e - lo mod NORM_LANES, the rest after them in order, the lanes added last in
 * order: a fixed order that vectorizes (one running sum waits an addition's latency per
 * element: `dmove bench --model --layers 2`, 38.6 M parameters, 2 threads, Xeon: the
 * optimizer with clipping 58.8 ms that way, 30.4 ms so). */
#define NORM_LANES 16

static double sumsq_part(const float *g, int64_t lo, int64_t hi) {
    double a[NORM_LANES] = {0};
    int64_t e = lo;
    for (; e + NORM_LANES <= hi; e += NORM_LANES)
#pragma omp simd
        for (int l = 0; l < NORM_LANES; l++) a[l] += (double)g[e + l] * (double)g[e + l];
    double s = 0.0;
    for (; e < hi; e++) s += (double)g[e] * (double)g[e];
    for (int l = 0; l < NORM_LANES; l++) s += a[l];
    return s;
}

static dm_status sumsq(dm_backend_state *st, int tg, const float *src, int64_t n, double *out) {
    float *g = (float *)src;
    if (!g) DM_TRY(dense(st, tg, n, &g, "the gradient norm"));
#pragma omp parallel for schedule(static)
    for (int k = 0; k < DM_NORM_PARTS; k++) {
        int64_t lo, hi;
        part_range(n, k, &lo, &hi);
        out[k] = sumsq_part(g, lo, hi);
    }
    return DM_OK;
}

static dm_status accumulate(dm_backend_state *st, int tg, int64_t n, float *acc, int first) {
    float *g;
    DM_TRY(dense(st, tg, n, &g, "gradient accumulation"));
    if (first) {
        memcpy(acc, g, (size_t)n * sizeof(float));
        return DM_OK;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t e = 0; e < n; e++) acc[e] += g[e];
    return DM_OK;
}

/* The CPU's tensors are host memory: MPI sums or sends them in place, on dist's thread. */
static dm_status reduce(dm_backend_state *st, int tg, float *buf, int64_t n, int root, dm_dist *d) {
    float *g = buf;
    if (!g) DM_TRY(dense(st, tg, n, &g, "the gradient reduction"));
    return dm_dist_reduce_start(d, g, n, root, "summing the gradients over the ranks");
}

static dm_status bcast(dm_backend_state *st, int t, float *buf, int64_t n, int root, dm_dist *d) {
    float *p = buf;
    if (!p) DM_TRY(dense(st, t, n, &p, "the parameters' broadcast"));
    return dm_dist_bcast_start(d, p, n, root, "the updated parameters from their rank");
}

static dm_status reduce_wait(dm_backend_state *st, dm_dist *d) { return dm_dist_reduce_wait(d); }

/* LAMB's first pass: the moments, and the partial sums of w^2 and u^2 into norms. */
static void lamb_moments(const dm_optim_coef *k, const float *w, const float *g, float *m, float *v, int64_t n,
                         double *norms) {
#pragma omp parallel for schedule(static)
    for (int q = 0; q < DM_NORM_PARTS; q++) {
        int64_t lo, hi;
        part_range(n, q, &lo, &hi);
        double sw = 0.0, su = 0.0;
        for (int64_t e = lo; e < hi; e++) {
            const float u = dm_lamb_moments_elem(k, w[e], g[e], &m[e], &v[e]);
            sw += (double)w[e] * (double)w[e];
            su += (double)u * (double)u;
        }
        norms[q] = sw;
        norms[DM_NORM_PARTS + q] = su;
    }
}

static dm_status optimize(dm_backend_state *st, dm_optim_pass_kind kind, int tp, int tg, int64_t n, float *master,
                          float *m, float *v, const float *acc, const dm_optim_coef *k, double *norms) {
    float *p, *g = (float *)acc;
    DM_TRY(dense(st, tp, n, &p, "the optimizer"));
    if (!g && kind != DM_PASS_LAMB_APPLY) DM_TRY(dense(st, tg, n, &g, "the optimizer"));
    const dm_optim_coef c = *k;
    /* fp32 storage: the master weights, when given, are the parameter's twin */
    float *w = master ? master : p;
    switch (kind) {
    case DM_PASS_ADAMW:
#pragma omp parallel for simd schedule(static)
        for (int64_t e = 0; e < n; e++) p[e] = w[e] = dm_adamw_elem(&c, w[e], g[e], &m[e], &v[e]);
        return DM_OK;
    case DM_PASS_LAMB_MOMENTS:
        if (!norms) return dm_fail(DM_ERR_INTERNAL, "LAMB: no buffer for the norms");
        lamb_moments(&c, w, g, m, v, n, norms);
        return DM_OK;
    case DM_PASS_LAMB_APPLY:
#pragma omp parallel for simd schedule(static)
        for (int64_t e = 0; e < n; e++) p[e] = w[e] = dm_lamb_apply_elem(&c, w[e], m[e], v[e]);
        return DM_OK;
    }
    return dm_fail(DM_ERR_INTERNAL, "optimizer pass %d unknown", (int)kind);
}

static dm_status mse(dm_backend_state *st, int ty, int tdy, const float *target, const float *mask, int64_t tokens,
                     int64_t width, float scale, double *partial, double *host_partial) {
    float *y, *dy = NULL;
    size_t ny, ndy = 0;
    DM_TRY(span(S(st), ty, &y, &ny));
    if (tdy >= 0) DM_TRY(span(S(st), tdy, &dy, &ndy));
    if ((int64_t)ny != tokens * width || (dy && (int64_t)ndy != tokens * width))
        return dm_fail(DM_ERR_INTERNAL, "the loss: the output is not %lld x %lld dense", (long long)tokens,
                       (long long)width);
    /* per token the sum of its squared errors in double (0 on padding), the gradient
     * scale * (y - target) (0 on padding): the caller sums the tokens in order */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *yr = y + t * width, *tr = target + t * width;
        double s = 0.0;
        if (mask[t] != 0.0f) {
            for (int64_t e = 0; e < width; e++) {
                const float d = yr[e] - tr[e];
                s += (double)d * d;
                if (dy) dy[t * width + e] = scale * d;
            }
        } else if (dy) {
            memset(dy + t * width, 0, (size_t)width * sizeof(float));
        }
        partial[t] = s;
    }
    if (host_partial != partial) memcpy(host_partial, partial, (size_t)tokens * sizeof(double));
    return DM_OK;
}

const dm_backend dm_backend_cpu = {
    .name = "cpu",
    .device = DM_DEVICE_CPU,
    .merge_siblings = 1,
    .runs_pairs = 1,
    .activations_apart = 1,
    .algos = &dm_cpu_gemm_algos,
    .check_options = check_options,
    .resolve_options = resolve_options,
    .attn_op = attn_op,
    .create = create,
    .destroy = destroy,
    .notes = notes,
    .workspace_bytes = workspace_bytes,
    .timed_with = timed_with,
    .upload = upload,
    .download = download,
    .tensor_addr = tensor_addr,
    .run_group = run_group,
    .set_rows = set_rows,
    .set_training = NULL, /* the kernels read each op's probability */
    .sync = sync,
    .profile = profile,
    .profile_take = profile_take,
    .pool_new = pool_new,
    .pool_free = pool_free,
    .pool_bytes = pool_bytes,
    .buf_new = buf_new,
    .buf_free = buf_free,
    .buf_copy = buf_copy,
    .copy_tensor = copy_tensor,
    .add_tensor = add_tensor,
    .sumsq = sumsq,
    .reduce = reduce,
    .bcast = bcast,
    .reduce_wait = reduce_wait,
    .accumulate = accumulate,
    .optimize = optimize,
    .mse = mse,
};
