/* test_ops.c: the backend-parity suite of the operator table (src/graph/ops.def). It
 * loops over the table, so a kind added there is run here with nothing else to write, and
 * a backend that lacks its kernel fails:
 *  - the table itself: operand counts within the graph's limits, pointwise kinds that
 *    reduce nothing, the params column naming the einsum exactly for the contractions;
 *    and its keeps column against the gradient rules: autodiff of a one-op graph reads
 *    exactly the forward operands the table says it keeps (none for the kinds without a
 *    rule: the backward ones);
 *  - every kind on random inputs against its naive reference (src/cpu/ref.c: dm_ref_op,
 *    dm_ref_contract for the einsums), each row kind in every variant its params column
 *    names (activation gelu, gelu_tanh, relu; dropout p 0, 0.1, 0.5 on the same Philox
 *    seed and stream as the reference; the mask plain and causal; LayerNorm's backward
 *    fed statistics consistent with its input, softmax masked scores (whole rows too),
 *    its backward a softmax output, the attention mask 0/1), on 8 shapes (rows x columns: six fixed, odd ones and a column
 *    of one included, two random), the contractions on every einsum spec the encoder
 *    builder and autodiff make (pre-LN and post-LN, with and without the input gradient),
 *    on two random sizings of their letters;
 *  - on every backend built: the CPU backend (fp32: rel.err < 1e-5), and with CUDA
 *    compiled in, the CUDA backend emulated on the host (DM_CUDA_EMULATE: the executor's
 *    row programs and cuBLAS calls run on the CPU) in fp32 (< 1e-5), bf16 and fp16
 *    storage (< 1e-2, the reference fed the same rounded inputs and its outputs rounded as
 *    the device stores them) with the interpreting row kernel, with the generated row
 *    kernels built for the host (every row program must be generated), and with the
 *    generated device kernels run lane by lane (simulated lanes: two small row shapes,
 *    the small einsum sizing); row statistics (LayerNorm's mean and rstd) stay fp32;
 *    on a GPU, also the device itself, interpreted and generated. Without CUDA compiled
 *    in: "SKIP" for the CUDA backend, said plainly.
 * Outputs are poisoned with NaN first: every element must be written. Masked scores
 * (a reference beyond 1e30 in magnitude) must match exactly; the norm-wise relative error
 * is taken over the other elements. A kind counts as run on a backend when at least one
 * instance matched there; at the end every kind must have run on every backend run: the
 * count must equal DM_NUM_OPS x backends. */
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/exec.h"
#include "cpu/kernels.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "graph/graph.h"
#include "plan/plan.h"
#include "testutil.h"

#ifdef DM_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

enum { B_CPU, B_EMU, B_EMU_GEN, B_EMU_SIM, B_GPU, B_GPU_GEN, NB };
static const char *const k_backend[NB] = {"cpu", "cuda emulated", "cuda emulated, generated kernels",
                                          "cuda emulated, generated kernels, simulated lanes", "cuda device",
                                          "cuda device, generated kernels"};
static const char *const k_short[NB] = {"cpu", "emu", "emu-gen", "emu-sim", "gpu", "gpu-gen"};
static const char *const k_dtype[3] = {"fp32", "bf16", "fp16"};

