/* build.cu: the plan's groups as executor steps, once, when the executor is made: a
 * contraction as one cuBLAS call's operands (batch address arrays where its batch does not
 * merge into one stride), a run of row ops as one row program (operands in the arena, in a
 * tile temporary, or in the block's scratch), LayerNorm's statistics kept in fp32, and
 * which programs and attention groups the generator (src/cudagen/) turns into kernels. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaexec/exec.h"

extern "C" {
#include "core/philox.h"
}

/* 1 if x is dense and row-major in its logical letter order (size-1 letters aside): the
 * row kernel addresses rows as base + r * cols. Other layouts (the tuner's) are not run
 * by the CUDA row kernel yet; contractions take any layout through their strides. */
static int dense_rowmajor(const dm_tensor *x) {
    int64_t want = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        if (x->size[d] == 1) continue;
        if (x->stride[d] != want) return 0;
        want *= x->size[d];
    }
    return 1;
}

/* The op kinds the row kernel (rows.cu) implements: every kind of the operator table but
 * the contractions and the indexed ones below (tests/test_ops.c runs each on this
 * backend, so a kind without its case in rows.cu, emulate.cu or cudagen/gen.cu fails
 * there); anything else fails at init rather than leaving its outputs unwritten. */
static int row_kind_supported(dm_op_kind k) {
    /* the gather's scatter-add (a table accumulated by index) is no row program: a
     * group of its own, run by scatter.cu (build_scatter) */
    if (k == DM_OP_EMBED_BWD) return 0;
    return (unsigned)k < DM_NUM_OPS && dm_op_kind_class(k) != DM_CLASS_CONTRACTION;
}


/* Device address of tensor t's first element (views included) and its element type;
 * NULL if not materialized. The plan's byte offsets are for fp32: in a 2-byte storage
 * type the arena keeps the same element offsets in half the bytes. */
void *dmx_arena_ptr(const dm_cuda_exec *ex, int t, int *dt) {
    const dm_graph *g = ex->plan->g;
    int r = dm_tensor_root(g, t);
    if (ex->plan->offset[r] < 0) return NULL;
    if (ex->wide && ex->wide[r]) {
        *dt = DMC_F32;
        return ex->side + ex->side_off[r] + g->t[t].offset;
    }
    *dt = ex->dtype;
    return ex->arena + (ex->plan->offset[r] / 4 + g->t[t].offset) * ex->esz;
}

static void *tile_ptr(const dm_cuda_exec *ex, const dmc_tiles *tl, int t, int *dt) {
    const dm_graph *g = ex->plan->g;
    int r = dm_tensor_root(g, t);
    *dt = ex->dtype;
    for (int q = 0; q < tl->n; q++)
        if (tl->root[q] == r) return ex->temp + (tl->off[q] + g->t[t].offset) * ex->esz;
    return NULL;
}

/* The row run op k of a batched group belongs to (as build_group splits the group: a
 * contraction alone, or consecutive row ops over one iteration space); contractions -1. */
static int run_of(const dm_plan *plan, const dm_group *gr, int k) {
    int run = 0;
    for (int q = 1; q <= k; q++) {
        const dm_op *a = dmx_op_at(plan, gr, q - 1), *b = dmx_op_at(plan, gr, q);
        if (a->kind == DM_OP_CONTRACT || b->kind == DM_OP_CONTRACT || a->rows != b->rows ||
            a->cols != b->cols)
            run++;
    }
    return dmx_op_at(plan, gr, k)->kind == DM_OP_CONTRACT ? -1 : run;
}

/* The tiles of a batched group: every root not in memory that a contraction of the group
 * touches, or that row ops of two runs share. A root only one run touches lives in that
 * run's scratch (build_prog, run_private) and needs none. */
dm_status dmx_group_tiles(const dm_plan *plan, const dm_group *gr, dmc_tiles *tl) {
    const dm_graph *g = plan->g;
    memset(tl, 0, sizeof *tl);
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = dmx_op_at(plan, gr, k);
        for (int s = 0; s < op->nin + op->nout; s++) {
            int r = dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]);
            if (plan->in_memory[r]) continue;
            int known = 0, rk = run_of(plan, gr, k), shared = rk < 0;
            for (int q = 0; q < tl->n; q++) known |= tl->root[q] == r;
            if (known) continue;
            for (int k2 = 0; k2 < gr->nops && !shared; k2++) {
                if (k2 == k || run_of(plan, gr, k2) == rk) continue;
                const dm_op *o2 = dmx_op_at(plan, gr, k2);
                for (int s2 = 0; s2 < o2->nin + o2->nout; s2++)
                    shared |= dm_tensor_root(g, s2 < o2->nin ? o2->in[s2] : o2->out[s2 - o2->nin]) == r;
            }
            if (!shared) continue;
            if (tl->n >= DMC_MAX_TILES)
                return dm_fail(DM_ERR_INTERNAL, "batched group of %s: more than %d tile tensors",
                               dmx_op_at(plan, gr, 0)->name, DMC_MAX_TILES);
            tl->root[tl->n] = r;
            tl->off[tl->n] = tl->floats;
            tl->floats += (g->t[r].numel + 63) / 64 * 64; /* 128-byte aligned or more */
            tl->n++;
        }
    }
    return DM_OK;
}

