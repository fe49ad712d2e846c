/* layer.c: the public dm_layer API: builds the encoder graph, plans it (fused or
 * unfused), lays every tensor out in one host arena and runs steps on the backend of the
 * layer's device (plan/backend.h), which keeps its own copy where its memory is not the
 * host's. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/cost.h"
#include "core/hugealloc.h"
#include "core/philox.h"
#include "core/sysinfo.h"
#include "core/status.h"
#include "graph/encoder.h"
#include "layer/backends.h"
#include "layer_internal.h"
#include "plan/compile.h"


static const dm_export *find_export(const dm_layer *L, const char *name) {
    for (int k = 0; k < L->enc.n; k++)
        if (!strcmp(L->enc.e[k].name, name)) return &L->enc.e[k];
    return NULL;
}

char *dm_layer_root_addr(const dm_layer *L, int r) { return dm_plan_root_addr(&L->plan, L->arena, L->act, r); }

/* The address of tensor t in the host memory (views included), or NULL if not materialized. */
static float *host_ptr(const dm_layer *L, int t) {
    float *p = (float *)dm_layer_root_addr(L, dm_tensor_root(&L->g, t));
    return p ? p + L->g.t[t].offset : NULL;
}

void dm_layer_act_share_free(dm_layer_act_share *share) {
    if (!share) return;
    free(share->mem);
    share->mem = NULL;
    share->bytes = 0;
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
    if (opt->rows != DM_ROWS_DEFAULT && opt->rows != DM_ROWS_INTERP && opt->rows != DM_ROWS_GEN &&
        opt->rows != DM_ROWS_AUTO)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown row kernel choice %d", (int)opt->rows);
    if (opt->streams < 0 || opt->streams > 2)
        return dm_fail(DM_ERR_INVALID_ARG, "streams %d: use 1 or 2", opt->streams);
    if (opt->unpad != 0 && opt->unpad != 1)
        return dm_fail(DM_ERR_INVALID_ARG, "unpad must be 0 or 1 (got %d)", opt->unpad);
    if (opt->unpad && (opt->recompute || opt->plan))
        return dm_fail(DM_ERR_INVALID_ARG, "an unpadded layer takes no %s: %s", opt->recompute ? "--recompute" : "plan file",
                       opt->recompute ? "its attention keeps the probabilities of the real tokens alone"
                                      : "`dmove tune` tunes the padded layer; leave out --plan");
    if (opt->attention_op < -1 || opt->attention_op > 1)
        return dm_fail(DM_ERR_INVALID_ARG, "attention_op must be -1 (never), 0 (the backend decides) or 1 (always); "
                       "got %d", opt->attention_op);
    /* what the device's backend does not take (a backend not built: dm_layer_new says so) */
    const dm_backend *B = dm_backend_get(opt->device);
    if (B && opt->unpad && !B->set_rows)
        return dm_fail(DM_ERR_UNSUPPORTED, "the %s backend runs no unpadded layer (the real tokens alone): run "
                       "padded there", B->name);
    return B ? B->check_options(opt) : DM_OK;
}

dm_status dm_layer_options_resolve(const dm_layer_options *opt, dm_layer_options *out) {
    if (!opt || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_options_resolve: NULL argument");
    const dm_backend *B;
    dm_layer_options r = *opt; /* resolved on the side: on an error, *out is the options as given */
    *out = r;
    DM_TRY(dm_backend_find(r.device, &B));
    DM_TRY(B->resolve_options(&r));
    *out = r;
    return DM_OK;
}

dm_status dm_layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt) {
    return dm_layer_new_with(out, cfg, opt, NULL, 0);
}

/* gpu_grouping: the plan grouped as the GPU's, whatever the backend
 * (dm_layer_new_gpu_grouping): no sibling batched contractions merged, and the attention
 * as its ops where the backend's own default would take the one op (CUDA's keeps them) */
typedef struct {
    const dm_choices *choices;
    int lenient, gpu_grouping;
    dm_backend_pool *pool;
    dm_layer_act_share *share;
    dm_segment segment;
    const dm_bert_sizes *sizes;
} layer_how;

static dm_status layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                           const layer_how *how);

dm_status dm_layer_new_with(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                            const dm_choices *choices, int lenient) {
    const layer_how how = {.choices = choices, .lenient = lenient};
    return layer_new(out, cfg, opt, &how);
}

