/* test_cuda.c: the CUDA backend against the CPU backend (design.md: CPU == CUDA, same
 * plan). Without CUDA compiled in, it checks that asking for the CUDA device fails with
 * DM_ERR_UNSUPPORTED, prints "SKIP: ..." and passes. With CUDA compiled in:
 *  - always, without a GPU: the suite below on the emulated executor (DM_CUDA_EMULATE:
 *    host memory, the cuBLAS calls and row programs run on the CPU), which checks the
 *    executor's mapping of the plan; then, with no GPU, "SKIP: no CUDA device (...)";
 *  - on a GPU: the device's Philox words equal the CPU's, then the suite on the GPU.
 * Layers whose plan goes to the CUDA executor are made by dm_layer_new_gpu_grouping: the
 * GPU's grouping (the CPU's plans also merge sibling batched contractions, which the
 * fused attention kernels do not take), on a host layer where emulated.
 * The suite: (1) every group of the fused and the unfused plan, run alone on both
 * backends from the same random arena, the GPU's outputs poisoned with NaN first (every
 * element must be written): relative error per output tensor < 1e-5; (2) the whole
 * layer, forward and backward, with padding and dropout 0.1, on small configurations:
 * relative error per tensor < 1e-5, every error printed; on the GPU a second step must
 * repeat the first bit for bit. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dmove.h"
#include "testutil.h"

#ifdef DM_HAVE_CUDA
#include "core/philox.h"
#include "cpu/backend.h"
#include "cuda/cuda_backend.h"
#include "layer/layer_internal.h"
#endif

/* A small layer; p = 0.1 so the dropout paths run. */
static dm_layer_config small_config(int64_t b, int64_t j, int64_t i, int64_t h, int64_t u,
                                    dm_act act) {
    dm_layer_config c;
    dm_layer_config_default(&c);
    c.batch = b, c.seq = j, c.hidden = i, c.heads = h, c.ffn = u;
    c.dropout = 0.1;
    c.act = act;
    c.seed = 0x1234567890abcdefull; /* both key halves non-zero */
    return c;
}

#ifdef DM_HAVE_CUDA

static uint64_t g_rng = 88172645463325252ull;

static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void test_philox(void) {
    static const struct {
        uint64_t seed;
        uint32_t stream;
        uint64_t start;
        int64_t n;
    } cases[] = {
        {0, 1, 0, 1000},
        {0x1234567890abcdefull, 2, 3, 777},              /* start inside a block */
        {0xffffffffffffffffull, 3, (1ull << 34) - 6, 64}, /* block index crosses 2^32 */
        {42, 1, (1ull << 34) + 1, 129},                   /* high counter word 1 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t n = cases[k].n;
        uint32_t *cpu = malloc(sizeof(uint32_t) * (size_t)n), *gpu = malloc(sizeof(uint32_t) * (size_t)n);
        dm_philox_words_ref(cases[k].seed, cases[k].stream, cases[k].start, n, cpu);
        memset(gpu, 0, sizeof(uint32_t) * (size_t)n);
        CHECK_OK(dm_cuda_philox_words(cases[k].seed, cases[k].stream, cases[k].start, n, gpu));
        int64_t bad = 0;
        for (int64_t e = 0; e < n; e++) bad += cpu[e] != gpu[e];
        CHECK(bad == 0);
        printf("philox seed %016llx stream %u start %llu n %lld: %lld mismatches %s\n",
               (unsigned long long)cases[k].seed, cases[k].stream,
               (unsigned long long)cases[k].start, (long long)n, (long long)bad,
               bad ? "FAIL" : "ok");
        free(cpu);
        free(gpu);
    }
}

/* Offsets (floats from the arena start) of every element of tensor t, in logical
 * order; returns the count. */
static int64_t element_offsets(const dm_layer *L, int t, int64_t *offs) {
    const dm_graph *g = &L->g;
    const dm_tensor *x = &g->t[t];
    int r = dm_tensor_root(g, t);
    int64_t base = L->plan.offset[r] / 4 + x->offset;
    int64_t idx[DM_MAX_DIMS] = {0};
    for (int64_t e = 0; e < x->numel; e++) {
        int64_t o = base;
        for (int d = 0; d < x->ndim; d++) o += idx[d] * x->stride[d];
        offs[e] = o;
        for (int d = x->ndim - 1; d >= 0; d--) {
            if (++idx[d] < x->size[d]) break;
            idx[d] = 0;
        }
    }
    return x->numel;
}

/* A valid attention mask in a whole-arena buffer: 1, except the last tokens of every
 * sequence but the first (padding), so MASK_ADD never sees values other than 0 and 1. */
static void set_mask(dm_layer *L, float *arena_copy) {
    float *p;
    int nd;
    int64_t sh[4];
    if (dm_layer_tensor(L, "attention_mask", &p, &nd, sh) != DM_OK) return;
    int64_t off = p - (float *)L->arena;
    for (int64_t b = 0; b < sh[0]; b++)
        for (int64_t k = 0; k < sh[1]; k++)
            arena_copy[off + b * sh[1] + k] = (b > 0 && k >= sh[1] - b) ? 0.0f : 1.0f;
}

/* Every group of the plan alone on both backends, from the same random arena. */
static const char *dtype_name(int dtype) {
    return dtype == DM_CUDA_BF16 ? "bf16" : dtype == DM_CUDA_FP16 ? "fp16" : "fp32";
}

/* The bar per storage type (issue: fp32 1e-5; bf16 1e-2), fp16 as bf16. */
static double tolerance(int dtype) { return dtype == DM_CUDA_FP32 ? 1e-5 : 1e-2; }

/* Does root r, an output of group gr, share its bytes with an input of the group (the
 * memory planner's in-place outputs)? */
static int over_input(const dm_layer *L, const dm_group *gr, int r) {
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &L->g.op[L->plan.order[gr->first + k]];
        for (int s = 0; s < op->nin; s++) {
            int q = dm_tensor_root(&L->g, op->in[s]);
            if (q != r && L->plan.offset[q] >= 0 && L->plan.offset[q] == L->plan.offset[r]) return 1;
        }
    }
    return 0;
}

static void test_groups(const dm_layer_config *cfg, dm_schedule sched, unsigned flags,
                        const char *label, int dtype) {
    dm_layer *L = NULL;
    dm_layer_options opt = {.schedule = sched, .threads = 2};
    CHECK_OK(dm_layer_new_gpu_grouping(&L, cfg, &opt));
    if (!L) return;
    dm_cuda_exec *ex = NULL;
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, dtype, flags));
    if (!ex) {
        dm_layer_free(L);
        return;
    }
    size_t bytes = L->plan.arena_bytes, nf = bytes / 4;
    float *init = malloc(bytes), *gpu = malloc(bytes);
    int64_t *offs = NULL;
    int64_t maxn = 1;
    for (int t = 0; t < L->g.nt; t++)
        if (L->g.t[t].numel > maxn) maxn = L->g.t[t].numel;
    offs = malloc(sizeof(int64_t) * (size_t)maxn);
    float *a = malloc(sizeof(float) * (size_t)maxn), *b = malloc(sizeof(float) * (size_t)maxn);
    if (!init || !gpu || !offs || !a || !b) {
        CHECK(!"out of memory");
        goto done;
    }
    const uint64_t seed = cfg->seed;
    for (int gi = 0; gi < L->plan.ngroups; gi++) {
        const dm_group *gr = &L->plan.groups[gi];
        const dm_op *op0 = &L->g.op[L->plan.order[gr->first]];
        for (size_t e = 0; e < nf; e++) init[e] = frand();
        set_mask(L, init);
        dm_cuda_round(dtype, init, nf); /* both backends start from what the GPU stores */
        memcpy(L->arena, init, bytes);
        /* the GPU starts from the same arena with the group's outputs poisoned (but
         * those written in place over an input of the group: memplan.c; unwritten, they
         * would keep the input's values, which the comparison catches) */
        memcpy(gpu, init, bytes);
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &L->g.op[L->plan.order[gr->first + k]];
            for (int s = 0; s < op->nout; s++) {
                int t = op->out[s];
                if (!L->plan.in_memory[dm_tensor_root(&L->g, t)] || over_input(L, gr, dm_tensor_root(&L->g, t)))
                    continue;
                int64_t n = element_offsets(L, t, offs);
                for (int64_t e = 0; e < n; e++) gpu[offs[e]] = NAN;
            }
        }
        CHECK_OK(dm_cuda_upload_arena(ex, gpu));
        CHECK_OK(dm_cpu_exec_group(dm_cpu_backend_exec(L->bk, L->st), gi, seed, 0));
        CHECK_OK(dm_cuda_exec_group(ex, gi, seed, 0));
        CHECK_OK(dm_cuda_sync(ex));
        CHECK_OK(dm_cuda_download_arena(ex, gpu));
        /* tensors sharing bytes convert separately in bf16/fp16: read each output itself */
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &L->g.op[L->plan.order[gr->first + k]];
            for (int s = 0; s < op->nout; s++) {
                int t = op->out[s], r = dm_tensor_root(&L->g, t);
                if (!L->plan.in_memory[r]) continue;
                float *at = (float *)((char *)gpu + L->plan.offset[r]) + L->g.t[t].offset;
                CHECK_OK(dm_cuda_download(ex, t, at));
            }
        }
        double worst = 0;
        int ok = 1;
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &L->g.op[L->plan.order[gr->first + k]];
            for (int s = 0; s < op->nout; s++) {
                int t = op->out[s];
                if (!L->plan.in_memory[dm_tensor_root(&L->g, t)]) continue;
                int64_t n = element_offsets(L, t, offs), nan = 0;
                for (int64_t e = 0; e < n; e++) {
                    a[e] = gpu[offs[e]];
                    b[e] = ((float *)L->arena)[offs[e]];
                    nan += isnan(a[e]) && !isnan(b[e]);
                }
                /* the GPU stores its outputs in the storage type: so does the reference
                 * (a masked score, -FLT_MAX, becomes the type's lowest finite value) */
                dm_cuda_round(dtype, b, (size_t)n);
                double err = rel_err(a, b, (size_t)n);
                int good = nan == 0 && err < tolerance(dtype);
                CHECK(good);
                if (!good) {
                    ok = 0;
                    fprintf(stderr, "  %s group %d (%s) output %s: rel.err %.2e, %lld of %lld "
                            "elements not written\n", label, gi, op0->name, L->g.t[t].name, err,
                            (long long)nan, (long long)n);
                }
                if (err > worst || isnan(err)) worst = err;
            }
        }
        printf("  %s group %2d %-26s worst rel.err %.2e %s\n", label, gi, op0->name, worst,
               ok ? "ok" : "FAIL");
    }
