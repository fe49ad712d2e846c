/* test_model_ops.c: the whole model's operators (issue 24) in graphs, on the CPU backend:
 *  - BERT's embeddings (three EMBEDs: word, position, token type; two adds; LayerNorm) and
 *    a masked-LM head (an EMBED gathering the masked positions' rows of the hidden state,
 *    a decoder tied to the word table with a bias, XENT), one graph, its backward by
 *    autodiff (the word table's gradient: its gather's and its decoder's parts summed),
 *    against PyTorch (tests/ref/model_ops.safetensors, made by make_model_ops_ref.py with
 *    transformers' BertEmbeddings): h, the per-row losses and their mean, and all six
 *    parameter gradients, fused and unfused plans, 1 and 3 threads; the fused plan runs
 *    the three lookups, the adds and the LayerNorm as one group (no intermediate in
 *    memory) and writes the logits' gradient over the logits;
 *  - the gradient rules in float64: the same graph without the LayerNorm evaluated by a
 *    double interpreter here (forward and autodiff's backward ops), against central
 *    finite differences of sum(loss * dloss) over every parameter entry;
 *  - EMBED_BWD deterministic: bit-identical tables on 1, 2, 3 and 7 threads (repeated,
 *    skewed and invalid ids); out-of-range ids give zero rows and add nothing;
 *  - XENT on extreme logits (no overflow) and a label beyond the columns (ignored);
 *  - the cost model on the graph: the new kinds by class, a lookup's bytes the rows it
 *    reads (not its table), a scatter's the table it writes;
 *  - the fusion pass and the memory planner on an adversarial graph (a lookup into a
 *    same-shaped activation with reversed ids, a scatter shaped as its input);
 *  - on the CUDA backend (emulated without a GPU; SKIP in a build without it) the fused
 *    forward and the whole step against PyTorch (fp32 and bf16, interpreted and generated
 *    row kernels), and EMBED_BWD alone against the CPU kernel (duplicate, invalid and all
 *    equal ids; fp32 and bf16). */
#include <string.h>

#include "analysis/cost.h"
#include "core/safetensors.h"
#include "cpu/exec.h"
#include "graph/graph.h"
#include "layer/backends.h"
#include "plan/backend.h"
#include "plan/plan.h"
#include "testutil.h"

#ifndef REF_DIR
#define REF_DIR "tests/ref"
#endif

enum { B = 2, J = 5, I = 8, V = 11, M = 7, TY = 2, K = 4 };

typedef struct {
    int ids, pos, tt, mpos, labels, dloss;  /* inputs */
    int word, posw, typew, gamma, beta, bias; /* parameters */
    int h, loss;
} model;

static int T_(dm_graph *g, const char *name, const char *l, dm_role role, int *ok) {
    int t = dm_graph_tensor(g, name, l, role);
    if (t < 0) *ok = 0;
    return t;
}

static void op_(dm_graph *g, dm_op_kind k, const char *name, int64_t rows, int64_t cols, int64_t nindex,
                const int *in, const int *out, int *ok) {
    dm_op op = {.kind = k, .nin = dm_op_nin(k), .nout = dm_op_nout(k), .rows = rows, .cols = cols,
                .nindex = nindex, .eps = 1e-12, .alpha = 1};
    snprintf(op.name, sizeof op.name, "%s", name);
    memcpy(op.in, in, sizeof(int) * (size_t)op.nin);
    memcpy(op.out, out, sizeof(int) * (size_t)op.nout);
    if (k == DM_OP_CONTRACT) snprintf(op.spec, sizeof op.spec, "ki,vi->kv");
    if (dm_graph_op(g, &op) < 0) *ok = 0;
}

static int g_forward_only; /* build(): no backward (the CUDA backend's check) */

/* Embeddings (LayerNorm with ln) and the head, and autodiff of the losses seeded by dloss. */
static int build(dm_graph *g, model *m, int ln) {
    int ok = 1;
    dm_graph_init(g);
    g->dim['b' - 'a'] = B, g->dim['j' - 'a'] = J, g->dim['i' - 'a'] = I, g->dim['v' - 'a'] = V;
    g->dim['m' - 'a'] = M, g->dim['t' - 'a'] = TY, g->dim['k' - 'a'] = K;
    m->ids = T_(g, "ids", "bj", DM_ROLE_INPUT, &ok);
    m->pos = T_(g, "pos", "bj", DM_ROLE_INPUT, &ok);
    m->tt = T_(g, "tt", "bj", DM_ROLE_INPUT, &ok);
    m->mpos = T_(g, "mpos", "k", DM_ROLE_INPUT, &ok);
    m->labels = T_(g, "labels", "k", DM_ROLE_INPUT, &ok);
    m->dloss = T_(g, "dloss", "k", DM_ROLE_INPUT, &ok);
    m->word = T_(g, "word", "vi", DM_ROLE_PARAM, &ok);
    m->posw = T_(g, "position", "mi", DM_ROLE_PARAM, &ok);
    m->typew = T_(g, "type", "ti", DM_ROLE_PARAM, &ok);
    m->gamma = T_(g, "gamma", "i", DM_ROLE_PARAM, &ok);
    m->beta = T_(g, "beta", "i", DM_ROLE_PARAM, &ok);
    m->bias = T_(g, "bias", "v", DM_ROLE_PARAM, &ok);
    int e1 = T_(g, "e_word", "bji", DM_ROLE_ACT, &ok), e2 = T_(g, "e_pos", "bji", DM_ROLE_ACT, &ok);
    int e3 = T_(g, "e_type", "bji", DM_ROLE_ACT, &ok), s1 = T_(g, "s1", "bji", DM_ROLE_ACT, &ok);
    int s2 = ln ? T_(g, "s2", "bji", DM_ROLE_ACT, &ok) : -1;
    m->h = T_(g, "h", "bji", DM_ROLE_OUTPUT, &ok);
    int mean = ln ? T_(g, "mean", "bj", DM_ROLE_ACT, &ok) : -1, rstd = ln ? T_(g, "rstd", "bj", DM_ROLE_ACT, &ok) : -1;
    int hm = T_(g, "hm", "ki", DM_ROLE_ACT, &ok), lg = T_(g, "logits", "kv", DM_ROLE_ACT, &ok);
    int lg2 = T_(g, "logits_b", "kv", DM_ROLE_ACT, &ok);
    m->loss = T_(g, "loss", "k", DM_ROLE_OUTPUT, &ok);
    int lse = T_(g, "lse", "k", DM_ROLE_ACT, &ok);
    if (!ok) return 0;
    const int64_t R = B * J;
    op_(g, DM_OP_EMBED, "word_embed", R, I, V, (int[]){m->word, m->ids}, (int[]){e1}, &ok);
    op_(g, DM_OP_EMBED, "pos_embed", R, I, M, (int[]){m->posw, m->pos}, (int[]){e2}, &ok);
    op_(g, DM_OP_EMBED, "type_embed", R, I, TY, (int[]){m->typew, m->tt}, (int[]){e3}, &ok);
    op_(g, DM_OP_ADD, "add1", R, I, 0, (int[]){e1, e2}, (int[]){s1}, &ok);
    if (ln) {
        op_(g, DM_OP_ADD, "add2", R, I, 0, (int[]){s1, e3}, (int[]){s2}, &ok);
        op_(g, DM_OP_LAYERNORM, "emb_ln", R, I, 0, (int[]){s2, m->gamma, m->beta}, (int[]){m->h, mean, rstd}, &ok);
    } else {
        op_(g, DM_OP_ADD, "add2", R, I, 0, (int[]){s1, e3}, (int[]){m->h}, &ok);
    }
    op_(g, DM_OP_EMBED, "gather_masked", K, I, R, (int[]){m->h, m->mpos}, (int[]){hm}, &ok);
    op_(g, DM_OP_CONTRACT, "decoder", 0, 0, 0, (int[]){hm, m->word}, (int[]){lg}, &ok);
    op_(g, DM_OP_BIAS_ADD, "decoder_bias", K, V, 0, (int[]){lg, m->bias}, (int[]){lg2}, &ok);
    op_(g, DM_OP_XENT, "xent", K, V, 0, (int[]){lg2, m->labels}, (int[]){m->loss, lse}, &ok);
    if (!ok) return 0;
    if (g_forward_only) return 1;
    int dx = -1;
    dm_status s = dm_autodiff(g, m->loss, m->dloss, -1, &dx);
    CHECK_OK(s);
    return s == DM_OK;
}