static dm_status new_prog(dm_cuda_exec *ex, int *pi) {
    if (ex->nprogs == ex->cap_progs) {
        int cap = ex->cap_progs ? 2 * ex->cap_progs : 32;
        dmc_rowprog *p = (dmc_rowprog *)realloc(ex->hprogs, sizeof(dmc_rowprog) * (size_t)cap);
        if (!p) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
        ex->hprogs = p;
        dmc_launch *l = (dmc_launch *)realloc(ex->launch, sizeof(dmc_launch) * (size_t)cap);
        if (!l) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
        ex->launch = l;
        ex->cap_progs = cap;
    }
    *pi = ex->nprogs++;
    memset(&ex->hprogs[*pi], 0, sizeof(dmc_rowprog));
    memset(&ex->launch[*pi], 0, sizeof(dmc_launch));
    return DM_OK;
}

/* 1 if root r is touched by no op of group gr outside ops [k0, k1) (a batched group's
 * row run): it can then live in the block's scratch rather than in a tile. */
static int run_private(const dm_plan *plan, const dm_group *gr, int k0, int k1, int r) {
    const dm_graph *g = plan->g;
    for (int k = 0; k < gr->nops; k++) {
        if (k >= k0 && k < k1) continue;
        const dm_op *op = dmx_op_at(plan, gr, k);
        for (int s = 0; s < op->nin + op->nout; s++)
            if (dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]) == r) return 0;
    }
    return 1;
}

/* p->vec: 16-byte chunks are possible when every global row starts 16-byte aligned. Also
 * checks each global row operand is fp32 or the storage type. */
static dm_status choose_vec(const dm_cuda_exec *ex, dmc_rowprog *p) {
    const int64_t cols = p->cols;
    p->vec = 1;
    for (int k = 0; k < p->nops; k++)
        for (int io = 0; io < 2; io++) {
            const dmc_rowop *x = &p->ops[k];
            for (int s = 0; s < (io ? x->nout : x->nin); s++) {
                const dmc_operand *d = io ? &x->out[s] : &x->in[s];
                if (d->loc != DMC_LOC_GLOBAL || d->kind == DM_ARG_ROWSCALAR) continue;
                int es = d->dt == DMC_F32 ? 4 : 2;
                if ((uintptr_t)d->base % 16 || (cols * es) % 16) p->vec = 0;
                if (d->dt != DMC_F32 && d->dt != ex->dtype)
                    return dm_fail(DM_ERR_INTERNAL, "a row operand in neither fp32 nor the "
                                   "storage type");
            }
        }
    return DM_OK;
}

/* Launch shape of row program pi. Chunks of 8 columns per thread. Rows of at most 64
 * chunks without column sums: a row per team of 8, 16 or 32 lanes (a lane per chunk, two
 * at most), 256 threads per block. Otherwise a row per block with a thread per chunk (32
 * up to row_threads). The grid is a fixed function of the plan (and
 * DMOVE_CUDA_ROW_THREADS), so column sums add their per-block partials in the same order
 * on every run. Sets p->warp_rows, and p->scratch_floats for teams. */
static void choose_launch(dm_cuda_exec *ex, int pi) {
    dmc_rowprog *p = &ex->hprogs[pi];
    const int64_t rows = p->rows, cols = p->cols;
    dmc_launch *lc = &ex->launch[pi];
    const int64_t chunks = (cols + 7) / 8;
    p->warp_rows = chunks > 64 || p->nacc ? 0 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    if (p->warp_rows) {
        const int teams = 256 / p->warp_rows; /* rows a block runs at once */
        lc->threads = 256;
        p->scratch_floats = teams * p->acc_off; /* acc_off: one row's scratch */
        int64_t nb = (rows + teams - 1) / teams;
        lc->blocks = (int)(nb < 16384 ? nb : 16384);
    } else {
        int64_t t = (chunks + 31) / 32 * 32;
        lc->threads = (int)(t < ex->row_threads ? t : ex->row_threads);
        int64_t maxb = p->nacc ? 2048 : 16384;
        lc->blocks = (int)(rows < maxb ? rows : maxb);
    }
    lc->dt = ex->dtype;
    size_t bytes = (size_t)p->scratch_floats * sizeof(float);
    lc->global_scratch = (ex->flags & DM_CUDA_GLOBAL_SCRATCH) || bytes > (size_t)ex->smem_optin;
    lc->smem_bytes = lc->global_scratch ? 0 : bytes;
    /* global scratch is blocks x scratch bytes: fewer blocks, still a function of the plan */
    if (lc->global_scratch && lc->blocks > 1024) lc->blocks = 1024;
}

/* The row program of ops [k0, k1) of group gr (same rows x cols). tl: the group's tiles
 * (batched groups: every tensor not in memory is a full temporary), or NULL (row groups:
 * such tensors are rows of the block's scratch). Mirrors init_group in cpu/exec.c. */