done:
    free(init);
    free(gpu);
    free(offs);
    free(a);
    free(b);
    dm_cuda_exec_free(ex);
    dm_layer_free(L);
}

static size_t tensor_numel(dm_layer *L, const char *name, float **p) {
    int nd = 0;
    int64_t sh[4] = {0};
    if (dm_layer_tensor(L, name, p, &nd, sh) != DM_OK) return 0;
    size_t n = 1;
    for (int d = 0; d < nd; d++) n *= (size_t)sh[d];
    return n;
}

/* The layer's results: output, grad_hidden_states and every "<param>.grad". */
static int export_id(const dm_layer *L, const char *name) {
    for (int k = 0; k < L->enc.n; k++)
        if (!strcmp(L->enc.e[k].name, name)) return L->enc.e[k].tensor;
    return -1;
}

/* (grad_hidden_states only where the layer builds it: not with no_input_grad) */
static int result_name(dm_layer *L, int k, char *buf, size_t n) {
    const int dx = export_id(L, "grad_hidden_states") >= 0;
    if (k == 0) snprintf(buf, n, "output");
    else if (k == 1 && dx) snprintf(buf, n, "grad_hidden_states");
    else if (k - 1 - dx < dm_layer_num_params(L)) snprintf(buf, n, "%s.grad", dm_layer_param_name(L, k - 1 - dx));
    else return 0;
    return 1;
}

/* test_layer's layers build no input gradient (as the first layer of a trained stack) */
static int g_no_dx;
static int g_recompute; /* the GPU's layer recomputes attention in the backward pass */

/* The layer on the CPU (C) and on the GPU (G), same inputs, padding and dropout. On a GPU,
 * G is a DM_DEVICE_CUDA layer used through the public API. Emulating, G is a CPU layer
 * whose plan an emulated executor runs group by group (as dm_layer_run does). */
