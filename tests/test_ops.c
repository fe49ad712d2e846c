/* test_ops.c: the backend-parity suite of the operator table (src/graph/ops.def). It
 * loops over the table, so a kind added there is run here with nothing else to write, and
 * a backend that lacks its kernel fails:
 *  - the table itself: operand counts within the graph's limits, pointwise kinds that
 *    reduce nothing, the params column naming the einsum exactly for the contractions;
 *    and its keeps column against the gradient rules: autodiff of a one-op graph reads
 *    exactly the forward operands the table says it keeps (none for the kinds without a
 *    rule: the backward ones);
 *  - every kind on random inputs against its naive reference (src/cpu/ref.c: dm_ref_op;
 *    src/plan/gemm.c: dm_gemm_ref for the einsums), each row kind in every variant its params column
 *    names (activation gelu, gelu_tanh, relu; dropout p 0, 0.1, 0.5 on the same Philox
 *    seed and stream as the reference; the mask plain and causal; LayerNorm's backward
 *    fed statistics consistent with its input, softmax masked scores (whole rows too),
 *    its backward a softmax output, the attention mask 0/1), on 8 shapes (rows x columns: six fixed, odd ones and a column
 *    of one included, two random), the contractions on every einsum spec the encoder
 *    builder and autodiff make (pre-LN and post-LN, with and without the input gradient),
 *    on two random sizings of their letters;
 *  - on every backend the registry lists (src/layer/backends.c: the Makefile's BACKENDS),
 *    driven through its dm_backend table alone (plan/backend.h: create over a host arena,
 *    upload, run_group, sync, download, destroy), in every variant it accepts: the option
 *    sets of dm_layer_options (storage fp32, bf16, fp16 x row kernels default, interp, gen
 *    x streams default, 1) that its check_options takes, one run per distinct set its
 *    resolve_options makes of them; and in each environment listed for it below (the CUDA
 *    backend: emulated on the host, DMOVE_CUDA_EMULATE=1; emulated with the generated
 *    device kernels run lane by lane, DMOVE_CUDA_EMULATE=lanes, rows gen, on two small row
 *    shapes and the small einsum sizing; on the device itself, =0, "SKIP" said plainly where
 *    there is none); a backend with none listed runs once, in the environment as it is.
 *    So today: the CPU backend (fp32: rel.err < 1e-5) and the CUDA backend emulated in fp32
 *    (< 1e-5), bf16 and fp16 storage (< 1e-2, the reference fed the same rounded inputs and
 *    its outputs rounded as the storage type keeps them) with the interpreting row kernel,
 *    with the generated row kernels built for the host (every row program must be
 *    generated: the backend's notes row_programs and row_programs_generated), and with
 *    simulated lanes; row statistics (LayerNorm's mean and rstd) stay fp32; on a GPU also
 *    the device, auto, interpreted and generated, on one stream and two. A device this
 *    dmove was built without: "SKIP" with the registry's reason.
 * The whole model's kinds (EMBED, EMBED_BWD, XENT, XENT_BWD, LINEAR_XENT and its backward:
 * run_alone) run in suites of one kind each (the last two on sizes m x e x v of their own:
 * one row, a vocabulary below one chunk of the CPU kernel, a multiple of it, neither), their index operands valid ids with repeats, 0 and N - 1, tables larger
 * and smaller than the rows, and every 7th index one that selects nothing (-100, -1, N,
 * 2.5); a backend other than the CPU's may refuse such a suite at create with
 * DM_ERR_UNSUPPORTED naming the kind: counted as the kind's outcome there and said.
 * Outputs are poisoned with NaN first: every element must be written. Masked scores
 * (a reference beyond 1e30 in magnitude) must match exactly; the norm-wise relative error
 * is taken over the other elements. A kind counts as run on a variant (backend,
 * environment, resolved row kernels and streams) when at least one instance matched there;
 * at the end every kind must have run (or been refused, as above) on every variant run
 * (the count must equal DM_NUM_OPS x variants), and every backend built must have run in
 * some variant. */
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "graph/graph.h"
#include "layer/backends.h"
#include "plan/backend.h"
#include "plan/gemm.h"
#include "plan/plan.h"
#include "testutil.h"

/* An environment a backend runs in here: its own variables, by its name. A backend with
 * none listed runs once, in the environment as it is. */