/* The gradient root of parameter p (d_<name>, role PARAM_GRAD), or -1. */
static int grad_of(const dm_graph *g, int p) {
    char want[DM_NAME_LEN + 2];
    snprintf(want, sizeof want, "d_%s", g->t[p].name);
    int found = -1;
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].role == DM_ROLE_PARAM_GRAD && g->t[t].base < 0 && !strcmp(g->t[t].name, want))
            found = found < 0 ? t : -2;
    return found;
}

/* --- against PyTorch ----------------------------------------------------------------- */

static const float *ref(const dm_st_file *f, const char *name, float *buf, size_t n) {
    const dm_st_tensor *t = dm_st_find(f, name);
    CHECK(t != NULL);
    if (!t) return NULL;
    dm_status s = dm_st_to_f32(t, buf, n);
    CHECK_OK(s);
    return s == DM_OK ? buf : NULL;
}

static double run_vs_torch(const dm_st_file *f, int fused, int threads) {
    dm_graph g;
    model m;
    double worst = 0;
    if (!build(&g, &m, 1)) return 1;
    dm_plan plan;
    dm_status s = dm_plan_build(&g, fused, 0, 0, &plan);
    CHECK_OK(s);
    if (s != DM_OK) {
        dm_graph_free(&g);
        return 1;
    }
    if (fused && threads == 1) { /* the groups, as the fusion pass made them */
        printf("  fused groups:");
        for (int gi = 0; gi < plan.ngroups; gi++) {
            printf(" [");
            for (int k = 0; k < plan.groups[gi].nops; k++)
                printf("%s%s", k ? " " : "", g.op[plan.order[plan.groups[gi].first + k]].name);
            printf("]");
        }
        printf("\n");
        /* the table gathered from, and the scatter's output, in memory; the gather's rows
         * not: e_word, e_pos, e_type and s1 live in scratch rows of the LayerNorm's group */
        CHECK(plan.in_memory[m.word] && plan.in_memory[m.h] && plan.in_memory[grad_of(&g, m.posw)]);
        int lg = -1, dlg = -1, internal = 0;
        for (int t = 0; t < g.nt; t++) {
            if (!strcmp(g.t[t].name, "e_word") || !strcmp(g.t[t].name, "e_pos") || !strcmp(g.t[t].name, "e_type") ||
                !strcmp(g.t[t].name, "s1")) /* (s2: the LayerNorm's input, kept for its backward) */
                internal += !plan.in_memory[t];
            if (!strcmp(g.t[t].name, "logits_b")) lg = t;
            if (!strcmp(g.t[t].name, "d_logits_b")) dlg = t;
        }
        CHECK(internal == 4);
        /* the logits' gradient written over the logits (XENT_BWD is element by element) */
        CHECK(lg >= 0 && dlg >= 0 && plan.offset[lg] == plan.offset[dlg]);
        printf("  the lookups, adds and LayerNorm one group (%d of 4 intermediates in scratch rows); dlogits over "
               "the logits: %s\n", internal, lg >= 0 && dlg >= 0 && plan.offset[lg] == plan.offset[dlg] ? "yes" : "no");
    }
    char *arena = aligned_alloc(64, (plan.arena_bytes + 64) / 64 * 64);
    float buf[V * I];
    const struct { const char *name; int t; } ins[] = {
        {"ids", m.ids}, {"pos", m.pos}, {"tt", m.tt}, {"mpos", m.mpos}, {"labels", m.labels}, {"word", m.word},
        {"position", m.posw}, {"type", m.typew}, {"gamma", m.gamma}, {"beta", m.beta}, {"bias", m.bias}};
    for (size_t q = 0; q < sizeof ins / sizeof ins[0]; q++) {
        float *dst = dm_cpu_tensor_ptr(&plan, arena, ins[q].t);
        const float *src = ref(f, ins[q].name, buf, (size_t)g.t[ins[q].t].numel);
        if (dst && src) memcpy(dst, src, sizeof(float) * (size_t)g.t[ins[q].t].numel);
    }
    /* dloss: the mean over the rows that count is the caller's */
    float *lab = dm_cpu_tensor_ptr(&plan, arena, m.labels), *dl = dm_cpu_tensor_ptr(&plan, arena, m.dloss);
    int count = 0;
    for (int k = 0; k < K; k++) count += lab[k] >= 0;
    for (int k = 0; k < K; k++) dl[k] = lab[k] >= 0 ? 1.0f / (float)count : 0.0f;
    dm_cpu_exec ex;
    s = dm_cpu_exec_init(&ex, &plan, arena, threads);
    CHECK_OK(s);
    for (int gi = 0; s == DM_OK && gi < plan.ngroups; gi++) CHECK_OK(dm_cpu_exec_group(&ex, gi, 1, 0));
    if (s == DM_OK) dm_cpu_exec_free(&ex);
    const float *loss = dm_cpu_tensor_ptr(&plan, arena, m.loss);
    double mean = 0;
    for (int k = 0; k < K; k++) mean += loss[k] / count;
    float lref[1];
    if (ref(f, "loss", lref, 1)) {
        double e = fabs(mean - lref[0]) / fabs(lref[0]);
        CHECK(e < 1e-5);
        worst = worst_of(worst, e);
    }
    const struct { const char *name; int t; } outs[] = {
        {"h", m.h}, {"loss_rows", m.loss}, {"word.grad", grad_of(&g, m.word)}, {"position.grad", grad_of(&g, m.posw)},
        {"type.grad", grad_of(&g, m.typew)}, {"gamma.grad", grad_of(&g, m.gamma)},
        {"beta.grad", grad_of(&g, m.beta)}, {"bias.grad", grad_of(&g, m.bias)}};
    for (size_t q = 0; q < sizeof outs / sizeof outs[0]; q++) {
        CHECK(outs[q].t >= 0);
        if (outs[q].t < 0) continue;
        size_t n = (size_t)g.t[outs[q].t].numel;
        const float *want = ref(f, outs[q].name, buf, n);
        if (!want) continue;
        double e = rel_err(dm_cpu_tensor_ptr(&plan, arena, outs[q].t), want, n);
        CHECK(e < 1e-5);
        if (!(e < 1e-5)) fprintf(stderr, "  FAIL %s: rel.err %.2e\n", outs[q].name, e);
        worst = worst_of(worst, e);
    }
    printf("  embeddings + head vs PyTorch, %s plan (%d groups), %d thread%s: loss %.6f (torch %.6f), worst rel.err "
           "%.2e\n", fused ? "fused" : "unfused", plan.ngroups, threads, threads > 1 ? "s" : "", mean, lref[0], worst);
    free(arena);
    dm_plan_free(&plan);
    dm_graph_free(&g);
    return worst;
}