static dm_status build_prog(dm_cuda_exec *ex, const dm_group *gr, int k0, int k1,
                            const dmc_tiles *tl, int *pi) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const dm_op *op0 = dmx_op_at(plan, gr, k0);
    if (k1 - k0 > DMC_MAX_ROWOPS)
        return dm_fail(DM_ERR_UNSUPPORTED, "group of %s: %d fused row ops; the CUDA backend runs "
                       "at most %d in one kernel", op0->name, k1 - k0, DMC_MAX_ROWOPS);
    DM_TRY(new_prog(ex, pi));
    dmc_rowprog *p = &ex->hprogs[*pi];
    const int64_t rows = op0->rows, cols = op0->cols;
    const int64_t cols_pad = (cols + 31) / 32 * 32; /* 128-byte aligned scratch rows */
    if (rows < 1 || cols < 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: empty iteration space", op0->name);
    int slot_root[DM_MAX_IN * DMC_MAX_ROWOPS];
    int nsl = 0;
    for (int k = k0; k < k1; k++) {
        const dm_op *op = dmx_op_at(plan, gr, k);
        dmc_rowop *x = &p->ops[k - k0];
        if (op->kind == DM_OP_CONTRACT || op->rows != rows || op->cols != cols)
            return dm_fail(DM_ERR_INTERNAL, "%s: not a row op of %s's iteration space", op->name,
                           op0->name);
        if (!row_kind_supported(op->kind))
            return dm_fail(DM_ERR_UNSUPPORTED, "%s: the CUDA backend has no kernel for op kind '%s' yet",
                           op->name, dm_op_kind_name(op->kind));
        x->kind = op->kind;
        x->nin = op->nin;
        x->nout = op->nout;
        x->act = op->act;
        x->stream = (uint32_t)op->stream;
        x->drop_on = op->p > 0;
        x->drop_thr = dm_dropout_threshold(op->p);
        x->drop_scale = op->p > 0 ? (float)(1.0 / (1.0 - op->p)) : 1.0f;
        x->causal = op->causal;
        x->eps = op->eps;
        x->nindex = op->nindex;
        for (int io = 0; io < 2; io++) {
            int n = io ? op->nout : op->nin;
            for (int s = 0; s < n; s++) {
                int t = io ? op->out[s] : op->in[s];
                dmc_operand *d = io ? &x->out[s] : &x->in[s];
                dm_arg_kind kind = io ? dm_arg_out(op->kind, s) : dm_arg_in(op->kind, s);
                d->kind = kind;
                int r = dm_tensor_root(g, t);
                /* in a batched group, a tensor only these row ops touch stays in scratch;
                 * one a GEMM or another run of the group touches is a tile */
                const int global = plan->in_memory[r] || (tl && !run_private(plan, gr, k0, k1, r));
                if (global && !dense_rowmajor(&g->t[t]))
                    return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s is not in the default "
                                   "(row-major) layout, which the CUDA row kernel needs so far (a "
                                   "plan from `dmove tune` chooses layouts for the CPU: leave out "
                                   "--plan with --device cuda)", op->name, g->t[t].name);
                if (kind == DM_ARG_COLACC) {
                    if (tl)
                        return dm_fail(DM_ERR_INTERNAL, "%s: column reduction inside a batched group",
                                       op->name);
                    if (p->nacc >= DMC_MAX_ACC)
                        return dm_fail(DM_ERR_UNSUPPORTED, "%s: more than %d column reductions in "
                                       "one group", op->name, DMC_MAX_ACC);
                    int dt = DMC_F32;
                    void *dst = dmx_arena_ptr(ex, t, &dt);
                    if (!dst || g->t[t].numel != cols)
                        return dm_fail(DM_ERR_INTERNAL, "%s: bad column reduction output", op->name);
                    d->loc = DMC_LOC_SCRATCH;
                    d->slot = p->nacc * cols_pad; /* shifted past the rows below */
                    p->acc_dst[p->nacc] = dst;
                    p->acc_dt[p->nacc] = dt;
                    p->acc_slot[p->nacc] = d->slot;
                    p->nacc++;
                    continue;
                }
                int64_t need = kind == DM_ARG_ROWSCALAR ? rows : kind == DM_ARG_COLVEC ? cols
                                                                                       : rows * cols;
                if (kind == DM_ARG_INDEXED) { /* a table gathered from: always in memory */
                    if (!plan->in_memory[r] || tl)
                        return dm_fail(DM_ERR_INTERNAL, "%s: table %s not in memory", op->name, g->t[t].name);
                    need = op->nindex * cols;
                }
                if (kind == DM_ARG_GROUPED) {
                    int64_t G = g->t[t].numel / cols;
                    if (G < 1 || g->t[t].numel % cols || rows % G)
                        return dm_fail(DM_ERR_INTERNAL, "%s: operand %s does not tile the rows",
                                       op->name, g->t[t].name);
                    d->rdiv = rows / G;
                    need = g->t[t].numel;
                }
                if (g->t[t].numel != need)
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s has %lld elements, expected %lld",
                                   op->name, g->t[t].name, (long long)g->t[t].numel, (long long)need);
                if (global) {
                    d->loc = DMC_LOC_GLOBAL;
                    d->tensor = r;
                    d->base = plan->in_memory[r] ? dmx_arena_ptr(ex, t, &d->dt) : tile_ptr(ex, tl, t, &d->dt);
                    if (!d->base)
                        return dm_fail(DM_ERR_INTERNAL, "%s: %s has no device memory", op->name,
                                       g->t[t].name);
                    continue;
                }
                /* internal to the group: a row of the block's scratch, one per root */
                int q = 0;
                while (q < nsl && slot_root[q] != r) q++;
                if (q == nsl) {
                    if (nsl >= (int)(sizeof slot_root / sizeof slot_root[0]))
                        return dm_fail(DM_ERR_INTERNAL, "too many scratch rows");
                    slot_root[nsl++] = r;
                }
                d->loc = DMC_LOC_SCRATCH;
                d->slot = q * cols_pad;
            }
        }
    }
    p->nops = k1 - k0;
    p->rows = rows;
    p->cols = cols;
    p->acc_off = nsl * cols_pad;
    p->acc_floats = p->nacc * cols_pad;
    for (int k = 0; k < p->nops; k++)
        for (int s = 0; s < p->ops[k].nout; s++)
            if (p->ops[k].out[s].kind == DM_ARG_COLACC) p->ops[k].out[s].slot += p->acc_off;
    for (int a = 0; a < p->nacc; a++) p->acc_slot[a] += p->acc_off;
    p->scratch_floats = p->acc_off + p->acc_floats;

    DM_TRY(choose_vec(ex, p));
    choose_launch(ex, *pi);
    return DM_OK;
}