typedef struct {
    const char *backend;     /* dm_backend.name */
    const char *label, *tag; /* in the report, and in the summary's columns */
    const char *var, *value; /* set while it runs (var NULL: nothing) */
    int slow;                /* only on the suites marked sim */
    dm_rows rows;            /* only the option sets resolved to these row kernels (DEFAULT: any) */
    int device;              /* on the device itself: DM_ERR_BACKEND at its first create means
                              * there is none here (SKIP, said once) */
} mode;
static const mode k_modes[] = {
    {"cuda", "emulated", "emu", "DMOVE_CUDA_EMULATE", "1", 0, DM_ROWS_DEFAULT, 0},
    {"cuda", "emulated, simulated lanes", "sim", "DMOVE_CUDA_EMULATE", "lanes", 1, DM_ROWS_GEN, 0},
    {"cuda", "device", "gpu", "DMOVE_CUDA_EMULATE", "0", 0, DM_ROWS_DEFAULT, 1},
};
enum { NMODES = sizeof k_modes / sizeof k_modes[0] };
static const mode k_plain = {"", "", NULL, NULL, NULL, 0, DM_ROWS_DEFAULT, 0};
static int g_mode_state[NMODES]; /* device modes: 0 not yet known, 1 present, -1 absent */

/* The option sets tried on every backend: their product, each as check_options takes it. */
static const dm_dtype k_dtypes[3] = {DM_DTYPE_FP32, DM_DTYPE_BF16, DM_DTYPE_FP16};
static const dm_rows k_rows[3] = {DM_ROWS_DEFAULT, DM_ROWS_INTERP, DM_ROWS_GEN};
static const int k_streams[2] = {0, 1};
static const char *const k_dtype[3] = {"fp32", "bf16", "fp16"};

/* A variant: a backend in an environment with its options resolved (the storage type
 * aside: a column of the summary each). */
enum { MAXV = 32 };
typedef struct {
    const dm_backend *B;
    const mode *m;
    dm_rows rows; /* as resolve_options made them */
    int streams;
    int tried;    /* a state was made, or its making failed (not a device found absent) */
    int done[3];  /* per storage type, the suite that last ran it */
    char label[96], tag[24];
} variant;
static variant g_var[MAXV];
static int g_nvar;

static int g_ran[DM_NUM_OPS][MAXV];         /* instances of the kind that matched there */
static double g_worst[DM_NUM_OPS][MAXV][3]; /* worst error per kind, variant and storage type */
static int g_seen[MAXV][3];                 /* (variant, storage type) pairs that ran */

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
    case DM_ARG_INDEXED: case DM_ARG_SCATTER: return "nc"; /* a table of N rows */
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
    if (dm_op_alone(k)) { /* their own operands (ops.def) */
        static const char *const ain[7] = {"bjhp", "bjhp", "bjhp", "b", "bhjk", "bjhp", "bjhp"}, /* packed sequences */
                                 *const aout[2][3] = {{"bjhp", "bhjk", ""}, {"bjhp", "bjhp", "bjhp"}},
                                 *const lin[6] = {"me", "ve", "v", "m", "m", "m"}, /* the fused decoder */
                                 *const lout[2][3] = {{"m", "m", "m"}, {"me", "ve", "v"}};
        const int attn = k == DM_OP_ATTN || k == DM_OP_ATTN_BWD;
        const int bwd = k == DM_OP_ATTN_BWD || k == DM_OP_LINEAR_XENT_BWD;
        const char *const *in = attn ? ain : lin, *const *out = attn ? aout[bwd] : lout[bwd];
        snprintf(op.spec, sizeof op.spec, "%s", attn ? "bjhp,bkhp->bhjk" : "me,ve->mv");
        if (attn) {
            op.rows = g->dim['b' - 'a'] * g->dim['h' - 'a'] * g->dim['j' - 'a'];
            op.cols = g->dim['j' - 'a'], op.nindex = g->dim['p' - 'a'];
        } else {
            op.rows = g->dim['m' - 'a'], op.cols = g->dim['v' - 'a'], op.nindex = g->dim['e' - 'a'];
        }
        for (int io = 0; io < 2; io++)
            for (int s = 0; s < (io ? op.nout : op.nin); s++) {
                char name[DM_NAME_LEN];
                snprintf(name, sizeof name, "%s_%s%d", op.name, io ? "out" : "in", s);
                const char *l = io ? out[s] : attn && s == 3 && op.keymask ? "bk" : in[s]; /* a mask (ops.def) */
                int t = dm_graph_tensor(g, name, l, io ? DM_ROLE_OUTPUT : in_role);
                if (t < 0) return -1;
                if (io) op.out[s] = t;
                else op.in[s] = t;
            }
        return dm_graph_op(g, &op);
    }
    if (spec) {
        snprintf(op.spec, sizeof op.spec, "%s", spec);
        if (sscanf(spec, "%15[a-z],%15[a-z]->%15[a-z]", let[0], let[1], let[2]) != 3) return -1;
    } else {
        op.rows = g->dim['g' - 'a'] * g->dim['r' - 'a'];
        op.cols = g->dim['c' - 'a'];
        if (dm_op_indexed(k)) op.nindex = g->dim['n' - 'a'];
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
    int alone;      /* a suite of one kind a backend may refuse (run_alone), or -1 */
} suite;

