/* test_xent_fused.c: the fused decoder and cross-entropy (LINEAR_XENT and its backward,
 * ops.def) against the unfused head it replaces (CONTRACT "me,ve->mv", BIAS_ADD, XENT and
 * autodiff's backward of them), both planned (fused and unfused plans) and run by the CPU
 * backend's executor, and both against the double reference (cpu/ref.c):
 *  - on sizes (m, e, v) with v a multiple of the kernel's chunk and not, v below one
 *    chunk, m of one row, on 1, 2 and 3 threads: loss, lse, and the gradients of t, W
 *    and bias equal within float32 rounding (norm-wise relative error < 1e-5); rows with
 *    labels that select nothing (-100, -1, v, 2.5: loss 0, no gradient), a label at the
 *    last id, per-row loss weights;
 *  - the argmax ids: the unfused logits' argmax (ties to the lowest id, as torch.argmax),
 *    on logits with exact ties (W rows repeated, within a chunk and across chunks and
 *    threads' blocks, the bias zero there);
 *  - the arena: the fused head's plan smaller by at least the two m x v logit tensors;
 *  - the cost model: the fused op's flop the unfused ops' GEMMs plus the recompute
 *    (forward 2 m e v, backward 6 m e v) and its row work (3 and 5 per logit, at the
 *    vector peak in its group's split); no m x v bytes. */
#include <math.h>
#include <string.h>

#include "analysis/cost.h"
#include "cpu/exec.h"
#include "graph/graph.h"
#include "plan/plan.h"
#include "testutil.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float frand(void) { return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

typedef struct {
    dm_graph g;
    dm_plan plan;
    char *arena;
    int t, w, bias, labels, dloss, loss, lse, pred, logits; /* pred: fused; logits: unfused */
    int dt, dw, dbias;
} head;

static int tensor(dm_graph *g, const char *name, const char *l, dm_role role, int *ok) {
    int t = dm_graph_tensor(g, name, l, role);
    if (t < 0) *ok = 0;
    return t;
}

static int add(dm_graph *g, dm_op_kind k, const char *name, int64_t rows, int64_t cols, int64_t e, const int *in,
               const int *out, int *ok) {
    dm_op op = {.kind = k, .nin = dm_op_nin(k), .nout = dm_op_nout(k), .rows = rows, .cols = cols, .nindex = e,
                .alpha = 1};
    snprintf(op.name, sizeof op.name, "%s", name);
    if (dm_op_kind_class(k) == DM_CLASS_CONTRACTION) snprintf(op.spec, sizeof op.spec, "me,ve->mv");
    memcpy(op.in, in, sizeof(int) * (size_t)op.nin);
    memcpy(op.out, out, sizeof(int) * (size_t)op.nout);
    int o = dm_graph_op(g, &op);
    if (o < 0) *ok = 0;
    return o;
}

static int grad_of(const dm_graph *g, int p) {
    char name[DM_NAME_LEN];
    snprintf(name, sizeof name, "d_%s", g->t[p].name);
    for (int t = 0; t < g->nt; t++)
        if (!strcmp(g->t[t].name, name)) return t;
    return -1;
}