static dm_status gemm_pointer_arrays(dm_cuda_exec *ex, dmc_step *st);

/* EMBED_BWD, a group of its own (fusion.c): its operands in memory, dense, row-major. */
static dm_status build_scatter(dm_cuda_exec *ex, const dm_group *gr, const dm_op *op, dmc_step *st) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    if (gr->nops != 1 || gr->nbatch > 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: an embedding gradient fused with other ops", op->name);
    int ts[3] = {op->in[0], op->in[1], op->out[0]}, dt[3];
    void *p[3];
    for (int s = 0; s < 3; s++) {
        int r = dm_tensor_root(g, ts[s]);
        p[s] = plan->in_memory[r] ? dmx_arena_ptr(ex, ts[s], &dt[s]) : NULL;
        if (!p[s] || !dense_rowmajor(&g->t[ts[s]]))
            return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s is not a dense row-major tensor in "
                           "memory, which the CUDA embedding gradient needs", op->name, g->t[ts[s]].name);
    }
    dmc_scatter *sc = &st->sc;
    sc->rows = op->rows;
    sc->cols = op->cols;
    sc->nindex = op->nindex;
    if (g->t[ts[0]].numel != op->rows * op->cols || g->t[ts[1]].numel != op->rows ||
        g->t[ts[2]].numel != op->nindex * op->cols)
        return dm_fail(DM_ERR_INTERNAL, "%s: operand sizes do not match %lld x %lld rows into %lld",
                       op->name, (long long)op->rows, (long long)op->cols, (long long)op->nindex);
    sc->dy = p[0];
    sc->idx = p[1];
    sc->table = p[2];
    sc->dy_dt = dt[0];
    sc->idx_dt = dt[1];
    sc->table_dt = dt[2];
    DM_TRY(dmc_scatter_plan(sc));
    DM_TRY(dmx_dev_alloc(ex, &st->work, dmc_scatter_work_bytes(sc), "the embedding gradient's work space"));
    dmc_scatter_bind(sc, st->work);
    st->scatter = 1;
    st->prog = -1;
    return DM_OK;
}

/* A "bjhp" operand of ATTN or ATTN_BWD: token rows (b, then j: ld apart), the heads P
 * apart, each head's P values together, in the storage type. */
static dm_status varlen_rows(dm_cuda_exec *ex, const dm_op *op, int t, int64_t P, void **p, int64_t *ld) {
    const dm_graph *g = ex->plan->g;
    const dm_tensor *x = &g->t[t];
    int dt = -1;
    *p = ex->plan->in_memory[dm_tensor_root(g, t)] ? dmx_arena_ptr(ex, t, &dt) : NULL;
    if (!*p || dt != ex->dtype || !dm_live_head_rows(g, t, P, ld))
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s must be in memory as token rows (letters bjhp, "
                       "layout bj first, each head's %lld values together)", op->name, x->name, (long long)P);
    return DM_OK;
}

/* Three of them (Q, K, V or their gradients, operands t[0..2]) at p[0..2], the row stride
 * they share at *ld; `what` names them in the refusal of unequal strides. */
static dm_status varlen_rows3(dm_cuda_exec *ex, const dm_op *op, const int *t, int64_t P, void **p, int64_t *ld,
                              const char *what) {
    for (int s = 0; s < 3; s++) {
        int64_t l;
        DM_TRY(varlen_rows(ex, op, t[s], P, &p[s], &l));
        if (s == 0) *ld = l;
        if (l != *ld) return dm_fail(DM_ERR_UNSUPPORTED, "%s: %s must have the same row stride", op->name, what);
    }
    return DM_OK;
}