static void test_layer(const dm_layer_config *cfg, dm_schedule sched, int emulate, int dtype,
                       unsigned gen) {
    printf("%s%s%s%slayer b=%lld j=%lld i=%lld h=%lld u=%lld p=%g %s%s%s, %s, %s storage:\n",
           emulate ? "emulated " : "", (gen & DM_CUDA_OVERLAP) ? "two-stream " : "",
           (gen & DM_CUDA_AUTO) ? "auto-chosen " : "",
           (gen & DM_CUDA_SIM_LANES) ? "generated-kernel (simulated lanes) " : (gen & DM_CUDA_GEN) ? "generated-kernel " : "", (long long)cfg->batch, (long long)cfg->seq,
           (long long)cfg->hidden, (long long)cfg->heads, (long long)cfg->ffn, cfg->dropout,
           dm_act_name(cfg->act), cfg->norm == DM_NORM_PRE ? " pre-LN" : "", cfg->causal ? " causal" : "",
           sched == DM_SCHED_FUSED ? "fused" : "unfused", dtype_name(dtype));
    dm_layer *C = NULL, *G = NULL;
    dm_cuda_exec *ex = NULL;
    float *first[64] = {0};
    dm_layer_options oc = {.schedule = sched, .threads = 2, .no_input_grad = g_no_dx};
    dm_layer_options og = {.schedule = sched, .threads = 2, .attention_op = -1, /* its ops (test_unpad: one op) */
                           .device = emulate ? DM_DEVICE_CPU : DM_DEVICE_CUDA,
                           .rows = emulate                ? DM_ROWS_DEFAULT /* a CPU layer */
                                   : (gen & DM_CUDA_AUTO) ? DM_ROWS_AUTO
                                   : (gen & DM_CUDA_GEN)  ? DM_ROWS_GEN
                                                          : DM_ROWS_INTERP,
                           .streams = emulate ? 0 : (gen & DM_CUDA_OVERLAP) ? 2 : 1,
                           .dtype = emulate                 ? DM_DTYPE_FP32 /* a CPU layer */
                                    : dtype == DM_CUDA_BF16 ? DM_DTYPE_BF16
                                    : dtype == DM_CUDA_FP16 ? DM_DTYPE_FP16
                                                            : DM_DTYPE_FP32,
                           .no_input_grad = g_no_dx,
                           .recompute = g_recompute};
    CHECK_OK(dm_layer_new(&C, cfg, &oc));
    CHECK_OK(dm_layer_new_gpu_grouping(&G, cfg, &og));
    if (!C || !G) goto done;
    CHECK_OK(dm_layer_init_params(C, 7));
    CHECK_OK(dm_layer_init_params(G, 7));
    static const char *const inputs[2] = {"hidden_states", "grad_output"};
    for (int k = 0; k < 2; k++) {
        float *pc, *pg;
        size_t n = tensor_numel(C, inputs[k], &pc);
        CHECK(n > 0 && tensor_numel(G, inputs[k], &pg) == n);
        for (size_t e = 0; e < n; e++) pc[e] = pg[e] = frand();
    }
    /* the CPU computes from the values the GPU stores; biases nonzero (BERT's
     * initialisation zeroes them), so that every bias path adds something */
    for (int k = 0; k < dm_layer_num_params(C); k++) {
        float *pc, *pg;
        size_t n = tensor_numel(C, dm_layer_param_name(C, k), &pc);
        CHECK(tensor_numel(G, dm_layer_param_name(G, k), &pg) == n);
        const char *pn = dm_layer_param_name(C, k);
        if (strstr(pn, ".bias") && !strstr(pn, "LayerNorm"))
            for (size_t e = 0; e < n; e++) pc[e] = pg[e] = 0.02f * frand();
        dm_cuda_round(dtype, pc, n);
        dm_cuda_round(dtype, pg, n);
    }
    for (int k = 0; k < 2; k++) {
        float *pc, *pg;
        size_t n = tensor_numel(C, inputs[k], &pc);
        CHECK(tensor_numel(G, inputs[k], &pg) == n);
        dm_cuda_round(dtype, pc, n);
        dm_cuda_round(dtype, pg, n);
    }
    {
        float *mc, *mg;
        int nd;
        int64_t sh[4];
        CHECK_OK(dm_layer_tensor(C, "attention_mask", &mc, &nd, sh));
        CHECK_OK(dm_layer_tensor(G, "attention_mask", &mg, &nd, sh));
        for (int64_t b = 0; b < sh[0]; b++) /* sequence b has b + 1 padding tokens (< j) */
            for (int64_t k = 0; k < sh[1]; k++)
                mc[b * sh[1] + k] = mg[b * sh[1] + k] = k >= sh[1] - (b + 1) && k > 0 ? 0.0f : 1.0f;
    }
    CHECK_OK(dm_layer_forward(C));
    CHECK_OK(dm_layer_backward(C));
    char name[128];
    if (emulate) {
        /* a layer with generated row kernels also takes the bias epilogues */
        CHECK_OK(dm_cuda_exec_init(&ex, &G->plan, dtype, DM_CUDA_EMULATE | gen | ((gen & DM_CUDA_GEN) ? DM_CUDA_EPILOGUE : 0)));
        if (!ex) goto done;
        CHECK_OK(dm_cuda_upload_arena(ex, G->arena));
        for (int pass = 0; pass < 2; pass++)
            for (int gi = 0; gi < G->plan.ngroups; gi++)
                if (G->plan.groups[gi].pass == pass) CHECK_OK(dm_cuda_exec_group(ex, gi, cfg->seed, 0));
        CHECK_OK(dm_cuda_sync(ex));
    } else {
        CHECK_OK(dm_layer_to_device(G));
        CHECK_OK(dm_layer_forward(G));
        CHECK_OK(dm_layer_backward(G));
    }
    /* poison the host copies: the download must bring every element */
    for (int k = 0; result_name(G, k, name, sizeof name); k++) {
        float *p;
        size_t n = tensor_numel(G, name, &p);
        for (size_t e = 0; e < n; e++) p[e] = NAN;
    }
    if (emulate) {
        for (int k = 0; result_name(G, k, name, sizeof name); k++) {
            float *p;
            tensor_numel(G, name, &p);
            CHECK_OK(dm_cuda_download(ex, export_id(G, name), p));
        }
    } else {
        CHECK_OK(dm_layer_to_host(G));
    }
    for (int k = 0; result_name(G, k, name, sizeof name) && k < 64; k++) {
        float *pc, *pg;
        size_t n = tensor_numel(C, name, &pc);
        CHECK(n > 0 && tensor_numel(G, name, &pg) == n);
        size_t nan = 0;
        for (size_t e = 0; e < n; e++) nan += isnan(pg[e]) != 0;
        double err = rel_err(pg, pc, n);
        /* the key bias's exact gradient is 0 (the softmax cancels it; tests/ref/make_refs.py):
         * both backends give round-off, so measure the difference against the key weight's
         * gradient instead */
        int kb = !strcmp(name, "attention.self.key.bias.grad");
        if (kb) {
            float *kw;
            size_t nw = tensor_numel(C, "attention.self.key.weight.grad", &kw);
            double d = 0, r = 0;
            for (size_t e = 0; e < n; e++) d += ((double)pg[e] - pc[e]) * ((double)pg[e] - pc[e]);
            for (size_t e = 0; e < nw; e++) r += (double)kw[e] * kw[e];
            err = r > 0 ? sqrt(d / r) : sqrt(d);
        }
        int ok = nan == 0 && err < tolerance(dtype);
        CHECK(ok);
        printf("  %-42s rel.err %.2e%s%s %s\n", name, err, kb ? " (vs key.weight.grad)" : "",
               nan ? " (NaN)" : "", ok ? "ok" : "FAIL");
        first[k] = malloc(n * sizeof(float));
        if (first[k]) memcpy(first[k], pg, n * sizeof(float));
    }
    if (emulate) goto done;
    /* a second step must repeat the first exactly (deterministic reductions) */
    CHECK_OK(dm_layer_forward(G));
    CHECK_OK(dm_layer_backward(G));
    CHECK_OK(dm_layer_to_host(G));
    size_t diff = 0;
    for (int k = 0; result_name(G, k, name, sizeof name) && k < 64; k++) {
        float *pg;
        size_t n = tensor_numel(G, name, &pg);
        if (first[k]) diff += memcmp(first[k], pg, n * sizeof(float)) != 0;
    }
    CHECK(diff == 0);
    printf("  second step on the GPU: %s\n", diff ? "DIFFERS (FAIL)" : "bit-identical");
    /* the contractions alone (bench's floor) run too */
    CHECK_OK(dm_layer_run(G, DM_PASS_FORWARD | DM_PASS_BACKWARD, 1u << DM_CLASS_CONTRACTION));
done:
    for (int k = 0; k < 64; k++) free(first[k]);
    dm_cuda_exec_free(ex);
    dm_layer_free(C);
    dm_layer_free(G);
}

/* Groups alone and whole layers; `emulate`: DM_CUDA_EMULATE (no GPU) or 0 (the GPU: the
 * groups then run with DM_CUDA_SYNC_EACH, so a fault names its group); `gen`:
 * DM_CUDA_GEN (row groups as generated kernels where they qualify) or 0. */
static int fused_count(const dm_layer_config *cfg, int dtype, unsigned flags, int tails);