/* The whole model's kinds (gathers, scatters by index, cross-entropy) run in suites of
 * their own: a backend other than the CPU's may refuse one at create with
 * DM_ERR_UNSUPPORTED naming it (the CUDA backend has no kernels for them yet); the
 * refusal is counted and said, never a silent pass. */
static int run_alone(dm_op_kind k) {
    return dm_op_indexed(k) || k == DM_OP_XENT || k == DM_OP_XENT_BWD || dm_op_alone(k);
}
static int g_refused[DM_NUM_OPS][MAXV];

static float *at(const suite *S, float *arena, int t) {
    return arena + S->plan.offset[dm_tensor_root(&S->g, t)] / 4 + S->g.t[t].offset;
}

/* Indices into a table of n rows, one per row: row 0 takes 0, row 1 n - 1, the others
 * random (repeats: rows > n); with `bad`, every 7th row one that selects nothing (-100,
 * -1, n, 2.5: zeros, nothing added, an ignored label). */
static void fill_index(float *idx, int64_t rows, int64_t n, int bad) {
    static const float k_bad[4] = {-100.0f, -1.0f, 0.0f, 2.5f};
    for (int64_t r = 0; r < rows; r++) {
        idx[r] = r == 0 ? 0.0f : r == 1 ? (float)(n - 1) : (float)(next_u64() % (uint64_t)n);
        if (bad && r % 7 == 6) idx[r] = r / 7 % 4 == 2 ? (float)n : k_bad[r / 7 % 4];
    }
}

/* Inputs that make each kind's check meaningful; anything else random. */
static void condition_inputs(const suite *S, const dm_op *op, float *arena) {
    const dm_graph *g = &S->g;
    const int64_t R = op->rows, C = op->cols;
    float *x0 = at(S, arena, op->in[0]), *x1 = op->nin > 1 ? at(S, arena, op->in[1]) : NULL;
    switch (op->kind) {
    case DM_OP_EMBED:
    case DM_OP_EMBED_BWD:
        fill_index(x1, R, op->nindex, 1);
        break;
    case DM_OP_XENT: /* labels: columns, and ignored rows */
        fill_index(x1, R, C, 1);
        break;
    case DM_OP_XENT_BWD: { /* in: logits, their logsumexp, labels, dloss */
        float *lse = at(S, arena, op->in[1]);
        fill_index(at(S, arena, op->in[2]), R, C, 1);
        for (int64_t r = 0; r < R; r++) {
            double m = -INFINITY, sum = 0;
            for (int64_t c = 0; c < C; c++) m = fmax(m, x0[r * C + c]);
            for (int64_t c = 0; c < C; c++) sum += exp(x0[r * C + c] - m);
            lse[r] = (float)(m + log(sum));
        }
        break;
    }
    case DM_OP_LINEAR_XENT: /* labels: columns, and ignored rows */
        fill_index(at(S, arena, op->in[3]), R, C, 1);
        break;
    case DM_OP_LINEAR_XENT_BWD: { /* labels as above; lse: the forward's on these inputs */
        fill_index(at(S, arena, op->in[3]), R, C, 1);
        float *tmp = malloc(sizeof(float) * (size_t)(2 * R));
        if (!tmp) break;
        dm_op f = *op;
        f.kind = DM_OP_LINEAR_XENT;
        f.nin = 4;
        f.nout = 3;
        const float *fin[4] = {x0, x1, at(S, arena, op->in[2]), at(S, arena, op->in[3])};
        dm_ref_op(&f, 0, 1, fin, (float *const[]){tmp, at(S, arena, op->in[4]), tmp + R});
        free(tmp);
        break;
    }
    case DM_OP_ATTN:
    case DM_OP_ATTN_BWD: { /* lengths: whole, empty and between (at least one token); bwd: the
                            * forward's probabilities and context on these inputs */
        const int64_t J = C, B = g->t[op->in[3]].numel / (op->keymask ? J : 1);
        float *len = at(S, arena, op->in[3]);
        for (int64_t q = 0; q < B && !op->keymask; q++)
            len[q] = q == 0 ? (float)J : q % 4 == 1 ? 0.0f : (float)(next_u64() % (uint64_t)(J + 1));
        for (int64_t q = 0; q < B && op->keymask; q++) /* a mask: whole, none (every key masked), random */
            for (int64_t c = 0; c < J; c++) len[q * J + c] = q == 0 ? 1.0f : q % 4 == 1 ? 0.0f : (float)(next_u64() % 3 != 0);
        if (op->kind == DM_OP_ATTN) break;
        dm_op f = *op;
        f.kind = DM_OP_ATTN;
        f.nin = 4;
        f.nout = 2;
        const float *fin[4] = {x0, x1, at(S, arena, op->in[2]), len};
        dm_ref_op(&f, S->seed, B, fin, (float *const[]){at(S, arena, op->in[6]), at(S, arena, op->in[4])});
        break;
    }
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
        if (op->kind == DM_OP_ATTN || op->kind == DM_OP_ATTN_BWD) /* sequences */
            groups = g->t[op->in[3]].numel / (op->keymask ? op->cols : 1);
        for (int s = 0; s < op->nout; s++) op_out[s] = at(S, ref, op->out[s]);
        if (op->kind == DM_OP_CONTRACT)
            dm_gemm_ref(g, op, ip[0], ip[1], op_out[0]);
        else dm_ref_op(op, S->seed, groups, ip, op_out);
    }
}