/* ATTN or ATTN_BWD, a group of its own (fusion.c): varlen.cu. */
static dm_status build_varlen(dm_cuda_exec *ex, const dm_group *gr, const dm_op *op, dmc_step *st) {
    const dm_graph *g = ex->plan->g;
    const int bwd = op->kind == DM_OP_ATTN_BWD;
    if (gr->nops != 1 || gr->nbatch > 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: the attention runs as a group of its own", op->name);
    const dm_tensor *q = &g->t[op->in[0]], *len = &g->t[op->in[3]];
    dmc_varlen *v = &st->vl;
    v->bwd = bwd;
    v->causal = op->causal;
    v->keymask = op->keymask;
    v->dt = ex->dtype;
    v->B = q->size[0], v->J = q->size[1], v->H = q->size[2], v->P = q->size[3];
    v->alpha = op->alpha;
    v->drop = op->p > 0;
    v->scale = v->drop ? (float)(1.0 / (1.0 - op->p)) : 1.0f;
    v->thr = dm_dropout_threshold(op->p);
    v->stream = (uint32_t)op->stream;
    if (q->ndim != 4 || len->numel != (v->keymask ? v->B * v->J : v->B) || op->nindex != v->P || op->cols != v->J ||
        op->rows != v->B * v->H * v->J)
        return dm_fail(DM_ERR_INTERNAL, "%s: its rows, columns and head size do not match Q (%s)", op->name, q->name);
    void *p[3];
    DM_TRY(varlen_rows3(ex, op, op->in, v->P, p, &v->ldq, "Q, K and V"));
    v->q = p[0], v->k = p[1], v->v = p[2];
    const int tp = bwd ? op->in[4] : op->out[1];
    const dm_tensor *pr = &g->t[tp];
    int dl = -1, dp = -1;
    v->lengths = dmx_arena_ptr(ex, op->in[3], &dl);
    v->probs = dmx_arena_ptr(ex, tp, &dp);
    v->len_dt = dl;
    if (!v->lengths || !v->probs || dp != ex->dtype || !dense_rowmajor(pr) || strcmp(pr->letters, "bhjk") ||
        (dl != DMC_F32 && v->J > 256 && !v->keymask))
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: the %s and the probabilities (bhjk, dense) must be in memory",
                       op->name, v->keymask ? "attention mask" : "lengths (in fp32)");
    if (bwd) {
        void *d[3];
        DM_TRY(varlen_rows(ex, op, op->in[5], v->P, &d[0], &v->ldc));
        v->dctx = d[0];
        DM_TRY(varlen_rows3(ex, op, op->out, v->P, d, &v->ldd, "dQ, dK and dV"));
        v->dq = d[0], v->dk = d[1], v->dv = d[2];
        if (op->nin < 7)
            return dm_fail(DM_ERR_INTERNAL, "%s: the forward's context is not among its operands", op->name);
        DM_TRY(varlen_rows(ex, op, op->in[6], v->P, &v->ctx, &v->ldo));
    } else {
        void *c;
        DM_TRY(varlen_rows(ex, op, op->out[0], v->P, &c, &v->ldc));
        v->ctx = c;
    }
    /* flash.cu's kernels where they take the case (the forward and its backward decide
     * alike: the same operands), unless DMOVE_CUDA_FLASH=0 */
    const char *why = "DMOVE_CUDA_FLASH=0";
    v->flash = !dm_cuda_flash_off() && dmc_flash_ok(v, dmx_emulated(ex) ? 0 : (size_t)ex->smem_optin, &why);
    if (v->flash && bwd) DM_TRY(dmc_flash_bwd_check(v)); /* at build, not at the first step */
    if (v->flash && !dmx_emulated(ex)) DM_TRY(dmc_flash_allow_smem(v));
    ex->nflash += v->flash;
    if (!v->flash && !ex->flash_note[0])
        snprintf(ex->flash_note, sizeof ex->flash_note, "%s (head width %lld, %s storage)", why, (long long)v->P,
                 v->dt == DMC_BF16 ? "bf16" : v->dt == DMC_F16 ? "fp16" : "fp32");
    st->varlen = 1; /* its work space: exec.cu's, bound when every group is built */
    st->prog = -1;
    return DM_OK;
}

/* LINEAR_XENT or LINEAR_XENT_BWD, a group of its own (fusion.c): xent.cu. Every operand
 * in memory, dense, of the sizes its rows (m), cols (v) and nindex (e) say; t, W, bias
 * and the gradients in the storage type. */
static dm_status build_xent(dm_cuda_exec *ex, const dm_group *gr, const dm_op *op, dmc_step *st) {
    const dm_graph *g = ex->plan->g;
    const int bwd = op->kind == DM_OP_LINEAR_XENT_BWD;
    if (gr->nops != 1 || gr->nbatch > 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: the fused cross-entropy runs as a group of its own", op->name);
    dmc_xent *x = &st->xe;
    x->bwd = bwd;
    x->dt = ex->dtype;
    x->m = x->m_run = op->rows, x->v = op->cols, x->e = op->nindex;
    DM_TRY(dmc_xent_plan(x));
    /* in: t, W, bias, labels [, lse, dloss]; out: loss, lse, pred or dt, dW, dbias */
    void *p[9];
    int dt[9];
    for (int io = 0; io < 2; io++)
        for (int s = 0; s < (io ? op->nout : op->nin); s++) {
            const int t = io ? op->out[s] : op->in[s], at = io ? op->nin + s : s;
            const dm_tensor *xt = &g->t[t];
            const int64_t want = dm_linear_xent_numel(op->kind, io, s, x->m, x->e, x->v);
            /* the storage type: t, W, bias (in) and dt, dW, dbias (out of the backward) */
            const int storage = io ? bwd : s < 3;
            p[at] = ex->plan->in_memory[dm_tensor_root(g, t)] ? dmx_arena_ptr(ex, t, &dt[at]) : NULL;
            if (!p[at] || !dense_rowmajor(xt) || xt->numel != want || (storage && dt[at] != ex->dtype))
                return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s must be in memory, dense, of %lld elements%s",
                               op->name, xt->name, (long long)want, storage ? ", in the storage type" : "");
        }
    x->t = p[0], x->W = p[1], x->bias = p[2], x->labels = p[3], x->lab_dt = dt[3];
    if (bwd) {
        x->lse_in = p[4], x->dloss = p[5], x->in_dt[0] = dt[4], x->in_dt[1] = dt[5];
        x->dt_out = p[6], x->dW = p[7], x->dbias = p[8];
    } else {
        x->loss = p[4], x->lse = p[5], x->pred = p[6];
        for (int s = 0; s < 3; s++) x->out_dt[s] = dt[4 + s];
    }
    st->xent = 1; /* its work space: exec.cu's, bound when every group is built */
    st->prog = -1;
    return DM_OK;
}

