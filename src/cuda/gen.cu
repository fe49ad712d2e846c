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
 * column-sum kernel: deterministic, as the interpreter. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <memory>
#include <new>
#include <string>

#include "cuda/cuda_internal.h"
#include "cuda/genrt.cuh"
#include "cuda/rowmath.cuh"

enum { GEN_MAXV = 64, GEN_MAXSEG = 48, GEN_MAX_NCH = 8, GEN_SMEM = 48 * 1024 };

/* A value of the row: a global operand (one tensor row, addressed by kind) or a tensor
 * internal to the group (scratch slot), or a row scalar. */
typedef struct {
    int loc, kind, dt;
    const void *base; /* GLOBAL */
    int64_t rdiv;     /* GROUPED */
    int64_t slot;     /* SCRATCH */
    int param;        /* GLOBAL: index into the kernel's dmg_ptrs */
    int def_seg;      /* segment that computes it; -1: read from memory */
    int first_seg, last_seg; /* segments that use it (reads and the def) */
    int first_read_op, def_op; /* the first op that reads it, the op that writes it; -1 */
    int last_read_op;          /* the last op that reads it; -1 */
    int tensor;                /* global: its root tensor */
    int array;        /* 1: a row array (used across segments) */
    int loaded_seg;   /* segment in which its load was emitted, -1 none */
} gen_val;

typedef struct {
    const dmc_rowprog *p;
    gen_val v[GEN_MAXV];
    int nv, nparam;
    const void *params[DMG_MAXP];
    int seg;  /* current segment while planning or emitting */
    int team, nch, chunks, vec, full; /* full: every chunk has 8 columns */
    int64_t cols_pad;
    std::string rowscope, body, post, out; /* the segment being emitted */
    int red; /* reductions counter (unique names) */
    /* a fused attention kernel's row program: the value at s_base is read from the warp's
     * tile Ss, the one at p_base is also stored to Ps (the same tile: each lane reads its
     * chunks of S before it writes its chunks of P), SLD and PLD elements of the storage
     * type a row; P goes to memory too only if p_global */
    const void *s_base, *p_base;
    int p_global;
} gen_ctx;

static const char *type_name(int dt) {
    return dt == DMC_BF16 ? "__nv_bfloat16" : dt == DMC_F16 ? "__half" : "float";
}

