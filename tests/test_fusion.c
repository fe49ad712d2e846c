/* test_fusion.c: the fusion pass and the fused schedule.
 *  1. The fused plan groups at least what the paper's fused kernels fuse (names below).
 *  2. Every group of the fused plan, run alone on the unfused schedule's inputs, gives
 *     the unfused schedule's outputs (dropout on: the same Philox masks).
 *  3. The whole step, fused vs unfused, agrees to fp32 rounding for every activation, and
 *     two runs with the same seed are bit-identical while another seed changes the masks.
 * The fused schedule runs the graph after dm_rewrite_fused (ACT -> ACT_DERIV, ACT_BWD ->
 * MUL, the attention's DROPOUT_BWD -> DROPOUT_BWD_NZ): op and tensor ids are those of the
 * unfused graph, plus the saved derivative. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dmove.h"
#include "core/status.h"
#include "cpu/backend.h"
#include "cpu/exec.h"
#include "graph/encoder.h"
#include "graph/graph.h"
#include "graph/rewrite.h"
#include "layer/layer_internal.h"
#include "plan/plan.h"
#include "layerutil.h"
#include "testutil.h"

static int group_of(const dm_layer *L, const char *op_name) {
    for (int G = 0; G < L->plan.ngroups; G++)
        for (int k = 0; k < L->plan.groups[G].nops; k++)
            if (!strcmp(L->g.op[L->plan.order[L->plan.groups[G].first + k]].name, op_name))
                return G;
    return -1;
}

static void expect_fused(const dm_layer *L, const char *kernel, const char *const *ops, int n) {
    int G = group_of(L, ops[0]), ok = G >= 0;
    for (int k = 1; k < n; k++) ok &= group_of(L, ops[k]) == G;
    CHECK(ok);
    printf("  %-6s %s\n", kernel, ok ? "fused" : "NOT FUSED");
}

/* Layers *A (options oa) and *B (ob) of cfg make a training step on the same inputs: the
 * worst relative error over the output and every gradient (INFINITY if one could not be
 * made). The caller frees both. */
static double steps_compared(const dm_layer_config *cfg, const dm_layer_options *oa, const dm_layer_options *ob,
                             dm_layer **A, dm_layer **B) {
    *A = *B = NULL;
    CHECK_OK(dm_layer_new(A, cfg, oa));
    CHECK_OK(dm_layer_new(B, cfg, ob));
    if (!*A || !*B) return INFINITY;
    fill_inputs(*A, 7);
    fill_inputs(*B, 7);
    CHECK_OK(dm_layer_forward(*A));
    CHECK_OK(dm_layer_backward(*A));
    CHECK_OK(dm_layer_forward(*B));
    CHECK_OK(dm_layer_backward(*B));
    return compare_all(*A, *B, 0);
}

/* The training step with activation a, fused vs unfused: the worst relative error over
 * the output and every gradient. */
static double step_vs_unfused(const dm_layer_config *base, dm_act a) {
    dm_layer_config cfg = *base;
    cfg.act = a;
    dm_layer_options fo = {.schedule = DM_SCHED_FUSED}, uo = {.schedule = DM_SCHED_UNFUSED};
    dm_layer *F, *U;
    double w = steps_compared(&cfg, &fo, &uo, &F, &U);
    dm_layer_free(F);
    dm_layer_free(U);
    return w;
}

/* The third pass on a small synthetic graph (batch letter b): a lone batched contraction
 * o = P.V shares V with the batched contraction q = T2.V; op by op they are independent,
 * but with `cycle` a row group X both feeds q (T2 = U + U) and reads o's output (T3 =
 * T2 + C2; a column sum keeps X out of batched groups), so merging o into q's group would
 * make a cycle between groups: the pass must refuse it and the plan still build. Without
 * `cycle` (T3 = T2 + T2) o joins q's group. Returns 1 if o ends up beside q. */