/* The head on t (m,e) -> loss, fused or not, its backward, planned (fused plan or not). */
static int head_build(head *h, int fused, int fused_plan, int64_t m, int64_t e, int64_t v) {
    memset(h, 0, sizeof *h);
    dm_graph *g = &h->g;
    dm_graph_init(g);
    g->dim['m' - 'a'] = m, g->dim['e' - 'a'] = e, g->dim['v' - 'a'] = v;
    int ok = 1;
    h->t = tensor(g, "t", "me", DM_ROLE_INPUT, &ok);
    h->w = tensor(g, "W", "ve", DM_ROLE_PARAM, &ok);
    h->bias = tensor(g, "bias", "v", DM_ROLE_PARAM, &ok);
    h->labels = tensor(g, "labels", "m", DM_ROLE_INPUT, &ok);
    h->loss = tensor(g, "loss", "m", DM_ROLE_OUTPUT, &ok);
    h->lse = tensor(g, "lse", "m", DM_ROLE_OUTPUT, &ok);
    h->pred = h->logits = -1;
    if (fused) {
        h->pred = tensor(g, "pred", "m", DM_ROLE_OUTPUT, &ok);
        if (ok) add(g, DM_OP_LINEAR_XENT, "dec_xent", m, v, e, (int[]){h->t, h->w, h->bias, h->labels},
                    (int[]){h->loss, h->lse, h->pred}, &ok);
    } else {
        const int mm = tensor(g, "logits_mm", "mv", DM_ROLE_ACT, &ok);
        h->logits = tensor(g, "logits", "mv", DM_ROLE_OUTPUT, &ok);
        if (ok) add(g, DM_OP_CONTRACT, "dec", m, v, 0, (int[]){h->t, h->w}, (int[]){mm}, &ok);
        if (ok) add(g, DM_OP_BIAS_ADD, "dec_bias", m, v, 0, (int[]){mm, h->bias}, (int[]){h->logits}, &ok);
        if (ok) add(g, DM_OP_XENT, "xent", m, v, 0, (int[]){h->logits, h->labels}, (int[]){h->loss, h->lse}, &ok);
    }
    h->dloss = tensor(g, "dloss", "m", DM_ROLE_INPUT, &ok);
    if (!ok) return 0;
    int dx = -1;
    CHECK_OK(dm_autodiff(g, h->loss, h->dloss, h->t, &dx));
    h->dt = dx;
    if (dx < 0) return 0;
    g->t[dx].role = DM_ROLE_OUTPUT;
    h->dw = grad_of(g, h->w);
    h->dbias = grad_of(g, h->bias);
    CHECK(h->dw >= 0 && h->dbias >= 0);
    if (h->dw < 0 || h->dbias < 0) return 0;
    dm_status s = dm_plan_build(g, fused_plan, 0, 0, &h->plan);
    CHECK_OK(s);
    if (s != DM_OK) return 0;
    h->arena = aligned_alloc(64, (h->plan.arena_bytes + 64) / 64 * 64);
    return h->arena != NULL;
}

static void head_free(head *h) {
    free(h->arena);
    dm_plan_free(&h->plan);
    dm_graph_free(&h->g);
}

static float *P(head *h, int t) { return dm_cpu_tensor_ptr(&h->plan, h->arena, t); }

static int head_run(head *h, const float *t, const float *w, const float *bias, const float *labels,
                    const float *dloss, int threads) {
    const int64_t m = h->g.t[h->t].numel, n = h->g.t[h->w].numel, v = h->g.t[h->bias].numel;
    memcpy(P(h, h->t), t, sizeof(float) * (size_t)m);
    memcpy(P(h, h->w), w, sizeof(float) * (size_t)n);
    memcpy(P(h, h->bias), bias, sizeof(float) * (size_t)v);
    memcpy(P(h, h->labels), labels, sizeof(float) * (size_t)h->g.t[h->labels].numel);
    memcpy(P(h, h->dloss), dloss, sizeof(float) * (size_t)h->g.t[h->dloss].numel);
    dm_cpu_exec ex;
    dm_status s = dm_cpu_exec_init(&ex, &h->plan, h->arena, threads);
    CHECK_OK(s);
    if (s != DM_OK) return 0;
    for (int gi = 0; gi < h->plan.ngroups && s == DM_OK; gi++) {
        s = dm_cpu_exec_group(&ex, gi, 1, 0);
        CHECK_OK(s);
    }
    dm_cpu_exec_free(&ex);
    return s == DM_OK;
}