static void run_suite(unsigned emulate, int dtype, unsigned gen) {
    char m[64], label[96];
    snprintf(m, sizeof m, "%s%s%s%s", emulate ? "emulated " : "", gen ? "gen " : "",
             dtype == DM_CUDA_FP32 ? "" : dtype_name(dtype), dtype == DM_CUDA_FP32 ? "" : " ");
    dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
    dm_layer_config b = small_config(3, 13, 48, 3, 96, DM_ACT_GELU_TANH); /* odd sizes */
    /* rows > 256. ReLU in fp32 only: its derivative is a step, and the CPU's fp32
     * pre-activations and the GPU's rounded ones fall on different sides of 0 for ~0.1%
     * of the elements, each a full-size difference in the FFN's gradients (measured on
     * an H100: 3.6e-2 in bf16, 1.4e-2 in fp16); the smooth GELU shows the storage's own
     * rounding. Groups alone run ReLU in every type (same inputs on both sides). */
    dm_layer_config c = small_config(2, 40, 320, 5, 1280, DM_ACT_RELU);
    dm_layer_config c_smooth = small_config(2, 40, 320, 5, 1280, DM_ACT_GELU);
    /* the layer variants: pre-LN and causal (the fused attention kernels' mask too), and
     * a causal post-LN layer of odd sizes */
    dm_layer_config v = small_config(2, 24, 64, 4, 256, DM_ACT_GELU);
    v.norm = DM_NORM_PRE, v.causal = 1;
    dm_layer_config w = b;
    w.causal = 1;
    const unsigned f = emulate | gen | DM_CUDA_SYNC_EACH;
    snprintf(label, sizeof label, "%sA fused", m);
    test_groups(&a, DM_SCHED_FUSED, f, label, dtype);
    snprintf(label, sizeof label, "%sA unfused", m);
    test_groups(&a, DM_SCHED_UNFUSED, f, label, dtype);
    snprintf(label, sizeof label, "%sB fused", m);
    test_groups(&b, DM_SCHED_FUSED, f, label, dtype);
    snprintf(label, sizeof label, "%sC fused", m);
    test_groups(&c, DM_SCHED_FUSED, f, label, dtype);
    snprintf(label, sizeof label, "%sV (pre-LN, causal) fused", m);
    test_groups(&v, DM_SCHED_FUSED, f, label, dtype);
    test_layer(&v, DM_SCHED_FUSED, emulate != 0, dtype, gen);
    test_layer(&w, DM_SCHED_FUSED, emulate != 0, dtype, gen);
    if (!gen) test_layer(&v, DM_SCHED_UNFUSED, emulate != 0, dtype, gen);
    if (gen && dtype != DM_CUDA_FP32) { /* the fused attention kernels' other shapes: three
                                         * and nine row tiles per item, in one block */
        dm_layer_config e = small_config(2, 48, 64, 2, 128, DM_ACT_GELU);
        dm_layer_config f2 = small_config(1, 144, 64, 2, 128, DM_ACT_GELU);
        snprintf(label, sizeof label, "%sE fused", m);
        test_groups(&e, DM_SCHED_FUSED, f, label, dtype);
        snprintf(label, sizeof label, "%sF fused", m);
        test_groups(&f2, DM_SCHED_FUSED, f, label, dtype);
        test_layer(&e, DM_SCHED_FUSED, emulate != 0, dtype, gen | DM_CUDA_OVERLAP);
        /* the path BERT-large at j=512 takes: 24 row tiles per item are too many for one
         * backward block, so the kernel stores the d scores and cuBLAS makes the d keys
         * after it; head width 64 (four k-steps); both kernels above 48 KB of shared
         * memory (the opt-in attribute); 48 chunks per row on a team of 32 lanes */
        dm_layer_config g2 = small_config(1, 384, 128, 2, 256, DM_ACT_GELU);
        CHECK(fused_count(&g2, dtype, emulate | gen, 1) ==
              (getenv("DMOVE_CUDA_FUSE") && !strcmp(getenv("DMOVE_CUDA_FUSE"), "0") ? 0 : 1));
        snprintf(label, sizeof label, "%sG fused (j=384, p=64)", m);
        test_groups(&g2, DM_SCHED_FUSED, f, label, dtype);
        test_layer(&g2, DM_SCHED_FUSED, emulate != 0, dtype, gen);
        /* --rows auto: on the GPU, real timings pick per group (a mix is possible) */
        test_layer(&a, DM_SCHED_FUSED, emulate != 0, dtype, gen | DM_CUDA_AUTO | DM_CUDA_OVERLAP);
    }
    if (dtype == DM_CUDA_FP32 && !gen) { /* the fallbacks and the rest once, in fp32 */
        snprintf(label, sizeof label, "%sA fused, global scratch", m);
        test_groups(&a, DM_SCHED_FUSED, f | DM_CUDA_GLOBAL_SCRATCH, label, dtype);
        snprintf(label, sizeof label, "%sB unfused", m);
        test_groups(&b, DM_SCHED_UNFUSED, f, label, dtype);
    }
    const dm_layer_config *cfgs[3] = {&a, &b, dtype == DM_CUDA_FP32 ? &c : &c_smooth};
    for (int k = 0; k < 3; k++) {
        test_layer(cfgs[k], DM_SCHED_FUSED, emulate != 0, dtype, gen);
        if (!gen) test_layer(cfgs[k], DM_SCHED_UNFUSED, emulate != 0, dtype, gen);
    }
    /* the weight-gradient GEMMs on a second stream (emulating: each deferred to the
     * last moment the hazards allow, so a missed one gives wrong numbers) */
    test_layer(&a, DM_SCHED_FUSED, emulate != 0, dtype, gen | DM_CUDA_OVERLAP);
    if (!gen) test_layer(&b, DM_SCHED_UNFUSED, emulate != 0, dtype, gen | DM_CUDA_OVERLAP);
    /* a layer that builds no input gradient (the first of a trained stack) */
    printf("(no input gradient)\n");
    g_no_dx = 1;
    test_layer(&b, DM_SCHED_FUSED, emulate != 0, dtype, gen);
    g_no_dx = 0;
    /* attention recomputed in the backward pass (against the CPU's plain layer) */
    printf("(the GPU's layer recomputes attention in the backward pass)\n");
    g_recompute = 1;
    test_layer(&a, DM_SCHED_FUSED, emulate != 0, dtype, gen);
    test_layer(&v, DM_SCHED_FUSED, emulate != 0, dtype, gen);
    g_recompute = 0;
}

/* The bias epilogue on forward-only plans, where the memory planner gives biased tensors
 * the bytes of inputs that die at their contraction: those pairs must stay apart. The
 * emulated forward pass with epilogues must match the CPU's. */