/* --- the gradient rules in float64 ------------------------------------------------------ */

/* Tensor t's element at letters' indices idx['a' + n] (default strides). */
static int64_t at_idx(const dm_tensor *t, const int64_t *idx) {
    int64_t o = 0;
    for (int d = 0; d < t->ndim; d++) o += idx[t->letters[d] - 'a'] * t->stride[d];
    return o;
}

static void einsum64(const dm_graph *g, const dm_op *op, double *const *v) {
    const dm_tensor *A = &g->t[op->in[0]], *Bt = &g->t[op->in[1]], *C = &g->t[op->out[0]];
    char let[27] = "";
    int nl = 0;
    for (const char *p = op->spec; *p; p++)
        if (*p >= 'a' && *p <= 'z' && !strchr(let, *p)) let[nl++] = *p, let[nl] = 0;
    double *a = v[op->in[0]], *b = v[op->in[1]], *c = v[op->out[0]];
    memset(c, 0, sizeof(double) * (size_t)C->numel);
    int64_t idx[26] = {0};
    for (;;) {
        c[at_idx(C, idx)] += op->alpha * a[at_idx(A, idx)] * b[at_idx(Bt, idx)];
        int d = nl - 1;
        while (d >= 0 && ++idx[let[d] - 'a'] == g->dim[let[d] - 'a']) idx[let[d--] - 'a'] = 0;
        if (d < 0) break;
    }
}

/* One op in double (the kinds of build(g, m, 0) and its backward). */
static void op64(const dm_graph *g, const dm_op *op, double *const *v) {
    const int64_t R = op->rows, C = op->cols;
    double *x = v[op->in[0]], *y = v[op->out[0]], *b = op->nin > 1 ? v[op->in[1]] : NULL;
    switch (op->kind) {
    case DM_OP_CONTRACT: einsum64(g, op, v); break;
    case DM_OP_ADD: for (int64_t e = 0; e < R * C; e++) y[e] = x[e] + b[e]; break;
    case DM_OP_BIAS_ADD: for (int64_t e = 0; e < R * C; e++) y[e] = x[e] + b[e % C]; break;
    case DM_OP_COLSUM:
        for (int64_t c = 0; c < C; c++) y[c] = 0;
        for (int64_t e = 0; e < R * C; e++) y[e % C] += x[e];
        break;
    case DM_OP_EMBED:
        for (int64_t r = 0; r < R; r++) {
            int64_t n = dm_index_row((float)b[r], op->nindex);
            for (int64_t c = 0; c < C; c++) y[r * C + c] = n >= 0 ? x[n * C + c] : 0;
        }
        break;
    case DM_OP_EMBED_BWD:
        memset(y, 0, sizeof(double) * (size_t)(op->nindex * C));
        for (int64_t r = 0; r < R; r++) {
            int64_t n = dm_index_row((float)b[r], op->nindex);
            for (int64_t c = 0; n >= 0 && c < C; c++) y[n * C + c] += x[r * C + c];
        }
        break;
    case DM_OP_XENT:
        for (int64_t r = 0; r < R; r++) {
            double mx = -INFINITY, s = 0;
            for (int64_t c = 0; c < C; c++) mx = fmax(mx, x[r * C + c]);
            for (int64_t c = 0; c < C; c++) s += exp(x[r * C + c] - mx);
            int64_t l = dm_index_row((float)b[r], C);
            v[op->out[1]][r] = mx + log(s);
            y[r] = l >= 0 ? mx + log(s) - x[r * C + l] : 0;
        }
        break;
    case DM_OP_XENT_BWD:
        for (int64_t r = 0; r < R; r++) {
            int64_t l = dm_index_row((float)v[op->in[2]][r], C);
            for (int64_t c = 0; c < C; c++)
                y[r * C + c] = l < 0 ? 0 : v[op->in[3]][r] * (exp(x[r * C + c] - b[r]) - (c == l));
        }
        break;
    default:
        CHECK(!"a kind the double interpreter lacks");
    }
}

/* sum(loss * dloss) of the forward ops (nfwd: their count), all ops with backward. */
static double run64(const dm_graph *g, double *const *v, int nops, int loss, int dloss) {
    for (int o = 0; o < nops; o++) op64(g, &g->op[o], v);
    double s = 0;
    for (int k = 0; k < K; k++) s += v[loss][k] * v[dloss][k];
    return s;
}

