/* gen.cu: row kernels generated per fused group. The generic row kernel (rows.cu)
 * interprets a row program: it loads an operand again in every op that reads it, keeps
 * a group's intermediates in shared memory, and pays for its dispatch in every op of every
 * row; the profile of the H100 runs put its LayerNorm groups at 5-10x their bandwidth floor.
 * Here each row program becomes CUDA C++ of its own: a row per team of lanes (a warp, or
 * fewer lanes for short rows), every value of the row in registers (each lane holds its
 * chunks of 8 columns), every operand read once and written once, the ops in straight
 * lines between the row reductions (softmax's max and sum, LayerNorm's mean and variance,
 * the backward sums), sizes and constants folded in. genbuild.cu compiles the kernels of a
 * plan as one NVRTC program at executor init, or, for the tests, builds the same text
 * for the host (genrt.cuh: a team of one lane holding the whole row, or every lane of
 * the device kernel simulated by a thread).
 *
 * Code shape (per program): the ops are split into segments at each row reduction; a
 * segment is one unrolled loop over the lane's chunks. A value used only in the segment
 * that makes it is a local of that loop; one used in a later segment is a row array
 * (NCH chunks x 8 floats) in registers. Column operands (bias, gamma, beta) are reloaded
 * where used (cached), row scalars are scalars. Column accumulators (bias and LayerNorm
 * parameter gradients) are per team in shared memory, each column owned by one lane;
 * each block writes one partial per column, summed in a fixed order by rows.cu's
 * column-sum kernel: deterministic, as the interpreter.
 * This file: the row kernels and the generator's entry points; attn.cu: the fused
 * attention kernels; gen.h: what the two share; genbuild.cu: NVRTC, the cache, loading. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <memory>
#include <new>
#include <string>

#include "cuda/rowmath.cuh"
#include "cudagen/gen.h"

const char *gen_type_name(int dt) {
    return dt == DMC_BF16 ? "__nv_bfloat16" : dt == DMC_F16 ? "__half" : "float";
}

void gen_add(std::string &s, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf) { /* long lines: format again into a big enough buffer */
        std::string big((size_t)n + 1, '\0');
        va_start(ap, fmt);
        vsnprintf(&big[0], big.size(), fmt, ap);
        va_end(ap);
        big.resize((size_t)n);
        s += big;
        return;
    }
    s += buf;
}

/* The value of operand d (found or added). */
static dm_status value_of(gen_ctx *G, const dmc_operand *d, int *vi) {
    for (int i = 0; i < G->nv; i++) {
        const gen_val *x = &G->v[i];
        if (x->loc != d->loc) continue;
        if (d->loc == DMC_LOC_SCRATCH ? x->slot == d->slot
                                      : x->base == d->base && x->tensor == d->tensor && x->kind == d->kind &&
                                            x->rdiv == d->rdiv) {
            *vi = i;
            return DM_OK;
        }
    }
    if (G->nv >= GEN_MAXV) return dm_fail(DM_ERR_UNSUPPORTED, "row program: more than %d values", GEN_MAXV);
    gen_val *x = &G->v[G->nv];
    memset(x, 0, sizeof *x);
    x->loc = d->loc;
    x->kind = d->kind;
    x->dt = d->loc == DMC_LOC_SCRATCH ? DMC_F32 : d->dt;
    x->base = d->base;
    x->rdiv = d->kind == DM_ARG_GROUPED ? d->rdiv : 0;
    x->slot = d->slot;
    x->param = -1;
    x->def_seg = -1;
    x->first_seg = x->last_seg = -1;
    x->first_read_op = x->def_op = x->last_read_op = -1;
    x->tensor = d->loc == DMC_LOC_GLOBAL ? d->tensor : -1;
    x->loaded_seg = -1;
    if (d->loc == DMC_LOC_GLOBAL && d->kind != DM_ARG_COLACC) {
        for (int q = 0; q < G->nparam; q++)
            if (G->params[q] == d->base) x->param = q;
        if (x->param < 0) {
            if (G->nparam >= DMG_MAXP)
                return dm_fail(DM_ERR_UNSUPPORTED, "row program: more than %d operands", DMG_MAXP);
            G->params[G->nparam] = d->base;
            x->param = G->nparam++;
        }
    }
    *vi = G->nv++;
    return DM_OK;
}

/* How many segments op kind k opens after the one it starts in: one per row reduction. */
static int segs_opened(int k) { return dm_op_row_reductions((dm_op_kind)k); }

/* An op that starts in segment s reads its inputs for the last time, and writes its
 * outputs, in its last segment (softmax: x for the max, then for exp; LayerNorm: x in
 * all three, gamma and beta in the last; the backward ops: everything in both). */
static int last_seg(int kind, int s) { return s + segs_opened(kind); }

static void use(gen_val *x, int s) {
    if (x->first_seg < 0 || s < x->first_seg) x->first_seg = s;
    if (s > x->last_seg) x->last_seg = s;
}