static int sibling_merged(int cycle) {
    dm_graph g;
    dm_graph_init(&g);
    g.dim['b' - 'a'] = 2, g.dim['j' - 'a'] = 4, g.dim['k' - 'a'] = 4, g.dim['p' - 'a'] = 4;
    int U = dm_graph_tensor(&g, "U", "bjk", DM_ROLE_INPUT), V = dm_graph_tensor(&g, "V", "bkp", DM_ROLE_INPUT),
        P = dm_graph_tensor(&g, "P", "bjk", DM_ROLE_INPUT), T2 = dm_graph_tensor(&g, "T2", "bjk", DM_ROLE_ACT),
        C1 = dm_graph_tensor(&g, "C1", "bjp", DM_ROLE_OUTPUT), C2 = dm_graph_tensor(&g, "C2", "bjp", DM_ROLE_OUTPUT),
        T3 = dm_graph_tensor(&g, "T3", "bjk", DM_ROLE_OUTPUT), S = dm_graph_tensor(&g, "S", "k", DM_ROLE_OUTPUT);
    CHECK(U >= 0 && V >= 0 && P >= 0 && T2 >= 0 && C1 >= 0 && C2 >= 0 && T3 >= 0 && S >= 0);
    dm_op x2 = {.kind = DM_OP_ADD, .name = "x2", .nin = 2, .nout = 1, .in = {U, U}, .out = {T2}, .rows = 8, .cols = 4};
    dm_op q = {.kind = DM_OP_CONTRACT, .name = "q", .nin = 2, .nout = 1, .in = {T2, V}, .out = {C1}, .alpha = 1,
               .spec = "bjk,bkp->bjp"};
    dm_op o = {.kind = DM_OP_CONTRACT, .name = "o", .nin = 2, .nout = 1, .in = {P, V}, .out = {C2}, .alpha = 1,
               .spec = "bjk,bkp->bjp"};
    dm_op x1 = {.kind = DM_OP_ADD, .name = "x1", .nin = 2, .nout = 1, .in = {T2, cycle ? C2 : T2}, .out = {T3},
                .rows = 8, .cols = 4};
    dm_op x3 = {.kind = DM_OP_COLSUM, .name = "x3", .nin = 1, .nout = 1, .in = {T3}, .out = {S}, .rows = 8, .cols = 4};
    const dm_op *ops[5] = {&x2, &q, &o, &x1, &x3};
    for (int k = 0; k < 5; k++) CHECK(dm_graph_op(&g, ops[k]) >= 0);
    dm_plan plan;
    CHECK_OK(dm_plan_build(&g, 1, 1, 0, &plan));
    int gq = -1, go = -1;
    for (int G = 0; G < plan.ngroups; G++)
        for (int k = 0; k < plan.groups[G].nops; k++) {
            int op = plan.order[plan.groups[G].first + k];
            if (op == 1) gq = G;
            if (op == 2) go = G;
        }
    CHECK(gq >= 0 && go >= 0);
    dm_plan_free(&plan);
    dm_graph_free(&g);
    return gq >= 0 && gq == go;
}

/* Y of a graph where a batched group holds two row groups one after the other: T = C1 +
 * C1 (8 rows of 1 column) and Y = S masked by T (8 rows of 4, T read GROUPED: row r reads
 * T's row r / 4), after the GEMMs C1 = A W and S = A V over b. Run by the CPU executor,
 * fused (one batched group) or not, into y (32 floats); 0 on success. The executor must
 * not run such ops row by row together: row r of Y reads a row of T not yet written. */
