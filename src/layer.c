/* layer.c: the public dm_layer API: builds the encoder graph, plans it (fused or
 * unfused), lays every tensor out in one arena and runs steps on the CPU backend. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>

#include "analysis/cost.h"
#include "core/hugealloc.h"
#include "core/philox.h"
#include "core/status.h"
#include "cpu/exec.h"
#include "graph/encoder.h"
#include "layer_internal.h"
#include "plan/compile.h"
#ifdef DM_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif


static const dm_export *find_export(const dm_layer *L, const char *name) {
    for (int k = 0; k < L->enc.n; k++)
        if (!strcmp(L->enc.e[k].name, name)) return &L->enc.e[k];
    return NULL;
}

static void fill(float *p, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) p[i] = v;
}

dm_status dm_layer_options_check(const dm_layer_options *opt) {
    if (!opt) return DM_OK;
    if (opt->schedule != DM_SCHED_FUSED && opt->schedule != DM_SCHED_UNFUSED)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown schedule %d", (int)opt->schedule);
    if (opt->threads < 0 || opt->threads > 4096)
        return dm_fail(DM_ERR_INVALID_ARG, "threads must be between 0 (all cores) and 4096");
    if (opt->recompute != 0 && opt->recompute != 1)
        return dm_fail(DM_ERR_INVALID_ARG, "recompute must be 0 or 1 (got %d)", opt->recompute);
    if (opt->recompute && opt->schedule != DM_SCHED_FUSED)
        return dm_fail(DM_ERR_INVALID_ARG, "recomputing attention in the backward pass (--recompute) is a rewrite "
                       "of the fused schedule: leave out --schedule unfused");
    if (opt->device != DM_DEVICE_CPU && opt->device != DM_DEVICE_CUDA)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown device %d", (int)opt->device);
    if (opt->dtype != DM_DTYPE_FP32 && opt->dtype != DM_DTYPE_BF16 && opt->dtype != DM_DTYPE_FP16)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown storage type %d", (int)opt->dtype);
    if (opt->dtype != DM_DTYPE_FP32 && opt->device != DM_DEVICE_CUDA)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s storage needs the CUDA device (--device cuda): "
                       "the CPU backend computes and stores fp32", dm_dtype_name(opt->dtype));
    if (opt->rows != DM_ROWS_DEFAULT && opt->rows != DM_ROWS_INTERP && opt->rows != DM_ROWS_GEN &&
        opt->rows != DM_ROWS_AUTO)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown row kernel choice %d", (int)opt->rows);
    if (opt->streams < 0 || opt->streams > 2)
        return dm_fail(DM_ERR_INVALID_ARG, "streams %d: use 1 or 2", opt->streams);
    if (opt->streams != 0 && opt->device != DM_DEVICE_CUDA)
        return dm_fail(DM_ERR_UNSUPPORTED, "--streams %d chooses the CUDA backend's streams: it "
                       "needs --device cuda", opt->streams);
    if (opt->rows != DM_ROWS_DEFAULT && opt->device != DM_DEVICE_CUDA)
        return dm_fail(DM_ERR_UNSUPPORTED, "--rows %s chooses the CUDA backend's row kernels: it "
                       "needs --device cuda", dm_rows_name(opt->rows));
    return DM_OK;
}

dm_status dm_layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt) {
    return dm_layer_new_with(out, cfg, opt, NULL, 0);
}

static dm_status layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                           const dm_choices *choices, int lenient, int gpu_grouping, struct dm_cuda_pool *pool);

dm_status dm_layer_new_with(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                            const dm_choices *choices, int lenient) {
    return layer_new(out, cfg, opt, choices, lenient, opt && opt->device == DM_DEVICE_CUDA, NULL);
}

dm_status dm_layer_new_pooled(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                              struct dm_cuda_pool *pool) {
    return layer_new(out, cfg, opt, NULL, 0, opt && opt->device == DM_DEVICE_CUDA, pool);
}

dm_status dm_layer_new_gpu_grouping(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt) {
    return layer_new(out, cfg, opt, NULL, 0, 1, NULL);
}

static dm_status layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                           const dm_choices *choices, int lenient, int gpu_grouping, struct dm_cuda_pool *pool) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_new: out is NULL");
    *out = NULL;
    DM_TRY(dm_layer_config_check(cfg));
    dm_layer_options defopt = {0};
    if (!opt) opt = &defopt;
    DM_TRY(dm_layer_options_check(opt));
#ifndef DM_HAVE_CUDA
    if (opt->device == DM_DEVICE_CUDA)
        return dm_fail(DM_ERR_UNSUPPORTED,
                       "dmove was built without CUDA: install the CUDA toolkit (nvcc) and rebuild");
#endif
    dm_layer *L = calloc(1, sizeof *L);
    if (!L) return dm_fail(DM_ERR_OOM, "out of memory");
    L->cfg = *cfg;
    L->opt = *opt;
    L->nthreads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
    /* the graph and its plan; a tuned plan's algorithms are the CPU's (dmove tune measures
     * on the CPU) */
    dm_compile_opts co = {.cfg = cfg, .schedule = opt->schedule, .recompute = opt->recompute,
                          .forward_only = opt->forward_only, .no_input_grad = opt->no_input_grad,
                          .gpu_grouping = gpu_grouping, .no_reuse = opt->no_reuse, .choices = choices,
                          .plan_file = opt->plan, .algos = &dm_cpu_gemm_algos};
    dm_status s = dm_compile(&co, &L->g, &L->enc, &L->plan);
    if (s == DM_OK) {
        L->arena_bytes = (L->plan.arena_bytes + 63) / 64 * 64;
        L->arena = dm_alloc_huge(L->arena_bytes); /* on 2 MiB pages where granted */
        if (!L->arena)
            s = dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB for the layer's tensors: reduce "
                        "batch or sequence length", (double)L->arena_bytes / (1 << 30));
    }
    if (s == DM_OK && (!(L->group_secs = calloc((size_t)L->plan.ngroups + 1, sizeof(double))) ||
                       !(L->gpu_secs = calloc((size_t)L->plan.ngroups + 1, sizeof(double)))))
        s = dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK) {
        memset(L->arena, 0, L->arena_bytes); /* touch every page now, not during a step */
        s = lenient ? dm_cpu_exec_init_lenient(&L->ex, &L->plan, L->arena, L->nthreads)
                    : dm_cpu_exec_init(&L->ex, &L->plan, L->arena, L->nthreads);
        if (s != DM_OK && opt->plan)
            dm_fail_context(s, "plan '%s' does not fit this layer: ", opt->plan);
    }
    if (s != DM_OK) {
        dm_layer_free(L);
        return s;
    }
    openblas_set_num_threads(L->nthreads);
    float *p;
    int nd;
    int64_t sh[4];
    if (dm_layer_tensor(L, "attention_mask", &p, &nd, sh) == DM_OK) fill(p, sh[0] * sh[1], 1.0f);
    if (!opt->forward_only && dm_layer_tensor(L, "grad_output", &p, &nd, sh) == DM_OK)
        fill(p, sh[0] * sh[1] * sh[2], 1.0f);
    const char *ones[2] = {"attention.output.LayerNorm.weight", "output.LayerNorm.weight"};
    for (int k = 0; k < 2; k++)
        if (dm_layer_tensor(L, ones[k], &p, &nd, sh) == DM_OK) fill(p, sh[0], 1.0f);