/* Pass 1: values, their segments, which must be row arrays. */
static dm_status plan_values(gen_ctx *G) {
    const dmc_rowprog *p = G->p;
    int s = 0;
    for (int k = 0; k < p->nops; k++) {
        const dmc_rowop *op = &p->ops[k];
        for (int i = 0; i < op->nin; i++) {
            int vi;
            DM_TRY(value_of(G, &op->in[i], &vi));
            gen_val *x = &G->v[vi];
            use(x, s);
            use(x, last_seg(op->kind, s));
            if (x->first_read_op < 0) x->first_read_op = k;
            x->last_read_op = k;
        }
        for (int i = 0; i < op->nout; i++) {
            int vi;
            DM_TRY(value_of(G, &op->out[i], &vi));
            gen_val *x = &G->v[vi];
            if (x->kind == DM_ARG_COLACC) continue;
            if (x->kind == DM_ARG_ROWSCALAR) { /* written once, a scalar */
                if (x->loaded_seg >= 0 || x->first_seg >= 0)
                    return dm_fail(DM_ERR_UNSUPPORTED, "row program writes a row statistic twice");
                x->loaded_seg = 0; /* marks it written; reset before emission */
                continue;
            }
            if (x->def_seg >= 0)
                return dm_fail(DM_ERR_UNSUPPORTED, "row program writes one tensor twice");
            x->def_seg = last_seg(op->kind, s);
            x->def_op = k;
            use(x, x->def_seg);
        }
        s += segs_opened(op->kind);
        if (s >= GEN_MAXSEG) return dm_fail(DM_ERR_UNSUPPORTED, "row program: too many reductions");
    }
    for (int i = 0; i < G->nv; i++) {
        gen_val *x = &G->v[i];
        x->loaded_seg = -1;
        x->array = (x->kind == DM_ARG_FULL || x->kind == DM_ARG_GROUPED) &&
                   x->last_seg > (x->def_seg >= 0 ? x->def_seg : x->first_seg);
        /* a tensor read before the op that writes it (in place, or a later overwrite):
         * the registers would not hold what memory does */
        if (x->def_op >= 0 && x->first_read_op >= 0 && x->first_read_op <= x->def_op)
            return dm_fail(DM_ERR_UNSUPPORTED, "row program reads a tensor before writing it");
        /* one address under two operand kinds, one of them written: lanes would read
         * what other lanes write. But an output written in place over an input (memplan.c):
         * both whole rows, the input read for the last time before the output is written
         * (or by the writing op itself, pointwise), so each lane loads its chunk of the
         * input before it stores its chunk of the output there */
        for (int j = 0; j < G->nv; j++) {
            const gen_val *y = &G->v[j];
            if (j == i || x->loc != DMC_LOC_GLOBAL || y->loc != DMC_LOC_GLOBAL || x->base != y->base ||
                !(x->def_seg >= 0 || x->kind == DM_ARG_ROWSCALAR))
                continue;
            const int in_place = x->kind == DM_ARG_FULL && y->kind == DM_ARG_FULL && x->tensor != y->tensor &&
                                 y->def_op < 0 && y->last_seg <= x->def_seg &&
                                 (y->last_read_op < x->def_op ||
                                  (y->last_read_op == x->def_op && dm_op_pointwise((dm_op_kind)p->ops[x->def_op].kind)));
            if (!in_place) return dm_fail(DM_ERR_UNSUPPORTED, "row program addresses one tensor two ways");
        }
    }
    return DM_OK;
}

/* --- emission ------------------------------------------------------------------------ */

/* The C++ expression of value x's chunk as a float[8] (array name) in the current
 * segment, loading it from memory if needed. */
static std::string chunk(gen_ctx *G, int vi) {
    gen_val *x = &G->v[vi];
    char name[32];
    if (x->array) snprintf(name, sizeof name, "R%d[c]", vi);
    else snprintf(name, sizeof name, "v%d", vi);
    if (x->def_seg >= 0 || x->kind == DM_ARG_COLACC) return name;
    /* from memory: once per segment, or once for a row array */
    if (x->array ? x->loaded_seg >= 0 : x->loaded_seg == G->seg) return name;
    x->loaded_seg = G->seg;
    if (!x->array) gen_add(G->body, "        float v%d[8];\n", vi);
    const char *ty = gen_type_name(x->dt);
    if (G->s_base && x->loc == DMC_LOC_GLOBAL && x->base == G->s_base)
        gen_add(G->body, "        dmg_ld8<1>(%s, (const %s *)Ss + (r - g0) * SLD + c0, n);\n", name, ty);
    else if (x->kind == DM_ARG_COLVEC)
        gen_add(G->body, "        dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + c0, n);\n", name, ty, x->param);
    else if (x->kind == DM_ARG_GROUPED)
        gen_add(G->body, "        dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + (r / %lldLL) * COLS + c0, n);\n",
            name, ty, x->param, (long long)x->rdiv);
    else
        gen_add(G->body, "        dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + r * COLS + c0, n);\n", name, ty,
            x->param);
    return name;
}

