/* rewrite.c: graph rewrites for the fused schedule, applied after autodiff and before the
 * fusion pass; the unfused schedule runs the graph as built, one pass per op. Each rewrite
 * uses what only a fused kernel can: it looks at an op together with its neighbours.
 *
 * Activation with its derivative: autodiff gives y = act(x) in the forward pass and
 * dx = dy * act'(x) in the backward, which keeps x alive across the step and evaluates the
 * activation's transcendental part twice (GELU: Phi(x) forward, Phi(x) and phi(x)
 * backward). Fused with its producer (bias + act: x never leaves the group), the forward
 * writes d = act'(x) instead, from the same evaluation (erf-GELU: Phi and phi share
 * exp(-x^2/2)), into as much memory as x held; the backward becomes a plain product, fused
 * with the bias gradient's column sum. The CPU kernels compute act and act' in one
 * function (cpu/vmath.h), so both schedules give the same numbers bit for bit.
 *
 * Dropout backward before a softmax backward: dx = mask * dy / (1 - p) needs the mask,
 * which the unfused op regenerates (Philox: the costliest element-wise work of the step).
 * The softmax backward multiplies dx by y, the dropout's input, elementwise, so dx only
 * matters where y != 0, and there the mask is exactly "the dropout's output is non-zero".
 * The fused backward reads the saved output (the attention probabilities after dropout,
 * kept for the value gradient anyway) instead of generating random numbers. */
#include "graph/rewrite.h"

#include <stdio.h>
#include <string.h>

#include "core/philox.h"
#include "core/status.h"

/* A graph call of a rewrite failed (-1 after dm_fail): out of memory said as rewriting
 * `what`, any other failure (an op that ops.def refuses) as it was recorded. */
static dm_status rewrite_failed(const char *what) {
    const dm_status s = dm_last_status();
    return s == DM_ERR_OOM ? dm_fail(DM_ERR_OOM, "out of memory rewriting %s", what) : s;
}

dm_status dm_rewrite_act_deriv(dm_graph *g, int *count) {
    int n = 0, nop = g->nop;
    for (int f = 0; f < nop; f++) {
        if (g->op[f].kind != DM_OP_ACT) continue;
        int x = g->op[f].in[0];
        /* x a root: d gets x's letters as a new row-major root */
        if (g->t[x].base >= 0 || g->t[x].numel != g->op[f].rows * g->op[f].cols) continue;
        int b = -1;
        for (int o = f + 1; o < nop && b < 0; o++) {
            const dm_op *q = &g->op[o];
            if (q->kind == DM_OP_ACT_BWD && q->in[1] == x && q->act == g->op[f].act &&
                q->rows == g->op[f].rows && q->cols == g->op[f].cols)
                b = o;
        }
        if (b < 0) continue;
        char name[DM_NAME_LEN], letters[DM_MAX_DIMS + 1];
        snprintf(name, sizeof name, "%s_deriv", g->t[g->op[f].out[0]].name);
        memcpy(letters, g->t[x].letters, sizeof letters); /* g->t may move */
        int d = dm_graph_tensor(g, name, letters, DM_ROLE_ACT);
        if (d < 0) return rewrite_failed(g->op[f].name);
        g->t[d].pass = 0;
        g->op[f].kind = DM_OP_ACT_DERIV;
        g->op[f].nout = 2;
        g->op[f].out[1] = d;
        g->op[b].kind = DM_OP_MUL;
        g->op[b].in[1] = d;
        n++;
    }
    if (count) *count = n;
    return DM_OK;
}

dm_status dm_rewrite_dropout_bwd_nz(dm_graph *g, int *count) {
    int n = 0, nop = g->nop;
    for (int b = 0; b < nop; b++) {
        const dm_op *bo = &g->op[b];
        if (bo->kind != DM_OP_DROPOUT_BWD || !(bo->p > 0)) continue;
        /* its forward dropout: the one op with the same random stream */
        int f = -1, nf = 0;
        for (int o = 0; o < nop; o++)
            if (g->op[o].kind == DM_OP_DROPOUT && g->op[o].stream == bo->stream) {
                f = o;
                nf++;
            }
        if (nf != 1 || g->op[f].p != bo->p || g->op[f].rows != bo->rows || g->op[f].cols != bo->cols)
            continue;
        int y = g->op[f].in[0], yd = g->op[f].out[0], dx = bo->out[0];
        if (g->t[dx].base >= 0 || g->t[dx].role != DM_ROLE_ACT || g->t[yd].base >= 0) continue;
        /* every reader of dx: a softmax backward with dy = dx and y = the dropout's input */
        int readers = 0, ok = 1;
        for (int o = 0; o < nop && ok; o++)
            for (int k = 0; k < g->op[o].nin; k++) {
                if (dm_tensor_root(g, g->op[o].in[k]) != dx) continue;
                readers++;
                ok = g->op[o].kind == DM_OP_SOFTMAX_BWD && k == 0 && g->op[o].in[0] == dx &&
                     g->op[o].in[1] == y;
            }
        if (!ok || !readers) continue;
        g->op[b].kind = DM_OP_DROPOUT_BWD_NZ;
        g->op[b].nin = 2;
        g->op[b].in[1] = yd;
        n++;
    }
    if (count) *count = n;
    return DM_OK;
}