#ifdef DM_HAVE_CUDA
    if (opt->device == DM_DEVICE_CUDA) {
        /* the same plan on the GPU, and the defaults just written sent up */
        int dt = opt->dtype == DM_DTYPE_BF16   ? DM_CUDA_BF16
                 : opt->dtype == DM_DTYPE_FP16 ? DM_CUDA_FP16
                                               : DM_CUDA_FP32;
        dm_rows rows = DM_ROWS_INTERP;
        int streams = 1;
        s = dm_rows_resolve(opt->rows, &rows);
        if (s == DM_OK) s = dm_streams_resolve(opt->streams, &streams);
        int emulate = 0;
        if (s == DM_OK) s = dm_cuda_emulate_resolve(&emulate);
        if (s == DM_OK)
            s = dm_cuda_exec_init_pooled(&L->cuda, &L->plan, dt,
                                  (rows == DM_ROWS_GEN    ? DM_CUDA_GEN | DM_CUDA_EPILOGUE
                                   : rows == DM_ROWS_AUTO ? DM_CUDA_GEN | DM_CUDA_EPILOGUE | DM_CUDA_AUTO
                                                          : 0) |
                                      (streams == 2 ? DM_CUDA_OVERLAP : 0) | (emulate ? DM_CUDA_EMULATE : 0),
                                      pool);
        if (s == DM_OK) s = dm_layer_to_device(L);
        if (s != DM_OK) {
            dm_layer_free(L);
            return s;
        }
    }