static int g_used[NB];                  /* the backend ran */
static int g_ran[DM_NUM_OPS][NB];       /* instances of the kind that matched there */
static double g_worst[DM_NUM_OPS][NB][3]; /* worst error per kind, backend and storage type */
static int g_seen[NB][3];               /* (backend, storage type) pairs that ran */

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t next_u64(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float frand(void) { /* uniform in [-2, 2) */
    return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

/* --- the table ------------------------------------------------------------------------ */

/* The forward operands (DM_KEEP_* bits) the backward ops of graph g read. */
static unsigned kept_by_autodiff(const dm_graph *g, const dm_op *f) {
    unsigned m = 0;
    for (int o = 0; o < g->nop; o++) {
        if (g->op[o].pass != 1) continue;
        for (int s = 0; s < g->op[o].nin; s++) {
            int r = dm_tensor_root(g, g->op[o].in[s]);
            for (int q = 0; q < f->nin; q++)
                if (dm_tensor_root(g, f->in[q]) == r) m |= DM_KEEP_IN(q);
            for (int q = 0; q < f->nout; q++)
                if (dm_tensor_root(g, f->out[q]) == r) m |= DM_KEEP_OUT(q);
        }
    }
    return m;
}

/* Letters of an operand addressed as `a` over rows (g, r) x columns c. */
static const char *row_letters(dm_arg_kind a) {
    switch (a) {
    case DM_ARG_COLVEC: case DM_ARG_COLACC: return "c";
    case DM_ARG_GROUPED: return "gc";
    case DM_ARG_ROWSCALAR: return "gr";
    default: return "grc";
    }
}

/* Appends one op of kind k with fresh tensors (inputs `in_role`, outputs DM_ROLE_OUTPUT):
 * a row op over (g, r) x c, or the contraction `spec`. Returns its index or -1. */
static int add_op(dm_graph *g, dm_op_kind k, const dm_op *proto, const char *spec, dm_role in_role) {
    static int serial;
    dm_op op = *proto;
    op.kind = k;
    op.nin = dm_op_nin(k);
    op.nout = dm_op_nout(k);
    snprintf(op.name, sizeof op.name, "%s_%d", dm_op_kind_name(k), serial++);
    char let[3][16] = {"", "", ""};
    if (spec) {
        snprintf(op.spec, sizeof op.spec, "%s", spec);
        if (sscanf(spec, "%15[a-z],%15[a-z]->%15[a-z]", let[0], let[1], let[2]) != 3) return -1;
    } else {
        op.rows = g->dim['g' - 'a'] * g->dim['r' - 'a'];
        op.cols = g->dim['c' - 'a'];
    }
    for (int io = 0; io < 2; io++)
        for (int s = 0; s < (io ? op.nout : op.nin); s++) {
            char name[DM_NAME_LEN];
            snprintf(name, sizeof name, "%s_%s%d", op.name, io ? "out" : "in", s);
            const char *l = spec ? let[io ? 2 : s] : row_letters(io ? dm_arg_out(k, s) : dm_arg_in(k, s));
            int t = dm_graph_tensor(g, name, l, io ? DM_ROLE_OUTPUT : in_role);
            if (t < 0) return -1;
            if (io) op.out[s] = t;
            else op.in[s] = t;
        }
    return dm_graph_op(g, &op);
}

static void check_table(void) {
    int bad = 0, rules = 0;
    for (int k = 0; k < DM_NUM_OPS; k++) {
        const dm_op_kind K = (dm_op_kind)k;
        const int nin = dm_op_nin(K), nout = dm_op_nout(K), contr = dm_op_kind_class(K) == DM_CLASS_CONTRACTION;
        int ok = nin >= 1 && nin <= DM_MAX_IN && nout >= 1 && nout <= DM_MAX_OUT && strcmp(dm_op_kind_name(K), "?");
        for (int q = 0; q < k; q++) ok &= strcmp(dm_op_kind_name(K), dm_op_kind_name((dm_op_kind)q)) != 0;
        ok &= contr == ((dm_op_params(K) & DM_OPP_SPEC) != 0);
        ok &= !contr || (dm_op_row_reductions(K) == 0 && !dm_op_reduces_cols(K) && !dm_op_pointwise(K));
        if (dm_op_pointwise(K)) {
            ok &= !dm_op_reduces_rows(K) && !dm_op_reduces_cols(K);
            for (int s = 0; s < nout; s++) ok &= dm_arg_out(K, s) == DM_ARG_FULL;
        }
        for (int s = 0; s < nout; s++) ok &= dm_arg_out(K, s) != DM_ARG_COLVEC && dm_arg_out(K, s) != DM_ARG_GROUPED;
        CHECK(ok);
        /* the keeps column against the gradient rule: one op, every input a parameter */
        dm_graph g;
        dm_graph_init(&g);
        for (int l = 0; l < 26; l++) g.dim[l] = 2 + l % 3;
        dm_op proto = {.alpha = 1, .p = 0.1, .eps = 1e-5, .stream = 1};
        int o = add_op(&g, K, &proto, contr ? "bji,ui->bju" : NULL, DM_ROLE_PARAM);
        CHECK(o >= 0);
        unsigned kept = 0;
        dm_status st = DM_ERR_INTERNAL;
        if (o >= 0) {
            const int y = g.op[o].out[0];
            char letters[DM_MAX_DIMS + 1];
            memcpy(letters, g.t[y].letters, sizeof letters);
            const int dy = dm_graph_tensor(&g, "dy", letters, DM_ROLE_INPUT);
            int dx = -1;
            const dm_op f = g.op[o];
            st = dy >= 0 ? dm_autodiff(&g, y, dy, -1, &dx) : DM_ERR_INTERNAL;
            if (st == DM_OK) kept = kept_by_autodiff(&g, &f);
        }
        rules += st == DM_OK;
        /* without a rule (the backward kinds): autodiff says so, and the row keeps nothing */
        const int match = st == DM_OK ? kept == dm_op_keeps(K)
                                      : strstr(dm_last_error(), "no gradient rule") && dm_op_keeps(K) == 0;
        CHECK(match);
        if (!ok || !match) {
            bad++;
            fprintf(stderr, "  table row %s: %s; gradient rule %s, keeps %#x, autodiff reads %#x\n",
                    dm_op_kind_name(K), ok ? "ok" : "INCONSISTENT", st == DM_OK ? "yes" : "none",
                    dm_op_keeps(K), kept);
        }
        dm_graph_free(&g);
    }
    printf("operator table: %d kinds, %d with a gradient rule, keeps == what autodiff reads: %s\n", DM_NUM_OPS,
           rules, bad ? "FAIL" : "ok");
}

/* --- suites: graphs of independent ops, each its own group ---------------------------- */

typedef struct {
    char label[64];
    dm_graph g;
    dm_plan plan;
    float *init;    /* the arena: inputs filled, outputs NaN */
    size_t nf;      /* floats in the arena */
    uint64_t seed;
    int sim;        /* also run with simulated lanes */
} suite;

static float *at(const suite *S, float *arena, int t) {
    return arena + S->plan.offset[dm_tensor_root(&S->g, t)] / 4 + S->g.t[t].offset;
}

/* Inputs that make each kind's check meaningful; anything else random. */
static void condition_inputs(const suite *S, const dm_op *op, float *arena) {
    const dm_graph *g = &S->g;
    const int64_t R = op->rows, C = op->cols;
    float *x0 = at(S, arena, op->in[0]), *x1 = op->nin > 1 ? at(S, arena, op->in[1]) : NULL;
    switch (op->kind) {
    case DM_OP_SOFTMAX: /* masked scores, as the mask leaves them: a quarter, and every 4th row whole */
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                if (r % 4 == 3 || (c > 0 && next_u64() % 4 == 0)) x0[r * C + c] = -FLT_MAX;
        break;
    case DM_OP_MASK_ADD: /* an attention mask: 1 keep, 0 padding */
        for (int64_t e = 0; e < g->t[op->in[1]].numel; e++) x1[e] = (float)(next_u64() % 4 != 3);
        break;
    case DM_OP_DROPOUT_BWD_NZ: /* the forward output: dropped elements are zero */
        for (int64_t e = 0; e < R * C; e += 3) x1[e] = 0.0f;
        break;
    case DM_OP_SOFTMAX_BWD: /* y: a softmax output */
        for (int64_t r = 0; r < R; r++) {
            double s = 0;
            for (int64_t c = 0; c < C; c++) /* zero where a score was masked */
                s += (x1[r * C + c] = c > 0 && next_u64() % 4 == 0 ? 0.0f : fabsf(x1[r * C + c]) + 1e-3f);
            for (int64_t c = 0; c < C; c++) x1[r * C + c] = (float)(x1[r * C + c] / s);
        }
        break;
    case DM_OP_LAYERNORM_BWD: { /* mean and rstd of x */
        float *mu = at(S, arena, op->in[2]), *rs = at(S, arena, op->in[3]);
        for (int64_t r = 0; r < R; r++) {
            double m = 0, v = 0;
            for (int64_t c = 0; c < C; c++) m += x1[r * C + c];
            m /= (double)C;
            for (int64_t c = 0; c < C; c++) v += (x1[r * C + c] - m) * (x1[r * C + c] - m);
            mu[r] = (float)m;
            rs[r] = (float)(1 / sqrt(v / (double)C + op->eps));
        }
        break;
    }
    default:
        break;
    }
}

/* Plans the graph (unfused: a group per op), fills the inputs. */
static int suite_plan(suite *S) {
    dm_status st = dm_plan_build(&S->g, 0, 0, 1, &S->plan);
    CHECK_OK(st);
    if (st != DM_OK) return 0;
    S->nf = S->plan.arena_bytes / 4;
    S->init = malloc(sizeof(float) * (S->nf ? S->nf : 1));
    if (!S->init) return 0;
    for (size_t e = 0; e < S->nf; e++) S->init[e] = NAN;
    for (int t = 0; t < S->g.nt; t++)
        if (S->g.t[t].role != DM_ROLE_OUTPUT && S->g.t[t].base < 0)
            for (int64_t e = 0; e < S->g.t[t].numel; e++) at(S, S->init, t)[e] = frand();
    for (int o = 0; o < S->g.nop; o++) condition_inputs(S, &S->g.op[o], S->init);
    return 1;
}

static void suite_free(suite *S) {
    free(S->init);
    dm_plan_free(&S->plan);
    dm_graph_free(&S->g);
}

/* The references of every op from the inputs in `in`, into `ref` (same layout). */
static void reference(const suite *S, float *in, float *ref) {
    const dm_graph *g = &S->g;
    for (int o = 0; o < g->nop; o++) {
        const dm_op *op = &g->op[o];
        const float *ip[DM_MAX_IN];
        float *op_out[DM_MAX_OUT];
        int64_t groups = 1;
        for (int s = 0; s < op->nin; s++) {
            ip[s] = at(S, in, op->in[s]);
            if (dm_arg_in(op->kind, s) == DM_ARG_GROUPED) groups = g->t[op->in[s]].numel / op->cols;
        }
        for (int s = 0; s < op->nout; s++) op_out[s] = at(S, ref, op->out[s]);
        if (dm_op_kind_class(op->kind) == DM_CLASS_CONTRACTION)
            dm_ref_contract(op->spec, g->dim, op->alpha, ip[0], ip[1], op_out[0]);
        else dm_ref_op(op, S->seed, groups, ip, op_out);
    }
}

static double tolerance(int dtype) { return dtype == 0 ? 1e-5 : 1e-2; }

/* Every op's outputs in `got` against `ref`; counts the kinds that match. count: whether
 * a match counts as the kind run on backend b (the generated backends: only when every
 * row program was generated). */
static void compare(const suite *S, const float *got, const float *ref, int b, int dtype, int count) {
    const dm_graph *g = &S->g;
    int nbad = 0;
    double worst = 0;
    const char *worst_op = "-";
    for (int o = 0; o < g->nop; o++) {
        const dm_op *op = &g->op[o];
        int good = 1;
        for (int s = 0; s < op->nout; s++) {
            const int t = op->out[s];
            const float *a = got + S->plan.offset[t] / 4, *r = ref + S->plan.offset[t] / 4;
            double d = 0, n2 = 0;
            int64_t nan = 0, masked_bad = 0;
            for (int64_t e = 0; e < g->t[t].numel; e++) {
                nan += isnan(a[e]) != 0;
                if (fabs((double)r[e]) > 1e30) { /* a masked score: exactly as stored */
                    masked_bad += !(fabs((double)a[e] - r[e]) <= 1e-6 * fabs((double)r[e]));
                    continue;
                }
                d += ((double)a[e] - r[e]) * ((double)a[e] - r[e]);
                n2 += (double)r[e] * r[e];
            }
            const double err = n2 > 0 ? sqrt(d / n2) : sqrt(d);
            const int ok = nan == 0 && masked_bad == 0 && err < tolerance(dtype);
            CHECK(ok);
            if (!ok) {
                good = 0;
                fprintf(stderr, "  FAIL %s %s %s: %s (act %s p %g causal %d) output %d: rel.err %.2e, %lld of %lld "
                        "not written, %lld masked wrong\n", S->label, k_backend[b], k_dtype[dtype], op->name,
                        dm_act_name(op->act), op->p, op->causal, s, err, (long long)nan,
                        (long long)g->t[t].numel, (long long)masked_bad);
            }
            if (!(err <= worst)) {
                worst = err;
                worst_op = op->name;
            }
            if (!(err <= g_worst[op->kind][b][dtype])) g_worst[op->kind][b][dtype] = err;
        }
        nbad += !good;
        if (good && count) g_ran[op->kind][b]++;
    }
    g_used[b] = 1;
    g_seen[b][dtype] = 1;
    printf("  %-22s %-50s %s: %3d ops, worst rel.err %.2e (%s)%s\n", S->label, k_backend[b], k_dtype[dtype],
           g->nop, worst, worst_op, nbad ? " FAIL" : "");
}

static void run_cpu(const suite *S) {
    float *a = malloc(sizeof(float) * (S->nf ? S->nf : 1)), *ref = malloc(sizeof(float) * (S->nf ? S->nf : 1));
    dm_cpu_exec ex;
    if (!a || !ref) goto done;
    memcpy(a, S->init, sizeof(float) * S->nf);
    memcpy(ref, S->init, sizeof(float) * S->nf);
    reference(S, S->init, ref);
    dm_status st = dm_cpu_exec_init(&ex, &S->plan, (char *)a, 2);
    CHECK_OK(st);
    if (st != DM_OK) goto done;
    for (int gi = 0; gi < S->plan.ngroups; gi++) CHECK_OK(dm_cpu_exec_group(&ex, gi, S->seed, 0));
    dm_cpu_exec_free(&ex);
    compare(S, a, ref, B_CPU, 0, 1);
done:
    free(a);
    free(ref);
}

#ifdef DM_HAVE_CUDA
/* The CUDA backend (flags: DM_CUDA_EMULATE and the row kernels) in storage type dtype. */
static void run_cuda(const suite *S, int b, unsigned flags, int dtype) {
    const dm_graph *g = &S->g;
    const size_t nf = S->nf ? S->nf : 1;
    float *in = malloc(sizeof(float) * nf), *ref = malloc(sizeof(float) * nf), *got = malloc(sizeof(float) * nf);
    dm_cuda_exec *ex = NULL;
    if (!in || !ref || !got) goto done;
    /* the reference computes from what the device stores, and is stored as it would be */
    memcpy(in, S->init, sizeof(float) * S->nf);
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].role != DM_ROLE_OUTPUT && g->t[t].base < 0) dm_cuda_round(dtype, at(S, in, t), (size_t)g->t[t].numel);
    memcpy(ref, in, sizeof(float) * S->nf);
    reference(S, in, ref);
    /* (but row statistics: the device keeps them in fp32, cuda_backend.h) */
    for (int o = 0; o < g->nop; o++)
        for (int s = 0; s < g->op[o].nout; s++)
            if (dm_arg_out(g->op[o].kind, s) != DM_ARG_ROWSCALAR)
                dm_cuda_round(dtype, at(S, ref, g->op[o].out[s]), (size_t)g->t[g->op[o].out[s]].numel);
    dm_status st = dm_cuda_exec_init(&ex, &S->plan, dtype, flags);
    CHECK_OK(st);
    if (st != DM_OK) goto done;
    int progs = 0, gen = dm_cuda_exec_generated(ex, &progs), all_gen = 1;
    if (flags & DM_CUDA_GEN) {
        all_gen = gen == progs;
        CHECK(all_gen);
        if (!all_gen)
            fprintf(stderr, "  FAIL %s %s: %d of %d row programs generated\n", S->label, k_backend[b], gen, progs);
    }
    CHECK_OK(dm_cuda_upload_arena(ex, in)); /* the outputs NaN */
    for (int gi = 0; gi < S->plan.ngroups; gi++) CHECK_OK(dm_cuda_exec_group(ex, gi, S->seed, 0));
    CHECK_OK(dm_cuda_sync(ex));
    for (size_t e = 0; e < S->nf; e++) got[e] = NAN;
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].role == DM_ROLE_OUTPUT) CHECK_OK(dm_cuda_download(ex, t, at(S, got, t)));
    compare(S, got, ref, b, dtype, all_gen);