dm_status dm_layer_new_pooled(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                              dm_backend_pool *pool, dm_layer_act_share *share) {
    const layer_how how = {.pool = pool, .share = share};
    return layer_new(out, cfg, opt, &how);
}

dm_status dm_layer_new_gpu_grouping(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt) {
    const layer_how how = {.gpu_grouping = 1};
    return layer_new(out, cfg, opt, &how);
}

dm_status dm_layer_new_segment(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                               dm_segment segment, const dm_bert_sizes *sizes, dm_backend_pool *pool) {
    const layer_how how = {.pool = pool, .segment = segment, .sizes = sizes};
    dm_layer_options o = {0};
    if (opt) o = *opt;
    if (segment != DM_SEG_ENCODER) o.unpad = 0; /* the embeddings and heads work on every row they are given */
    return layer_new(out, cfg, &o, &how);
}

/* The defaults of a new layer's inputs and parameters: an attention mask and an output
 * gradient of ones, LayerNorm weights 1 (the rest 0). */
static void layer_defaults(dm_layer *L) {
    for (int k = 0; k < L->enc.n; k++) {
        const dm_export *e = &L->enc.e[k];
        const int ones = !strcmp(e->name, "attention_mask") || !strcmp(e->name, "grad_output") ||
                         (e->is_param && strstr(e->name, "LayerNorm.weight"));
        const int full = !strcmp(e->name, "seq_lengths"); /* every sequence whole */
        if (!ones && !full) continue;
        int64_t n = 1;
        for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
        float *p = host_ptr(L, e->tensor);
        if (p) fill(p, n, full ? (float)L->cfg.seq : 1.0f);
    }
}

static dm_status layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                           const layer_how *how) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_new: out is NULL");
    *out = NULL;
    DM_TRY(dm_layer_config_check(cfg));
    dm_layer_options defopt = {0};
    if (!opt) opt = &defopt;
    DM_TRY(dm_layer_options_check(opt));
    const dm_backend *B;
    DM_TRY(dm_backend_find(opt->device, &B));
    const int siblings = B->merge_siblings && !how->gpu_grouping;
    dm_layer *L = calloc(1, sizeof *L);
    if (!L) return dm_fail(DM_ERR_OOM, "out of memory");
    L->cfg = *cfg;
    L->opt = *opt;
    L->bk = B;
    L->segment = how->segment;
    /* the graph and its plan; a plan file names the algorithms of the backend that runs it,
     * else those of the CPU backend, where `dmove tune` measures */
    const dm_backend *C = B;
    dm_status s = B->algos ? DM_OK : dm_backend_find(DM_DEVICE_CPU, &C);
    /* the padded attention as one op: asked for, or where the backend's kernels win (not
     * under a tuner's choices, which name the attention's ops, nor in the GPU's grouping) */
    const int attn_op = how->segment == DM_SEG_ENCODER && !opt->unpad &&
                        (opt->attention_op > 0 || (opt->attention_op == 0 && !how->choices && !how->gpu_grouping &&
                                                   B->attn_op && B->attn_op(cfg, opt)));
    dm_compile_opts co = {.cfg = cfg, .schedule = opt->schedule, .recompute = opt->recompute,
                          .forward_only = opt->forward_only, .no_input_grad = opt->no_input_grad,
                          .no_siblings = !siblings, .no_reuse = opt->no_reuse, .unpad = opt->unpad, .attn_op = attn_op,
                          .choices = how->choices,
                          .plan_file = opt->plan, .algos = C->algos, .segment = how->segment, .sizes = how->sizes};
    if (s == DM_OK) s = dm_compile(&co, &L->g, &L->enc, &L->plan);
    /* the activations apart, in memory the model's forward-only layers share */
    dm_layer_act_share *share = how->share;
    const size_t act = s == DM_OK ? L->plan.activation_bytes : 0;
    int apart = s == DM_OK && share && opt->forward_only && B->activations_apart && act > 0;
    if (apart && !share->mem) {
        /* touched below at once: past the free memory the kernel would kill the process */
        s = dm_memory_room((int64_t)act, "the layers' activations");
        if (s == DM_OK && !(share->mem = dm_alloc_huge(act)))
            s = dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB for the layers' activations: reduce batch or "
                        "sequence length", (double)act / (1 << 30));
        if (s == DM_OK) {
            memset(share->mem, 0, act);
            share->bytes = act;
        }
    }
    apart = apart && s == DM_OK && act <= share->bytes;
    if (s == DM_OK) {
        L->arena_bytes = ((apart ? L->plan.arena_bytes - act : L->plan.arena_bytes) + 63) / 64 * 64;
        s = dm_memory_room((int64_t)L->arena_bytes, "the layer's tensors");
    }
    if (s == DM_OK) {
        L->arena = dm_alloc_huge(L->arena_bytes); /* on 2 MiB pages where granted */
        if (!L->arena)
            s = dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB for the layer's tensors: reduce "
                        "batch or sequence length", (double)L->arena_bytes / (1 << 30));
    }
    if (s == DM_OK) L->act = apart ? share->mem : L->arena + (L->plan.arena_bytes - act);
    if (s == DM_OK && (!(L->group_secs = calloc((size_t)L->plan.ngroups + 1, sizeof(double))) ||
                       !(L->pass_secs = calloc((size_t)L->plan.ngroups + 1, sizeof(double)))))
        s = dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK) {
        memset(L->arena, 0, L->arena_bytes); /* touch every page now, not during a step */
        s = B->create(&L->st, &L->plan, L->arena, apart ? L->act : NULL, opt, how->lenient ? DM_BACKEND_LENIENT : 0,
                      how->pool);
    }
    if (s != DM_OK) {
        dm_layer_free(L);
        return s;
    }
    layer_defaults(L);
    /* the defaults just written to the backend's memory (where it is not the host's) */
    s = dm_layer_to_device(L);
    if (s != DM_OK) {
        dm_layer_free(L);
        return s;
    }
    *out = L;
    return DM_OK;
}