/* The op that writes root t in pass `pass`, or -1. */
static int writer(const dm_graph *g, int t, int pass) {
    for (int o = 0; o < g->nop; o++)
        if (g->op[o].pass == pass && g->op[o].nout > 0 && g->op[o].out[0] == t) return o;
    return -1;
}

dm_status dm_rewrite_recompute_attention(dm_graph *g, int *count) {
    if (count) *count = 0;
    /* the chain, walked back from attention's dropout: scores -> mask -> softmax -> dropout */
    int fd = -1;
    for (int o = 0; o < g->nop && fd < 0; o++)
        if (g->op[o].pass == 0 && g->op[o].kind == DM_OP_DROPOUT && g->op[o].stream == DM_DROP_ATTN_PROBS) fd = o;
    if (fd < 0) return DM_OK;
    const int a = g->op[fd].in[0], ad = g->op[fd].out[0];
    const int fs = writer(g, a, 0);
    const int sm = fs >= 0 ? g->op[fs].in[0] : -1;
    const int fm = sm >= 0 ? writer(g, sm, 0) : -1;
    const int s = fm >= 0 ? g->op[fm].in[0] : -1;
    const int fc = s >= 0 ? writer(g, s, 0) : -1;
    if (fs < 0 || g->op[fs].kind != DM_OP_SOFTMAX || fm < 0 || g->op[fm].kind != DM_OP_MASK_ADD || fc < 0 ||
        g->op[fc].kind != DM_OP_CONTRACT)
        return DM_OK;
    /* the first backward op that reads the probabilities */
    int at = -1;
    for (int o = 0; o < g->nop && at < 0; o++)
        if (g->op[o].pass == 1)
            for (int k = 0; k < g->op[o].nin; k++)
                if (dm_tensor_root(g, g->op[o].in[k]) == a || dm_tensor_root(g, g->op[o].in[k]) == ad) at = o;
    if (at < 0) return DM_OK;
    /* readers through views would keep the forward's tensors: then leave the graph alone */
    for (int o = 0; o < g->nop; o++)
        for (int k = 0; k < g->op[o].nin; k++) {
            const int r = dm_tensor_root(g, g->op[o].in[k]);
            if ((r == a || r == ad) && g->op[o].in[k] != r) return DM_OK;
        }
    /* the clones' tensors (g->t may move: copy what is needed first) */
    const int src[4] = {s, sm, a, ad};
    int re[4];
    for (int k = 0; k < 4; k++) {
        char name[DM_NAME_LEN], letters[DM_MAX_DIMS + 1];
        snprintf(name, sizeof name, "%.40s_re", g->t[src[k]].name);
        memcpy(letters, g->t[src[k]].letters, sizeof letters);
        re[k] = dm_graph_tensor(g, name, letters, DM_ROLE_ACT);
        if (re[k] < 0) return rewrite_failed("attention for recomputation");
        g->t[re[k]].pass = 1;
    }
    /* the clones' ops, appended, then moved to just before `at` */
    const int fwd[4] = {fc, fm, fs, fd};
    const int n0 = g->nop;
    for (int k = 0; k < 4; k++) {
        dm_op op = g->op[fwd[k]];
        op.pass = 1;
        op.recomputed = 1;
        char name[DM_NAME_LEN];
        snprintf(name, sizeof name, "%.40s_re", op.name);
        snprintf(op.name, sizeof op.name, "%s", name);
        if (k > 0) op.in[0] = re[k - 1];
        op.out[0] = re[k];
        if (dm_graph_op(g, &op) < 0) return rewrite_failed("attention for recomputation");
    }
    dm_op moved[4];
    memcpy(moved, &g->op[n0], sizeof moved);
    memmove(&g->op[at + 4], &g->op[at], sizeof(dm_op) * (size_t)(n0 - at));
    memcpy(&g->op[at], moved, sizeof moved);
    /* the backward reads the clones */
    for (int o = at + 4; o < g->nop; o++)
        for (int k = 0; k < g->op[o].nin; k++) {
            if (g->op[o].in[k] == a) g->op[o].in[k] = re[2];
            else if (g->op[o].in[k] == ad) g->op[o].in[k] = re[3];
        }
    if (count) *count = 1;
    return DM_OK;
}

dm_status dm_rewrite_fused(dm_graph *g) {
    DM_TRY(dm_rewrite_act_deriv(g, NULL));
    return dm_rewrite_dropout_bwd_nz(g, NULL);
}