static double rel_err64(const float *a, const float *b, int64_t n) {
    double d = 0, n2 = 0;
    for (int64_t k = 0; k < n; k++) {
        d += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
        n2 += (double)b[k] * b[k];
    }
    return n2 > 0 ? sqrt(d / n2) : sqrt(d);
}

/* The double reference of LINEAR_XENT and its backward on the same inputs. */
static void reference(int64_t m, int64_t e, int64_t v, const float *t, const float *w, const float *bias,
                      const float *labels, const float *dloss, float *loss, float *lse, float *pred, float *dt,
                      float *dw, float *db) {
    dm_op f = {.kind = DM_OP_LINEAR_XENT, .nin = 4, .nout = 3, .rows = m, .cols = v, .nindex = e};
    dm_ref_op(&f, 0, 1, (const float *const[]){t, w, bias, labels}, (float *const[]){loss, lse, pred});
    dm_op b = f;
    b.kind = DM_OP_LINEAR_XENT_BWD;
    b.nin = 6;
    dm_ref_op(&b, 0, 1, (const float *const[]){t, w, bias, labels, lse, dloss}, (float *const[]){dt, dw, db});
}

/* The unfused logits' argmax, ties to the lowest id. */
static int64_t argmax_row(const float *x, int64_t v) {
    int64_t best = 0;
    for (int64_t c = 1; c < v; c++)
        if (x[c] > x[best]) best = c;
    return best;
}

static int g_bad;

/* One size: inputs with ignored rows, the last id as a label, tied rows of W; fused and
 * unfused heads, fused and unfused plans, 1 to 3 threads. */