/* Declares value x's chunk as computed in this segment; returns its name. */
static std::string define(gen_ctx *G, int vi) {
    gen_val *x = &G->v[vi];
    char name[32];
    if (x->array) {
        snprintf(name, sizeof name, "R%d[c]", vi);
    } else {
        snprintf(name, sizeof name, "v%d", vi);
        gen_add(G->body, "        float v%d[8];\n", vi);
    }
    return name;
}

/* After value x's chunk is computed: stored if global (rounded first, so later uses in
 * the group see what memory holds). */
static void finish(gen_ctx *G, int vi) {
    gen_val *x = &G->v[vi];
    if (x->loc != DMC_LOC_GLOBAL) return;
    std::string a = x->array ? "R" + std::to_string(vi) + "[c]" : "v" + std::to_string(vi);
    const char *ty = gen_type_name(x->dt);
    if (x->dt != DMC_F32) gen_add(G->body, "        dmg_round8<%s>(%s);\n", ty, a.c_str());
    const int tile = G->p_base && x->base == G->p_base;
    if (tile) gen_add(G->body, "        if (ok) dmg_st8<1>((%s *)Ps + (r - g0) * PLD + c0, %s, n);\n", ty, a.c_str());
    if (tile && !G->p_global) return;
    if (x->kind == DM_ARG_GROUPED)
        gen_add(G->body, "        if (ok) dmg_st8<VEC>((%s *)P.p[%d] + (r / %lldLL) * COLS + c0, %s, n);\n", ty,
            x->param, (long long)x->rdiv, a.c_str());
    else
        gen_add(G->body, "        if (ok) dmg_st8<VEC>((%s *)P.p[%d] + r * COLS + c0, %s, n);\n", ty, x->param,
            a.c_str());
}

/* A row scalar input: a scalar at row scope; an output: a name to assign. */
static std::string scalar_in(gen_ctx *G, int vi) {
    gen_val *x = &G->v[vi];
    char name[32];
    snprintf(name, sizeof name, "s%d", vi);
    if (x->loc == DMC_LOC_GLOBAL && x->loaded_seg < 0) {
        x->loaded_seg = G->seg;
        gen_add(G->rowscope, "        const float s%d = dmg_f(((const %s *)P.p[%d])[r]);\n", vi,
            gen_type_name(x->dt), x->param);
    }
    return name;
}

static void scalar_out(gen_ctx *G, int vi, const char *expr) {
    gen_val *x = &G->v[vi];
    gen_add(G->rowscope, "        const float s%d = %s;\n", vi, expr);
    x->loaded_seg = G->seg;
    if (x->loc == DMC_LOC_GLOBAL)
        gen_add(G->rowscope, "        if (ok && lt == 0) ((%s *)P.p[%d])[r] = dmg_to<%s>(s%d);\n",
            gen_type_name(x->dt), x->param, gen_type_name(x->dt), vi);
}

/* Ends the current segment: its row-scope lines, its chunk loop, then `after` (the
 * reductions), all into out. */
static void close_segment(gen_ctx *G, const std::string &after) {
    G->out += G->rowscope;
    if (!G->body.empty()) {
        /* the lane's chunks c0 = (c * TEAM + lt) * 8, n of their columns valid */
        gen_add(G->out, "        %s for (int c = 0; c < NCH; c++) {\n"
                    "        const int c0 = (c * TEAM + lt) * 8;\n"
                    "        if (%s) {\n"
                    "        const int n = %s;\n"
                    "        (void)n; (void)c0;\n",
            G->nch <= GEN_MAX_NCH ? "DMC_UNROLL" : "DMC_UNROLL4", /* wide rows: registers */
            G->chunks % G->team == 0 ? "true" : "c0 < COLS",
            G->full ? "8" : "(int)(COLS - c0 < 8 ? COLS - c0 : 8)");
        G->out += G->body;
        G->out += "        }}\n";
    }
    G->out += after;
    G->rowscope.clear();
    G->body.clear();
    G->seg++;
}

static const char *act_fn(int act) {
    return act == DM_ACT_RELU ? "dmc_relu_both" : act == DM_ACT_GELU_TANH ? "dmc_gelu_tanh_both"
                                  : act == DM_ACT_TANH ? "dmc_tanh_both" : "dmc_gelu_both";
}

/* The accumulator index of a COLACC operand. */
static int acc_index(const gen_ctx *G, const dmc_operand *d) {
    for (int a = 0; a < G->p->nacc; a++)
        if (G->p->acc_slot[a] == d->slot) return a;
    return -1;
}

/* The kinds without a row reduction: every output chunk from the same chunks of the
 * inputs (or, COLSUM, added into the column accumulators). */