int dm_layer_notes(const dm_layer *L, const dm_layer_note **notes) {
    if (!notes) return 0;
    *notes = NULL;
    return L && L->st ? L->bk->notes(L->st, notes) : 0;
}

static const dm_layer_note *find_note(const dm_layer *L, const char *key) {
    const dm_layer_note *n = NULL;
    const int k = key ? dm_layer_notes(L, &n) : 0;
    for (int i = 0; i < k; i++)
        if (!strcmp(n[i].key, key)) return &n[i];
    return NULL;
}

double dm_layer_note_value(const dm_layer *L, const char *key, double otherwise) {
    const dm_layer_note *n = find_note(L, key);
    return n && !n->text ? n->value : otherwise;
}

const char *dm_layer_note_text(const dm_layer *L, const char *key) {
    const dm_layer_note *n = find_note(L, key);
    return n && n->text ? n->text : "";
}

void dm_layer_free(dm_layer *L) {
    if (!L) return;
    if (L->st) L->bk->destroy(L->st);
    dm_plan_free(&L->plan);
    dm_graph_free(&L->g);
    free(L->arena);
    free(L->group_secs);
    free(L->pass_secs);
    free(L);
}

/* The exported tensor `name`, or NULL with DM_ERR_NOT_FOUND recorded, saying why. */
static const dm_export *named_export(const dm_layer *L, const char *name) {
    const dm_export *e = find_export(L, name);
    if (!e && L->opt.forward_only && strstr(name, "grad") != NULL)
        dm_fail(DM_ERR_NOT_FOUND, "tensor '%s' does not exist in a forward-only layer", name);
    else if (!e)
        dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the layer", name);
    return e;
}

dm_status dm_layer_tensor(dm_layer *L, const char *name, float **data, int *ndim, int64_t shape[4]) {
    if (!L || !name || !data) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_tensor: NULL argument");
    const dm_export *e = named_export(L, name);
    if (!e) return DM_ERR_NOT_FOUND;
    float *p = host_ptr(L, e->tensor);
    if (!p) return dm_fail(DM_ERR_INTERNAL, "tensor '%s' has no memory", name);
    *data = p;
    if (ndim) *ndim = e->ndim;
    if (shape)
        for (int d = 0; d < 4; d++) shape[d] = d < e->ndim ? e->shape[d] : 0;
    return DM_OK;
}