static void add(std::string &s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(std::string &s, const char *fmt, ...) {
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

/* How many segments op kind k opens after the one it starts in. */
static int segs_opened(int k) {
    return k == DM_OP_SOFTMAX || k == DM_OP_LAYERNORM ? 2 : k == DM_OP_SOFTMAX_BWD || k == DM_OP_LAYERNORM_BWD ? 1 : 0;
}

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
    if (!x->array) add(G->body, "        float v%d[8];\n", vi);
    const char *ty = type_name(x->dt);
    if (G->s_base && x->loc == DMC_LOC_GLOBAL && x->base == G->s_base)
        add(G->body, "        dmg_ld8<1>(%s, (const %s *)Ss + (r - g0) * SLD + c0, n);\n", name, ty);
    else if (x->kind == DM_ARG_COLVEC)
        add(G->body, "        dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + c0, n);\n", name, ty, x->param);
    else if (x->kind == DM_ARG_GROUPED)
        add(G->body, "        dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + (r / %lldLL) * COLS + c0, n);\n",
            name, ty, x->param, (long long)x->rdiv);
    else
        add(G->body, "        dmg_ld8<VEC>(%s, (const %s *)P.p[%d] + r * COLS + c0, n);\n", name, ty,
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
        add(G->body, "        float v%d[8];\n", vi);
    }
    return name;
}

/* After value x's chunk is computed: stored if global (rounded first, so later uses in
 * the group see what memory holds). */
static void finish(gen_ctx *G, int vi) {
    gen_val *x = &G->v[vi];
    if (x->loc != DMC_LOC_GLOBAL) return;
    std::string a = x->array ? "R" + std::to_string(vi) + "[c]" : "v" + std::to_string(vi);
    const char *ty = type_name(x->dt);
    if (x->dt != DMC_F32) add(G->body, "        dmg_round8<%s>(%s);\n", ty, a.c_str());
    const int tile = G->p_base && x->base == G->p_base;
    if (tile) add(G->body, "        if (ok) dmg_st8<1>((%s *)Ps + (r - g0) * PLD + c0, %s, n);\n", ty, a.c_str());
    if (tile && !G->p_global) return;
    if (x->kind == DM_ARG_GROUPED)
        add(G->body, "        if (ok) dmg_st8<VEC>((%s *)P.p[%d] + (r / %lldLL) * COLS + c0, %s, n);\n", ty,
            x->param, (long long)x->rdiv, a.c_str());
    else
        add(G->body, "        if (ok) dmg_st8<VEC>((%s *)P.p[%d] + r * COLS + c0, %s, n);\n", ty, x->param,
            a.c_str());
}

/* A row scalar input: a scalar at row scope; an output: a name to assign. */
static std::string scalar_in(gen_ctx *G, int vi) {
    gen_val *x = &G->v[vi];
    char name[32];
    snprintf(name, sizeof name, "s%d", vi);
    if (x->loc == DMC_LOC_GLOBAL && x->loaded_seg < 0) {
        x->loaded_seg = G->seg;
        add(G->rowscope, "        const float s%d = dmg_f(((const %s *)P.p[%d])[r]);\n", vi,
            type_name(x->dt), x->param);
    }
    return name;
}

static void scalar_out(gen_ctx *G, int vi, const char *expr) {
    gen_val *x = &G->v[vi];
    add(G->rowscope, "        const float s%d = %s;\n", vi, expr);
    x->loaded_seg = G->seg;
    if (x->loc == DMC_LOC_GLOBAL)
        add(G->rowscope, "        if (ok && lt == 0) ((%s *)P.p[%d])[r] = dmg_to<%s>(s%d);\n",
            type_name(x->dt), x->param, type_name(x->dt), vi);
}

/* Ends the current segment: its row-scope lines, its chunk loop, then `after` (the
 * reductions), all into out. */
static void close_segment(gen_ctx *G, const std::string &after) {
    G->out += G->rowscope;
    if (!G->body.empty()) {
        /* the lane's chunks c0 = (c * TEAM + lt) * 8, n of their columns valid */
        add(G->out, "        %s for (int c = 0; c < NCH; c++) {\n"
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
                                                                          : "dmc_gelu_both";
}

/* The accumulator index of a COLACC operand. */
static int acc_index(const gen_ctx *G, const dmc_operand *d) {
    for (int a = 0; a < G->p->nacc; a++)
        if (G->p->acc_slot[a] == d->slot) return a;
    return -1;
}

static dm_status emit_op(gen_ctx *G, const dmc_rowop *op) {
    int in[DM_MAX_IN] = {0}, out[DM_MAX_OUT] = {0};
    for (int i = 0; i < op->nin; i++) DM_TRY(value_of(G, &op->in[i], &in[i]));
    for (int i = 0; i < op->nout; i++)
        if (op->out[i].kind != DM_ARG_COLACC) DM_TRY(value_of(G, &op->out[i], &out[i]));
    const int K = G->red++;
    std::string a, b, y, after;
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
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) ");
        if (op->kind == DM_OP_MUL) add(G->body, "%s[e] = %s[e] * %s[e];\n", Y, A, B);
        else if (op->kind == DM_OP_MASK_ADD && op->causal) /* keys after the query r % COLS */
            add(G->body, "%s[e] = fmaxf(%s[e] + (c0 + e <= r %% COLS ? 1.0f - %s[e] : 1.0f) * -3.40282347e+38f, %.9ef);\n",
                Y, A, B, (double)dmc_lowest(G->v[out[0]].dt));
        else if (op->kind == DM_OP_MASK_ADD)
            add(G->body, "%s[e] = fmaxf(%s[e] + (1.0f - %s[e]) * -3.40282347e+38f, %.9ef);\n", Y, A, B,
                (double)dmc_lowest(G->v[out[0]].dt));
        else if (op->kind == DM_OP_DROPOUT_BWD_NZ)
            add(G->body, "%s[e] = %s[e] != 0.0f ? %s[e] * %.9ef : 0.0f;\n", Y, B, A, (double)op->drop_scale);
        else add(G->body, "%s[e] = %s[e] + %s[e];\n", Y, A, B);
        finish(G, out[0]);
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD:
        a = chunk(G, in[0]);
        y = define(G, out[0]);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = %s[e];\n", y.c_str(), a.c_str());
        if (op->drop_on)
            add(G->body, "        dmg_drop8(%s, n, seed, %uu, (unsigned long long)r * COLS + c0, %uu, %.9ef);\n",
                y.c_str(), op->stream, op->drop_thr, (double)op->drop_scale);
        finish(G, out[0]);
        break;
    case DM_OP_ACT:
    case DM_OP_ACT_DERIV: {
        a = chunk(G, in[0]);
        y = define(G, out[0]);
        std::string d = op->kind == DM_OP_ACT_DERIV ? define(G, out[1]) : std::string();
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) { float g; %s[e] = %s(%s[e], &g);%s%s%s }\n",
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
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) { float g; (void)%s(%s[e], &g); %s[e] = %s[e] * g; }\n",
            act_fn(op->act), b.c_str(), y.c_str(), a.c_str());
        finish(G, out[0]);
        break;
    case DM_OP_COLSUM: {
        a = chunk(G, in[0]);
        int ai = acc_index(G, &op->out[0]);
        if (ai < 0) return dm_fail(DM_ERR_INTERNAL, "column sum without an accumulator");
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (ok && e < n) acc[%d * ACCW + DMG_AT(c, e)] += %s[e];\n", ai,
            a.c_str());
        break;
    }
    case DM_OP_SOFTMAX: {
        a = chunk(G, in[0]);
        add(G->rowscope, "        float m%d = -dmg_inf();\n", K);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) m%d = fmaxf(m%d, %s[e]);\n", K, K, a.c_str());
        add(after, "        m%d = dmg_max<TEAM>(m%d);\n", K, K);
        close_segment(G, after);
        after.clear();
        /* exp(x - m) is kept: a row array of its own (the output's slot is not yet live) */
        a = chunk(G, in[0]);
        add(G->out, "        float E%d[NCH][8];\n", K);
        add(G->rowscope, "        float t%d = 0.0f;\n", K);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) { E%d[c][e] = expf(%s[e] - m%d); if (e < n) t%d += E%d[c][e]; }\n",
            K, a.c_str(), K, K, K);
        add(after, "        const float inv%d = 1.0f / dmg_sum<TEAM>(t%d);\n", K, K);
        close_segment(G, after);
        y = define(G, out[0]);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = E%d[c][e] * inv%d;\n", y.c_str(), K, K);
        finish(G, out[0]);
        break;
    }
    case DM_OP_SOFTMAX_BWD: { /* in: dy, y; dx = y (dy - sum(dy y)) */
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        add(G->rowscope, "        float t%d = 0.0f;\n", K);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) t%d += %s[e] * %s[e];\n", K, a.c_str(), b.c_str());
        add(after, "        t%d = dmg_sum<TEAM>(t%d);\n", K, K);
        close_segment(G, after);
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        y = define(G, out[0]);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = %s[e] * (%s[e] - t%d);\n", y.c_str(),
            b.c_str(), a.c_str(), K);
        finish(G, out[0]);
        break;
    }
    case DM_OP_LAYERNORM: { /* in: x, gamma, beta; out: y, mean, rstd */
        a = chunk(G, in[0]);
        add(G->rowscope, "        float t%d = 0.0f;\n", K);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) t%d += %s[e];\n", K, a.c_str());
        add(after, "        const float mean%d = dmg_sum<TEAM>(t%d) / (float)COLS;\n", K, K);
        close_segment(G, after);
        after.clear();
        a = chunk(G, in[0]);
        add(G->rowscope, "        float q%d = 0.0f;\n", K);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) q%d += (%s[e] - mean%d) * (%s[e] - mean%d);\n", K,
            a.c_str(), K, a.c_str(), K);
        add(after, "        q%d = dmg_sum<TEAM>(q%d);\n", K, K);
        add(after, "        const float rstd%d = (float)(1.0 / sqrt((double)(q%d / (float)COLS) + %.17g));\n", K,
            K, op->eps);
        close_segment(G, after);
        a = chunk(G, in[0]);
        std::string gm = chunk(G, in[1]), bt = chunk(G, in[2]);
        y = define(G, out[0]);
        add(G->body, "        DMC_UNROLL for (int e = 0; e < 8; e++) %s[e] = (%s[e] - mean%d) * rstd%d * %s[e] + %s[e];\n",
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
        add(G->rowscope, "        float t%d = 0.0f, q%d = 0.0f;\n", K, K);
        add(G->body,
            "        DMC_UNROLL for (int e = 0; e < 8; e++) if (e < n) {\n"
            "            const float xh = (%s[e] - %s) * %s, g = %s[e] * %s[e];\n"
            "            t%d += g;\n"
            "            q%d += g * xh;\n"
            "            if (ok) { acc[%d * ACCW + DMG_AT(c, e)] += %s[e] * xh; acc[%d * ACCW + DMG_AT(c, e)] += %s[e]; }\n"
            "        }\n",
            b.c_str(), M, S, a.c_str(), gm.c_str(), K, K, ag, a.c_str(), ab, a.c_str());
        add(after, "        t%d = dmg_sum<TEAM>(t%d) * (1.0f / (float)COLS);\n", K, K);
        add(after, "        q%d = dmg_sum<TEAM>(q%d) * (1.0f / (float)COLS);\n", K, K);
        close_segment(G, after);
        a = chunk(G, in[0]);
        b = chunk(G, in[1]);
        gm = chunk(G, in[4]);
        y = define(G, out[0]);
        add(G->body,
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
static dm_status gen_rows_fn(gen_ctx *G, int idx, int sld, int pld, std::string &src) {
    const dmc_rowprog *p = G->p;
    dm_status s = gen_shape(G);
    if (s == DM_OK) s = plan_values(G);
    G->seg = 0;
    for (int q = 0; q < p->nops && s == DM_OK; q++) s = emit_op(G, &p->ops[q]);
    if (s != DM_OK) return s;
    close_segment(G, "");
    add(src, "\n/* program %d: %d ops, %lld rows x %lld columns */\n", idx, p->nops, (long long)p->rows,
        (long long)p->cols);
    add(src, "enum { ROWS%d = %lld, COLS%d = %lld, NACC%d = %d };\n", idx, (long long)p->rows, idx,
        (long long)p->cols, idx, p->nacc);
    add(src, "template <int TEAM, int NCH> __host__ __device__ void dmg_rows%d(const dmg_ptrs &P, "
             "unsigned long long seed, float *acc, int lt, long long g0, long long gs, int tw, long long rend, "
             "const void *Ss, void *Ps) {\n", idx);
    add(src, "    enum { VEC = %d, ACCW = NCH * TEAM * 8, SLD = %d, PLD = %d };\n", G->vec, sld, pld);
    add(src, "    const long long ROWS = ROWS%d, COLS = COLS%d;\n", idx, idx);
    /* zero this lane's columns of the team's accumulators */
    if (p->nacc)
        add(src, "    for (int a = 0; a < %d; a++) for (int c = 0; c < NCH; c++)\n"
                 "        DMC_UNROLL for (int e = 0; e < 8; e++) acc[a * ACCW + DMG_AT(c, e)] = 0.0f;\n",
            p->nacc);
    else add(src, "    (void)acc;\n");
    add(src, "    (void)seed; (void)ROWS; (void)Ss; (void)Ps;\n");
    for (int i = 0; i < G->nv; i++)
        if (G->v[i].array) add(src, "    float R%d[NCH][8];\n", i);
    add(src, "    for (long long rb = g0; rb < rend; rb += gs) {\n");
    add(src, "        const long long rr = rb + tw;\n        const bool ok = rr < rend;\n"
             "        const long long r = ok ? rr : rend - 1;\n        (void)ok;\n");
    src += G->out;
    add(src, "    }\n}\n");
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
    add(src, "#if defined(__CUDACC_RTC__) || defined(DMG_SIM)\n");
    add(src, "DMG_KERNEL(%d) dmg_k%d(const dmg_ptrs P, unsigned long long seed, float *part) {\n", threads, idx);
    add(src, "    enum { TEAM = %d, NCH = %d, TPW = 32 / TEAM, WPB = %d };\n", G->team, G->nch, threads / 32);
    add(src, "    const int lt = DMG_TID %% TEAM, tw = (DMG_TID %% 32) / TEAM, wib = DMG_TID / 32;\n");
    add(src, "    const long long g0 = ((long long)DMG_BID * WPB + wib) * TPW, gs = (long long)DMG_NBLK * WPB * TPW;\n");
    if (p->nacc) {
        add(src, "    DMG_SMEM(dmg_smem);\n");
        add(src, "    float *acc = dmg_smem + (DMG_TID / TEAM) * %lld;\n", (long long)tstride);
    } else {
        add(src, "    float *acc = 0; (void)part;\n");
    }
    add(src, "    dmg_rows%d<TEAM, NCH>(P, seed, acc, lt, g0, gs, tw, ROWS%d, 0, 0);\n", idx, idx);
    if (p->nacc) {
        add(src, "    DMG_SYNC();\n");
        add(src, "    dmg_acc_out<TEAM, NCH>(dmg_smem, %d, %lld, NACC%d, COLS%d, %lld, part + (long long)DMG_BID * %lld, "
                 "DMG_TID, DMG_NTHR);\n",
            teams, (long long)tstride, idx, idx, (long long)G->cols_pad, (long long)k->acc_floats);
    }
    add(src, "}\n#endif\n");
    /* the host entry: the simulation, or the same grid of teams of one lane, in order */
    add(src, "#ifndef __CUDACC_RTC__\n");
    add(src, "extern \"C\" int dmg_h%d(const dmg_ptrs *P, unsigned long long seed, float *part, int blocks) {\n", idx);
    add(src, "#ifdef DMG_SIM\n    dmg_sim_run(%d, blocks, %lld, [&] { dmg_k%d(*P, seed, part); });\n    return 0;\n#else\n",
        threads, (long long)(k->smem / 4), idx);
    add(src, "    const int teams = %d;\n", teams);
    if (p->nacc)
        add(src, "    float *acc = (float *)calloc((size_t)teams * %lld, sizeof(float));\n    if (!acc) return 1;\n",
            (long long)(p->nacc * accw_host));
    else add(src, "    float *acc = 0; (void)part;\n");
    add(src, "    for (int b = 0; b < blocks; b++) {\n"
             "        for (int t = 0; t < teams; t++)\n"
             "            dmg_rows%d<1, %d>(*P, seed, acc ? acc + (size_t)t * %lld : 0, 0, (long long)b * teams + t, "
             "(long long)blocks * teams, 0, ROWS%d, 0, 0);\n",
        idx, G->chunks, (long long)(p->nacc * accw_host), idx);
    if (p->nacc)
        add(src, "        dmg_acc_out<1, %d>(acc, teams, %lld, NACC%d, COLS%d, %lld, part + (long long)b * %lld, 0, 1);\n",
            G->chunks, (long long)(p->nacc * accw_host), idx, idx, (long long)G->cols_pad, (long long)k->acc_floats);
    add(src, "    }\n");
    if (p->nacc) add(src, "    free(acc);\n");
    add(src, "    return 0;\n#endif\n}\n#endif\n");
    return DM_OK;
}

/* --- fused attention kernels ---------------------------------------------------------- */

/* Offsets of batch item q in the operands of one GEMM, as C++ statements. */
static void batch_code(std::string &src, const dmc_batches &bt, const char *oa, const char *ob, const char *oc) {
    add(src, "    long long %s = 0, %s = 0, %s = 0;\n    {\n        long long t = q;\n", oa, ob, oc);
    for (int d = bt.nd - 1; d >= 0; d--)
        add(src, "        { const long long i = t %% %lldLL; t /= %lldLL; %s += i * %lldLL; %s += i * %lldLL; %s += i * %lldLL; }\n",
            (long long)bt.sz[d], (long long)bt.sz[d], oa, (long long)bt.sa[d], ob, (long long)bt.sb[d], oc,
            (long long)bt.sc[d]);
    add(src, "        (void)t;\n    }\n    (void)%s; (void)%s; (void)%s;\n", oa, ob, oc);
}

/* 1 if every matrix of operand X (base + batch offsets) starts `align`-byte aligned. */
static int batch_aligned(const void *base, const dmc_batches &bt, int which, int esz, int align) {
    if ((uintptr_t)base % (uintptr_t)align) return 0;
    for (int d = 0; d < bt.nd; d++) {
        int64_t st = which == 0 ? bt.sa[d] : which == 1 ? bt.sb[d] : bt.sc[d];
        if (bt.sz[d] > 1 && (st * esz) % align) return 0;
    }
    return 1;
}

/* The tile shape of fused kernel a. Per warp: its 16 rows of C1 rounded to the storage
 * type, LD elements a row, which the row ops overwrite with P in place (each lane its own
 * chunks), then a 16 x 16 fp32 tile through which accumulators are stored. A block: its
 * warps' rows, consecutive (GEMM 3 reads all of them), then their fp32 tiles. */
typedef struct {
    int warps, ld;
    int64_t block_floats, tiles;
} attn_shape;

static dm_status attn_check(const dmc_attn *a, attn_shape *sh) {
    const dm_gemm *g1 = &a->g1, *g2 = &a->g2, *g3 = &a->g3;
    const int esz = 2;
    if (a->dt != DMC_BF16 && a->dt != DMC_F16)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: tensor cores need bf16 or fp16 storage");
    if (g1->m % 16 || g1->n % 16 || g1->k % 16 || g2->n % 16 || g2->m != g1->m || g2->k != g1->n)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: sizes not multiples of 16");
    if (g1->k > 128 || g2->n > 128)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: head width above 128");
    if (g1->lda % 8 || g1->ldb % 8 || g2->ldb % 8)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: leading dimensions not multiples of 8");
    if (!batch_aligned(g1->A, a->b1, 0, esz, 32) || !batch_aligned(g1->B, a->b1, 1, esz, 32) ||
        !batch_aligned(g2->B, a->b2, 1, esz, 32))
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: operands not 32-byte aligned");
    if (a->has3 && (g3->m != g1->n || g3->k != g1->m || g3->n % 16 || g3->n > 128 || g3->ldb % 8 ||
                    !batch_aligned(g3->B, a->b3, 1, esz, 32)))
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the third GEMM's sizes or alignment");
    if (a->prog->nacc) return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: column sums in the row ops");
    /* 8 elements of padding: rows 16 bytes apart modulo 128, so the 8 rows a tensor-core
     * load reads at once (16 bytes each) fall in different banks; every tile base stays
     * 32-byte aligned (16 rows of LD are a multiple of 256 bytes) and LD a multiple of 8 */
    sh->ld = (int)(g1->n + 8);
    sh->tiles = a->b1.count * (g1->m / 16);
    const int64_t warp_bytes = 16 * (int64_t)sh->ld * esz + 256 * 4;
    if (a->has3) { /* a block per batch item: its rows of P are all GEMM 3 needs; at most
                    * 112 KiB of shared memory, so that two blocks share an SM (228 KiB on an
                    * H100, 1 KiB of it reserved per block) */
        sh->warps = g1->m / 16;
        if (sh->warps > 32 || sh->warps * warp_bytes > (int64_t)a->smem_max || sh->warps * warp_bytes > 112 * 1024)
            return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: %d rows of one item exceed a block", g1->m);
    } else {
        for (sh->warps = 4; sh->warps > 1; sh->warps /= 2)
            if (sh->warps * warp_bytes <= 100 * 1024 && sh->warps * warp_bytes <= (int64_t)a->smem_max) break;
        if (sh->warps * warp_bytes > (int64_t)a->smem_max)
            return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: rows of %d scores exceed shared memory", g1->n);
    }
    sh->block_floats = sh->warps * warp_bytes / 4;
    return DM_OK;
}

/* Accumulator tile ACC to DST (16 x 16 of the storage type, rows LD apart; 16-byte stores
 * if vec), through the warp's fp32 tile F: lanes lane, lane + 32, ... take 8 elements. */
static void emit_tile_out(std::string &src, const char *acc, const char *dst, const char *ld, int vec) {
    add(src, "        dmg_store_c(F, %s, 16);\n        DMG_WSYNC();\n", acc);
    add(src, "        for (int e = lane * 8; e < 256; e += TPW * TEAM * 8) {\n"
             "            float v[8];\n"
             "            dmg_ld8<1>(v, F + e, 8);\n"
             "            dmg_st8<%d>(%s + (long long)(e / 16) * (%s) + e %% 16, v, 8);\n"
             "        }\n        DMG_WSYNC();\n", vec, dst, ld);
}

/* C[16 x NN] = alpha * A op(B) over K: A a 16 x K tile of the storage type in shared memory
 * (akind declares and loads fragment pa for step kk), B streamed from memory. */
static void emit_gemm_out(std::string &src, const char *ST, const char *akind, int K, int NN, int TB, int LDB,
                          const char *B, float alpha, const char *C, int LDC, int vec) {
    add(src, "    {\n        dmg_fc acc[%d];\n        DMC_UNROLL for (int c2 = 0; c2 < %d; c2++) dmg_zero(acc[c2]);\n", NN / 16,
        NN / 16);
    add(src, "        for (int kk = 0; kk < %d; kk++) {\n", K / 16);
    add(src, "            %s\n", akind);
    add(src, "            DMC_UNROLL for (int c2 = 0; c2 < %d; c2++) {\n"
             "                dmg_fb<%s, %d> fb;\n"
             "                dmg_load_b(fb, %s + (%d ? (long long)c2 * 16 * %d + kk * 16 : (long long)kk * 16 * %d + c2 * 16), %d);\n"
             "                dmg_mma(acc[c2], pa, fb);\n            }\n        }\n",
        NN / 16, ST, TB, B, TB, LDB, LDB, LDB);
    add(src, "        for (int c2 = 0; c2 < %d; c2++) {\n        dmg_scale(acc[c2], %.9ef);\n", NN / 16, (double)alpha);
    char dst[64], ld[32];
    snprintf(dst, sizeof dst, "%s + c2 * 16", C);
    snprintf(ld, sizeof ld, "%d", LDC);
    emit_tile_out(src, "acc[c2]", dst, ld, vec);
    add(src, "        }\n    }\n");
}

/* Appends fused kernel number idx for a to src; shape into k. */
static dm_status gen_attn(const dmc_attn *a, int idx, dmc_genk *k, std::string &src) {
    attn_shape sh = {};
    DM_TRY(attn_check(a, &sh));
    std::unique_ptr<gen_ctx> holder(new gen_ctx());
    gen_ctx *G = holder.get();
    G->p = a->prog;
    G->s_base = a->g1.C;
    G->p_base = a->g2.A;
    G->p_global = a->p_in_memory;
    std::string rows;
    DM_TRY(gen_rows_fn(G, idx, sh.ld, sh.ld, rows));
    /* the row program reads C1 (S) and writes P, whole rows of both; the row ops write
     * nothing the GEMMs read from memory (other warps do) */
    const gen_val *S = NULL, *Pv = NULL;
    for (int i = 0; i < G->nv; i++) {
        const gen_val *x = &G->v[i];
        if (x->loc != DMC_LOC_GLOBAL) continue;
        if (x->base == G->s_base) {
            if (x->kind != DM_ARG_FULL || x->def_seg >= 0)
                return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops write the scores");
            S = x;
        }
        if (x->base == G->p_base) {
            if (x->kind != DM_ARG_FULL || x->def_seg < 0)
                return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops do not make GEMM 2's operand");
            Pv = x;
        }
        if (x->def_seg >= 0 && (x->base == a->g1.A || x->base == a->g1.B || x->base == a->g2.B ||
                                (a->has3 && (x->base == a->g3.B || x->base == a->g3.C)) || x->base == a->g2.C))
            return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops write a GEMM operand");
    }
    if (!S || !Pv) return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops do not join the GEMMs");
    /* P overwrites S in place, each lane its own chunks: S's first read must come no later
     * than the op that makes P (then its load precedes P's store in every lane) */
    if (S->first_read_op > Pv->def_op)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: P made before the scores are read");
    if (G->nparam + 6 > DMG_MAXP) return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: too many operands");
    const int pa1 = G->nparam, pb1 = pa1 + 1, pb2 = pa1 + 2, pc2 = pa1 + 3, pb3 = pa1 + 4, pc3 = pa1 + 5;
    G->params[pa1] = a->g1.A;
    G->params[pb1] = a->g1.B;
    G->params[pb2] = a->g2.B;
    G->params[pc2] = a->g2.C;
    G->params[pb3] = a->has3 ? a->g3.B : NULL;
    G->params[pc3] = a->has3 ? a->g3.C : NULL;
    const int np = G->nparam + 6;
    const int vec2 = batch_aligned(a->g2.C, a->b2, 2, 2, 16) && (a->g2.ldc * 2) % 16 == 0;
    const int vec3 = a->has3 && batch_aligned(a->g3.C, a->b3, 2, 2, 16) && (a->g3.ldc * 2) % 16 == 0;
    const char *ST = type_name(a->dt);
    const dm_gemm *g1 = &a->g1, *g2 = &a->g2, *g3 = &a->g3;

    src += rows;
    add(src, "/* fused kernel %d: per batch item (%lld) and 16 of its %d rows: [%d x %d] = %.9g op(A1) op(B1) "
             "(k %d) in shared memory, the row ops, [%d x %d] = %.9g P op(B2)", idx, (long long)a->b1.count, g1->m,
        g1->m, g1->n, (double)g1->alpha, g1->k, g2->m, g2->n, (double)g2->alpha);
    if (a->has3) add(src, "; then per item [%d x %d] = %.9g P^T op(B3)", g3->m, g3->n, (double)g3->alpha);
    add(src, " */\n");
    /* a warp's rows: GEMM 1, the row ops, GEMM 2 */
    add(src, "template <int TEAM, int NCH, int TPW> __host__ __device__ void dmg_att%d(const dmg_ptrs &P, "
             "unsigned long long seed, long long T, int lt, int tw, int lane, %s *Sw, float *F) {\n", idx, ST);
    add(src, "    enum { M = %d, N = %d, K1 = %d, LD = %d, MT = M / 16 };\n", g1->m, g1->n, g1->k, sh.ld);
    add(src, "    enum { LDA1 = %d, LDB1 = %d, TA1 = %d, TB1 = %d };\n", g1->lda, g1->ldb, g1->transA, g1->transB);
    add(src, "    const long long q = T / MT, i0 = (T %% MT) * 16, RB = q * M + i0;\n");
    batch_code(src, a->b1, "oa1", "ob1", "oc1");
    batch_code(src, a->b2, "oa2", "ob2", "oc2");
    add(src, "    const %s *A1 = (const %s *)P.p[%d] + oa1 + (TA1 ? i0 : i0 * LDA1);\n", ST, ST, pa1);
    add(src, "    const %s *B1 = (const %s *)P.p[%d] + ob1;\n", ST, ST, pb1);
    add(src, "    const %s *B2 = (const %s *)P.p[%d] + ob2;\n", ST, ST, pb2);
    add(src, "    %s *C2 = (%s *)P.p[%d] + oc2 + i0 * %d;\n", ST, ST, pc2, g2->ldc);
    /* GEMM 1: the warp's 16 rows of A1 held, B1 streamed per 16 columns */
    add(src, "    dmg_fa<%s, TA1> fa[K1 / 16];\n", ST);
    add(src, "    DMC_UNROLL for (int kk = 0; kk < K1 / 16; kk++) dmg_load_a(fa[kk], A1 + (TA1 ? (long long)kk * 16 * LDA1 : kk * 16), LDA1);\n");
    add(src, "    for (int ct = 0; ct < N / 16; ct++) {\n"
             "        dmg_fc acc;\n        dmg_zero(acc);\n"
             "        DMC_UNROLL for (int kk = 0; kk < K1 / 16; kk++) {\n"
             "            dmg_fb<%s, TB1> fb;\n"
             "            dmg_load_b(fb, B1 + (TB1 ? (long long)ct * 16 * LDB1 + kk * 16 : (long long)kk * 16 * LDB1 + ct * 16), LDB1);\n"
             "            dmg_mma(acc, fa[kk], fb);\n        }\n"
             "        dmg_scale(acc, %.9ef);\n", ST, (double)g1->alpha);
    emit_tile_out(src, "acc", "Sw + ct * 16", "LD", 1);
    add(src, "    }\n");
    add(src, "    dmg_rows%d<TEAM, NCH>(P, seed, 0, lt, RB, TPW, tw, RB + 16, Sw, Sw);\n", idx);
    add(src, "    DMG_WSYNC();\n");
    /* GEMM 2: P from shared memory (row-major), B2 streamed */
    char akind[160];
    snprintf(akind, sizeof akind, "dmg_fa<%s, 0> pa;\n            dmg_load_a(pa, Sw + kk * 16, LD);", ST);
    emit_gemm_out(src, ST, akind, g1->n, g2->n, g2->transB, g2->ldb, "B2", g2->alpha, "C2", g2->ldc, vec2);
    add(src, "}\n");
    if (a->has3) {
        /* GEMM 3, after every warp's rows: 16 rows t0.. of P^T (P column-major) over all
         * M rows of the item, times B3 */
        add(src, "template <int TEAM, int TPW> __host__ __device__ void dmg_att%d_3(const dmg_ptrs &P, long long q, "
                 "int t, int lane, const %s *Pall, float *F) {\n", idx, ST);
        add(src, "    enum { LD = %d };\n    const long long t0 = (long long)t * 16;\n", sh.ld);
        batch_code(src, a->b3, "oa3", "ob3", "oc3");
        add(src, "    const %s *B3 = (const %s *)P.p[%d] + ob3;\n", ST, ST, pb3);
        add(src, "    %s *C3 = (%s *)P.p[%d] + oc3 + t0 * %d;\n", ST, ST, pc3, g3->ldc);
        snprintf(akind, sizeof akind, "dmg_fa<%s, 1> pa;\n            dmg_load_a(pa, Pall + (long long)kk * 16 * LD + t0, LD);", ST);
        emit_gemm_out(src, ST, akind, g1->m, g3->n, g3->transB, g3->ldb, "B3", g3->alpha, "C3", g3->ldc, vec3);
        add(src, "}\n");
    }

    const int64_t items = a->b1.count;
    const int64_t blocks = a->has3 ? items : (sh.tiles + sh.warps - 1) / sh.warps;
    k->threads = 32 * sh.warps;
    k->teams = 0;
    k->blocks = (int)(blocks < 65535 ? blocks : 65535);
    k->smem = (size_t)(sh.block_floats * 4);
    k->nparams = np;
    for (int q = 0; q < np; q++) k->params[q] = (void *)G->params[q];
    k->acc_floats = 0;
    const int64_t rows_floats = (int64_t)sh.warps * 16 * sh.ld / 2; /* the block's rows, in floats */
    add(src, "#if defined(__CUDACC_RTC__) || defined(DMG_SIM)\n");
    add(src, "DMG_KERNEL(%d) dmg_k%d(const dmg_ptrs P, unsigned long long seed, float *part) {\n", k->threads, idx);
    add(src, "    enum { TEAM = %d, NCH = %d, TPW = 32 / TEAM, W = %d };\n", G->team, G->nch, sh.warps);
    add(src, "    (void)part;\n    DMG_SMEM(dmg_smem);\n");
    add(src, "    const int lane = DMG_TID %% 32, w = DMG_TID / 32;\n");
    add(src, "    %s *Pall = (%s *)dmg_smem, *Sw = Pall + (long long)w * 16 * %d;\n", ST, ST, sh.ld);
    add(src, "    float *F = dmg_smem + %lld + w * 256;\n", (long long)rows_floats);
    if (a->has3) {
        add(src, "    for (long long q = DMG_BID; q < %lldLL; q += DMG_NBLK) {\n", (long long)items);
        add(src, "        dmg_att%d<TEAM, NCH, TPW>(P, seed, q * W + w, lane %% TEAM, lane / TEAM, lane, Sw, F);\n", idx);
        add(src, "        DMG_SYNC();\n");
        add(src, "        for (int t = w; t < %d; t += W) dmg_att%d_3<TEAM, TPW>(P, q, t, lane, Pall, F);\n", g3->m / 16, idx);
        add(src, "        DMG_SYNC();\n    }\n");
    } else {
        add(src, "    for (long long T = (long long)DMG_BID * W + w; T < %lldLL; T += (long long)DMG_NBLK * W)\n"
                 "        dmg_att%d<TEAM, NCH, TPW>(P, seed, T, lane %% TEAM, lane / TEAM, lane, Sw, F);\n",
            (long long)sh.tiles, idx);
    }
    add(src, "}\n#endif\n");
    /* the host: the simulation, or each warp's part by a team of one, in order */
    add(src, "#ifndef __CUDACC_RTC__\n");
    add(src, "extern \"C\" int dmg_h%d(const dmg_ptrs *P, unsigned long long seed, float *part, int blocks) {\n", idx);
    add(src, "#ifdef DMG_SIM\n    dmg_sim_run(%d, blocks, %lld, [&] { dmg_k%d(*P, seed, part); });\n    return 0;\n#else\n",
        k->threads, (long long)sh.block_floats, idx);
    add(src, "    (void)part; (void)blocks;\n"
             "    float *S = (float *)malloc(sizeof(float) * %lld);\n    if (!S) return 1;\n"
             "    %s *Pall = (%s *)S;\n    float *F = S + %lld;\n", (long long)sh.block_floats, ST, ST, (long long)rows_floats);
    if (a->has3)
        add(src, "    for (long long q = 0; q < %lldLL; q++) {\n"
                 "        for (int w = 0; w < %d; w++) dmg_att%d<1, %d, 1>(*P, seed, q * %d + w, 0, 0, 0, Pall + w * 16 * %d, F);\n"
                 "        for (int t = 0; t < %d; t++) dmg_att%d_3<1, 1>(*P, q, t, 0, Pall, F);\n    }\n",
            (long long)items, sh.warps, idx, G->chunks, sh.warps, sh.ld, g3->m / 16, idx);
    else
        add(src, "    for (long long T = 0; T < %lldLL; T++) dmg_att%d<1, %d, 1>(*P, seed, T, 0, 0, 0, Pall, F);\n",
            (long long)sh.tiles, idx, G->chunks);
    add(src, "    free(S);\n    return 0;\n#endif\n}\n#endif\n");
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

dm_status dmc_gen_attn_eligible(const dmc_attn *a) {
    try {
        std::string src;
        dmc_genk k;
        return gen_attn(a, 0, &k, src);
    } catch (const std::bad_alloc &) {
        return dm_fail(DM_ERR_OOM, "out of memory generating a fused attention kernel");
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