#endif
    *out = L;
    return DM_OK;
}

void dm_layer_cuda_choices(const dm_layer *L, dm_cuda_choices *out) {
    memset(out, 0, sizeof *out);
#ifdef DM_HAVE_CUDA
    if (!L || !L->cuda) return;
    out->row_programs_generated = dm_cuda_exec_generated(L->cuda, &out->row_programs);
    out->attention_fused = dm_cuda_exec_fused(L->cuda);
    out->bias_epilogues = dm_cuda_exec_epilogues(L->cuda);
    out->second_stream = dm_cuda_exec_side_groups(L->cuda);
    snprintf(out->gen_unavailable, sizeof out->gen_unavailable, "%s", dm_cuda_exec_gen_note(L->cuda));
    snprintf(out->gpu, sizeof out->gpu, "%s", dm_cuda_exec_gpu_name(L->cuda));
#else
    (void)L;
#endif
}

void dm_layer_free(dm_layer *L) {
    if (!L) return;
    dm_cpu_exec_free(&L->ex);
#ifdef DM_HAVE_CUDA
    dm_cuda_exec_free(L->cuda);
#endif
    dm_plan_free(&L->plan);
    dm_graph_free(&L->g);
    free(L->arena);
    free(L->group_secs);
    free(L->gpu_secs);
    free(L);
}

dm_status dm_layer_tensor(dm_layer *L, const char *name, float **data, int *ndim, int64_t shape[4]) {
    if (!L || !name || !data) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_tensor: NULL argument");
    const dm_export *e = find_export(L, name);
    if (!e) {
        if (L->opt.forward_only && (strstr(name, "grad") != NULL))
            return dm_fail(DM_ERR_NOT_FOUND, "tensor '%s' does not exist in a forward-only layer", name);
        return dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the layer", name);
    }
    float *p = dm_cpu_tensor_ptr(&L->plan, L->arena, e->tensor);
    if (!p) return dm_fail(DM_ERR_INTERNAL, "tensor '%s' has no memory", name);
    *data = p;
    if (ndim) *ndim = e->ndim;
    if (shape)
        for (int d = 0; d < 4; d++) shape[d] = d < e->ndim ? e->shape[d] : 0;
    return DM_OK;
}

int dm_layer_num_params(const dm_layer *L) { return L ? DM_NUM_PARAMS : 0; }

const char *dm_layer_param_name(const dm_layer *L, int i) {
    return (L && i >= 0 && i < DM_NUM_PARAMS) ? dm_param_names[i] : NULL;
}

dm_status dm_layer_init_params(dm_layer *L, uint64_t seed) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_init_params: NULL layer");
    for (int k = 0; k < DM_NUM_PARAMS; k++) {
        float *p;
        int nd;
        int64_t sh[4];
        DM_TRY(dm_layer_tensor(L, dm_param_names[k], &p, &nd, sh));
        int64_t n = nd == 1 ? sh[0] : sh[0] * sh[1];
        if (strstr(dm_param_names[k], "LayerNorm.weight")) fill(p, n, 1.0f);
        else if (nd == 1) fill(p, n, 0.0f);
        else {
            /* N(0, 0.02) by Box-Muller over Philox words (stream 1000 + parameter) */
            for (int64_t i = 0; i < n; i += 2) {
                uint32_t w[2];
                dm_philox_words(seed, 1000u + (uint32_t)k, (uint64_t)i, 2, w);
                double u1 = ((double)w[0] + 1.0) / 4294967297.0, u2 = (double)w[1] / 4294967296.0;
                double r = sqrt(-2.0 * log(u1)) * 0.02;
                p[i] = (float)(r * cos(2 * M_PI * u2));
                if (i + 1 < n) p[i + 1] = (float)(r * sin(2 * M_PI * u2));
            }
        }
    }
    return DM_OK;
}

dm_status dm_layer_set_seed(dm_layer *L, uint64_t seed) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_set_seed: NULL layer");
    L->cfg.seed = seed;
    return DM_OK;
}

/* One group on the layer's device. While profiling on the host's clock (an emulated GPU:
 * by_events 0), a GPU group is waited for, so that the time taken around it is its own;
 * on a GPU its CUDA events time it. only_c: a batched group runs just its GEMMs;
 * contractions_only: only contraction groups run (on the CPU, a "direct_rows" GEMM then
 * leaves out the row group of its epilogue). */