static double tolerance(int dtype) { return dtype == 0 ? 1e-5 : 1e-2; }

/* Every op's outputs in `got` against `ref`; counts the kinds that match. count: whether
 * a match counts as the kind run on variant v (generated row kernels: only when every row
 * program was generated). */
static void compare(const suite *S, const float *got, const float *ref, int v, int dtype, int count) {
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
                if (isnan(r[e])) { /* the reference leaves it unwritten (NaN): so must the backend */
                    masked_bad += !isnan(a[e]);
                    continue;
                }
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
                        "not written, %lld masked wrong\n", S->label, g_var[v].label, k_dtype[dtype], op->name,
                        dm_act_name(op->act), op->p, op->causal, s, err, (long long)nan,
                        (long long)g->t[t].numel, (long long)masked_bad);
            }
            if (!(err <= worst)) {
                worst = err;
                worst_op = op->name;
            }
            if (!(err <= g_worst[op->kind][v][dtype])) g_worst[op->kind][v][dtype] = err;
        }
        nbad += !good;
        if (good && count) g_ran[op->kind][v]++;
    }
    g_seen[v][dtype] = 1;
    printf("  %-22s %-50s %s: %3d ops, worst rel.err %.2e (%s)%s\n", S->label, g_var[v].label, k_dtype[dtype],
           g->nop, worst, worst_op, nbad ? " FAIL" : "");
}

/* x as storage type dt keeps it (dm_dtype): rounded to the nearest, ties to even, a value
 * beyond the type's largest finite one first brought back to it. */
static float stored(dm_dtype dt, float x) {
    if (dt == DM_DTYPE_FP32 || !isfinite(x) || x == 0.0f) return x;
    const int mant = dt == DM_DTYPE_BF16 ? 7 : 10, emin = dt == DM_DTYPE_BF16 ? -126 : -14;
    const double big = dt == DM_DTYPE_BF16 ? 3.38953139e38 : 65504.0, v = fmin(fmax((double)x, -big), big);
    int e;
    (void)frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
    const double q = ldexp(1.0, (e - 1 < emin ? emin : e - 1) - mant); /* its unit in the last place */
    return (float)(nearbyint(v / q) * q);
}

static void store(dm_dtype dt, float *x, int64_t n) {
    for (int64_t e = 0; e < n; e++) x[e] = stored(dt, x[e]);
}

/* The number of note `key` of a backend's notes, or `otherwise`. */
static double note_value(const dm_layer_note *notes, int n, const char *key, double otherwise) {
    for (int k = 0; k < n; k++)
        if (!strcmp(notes[k].key, key) && !notes[k].text) return notes[k].value;
    return otherwise;
}

static int *mode_state(const mode *m) {
    return m >= k_modes && m < k_modes + NMODES ? &g_mode_state[m - k_modes] : NULL;
}

/* The variant of backend B in environment m with options resolved to rows and streams
 * (made on first use), or -1 if there are too many. */