dm_status dmx_build_group(dm_cuda_exec *ex, int gi, dmc_tiles *tl) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[gi];
    dmc_group *eg = &ex->groups[gi];
    eg->steps = (dmc_step *)calloc((size_t)(gr->nops > 0 ? gr->nops : 1), sizeof(dmc_step));
    if (!eg->steps) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    const int batched = gr->nbatch > 1;
    if (batched) DM_TRY(dmx_group_tiles(plan, gr, tl));
    int k = 0;
    while (k < gr->nops) {
        const dm_op *op = dmx_op_at(plan, gr, k);
        dmc_step *st = &eg->steps[eg->nsteps];
        if (op->kind == DM_OP_EMBED_BWD) {
            eg->nsteps++; /* first: dm_cuda_exec_free frees work of counted steps */
            DM_TRY(build_scatter(ex, gr, op, st));
            k++;
            continue;
        }
        if (op->kind == DM_OP_ATTN || op->kind == DM_OP_ATTN_BWD) {
            eg->nsteps++; /* first: dm_cuda_exec_free frees work of counted steps */
            DM_TRY(build_varlen(ex, gr, op, st));
            k++;
            continue;
        }
        if (op->kind == DM_OP_LINEAR_XENT || op->kind == DM_OP_LINEAR_XENT_BWD) {
            eg->nsteps++;
            DM_TRY(build_xent(ex, gr, op, st));
            k++;
            continue;
        }
        if (op->kind == DM_OP_CONTRACT) {
            if (!batched && gr->nops != 1)
                return dm_fail(DM_ERR_INTERNAL, "%s: a contraction fused with other ops outside a "
                               "batched group", op->name);
            void *p[3];
            int ts[3] = {op->in[0], op->in[1], op->out[0]};
            for (int s = 0; s < 3; s++) {
                int r = dm_tensor_root(g, ts[s]), dt = DMC_F32;
                p[s] = plan->in_memory[r] ? dmx_arena_ptr(ex, ts[s], &dt)
                       : batched           ? tile_ptr(ex, tl, ts[s], &dt)
                                           : NULL;
                if (!p[s])
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s has no device memory", op->name,
                                   g->t[ts[s]].name);
                if (dt != ex->dtype)
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s is not in the storage type",
                                   op->name, g->t[ts[s]].name);
            }
            /* dm_gemm_map_prepare does float pointer arithmetic from the operands' first
             * elements: its results are turned back into element offsets, and those into
             * device addresses of the storage type */
            DM_TRY(dm_gemm_map_prepare(&st->gm, g, op, (float *)p[0], (float *)p[1], (float *)p[2]));
            {
                /* swapped: gm's A is the op's second input, its B the first */
                char *pa = (char *)p[st->gm.swapped ? 1 : 0], *pb = (char *)p[st->gm.swapped ? 0 : 1];
                st->gm.A = (float *)(pa + (st->gm.A - (float *)pa) * ex->esz);
                st->gm.B = (float *)(pb + (st->gm.B - (float *)pb) * ex->esz);
                st->gm.C = (float *)((char *)p[2] + (st->gm.C - (float *)p[2]) * ex->esz);
            }
            st->gemm = 1;
            eg->nsteps++; /* first: dm_cuda_exec_free frees ptrs of counted steps */
            DM_TRY(gemm_pointer_arrays(ex, st));
            k++;
            continue;
        }
        /* a run of row ops over one iteration space */
        int k1 = k + 1;
        while (k1 < gr->nops) {
            const dm_op *o2 = dmx_op_at(plan, gr, k1);
            if (o2->kind == DM_OP_CONTRACT || o2->rows != op->rows || o2->cols != op->cols) break;
            k1++;
        }
        /* outside batched groups, scratch rows cannot cross kernels: the run must be the
         * whole group, over the group's iteration space */
        if (!batched && (k != 0 || k1 != gr->nops || op->rows != gr->rows || op->cols != gr->cols))
            return dm_fail(DM_ERR_INTERNAL, "group of %s: ops over different iteration spaces",
                           op->name);
        DM_TRY(build_prog(ex, gr, k, k1, batched ? tl : NULL, &st->prog));
        st->gemm = 0;
        eg->nsteps++;
        k = k1;
    }
    return DM_OK;
}

/* Non-fp32 storage: the tensors that only row ops touch as row scalars (LayerNorm's mean
 * and rstd, saved for backward) stay fp32, in the side buffer: statistics in fp32. */
dm_status dmx_init_wide(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    ex->wide = (char *)calloc((size_t)g->nt, 1);
    ex->side_off = (int64_t *)calloc((size_t)g->nt, sizeof(int64_t));
    char *no = (char *)calloc((size_t)g->nt, 1);
    if (!ex->wide || !ex->side_off || !no) {
        free(no);
        return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    }
    for (int o = 0; o < g->nop; o++) {
        const dm_op *op = &g->op[o];
        for (int s = 0; s < op->nin + op->nout; s++) {
            int t = s < op->nin ? op->in[s] : op->out[s - op->nin];
            int r = dm_tensor_root(g, t);
            dm_arg_kind k = s < op->nin ? dm_arg_in(op->kind, s) : dm_arg_out(op->kind, s - op->nin);
            /* row statistics, and the attention's lengths (whole numbers to 512 and beyond) */
            if (k == DM_ARG_ROWSCALAR || ((op->kind == DM_OP_ATTN || op->kind == DM_OP_ATTN_BWD) && s == 3))
                ex->wide[r] = 1;
            else no[r] = 1;
        }
    }
    ex->side_floats = 0;
    for (int r = 0; r < g->nt; r++) {
        ex->wide[r] = ex->wide[r] && !no[r] && g->t[r].base < 0 && plan->offset[r] >= 0;
        if (!ex->wide[r]) continue;
        ex->side_off[r] = (int64_t)ex->side_floats;
        ex->side_floats += (size_t)(g->t[r].numel + 63) / 64 * 64;
    }
    free(no);
    if (!ex->side_floats) return DM_OK;
    DM_TRY(dmx_dev_alloc(ex, (void **)&ex->side, ex->side_floats * sizeof(float), "row statistics"));
    if (!dmx_emulated(ex)) /* emulated memory comes zeroed from dev_alloc */
        DMC_CUDA(cudaMemsetAsync(ex->side, 0, ex->side_floats * sizeof(float), ex->stream));
    return DM_OK;
}