dm_status dm_layer_device_tensor(dm_layer *L, const char *name, void **data, dm_dtype *dtype) {
    if (!L || !name || !data || !dtype) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_device_tensor: NULL argument");
    const dm_export *e = named_export(L, name);
    if (!e) return DM_ERR_NOT_FOUND;
    int dt = DM_DTYPE_FP32;
    void *p = L->bk->tensor_addr(L->st, e->tensor, &dt);
    if (!p) return dm_fail(DM_ERR_INTERNAL, "tensor '%s' has no memory on the %s backend", name, L->bk->name);
    *data = p;
    *dtype = (dm_dtype)dt;
    return DM_OK;
}

dm_status dm_layer_tensor_to_device(dm_layer *L, const char *name) {
    if (!L || !name) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_tensor_to_device: NULL argument");
    const dm_export *e = named_export(L, name);
    if (!e) return DM_ERR_NOT_FOUND;
    return L->bk->upload(L->st, e->tensor, host_ptr(L, e->tensor));
}

int dm_layer_num_params(const dm_layer *L) {
    int n = 0;
    for (int k = 0; L && k < L->enc.n; k++) n += L->enc.e[k].is_param;
    return n;
}

const char *dm_layer_param_name(const dm_layer *L, int i) {
    for (int k = 0; L && i >= 0 && k < L->enc.n; k++)
        if (L->enc.e[k].is_param && i-- == 0) return L->enc.e[k].name;
    return NULL;
}

dm_status dm_layer_init_params(dm_layer *L, uint64_t seed) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_init_params: NULL layer");
    /* BERT's initialisation (transformers' _init_weights): LayerNorm weights 1, biases 0,
     * weights and embedding tables N(0, 0.02) (a whole model zeroes the padding id's word
     * row itself: train/model.c) */
    const int np = dm_layer_num_params(L);
    for (int k = 0; k < np; k++) {
        const char *name = dm_layer_param_name(L, k);
        float *p;
        int nd;
        int64_t sh[4];
        DM_TRY(dm_layer_tensor(L, name, &p, &nd, sh));
        int64_t n = nd == 1 ? sh[0] : sh[0] * sh[1];
        if (strstr(name, "LayerNorm.weight")) fill(p, n, 1.0f);
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

dm_status dm_layer_set_training(dm_layer *L, int training) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_set_training: NULL layer");
    training = training != 0;
    /* the CPU's kernels read each operator's probability when they run; a backend that
     * fixed them when the layer was made switches its own */
    if (L->bk->set_training) DM_TRY(L->bk->set_training(L->st, training));
    for (int o = 0; o < L->g.nop; o++)
        if (dm_op_params(L->g.op[o].kind) & DM_OPP_DROPOUT) L->g.op[o].p = training ? L->cfg.dropout : 0.0;
    return DM_OK;
}

dm_status dm_layer_set_seed(dm_layer *L, uint64_t seed) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_set_seed: NULL layer");
    L->cfg.seed = seed;
    return DM_OK;
}