static int grouped_chain(int fused, float *y) {
    dm_graph g;
    dm_graph_init(&g);
    g.dim['b' - 'a'] = 2, g.dim['j' - 'a'] = 4, g.dim['k' - 'a'] = 3, g.dim['p' - 'a'] = 4, g.dim['q' - 'a'] = 1;
    int A = dm_graph_tensor(&g, "A", "bjk", DM_ROLE_INPUT), W = dm_graph_tensor(&g, "W", "bkq", DM_ROLE_INPUT),
        V = dm_graph_tensor(&g, "V", "bkp", DM_ROLE_INPUT), C1 = dm_graph_tensor(&g, "C1", "bjq", DM_ROLE_ACT),
        S = dm_graph_tensor(&g, "S", "bjp", DM_ROLE_ACT), T = dm_graph_tensor(&g, "T", "bjq", DM_ROLE_OUTPUT),
        Y = dm_graph_tensor(&g, "Y", "bjp", DM_ROLE_OUTPUT);
    dm_op c1 = {.kind = DM_OP_CONTRACT, .name = "c1", .nin = 2, .nout = 1, .in = {A, W}, .out = {C1}, .alpha = 1,
                .spec = "bjk,bkq->bjq"};
    dm_op c2 = {.kind = DM_OP_CONTRACT, .name = "c2", .nin = 2, .nout = 1, .in = {A, V}, .out = {S}, .alpha = 1,
                .spec = "bjk,bkp->bjp"};
    dm_op x1 = {.kind = DM_OP_ADD, .name = "x1", .nin = 2, .nout = 1, .in = {C1, C1}, .out = {T}, .rows = 8, .cols = 1};
    dm_op x2 = {.kind = DM_OP_MASK_ADD, .name = "x2", .nin = 2, .nout = 1, .in = {S, T}, .out = {Y}, .rows = 8,
                .cols = 4};
    const dm_op *ops[4] = {&c1, &c2, &x1, &x2};
    int rc = 1;
    for (int k = 0; k < 4; k++) CHECK(dm_graph_op(&g, ops[k]) >= 0);
    dm_plan plan;
    dm_cpu_exec ex;
    char *arena = NULL;
    if (dm_plan_build(&g, fused, 0, 1, &plan) != DM_OK) goto out_graph;
    if (fused) CHECK(plan.ngroups == 1 && plan.groups[0].nbatch == 2 && plan.groups[0].nops == 4);
    arena = aligned_alloc(64, (plan.arena_bytes + 127) / 64 * 64);
    if (!arena) goto out_plan;
    for (size_t e = 0; e < plan.arena_bytes / 4; e++) ((float *)arena)[e] = NAN;
    const int ins[3] = {A, W, V};
    for (int q = 0; q < 3; q++) {
        float *p = dm_cpu_tensor_ptr(&plan, arena, ins[q]);
        for (int64_t e = 0; e < g.t[ins[q]].numel; e++) p[e] = (float)((e * 7 + q * 3) % 5) * 0.25f;
    }
    if (dm_cpu_exec_init(&ex, &plan, arena, 2) != DM_OK) goto out_arena;
    rc = 0;
    for (int gi = 0; gi < plan.ngroups; gi++) rc |= dm_cpu_exec_group(&ex, gi, 1, 0) != DM_OK;
    memcpy(y, dm_cpu_tensor_ptr(&plan, arena, Y), sizeof(float) * 32);
    dm_cpu_exec_free(&ex);
out_arena:
    free(arena);
out_plan:
    dm_plan_free(&plan);
out_graph:
    dm_graph_free(&g);
    return rc;
}

/* An op whose operand counts disagree with its ops.def row (or whose kind has none) is
 * refused as an internal error naming it, and the builders that append ops return that
 * status and message, not "out of memory". */