static void gradcheck64(void) {
    dm_graph g;
    model m;
    int nfwd = 0; /* the forward ops come first */
    if (!build(&g, &m, 0)) return;
    for (int o = 0; o < g.nop; o++) nfwd += g.op[o].pass == 0;
    double **v = calloc((size_t)g.nt, sizeof(double *));
    for (int t = 0; t < g.nt; t++) v[t] = calloc((size_t)g.t[t].numel, sizeof(double));
    uint64_t st = 99;
    for (int t = 0; t < g.nt; t++)
        for (int64_t e = 0; g.t[t].role == DM_ROLE_PARAM && e < g.t[t].numel; e++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            v[t][e] = ((double)(st >> 11) / 9007199254740992.0 - 0.5) * 1.5;
        }
    /* ids with repeats, 0 and the last row, one out of range (a zero row); a label -100 */
    const double ids[B * J] = {0, 3, 10, 3, 7, 3, 1, 10, 11, 5}, tts[B * J] = {0, 0, 1, 1, 1, 0, 0, 1, 1, 1};
    const double mpos[K] = {0, 4, 9, 4}, labels[K] = {2, 10, -100, 0}, dloss[K] = {0.7, -0.4, 0.9, 1.3};
    for (int r = 0; r < B * J; r++) v[m.ids][r] = ids[r], v[m.pos][r] = r % J, v[m.tt][r] = tts[r];
    for (int k = 0; k < K; k++) v[m.mpos][k] = mpos[k], v[m.labels][k] = labels[k], v[m.dloss][k] = dloss[k];
    run64(&g, v, g.nop, m.loss, m.dloss);
    const int params[4] = {m.word, m.posw, m.typew, m.bias};
    for (int q = 0; q < 4; q++) {
        const int p = params[q], gp = grad_of(&g, p);
        CHECK(gp >= 0);
        if (gp < 0) continue;
        double *grad = malloc(sizeof(double) * (size_t)g.t[p].numel), dd = 0, gg = 0;
        memcpy(grad, v[gp], sizeof(double) * (size_t)g.t[p].numel);
        for (int64_t e = 0; e < g.t[p].numel; e++) {
            const double x0 = v[p][e], h = 1e-5;
            v[p][e] = x0 + h;
            const double lp = run64(&g, v, nfwd, m.loss, m.dloss);
            v[p][e] = x0 - h;
            const double lm = run64(&g, v, nfwd, m.loss, m.dloss);
            v[p][e] = x0;
            const double fd = (lp - lm) / (2 * h);
            dd += (fd - grad[e]) * (fd - grad[e]);
            gg += grad[e] * grad[e];
        }
        const double rel = sqrt(dd / gg);
        CHECK(gg > 0 && rel < 1e-8);
        printf("  float64 finite differences, %-8s (%lld entries): ||grad|| %.3e, rel.err %.2e %s\n", g.t[p].name,
               (long long)g.t[p].numel, sqrt(gg), rel, gg > 0 && rel < 1e-8 ? "ok" : "FAIL");
        free(grad);
    }
    for (int t = 0; t < g.nt; t++) free(v[t]);
    free(v);
    dm_graph_free(&g);
}

/* --- EMBED_BWD determinism, invalid ids, XENT extremes -------------------------------- */

/* One op of kind k over rows x cols (table n rows) on the CPU, `threads` threads; in: the
 * inputs (numel each), out: the first output. */
static void run_one(dm_op_kind k, int64_t rows, int64_t cols, int64_t n, const float *const *in, float *out,
                    int threads) {
    dm_graph g;
    dm_graph_init(&g);
    g.dim['r' - 'a'] = rows, g.dim['c' - 'a'] = cols, g.dim['n' - 'a'] = n;
    int ok = 1, ts[6];
    const char *l_in[2][4] = {{"rc", "r"}, {"rc", "r"}};
    const int nin = dm_op_nin(k), nout = dm_op_nout(k);
    for (int s = 0; s < nin; s++) {
        dm_arg_kind a = dm_arg_in(k, s);
        ts[s] = T_(&g, s ? "in1" : "in0", a == DM_ARG_INDEXED ? "nc" : a == DM_ARG_ROWSCALAR ? "r" : l_in[0][0],
                   DM_ROLE_INPUT, &ok);
    }
    for (int s = 0; s < nout; s++) {
        dm_arg_kind a = dm_arg_out(k, s);
        ts[nin + s] = T_(&g, s ? "out1" : "out0", a == DM_ARG_SCATTER ? "nc" : a == DM_ARG_ROWSCALAR ? "r" : "rc",
                         DM_ROLE_OUTPUT, &ok);
    }
    op_(&g, k, "op", rows, cols, dm_op_indexed(k) ? n : 0, ts, ts + nin, &ok);
    CHECK(ok);
    dm_plan plan;
    if (!ok || dm_plan_build(&g, 1, 0, 0, &plan) != DM_OK) {
        CHECK(!"planned");
        dm_graph_free(&g);
        return;
    }
    char *arena = aligned_alloc(64, (plan.arena_bytes + 64) / 64 * 64);
    for (int s = 0; s < nin; s++)
        memcpy(dm_cpu_tensor_ptr(&plan, arena, ts[s]), in[s], sizeof(float) * (size_t)g.t[ts[s]].numel);
    float *o = dm_cpu_tensor_ptr(&plan, arena, ts[nin]);
    for (int64_t e = 0; e < g.t[ts[nin]].numel; e++) o[e] = NAN;
    dm_cpu_exec ex;
    CHECK_OK(dm_cpu_exec_init(&ex, &plan, arena, threads));
    CHECK_OK(dm_cpu_exec_group(&ex, 0, 1, 0));
    dm_cpu_exec_free(&ex);
    memcpy(out, o, sizeof(float) * (size_t)g.t[ts[nin]].numel);
    free(arena);
    dm_plan_free(&plan);
    dm_graph_free(&g);
}

/* R ids into an N-row table, skewed: most rows on ids 0..2, some invalid (-2, -1, N..N+1,
 * a NaN at row 5) */
static void skewed_ids(float *idx, int R, int N) {
    for (int r = 0; r < R; r++) idx[r] = r % 3 ? (float)(r % 3) : (float)((r * 7) % (N + 4)) - 2.0f;
    if (R > 5) idx[5] = NAN;
}

/* EMBED_BWD of R rows of width C into an N-row table: 1, 2, 3 and 7 threads bit-identical,
 * against a double sum, the rows no valid id selects zero (the output starts as NaN) */