static dm_status run_group(dm_layer *L, int gi, int only_c, int contractions_only, int by_events) {
#ifdef DM_HAVE_CUDA
    if (L->cuda) { /* profiled on the host (emulating): wait for each group */
        DM_TRY(dm_cuda_exec_group(L->cuda, gi, L->cfg.seed, only_c));
        return L->profile && !by_events ? dm_cuda_sync(L->cuda) : DM_OK;
    }
#else
    (void)by_events;
#endif
    return dm_cpu_exec_group(&L->ex, gi, L->cfg.seed, only_c || contractions_only);
}

dm_status dm_layer_run(dm_layer *L, int passes, unsigned class_mask) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "NULL layer");
    if ((passes & DM_PASS_BACKWARD) && L->opt.forward_only)
        return dm_fail(DM_ERR_INVALID_ARG, "this layer was built forward-only: it has no backward pass");
    if ((passes & DM_PASS_BACKWARD) && !(passes & DM_PASS_FORWARD) && !L->forward_done)
        return dm_fail(DM_ERR_INVALID_ARG, "run the forward pass before the backward pass");
    /* on a GPU a profiled pass times its groups by CUDA events, without waiting after
     * each (so the GPU runs as in an unprofiled pass, the two streams overlapping) */
    int by_events = 0;
#ifdef DM_HAVE_CUDA
    if (L->cuda) DM_TRY(dm_cuda_exec_profile(L->cuda, L->profile, &by_events));
#endif
    for (int gi = 0; gi < L->plan.ngroups; gi++) {
        const dm_group *gr = &L->plan.groups[gi];
        if (!(passes & (gr->pass ? DM_PASS_BACKWARD : DM_PASS_FORWARD))) continue;
        /* a batched group holds contractions and row ops: with only contractions asked
         * for, it runs just its GEMMs */
        const int contractions_only = class_mask == (1u << DM_CLASS_CONTRACTION);
        int only_c = gr->nbatch > 1 && contractions_only;
        if (!(class_mask & (1u << gr->cls))) continue;
        double t0 = L->profile ? omp_get_wtime() : 0;
        DM_TRY(run_group(L, gi, only_c, contractions_only, by_events));
        if (L->profile && !by_events) {
            double dt = omp_get_wtime() - t0;
            L->prof[gr->pass][gr->cls] += dt;
            L->group_secs[gi] += dt;
        }
    }
#ifdef DM_HAVE_CUDA
    /* a pass is over when the GPU is: step timings are true, kernel errors surface here
     * (unless the trainer waits for a whole stack's pass instead) */
    if (L->cuda && !L->defer_wait) DM_TRY(dm_cuda_sync(L->cuda));
    if (by_events) { /* waits for the GPU (even for a trainer's deferred wait), then each group's time */
        DM_TRY(dm_cuda_exec_profile_take(L->cuda, L->gpu_secs));
        for (int gi = 0; gi < L->plan.ngroups; gi++) {
            const dm_group *gr = &L->plan.groups[gi];
            L->prof[gr->pass][gr->cls] += L->gpu_secs[gi];
            L->group_secs[gi] += L->gpu_secs[gi];
        }
    }
#endif
    if (passes & DM_PASS_FORWARD) L->forward_done = 1;
    return DM_OK;
}

dm_status dm_layer_forward(dm_layer *L) { return dm_layer_run(L, DM_PASS_FORWARD, DM_RUN_ALL); }
dm_status dm_layer_backward(dm_layer *L) { return dm_layer_run(L, DM_PASS_BACKWARD, DM_RUN_ALL); }

void dm_layer_profile(dm_layer *L, int enable) {
    if (L) L->profile = enable;
}

void dm_layer_profile_read(const dm_layer *L, double secs[2][DM_NUM_CLASSES]) {
    for (int p = 0; p < 2; p++)
        for (int c = 0; c < DM_NUM_CLASSES; c++) secs[p][c] = L ? L->prof[p][c] : 0;
}

void dm_layer_profile_reset(dm_layer *L) {
    if (!L) return;
    memset(L->prof, 0, sizeof L->prof);
    memset(L->group_secs, 0, sizeof(double) * (size_t)L->plan.ngroups);
}