static void one_size(int64_t m, int64_t e, int64_t v, int ties) {
    float *t = malloc(sizeof(float) * (size_t)(m * e)), *w = malloc(sizeof(float) * (size_t)(v * e));
    float *bias = malloc(sizeof(float) * (size_t)v), *lab = malloc(sizeof(float) * (size_t)m),
          *dl = malloc(sizeof(float) * (size_t)m);
    const int64_t outs = 3 * m + m * e + v * e + v;
    float *ref = malloc(sizeof(float) * (size_t)outs);
    if (!t || !w || !bias || !lab || !dl || !ref) {
        CHECK(0);
        goto done;
    }
    for (int64_t k = 0; k < m * e; k++) t[k] = frand();
    for (int64_t k = 0; k < v * e; k++) w[k] = frand();
    for (int64_t c = 0; c < v; c++) bias[c] = 0.5f * frand();
    static const float k_bad[4] = {-100.0f, -1.0f, 0.0f, 2.5f};
    for (int64_t r = 0; r < m; r++) {
        lab[r] = r == 0 ? (float)(v - 1) : (float)(next_u64() % (uint64_t)v);
        if (r % 5 == 4) lab[r] = r / 5 % 4 == 2 ? (float)v : k_bad[r / 5 % 4];
        dl[r] = 0.25f + (float)(next_u64() % 4) * 0.25f;
    }
    if (ties) { /* exact ties: W rows repeated (bias 0 there) and t in eighths (exact sums in
                 * any order); the pair (3, v - 1), in different chunks and threads' blocks,
                 * wins each row: 1.5 sum(t) against at most sum(t) + 0.5 */
        const int64_t pairs[3][2] = {{1, 2}, {v / 2, v / 2 + 1}, {3, v - 1}};
        for (int q = 0; q < 3; q++) {
            const int64_t a = pairs[q][0], b = pairs[q][1];
            for (int64_t k = 0; k < e; k++) w[b * e + k] = w[a * e + k] = (float)(q + 1) * 0.5f;
            bias[a] = bias[b] = 0.0f;
        }
        for (int64_t r = 0; r < m; r++)
            for (int64_t k = 0; k < e; k++) t[r * e + k] = (float)(8 + next_u64() % 24) / 8.0f;
    }
    float *rl = ref, *rlse = rl + m, *rpred = rlse + m, *rdt = rpred + m, *rdw = rdt + m * e, *rdb = rdw + v * e;
    reference(m, e, v, t, w, bias, lab, dl, rl, rlse, rpred, rdt, rdw, rdb);
    double worst = 0;
    int64_t argmax_bad = 0, ties_seen = 0;
    for (int fused = 0; fused < 2; fused++)
        for (int fplan = 0; fplan < 2; fplan++)
            for (int threads = 1; threads <= 3; threads++) {
                head h;
                if (!head_build(&h, fused, fplan, m, e, v) || !head_run(&h, t, w, bias, lab, dl, threads)) {
                    CHECK(0);
                    head_free(&h);
                    continue;
                }
                const double err[5] = {rel_err64(P(&h, h.loss), rl, m), rel_err64(P(&h, h.lse), rlse, m),
                                       rel_err64(P(&h, h.dt), rdt, m * e), rel_err64(P(&h, h.dw), rdw, v * e),
                                       rel_err64(P(&h, h.dbias), rdb, v)};
                int good = 1;
                for (int q = 0; q < 5; q++) {
                    good &= err[q] < 1e-5;
                    worst = worst_of(worst, err[q]);
                }
                /* ignored rows: loss exactly 0 */
                for (int64_t r = 0; r < m; r++)
                    if (dm_index_row(lab[r], v) < 0) good &= P(&h, h.loss)[r] == 0.0f;
                /* the argmax: the fused head's ids against the reference's and the unfused
                 * logits' (ties to the lowest id) */
                for (int64_t r = 0; r < m; r++) {
                    const float want = rpred[r];
                    const float got = fused ? P(&h, h.pred)[r] : (float)argmax_row(P(&h, h.logits) + r * v, v);
                    argmax_bad += got != want;
                }
                CHECK(good);
                if (!good) {
                    g_bad++;
                    fprintf(stderr, "  FAIL m %lld e %lld v %lld %s head, %s plan, %d threads: rel.err loss %.2e lse "
                            "%.2e dt %.2e dW %.2e dbias %.2e\n", (long long)m, (long long)e, (long long)v,
                            fused ? "fused" : "unfused", fplan ? "fused" : "unfused", threads, err[0], err[1],
                            err[2], err[3], err[4]);
                }
                head_free(&h);
            }
    if (ties) /* the reference chose the lowest of the tied ids where a tie was the max */
        for (int64_t r = 0; r < m; r++) ties_seen += rpred[r] == 3.0f;
    CHECK(argmax_bad == 0);
    CHECK(!ties || ties_seen == m);
    printf("  m %4lld e %3lld v %5lld%s: fused and unfused heads and plans, 1-3 threads, against the double "
           "reference: worst rel.err %.2e, argmax wrong %lld%s\n", (long long)m, (long long)e, (long long)v,
           ties ? " (ties)" : "", worst, (long long)argmax_bad, worst < 1e-5 && !argmax_bad ? "" : " FAIL");
    if (ties) printf("    rows whose max is a tie, won by its lowest id: %lld of %lld\n", (long long)ties_seen,
                     (long long)m);
done:
    free(t);
    free(w);
    free(bias);
    free(lab);
    free(dl);
    free(ref);
}