static int variant_of(const dm_backend *B, const mode *m, dm_rows rows, int streams) {
    for (int v = 0; v < g_nvar; v++)
        if (g_var[v].B == B && g_var[v].m == m && g_var[v].rows == rows && g_var[v].streams == streams) return v;
    if (g_nvar == MAXV) return -1;
    variant *V = &g_var[g_nvar];
    *V = (variant){.B = B, .m = m, .rows = rows, .streams = streams};
    snprintf(V->label, sizeof V->label, "%s%s%s%s%s", B->name, m->label[0] ? " " : "", m->label,
             rows != DM_ROWS_DEFAULT ? ", rows " : "", rows != DM_ROWS_DEFAULT ? dm_rows_name(rows) : "");
    if (streams > 0)
        snprintf(V->label + strlen(V->label), sizeof V->label - strlen(V->label), ", %d stream%s", streams,
                 streams > 1 ? "s" : "");
    snprintf(V->tag, sizeof V->tag, "%s%s%s%s", m->tag ? m->tag : B->name, rows != DM_ROWS_DEFAULT ? "-" : "",
             rows != DM_ROWS_DEFAULT ? dm_rows_name(rows) : "", streams > 1 ? "/2" : "");
    return g_nvar++;
}

/* Runs the suite on variant v through its backend's table, with options opt (as a layer
 * passes them to create: unresolved). */
static void run_backend(const suite *S, int v, const dm_layer_options *opt) {
    variant *V = &g_var[v];
    const dm_backend *B = V->B;
    const dm_graph *g = &S->g;
    const size_t nf = S->nf ? S->nf : 1, bytes = (S->plan.arena_bytes + 127) / 64 * 64;
    float *in = malloc(sizeof(float) * nf), *ref = malloc(sizeof(float) * nf), *got = malloc(sizeof(float) * nf);
    float *host = aligned_alloc(64, bytes); /* the layer's host arena, as dm_layer_new makes it */
    dm_backend_state *st = NULL;
    if (!in || !ref || !got || !host) {
        CHECK(!"out of memory");
        goto done;
    }
    /* the reference computes from what the backend stores, and is stored as it would be */
    memcpy(in, S->init, sizeof(float) * S->nf);
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].role != DM_ROLE_OUTPUT && g->t[t].base < 0) store(opt->dtype, at(S, in, t), g->t[t].numel);
    memcpy(ref, in, sizeof(float) * S->nf);
    reference(S, in, ref);
    /* (but row statistics: fp32 whatever the storage type, dm_dtype) */
    for (int o = 0; o < g->nop; o++)
        for (int s = 0; s < g->op[o].nout; s++)
            if (dm_arg_out(g->op[o].kind, s) != DM_ARG_ROWSCALAR)
                store(opt->dtype, at(S, ref, g->op[o].out[s]), g->t[g->op[o].out[s]].numel);
    memset(host, 0, bytes);
    dm_status s = B->create(&st, &S->plan, (char *)host, NULL, opt, 0, NULL);
    int *known = mode_state(V->m);
    if (V->m->device && known && *known == 0) {
        *known = s == DM_ERR_BACKEND ? -1 : 1;
        if (*known < 0) {
            printf("SKIP: %s %s: none here (%s)\n", B->name, V->m->label, dm_last_error());
            goto done;
        }
    }
    V->tried = 1;
    if (s == DM_ERR_UNSUPPORTED && S->alone >= 0 && strcmp(B->name, "cpu")) {
        char named[64];
        snprintf(named, sizeof named, "'%s'", dm_op_kind_name((dm_op_kind)S->alone));
        const int says = strstr(dm_last_error(), named) != NULL;
        CHECK(says);
        if (says) g_refused[S->alone][v]++;
        printf("  %-22s %-50s %s: refused (%s)\n", S->label, V->label, k_dtype[opt->dtype], dm_last_error());
        goto done;
    }
    CHECK_OK(s);
    if (s != DM_OK) goto done;
    /* generated row kernels asked for: every row program generated, as the notes say */
    int all_gen = 1;
    if (V->rows == DM_ROWS_GEN) {
        const dm_layer_note *notes = NULL;
        const int nn = B->notes(st, &notes);
        const double progs = note_value(notes, nn, "row_programs", -1);
        const double gen = note_value(notes, nn, "row_programs_generated", -2);
        all_gen = progs >= 0 && gen == progs;
        CHECK(all_gen);
        if (!all_gen)
            fprintf(stderr, "  FAIL %s %s: %g of %g row programs generated (notes row_programs_generated, "
                    "row_programs)\n", S->label, V->label, gen, progs);
    }
    /* every tensor in: the inputs as stored, the outputs NaN */
    memcpy(host, in, sizeof(float) * S->nf);
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].base < 0 && S->plan.offset[t] >= 0) CHECK_OK(B->upload(st, t, at(S, host, t)));
    for (int gi = 0; gi < S->plan.ngroups; gi++) CHECK_OK(B->run_group(st, gi, S->seed, 0));
    CHECK_OK(B->sync(st));
    for (size_t e = 0; e < S->nf; e++) got[e] = NAN;
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].role == DM_ROLE_OUTPUT) CHECK_OK(B->download(st, t, at(S, got, t)));
    compare(S, got, ref, v, (int)opt->dtype, all_gen);