static dm_status emit_eltwise(gen_ctx *G, const dmc_rowop *op, const int *in, const int *out) {
    std::string a, b, y;
    switch (op->kind) {
    case DM_OP_BIAS_ADD:
    case DM_OP_ADD:
    case DM_OP_MUL:
    case DM_OP_MASK_ADD:
    case DM_OP_DROPOUT_BWD_NZ: {
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        y = define(G, out[0]);
        const char *A = a.c_str(), *B = b.c_str(), *Y = y.c_str();
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) ");
        if (op->kind == DM_OP_MUL) gen_add(G->body, "%s[e] = %s[e] * %s[e];\n", Y, A, B);
        else if (op->kind == DM_OP_MASK_ADD && op->causal) /* keys after the query r % COLS */
            gen_add(G->body, "%s[e] = fmaxf(%s[e] + (c0 + e <= r %% COLS ? 1.0f - %s[e] : 1.0f) * -3.40282347e+38f, %.9ef);\n",
                Y, A, B, (double)dmc_lowest(G->v[out[0]].dt));
        else if (op->kind == DM_OP_MASK_ADD)
            gen_add(G->body, "%s[e] = fmaxf(%s[e] + (1.0f - %s[e]) * -3.40282347e+38f, %.9ef);\n", Y, A, B,
                (double)dmc_lowest(G->v[out[0]].dt));
        else if (op->kind == DM_OP_DROPOUT_BWD_NZ)
            gen_add(G->body, "%s[e] = %s[e] != 0.0f ? %s[e] * %.9ef : 0.0f;\n", Y, B, A, (double)op->drop_scale);
        else gen_add(G->body, "%s[e] = %s[e] + %s[e];\n", Y, A, B);
        finish(G, out[0]);
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD:
        a = chunk(G, in[0]);
        y = define(G, out[0]);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = %s[e];\n", y.c_str(), a.c_str());
        if (op->drop_on)
            gen_add(G->body, "        dmg_drop8(%s, n, seed, %uu, (unsigned long long)DMG_KEYROW * COLS + c0, %uu, %.9ef);\n",
                y.c_str(), op->stream, op->drop_thr, (double)op->drop_scale);
        finish(G, out[0]);
        break;
    case DM_OP_ACT:
    case DM_OP_ACT_DERIV: {
        a = chunk(G, in[0]);
        y = define(G, out[0]);
        std::string d = op->kind == DM_OP_ACT_DERIV ? define(G, out[1]) : std::string();
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) { float g; %s[e] = %s(%s[e], &g);%s%s%s }\n",
            y.c_str(), act_fn(op->act), a.c_str(), d.empty() ? "" : " ", d.c_str(),
            d.empty() ? " (void)g;" : "[e] = g;");
        finish(G, out[0]);
        if (op->kind == DM_OP_ACT_DERIV) finish(G, out[1]);
        break;
    }
    case DM_OP_ACT_BWD:
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        y = define(G, out[0]);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) { float g; (void)%s(%s[e], &g); %s[e] = %s[e] * g; }\n",
            act_fn(op->act), b.c_str(), y.c_str(), a.c_str());
        finish(G, out[0]);
        break;
    case DM_OP_EMBED: { /* in: table, idx: row idx[r] of the table, or zeros */
        const int tv = in[0];
        std::string ix = scalar_in(G, in[1]);
        y = define(G, out[0]);
        gen_add(G->body,
            "        { const long long nr = dmc_index_row(%s, %lldLL);\n"
            "          if (nr >= 0) dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + nr * COLS + c0, n);\n"
            "          else DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = 0.0f; }\n",
            ix.c_str(), (long long)op->nindex, y.c_str(), gen_type_name(G->v[tv].dt), G->v[tv].param, y.c_str());
        finish(G, out[0]);
        break;
    }
    case DM_OP_XENT_BWD: { /* in: logits, lse, label, dloss: dloss (softmax - onehot) */
        std::string lse = scalar_in(G, in[1]), lab = scalar_in(G, in[2]), dl = scalar_in(G, in[3]);
        a = chunk(G, in[0]);
        y = define(G, out[0]);
        gen_add(G->body,
            "        { const long long l = dmc_index_row(%s, COLS);\n"
            "          DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = l < 0 ? 0.0f : %s * (expf(%s[e] - %s) - (c0 + e == l ? 1.0f : 0.0f)); }\n",
            lab.c_str(), y.c_str(), dl.c_str(), a.c_str(), lse.c_str());
        finish(G, out[0]);
        break;
    }
    case DM_OP_COLSUM: {
        a = chunk(G, in[0]);
        int ai = acc_index(G, &op->out[0]);
        if (ai < 0) return dm_fail(DM_ERR_INTERNAL, "column sum without an accumulator");
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (ok && e < n) acc[%d * ACCW + DMG_AT(c, e)] += %s[e];\n", ai,
            a.c_str());
        break;
    }
    default:
        return dm_fail(DM_ERR_UNSUPPORTED, "no generated kernel for op kind '%s'",
                       dm_op_kind_name((dm_op_kind)op->kind));
    }
    return DM_OK;
}

/* The kinds with row reductions (ops.def's rowred): each reduction closes a segment.
 * K: the op's number in the program, which names its row-scope values. */