static void test_graph_op_status(void) {
    printf("0. an operator that ops.def refuses: DM_ERR_INTERNAL, named:\n");
    dm_graph g;
    dm_graph_init(&g);
    g.dim['b' - 'a'] = 2, g.dim['i' - 'a'] = 4, g.dim['u' - 'a'] = 3;
    const int x = dm_graph_tensor(&g, "x", "bi", DM_ROLE_INPUT), w = dm_graph_tensor(&g, "w", "ui", DM_ROLE_PARAM);
    const int y = dm_graph_tensor(&g, "y", "bu", DM_ROLE_ACT), dy = dm_graph_tensor(&g, "dy", "bu", DM_ROLE_INPUT);
    CHECK(x >= 0 && w >= 0 && y >= 0 && dy >= 0);
    dm_op add = {.kind = DM_OP_ADD, .nin = 1, .nout = 1, .in = {x}, .out = {y}, .rows = 2, .cols = 3};
    snprintf(add.name, sizeof add.name, "lonely_add");
    dm_clear_error();
    CHECK(dm_graph_op(&g, &add) == -1 && g.nop == 0 && dm_last_status() == DM_ERR_INTERNAL &&
          strstr(dm_last_error(), "op lonely_add: a ") && strstr(dm_last_error(), "(ops.def), not 1 and 1"));
    dm_op bad = add;
    bad.kind = DM_NUM_OPS;
    CHECK(dm_graph_op(&g, &bad) == -1 && dm_last_status() == DM_ERR_INTERNAL &&
          strstr(dm_last_error(), "is not a row of ops.def"));
    /* a failure always has a status, even with none recorded */
    dm_clear_error();
    CHECK(dm_last_status() == DM_ERR_INTERNAL);
    /* autodiff returns what its graph calls recorded: here the weight's gradient cannot be
     * made (its dimension u lost its size), an internal error, not out of memory */
    dm_op mm = {.kind = DM_OP_CONTRACT, .nin = 2, .nout = 1, .in = {x, w}, .out = {y}, .alpha = 1.0f};
    snprintf(mm.name, sizeof mm.name, "proj");
    snprintf(mm.spec, sizeof mm.spec, "bi,ui->bu");
    CHECK(dm_graph_op(&g, &mm) == 0);
    g.dim['u' - 'a'] = 0;
    int dx = 0;
    CHECK(dm_autodiff(&g, y, dy, -1, &dx) == DM_ERR_INTERNAL && strstr(dm_last_error(), "d_w: dimension u has no size"));
    dm_graph_free(&g);
    /* the attention-recompute rewrite copies the forward's ops: a softmax given two inputs
     * fails there as what it is (it said "out of memory rewriting attention") */
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 4, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 16;
    dm_encoder enc;
    dm_graph_init(&g);
    CHECK_OK(dm_build_encoder(&g, &cfg, 0, 1, 0, 0, &enc));
    int sm = -1;
    for (int o = 0; o < g.nop; o++)
        if (!strcmp(g.op[o].name, "attn_softmax")) sm = o;
    CHECK(sm >= 0);
    if (sm >= 0) {
        g.op[sm].nin = 2;
        g.op[sm].in[1] = g.op[sm].in[0];
        int n = 0;
        const dm_status st = dm_rewrite_recompute_attention(&g, &n);
        printf("   %s: %s\n", dm_status_name(st), dm_last_error());
        CHECK(st == DM_ERR_INTERNAL && strstr(dm_last_error(), "op attn_softmax_re: a ") &&
              strstr(dm_last_error(), "not 2 and 1") && !strstr(dm_last_error(), "out of memory"));
    }
    dm_graph_free(&g);
}