static void test_epilogue_forward_only(dm_schedule sched) {
    dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
    dm_layer_options o = {.schedule = sched, .forward_only = 1, .threads = 2};
    dm_layer *L = NULL;
    dm_cuda_exec *ex = NULL;
    float *want = NULL, *got;
    CHECK_OK(dm_layer_new_gpu_grouping(&L, &a, &o));
    if (!L) return;
    CHECK_OK(dm_layer_init_params(L, 7));
    float *x;
    size_t n = tensor_numel(L, "hidden_states", &x);
    for (size_t e = 0; e < n; e++) x[e] = frand();
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_FP32, DM_CUDA_EMULATE | DM_CUDA_EPILOGUE));
    if (!ex) goto done;
    CHECK_OK(dm_cuda_upload_arena(ex, L->arena)); /* the inputs, before the CPU runs */
    CHECK_OK(dm_layer_forward(L));
    n = tensor_numel(L, "output", &got);
    want = malloc(n * sizeof(float));
    if (!want) goto done;
    memcpy(want, got, n * sizeof(float));
    for (int gi = 0; gi < L->plan.ngroups; gi++) CHECK_OK(dm_cuda_exec_group(ex, gi, a.seed, 0));
    CHECK_OK(dm_cuda_sync(ex));
    for (size_t e = 0; e < n; e++) got[e] = NAN;
    CHECK_OK(dm_cuda_download(ex, export_id(L, "output"), got));
    double err = rel_err(got, want, n);
    CHECK(err < 1e-5);
    printf("forward-only %s plan, bias epilogues %d: output rel.err %.2e %s\n",
           sched == DM_SCHED_FUSED ? "fused" : "unfused", dm_cuda_exec_epilogues(ex), err, err < 1e-5 ? "ok" : "FAIL");
done:
    free(want);
    dm_cuda_exec_free(ex);
    dm_layer_free(L);
}

/* --rows auto (DM_CUDA_AUTO): every choice forced each way (DMOVE_TEST_AUTO), then left
 * to the (host) timings: the counts follow, and the layer's results stay right. */
static void test_auto(void) {
    dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
    /* gen: every generated choice; interp: none; unfused: cuBLAS around generated row
     * kernels instead of the fused attention kernels (what auto falls back to when a
     * fused kernel loses) */
    const char *modes[4] = {"gen", "interp", "unfused", NULL};
    for (int m = 0; m < 4; m++) {
        if (modes[m]) CHECK(setenv("DMOVE_TEST_AUTO", modes[m], 1) == 0);
        else CHECK(unsetenv("DMOVE_TEST_AUTO") == 0);
        dm_layer *L = NULL;
        dm_layer_options o = {.schedule = DM_SCHED_FUSED, .threads = 2};
        CHECK_OK(dm_layer_new_gpu_grouping(&L, &a, &o));
        if (!L) continue;
        dm_cuda_exec *ex = NULL;
        CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16, DM_CUDA_EMULATE | DM_CUDA_GEN | DM_CUDA_EPILOGUE | DM_CUDA_AUTO));
        int all = 0, gen = ex ? dm_cuda_exec_generated(ex, &all) : -1, fused = dm_cuda_exec_fused(ex),
            epi = dm_cuda_exec_epilogues(ex);
        /* the bias group the epilogue absorbs runs nothing: all but one program generated */
        if (m == 0) CHECK(gen == all - 1 && fused == 2 && epi == 1);
        if (m == 1) CHECK(gen == 0 && fused == 0 && epi == 0);
        if (m == 2) CHECK(gen == all - 1 && fused == 0 && epi == 1);
        printf("rows auto (%s): %d of %d row programs generated, %d groups fused, %d bias epilogues\n",
               modes[m] ? modes[m] : "host timings", gen, all, fused, epi);
        dm_cuda_exec_free(ex);
        dm_layer_free(L);
        test_layer(&a, DM_SCHED_FUSED, 1, DM_CUDA_BF16, DM_CUDA_GEN | DM_CUDA_AUTO);
    }
    CHECK(unsetenv("DMOVE_TEST_AUTO") == 0);
    /* NVRTC cannot build the kernels (here: no toolkit headers): auto keeps the
     * interpreter and cuBLAS and says why; gen, asked for the kernels, fails */
    const char *inc = getenv("DMOVE_CUDA_INCLUDE"), *cache = getenv("DMOVE_CUDA_CACHE");
    char inc_saved[1024] = "", cache_saved[64] = "";
    if (inc) snprintf(inc_saved, sizeof inc_saved, "%s", inc);
    if (cache) snprintf(cache_saved, sizeof cache_saved, "%s", cache);
    CHECK(setenv("DMOVE_CUDA_INCLUDE", "/nonexistent/dmove-test", 1) == 0);
    CHECK(setenv("DMOVE_CUDA_CACHE", "0", 1) == 0);
    dm_layer *L = NULL;
    dm_layer_options o = {.schedule = DM_SCHED_FUSED, .threads = 2};
    CHECK_OK(dm_layer_new_gpu_grouping(&L, &a, &o));
    if (L) {
        const unsigned f = DM_CUDA_EMULATE | DM_CUDA_GEN | DM_CUDA_EPILOGUE;
        dm_cuda_exec *ex = NULL;
        CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16, f | DM_CUDA_AUTO));
        int all = 0;
        CHECK(ex && dm_cuda_exec_generated(ex, &all) == 0 && all > 0 && dm_cuda_exec_fused(ex) == 0);
        CHECK(ex && strstr(dm_cuda_exec_gen_note(ex), "cuda_bf16.h") != NULL);
        printf("rows auto without NVRTC's headers: %d of %d generated; note: %.80s...\n",
               ex ? dm_cuda_exec_generated(ex, NULL) : -1, all, ex ? dm_cuda_exec_gen_note(ex) : "");
        dm_cuda_exec_free(ex);
        ex = NULL;
        CHECK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16, f) == DM_ERR_NOT_FOUND && ex == NULL);
        CHECK(strstr(dm_last_error(), "--rows interp") != NULL);
        dm_layer_free(L);
        /* and the layer still computes right, by the interpreter */
        test_layer(&a, DM_SCHED_FUSED, 1, DM_CUDA_BF16, DM_CUDA_GEN | DM_CUDA_AUTO);
    }
    if (inc) CHECK(setenv("DMOVE_CUDA_INCLUDE", inc_saved, 1) == 0);
    else CHECK(unsetenv("DMOVE_CUDA_INCLUDE") == 0);
    if (cache) CHECK(setenv("DMOVE_CUDA_CACHE", cache_saved, 1) == 0);
    else CHECK(unsetenv("DMOVE_CUDA_CACHE") == 0);
}

/* How many batched groups of cfg's fused plan run as one fused kernel, or with tails,
 * how many of those leave a GEMM to cuBLAS after the kernel (the backward whose item is
 * too big for one block); -1: no executor. */
static int fused_count(const dm_layer_config *cfg, int dtype, unsigned flags, int tails) {
    dm_layer *L = NULL;
    dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .threads = 2};
    CHECK_OK(dm_layer_new_gpu_grouping(&L, cfg, &opt));
    if (!L) return -1;
    dm_cuda_exec *ex = NULL;
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, dtype, flags));
    int n = !ex ? -1 : tails ? dm_cuda_exec_fused_tails(ex) : dm_cuda_exec_fused(ex);
    dm_cuda_exec_free(ex);
    dm_layer_free(L);
    return n;
}

static int fused_groups(const dm_layer_config *cfg, int dtype, unsigned flags) {
    return fused_count(cfg, dtype, flags, 0);
}

/* The generated kernels as the GPU runs them, lanes simulated by threads on the host
 * (DM_CUDA_SIM_LANES): teams of 1 to 32 lanes, several teams per warp, rows not a whole
 * number of chunks, partial last chunks, column sums across teams and blocks. */