static dm_status emit_rowred(gen_ctx *G, const dmc_rowop *op, const int *in, const int *out, int K) {
    std::string a, b, y, after;
    switch (op->kind) {
    case DM_OP_SOFTMAX: {
        a = chunk(G, in[0]);
        gen_add(G->rowscope, "        float m%d = -dmg_inf();\n", K);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) m%d = fmaxf(m%d, %s[e]);\n", K, K, a.c_str());
        gen_add(after, "        m%d = dmg_max<TEAM>(m%d);\n", K, K);
        close_segment(G, after);
        after.clear();
        /* exp(x - m) is kept: a row array of its own (the output's slot is not yet live) */
        a = chunk(G, in[0]);
        gen_add(G->out, "        float E%d[NCH][8];\n", K);
        gen_add(G->rowscope, "        float t%d = 0.0f;\n", K);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) { E%d[c][e] = expf(%s[e] - m%d); if (e < n) t%d += E%d[c][e]; }\n",
            K, a.c_str(), K, K, K);
        gen_add(after, "        const float inv%d = 1.0f / dmg_sum<TEAM>(t%d);\n", K, K);
        close_segment(G, after);
        y = define(G, out[0]);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = E%d[c][e] * inv%d;\n", y.c_str(), K, K);
        finish(G, out[0]);
        break;
    }
    case DM_OP_SOFTMAX_BWD: { /* in: dy, y; dx = y (dy - sum(dy y)) */
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        gen_add(G->rowscope, "        float t%d = 0.0f;\n", K);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) t%d += %s[e] * %s[e];\n", K, a.c_str(), b.c_str());
        gen_add(after, "        t%d = dmg_sum<TEAM>(t%d);\n", K, K);
        close_segment(G, after);
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        y = define(G, out[0]);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = %s[e] * (%s[e] - t%d);\n", y.c_str(),
            b.c_str(), a.c_str(), K);
        finish(G, out[0]);
        break;
    }
    case DM_OP_XENT: { /* in: logits, label; out: loss, lse (rows.cu's rowop_xent) */
        std::string lab = scalar_in(G, in[1]);
        a = chunk(G, in[0]);
        gen_add(G->rowscope, "        float m%d = -dmg_inf();\n", K);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) m%d = fmaxf(m%d, %s[e]);\n", K, K, a.c_str());
        gen_add(after, "        m%d = dmg_max<TEAM>(m%d);\n", K, K);
        close_segment(G, after);
        after.clear();
        a = chunk(G, in[0]);
        gen_add(G->rowscope, "        float t%d = 0.0f, p%d = 0.0f;\n        const long long l%d = dmc_index_row(%s, COLS);\n", K,
            K, K, lab.c_str());
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) { t%d += expf(%s[e] - m%d); if (c0 + e == l%d) p%d += %s[e]; }\n",
            K, a.c_str(), K, K, K, a.c_str());
        gen_add(after, "        t%d = dmg_sum<TEAM>(t%d);\n        p%d = dmg_sum<TEAM>(p%d);\n", K, K, K, K);
        close_segment(G, after);
        char ex[96];
        snprintf(ex, sizeof ex, "l%d >= 0 ? (m%d - p%d) + logf(t%d) : 0.0f", K, K, K, K);
        scalar_out(G, out[0], ex);
        snprintf(ex, sizeof ex, "m%d + logf(t%d)", K, K);
        scalar_out(G, out[1], ex);
        break;
    }
    case DM_OP_LAYERNORM: { /* in: x, gamma, beta; out: y, mean, rstd */
        a = chunk(G, in[0]);
        gen_add(G->rowscope, "        float t%d = 0.0f;\n", K);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) t%d += %s[e];\n", K, a.c_str());
        gen_add(after, "        const float mean%d = dmg_sum<TEAM>(t%d) / (float)COLS;\n", K, K);
        close_segment(G, after);
        after.clear();
        a = chunk(G, in[0]);
        gen_add(G->rowscope, "        float q%d = 0.0f;\n", K);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) q%d += (%s[e] - mean%d) * (%s[e] - mean%d);\n", K,
            a.c_str(), K, a.c_str(), K);
        gen_add(after, "        q%d = dmg_sum<TEAM>(q%d);\n", K, K);
        gen_add(after, "        const float rstd%d = (float)(1.0 / sqrt((double)(q%d / (float)COLS) + %.17g));\n", K,
            K, op->eps);
        close_segment(G, after);
        a = chunk(G, in[0]);
        std::string gm = chunk(G, in[1]), bt = chunk(G, in[2]);
        y = define(G, out[0]);
        gen_add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = (%s[e] - mean%d) * rstd%d * %s[e] + %s[e];\n",
            y.c_str(), a.c_str(), K, K, gm.c_str(), bt.c_str());
        finish(G, out[0]);
        char ex[32];
        snprintf(ex, sizeof ex, "mean%d", K);
        scalar_out(G, out[1], ex);
        snprintf(ex, sizeof ex, "rstd%d", K);
        scalar_out(G, out[2], ex);
        break;
    }
    case DM_OP_LAYERNORM_BWD: {
        /* in: dy, x, mean, rstd, gamma; out: dx, dgamma (acc), dbeta (acc) */
        int ag = acc_index(G, &op->out[1]), ab = acc_index(G, &op->out[2]);
        if (ag < 0 || ab < 0) return dm_fail(DM_ERR_INTERNAL, "LayerNorm backward without accumulators");
        std::string mean = scalar_in(G, in[2]), rstd = scalar_in(G, in[3]);
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        std::string gm = chunk(G, in[4]);
        const char *M = mean.c_str(), *S = rstd.c_str();
        gen_add(G->rowscope, "        float t%d = 0.0f, q%d = 0.0f;\n", K, K);
        gen_add(G->body,
            "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) {\n"
            "            const float xh = (%s[e] - %s) * %s, g = %s[e] * %s[e];\n"
            "            t%d += g;\n"
            "            q%d += g * xh;\n"
            "            if (ok) { acc[%d * ACCW + DMG_AT(c, e)] += %s[e] * xh; acc[%d * ACCW + DMG_AT(c, e)] += %s[e]; }\n"
            "        }\n",
            b.c_str(), M, S, a.c_str(), gm.c_str(), K, K, ag, a.c_str(), ab, a.c_str());
        gen_add(after, "        t%d = dmg_sum<TEAM>(t%d) * (1.0f / (float)COLS);\n", K, K);
        gen_add(after, "        q%d = dmg_sum<TEAM>(q%d) * (1.0f / (float)COLS);\n", K, K);
        close_segment(G, after);
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        gm = chunk(G, in[4]);
        y = define(G, out[0]);
        gen_add(G->body,
            "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = %s * (%s[e] * %s[e] - t%d - (%s[e] - %s) * %s * q%d);\n",
            y.c_str(), S, a.c_str(), gm.c_str(), K, b.c_str(), M, S, K);
        finish(G, out[0]);
        break;
    }
    default:
        return dm_fail(DM_ERR_UNSUPPORTED, "no generated kernel for op kind '%s'",
                       dm_op_kind_name((dm_op_kind)op->kind));
    }
    return DM_OK;
}