done:
    dm_cuda_exec_free(ex);
    free(in);
    free(ref);
    free(got);
}
#endif

#ifdef DM_HAVE_CUDA
static int g_gpu; /* a CUDA device is usable */
#endif

static void run_suite(suite *S) {
    if (!suite_plan(S)) {
        CHECK(!"suite not planned");
        return;
    }
    run_cpu(S);
#ifdef DM_HAVE_CUDA
    for (int dt = 0; dt < 3; dt++) {
        run_cuda(S, B_EMU, DM_CUDA_EMULATE, dt);
        run_cuda(S, B_EMU_GEN, DM_CUDA_EMULATE | DM_CUDA_GEN, dt);
        if (S->sim) run_cuda(S, B_EMU_SIM, DM_CUDA_EMULATE | DM_CUDA_GEN | DM_CUDA_SIM_LANES, dt);
        if (g_gpu) {
            run_cuda(S, B_GPU, DM_CUDA_SYNC_EACH, dt);
            run_cuda(S, B_GPU_GEN, DM_CUDA_SYNC_EACH | DM_CUDA_GEN, dt);
        }
    }
#endif
    suite_free(S);
}

/* Every row kind in every variant of its params column, over (g, r) x c = R x C. */
static void row_suite(int64_t R, int64_t C, int sim) {
    suite S = {.seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(R * 131 + C), .sim = sim};
    snprintf(S.label, sizeof S.label, "rows %lld x %lld", (long long)R, (long long)C);
    dm_graph_init(&S.g);
    const int64_t G = R % 3 == 0 ? 3 : 1;
    S.g.dim['g' - 'a'] = G;
    S.g.dim['r' - 'a'] = R / G;
    S.g.dim['c' - 'a'] = C;
    static const double ps[3] = {0.0, 0.1, 0.5};
    int stream = 1;
    for (int k = 0; k < DM_NUM_OPS; k++) {
        const dm_op_kind K = (dm_op_kind)k;
        if (dm_op_kind_class(K) == DM_CLASS_CONTRACTION) continue;
        const unsigned pm = dm_op_params(K);
        const int na = pm & DM_OPP_ACT ? 3 : 1, nd = pm & DM_OPP_DROPOUT ? 3 : 1, nc = pm & DM_OPP_CAUSAL ? 2 : 1;
        for (int a = 0; a < na; a++)
            for (int d = 0; d < nd; d++)
                for (int c = 0; c < nc; c++) {
                    dm_op proto = {.act = (dm_act)a, .p = ps[d], .stream = pm & DM_OPP_DROPOUT ? stream++ : 0,
                                   .causal = c, .eps = 1e-5};
                    CHECK(add_op(&S.g, K, &proto, NULL, DM_ROLE_INPUT) >= 0);
                }
    }
    run_suite(&S);
}