static void run_sim_suite(void) {
    const unsigned f = DM_CUDA_EMULATE | DM_CUDA_GEN | DM_CUDA_SIM_LANES;
    dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
    dm_layer_config b = small_config(3, 13, 48, 3, 96, DM_ACT_GELU_TANH);
    dm_layer_config c = small_config(2, 40, 320, 5, 1280, DM_ACT_RELU);
    /* teams of 1 (j=7: one partial chunk), 4 (i=24), 8 (u=40), 16 (3i=72) lanes */
    dm_layer_config d = small_config(3, 7, 24, 3, 40, DM_ACT_GELU);
    test_groups(&a, DM_SCHED_FUSED, f, "simulated lanes, bf16 A fused", DM_CUDA_BF16);
    test_groups(&b, DM_SCHED_FUSED, f, "simulated lanes, fp16 B fused", DM_CUDA_FP16);
    test_groups(&c, DM_SCHED_FUSED, f, "simulated lanes, C fused", DM_CUDA_FP32);
    test_groups(&d, DM_SCHED_FUSED, f, "simulated lanes, bf16 D fused", DM_CUDA_BF16);
    test_groups(&d, DM_SCHED_UNFUSED, f, "simulated lanes, D unfused", DM_CUDA_FP32);
    test_layer(&d, DM_SCHED_FUSED, 1, DM_CUDA_BF16, DM_CUDA_GEN | DM_CUDA_SIM_LANES);
    /* pre-LN and causal: the fused attention kernel masks the keys after each query */
    dm_layer_config v = small_config(2, 48, 64, 2, 128, DM_ACT_GELU);
    v.norm = DM_NORM_PRE, v.causal = 1;
    CHECK(fused_groups(&v, DM_CUDA_BF16, f) == (getenv("DMOVE_CUDA_FUSE") && !strcmp(getenv("DMOVE_CUDA_FUSE"), "0") ? 0 : 2));
    test_groups(&v, DM_SCHED_FUSED, f, "simulated lanes, bf16 V (pre-LN, causal) fused", DM_CUDA_BF16);
    test_layer(&v, DM_SCHED_FUSED, 1, DM_CUDA_BF16, DM_CUDA_GEN | DM_CUDA_SIM_LANES);
    /* fewer blocks than rows need (as the occupancy cap on a GPU, or
     * DMOVE_CUDA_COLSUM_BLOCKS): one block, each team striding over several rows and
     * summing their columns */
    printf("(column sums in one block)\n");
    setenv("DMOVE_CUDA_COLSUM_BLOCKS", "1", 1);
    test_layer(&a, DM_SCHED_FUSED, 1, DM_CUDA_BF16, DM_CUDA_GEN | DM_CUDA_SIM_LANES);
    unsetenv("DMOVE_CUDA_COLSUM_BLOCKS");
    /* the fused attention kernel (A above: one tile per item) with two row tiles per
     * item, three column tiles of scores (teams of 8 over 6 chunks: a partial round),
     * head width 32 (two k-steps, two output tiles) */
    dm_layer_config e = small_config(2, 48, 64, 2, 128, DM_ACT_GELU);
    CHECK(fused_groups(&e, DM_CUDA_BF16, f) == (getenv("DMOVE_CUDA_FUSE") && !strcmp(getenv("DMOVE_CUDA_FUSE"), "0") ? 0 : 2));
    CHECK(fused_groups(&e, DM_CUDA_FP32, f) == 0); /* tensor cores: 16-bit storage only */
    test_groups(&e, DM_SCHED_FUSED, f, "simulated lanes, bf16 E fused", DM_CUDA_BF16);
    test_groups(&e, DM_SCHED_FUSED, f, "simulated lanes, fp16 E fused", DM_CUDA_FP16);
    test_layer(&e, DM_SCHED_FUSED, 1, DM_CUDA_FP16, DM_CUDA_GEN | DM_CUDA_SIM_LANES);
    /* j = 144: nine row tiles per item in one backward block of 288 threads (teams of 16
     * over 18 chunks); j = 384 (run_suite) is the one whose d keys go to cuBLAS */
    dm_layer_config f2 = small_config(1, 144, 64, 2, 128, DM_ACT_GELU);
    CHECK(fused_groups(&f2, DM_CUDA_BF16, f) == (getenv("DMOVE_CUDA_FUSE") && !strcmp(getenv("DMOVE_CUDA_FUSE"), "0") ? 0 : 2));
    test_groups(&f2, DM_SCHED_FUSED, f, "simulated lanes, bf16 F fused", DM_CUDA_BF16);
    test_layer(&f2, DM_SCHED_FUSED, 1, DM_CUDA_BF16, DM_CUDA_GEN);
    /* j = 384, head width 64: BERT-large's j=512 path (the d keys by cuBLAS), lane by lane */
    dm_layer_config g2 = small_config(1, 384, 128, 2, 256, DM_ACT_GELU);
    test_groups(&g2, DM_SCHED_FUSED, f, "simulated lanes, bf16 G fused", DM_CUDA_BF16);
}

/* How many row programs of a layer's fused plan the generator takes: all of the small
 * layers' (so the gen suites above test generated code, not the interpreter). */
/* A small layer's fused plan grouped for the GPU executor (NULL after a failed check). */
static dm_layer *small_gpu_plan(void) {
    dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
    dm_layer *L = NULL;
    dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .threads = 2};
    CHECK_OK(dm_layer_new_gpu_grouping(&L, &a, &opt));
    return L;
}

static void test_gen_coverage(int emulate) {
    dm_layer *L = small_gpu_plan();
    if (!L) return;
    dm_cuda_exec *ex = NULL;
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16, (emulate ? DM_CUDA_EMULATE : 0) | DM_CUDA_GEN));
    int all = 0, gen = dm_cuda_exec_generated(ex, &all), fused = dm_cuda_exec_fused(ex);
    CHECK(all > 0 && gen == all);
    /* attention's forward and backward (j = 16, head width 16) as fused tensor-core kernels
     * (none with DMOVE_CUDA_FUSE=0: bench/gpu/run.sh's fallback) */
    const char *fz = getenv("DMOVE_CUDA_FUSE");
    CHECK(fused == (fz && !strcmp(fz, "0") ? 0 : 2));
    printf("generated kernels: %d of %d row programs; %d batched group(s) fused whole\n", gen, all, fused);
    dm_cuda_exec_free(ex);
    ex = NULL;
    /* the qkv projection takes its bias into a cuBLASLt epilogue */
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16, (emulate ? DM_CUDA_EMULATE : 0) | DM_CUDA_EPILOGUE));
    CHECK(dm_cuda_exec_epilogues(ex) == 1);
    printf("bias epilogues: %d\n", dm_cuda_exec_epilogues(ex));
    /* ... and the bias group is the one marked absorbed: qkv_bias, after qkv_proj */
    int absorbed = 0, at = -1;
    for (int G = 0; G < L->plan.ngroups; G++)
        if (dm_cuda_exec_group_absorbed(ex, G)) absorbed++, at = G;
    CHECK(absorbed == 1 && at >= 1 &&
          !strcmp(L->plan.g->op[L->plan.order[L->plan.groups[at].first]].name, "qkv_bias") &&
          !strcmp(L->plan.g->op[L->plan.order[L->plan.groups[at - 1].first]].name, "qkv_proj"));
    CHECK(!dm_cuda_exec_group_absorbed(ex, -1) && !dm_cuda_exec_group_absorbed(ex, L->plan.ngroups));
    CHECK(emulate ? dm_cuda_exec_gpu_name(ex)[0] == 0 : dm_cuda_exec_gpu_name(ex)[0] != 0); /* the GPU's name */
    dm_cuda_exec_free(ex);
    ex = NULL;
    /* the second stream takes what no later group reads: the four weight-gradient GEMMs
     * of the fused plan, the qkv bias gradient (a column sum) and the input gradient's
     * last sum */
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16, (emulate ? DM_CUDA_EMULATE : 0) | DM_CUDA_OVERLAP));
    CHECK(dm_cuda_exec_side_groups(ex) == 6);
    printf("second stream: %d groups\n", dm_cuda_exec_side_groups(ex));
    dm_cuda_exec_free(ex);
    dm_layer_free(L);
}