static dm_status emit_op(gen_ctx *G, const dmc_rowop *op) {
    int in[DM_MAX_IN] = {0}, out[DM_MAX_OUT] = {0};
    for (int i = 0; i < op->nin; i++) DM_TRY(value_of(G, &op->in[i], &in[i]));
    for (int i = 0; i < op->nout; i++)
        if (op->out[i].kind != DM_ARG_COLACC) DM_TRY(value_of(G, &op->out[i], &out[i]));
    const int K = G->red++;
    return dm_op_reduces_rows((dm_op_kind)op->kind) ? emit_rowred(G, op, in, out, K)
                                                     : emit_eltwise(G, op, in, out);
}

/* Can program p run as a generated kernel? The shape rules: at most GEN_MAX_NCH chunks per
 * lane when a reduction keeps the row in registers, the accumulators of a team in 48 KiB
 * of shared memory, operands and values within the fixed tables. */
static dm_status gen_shape(gen_ctx *G) {
    const dmc_rowprog *p = G->p;
    int reductions = 0;
    for (int k = 0; k < p->nops; k++) reductions |= segs_opened(p->ops[k].kind) > 0;
    G->chunks = (int)((p->cols + 7) / 8);
    if (p->cols > (int64_t)1 << 24) return dm_fail(DM_ERR_UNSUPPORTED, "rows too long");
    G->team = G->chunks >= 32 ? 32 : G->chunks > 8 ? 16 : G->chunks > 4 ? 8 : G->chunks > 2 ? 4 : G->chunks > 1 ? 2 : 1;
    G->nch = (G->chunks + G->team - 1) / G->team;
    if (reductions && G->nch > GEN_MAX_NCH)
        return dm_fail(DM_ERR_UNSUPPORTED, "rows of %lld columns with a row reduction: more than %d "
                       "chunks per lane", (long long)p->cols, GEN_MAX_NCH);
    G->cols_pad = (p->cols + 31) / 32 * 32;
    /* one team's accumulators: nacc x its lanes' chunks x 8 floats, plus the padding that
     * staggers the teams of a warp across banks */
    if (p->nacc && ((int64_t)p->nacc * G->nch * G->team * 8 + G->team) * 4 > GEN_SMEM)
        return dm_fail(DM_ERR_UNSUPPORTED, "column accumulators of one team exceed shared memory");
    G->vec = p->vec;
    G->full = p->cols % 8 == 0;
    return DM_OK;
}

/* Plans and emits program G->p (G->p set; G->s_base etc. for a fused kernel) as the row
 * function dmg_rows<idx>: rows g0 + tw, g0 + tw + gs, ... below rend, a team each.
 * sld, pld: the fused kernel's tile row lengths (else 0). */