/* The einsum specs (and scales) the encoder builder and autodiff make. */
typedef struct {
    char spec[64];
    float alpha;
} einsum;

static int builder_specs(einsum *out, int max) {
    int n = 0;
    for (int v = 0; v < 4; v++) {
        dm_layer_config cfg;
        dm_layer_config_default(&cfg);
        cfg.batch = 2, cfg.seq = 3, cfg.hidden = 4, cfg.heads = 2, cfg.ffn = 5;
        cfg.norm = v & 1 ? DM_NORM_PRE : DM_NORM_POST;
        dm_graph g;
        dm_encoder enc;
        dm_graph_init(&g);
        CHECK_OK(dm_build_encoder(&g, &cfg, 0, v < 2, &enc));
        for (int o = 0; o < g.nop; o++) {
            if (dm_op_kind_class(g.op[o].kind) != DM_CLASS_CONTRACTION) continue;
            int seen = 0;
            for (int q = 0; q < n; q++) seen |= !strcmp(out[q].spec, g.op[o].spec) && out[q].alpha == g.op[o].alpha;
            if (seen || n >= max) continue;
            snprintf(out[n].spec, sizeof out[n].spec, "%s", g.op[o].spec);
            out[n++].alpha = g.op[o].alpha;
        }
        dm_graph_free(&g);
    }
    return n;
}