int main(void) {
    test_graph_op_status();
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 3, cfg.seq = 9, cfg.hidden = 24, cfg.heads = 4, cfg.ffn = 40;
    cfg.dropout = 0.2;
    cfg.seed = 42;
    dm_layer *F = NULL, *U = NULL;
    /* the attention's ops, fused by the fusion pass (the CPU's default runs the padded
     * attention as one op: test_unpad checks it against these groups) */
    dm_layer_options of = {.schedule = DM_SCHED_FUSED, .threads = 2, .attention_op = -1};
    dm_layer_options ou = {.schedule = DM_SCHED_UNFUSED, .threads = 2, .no_reuse = 1};
    CHECK_OK(dm_layer_new(&F, &cfg, &of));
    CHECK_OK(dm_layer_new(&U, &cfg, &ou));
    if (!F || !U) TEST_END();

    printf("1. the paper's fused kernels, as found by the fusion pass:\n");
#define EXPECT(k, ...) expect_fused(F, k, (const char *const[]){__VA_ARGS__}, \
                                    (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *)))
    EXPECT("AIB", "qkv_bias");
    EXPECT("SM", "attn_mask", "attn_softmax", "attn_probs_dropout");
    EXPECT("BDRLN", "attn_out_bias", "attn_out_dropout", "attn_residual", "attn_layernorm");
    EXPECT("BRD", "ffn_in_bias", "ffn_act");
    EXPECT("BDRLN", "ffn_out_bias", "ffn_out_dropout", "ffn_residual", "ffn_layernorm");
    EXPECT("BSB", "ffn_layernorm_bwd", "ffn_out_dropout_bwd", "ffn_out_bias_dbias");
    EXPECT("BDRB", "ffn_act_bwd", "ffn_in_bias_dbias");
    EXPECT("EBSB", "grad_acc_h1", "attn_layernorm_bwd", "attn_out_dropout_bwd", "attn_out_bias_dbias");
    EXPECT("BS", "attn_probs_dropout_bwd", "attn_softmax_bwd");
    EXPECT("BAIB", "qkv_bias_dbias");
    EXPECT("BEI", "grad_acc_hidden_states");
    /* beyond the paper: attention as batched groups over (b, h), contractions included */
    EXPECT("ATTN-F", "attn_scores", "attn_mask", "attn_softmax", "attn_probs_dropout", "attn_context");
    EXPECT("ATTN-B", "attn_context_dA", "attn_probs_dropout_bwd", "attn_softmax_bwd",
           "attn_scores_dA", "attn_scores_dB");
    /* third pass (CPU plans): dV = P^T dctx, independent of the backward attention group
     * but reading its P and dctx, joins it; the GPU's plan (siblings off) keeps it alone,
     * the shape its fused attention kernels take */
    EXPECT("ATTN-B+", "attn_context_dA", "attn_context_dB");
    {
        dm_plan gpu;
        CHECK_OK(dm_plan_build(&F->g, 1, 0, 0, &gpu));
        int dv = -1, da = -1, alone = 0;
        for (int G = 0; G < gpu.ngroups; G++)
            for (int k = 0; k < gpu.groups[G].nops; k++) {
                const char *nm = F->g.op[gpu.order[gpu.groups[G].first + k]].name;
                if (!strcmp(nm, "attn_context_dB")) dv = G, alone = gpu.groups[G].nops == 1;
                if (!strcmp(nm, "attn_context_dA")) da = G;
            }
        CHECK(dv >= 0 && da >= 0 && dv != da && alone);
        CHECK(gpu.ngroups == F->plan.ngroups + 1);
        printf("  without the third pass (GPU plans): attn_context_dB %s\n",
               dv != da && alone ? "alone" : "NOT ALONE");
        dm_plan_free(&gpu);
    }
    {
        int merged = sibling_merged(0), refused = !sibling_merged(1);
        CHECK(merged && refused);
        printf("  third pass, synthetic graph: independent sibling merged %s, a merge that would close a "
               "cycle through a third group refused %s\n", merged ? "yes" : "NO", refused ? "yes" : "NO");
    }
    {
        float yu[32], yf[32];
        const int ok = !grouped_chain(0, yu) && !grouped_chain(1, yf);
        CHECK(ok && !memcmp(yu, yf, sizeof yu));
        int nan = 0;
        for (int e = 0; e < 32; e++) nan += yf[e] != yf[e];
        CHECK(nan == 0);
        printf("  a batched group holding two row groups (a GROUPED read of the first's output): fused %s "
               "unfused, bit for bit\n", ok && !memcmp(yu, yf, sizeof yu) ? "==" : "!=");
    }
    int nonc = 0, nops = 0;
    for (int G = 0; G < F->plan.ngroups; G++) {
        int has = 0;
        for (int k = 0; k < F->plan.groups[G].nops; k++) {
            int rowop = F->g.op[F->plan.order[F->plan.groups[G].first + k]].kind != DM_OP_CONTRACT;
            has |= rowop;
            nops += rowop;
        }
        nonc += has;
    }
    printf("  %d groups hold the %d element-wise and normalization ops\n", nonc, nops);
    CHECK(nonc == 11);
    /* the tensors a batched group keeps inside never get memory */
    const char *tiles[4] = {"scores", "d_probs_drop", "d_probs", "d_scores_masked"};
    for (int k = 0; k < 4; k++) {
        int found = 0;
        for (int t = 0; t < F->g.nt; t++)
            if (!strcmp(F->g.t[t].name, tiles[k])) {
                found = 1;
                CHECK(!F->plan.in_memory[t]);
                printf("  %-14s %s\n", tiles[k], F->plan.in_memory[t] ? "IN MEMORY" : "per-thread tile only");
            }
        CHECK(found);
    }

    /* the fused graph's rewrites: the activation keeps its derivative (the pre-activation
     * stays inside its group), the attention dropout's backward reads its mask off the
     * saved probabilities */
    const struct { const char *op; dm_op_kind f, u; } rw[3] = {
        {"ffn_act", DM_OP_ACT_DERIV, DM_OP_ACT}, {"ffn_act_bwd", DM_OP_MUL, DM_OP_ACT_BWD},
        {"attn_probs_dropout_bwd", DM_OP_DROPOUT_BWD_NZ, DM_OP_DROPOUT_BWD}};
    for (int k = 0; k < 3; k++) {
        int o = -1;
        for (int q = 0; q < F->g.nop; q++)
            if (!strcmp(F->g.op[q].name, rw[k].op)) o = q;
        CHECK(o >= 0 && o < U->g.nop && F->g.op[o].kind == rw[k].f && U->g.op[o].kind == rw[k].u &&
              !strcmp(U->g.op[o].name, rw[k].op));
        if (o >= 0)
            printf("  %-22s fused: %-14s unfused: %s\n", rw[k].op, dm_op_kind_name(F->g.op[o].kind),
                   o < U->g.nop ? dm_op_kind_name(U->g.op[o].kind) : "?");
    }
    const char *kept[2] = {"ffn1", "ffn_act_deriv"};
    for (int k = 0; k < 2; k++) {
        int found = 0;
        for (int t = 0; t < F->g.nt; t++)
            if (!strcmp(F->g.t[t].name, kept[k])) {
                found = 1;
                CHECK(F->plan.in_memory[t] == (k == 1));
                printf("  %-14s %s\n", kept[k], F->plan.in_memory[t] ? "in memory" : "inside its group only");
            }
        CHECK(found);
    }

    fill_inputs(F, 7);
    fill_inputs(U, 7);
    CHECK_OK(dm_layer_forward(U));
    CHECK_OK(dm_layer_backward(U));

    printf("2. each fused group against its unfused operators:\n");
    const dm_graph *g = &F->g;
    int nu = U->g.nt; /* tensors from nu on exist only in the fused graph: an earlier fused
                       * group of this loop made them, nothing in U to compare with */
    CHECK(g->nt > nu);
    for (int G = 0; G < F->plan.ngroups; G++) {
        const dm_group *gr = &F->plan.groups[G];
        char *made = calloc((size_t)g->nt, 1);
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[F->plan.order[gr->first + k]];
            for (int s = 0; s < op->nout; s++) made[dm_tensor_root(g, op->out[s])] = 1;
        }
        /* inputs from the unfused run */
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[F->plan.order[gr->first + k]];
            for (int s = 0; s < op->nin; s++) {
                int r = dm_tensor_root(g, op->in[s]);
                if (made[r] || !F->plan.in_memory[r] || r >= nu) continue;
                memcpy(dm_cpu_tensor_ptr(&F->plan, F->arena, r),
                       dm_cpu_tensor_ptr(&U->plan, U->arena, r), (size_t)g->t[r].numel * 4);
            }
        }
        /* poison the outputs (for a slice written through a view: just the slice, the
         * rest of its root comes from the unfused run), run the group alone; an output
         * written in place over an input of the group (memplan.c) keeps the input: were
         * it not written, it would still hold the input's values, which the comparison
         * below catches */
        int inplace = 0;
        for (int r = 0; r < g->nt; r++) {
            if (!made[r] || !F->plan.in_memory[r]) continue;
            int over_input = 0;
            for (int k = 0; k < gr->nops && !over_input; k++) {
                const dm_op *op = &g->op[F->plan.order[gr->first + k]];
                for (int s = 0; s < op->nin; s++) {
                    int q = dm_tensor_root(g, op->in[s]);
                    over_input |= q != r && !made[q] && F->plan.offset[q] == F->plan.offset[r];
                }
            }
            inplace += over_input;
            if (!over_input) memset(dm_cpu_tensor_ptr(&F->plan, F->arena, r), 0xff, (size_t)g->t[r].numel * 4);
        }
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[F->plan.order[gr->first + k]];
            int t = op->out[0], r = dm_tensor_root(g, t);
            if (g->t[t].base < 0) continue;
            memcpy(dm_cpu_tensor_ptr(&F->plan, F->arena, r), dm_cpu_tensor_ptr(&U->plan, U->arena, r),
                   (size_t)g->t[r].numel * 4);
            float *v = dm_cpu_tensor_ptr(&F->plan, F->arena, t);
            int64_t idx[DM_MAX_DIMS] = {0};
            for (int64_t e = 0; e < g->t[t].numel; e++) {
                int64_t off = 0;
                for (int d = 0; d < g->t[t].ndim; d++) off += idx[d] * g->t[t].stride[d];
                v[off] = NAN;
                for (int d = g->t[t].ndim - 1; d >= 0; d--) {
                    if (++idx[d] < g->t[t].size[d]) break;
                    idx[d] = 0;
                }
            }
        }
        CHECK_OK(dm_cpu_exec_group(dm_cpu_backend_exec(F->bk, F->st), G, cfg.seed, 0));
        double worst = 0;
        int nout = 0;
        for (int r = 0; r < g->nt; r++) {
            if (!made[r] || !F->plan.in_memory[r] || r >= nu) continue;
            double e = rel_err(dm_cpu_tensor_ptr(&F->plan, F->arena, r),
                               dm_cpu_tensor_ptr(&U->plan, U->arena, r), (size_t)g->t[r].numel);
            if (!(e <= worst)) worst = e;
            nout++;
        }
        int ok = worst < 1e-6;
        CHECK(ok);
        if (gr->nops > 1 || !ok) {
            printf("  group %2d (%d ops, %d outputs in memory, %d in place) rel.err %.2e %s:", G, gr->nops, nout, inplace,
                   worst, ok ? "ok" : "FAIL");
            for (int k = 0; k < gr->nops; k++) printf(" %s", g->op[F->plan.order[gr->first + k]].name);
            printf("\n");
        }
        free(made);
    }

    printf("3. whole step, fused vs unfused, dropout %.1f:\n", cfg.dropout);
    fill_inputs(F, 7);
    CHECK_OK(dm_layer_forward(F));
    CHECK_OK(dm_layer_backward(F));
    double w = compare_all(F, U, 1);
    CHECK(w < 1e-6);
    /* determinism: a second run with the same seed is identical; another seed differs */
    dm_layer *F2 = NULL;
    CHECK_OK(dm_layer_new(&F2, &cfg, &of));
    fill_inputs(F2, 7);
    CHECK_OK(dm_layer_forward(F2));
    CHECK_OK(dm_layer_backward(F2));
    CHECK(compare_all(F2, F, 0) == 0.0);
    CHECK_OK(dm_layer_set_seed(F2, 43));
    CHECK_OK(dm_layer_forward(F2));
    CHECK_OK(dm_layer_backward(F2));
    double other = compare_all(F2, F, 0);
    printf("  same seed: identical; seed 43 vs 42: max rel.diff %.2e\n", other);
    CHECK(other > 1e-2);
    for (int a = DM_ACT_GELU_TANH; a <= DM_ACT_RELU; a++) {
        double wa = step_vs_unfused(&cfg, (dm_act)a);
        printf("  %-9s fused vs unfused, every output and gradient: max rel.err %.2e\n",
               dm_act_name((dm_act)a), wa);
        CHECK(wa < 1e-6);
    }
    dm_layer_free(F2);
    dm_layer_free(F);
    dm_layer_free(U);

    /* memory: the fused plan keeps no more intermediates than the unfused one (its row
     * groups write outputs in place over inputs that die in them, as the unfused plan's
     * ops reuse what dies one op earlier), at these sizes and BERT-base's, both variants */
    for (int v = 0; v < 4; v++) {
        dm_layer_config mc = cfg;
        if (v >= 2) dm_layer_config_default(&mc);
        mc.norm = v % 2 ? DM_NORM_PRE : DM_NORM_POST;
        dm_layer *MF = NULL, *MU = NULL;
        dm_layer_options mf = {.schedule = DM_SCHED_FUSED, .threads = 2}, mu = {.schedule = DM_SCHED_UNFUSED, .threads = 2};
        CHECK_OK(dm_layer_new(&MF, &mc, &mf));
        CHECK_OK(dm_layer_new(&MU, &mc, &mu));
        dm_layer_memory a, b;
        dm_layer_memory_info(MF, &a);
        dm_layer_memory_info(MU, &b);
        CHECK(a.activations > 0 && a.activations <= b.activations && a.arena <= b.arena);
        printf("  %s, %s-LN: intermediates fused %.2f MB, unfused %.2f MB\n", v >= 2 ? "BERT-base" : "small",
               dm_norm_name(mc.norm), a.activations / 1e6, b.activations / 1e6);
        dm_layer_free(MF);
        dm_layer_free(MU);
    }

    /* attention recomputed in the backward pass: the clones join the backward attention
     * group, the probabilities never reach memory, the numbers stay the same */
    printf("4. attention recomputed in the backward pass:\n");
    {
        dm_layer_options orc = {.schedule = DM_SCHED_FUSED, .threads = 2, .recompute = 1};
        dm_layer *R, *N;
        const double wr = steps_compared(&cfg, &orc, &of, &R, &N);
        if (R && N) {
            F = R;
            EXPECT("ATTN-B+R", "attn_context_dA", "attn_scores_re", "attn_mask_re", "attn_softmax_re",
                   "attn_probs_dropout_re", "attn_context_dB", "attn_probs_dropout_bwd", "attn_softmax_bwd",
                   "attn_scores_dA", "attn_scores_dB");
            int kept = 0;
            for (int t = 0; t < R->g.nt; t++)
                if (R->g.t[t].base < 0 && R->plan.in_memory[t] &&
                    (!strncmp(R->g.t[t].name, "probs", 5) || !strncmp(R->g.t[t].name, "scores", 6)))
                    kept++;
            CHECK(kept == 0);
            dm_layer_memory mr, mn;
            dm_layer_memory_info(R, &mr);
            dm_layer_memory_info(N, &mn);
            CHECK(mr.activations < mn.activations);
            CHECK(wr < 1e-6);
            printf("  probabilities in memory: %d; intermediates %.3f MB (without: %.3f MB); every output and "
                   "gradient vs without: max rel.err %.2e\n", kept, mr.activations / 1e6, mn.activations / 1e6, wr);
        }
        dm_layer_free(R);
        dm_layer_free(N);
        F = NULL;
    }

    /* the layer variants: only the forward graph differs; the same pass finds their
     * groups, and their steps agree with the unfused ones */
    printf("5. pre-LN (and causal) layers:\n");
    dm_layer_config pre = cfg;
    pre.norm = DM_NORM_PRE;
    pre.causal = 1;
    F = NULL;
    CHECK_OK(dm_layer_new(&F, &pre, &of));
    if (F) {
        EXPECT("LN", "attn_layernorm");
        EXPECT("BDRLN", "attn_out_bias", "attn_out_dropout", "attn_residual", "ffn_layernorm");
        EXPECT("BDR", "ffn_out_bias", "ffn_out_dropout", "ffn_residual");
        EXPECT("DB", "ffn_out_dropout_bwd", "ffn_out_bias_dbias");
        EXPECT("LNB+EBSB", "ffn_layernorm_bwd", "grad_acc_h1", "attn_out_dropout_bwd", "attn_out_bias_dbias");
        EXPECT("LNB+BEI", "attn_layernorm_bwd", "grad_acc_hidden_states");
        EXPECT("ATTN-F", "attn_scores", "attn_mask", "attn_softmax", "attn_probs_dropout", "attn_context");
        dm_layer_free(F);
    }
    for (int v = 0; v < 3; v++) {
        dm_layer_config x = cfg;
        x.norm = v ? DM_NORM_PRE : DM_NORM_POST;
        x.causal = v != 1;
        double wv = step_vs_unfused(&x, DM_ACT_GELU);
        printf("  %s-LN%s fused vs unfused, every output and gradient: max rel.err %.2e\n",
               dm_norm_name(x.norm), x.causal ? ", causal" : "", wv);
        CHECK(wv < 1e-6);
    }
    TEST_END();
}