static void scatter_case(int R, int C, int N, const char *what) {
    float *dy = malloc(sizeof(float) * (size_t)R * C), *idx = malloc(sizeof(float) * (size_t)R),
          *t1 = malloc(sizeof(float) * (size_t)N * C), *tk = malloc(sizeof(float) * (size_t)N * C);
    double *ref = calloc((size_t)N * C, sizeof(double));
    char *hit = calloc((size_t)N, 1);
    CHECK(dy && idx && t1 && tk && ref && hit);
    if (!dy || !idx || !t1 || !tk || !ref || !hit) goto out;
    uint64_t st = 7;
    for (int64_t e = 0; e < (int64_t)R * C; e++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        dy[e] = (float)((double)(st >> 11) / 9007199254740992.0 - 0.5) * (e % 5 == 0 ? 1e4f : 1.0f);
    }
    int bad = 0;
    skewed_ids(idx, R, N);
    for (int r = 0; r < R; r++) bad += dm_index_row(idx[r], N) < 0;
    CHECK(dm_index_count_bad(idx, R, N) == bad && bad > 0);
    const float *in[2] = {dy, idx};
    run_one(DM_OP_EMBED_BWD, R, C, N, in, t1, 1);
    int same = 1;
    const int threads[3] = {2, 3, 7};
    for (int q = 0; q < 3; q++) {
        run_one(DM_OP_EMBED_BWD, R, C, N, in, tk, threads[q]);
        same &= memcmp(t1, tk, sizeof(float) * (size_t)N * C) == 0;
    }
    CHECK(same);
    for (int r = 0; r < R; r++) {
        const int64_t n = dm_index_row(idx[r], N);
        if (n < 0) continue;
        hit[n] = 1;
        for (int c = 0; c < C; c++) ref[n * C + c] += dy[(int64_t)r * C + c];
    }
    double d = 0, n2 = 0;
    int zero_rows = 1;
    for (int64_t e = 0; e < (int64_t)N * C; e++) {
        d += (ref[e] - t1[e]) * (ref[e] - t1[e]);
        n2 += ref[e] * ref[e];
        if (!hit[e / C]) zero_rows &= t1[e] == 0.0f;
    }
    CHECK(sqrt(d / n2) < 1e-5 && zero_rows);
    printf("  embed_bwd %dx%d into %d rows (%d ids invalid%s): 1, 2, 3, 7 threads bit-identical %s, rel.err %.1e "
           "against double, rows not selected zero %s\n", R, C, N, bad, what, same ? "ok" : "FAIL", sqrt(d / n2),
           zero_rows ? "ok" : "FAIL");
out:
    free(dy), free(idx), free(t1), free(tk), free(ref), free(hit);
}

static void scatter_checks(void) {
    enum { R = 3000, C = 77, N = 50 };
    scatter_case(R, C, N, "");
    /* a table past 8 MB, cleared by streaming stores (exec.c), its rows 77 floats: each
     * thread's columns start off a 64-byte line */
    scatter_case(600, C, 30000, "; a table past 8 MB");
    float idx[R];
    skewed_ids(idx, R, N);
    /* EMBED: invalid ids give zero rows */
    float tab[N * C], out[R * C];
    for (int e = 0; e < N * C; e++) tab[e] = (float)(e + 1);
    const float *in2[2] = {tab, idx};
    run_one(DM_OP_EMBED, R, C, N, in2, out, 2);
    int ok = 1;
    for (int r = 0; r < R; r++) {
        int64_t n = dm_index_row(idx[r], N);
        for (int c = 0; c < C; c++) ok &= out[r * C + c] == (n >= 0 ? tab[n * C + c] : 0.0f);
    }
    CHECK(ok);
    printf("  embed: rows of valid ids copied, invalid ids (-2, -1, N..N+1, NaN) zero rows: %s\n", ok ? "ok" : "FAIL");
    /* XENT: logits of +-1e4 (no overflow), a label beyond the columns (ignored) */
    float lg[3 * 4] = {1e4f, 0, -1e4f, 3, -1e4f, -1e4f, 1e4f, 1e4f, 1, 2, 3, 4}, lab[3] = {0, 2, 4};
    float loss[3];
    const float *in3[2] = {lg, lab};
    run_one(DM_OP_XENT, 3, 4, 0, in3, loss, 1);
    ok = fabsf(loss[0]) < 1e-3f && fabsf(loss[1] - logf(2.0f)) < 1e-5f && loss[2] == 0.0f;
    CHECK(ok);
    printf("  xent: logits +-1e4 %.3g and %.6f (log 2), label beyond the columns %.1f (ignored): %s\n", loss[0],
           loss[1], loss[2], ok ? "ok" : "FAIL");
}

/* The cost model on the model graph: the new kinds by class, a lookup's bytes the rows it
 * reads (not the table), a scatter's the whole table it writes. */
static void analysis_checks(void) {
    dm_graph g;
    model m;
    if (!build(&g, &m, 1)) return;
    dm_plan plan;
    dm_device dev;
    dm_cost_report rep;
    CHECK_OK(dm_device_preset("h100", &dev));
    CHECK_OK(dm_plan_build(&g, 1, 0, 0, &plan));
    dm_status s = dm_cost_analyze(&g, &plan, &dev, 4, &rep);
    CHECK_OK(s);
    if (s != DM_OK) return;
    int seen = 0;
    for (int o = 0; o < g.nop; o++) {
        const dm_op *op = &g.op[o];
        const dm_op_cost *c = &rep.ops[o];
        if (!strcmp(op->name, "word_embed")) { /* reads R ids and R rows of I; writes R x I */
            CHECK(c->cls == DM_CLASS_ELEMENTWISE && c->flop == 0);
            CHECK(c->bytes_read == 4.0 * (B * J * I + B * J) && c->bytes_written == 4.0 * B * J * I);
            seen++;
        }
        if (!strcmp(op->name, "word_embed_bwd")) { /* reads dy and the ids, writes the whole table */
            CHECK(c->cls == DM_CLASS_NORMALIZATION && c->flop == (double)B * J * I);
            CHECK(c->bytes_read == 4.0 * (B * J * I + B * J) && c->bytes_written == 4.0 * V * I);
            seen++;
        }
        if (op->kind == DM_OP_XENT) {
            CHECK(c->cls == DM_CLASS_NORMALIZATION && c->flop == 3.0 * K * V);
            seen++;
        }
        if (op->kind == DM_OP_XENT_BWD) {
            CHECK(c->cls == DM_CLASS_ELEMENTWISE && c->flop == 4.0 * K * V);
            seen++;
        }
    }
    CHECK(seen == 4);
    printf("  analysis: flop by class contraction %.0f, normalization %.0f, element-wise %.0f; bytes unfused %.0f, "
           "fused %.0f (%.0f%% less); the lookups' bytes their rows, the scatter's its table: %s\n",
           rep.class_flop[DM_CLASS_CONTRACTION], rep.class_flop[DM_CLASS_NORMALIZATION],
           rep.class_flop[DM_CLASS_ELEMENTWISE], rep.unfused_bytes, rep.fused_bytes, rep.reduction_pct,
           seen == 4 ? "ok" : "FAIL");
    dm_cost_free(&rep);
    dm_plan_free(&plan);
    dm_graph_free(&g);
}