/* Every builder contraction with its letters sized from [lo, hi]. */
static void contract_suite(const einsum *es, int n, int lo, int hi, int sim) {
    suite S = {.seed = 7, .sim = sim};
    snprintf(S.label, sizeof S.label, "einsums %d..%d", lo, hi);
    dm_graph_init(&S.g);
    for (int l = 0; l < 26; l++) S.g.dim[l] = lo + (int64_t)(next_u64() % (uint64_t)(hi - lo + 1));
    for (int k = 0; k < DM_NUM_OPS; k++) {
        if (dm_op_kind_class((dm_op_kind)k) != DM_CLASS_CONTRACTION) continue;
        for (int q = 0; q < n; q++) {
            dm_op proto = {.alpha = es[q].alpha};
            CHECK(add_op(&S.g, (dm_op_kind)k, &proto, es[q].spec, DM_ROLE_INPUT) >= 0);
        }
    }
    run_suite(&S);
}

static void summary(void) {
    int cols[NB * 3][2], nc = 0;
    for (int b = 0; b < NB; b++)
        for (int d = 0; d < 3; d++)
            if (g_seen[b][d]) cols[nc][0] = b, cols[nc++][1] = d;
    printf("\nworst rel.err per kind (column: backend, storage type):\n%-15s", "");
    for (int c = 0; c < nc; c++) {
        char h[24];
        snprintf(h, sizeof h, "%s %s", k_short[cols[c][0]], k_dtype[cols[c][1]]);
        printf(" %12s", h);
    }
    printf("\n");
    for (int k = 0; k < DM_NUM_OPS; k++) {
        printf("%-15s", dm_op_kind_name((dm_op_kind)k));
        for (int c = 0; c < nc; c++) printf(" %12.1e", g_worst[k][cols[c][0]][cols[c][1]]);
        printf("\n");
    }
    int backends = 0, pairs = 0;
    for (int b = 0; b < NB; b++) {
        if (!g_used[b]) continue;
        backends++;
        for (int k = 0; k < DM_NUM_OPS; k++) {
            pairs += g_ran[k][b] > 0;
            if (!g_ran[k][b]) fprintf(stderr, "FAIL: %s never ran on the backend %s\n", dm_op_kind_name((dm_op_kind)k), k_backend[b]);
        }
        printf("%-50s:", k_backend[b]);
        for (int k = 0; k < DM_NUM_OPS; k++) printf(" %d", g_ran[k][b]);
        printf(" instances per kind\n");
    }
    CHECK(pairs == DM_NUM_OPS * backends);
    printf("every kind on every backend: %d (kind, backend) pairs ran = %d kinds x %d backends %s\n", pairs,
           DM_NUM_OPS, backends, pairs == DM_NUM_OPS * backends ? "ok" : "FAIL");
}