dm_status dm_layer_run(dm_layer *L, int passes, unsigned class_mask) {
    if (!L) return dm_fail(DM_ERR_INVALID_ARG, "NULL layer");
    if ((passes & DM_PASS_BACKWARD) && L->opt.forward_only)
        return dm_fail(DM_ERR_INVALID_ARG, "this layer was built forward-only: it has no backward pass");
    if ((passes & DM_PASS_BACKWARD) && !(passes & DM_PASS_FORWARD) && !L->forward_done)
        return dm_fail(DM_ERR_INVALID_ARG, "run the forward pass before the backward pass");
    /* a backend with device timers (a GPU's CUDA events) times a profiled pass's groups
     * itself, without waiting after each (so the device runs as in an unprofiled pass, its
     * streams overlapping); otherwise each group is timed here on the host's clock, the
     * backend returning when it is done */
    const dm_backend *B = L->bk;
    int by_events = 0;
    DM_TRY(B->profile(L->st, L->profile, &by_events));
    /* with only contractions asked for, a batched group (contractions and row ops) runs
     * just its GEMMs, and a "direct_rows" GEMM leaves out the row group of its epilogue */
    const int contractions_only = class_mask == (1u << DM_CLASS_CONTRACTION);
    if (L->opt.unpad && (passes & DM_PASS_FORWARD)) { /* this step's lengths, as the host copy has them */
        int t = dm_layer_tensor_id(L, "seq_lengths");
        if (t < 0) return dm_fail(DM_ERR_INTERNAL, "unpadded layer without seq_lengths");
        DM_TRY(B->set_rows(L->st, 0, host_ptr(L, t)));
    }
    for (int gi = 0; gi < L->plan.ngroups; gi++) {
        const dm_group *gr = &L->plan.groups[gi];
        if (!(passes & (gr->pass ? DM_PASS_BACKWARD : DM_PASS_FORWARD))) continue;
        if (!(class_mask & (1u << gr->cls))) continue;
        double t0 = L->profile ? omp_get_wtime() : 0;
        DM_TRY(B->run_group(L->st, gi, L->cfg.seed, contractions_only));
        if (L->profile && !by_events) {
            double dt = omp_get_wtime() - t0;
            L->prof[gr->pass][gr->cls] += dt;
            L->group_secs[gi] += dt;
        }
    }
    /* a pass is over when the device is: step timings are true, kernel errors surface
     * here (unless the trainer waits for a whole stack's pass instead) */
    if (!L->defer_wait) DM_TRY(B->sync(L->st));
    if (by_events) { /* waits for the device (even for a trainer's deferred wait), then each group's time */
        DM_TRY(B->profile_take(L->st, L->pass_secs));
        for (int gi = 0; gi < L->plan.ngroups; gi++) {
            const dm_group *gr = &L->plan.groups[gi];
            L->prof[gr->pass][gr->cls] += L->pass_secs[gi];
            L->group_secs[gi] += L->pass_secs[gi];
        }
    }
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
    /* the plan counts fp32; a layer stores every tensor in its storage type (a GPU's fp32
     * row statistics, a few KB, aside): the CPU's is always fp32 */
    const size_t half = L->opt.dtype != DM_DTYPE_FP32;
    /* a layer whose activations are shared (dm_layer_act_share) holds only the rest */
    const size_t own = L->plan.arena_bytes - L->plan.activation_bytes;
    out->arena = (L->act == L->arena + own ? L->plan.arena_bytes : own) >> half;
    out->activations = L->plan.activation_bytes >> half;
    for (int t = 0; t < L->g.nt; t++) {
        if (L->g.t[t].base >= 0) continue;
        size_t b = ((size_t)L->g.t[t].numel * sizeof(float)) >> half;
        if (L->g.t[t].role == DM_ROLE_PARAM) out->parameters += b;
        else if (L->g.t[t].role == DM_ROLE_INPUT) out->inputs += b;
    }
    out->scratch = L->bk->workspace_bytes(L->st);
}

void dm_layer_flop(const dm_layer *L, double flop[2][DM_NUM_CLASSES]) {
    memset(flop, 0, sizeof(double) * 2 * DM_NUM_CLASSES);
    if (!L) return;
    for (int o = 0; o < L->g.nop; o++) {
        const dm_op *op = &L->g.op[o];
        /* a fused op's row work (the attention's softmax, the cross-entropy) in the
         * classes of the ops it stands for: its contraction flop are its GEMMs' alone */
        flop[op->pass][dm_op_kind_class(op->kind)] += dm_op_flop(&L->g, op) - dm_op_row_flop(op);
        dm_op_row_flop_classes(op, flop[op->pass]);
    }
}

dm_status dm_layer_describe(const dm_layer *L, char **text) {
    if (!L || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_layer_describe: NULL argument");
    *text = dm_plan_describe(&L->plan, L->group_secs, L->bk->runs_pairs);
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
    const int esz = L->opt.dtype != DM_DTYPE_FP32 ? 2 : 4;
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
    out->timed_with = L->bk->timed_with(L->st, G);
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

/* Copies the user-visible root tensors between the host arena and the backend's memory
 * (nothing moves where that is the host arena): up, the inputs and parameters; down, the
 * outputs and parameter gradients. */
static dm_status layer_copy(dm_layer *L, int up) {
    const dm_graph *g = &L->g;
    for (int t = 0; t < g->nt; t++) {
        const dm_tensor *x = &g->t[t];
        if (x->base >= 0 || L->plan.offset[t] < 0) continue;
        int is_in = x->role == DM_ROLE_INPUT || x->role == DM_ROLE_PARAM;
        int is_out = x->role == DM_ROLE_OUTPUT || x->role == DM_ROLE_PARAM_GRAD;
        float *h = host_ptr(L, t);
        if (up && is_in) DM_TRY(L->bk->upload(L->st, t, h));
        if (!up && is_out) DM_TRY(L->bk->download(L->st, t, h));
    }
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