/* Group gi as one fused kernel (dmc_attn): steps GEMM, row program, GEMM (and a GEMM
 * more), the first GEMM's output a tile the row ops read, the others' A operand one they
 * write (the second's plain, the third's transposed: P^T), row r of both being row r % m
 * of batch item r / m of the GEMMs. 0 if not (or not 16-bit storage). */
static int attn_pattern(const dm_cuda_exec *ex, int gi, dmc_attn *a) {
    const dmc_group *eg = &ex->groups[gi];
    if (ex->dtype == DM_CUDA_FP32 || ex->plan->groups[gi].nbatch <= 1) return 0;
    if (eg->nsteps != 3 && eg->nsteps != 4) return 0;
    const dmc_step *s0 = &eg->steps[0], *s1 = &eg->steps[1], *s2 = &eg->steps[2];
    if (!s0->gemm || s1->gemm || !s2->gemm || (eg->nsteps == 4 && !eg->steps[3].gemm)) return 0;
    memset(a, 0, sizeof *a);
    a->prog = &ex->hprogs[s1->prog];
    a->g1 = s0->gm;
    a->g2 = s2->gm;
    a->has3 = eg->nsteps == 4;
    if (a->has3) { /* the plain one is GEMM 2, the transposed one GEMM 3 */
        a->g3 = eg->steps[3].gm;
        a->tail_step = 3;
        if (a->g2.transA) {
            a->tail_step = 2;
            dm_gemm_map t = a->g2;
            a->g2 = a->g3;
            a->g3 = t;
        }
    }
    a->dt = ex->dtype;
    a->smem_max = (size_t)ex->smem_optin;
    const dm_gemm_map *g1 = &a->g1, *g2 = &a->g2, *g3 = &a->g3;
    const char *temp_end = ex->temp + ex->temp_floats * (size_t)ex->esz;
    const int s_tile = (const char *)g1->C >= ex->temp && (const char *)g1->C < temp_end;
    a->p_in_memory = !((const char *)g2->A >= ex->temp && (const char *)g2->A < temp_end);
    if (!s_tile || g1->beta != 0.0f || g2->beta != 0.0f || g2->transA) return 0;
    const int64_t cols = a->prog->cols;
    if (g1->n != cols || g1->ldc != cols || g2->k != cols || g2->lda != cols || g2->m != g1->m) return 0;
    if (a->has3 && (g3->A != g2->A || !g3->transA || g3->beta != 0.0f || g3->lda != cols || g3->k != g1->m))
        return 0;
    dmc_gemm_batches(g1, &a->b1);
    dmc_gemm_batches(g2, &a->b2);
    if (a->has3) dmc_gemm_batches(g3, &a->b3);
    if (a->b1.count != a->b2.count || a->prog->rows != a->b1.count * g1->m) return 0;
    if (a->has3 && a->b3.count != a->b1.count) return 0;
    for (int64_t q = 0; q < a->b1.count; q++) {
        int64_t oa, ob, oc;
        dmc_batch_offsets(&a->b1, q, &oa, &ob, &oc);
        if (oc != q * g1->m * cols) return 0;
        dmc_batch_offsets(&a->b2, q, &oa, &ob, &oc);
        if (oa != q * g1->m * cols) return 0;
        if (!a->has3) continue;
        dmc_batch_offsets(&a->b3, q, &oa, &ob, &oc);
        if (oa != q * g1->m * cols) return 0;
    }
    return 1;
}

/* DM_CUDA_GEN: every program the generator takes (cudagen/gen.cu: row reductions over at most
 * 2048 columns, ...) runs as a kernel of its own, and every batched group of attention's
 * shapes (forward; backward when an item's rows fit a block) as one fused kernel (unless
 * DMOVE_CUDA_FUSE=0), compiled here in one NVRTC program; the rest stay with the
 * interpreter and cuBLAS (DMOVE_CUDA_DUMP=FILE writes the generated source). */