/* The compiled-kernel cache (cudagen/genbuild.cu) under $XDG_CACHE_HOME/dmove/cuda: the gen suites
 * filled it (emulating: with the PTX of NVRTC's check; on a GPU, the GPU suites then read
 * their cubins back from it); every file corrupted (a payload byte flipped, or truncated)
 * must be ignored and rewritten whole, and the kernels still built and run. */
static void test_gen_cache(const char *xdg) {
    char dir[600], path[900];
    snprintf(dir, sizeof dir, "%s/dmove/cuda", xdg);
    for (int round = 0; round < 2; round++) {
        DIR *d = opendir(dir);
        CHECK(d != NULL);
        if (!d) return;
        int files = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strstr(e->d_name, ".bin")) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            FILE *f = fopen(path, "r+b");
            CHECK(f != NULL);
            if (!f) continue;
            unsigned char hdr[8];
            CHECK(fread(hdr, 1, 8, f) == 8 && !memcmp(hdr, "DMGCODE1", 8)); /* rewritten whole */
            if (round == 0) { /* a byte of the payload */
                unsigned char b = 0;
                CHECK(fseek(f, 40, SEEK_SET) == 0 && fread(&b, 1, 1, f) == 1);
                b ^= 0x5a;
                CHECK(fseek(f, 40, SEEK_SET) == 0 && fwrite(&b, 1, 1, f) == 1);
            }
            CHECK(fclose(f) == 0);
            if (round == 1) CHECK(truncate(path, 20) == 0);
            files++;
        }
        closedir(d);
        CHECK(files > 0);
        printf("kernel cache: %d files %s\n", files, round == 0 ? "corrupted" : "truncated");
        test_gen_coverage(1);
        dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
        test_groups(&a, DM_SCHED_FUSED, DM_CUDA_EMULATE | DM_CUDA_GEN, "emulated gen, cache rebuilt", DM_CUDA_BF16);
    }
}

/* Profiling by CUDA events (dm_cuda_exec_profile): on a GPU every group that ran (also
 * on the second stream) has a time above 0 and a take clears them; emulating there are
 * no events (the layer times on the host). On a GPU also through a layer: profiled
 * steps give every group a time, and the class times are the groups' sums. */
static void test_profile_events(int emulate) {
    dm_layer *L = small_gpu_plan();
    if (!L) return;
    dm_cuda_exec *ex = NULL;
    CHECK_OK(dm_cuda_exec_init(&ex, &L->plan, DM_CUDA_BF16,
                               (emulate ? DM_CUDA_EMULATE : 0) | DM_CUDA_OVERLAP | DM_CUDA_EPILOGUE));
    if (!ex) {
        dm_layer_free(L);
        return;
    }
    const int n = L->plan.ngroups;
    double *secs = calloc((size_t)n, sizeof *secs);
    int ev = -1, ran = 0, timed = 0, cleared = 1;
    CHECK_OK(dm_cuda_exec_profile(ex, 1, &ev));
    CHECK(ev == !emulate);
    for (int gi = 0; gi < n; gi++) CHECK_OK(dm_cuda_exec_group(ex, gi, 7, 0));
    CHECK_OK(dm_cuda_exec_profile_take(ex, secs));
    for (int gi = 0; gi < n; gi++) {
        ran += !dm_cuda_exec_group_absorbed(ex, gi);
        timed += secs[gi] > 0;
        if (dm_cuda_exec_group_absorbed(ex, gi)) CHECK(secs[gi] == 0);
    }
    CHECK(timed == (emulate ? 0 : ran));
    CHECK_OK(dm_cuda_exec_profile_take(ex, secs)); /* taken: nothing left */
    for (int gi = 0; gi < n; gi++) cleared &= secs[gi] == 0;
    CHECK(cleared);
    CHECK_OK(dm_cuda_exec_profile(ex, 0, &ev)); /* off: nothing recorded */
    CHECK(ev == 0);
    for (int gi = 0; gi < n; gi++) CHECK_OK(dm_cuda_exec_group(ex, gi, 7, 0));
    CHECK_OK(dm_cuda_exec_profile_take(ex, secs));
    for (int gi = 0; gi < n; gi++) cleared &= secs[gi] == 0;
    CHECK(cleared);
    printf("profiling by events (%s): %d of %d groups timed (%d run, %d on the second stream)\n",
           emulate ? "emulated: none" : "GPU", timed, n, ran, dm_cuda_exec_side_groups(ex));
    dm_cuda_exec_free(ex);
    dm_layer_free(L);
    free(secs);
    if (emulate) return;
    /* the layer: its profiled steps by events, every group timed, the classes their sums */
    dm_layer_config a = small_config(2, 16, 64, 4, 256, DM_ACT_GELU);
    dm_layer_options o = {.schedule = DM_SCHED_FUSED, .threads = 2, .device = DM_DEVICE_CUDA,
                          .dtype = DM_DTYPE_BF16, .streams = 2};
    CHECK_OK(dm_layer_new(&L, &a, &o));
    if (!L) return;
    CHECK_OK(dm_layer_init_params(L, 3));
    CHECK_OK(dm_layer_to_device(L));
    dm_layer_profile(L, 1);
    dm_layer_profile_reset(L);
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_backward(L));
    dm_layer_profile(L, 0);
    double cls[2][DM_NUM_CLASSES], csum = 0, gsum = 0;
    dm_layer_profile_read(L, cls);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < DM_NUM_CLASSES; k++) csum += cls[p][k];
    int untimed = 0;
    for (int G = 0; G < dm_layer_num_groups(L); G++) {
        dm_layer_group x;
        CHECK_OK(dm_layer_group_info(L, G, &x));
        gsum += x.seconds;
        untimed += x.timed_with < 0 && !(x.seconds > 0);
    }
    CHECK(untimed == 0 && gsum > 0 && fabs(gsum - csum) <= 1e-12 + 1e-9 * gsum);
    printf("layer profiled by events: %d groups, %.3f ms in all, every group timed\n", dm_layer_num_groups(L),
           gsum * 1e3);
    dm_layer_free(L);
}

#endif /* DM_HAVE_CUDA */

/* --streams and DMOVE_CUDA_STREAMS (dm_cuda_streams_resolve), the default row kernels
 * (dm_cuda_rows_resolve): on a GPU auto on two streams, emulating interp on one (the CUDA
 * backend's: with it built). */