/* The passes on an adversarial graph: a lookup into an activation of the same shape as
 * its output (N == rows), indices reversed, and a scatter whose output is shaped as its
 * input: t = x + x; e = embed(t, idx); y = e + t; z = embed_bwd(e + e, idx). A table made
 * in the lookup's group would live in scratch rows (wrong rows read), an output written
 * over t or e while a lookup still reads other rows of it, or z over its input, would
 * corrupt rows: fused and unfused plans, memory reused, against direct loops. */
static void adversarial_plans(void) {
    enum { R = 37, C = 19 };
    for (int fused = 0; fused < 2; fused++) {
        dm_graph g;
        dm_graph_init(&g);
        g.dim['r' - 'a'] = R, g.dim['c' - 'a'] = C;
        int ok = 1;
        int x = T_(&g, "x", "rc", DM_ROLE_INPUT, &ok), idx = T_(&g, "idx", "r", DM_ROLE_INPUT, &ok);
        int t = T_(&g, "t", "rc", DM_ROLE_ACT, &ok), e = T_(&g, "e", "rc", DM_ROLE_ACT, &ok);
        int y = T_(&g, "y", "rc", DM_ROLE_OUTPUT, &ok), e2 = T_(&g, "e2", "rc", DM_ROLE_ACT, &ok);
        int z = T_(&g, "z", "rc", DM_ROLE_OUTPUT, &ok);
        if (!ok) return;
        op_(&g, DM_OP_ADD, "t", R, C, 0, (int[]){x, x}, (int[]){t}, &ok);
        op_(&g, DM_OP_EMBED, "e", R, C, R, (int[]){t, idx}, (int[]){e}, &ok);
        op_(&g, DM_OP_ADD, "y", R, C, 0, (int[]){e, t}, (int[]){y}, &ok);
        op_(&g, DM_OP_ADD, "e2", R, C, 0, (int[]){e, e}, (int[]){e2}, &ok);
        op_(&g, DM_OP_EMBED_BWD, "z", R, C, R, (int[]){e2, idx}, (int[]){z}, &ok);
        dm_plan plan;
        CHECK(ok);
        if (!ok || dm_plan_build(&g, fused, 0, 0, &plan) != DM_OK) {
            CHECK(!"planned");
            dm_graph_free(&g);
            return;
        }
        char *arena = aligned_alloc(64, (plan.arena_bytes + 64) / 64 * 64);
        float *px = dm_cpu_tensor_ptr(&plan, arena, x), *pi = dm_cpu_tensor_ptr(&plan, arena, idx);
        for (int e0 = 0; e0 < R * C; e0++) px[e0] = (float)(e0 % 97) * 0.25f - 3.0f;
        for (int r = 0; r < R; r++) pi[r] = (float)(R - 1 - r);
        pi[5] = 7; /* a repeat: row 7 twice, row R - 1 - 5 never */
        dm_cpu_exec ex;
        CHECK_OK(dm_cpu_exec_init(&ex, &plan, arena, 2));
        for (int gi = 0; gi < plan.ngroups; gi++) CHECK_OK(dm_cpu_exec_group(&ex, gi, 1, 0));
        dm_cpu_exec_free(&ex);
        const float *py = dm_cpu_tensor_ptr(&plan, arena, y), *pz = dm_cpu_tensor_ptr(&plan, arena, z);
        int good = 1;
        for (int r = 0; r < R; r++) {
            const int n = (int)pi[r];
            for (int c = 0; c < C; c++) good &= py[r * C + c] == 2 * px[n * C + c] + 2 * px[r * C + c];
        }
        for (int n = 0; n < R; n++)
            for (int c = 0; c < C; c++) {
                float want = 0;
                for (int r = 0; r < R; r++)
                    if ((int)pi[r] == n) want += 4 * px[(int)pi[r] * C + c];
                good &= pz[n * C + c] == want;
            }
        CHECK(good);
        printf("  adversarial plan (%s, %d groups, %zu arena bytes): a lookup into a same-shaped activation with "
               "reversed ids, a scatter shaped as its input: %s\n", fused ? "fused" : "unfused", plan.ngroups,
               plan.arena_bytes, good ? "ok" : "FAIL");
        free(arena);
        dm_plan_free(&plan);
        dm_graph_free(&g);
    }
}

/* EMBED_BWD alone on the CUDA backend B (emulated: scatter.cu's steps on the host, in the
 * device's order) with storage dt: dy (R x C), idx (R) in, the table (N x C) to out. */
static int cuda_scatter_one(const dm_backend *B, dm_dtype dt, int64_t R, int64_t C, int64_t N, const float *dy,
                            const float *idx, float *out) {
    dm_graph g;
    dm_graph_init(&g);
    g.dim['r' - 'a'] = R, g.dim['c' - 'a'] = C, g.dim['n' - 'a'] = N;
    int ok = 1, ts[3];
    ts[0] = T_(&g, "dy", "rc", DM_ROLE_INPUT, &ok);
    ts[1] = T_(&g, "idx", "r", DM_ROLE_INPUT, &ok);
    ts[2] = T_(&g, "table", "nc", DM_ROLE_OUTPUT, &ok);
    op_(&g, DM_OP_EMBED_BWD, "scatter", R, C, N, ts, ts + 2, &ok);
    dm_plan plan;
    if (!ok || dm_plan_build(&g, 1, 0, 0, &plan) != DM_OK) {
        CHECK(!"planned");
        dm_graph_free(&g);
        return 0;
    }
    char *host = aligned_alloc(64, (plan.arena_bytes + 127) / 64 * 64);
    memset(host, 0, (plan.arena_bytes + 127) / 64 * 64);
    memcpy(dm_cpu_tensor_ptr(&plan, host, ts[0]), dy, sizeof(float) * (size_t)(R * C));
    memcpy(dm_cpu_tensor_ptr(&plan, host, ts[1]), idx, sizeof(float) * (size_t)R);
    dm_layer_options opt = {.threads = 2, .device = DM_DEVICE_CUDA, .dtype = dt, .rows = DM_ROWS_INTERP};
    dm_backend_state *st = NULL;
    dm_status s = B->create(&st, &plan, host, NULL, &opt, 0, NULL);
    CHECK_OK(s);
    if (s == DM_OK) {
        for (int q = 0; q < 2; q++) CHECK_OK(B->upload(st, ts[q], dm_cpu_tensor_ptr(&plan, host, ts[q])));
        CHECK_OK(B->run_group(st, 0, 1, 0));
        CHECK_OK(B->sync(st));
        CHECK_OK(B->download(st, ts[2], out));
        B->destroy(st);
    }
    free(host);
    dm_plan_free(&plan);
    dm_graph_free(&g);
    return s == DM_OK;
}