/* The arena: the fused head's plan holds no m x v tensor. */
static void memory_check(void) {
    const int64_t m = 40, e = 16, v = 1000;
    for (int fplan = 0; fplan < 2; fplan++) {
        head a, b;
        if (!head_build(&a, 0, fplan, m, e, v) || !head_build(&b, 1, fplan, m, e, v)) {
            CHECK(0);
            head_free(&a);
            head_free(&b);
            continue;
        }
        const double saved = (double)a.plan.arena_bytes - (double)b.plan.arena_bytes;
        int mv = 0;
        for (int q = 0; q < b.g.nt; q++)
            mv += b.plan.offset[q] >= 0 && b.g.t[q].base < 0 && b.g.t[q].numel == m * v;
        /* two m x v tensors fewer, less the fused head's argmax ids (m floats, aligned) */
        const int good = mv == 0 && saved >= 2.0 * m * v * 4 - 256;
        CHECK(good);
        printf("  arena (%s plan, m %lld v %lld): unfused %zu bytes, fused %zu: %.0f fewer (2 x m x v floats: "
               "%lld)%s\n", fplan ? "fused" : "unfused", (long long)m, (long long)v, a.plan.arena_bytes,
               b.plan.arena_bytes, saved, (long long)(2 * m * v * 4), good ? "" : " FAIL");
        /* the cost model: the fused op's flop as counted */
        double fa = 0, fb = 0, ra = 0, rb = 0;
        for (int o = 0; o < a.g.nop; o++) {
            fa += dm_op_flop(&a.g, &a.g.op[o]);
            ra += dm_op_bytes(&a.g, &a.g.op[o]);
        }
        for (int o = 0; o < b.g.nop; o++) {
            fb += dm_op_flop(&b.g, &b.g.op[o]);
            rb += dm_op_bytes(&b.g, &b.g.op[o]);
        }
        /* unfused: 3 GEMMs (6 m e v), the bias add (1 per logit), XENT (3), XENT_BWD (4), the
         * bias gradient's column sum (1); fused: 4 GEMMs, XENT's 3, XENT_BWD's 4 and the
         * column sum's 1 (the bias add inside the GEMM's row work): one GEMM more, one
         * m x v less. Bytes: the unfused ops move the logits 9 times (m x v floats each), the
         * fused ones read the bias and labels once more */
        const double gemm = 2.0 * m * e * v, mv4 = 4.0 * m * v;
        CHECK(fabs(fb - fa - (gemm - (double)m * v)) <= 1e-9 * fb);
        CHECK(rb + 8 * mv4 <= ra);
        /* the groups' split: the GEMMs at the contraction peak, the row work at the vector one */
        int groups_ok = 1;
        for (int G = 0; G < b.plan.ngroups; G++) {
            const dm_op *op = &b.g.op[b.plan.order[b.plan.groups[G].first]];
            double fc = 0, fo = 0;
            dm_cost_group_flop(&b.plan, G, &fc, &fo);
            if (op->kind == DM_OP_LINEAR_XENT) groups_ok &= fc == gemm && fo == 3.0 * m * v;
            if (op->kind == DM_OP_LINEAR_XENT_BWD) groups_ok &= fc == 3 * gemm && fo == 5.0 * m * v;
        }
        CHECK(groups_ok);
        if (fplan) printf("  cost model: flop unfused head %.4g, fused %.4g (a GEMM more less the bias add: %.4g); "
                          "bytes unfused %.4g, fused %.4g (at least 8 x %.4g fewer)\n", fa, fb,
                          gemm - (double)m * v, ra, rb, mv4);
        head_free(&a);
        head_free(&b);
    }
}

int main(void) {
    /* v: a multiple of the chunk, not, below one chunk; m: one row, odd, larger */
    const int64_t sizes[][3] = {{1, 8, 300},  {7, 16, 256},  {13, 24, 1000}, {33, 8, 517},
                                {5, 40, 100}, {29, 12, 2 * DM_XENT_CHUNK + 3}};
    for (size_t q = 0; q < sizeof sizes / sizeof sizes[0]; q++) one_size(sizes[q][0], sizes[q][1], sizes[q][2], 0);
    one_size(12, 8, 3 * DM_XENT_CHUNK + 7, 1);
    one_size(9, 8, 50, 1);
    one_size(6, 20, 5 * DM_XENT_CHUNK, 1);
    for (int q = 0; q < 2; q++) /* random sizes */
        one_size(1 + (int64_t)(next_u64() % 40), 1 + (int64_t)(next_u64() % 48), 8 + (int64_t)(next_u64() % 1500),
                 q);
    memory_check();
    TEST_END();
}