static void test_streams_option(void) {
#ifdef DM_HAVE_CUDA
    int n = 0;
    dm_rows r = DM_ROWS_DEFAULT;
    const char *emu_env = getenv("DMOVE_CUDA_EMULATE");
    char *emu = emu_env ? strdup(emu_env) : NULL;
    CHECK(unsetenv("DMOVE_CUDA_STREAMS") == 0 && unsetenv("DMOVE_CUDA_ROWS") == 0);
    CHECK(unsetenv("DMOVE_CUDA_EMULATE") == 0);
    CHECK(dm_cuda_streams_resolve(0, &n) == DM_OK && n == 2);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_DEFAULT, &r) == DM_OK && r == DM_ROWS_AUTO);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_INTERP, &r) == DM_OK && r == DM_ROWS_INTERP);
    CHECK(setenv("DMOVE_CUDA_ROWS", "gen", 1) == 0);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_DEFAULT, &r) == DM_OK && r == DM_ROWS_GEN);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_AUTO, &r) == DM_OK && r == DM_ROWS_AUTO); /* the option wins */
    CHECK(setenv("DMOVE_CUDA_ROWS", "x", 1) == 0);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_DEFAULT, &r) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "DMOVE_CUDA_ROWS='x'"));
    CHECK(unsetenv("DMOVE_CUDA_ROWS") == 0);
    CHECK(setenv("DMOVE_CUDA_EMULATE", "1", 1) == 0);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_DEFAULT, &r) == DM_OK && r == DM_ROWS_INTERP);
    CHECK(dm_cuda_streams_resolve(0, &n) == DM_OK && n == 1);
    CHECK(dm_cuda_streams_resolve(2, &n) == DM_OK && n == 2);
    /* DMOVE_CUDA_EMULATE: 1 emulates, lanes emulates with the generated kernels lane by lane
     * (tests/test_ops.c), as the interp default and one stream say */
    int on = -1;
    CHECK(dm_cuda_emulate_resolve(&on) == DM_OK && on == 1);
    CHECK(setenv("DMOVE_CUDA_EMULATE", "lanes", 1) == 0);
    CHECK(dm_cuda_emulate_resolve(&on) == DM_OK && on == 2);
    CHECK(dm_cuda_rows_resolve(DM_ROWS_DEFAULT, &r) == DM_OK && r == DM_ROWS_INTERP);
    CHECK(dm_cuda_streams_resolve(0, &n) == DM_OK && n == 1);
    CHECK(setenv("DMOVE_CUDA_EMULATE", "0", 1) == 0);
    CHECK(dm_cuda_emulate_resolve(&on) == DM_OK && on == 0);
    CHECK(setenv("DMOVE_CUDA_EMULATE", "yes", 1) == 0);
    CHECK(dm_cuda_emulate_resolve(&on) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "lanes"));
    if (emu) CHECK(setenv("DMOVE_CUDA_EMULATE", emu, 1) == 0);
    else CHECK(unsetenv("DMOVE_CUDA_EMULATE") == 0);
    free(emu);
    CHECK(setenv("DMOVE_CUDA_STREAMS", "1", 1) == 0);
    CHECK(dm_cuda_streams_resolve(0, &n) == DM_OK && n == 1);
    CHECK(dm_cuda_streams_resolve(2, &n) == DM_OK && n == 2);
    CHECK(dm_cuda_streams_resolve(3, &n) == DM_ERR_INVALID_ARG);
    CHECK(setenv("DMOVE_CUDA_STREAMS", "2", 1) == 0);
    CHECK(dm_cuda_streams_resolve(0, &n) == DM_OK && n == 2);
    CHECK(dm_cuda_streams_resolve(1, &n) == DM_OK && n == 1); /* the option wins */
    CHECK(setenv("DMOVE_CUDA_STREAMS", "x", 1) == 0);
    CHECK(dm_cuda_streams_resolve(0, &n) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "DMOVE_CUDA_STREAMS='x'"));
    CHECK(unsetenv("DMOVE_CUDA_STREAMS") == 0);
#endif
    /* on the CPU the option is refused, saying why */
    dm_layer_config tiny = small_config(2, 8, 16, 2, 32, DM_ACT_GELU);
    dm_layer_options o = {.streams = 2};
    dm_layer *L = NULL;
    CHECK(dm_layer_new(&L, &tiny, &o) == DM_ERR_UNSUPPORTED && L == NULL);
    CHECK(strstr(dm_last_error(), "needs --device cuda") != NULL);
}

int main(void) {
    test_streams_option();
    dm_layer_config tiny = small_config(2, 8, 16, 2, 32, DM_ACT_GELU);
    dm_layer_options cuda_opt = {.device = DM_DEVICE_CUDA};
    dm_layer *L = NULL;
#ifndef DM_HAVE_CUDA
    /* asking for the GPU in a CPU-only build says how to get one */
    dm_status s = dm_layer_new(&L, &tiny, &cuda_opt);
    CHECK(s == DM_ERR_UNSUPPORTED && L == NULL);
    CHECK(strstr(dm_last_error(), "built without CUDA") != NULL);
    if (g_fail) TEST_END();
    printf("SKIP: %s\n", dm_last_error());
    return 0;
#else
    /* the generated kernels' compile cache in a folder of this run's own */
    char xdg[] = "/tmp/dmove-test-cuda-XXXXXX"; /* left behind: a few PTX files */
    CHECK(mkdtemp(xdg) != NULL);
    CHECK(setenv("XDG_CACHE_HOME", xdg, 1) == 0);
    /* DMOVE_TEST_GEN=0: the interpreting row kernel only; =only: the generated kernels
     * only (bench/gpu/run.sh runs the two apart, so a fault in one still lets the other
     * be benchmarked); unset: both */
    const char *tg = getenv("DMOVE_TEST_GEN"), *te = getenv("DMOVE_TEST_EMULATE");
    const int interp = !tg || strcmp(tg, "only") != 0, gen = !tg || strcmp(tg, "0") != 0;
    /* DMOVE_TEST_EMULATE=0 skips the emulated suites (CI runs them; a GPU run saves the
     * time) */
    const int emu = !te || strcmp(te, "0") != 0;
    /* without a GPU: the executor's mapping, emulated on the host */
    for (int dt = DM_CUDA_FP32; dt <= DM_CUDA_FP16 && interp && emu; dt++) run_suite(DM_CUDA_EMULATE, dt, 0);
    if (emu) test_profile_events(1);
    if (gen && emu) {
        test_gen_coverage(1);
        for (int dt = DM_CUDA_FP32; dt <= DM_CUDA_FP16; dt++) run_suite(DM_CUDA_EMULATE, dt, DM_CUDA_GEN);
        test_gen_cache(xdg);
        run_sim_suite();
        test_epilogue_forward_only(DM_SCHED_UNFUSED);
        test_epilogue_forward_only(DM_SCHED_FUSED);
        test_auto();
    }
    char why[256];
    if (dm_cuda_available(why, sizeof why) != DM_OK) {
        dm_status s = dm_layer_new(&L, &tiny, &cuda_opt);
        CHECK(s == DM_ERR_BACKEND && L == NULL);
        printf("SKIP: no CUDA device (%s)\n", why);
        TEST_END(); /* the emulated checks above still count */
    }
    printf("CUDA: %s\n", why);
    test_philox();
    for (int dt = DM_CUDA_FP32; dt <= DM_CUDA_FP16 && interp; dt++) run_suite(0, dt, 0);
    if (interp) test_profile_events(0);
    if (gen) {
        test_gen_coverage(0);
        for (int dt = DM_CUDA_FP32; dt <= DM_CUDA_FP16; dt++) run_suite(0, dt, DM_CUDA_GEN);
    }
    (void)L;
    TEST_END();
#endif
}