void dm_layer_memory_info(const dm_layer *L, dm_layer_memory *out) {
    memset(out, 0, sizeof *out);
    if (!L) return;
    /* the plan counts fp32; a GPU layer stores every tensor in its type (its fp32 row
     * statistics, a few KB, aside) */
    const size_t half = L->cuda && L->opt.dtype != DM_DTYPE_FP32;
    out->arena = L->plan.arena_bytes >> half;
    out->activations = L->plan.activation_bytes >> half;
    for (int t = 0; t < L->g.nt; t++) {
        if (L->g.t[t].base >= 0) continue;
        size_t b = ((size_t)L->g.t[t].numel * sizeof(float)) >> half;
        if (L->g.t[t].role == DM_ROLE_PARAM) out->parameters += b;
        else if (L->g.t[t].role == DM_ROLE_INPUT) out->inputs += b;
    }
    if (!L->cuda) out->scratch = (size_t)L->ex.nthreads * (size_t)L->ex.per_thread * sizeof(float);
#ifdef DM_HAVE_CUDA
    else out->scratch = dm_cuda_exec_workspace_bytes(L->cuda);
#endif
}

void dm_layer_flop(const dm_layer *L, double flop[2][DM_NUM_CLASSES]) {
    memset(flop, 0, sizeof(double) * 2 * DM_NUM_CLASSES);
    if (!L) return;
    for (int o = 0; o < L->g.nop; o++) {
        const dm_op *op = &L->g.op[o];
        flop[op->pass][dm_op_kind_class(op->kind)] += dm_op_flop(&L->g, op);
    }
}