dm_status gen_rows_fn(gen_ctx *G, int idx, int sld, int pld, std::string &src) {
    const dmc_rowprog *p = G->p;
    dm_status s = gen_shape(G);
    if (s == DM_OK) s = plan_values(G);
    G->seg = 0;
    for (int q = 0; q < p->nops && s == DM_OK; q++) s = emit_op(G, &p->ops[q]);
    if (s != DM_OK) return s;
    close_segment(G, "");
    /* live rows (set_rows): the step's rows read from the device, the dropout's row from
     * the program's key map; two more parameters */
    int live = -1, key = -1;
    if (p->live) {
        if (G->nparam + 2 > DMG_MAXP)
            return dm_fail(DM_ERR_UNSUPPORTED, "row program: more than %d operands", DMG_MAXP);
        live = G->nparam++;
        G->params[live] = p->live;
        if (p->rowkey) G->params[key = G->nparam++] = p->rowkey;
    }
    gen_add(src, "\n/* program %d: %d ops, %lld rows x %lld columns */\n", idx, p->nops, (long long)p->rows,
        (long long)p->cols);
    gen_add(src, "enum { ROWS%d = %lld, COLS%d = %lld, NACC%d = %d };\n", idx, (long long)p->rows, idx,
        (long long)p->cols, idx, p->nacc);
    if (live >= 0)
        gen_add(src, "#define DMG_REND%d(P) (*(const long long *)(P).p[%d] * %lldLL)\n", idx, live,
            (long long)p->live_rpt);
    else gen_add(src, "#define DMG_REND%d(P) ROWS%d\n", idx, idx);
    gen_add(src, "template <int TEAM, int NCH> __host__ __device__ void dmg_rows%d(const dmg_ptrs &P, "
             "unsigned long long seed, float *acc, int lt, long long g0, long long gs, int tw, long long rend, "
             "const void *Ss, void *Ps) {\n", idx);
    gen_add(src, "    enum { VEC = %d, ACCW = NCH * TEAM * 8, SLD = %d, PLD = %d };\n", G->vec, sld, pld);
    gen_add(src, "    const long long ROWS = ROWS%d, COLS = COLS%d;\n", idx, idx);
    /* zero this lane's columns of the team's accumulators */
    if (p->nacc)
        gen_add(src, "    for (int a = 0; a < %d; a++) for (int c = 0; c < NCH; c++)\n"
                 "        DMC_UNROLL for (int e = 0; e < 8; e++) acc[a * ACCW + DMG_AT(c, e)] = 0.0f;\n",
            p->nacc);
    else gen_add(src, "    (void)acc;\n");
    gen_add(src, "    (void)seed; (void)ROWS; (void)Ss; (void)Ps;\n");
    for (int i = 0; i < G->nv; i++)
        if (G->v[i].array) gen_add(src, "    float R%d[NCH][8];\n", i);
    gen_add(src, "    for (long long rb = g0; rb < rend; rb += gs) {\n");
    gen_add(src, "        const long long rr = rb + tw;\n        const bool ok = rr < rend;\n"
             "        const long long r = ok ? rr : rend - 1;\n        (void)ok;\n");
    if (key >= 0)
        gen_add(src, "#define DMG_KEYROW ((long long)((const int *)P.p[%d])[r / %lldLL] * %lldLL + r %% %lldLL)\n", key,
            (long long)p->live_rpt, (long long)p->live_rpt, (long long)p->live_rpt);
    else gen_add(src, "#define DMG_KEYROW r\n");
    src += G->out;
    gen_add(src, "#undef DMG_KEYROW\n    }\n}\n");
    return DM_OK;
}