done:
    if (st) B->destroy(st);
    free(host);
    free(in);
    free(ref);
    free(got);
}

/* The suite on backend B in environment m: every option set of the product above that B
 * takes, once per distinct resolved set (and storage type). */
static void run_mode(const suite *S, const dm_backend *B, const mode *m, int serial) {
    const int *known = mode_state(m);
    if ((m->slow && !S->sim) || (known && *known < 0)) return;
    char was[256] = "";
    const char *w = m->var ? getenv(m->var) : NULL;
    if (w) snprintf(was, sizeof was, "%s", w);
    if (m->var) CHECK(setenv(m->var, m->value, 1) == 0);
    for (int d = 0; d < 3; d++)
        for (int r = 0; r < 3; r++)
            for (int k = 0; k < 2; k++) {
                dm_layer_options o = {.threads = 2, .device = B->device, .dtype = k_dtypes[d], .rows = k_rows[r],
                                      .streams = k_streams[k]};
                if (B->check_options(&o) != DM_OK) continue; /* not a set this backend takes */
                dm_layer_options res = o;
                const dm_status st = B->resolve_options(&res);
                CHECK_OK(st);
                if (st != DM_OK || (m->rows != DM_ROWS_DEFAULT && res.rows != m->rows)) continue;
                const int v = variant_of(B, m, res.rows, res.streams);
                CHECK(v >= 0);
                if (v < 0 || g_var[v].done[d] == serial) continue; /* the same as a set run before */
                g_var[v].done[d] = serial;
                run_backend(S, v, &o);
                if (known && *known < 0) goto out; /* no device */
            }
out:
    if (m->var) CHECK((w ? setenv(m->var, was, 1) : unsetenv(m->var)) == 0);
}

static void run_suite(suite *S) {
    static int serial;
    if (!suite_plan(S)) {
        CHECK(!"suite not planned");
        return;
    }
    serial++;
    const dm_backend *B;
    for (int b = 0; (B = dm_backend_at(b)); b++) {
        int listed = 0;
        for (int m = 0; m < NMODES; m++)
            if (!strcmp(k_modes[m].backend, B->name)) {
                run_mode(S, B, &k_modes[m], serial);
                listed = 1;
            }
        if (!listed) run_mode(S, B, &k_plain, serial);
    }
    suite_free(S);
}

/* Every row kind in every variant of its params column, over (g, r) x c = R x C: the
 * kinds not run alone (only < 0), or kind `only` alone. Tables have N rows: more than
 * the rows (odd R: rows never indexed) or about half (repeats). */