int main(void) {
    /* rows x columns: odd and even lengths (vector remainders, dropout blocks that start
     * mid-Philox-block), a column of one, rows of more than one team of lanes; two random */
    int64_t shapes[8][2] = {{1, 1}, {6, 33}, {5, 7}, {12, 128}, {3, 768}, {2, 1031}};
    for (int s = 6; s < 8; s++) {
        shapes[s][0] = 1 + (int64_t)(next_u64() % 24);
        shapes[s][1] = 2 + (int64_t)(next_u64() % 299);
    }
    check_table();
#ifdef DM_HAVE_CUDA
    char why[256] = "";
    g_gpu = dm_cuda_available(why, sizeof why) == DM_OK;
    if (g_gpu) printf("CUDA backend: emulated on the host, and on the device %s\n", why);
    else printf("CUDA backend: emulated on the host (no device: %s)\n", why);
#else
    printf("SKIP: the CUDA backend is not built (dmove without DM_HAVE_CUDA): the CPU backend only\n");
#endif
    for (int s = 0; s < 8; s++) row_suite(shapes[s][0], shapes[s][1], s == 1 || s == 2);
    einsum es[64];
    const int n = builder_specs(es, 64);
    printf("the builders' einsums (%d):", n);
    for (int q = 0; q < n; q++) printf(" %s%s", es[q].spec, es[q].alpha != 1.0f ? "*a" : "");
    printf("\n");
    CHECK(n >= 6);
    contract_suite(es, n, 1, 6, 1);
    contract_suite(es, n, 5, 23, 0);
    summary();
    TEST_END();
}