/* The CUDA EMBED_BWD against the CPU kernel: duplicate ids with invalid ones (-2, -1, N,
 * N + 1, NaN), all ids equal (one run across many chunks), a table of 30522 rows (more
 * rows per counting thread), a single row; fp32 (1e-6) and bf16 (dy rounded on upload:
 * 1e-2); rows no valid id selects exactly zero; two runs bit-identical. */
static void cuda_scatter(const dm_backend *B) {
    static const struct { int64_t R, C, N; int pattern; const char *what; } cases[] = {
        {3000, 77, 50, 0, "duplicate and invalid ids"}, {1000, 33, 7, 1, "all ids equal"},
        {3000, 3, 30522, 2, "a 30522-row table"}, {1, 300, 4, 1, "one row"}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        const int64_t R = cases[q].R, C = cases[q].C, N = cases[q].N;
        float *dy = malloc(sizeof(float) * (size_t)(R * C)), *idx = malloc(sizeof(float) * (size_t)R);
        float *want = malloc(sizeof(float) * (size_t)(N * C)), *got = malloc(sizeof(float) * (size_t)(N * C));
        float *again = malloc(sizeof(float) * (size_t)(N * C));
        uint64_t z = 11 + q;
        for (int64_t e = 0; e < R * C; e++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            dy[e] = (float)((double)(z >> 11) / 9007199254740992.0 - 0.5);
        }
        for (int64_t r = 0; r < R; r++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            idx[r] = cases[q].pattern == 1 ? 3.0f
                     : cases[q].pattern == 2 ? (float)((int64_t)(z >> 33) % (N + 10)) - 5.0f
                     : r % 3 ? (float)(r % 3) : (float)((r * 7) % (N + 4)) - 2.0f;
            if (cases[q].pattern == 0 && r == 5) idx[r] = NAN;
        }
        const float *in[2] = {dy, idx};
        run_one(DM_OP_EMBED_BWD, R, C, N, in, want, 1);
        for (int v = 0; v < 2; v++) {
            const dm_dtype dt = v ? DM_DTYPE_BF16 : DM_DTYPE_FP32;
            const double tol = v ? 1e-2 : 1e-6;
            if (!cuda_scatter_one(B, dt, R, C, N, dy, idx, got) || !cuda_scatter_one(B, dt, R, C, N, dy, idx, again))
                continue;
            const int same = memcmp(got, again, sizeof(float) * (size_t)(N * C)) == 0;
            int zero = 1;
            for (int64_t n = 0; n < N; n++) {
                int any = 0;
                for (int64_t r = 0; r < R && !any; r++) any = dm_index_row(idx[r], N) == n;
                for (int64_t c = 0; c < C && !any; c++) zero &= got[n * C + c] == 0.0f;
            }
            const double e = rel_err(got, want, (size_t)(N * C));
            CHECK(same && zero && e < tol);
            printf("  cuda (%s) %s embed_bwd %lldx%lld into %lld rows, %s: vs the CPU kernel rel.err %.1e, "
                   "rows not selected zero %s, two runs bit-identical %s\n", cuda_where(), v ? "bf16" : "fp32", (long long)R,
                   (long long)C, (long long)N, cases[q].what, e, zero ? "ok" : "FAIL", same ? "ok" : "FAIL");
        }
        free(dy);
        free(idx);
        free(want);
        free(got);
        free(again);
    }
}

/* The whole step (forward and backward, the embedding gradients by scatter.cu) on the
 * CUDA backend state st: h, the losses and the six parameter gradients against PyTorch
 * (fp32 1e-5; bf16 storage 3e-2). */
static void cuda_whole_step(const dm_backend *B, dm_backend_state *st, const dm_st_file *f, const dm_graph *g,
                            const dm_plan *plan, const model *m, char *host, double tol, const char *what) {
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].base < 0 && plan->offset[t] >= 0 && g->t[t].role != DM_ROLE_OUTPUT &&
            g->t[t].role != DM_ROLE_PARAM_GRAD)
            CHECK_OK(B->upload(st, t, dm_cpu_tensor_ptr(plan, host, t)));
    for (int gi = 0; gi < plan->ngroups; gi++) CHECK_OK(B->run_group(st, gi, 1, 0));
    CHECK_OK(B->sync(st));
    const struct { const char *name; int t; } outs[] = {
        {"h", m->h}, {"loss_rows", m->loss}, {"word.grad", grad_of(g, m->word)}, {"position.grad", grad_of(g, m->posw)},
        {"type.grad", grad_of(g, m->typew)}, {"gamma.grad", grad_of(g, m->gamma)},
        {"beta.grad", grad_of(g, m->beta)}, {"bias.grad", grad_of(g, m->bias)}};
    double worst[2] = {0, 0}; /* h and losses; gradients */
    float buf[V * I];
    for (size_t q = 0; q < sizeof outs / sizeof outs[0]; q++) {
        CHECK(outs[q].t >= 0);
        if (outs[q].t < 0) continue;
        const size_t n = (size_t)g->t[outs[q].t].numel;
        float *got = malloc(sizeof(float) * n);
        CHECK_OK(B->download(st, outs[q].t, got));
        const float *want = ref(f, outs[q].name, buf, n);
        const double e = want ? rel_err(got, want, n) : 1;
        worst[q >= 2] = worst_of(worst[q >= 2], e);
        if (!(e < tol)) fprintf(stderr, "  FAIL %s: rel.err %.2e\n", outs[q].name, e);
        CHECK(e < tol);
        free(got);
    }
    printf("  cuda (%s) %s, the whole step (%d groups): h and losses worst rel.err %.2e, the six gradients "
           "%.2e vs PyTorch %s\n", cuda_where(), what, plan->ngroups, worst[0], worst[1],
           worst[0] < tol && worst[1] < tol ? "ok" : "FAIL");
}