/* Appends kernel number `idx` for program p to src; shape into k. */
static dm_status gen_kernel(const dmc_rowprog *p, int idx, int sms, dmc_genk *k, std::string &src) {
    std::unique_ptr<gen_ctx> holder(new gen_ctx()); /* freed on every way out */
    gen_ctx *G = holder.get();
    G->p = p;
    DM_TRY(gen_rows_fn(G, idx, 0, 0, src));
    /* launch shape: 128 threads (4 warps), or fewer when the teams' accumulators need it.
     * A team's accumulators: nacc x (its lanes' chunks x 8) floats, lane-interleaved,
     * plus TEAM floats that stagger the teams of one warp across the banks. A program with
     * column sums gets no more blocks than the GPU holds at once (sms x blocks per SM by
     * shared memory, at most 8): each team then sums many rows, and there are few partials
     * to add. */
    int threads = 128;
    const int64_t accw = (int64_t)G->nch * G->team * 8, accw_host = (int64_t)G->chunks * 8;
    const int64_t tstride = (int64_t)p->nacc * accw + G->team; /* floats per team */
    while (p->nacc && threads > 32 && (threads / G->team) * tstride * 4 > GEN_SMEM) threads /= 2;
    const int teams = threads / G->team;
    int64_t blocks = (p->rows + teams - 1) / teams, cap = 65535;
    k->smem = p->nacc ? (size_t)(teams * tstride * 4) : 0;
    if (p->nacc) {
        int64_t per_sm = (int64_t)(200 * 1024) / (int64_t)k->smem;
        cap = (int64_t)sms * (per_sm < 1 ? 1 : per_sm > 8 ? 8 : per_sm);
    }
    k->threads = threads;
    k->teams = teams;
    k->blocks = (int)(blocks < cap ? blocks : cap);
    k->nparams = G->nparam;
    for (int q = 0; q < G->nparam; q++) k->params[q] = (void *)G->params[q];
    k->acc_floats = p->nacc * G->cols_pad; /* the partials' layout, as the interpreter's */

    /* The kernel: for NVRTC, and for the host's lane-by-lane simulation of the device
     * (DMG_SIM, genrt.cuh), which runs this very text with a thread per lane. */
    gen_add(src, "#if defined(__CUDACC_RTC__) || defined(DMG_SIM)\n");
    gen_add(src, "DMG_KERNEL(%d) dmg_k%d(const dmg_ptrs P, unsigned long long seed, float *part) {\n", threads, idx);
    gen_add(src, "    enum { TEAM = %d, NCH = %d, TPW = 32 / TEAM, WPB = %d };\n", G->team, G->nch, threads / 32);
    gen_add(src, "    const int lt = DMG_TID %% TEAM, tw = (DMG_TID %% 32) / TEAM, wib = DMG_TID / 32;\n");
    gen_add(src, "    const long long g0 = ((long long)DMG_BID * WPB + wib) * TPW, gs = (long long)DMG_NBLK * WPB * TPW;\n");
    if (p->nacc) {
        gen_add(src, "    DMG_SMEM(dmg_smem);\n");
        gen_add(src, "    float *acc = dmg_smem + (DMG_TID / TEAM) * %lld;\n", (long long)tstride);
    } else {
        gen_add(src, "    float *acc = 0; (void)part;\n");
    }
    gen_add(src, "    dmg_rows%d<TEAM, NCH>(P, seed, acc, lt, g0, gs, tw, DMG_REND%d(P), 0, 0);\n", idx, idx);
    if (p->nacc) {
        gen_add(src, "    DMG_SYNC();\n");
        gen_add(src, "    dmg_acc_out<TEAM, NCH>(dmg_smem, %d, %lld, NACC%d, COLS%d, %lld, part + (long long)DMG_BID * %lld, "
                 "DMG_TID, DMG_NTHR);\n",
            teams, (long long)tstride, idx, idx, (long long)G->cols_pad, (long long)k->acc_floats);
    }
    gen_add(src, "}\n#endif\n");
    /* the host entry: the simulation, or the same grid of teams of one lane, in order */
    gen_add(src, "#ifndef __CUDACC_RTC__\n");
    gen_add(src, "extern \"C\" int dmg_h%d(const dmg_ptrs *P, unsigned long long seed, float *part, int blocks) {\n", idx);
    gen_add(src, "#ifdef DMG_SIM\n    dmg_sim_run(%d, blocks, %lld, [&] { dmg_k%d(*P, seed, part); });\n    return 0;\n#else\n",
        threads, (long long)(k->smem / 4), idx);
    gen_add(src, "    const int teams = %d;\n", teams);
    if (p->nacc)
        gen_add(src, "    float *acc = (float *)calloc((size_t)teams * %lld, sizeof(float));\n    if (!acc) return 1;\n",
            (long long)(p->nacc * accw_host));
    else gen_add(src, "    float *acc = 0; (void)part;\n");
    gen_add(src, "    for (int b = 0; b < blocks; b++) {\n"
             "        for (int t = 0; t < teams; t++)\n"
             "            dmg_rows%d<1, %d>(*P, seed, acc ? acc + (size_t)t * %lld : 0, 0, (long long)b * teams + t, "
             "(long long)blocks * teams, 0, DMG_REND%d((*P)), 0, 0);\n",
        idx, G->chunks, (long long)(p->nacc * accw_host), idx);
    if (p->nacc)
        gen_add(src, "        dmg_acc_out<1, %d>(acc, teams, %lld, NACC%d, COLS%d, %lld, part + (long long)b * %lld, 0, 1);\n",
            G->chunks, (long long)(p->nacc * accw_host), idx, idx, (long long)G->cols_pad, (long long)k->acc_floats);
    gen_add(src, "    }\n");
    if (p->nacc) gen_add(src, "    free(acc);\n");
    gen_add(src, "    return 0;\n#endif\n}\n#endif\n");
    return DM_OK;
}

/* The C entry points catch what std::string and new throw: out of memory is a status. */
dm_status dmc_gen_eligible(const dmc_rowprog *p) {
    try {
        std::string src;
        dmc_genk k;
        return gen_kernel(p, 0, 132, &k, src);
    } catch (const std::bad_alloc &) {
        return dm_fail(DM_ERR_OOM, "out of memory generating a row kernel");
    }
}

dm_status dmc_gen_source(const dmc_rowprog *const *progs, int n, const dmc_attn *attns, int na,
                         int sms, dmc_genk *k, std::string *src) {
    try {
        *src = "#include \"cuda/genrt.cuh\"\n#ifndef __CUDACC_RTC__\n#include <stdlib.h>\n#endif\n";
        for (int i = 0; i < n; i++) DM_TRY(gen_kernel(progs[i], i, sms, &k[i], *src));
        for (int i = 0; i < na; i++) DM_TRY(gen_attn(&attns[i], n + i, &k[n + i], *src));
    } catch (const std::bad_alloc &) {
        return dm_fail(DM_ERR_OOM, "out of memory generating the row kernels");
    }
    return DM_OK;
}