dm_status dmx_init_gen(dm_cuda_exec *ex) {
    const size_t np = (size_t)(ex->nprogs > 0 ? ex->nprogs : 1), ng = (size_t)(ex->ngroups > 0 ? ex->ngroups : 1);
    ex->gen_of = (int *)malloc(sizeof(int) * np);
    const dmc_rowprog **list = (const dmc_rowprog **)malloc(sizeof(void *) * np);
    dmc_attn *attns = (dmc_attn *)malloc(sizeof(dmc_attn) * ng);
    int *attn_group = (int *)malloc(sizeof(int) * ng);
    char *in_attn = (char *)calloc(np, 1);
    if (!ex->gen_of || !list || !attns || !attn_group || !in_attn) {
        free(list);
        free(attns);
        free(attn_group);
        free(in_attn);
        return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    }
    int na = 0;
    const char *fz = getenv("DMOVE_CUDA_FUSE"); /* =0: no fused attention kernels */
    for (int gi = 0; gi < ex->ngroups && !(fz && !strcmp(fz, "0")); gi++) {
        if (!attn_pattern(ex, gi, &attns[na])) continue;
        int tail = 0;
        if (dmc_gen_attn_eligible(&attns[na]) != DM_OK) {
            /* an item's rows too many for one block: the kernel stores P (attention's
             * d scores) to its tile, and GEMM 3 runs after it, by cuBLAS */
            if (!attns[na].has3) continue;
            attns[na].has3 = 0;
            attns[na].p_in_memory = 1;
            if (dmc_gen_attn_eligible(&attns[na]) != DM_OK) continue;
            tail = attns[na].tail_step;
        }
        in_attn[ex->groups[gi].steps[1].prog] = 1;
        ex->groups[gi].tail = tail;
        attn_group[na++] = gi;
    }
    ex->ngen = 0;
    for (int i = 0; i < ex->nprogs; i++) {
        ex->gen_of[i] = -1;
        /* a program inside a fused kernel gets a kernel of its own only for auto, which
         * may find cuBLAS around it faster than the fused kernel */
        if ((in_attn[i] && !(ex->flags & DM_CUDA_AUTO)) || dmc_gen_eligible(&ex->hprogs[i]) != DM_OK)
            continue; /* fused, or interpreted */
        ex->gen_of[i] = ex->ngen;
        list[ex->ngen++] = &ex->hprogs[i];
    }
    dm_clear_error(); /* a program the generator does not take is no error */
    for (int q = 0; q < na; q++) ex->groups[attn_group[q]].fused = 1 + ex->ngen + q;
    ex->nfused = na;
    const int mode = !dmx_emulated(ex) ? 0 : (ex->flags & DM_CUDA_SIM_LANES) ? 2 : 1;
    dm_status s = ex->ngen + na ? dmc_gen_build(&ex->gen, list, ex->ngen, attns, na, mode, ex->device) : DM_OK;
    if ((s == DM_ERR_NOT_FOUND || s == DM_ERR_BACKEND) && (ex->flags & DM_CUDA_AUTO)) {
        /* auto chooses whatever runs fastest, and kernels NVRTC or the driver cannot build
         * or load do not run (no toolkit headers, an architecture NVRTC does not know):
         * the row groups and attention keep the interpreter and cuBLAS (bias epilogues,
         * cuBLASLt's, are still weighed); the reason is kept for the user */
        snprintf(ex->gen_note, sizeof ex->gen_note, "%s", dm_last_error());
        for (int i = 0; i < ex->nprogs; i++) ex->gen_of[i] = -1;
        for (int q = 0; q < na; q++) {
            ex->groups[attn_group[q]].fused = 0;
            ex->groups[attn_group[q]].tail = 0;
        }
        ex->ngen = ex->nfused = 0;
        ex->gen = NULL;
        dm_clear_error();
        s = DM_OK;
    }
    free(list);
    free(attns);
    free(attn_group);
    free(in_attn);
    DM_TRY(s);
    return DM_OK;
}

const char *dm_cuda_exec_gen_note(const dm_cuda_exec *ex) { return ex ? ex->gen_note : ""; }

/* The row programs of the plan that run generated code: inside a fused kernel, or as a
 * kernel of their own (a bias group a cuBLASLt epilogue absorbed runs nothing: not
 * counted). */
int dm_cuda_exec_generated(const dm_cuda_exec *ex, int *programs) {
    if (programs) *programs = ex ? ex->nprogs : 0;
    int n = 0;
    for (int gi = 0; ex && gi < ex->ngroups; gi++) {
        const dmc_group *eg = &ex->groups[gi];
        for (int k = 0; k < eg->nsteps && !eg->skip; k++) {
            const dmc_step *st = &eg->steps[k];
            n += dmx_step_rows(st) && (eg->fused || (ex->gen_of && ex->gen_of[st->prog] >= 0));
        }
    }
    return n;
}

int dm_cuda_exec_fused(const dm_cuda_exec *ex) { return ex ? ex->nfused : 0; }
int dm_cuda_exec_flash(const dm_cuda_exec *ex) { return ex ? ex->nflash : 0; }
const char *dm_cuda_exec_flash_note(const dm_cuda_exec *ex) { return ex ? ex->flash_note : ""; }

int dm_cuda_exec_fused_tails(const dm_cuda_exec *ex) {
    int n = 0;
    for (int gi = 0; ex && gi < ex->ngroups; gi++) n += ex->groups[gi].fused && ex->groups[gi].tail;
    return n;
}


/* A contraction whose batch does not merge into one stride (attention's (b, h) over
 * head-interleaved activations) runs as one cublasGemmBatchedEx over arrays of matrix
 * addresses, made here once (the arena does not move): B's, A's, C's, `count` each. */
static dm_status gemm_pointer_arrays(dm_cuda_exec *ex, dmc_step *st) {
    dmc_batches bt;
    dmc_gemm_batches(&st->gm, &bt);
    if (bt.nd <= 1 || dmx_emulated(ex)) return DM_OK; /* one strided-batched call, or emulating */
    if (bt.count > INT_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "a batched contraction of %lld matrices exceeds cuBLAS's "
                       "batch count range", (long long)bt.count);
    size_t n = (size_t)bt.count;
    const void **h = (const void **)malloc(3 * n * sizeof(void *));
    if (!h) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    const int64_t es = ex->esz;
    for (size_t q = 0; q < n; q++) {
        int64_t oa, ob, oc;
        dmc_batch_offsets(&bt, (int64_t)q, &oa, &ob, &oc);
        h[q] = (const char *)st->gm.B + ob * es;
        h[n + q] = (const char *)st->gm.A + oa * es;
        h[2 * n + q] = (const char *)st->gm.C + oc * es;
    }
    dm_status s = dmx_dev_alloc(ex, (void **)&st->ptrs, 3 * n * sizeof(void *), "GEMM batch addresses");
    if (s == DM_OK) s = dmx_dev_copy(ex, st->ptrs, h, 3 * n * sizeof(void *), cudaMemcpyHostToDevice);
    free(h);
    st->nptrs = (int)n;
    return s;
}