/* The CUDA backend (emulated without a GPU) on the fused plan of the model's forward
 * (the lookups, adds and LayerNorm as one row program; the gather of the masked rows, the
 * tied decoder, its bias and the loss) against PyTorch: fp32 and bf16 storage, the
 * interpreting and the generated row kernels; then the whole step (cuda_whole_step). */
static void cuda_forward(const dm_st_file *f) {
    const dm_backend *B = NULL;
    if (dm_backend_find(DM_DEVICE_CUDA, &B) != DM_OK) {
        printf("SKIP: the CUDA backend: %s\n", dm_last_error());
        return;
    }
    const char *was = getenv("DMOVE_CUDA_EMULATE");
    if (!was) setenv("DMOVE_CUDA_EMULATE", "1", 1);
    cuda_scatter(B);
    for (int pass = 0; pass < 2; pass++) {
        g_forward_only = pass == 0;
        dm_graph g;
        model m;
        dm_plan plan;
        if (!build(&g, &m, 1)) return;
        CHECK_OK(dm_plan_build(&g, 1, 0, 0, &plan));
        float *host = aligned_alloc(64, (plan.arena_bytes + 127) / 64 * 64), buf[V * I];
        memset(host, 0, (plan.arena_bytes + 127) / 64 * 64);
        if (pass == 1) { /* dloss: 1 / count on the rows that count, as run_vs_torch */
            const float *lab = ref(f, "labels", buf, K);
            int count = 0;
            for (int k = 0; lab && k < K; k++) count += lab[k] >= 0;
            for (int k = 0; lab && k < K; k++)
                dm_cpu_tensor_ptr(&plan, (char *)host, m.dloss)[k] = lab[k] >= 0 ? 1.0f / (float)count : 0.0f;
        }
        const struct { const char *name; int t; } ins[] = {
            {"ids", m.ids}, {"pos", m.pos}, {"tt", m.tt}, {"mpos", m.mpos}, {"labels", m.labels},
            {"word", m.word}, {"position", m.posw}, {"type", m.typew}, {"gamma", m.gamma}, {"beta", m.beta},
            {"bias", m.bias}};
        for (size_t q = 0; q < sizeof ins / sizeof ins[0]; q++) {
            const float *src = ref(f, ins[q].name, buf, (size_t)g.t[ins[q].t].numel);
            if (src) memcpy(dm_cpu_tensor_ptr(&plan, (char *)host, ins[q].t), src, sizeof(float) * (size_t)g.t[ins[q].t].numel);
        }
        static const dm_dtype dts[3] = {DM_DTYPE_FP32, DM_DTYPE_FP32, DM_DTYPE_BF16};
        static const dm_rows rws[3] = {DM_ROWS_INTERP, DM_ROWS_GEN, DM_ROWS_INTERP};
        for (int v = 0; v < 3; v++) {
            dm_layer_options opt = {.threads = 2, .device = DM_DEVICE_CUDA, .dtype = dts[v], .rows = rws[v]};
            dm_backend_state *st = NULL;
            dm_status s = B->create(&st, &plan, (char *)host, NULL, &opt, 0, NULL);
            CHECK_OK(s);
            if (pass == 1 && s == DM_OK) { /* the whole step, the scatter-adds included */
                cuda_whole_step(B, st, f, &g, &plan, &m, (char *)host, dts[v] == DM_DTYPE_FP32 ? 1e-5 : 3e-2,
                                dts[v] == DM_DTYPE_FP32 ? (rws[v] == DM_ROWS_GEN ? "fp32, rows gen" : "fp32, rows interp")
                                                        : "bf16, rows interp");
                B->destroy(st);
                continue;
            }
            if (s != DM_OK) break;
            double progs = -1, gen = -2;
            const dm_layer_note *notes = NULL;
            for (int k = 0, nn = B->notes(st, &notes); k < nn; k++) {
                if (!strcmp(notes[k].key, "row_programs") && !notes[k].text) progs = notes[k].value;
                if (!strcmp(notes[k].key, "row_programs_generated") && !notes[k].text) gen = notes[k].value;
            }
            if (rws[v] == DM_ROWS_GEN) CHECK(progs > 0 && gen == progs); /* every program generated */
            for (int t = 0; t < g.nt; t++)
                if (g.t[t].base < 0 && plan.offset[t] >= 0 && g.t[t].role != DM_ROLE_OUTPUT)
                    CHECK_OK(B->upload(st, t, dm_cpu_tensor_ptr(&plan, (char *)host, t)));
            for (int gi = 0; gi < plan.ngroups; gi++) CHECK_OK(B->run_group(st, gi, 1, 0));
            CHECK_OK(B->sync(st));
            const double tol = dts[v] == DM_DTYPE_FP32 ? 1e-5 : 2e-2;
            double worst = 0;
            const struct { const char *name; int t; } outs[] = {{"h", m.h}, {"loss_rows", m.loss}};
            for (int q = 0; q < 2; q++) {
                const size_t n = (size_t)g.t[outs[q].t].numel;
                float *got = malloc(sizeof(float) * n);
                CHECK_OK(B->download(st, outs[q].t, got));
                const float *want = ref(f, outs[q].name, buf, n);
                const double e = want ? rel_err(got, want, n) : 1;
                CHECK(e < tol);
                worst = worst_of(worst, e);
                free(got);
            }
            printf("  cuda (%s) %s, rows %s, fused forward (%d groups, %g row programs, %g generated): h and "
                   "losses vs PyTorch, worst rel.err %.2e %s\n", cuda_where(), dts[v] == DM_DTYPE_FP32 ? "fp32" : "bf16",
                   dm_rows_name(rws[v]), plan.ngroups, progs, gen < 0 ? 0 : gen, worst, worst < tol ? "ok" : "FAIL");
            B->destroy(st);
        }
        free(host);
        dm_plan_free(&plan);
        dm_graph_free(&g);
    }
    g_forward_only = 0;
    if (!was) unsetenv("DMOVE_CUDA_EMULATE");
}

int main(void) {
    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(REF_DIR "/model_ops.safetensors", &f));
    if (f) {
        for (int fused = 0; fused < 2; fused++)
            for (int th = 1; th <= 3; th += 2) run_vs_torch(f, fused, th);
        cuda_forward(f);
        dm_st_free(f);
    }
    gradcheck64();
    scatter_checks();
    analysis_checks();
    adversarial_plans();
    TEST_END();
}