dm_status dm_layer_describe(const dm_layer *L, char **text) {
    if (!L || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_describe: NULL argument");
    int cpu = 1; /* the GPU executor runs no pairs (it has its second stream) */
#ifdef DM_HAVE_CUDA
    cpu = L->cuda == NULL;
#endif
    *text = dm_plan_describe(&L->plan, L->group_secs, cpu);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
}

int dm_layer_num_groups(const dm_layer *L) { return L ? L->plan.ngroups : 0; }

double dm_layer_group_seconds(const dm_layer *L, int G) {
    return L && G >= 0 && G < L->plan.ngroups ? L->group_secs[G] : 0.0;
}

dm_status dm_layer_group_info(const dm_layer *L, int G, dm_layer_group *out) {
    if (!L || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_group_info: NULL argument");
    if (G < 0 || G >= L->plan.ngroups)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_group_info: no group %d (the plan has %d)", G,
                       L->plan.ngroups);
    const dm_group *gr = &L->plan.groups[G];
    const dm_graph *g = L->plan.g;
    memset(out, 0, sizeof *out);
    out->pass = gr->pass;
    out->cls = gr->cls;
    out->nops = gr->nops;
    out->seconds = L->group_secs[G];
    dm_cost_group_flop(&L->plan, G, &out->contraction_flop, &out->other_flop);
    /* the storage type: fp32 on the CPU, the device's on the GPU */
    const int esz = L->cuda && L->opt.dtype != DM_DTYPE_FP32 ? 2 : 4;
    DM_TRY(dm_cost_group_io(&L->plan, G, esz, &out->bytes_read, &out->bytes_written));
    size_t len = 0;
    for (int k = 0; k < gr->nops; k++) {
        const char *name = g->op[L->plan.order[gr->first + k]].name;
        const size_t need = strlen(name) + (k ? 3 : 0);
        if (len + need + 4 > sizeof out->ops) { /* room for "..." and the terminator */
            memcpy(out->ops + len, "...", 4);
            len += 3;
            break;
        }
        len += (size_t)snprintf(out->ops + len, sizeof out->ops - len, "%s%s", k ? " + " : "", name);
    }
    out->timed_with = -1;
#ifdef DM_HAVE_CUDA
    if (L->cuda) {
        if (dm_cuda_exec_group_absorbed(L->cuda, G)) out->timed_with = G - 1;
        return DM_OK;
    }
#endif
    if (G < L->ex.ngroups && L->ex.groups[G].rows_of >= 0) out->timed_with = L->ex.groups[G].rows_of;
    if (G < L->ex.ngroups && L->ex.groups[G].beside >= 0) out->timed_with = L->ex.groups[G].beside;
    return DM_OK;
}

const char *dm_device_kind_name(dm_device_kind d) {
    return d == DM_DEVICE_CPU ? "cpu" : d == DM_DEVICE_CUDA ? "cuda" : "?";
}

const char *dm_dtype_name(dm_dtype d) {
    return d == DM_DTYPE_FP32 ? "fp32" : d == DM_DTYPE_BF16 ? "bf16" : d == DM_DTYPE_FP16 ? "fp16" : "?";
}

const char *dm_rows_name(dm_rows r) {
    return r == DM_ROWS_GEN      ? "gen"
           : r == DM_ROWS_AUTO    ? "auto"
           : r == DM_ROWS_INTERP  ? "interp"
           : r == DM_ROWS_DEFAULT ? "default"
                                  : "?";
}

dm_status dm_rows_parse(const char *s, dm_rows *out) {
    if (s && !strcmp(s, "gen")) *out = DM_ROWS_GEN;
    else if (s && !strcmp(s, "auto")) *out = DM_ROWS_AUTO;
    else if (s && !strcmp(s, "interp")) *out = DM_ROWS_INTERP;
    else return dm_fail(DM_ERR_INVALID_ARG, "unknown row kernels '%s': use interp, gen or auto", s ? s : "(null)");
    return DM_OK;
}

/* Is the CUDA backend emulated on the host (DMOVE_CUDA_EMULATE=1)? A bad variable counts
 * as no: layer creation reports it. */
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
dm_status dm_rows_resolve(dm_rows r, dm_rows *out) {
    const char *env = getenv("DMOVE_CUDA_ROWS");
    *out = r != DM_ROWS_DEFAULT ? r : emulating() ? DM_ROWS_INTERP : DM_ROWS_AUTO;
    if (r != DM_ROWS_DEFAULT || !env || !*env) return DM_OK;
    if (dm_rows_parse(env, out) != DM_OK)
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_ROWS='%s': use interp, gen or auto", env);
    return DM_OK;
}

dm_status dm_streams_resolve(int streams, int *out) {
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
    if (strcmp(env, "1") != 0)
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_EMULATE='%s': use 1 (run --device cuda on the host, "
                       "emulated, for tests) or 0", env);
    *on = 1;
    return DM_OK;
}

int dm_layer_tensor_id(const dm_layer *L, const char *name) {
    const dm_export *e = L && name ? find_export(L, name) : NULL;
    return e ? e->tensor : -1;
}

dm_status dm_dtype_parse(const char *s, dm_dtype *out) {
    if (s && !strcmp(s, "fp32")) *out = DM_DTYPE_FP32;
    else if (s && !strcmp(s, "bf16")) *out = DM_DTYPE_BF16;
    else if (s && !strcmp(s, "fp16")) *out = DM_DTYPE_FP16;
    else return dm_fail(DM_ERR_INVALID_ARG, "unknown storage type '%s': use fp32, bf16 or fp16",
                        s ? s : "(null)");
    return DM_OK;
}

dm_status dm_device_kind_parse(const char *s, dm_device_kind *out) {
    if (s && !strcmp(s, "cpu")) *out = DM_DEVICE_CPU;
    else if (s && !strcmp(s, "cuda")) *out = DM_DEVICE_CUDA;
    else return dm_fail(DM_ERR_INVALID_ARG, "unknown device '%s': use cpu or cuda", s ? s : "(null)");
    return DM_OK;
}

/* Copies the user-visible root tensors between the host staging arena and the GPU: up,
 * the inputs and parameters; down, the outputs and parameter gradients. */
static dm_status layer_copy(dm_layer *L, int up) {
#ifdef DM_HAVE_CUDA
    if (!L->cuda) return DM_OK;
    const dm_graph *g = &L->g;
    for (int t = 0; t < g->nt; t++) {
        const dm_tensor *x = &g->t[t];
        if (x->base >= 0 || L->plan.offset[t] < 0) continue;
        int is_in = x->role == DM_ROLE_INPUT || x->role == DM_ROLE_PARAM;
        int is_out = x->role == DM_ROLE_OUTPUT || x->role == DM_ROLE_PARAM_GRAD;
        float *h = dm_cpu_tensor_ptr(&L->plan, L->arena, t);
        if (up && is_in) DM_TRY(dm_cuda_upload(L->cuda, t, h));
        if (!up && is_out) DM_TRY(dm_cuda_download(L->cuda, t, h));
    }
#else
    (void)L;
    (void)up;
#endif
    return DM_OK;
}

dm_status dm_layer_to_device(dm_layer *L) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_to_device: NULL layer");
    return layer_copy(L, 1);
}

dm_status dm_layer_to_host(dm_layer *L) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_to_host: NULL layer");
    return layer_copy(L, 0);
}