static void row_suite(int64_t R, int64_t C, int sim, int only) {
    suite S = {.seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(R * 131 + C), .sim = sim, .alone = only};
    snprintf(S.label, sizeof S.label, "rows %lld x %lld%s%s", (long long)R, (long long)C, only >= 0 ? " " : "",
             only >= 0 ? dm_op_kind_name((dm_op_kind)only) : "");
    dm_graph_init(&S.g);
    const int64_t G = R % 3 == 0 ? 3 : 1;
    S.g.dim['g' - 'a'] = G;
    S.g.dim['r' - 'a'] = R / G;
    S.g.dim['c' - 'a'] = C;
    S.g.dim['n' - 'a'] = R % 2 ? R + 3 : (R + 1) / 2;
    static const double ps[3] = {0.0, 0.1, 0.5};
    int stream = 1;
    for (int k = 0; k < DM_NUM_OPS; k++) {
        const dm_op_kind K = (dm_op_kind)k;
        if (dm_op_kind_class(K) == DM_CLASS_CONTRACTION || (only < 0 ? run_alone(K) : k != only)) continue;
        const unsigned pm = dm_op_params(K);
        const int na = pm & DM_OPP_ACT ? DM_ACT_TANH + 1 : 1, nd = pm & DM_OPP_DROPOUT ? 3 : 1, nc = pm & DM_OPP_CAUSAL ? 2 : 1;
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
        CHECK_OK(dm_build_encoder(&g, &cfg, 0, v < 2, 0, 0, &enc));
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
    suite S = {.seed = 7, .sim = sim, .alone = -1};
    snprintf(S.label, sizeof S.label, "einsums %d..%d", lo, hi);
    dm_graph_init(&S.g);
    for (int l = 0; l < 26; l++) S.g.dim[l] = lo + (int64_t)(next_u64() % (uint64_t)(hi - lo + 1));
    for (int k = 0; k < DM_NUM_OPS; k++) {
        if (dm_op_kind_class((dm_op_kind)k) != DM_CLASS_CONTRACTION || dm_op_alone((dm_op_kind)k)) continue;
        for (int q = 0; q < n; q++) {
            dm_op proto = {.alpha = es[q].alpha};
            CHECK(add_op(&S.g, (dm_op_kind)k, &proto, es[q].spec, DM_ROLE_INPUT) >= 0);
        }
    }
    run_suite(&S);
}

/* A kind with a kernel of its own over whole tensors (dm_op_alone: the fused decoder and
 * cross-entropy), alone, on m rows, e inner and v vocabulary columns. */
static void alone_suite(int k, int64_t m, int64_t e, int64_t v, int sim) {
    suite S = {.seed = 11, .sim = sim, .alone = k};
    snprintf(S.label, sizeof S.label, "m %lld e %lld v %lld %s", (long long)m, (long long)e, (long long)v,
             dm_op_kind_name((dm_op_kind)k));
    dm_graph_init(&S.g);
    S.g.dim['m' - 'a'] = m, S.g.dim['e' - 'a'] = e, S.g.dim['v' - 'a'] = v;
    dm_op proto = {.alpha = 1};
    CHECK(add_op(&S.g, (dm_op_kind)k, &proto, NULL, DM_ROLE_INPUT) >= 0);
    run_suite(&S);
}

/* Attention over packed sequences (ATTN and its backward): b sequences of lengths up to
 * j, h heads of p; plain and causal, dropout 0 and 0.1; and over whole sequences with an
 * attention mask (keymask), dropout 0 and 0.1. */
static void attn_suite(int k, int64_t b, int64_t j, int64_t h, int64_t p, int sim) {
    suite S = {.seed = 13, .sim = sim, .alone = k};
    snprintf(S.label, sizeof S.label, "b %lld j %lld h %lld p %lld %s", (long long)b, (long long)j, (long long)h,
             (long long)p, dm_op_kind_name((dm_op_kind)k));
    dm_graph_init(&S.g);
    S.g.dim['b' - 'a'] = b, S.g.dim['j' - 'a'] = S.g.dim['k' - 'a'] = j, S.g.dim['h' - 'a'] = h, S.g.dim['p' - 'a'] = p;
    int stream = 1;
    for (int c = 0; c < 2; c++)
        for (int d = 0; d < 2; d++) {
            dm_op proto = {.alpha = 0.35f, .causal = c, .p = d ? 0.1 : 0.0, .stream = stream++};
            CHECK(add_op(&S.g, (dm_op_kind)k, &proto, NULL, DM_ROLE_INPUT) >= 0);
        }
    for (int d = 0; d < 2; d++) {
        dm_op proto = {.alpha = 0.35f, .keymask = 1, .p = d ? 0.1 : 0.0, .stream = stream++};
        CHECK(add_op(&S.g, (dm_op_kind)k, &proto, NULL, DM_ROLE_INPUT) >= 0);
    }
    run_suite(&S);
}

static void summary(void) {
    int cols[MAXV * 3][2], nc = 0;
    for (int v = 0; v < g_nvar; v++)
        for (int d = 0; d < 3; d++)
            if (g_seen[v][d]) cols[nc][0] = v, cols[nc++][1] = d;
    printf("\nworst rel.err per kind (column: variant, storage type):\n%-15s", "");
    for (int c = 0; c < nc; c++) {
        char h[40];
        snprintf(h, sizeof h, "%s %s", g_var[cols[c][0]].tag, k_dtype[cols[c][1]]);
        printf(" %15s", h);
    }
    printf("\n");
    for (int k = 0; k < DM_NUM_OPS; k++) {
        printf("%-15s", dm_op_kind_name((dm_op_kind)k));
        for (int c = 0; c < nc; c++) printf(" %15.1e", g_worst[k][cols[c][0]][cols[c][1]]);
        printf("\n");
    }
    int variants = 0, pairs = 0, refused = 0;
    for (int v = 0; v < g_nvar; v++) {
        if (!g_var[v].tried) continue;
        variants++;
        for (int k = 0; k < DM_NUM_OPS; k++) {
            /* refused plainly (only a kind run alone, never on the CPU): every time it came */
            const int ref = g_refused[k][v] > 0 && !g_ran[k][v];
            pairs += g_ran[k][v] > 0 || ref;
            refused += ref;
            if (ref) printf("REFUSED: %s on %s (DM_ERR_UNSUPPORTED, naming it)\n", dm_op_kind_name((dm_op_kind)k),
                            g_var[v].label);
            if (!g_ran[k][v] && !ref)
                fprintf(stderr, "FAIL: %s never ran on %s\n", dm_op_kind_name((dm_op_kind)k), g_var[v].label);
        }
        printf("%-50s:", g_var[v].label);
        for (int k = 0; k < DM_NUM_OPS; k++) printf(" %d", g_ran[k][v]);
        printf(" instances per kind\n");
    }
    CHECK(pairs == DM_NUM_OPS * variants);
    printf("every kind on every backend variant: %d (kind, variant) pairs ran or were refused (%d) = %d kinds x %d "
           "variants %s\n", pairs, refused, DM_NUM_OPS, variants, pairs == DM_NUM_OPS * variants ? "ok" : "FAIL");
    /* and every backend built ran, in some variant */
    const dm_backend *B;
    int backends = 0, ran = 0;
    for (int b = 0; (B = dm_backend_at(b)); b++) {
        int n = 0;
        for (int v = 0; v < g_nvar; v++) n += g_var[v].B == B && g_var[v].tried;
        backends++;
        ran += n > 0;
        CHECK(n > 0);
        if (!n) fprintf(stderr, "FAIL: the backend %s ran in no variant (it took none of the option sets)\n", B->name);
    }
    printf("every backend built ran: %d of %d %s\n", ran, backends, ran == backends ? "ok" : "FAIL");
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
    const dm_backend *B;
    printf("backends built:");
    for (int b = 0; (B = dm_backend_at(b)); b++) printf(" %s", B->name);
    printf("\n");
    for (int d = 0; strcmp(dm_device_kind_name((dm_device_kind)d), "?"); d++)
        if (dm_backend_find((dm_device_kind)d, &B) != DM_OK)
            printf("SKIP: the %s backend: %s\n", dm_device_kind_name((dm_device_kind)d), dm_last_error());
    for (int s = 0; s < 8; s++) {
        row_suite(shapes[s][0], shapes[s][1], s == 1 || s == 2, -1);
        for (int k = 0; k < DM_NUM_OPS; k++)
            if (run_alone((dm_op_kind)k) && !dm_op_alone((dm_op_kind)k))
                row_suite(shapes[s][0], shapes[s][1], s == 1 || s == 2, k);
    }
    /* the fused decoder and cross-entropy: one row, v below one chunk of its CPU kernel, a
     * multiple of it, and neither */
    const int64_t xs[4][3] = {{1, 5, 7}, {6, 33, 2 * DM_XENT_CHUNK}, {13, 8, 1031}, {40, 17, 300}};
    for (int q = 0; q < 6; q++) {
        /* the last two again with the CUDA kernel's vocabulary in chunks of 32 columns (its
         * default, 4096, is more than these have): the carry across chunks, a short last one */
        if (q == 4) setenv("DMOVE_CUDA_XENT_CHUNK", "32", 1);
        for (int k = 0; k < DM_NUM_OPS; k++)
            if (dm_op_alone((dm_op_kind)k) && k != DM_OP_ATTN && k != DM_OP_ATTN_BWD)
                alone_suite(k, xs[q < 4 ? q : q - 2][0], xs[q < 4 ? q : q - 2][1], xs[q < 4 ? q : q - 2][2], q < 2);
    }
    unsetenv("DMOVE_CUDA_XENT_CHUNK");
    /* the attention over packed sequences: one of one token, odd sizes, BERT's head size;
     * CUDA's flash kernels off: their forward keeps each row's log-sum-exp where this
     * suite compares probabilities, and their backward reads it there (test_unpad runs
     * them, forward and backward together) */
    const int64_t as[3][4] = {{1, 1, 1, 8}, {5, 17, 3, 16}, {3, 40, 2, 64}};
    setenv("DMOVE_CUDA_FLASH", "0", 1);
    for (int q = 0; q < 3; q++) {
        attn_suite(DM_OP_ATTN, as[q][0], as[q][1], as[q][2], as[q][3], q < 2);
        attn_suite(DM_OP_ATTN_BWD, as[q][0], as[q][1], as[q][2], as[q][3], q < 2);
    }
    unsetenv("DMOVE_CUDA_FLASH");
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
