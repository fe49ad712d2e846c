/* exec.c: the CPU group executor. A contraction group is one dm_gemm. Any other group
 * runs row by row: each thread takes a static block of rows and, for each row, runs the
 * group's ops in order; tensors internal to the group live in that thread's scratch
 * rows (L1/L2-resident), tensors that leave it are read and written in the arena once.
 * Column reductions accumulate per thread and are summed in a second parallel loop, so
 * results are deterministic for a given thread count. */
#include "cpu/exec.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/hugealloc.h"
#include "core/status.h"
#include "core/sysinfo.h"
#include "cpu/stream.h"

dm_cpu_mem dm_cpu_mem_of(const dm_plan *plan, char *arena, char *act) {
    return (dm_cpu_mem){plan, arena, act ? act : arena + (plan->arena_bytes - plan->activation_bytes)};
}

float *dm_cpu_mem_ptr(const dm_cpu_mem *m, int t) {
    const dm_graph *g = m->plan->g;
    float *p = (float *)dm_plan_root_addr(m->plan, m->arena, m->act, dm_tensor_root(g, t));
    return p ? p + g->t[t].offset : NULL;
}

float *dm_cpu_tensor_ptr(const dm_plan *plan, char *arena, int t) {
    const dm_cpu_mem m = dm_cpu_mem_of(plan, arena, NULL);
    return dm_cpu_mem_ptr(&m, t);
}

void dm_cpu_eltwise_row(const dm_row *rw);
void dm_cpu_norm_row(const dm_row *rw);

void dm_cpu_row(const dm_row *rw) {
    if (dm_op_kind_class(rw->op->kind) == DM_CLASS_NORMALIZATION) dm_cpu_norm_row(rw);
    else dm_cpu_eltwise_row(rw);
}

static float g_tile_placeholder[1]; /* operand address for GEMM tiles (replaced per call) */

/* Scratch slot of an internal tensor: per-thread rows (row groups) or tiles (batched
 * groups); `need` floats each. Returns the float offset of the slot. */
static int64_t scratch_slot(int *slot_t, int64_t *slot_off, int *nsl, int64_t *used, int r,
                            int64_t need) {
    for (int q = 0; q < *nsl; q++)
        if (slot_t[q] == r) return slot_off[q];
    slot_t[*nsl] = r;
    slot_off[*nsl] = *used;
    (*nsl)++;
    *used += (need + 15) / 16 * 16;
    return slot_off[*nsl - 1];
}

/* How a row op addresses row r of memory operand t. The op's rows x cols iteration
 * space is the tensor's letters in logical order with the last ones (whose sizes make
 * cols; none for a ROWSCALAR) as columns. Row kernels vectorize along the columns, so
 * those must stay contiguous and innermost; the row letters may lie in any order (their
 * strides are kept and row r is decomposed over them). */
dm_status dm_cpu_row_map(const dm_graph *g, const dm_op *op, int t, int64_t cols, dm_operand *d) {
    const dm_tensor *x = &g->t[t];
    int nc = 0;
    int64_t prod = 1;
    if (d->kind == DM_ARG_FULL || d->kind == DM_ARG_GROUPED)
        while (prod < cols && nc < x->ndim) prod *= x->size[x->ndim - 1 - nc++];
    if (prod != (d->kind == DM_ARG_ROWSCALAR ? 1 : cols))
        return dm_fail(DM_ERR_INTERNAL, "%s: the columns of %s are not its last letters", op->name, x->name);
    int64_t want = 1;
    for (int q = x->ndim - 1; q >= x->ndim - nc; q--) {
        if (x->size[q] > 1 && x->stride[q] != want)
            return dm_fail(DM_ERR_UNSUPPORTED,
                           "%s: the layout of %s does not keep its columns (the last %d letters of "
                           "'%s') contiguous and innermost, as row kernels need", op->name, x->name, nc,
                           x->letters);
        want *= x->size[q];
    }
    int dflt = 1;
    for (int q = x->ndim - nc - 1; q >= 0; q--) {
        if (x->size[q] > 1 && x->stride[q] != want) dflt = 0;
        want *= x->size[q];
    }
    if (dflt) return DM_OK;
    if (d->kind == DM_ARG_GROUPED)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: %s must keep its default layout", op->name, x->name);
    for (int q = 0; q < x->ndim - nc; q++) {
        d->rsize[d->nrl] = x->size[q];
        d->rstride[d->nrl] = x->stride[q];
        d->nrl++;
    }
    return DM_OK;
}

/* A T input or X output: the table, in memory in its default layout (row n at n * cols),
 * nindex x cols elements. */
static dm_status table_operand(const dm_plan *plan, const dm_cpu_mem *arena, const dm_op *op, int t, dm_operand *d) {
    const dm_graph *g = plan->g;
    if (!plan->in_memory[dm_tensor_root(g, t)] || g->t[t].numel != op->nindex * op->cols)
        return dm_fail(DM_ERR_INTERNAL, "%s: table %s is not in memory or not %lld x %lld", op->name, g->t[t].name,
                       (long long)op->nindex, (long long)op->cols);
    dm_operand full = {.kind = DM_ARG_FULL};
    DM_TRY(dm_cpu_row_map(g, op, t, op->cols, &full));
    if (full.nrl)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: the table %s must keep its default layout", op->name, g->t[t].name);
    d->base = dm_cpu_mem_ptr(arena, t);
    d->rdiv = op->nindex;
    return d->base ? DM_OK : dm_fail(DM_ERR_INTERNAL, "%s: %s has no memory", op->name, g->t[t].name);
}

/* The fused decoder and cross-entropy (LINEAR_XENT or its backward), a group of its own:
 * every operand in memory, dense, of the sizes its rows (m), cols (v) and nindex (e) say. */
static dm_status init_xent(dm_cpu_exec *ex, dm_exgroup *eg, const dm_plan *plan, const dm_cpu_mem *arena,
                           const dm_op *op) {
    const dm_graph *g = plan->g;
    const int64_t m = op->rows, v = op->cols, e = op->nindex;
    const int bwd = op->kind == DM_OP_LINEAR_XENT_BWD;
    if (eg->gr->nops != 1 || eg->gr->nbatch > 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: the fused cross-entropy runs as a group of its own", op->name);
    if (m < 1 || v < 1 || e < 1 || m > INT32_MAX / DM_XENT_CHUNK || v > INT32_MAX / e || m > INT32_MAX / e)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: %lld rows, %lld columns, %lld inner: sizes beyond BLAS's ints",
                       op->name, (long long)m, (long long)v, (long long)e);
    /* t, W, bias, labels [, lse, dloss]; then loss, lse, pred or dt, dW, dbias */
    for (int io = 0; io < 2; io++)
        for (int s = 0; s < (io ? op->nout : op->nin); s++) {
            const int t = io ? op->out[s] : op->in[s];
            const dm_tensor *x = &g->t[t];
            int64_t want = 1;
            int dense = 1;
            for (int d = x->ndim - 1; d >= 0; d--) {
                if (x->size[d] > 1 && x->stride[d] != want) dense = 0;
                want *= x->size[d];
            }
            float *p = dm_cpu_mem_ptr(arena, t);
            const int64_t numel = dm_linear_xent_numel(op->kind, io, s, m, e, v);
            if (!p || !dense || x->numel != numel)
                return dm_fail(DM_ERR_INTERNAL, "%s: operand %s is not in memory, dense, of %lld elements",
                               op->name, x->name, (long long)numel);
            eg->xp[io ? op->nin + s : s] = p;
        }
    const int64_t need = dm_cpu_xent_work_floats(bwd, m, e, ex->nthreads); /* one buffer for all: exec_init */
    if (need > ex->xwork_floats) ex->xwork_floats = need;
    eg->xent = 1 + bwd;
    eg->xop = op;
    return DM_OK;
}

/* Whether two operands address row r (of the same rows x cols) alike: each a whole row
 * (FULL) or each one float (ROWSCALAR), at the same place. */
static int same_rows(const dm_operand *a, const dm_operand *b) {
    if (a->kind != b->kind || (a->kind != DM_ARG_FULL && a->kind != DM_ARG_ROWSCALAR) || a->scratch != b->scratch)
        return 0;
    if (a->scratch) return a->slot == b->slot;
    if (a->base != b->base || a->nrl != b->nrl) return 0;
    for (int q = 0; q < a->nrl; q++)
        if (a->rsize[q] != b->rsize[q] || a->rstride[q] != b->rstride[q]) return 0;
    return 1;
}

/* Whether op q can join the chain of ops [k, q) run row by row: the same rows and
 * columns, and every tensor one of them writes and another reads or writes addressed
 * alike by both (row r of it is what row r of the chain touches). Else a read of another
 * row (a GROUPED operand, another view) could see a row the chain has not reached yet. */
static int joins_chain(const dm_graph *g, const dm_exgroup *eg, int k, int q) {
    const dm_exop *x = &eg->ops[q];
    if (x->op->kind == DM_OP_CONTRACT || x->op->rows != eg->ops[k].op->rows || x->op->cols != eg->ops[k].op->cols)
        return 0;
    for (int p = k; p < q; p++) {
        const dm_exop *y = &eg->ops[p];
        for (int io = 0; io < 2; io++) /* q's inputs (io 0) and outputs (1) */
            for (int s = 0; s < (io ? x->op->nout : x->op->nin); s++) {
                const int tx = io ? x->op->out[s] : x->op->in[s];
                const dm_operand *dx = io ? &x->out[s] : &x->in[s];
                for (int jo = 0; jo < 2; jo++) /* p's inputs (0) and outputs (1): one of the two a write */
                    for (int t = 0; (io || jo) && t < (jo ? y->op->nout : y->op->nin); t++) {
                        const int ty = jo ? y->op->out[t] : y->op->in[t];
                        if (dm_tensor_root(g, tx) == dm_tensor_root(g, ty) &&
                            (tx != ty || !same_rows(dx, jo ? &y->out[t] : &y->in[t])))
                            return 0;
                    }
            }
    }
    return 1;
}

/* A batched group's row ops run in chains (joins_chain: the row ops up to the next
 * contraction that read and write their tensors row for row alike), row by row. An
 * output of a chain that is a tensor in memory no later contraction of the group reads
 * and no op after the chain (the attention's probabilities, kept for the backward) is
 * written to a staging row in the thread's scratch, read there by the chain's later ops,
 * and streamed to memory past the caches when the chain is done with the row: no read of
 * the line before it is written, no eviction of the tiles the group works in. Not where
 * the tensor is written twice in the group. */
static void stage_chains(const dm_graph *g, dm_exgroup *eg, int64_t *used) {
    for (int k = 0; k < eg->nops; k++) {
        dm_exop *x = &eg->ops[k];
        if (x->op->kind == DM_OP_CONTRACT) continue;
        int k1 = k + 1;
        while (k1 < eg->nops && joins_chain(g, eg, k, k1)) k1++;
        for (int q = k; q < k1; q++) eg->ops[q].chain_end = k1;
        for (int q = k; q < k1; q++) {
            dm_exop *w = &eg->ops[q];
            for (int s = 0; s < w->op->nout; s++) {
                dm_operand *d = &w->out[s];
                if (d->kind != DM_ARG_FULL || d->scratch || !d->base) continue;
                const int r = dm_tensor_root(g, w->op->out[s]);
                int ok = 1;
                for (int o = 0; o < eg->nops && ok; o++) {
                    const dm_exop *y = &eg->ops[o];
                    for (int t = 0; t < y->op->nout && ok; t++) /* written once */
                        if ((o != q || t != s) && dm_tensor_root(g, y->op->out[t]) == r) ok = 0;
                    for (int t = 0; t < y->op->nin && ok; t++) /* read by the chain alone (row for row:
                                                                  * joins_chain) */
                        if (o >= k1 && dm_tensor_root(g, y->op->in[t]) == r) ok = 0;
                }
                if (!ok) continue;
                d->staged = 1;
                d->slot = *used;
                *used += (w->op->cols + 15) / 16 * 16;
                for (int o = q + 1; o < k1; o++)
                    for (int t = 0; t < eg->ops[o].op->nin; t++)
                        if (dm_tensor_root(g, eg->ops[o].op->in[t]) == r) {
                            eg->ops[o].in[t].staged = 1;
                            eg->ops[o].in[t].slot = d->slot;
                        }
            }
        }
        k = k1 - 1;
    }
}

static dm_status init_group(dm_cpu_exec *ex, dm_exgroup *eg, const dm_plan *plan, const dm_cpu_mem *arena) {
    const dm_graph *g = plan->g;
    const dm_group *gr = eg->gr;
    const dm_op *first = &g->op[plan->order[gr->first]];
    int64_t nb = gr->nbatch > 1 ? gr->nbatch : 0;
    if (first->kind == DM_OP_ATTN || first->kind == DM_OP_ATTN_BWD)
        return dm_cpu_exec_init_attn(ex, eg, plan, arena, first);
    if (dm_op_alone(first->kind)) return init_xent(ex, eg, plan, arena, first);
    if (first->kind == DM_OP_CONTRACT && gr->nops == 1 && !nb) {
        eg->contract = 1;
        float *A = dm_cpu_mem_ptr(arena, first->in[0]);
        float *B = dm_cpu_mem_ptr(arena, first->in[1]);
        float *C = dm_cpu_mem_ptr(arena, first->out[0]);
        if (!A || !B || !C) return dm_fail(DM_ERR_INTERNAL, "%s: operand not in memory", first->name);
        DM_TRY(dm_gemm_prepare(&eg->gemm, g, first, A, B, C));
        int algo = plan->algo ? plan->algo[plan->order[gr->first]] : DM_GEMM_DEFAULT;
        dm_status s = dm_gemm_set_algo(&eg->gemm, (dm_gemm_algo)algo, ex->nthreads);
        if (s != DM_OK)
            return dm_fail_context(s, "contraction %s: ", first->name);
        return DM_OK;
    }
    eg->ops = calloc((size_t)gr->nops, sizeof(dm_exop));
    if (!eg->ops) return dm_fail(DM_ERR_OOM, "out of memory preparing the plan");
    eg->nops = gr->nops;
    eg->nbatch = nb;
    int slot_t[DM_MAX_IN * 64];
    int64_t slot_off[DM_MAX_IN * 64];
    int nsl = 0;
    int64_t used = 0, acc_used = 0;
    int64_t rowsz = (ex->max_cols + 15) / 16 * 16;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        dm_exop *x = &eg->ops[k];
        x->op = op;
        x->islot = dm_op_index_slot(op->kind);
        if (dm_op_indexed(op->kind)) {
            for (int s = 0; s < op->nout; s++) eg->scatter |= dm_arg_out(op->kind, s) == DM_ARG_SCATTER;
            if (eg->scatter && (gr->nops != 1 || nb))
                return dm_fail(DM_ERR_INTERNAL, "%s: a scatter into a table runs as a group of its own", op->name);
        }
        if (op->kind == DM_OP_CONTRACT) {
            /* a batched contraction inside a batched group: tiles for internal operands */
            float *p[3];
            int ts[3] = {op->in[0], op->in[1], op->out[0]};
            for (int s = 0; s < 3; s++) {
                int r = dm_tensor_root(g, ts[s]);
                if (plan->in_memory[r]) {
                    p[s] = dm_cpu_mem_ptr(arena, ts[s]);
                    x->tile[s] = -1;
                } else {
                    if (nsl >= (int)(sizeof slot_t / sizeof slot_t[0]))
                        return dm_fail(DM_ERR_INTERNAL, "too many scratch tiles");
                    p[s] = g_tile_placeholder;
                    x->tile[s] = scratch_slot(slot_t, slot_off, &nsl, &used, r, g->t[r].numel / nb);
                }
            }
            DM_TRY(dm_gemm_prepare(&x->gemm, g, op, p[0], p[1], p[2]));
            if (x->gemm.nbatch != nb)
                return dm_fail(DM_ERR_INTERNAL, "%s: batch %lld does not match its group's %lld",
                               op->name, (long long)x->gemm.nbatch, (long long)nb);
            /* of the algorithms, only the kernel applies here: the group's threads take
             * the batch indices (those that need a turn of their own are refused in
             * pair_groups; the thread splits have nothing to split) */
            const int ka = plan->algo ? plan->algo[plan->order[gr->first + k]] : DM_GEMM_DEFAULT;
            const dm_gemm_algo kern = ka == DM_GEMM_DEFAULT ? DM_GEMM_DEFAULT /* dm_gemm_default_algo's */
                                      : dm_gemm_algo_direct(ka) ? DM_GEMM_DIRECT
                                                                : DM_GEMM_BLAS; /* BLAS per batch index */
            dm_status s = dm_gemm_set_algo(&x->gemm, kern, ex->nthreads);
            if (s != DM_OK) return dm_fail_context(s, "contraction %s: ", op->name);
            continue;
        }
        int64_t cols = op->cols, rows = nb ? op->rows / nb : 1; /* rows of one scratch unit */
        for (int io = 0; io < 2; io++) {
            int n = io ? op->nout : op->nin;
            for (int s = 0; s < n; s++) {
                int t = io ? op->out[s] : op->in[s];
                dm_operand *d = io ? &x->out[s] : &x->in[s];
                d->kind = io ? dm_arg_out(op->kind, s) : dm_arg_in(op->kind, s);
                int r = dm_tensor_root(g, t);
                if (d->kind == DM_ARG_COLACC) {
                    if (eg->nacc >= (int)(sizeof eg->acc_dst / sizeof eg->acc_dst[0]) || nb)
                        return dm_fail(DM_ERR_INTERNAL, "%s: column reduction not supported here", op->name);
                    d->slot = acc_used;
                    eg->acc_dst[eg->nacc] = dm_cpu_mem_ptr(arena, t);
                    eg->acc_slot[eg->nacc] = acc_used;
                    if (!eg->acc_dst[eg->nacc] || g->t[t].numel != cols)
                        return dm_fail(DM_ERR_INTERNAL, "%s: bad column reduction output", op->name);
                    eg->nacc++;
                    acc_used += (cols + 15) / 16 * 16;
                    continue;
                }
                if (d->kind == DM_ARG_INDEXED || d->kind == DM_ARG_SCATTER) {
                    DM_TRY(table_operand(plan, arena, op, t, d));
                    continue;
                }
                int64_t need = d->kind == DM_ARG_ROWSCALAR ? op->rows : d->kind == DM_ARG_COLVEC ? cols : 0;
                if (d->kind == DM_ARG_FULL) need = op->rows * cols;
                if (d->kind == DM_ARG_GROUPED) {
                    int64_t G = g->t[t].numel / cols;
                    if (G < 1 || g->t[t].numel % cols || op->rows % G)
                        return dm_fail(DM_ERR_INTERNAL, "%s: operand %s does not tile the rows", op->name, g->t[t].name);
                    d->rdiv = op->rows / G;
                    need = g->t[t].numel;
                }
                if (g->t[t].numel != need)
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s has %lld elements, expected %lld",
                                   op->name, g->t[t].name, (long long)g->t[t].numel, (long long)need);
                if (plan->in_memory[r]) {
                    d->base = dm_cpu_mem_ptr(arena, t);
                    if (!d->base) return dm_fail(DM_ERR_INTERNAL, "%s: %s has no memory", op->name, g->t[t].name);
                    if (d->kind != DM_ARG_COLVEC) DM_TRY(dm_cpu_row_map(g, op, t, cols, d));
                    continue;
                }
                if (eg->scatter)
                    return dm_fail(DM_ERR_INTERNAL, "%s: the operands of a scatter must be in memory", op->name);
                if (nsl >= (int)(sizeof slot_t / sizeof slot_t[0]))
                    return dm_fail(DM_ERR_INTERNAL, "too many scratch rows");
                d->scratch = 1;
                /* a row (row groups) or this batch index's tile (batched groups) */
                int64_t unit = nb ? (d->kind == DM_ARG_ROWSCALAR ? rows : rows * cols) : rowsz;
                d->slot = scratch_slot(slot_t, slot_off, &nsl, &used, r, unit);
            }
        }
    }
    if (nb) stage_chains(g, eg, &used);
    for (int k = 0; k < eg->nops; k++)
        for (int s = 0; s < eg->ops[k].op->nout; s++)
            if (eg->ops[k].out[s].kind == DM_ARG_COLACC) eg->ops[k].out[s].slot += used;
    for (int a = 0; a < eg->nacc; a++) eg->acc_slot[a] += used;
    eg->scratch_floats = used + acc_used;
    return DM_OK;
}

/* Each contraction set to "concurrent" gets its partner, as dm_plan_pairs pairs them; a
 * mark without one is an error (lenient: that group is unusable). */
static dm_status pair_groups(dm_cpu_exec *ex, const dm_plan *plan, int lenient) {
    int *partner = malloc(sizeof(int) * (size_t)(plan->ngroups + 1));
    if (!partner) return dm_fail(DM_ERR_OOM, "out of memory preparing the plan");
    dm_status st = dm_plan_pairs(plan, partner, NULL);
    for (int gi = 0; gi < plan->ngroups && st == DM_OK; gi++) {
        int p = partner[gi];
        if (p >= 0 && ex->groups[gi].contract && !ex->groups[gi].unusable && ex->groups[p].contract &&
            !ex->groups[p].unusable) {
            ex->groups[gi].partner = p;
            ex->groups[p].beside = gi;
        }
    }
    for (int gi = 0; gi < plan->ngroups && st == DM_OK; gi++) {
        dm_exgroup *eg = &ex->groups[gi];
        /* a contraction inside a batched group (attention's) runs per batch index with
         * the group's row ops: it has no turn of its own to share */
        for (int k = 0; !eg->contract && plan->algo && k < eg->gr->nops && st == DM_OK; k++) {
            const dm_op *op = &plan->g->op[plan->order[eg->gr->first + k]];
            const int a = plan->algo[plan->order[eg->gr->first + k]];
            if (op->kind != DM_OP_CONTRACT || !(dm_gemm_algo_concurrent(a) || a == DM_GEMM_DIRECT_ROWS)) continue;
            st = dm_fail(DM_ERR_UNSUPPORTED,
                         "contraction %s runs inside a fused group (per batch index, with the row ops "
                         "around it), so it cannot be \"%s\" (which needs a turn of its own): give it "
                         "another algorithm (\"direct\" chooses its kernel there)",
                         op->name, dm_gemm_algo_name((dm_gemm_algo)a));
        }
        if (st != DM_OK && lenient) {
            eg->unusable = st;
            st = DM_OK;
            continue;
        }
        if (st != DM_OK) break;
        if (!eg->contract || eg->unusable || !dm_gemm_algo_concurrent(eg->gemm.algo)) continue;
        int p = eg->partner;
        if (p >= 0 && ex->groups[p].contract && !ex->groups[p].unusable) continue;
        const char *name = plan->g->op[plan->order[eg->gr->first]].name;
        st = eg->beside >= 0
                 ? dm_fail(DM_ERR_UNSUPPORTED,
                           "contraction %s runs beside an earlier one (algorithm \"concurrent\" there), "
                           "so it cannot be \"%s\" itself: give it another algorithm", name,
                           dm_gemm_algo_name(eg->gemm.algo))
                 : dm_fail(DM_ERR_UNSUPPORTED,
                           "contraction %s has the algorithm \"%s\", but no later weight-gradient "
                           "contraction of its pass is free to run beside it: give it another algorithm",
                           name, dm_gemm_algo_name(eg->gemm.algo));
        if (lenient) {
            eg->unusable = st;
            eg->partner = -1;
            if (p >= 0) ex->groups[p].beside = -1;
            st = DM_OK;
        }
    }
    free(partner);
    return st;
}

static dm_status exec_init(dm_cpu_exec *ex, const dm_plan *plan, const dm_cpu_mem *arena, int nthreads, int lenient) {
    memset(ex, 0, sizeof *ex);
    /* plan->algo's ids are dm_gemm_algo values only in the CPU's own table */
    if (plan->algo && plan->algos != &dm_cpu_gemm_algos)
        return dm_fail(DM_ERR_INVALID_ARG, "the plan's algorithms are the %s backend's, not the CPU's",
                       plan->algos ? plan->algos->backend : "(unnamed)");
    /* under ulimit -v, OpenBLAS spins forever on a buffer it cannot map, and the OpenMP
     * runtime exits when it cannot map a thread's stack: refuse first (OpenBLAS mapped its
     * first buffer when it started) */
    DM_TRY(dm_threads_room(nthreads, "OpenBLAS's buffers and the stacks for this many threads"));
    ex->nthreads = nthreads;
    ex->max_cols = plan->max_cols > 0 ? plan->max_cols : 1;
    ex->ngroups = plan->ngroups;
    ex->groups = calloc((size_t)plan->ngroups, sizeof(dm_exgroup));
    if (!ex->groups) return dm_fail(DM_ERR_OOM, "out of memory preparing the plan");
    for (int gi = 0; gi < plan->ngroups; gi++) {
        ex->groups[gi].gr = &plan->groups[gi];
        ex->groups[gi].partner = ex->groups[gi].beside = -1;
        ex->groups[gi].rows_next = ex->groups[gi].rows_of = -1;
        dm_status s = init_group(ex, &ex->groups[gi], plan, arena);
        if (s == DM_ERR_UNSUPPORTED && lenient) {
            ex->groups[gi].unusable = s;
            continue;
        }
        if (s != DM_OK) {
            dm_cpu_exec_free(ex);
            return s;
        }
        if (ex->groups[gi].scratch_floats > ex->per_thread)
            ex->per_thread = ex->groups[gi].scratch_floats;
    }
    dm_status s = pair_groups(ex, plan, lenient);
    if (s != DM_OK) {
        dm_cpu_exec_free(ex);
        return s;
    }
    ex->per_thread = (ex->per_thread + 15) / 16 * 16 + 16;
    size_t fl = (size_t)ex->per_thread * (size_t)nthreads;
    ex->scratch = aligned_alloc(64, (fl * 4 + 63) / 64 * 64);
    ex->words = aligned_alloc(64, ((size_t)ex->max_cols * (size_t)nthreads * 4 + 63) / 64 * 64);
    if (!ex->scratch || !ex->words) {
        dm_cpu_exec_free(ex);
        return dm_fail(DM_ERR_OOM, "out of memory allocating scratch rows");
    }
    memset(ex->scratch, 0, fl * 4);
    size_t xb;
    if (ex->xwork_floats &&
        (!dm_mul_ok((size_t)ex->xwork_floats, sizeof(float), &xb) || !(ex->xwork = dm_alloc_huge(xb)))) {
        dm_cpu_exec_free(ex);
        return dm_fail(DM_ERR_OOM, "out of memory for the fused cross-entropy's buffers");
    }
    /* every contraction gets the direct kernel's buffers, also those a tuner switches to
     * it after this; untouched pages of them cost nothing */
    if (dm_gemm_direct_available()) {
        ex->pack = aligned_alloc(64, sizeof(float) * (size_t)DM_GEMM_DIRECT_PACK_FLOATS * (size_t)nthreads);
        if (!ex->pack) {
            dm_cpu_exec_free(ex);
            return dm_fail(DM_ERR_OOM, "out of memory allocating the direct kernel's buffers");
        }
        for (int gi = 0; gi < ex->ngroups; gi++) {
            dm_exgroup *eg = &ex->groups[gi];
            eg->gemm.pack = ex->pack;
            eg->gemm.pack_threads = nthreads;
            for (int k = 0; k < eg->nops; k++) {
                eg->ops[k].gemm.pack = ex->pack;
                eg->ops[k].gemm.pack_threads = nthreads;
            }
        }
    }
    for (int gi = 0; gi < ex->ngroups; gi++) {
        dm_exgroup *eg = &ex->groups[gi];
        if (!eg->contract || eg->unusable || eg->gemm.algo != DM_GEMM_DIRECT_ROWS) continue;
        s = dm_cpu_exec_fuse_rows(ex, plan, gi);
        if (s == DM_ERR_UNSUPPORTED && lenient) {
            eg->unusable = s;
            continue;
        }
        if (s != DM_OK) {
            dm_cpu_exec_free(ex);
            return s;
        }
    }
    s = dm_cpu_exec_init_tokens(ex, plan, arena);
    if (s != DM_OK) dm_cpu_exec_free(ex);
    return s;
}

/* Do roots r and q share arena bytes? */
static int roots_overlap(const dm_plan *plan, int r, int q) {
    if (plan->offset[r] < 0 || plan->offset[q] < 0) return 0;
    int64_t a = plan->offset[r], b = a + plan->g->t[r].numel * (int64_t)sizeof(float);
    int64_t c = plan->offset[q], d = c + plan->g->t[q].numel * (int64_t)sizeof(float);
    return a < d && c < b;
}

dm_status dm_cpu_exec_fuse_rows(dm_cpu_exec *ex, const dm_plan *plan, int gi) {
    const dm_graph *g = plan->g;
    if (gi < 0 || gi >= ex->ngroups) return dm_fail(DM_ERR_INVALID_ARG, "no group %d", gi);
    dm_exgroup *eg = &ex->groups[gi];
    const dm_op *op = &g->op[plan->order[eg->gr->first]];
    if (!eg->contract || eg->unusable)
        return dm_fail(DM_ERR_UNSUPPORTED, "group %d is not a lone contraction that can run", gi);
    if (eg->gemm.algo != DM_GEMM_DIRECT_ROWS || !dm_gemm_direct_available())
        return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: only the algorithm \"direct_rows\" (on a CPU with "
                       "AVX-512 or AVX2) runs the next group in its epilogue", op->name);
    const dm_gemm *gm = &eg->gemm;
    const char *why = NULL;
    dm_exgroup *rg = gi + 1 < ex->ngroups ? &ex->groups[gi + 1] : NULL;
    if (gm->nbatch != 1 || eg->partner >= 0 || eg->beside >= 0)
        why = gm->nbatch != 1 ? "it is a batched contraction" : "it runs beside another contraction";
    else if (!rg || rg->contract || rg->scatter || rg->nbatch > 1 || rg->unusable || rg->rows_of >= 0 ||
             rg->gr->pass != eg->gr->pass)
        why = "the next group is no row group of the same pass";
    else if (rg->gr->rows != gm->m || rg->gr->cols != gm->n || gm->ldc != gm->n)
        why = "the next group's rows are not the GEMM's output rows";
    const int croot = dm_tensor_root(g, op->out[0]);
    const int ra = dm_tensor_root(g, op->in[0]), rb = dm_tensor_root(g, op->in[1]);
    for (int k = 0; !why && k < rg->nops; k++) {
        const dm_exop *x = &rg->ops[k];
        for (int io = 0; io < 2 && !why; io++)
            for (int q = 0; q < (io ? x->op->nout : x->op->nin) && !why; q++) {
                const dm_operand *d = io ? &x->out[q] : &x->in[q];
                int r = dm_tensor_root(g, io ? x->op->out[q] : x->op->in[q]);
                if (d->scratch || d->kind == DM_ARG_COLACC) continue; /* per thread, or summed after the GEMM */
                /* the GEMM's output, read (or rewritten in place) row for row as it was
                 * written; also under another name (the memory planner's in-place outputs) */
                int same = r == croot || (plan->offset[r] == plan->offset[croot] && g->t[r].numel == g->t[croot].numel);
                int as_c = same && d->kind == DM_ARG_FULL && d->nrl == 0 && d->base == gm->C;
                if (same && !as_c) why = "the next group reads the GEMM's output other than row for row";
                else if (!as_c && roots_overlap(plan, r, croot))
                    why = "the next group uses memory the GEMM's output shares";
                else if (io && (roots_overlap(plan, r, ra) || roots_overlap(plan, r, rb)))
                    why = "the next group writes memory the GEMM reads";
            }
    }
    if (why)
        return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s cannot run the next group in its epilogue "
                       "(algorithm \"direct_rows\"): %s; give it another algorithm", op->name, why);
    /* op(B) whole, packed into panels, shared by the team */
    {
        int64_t need = (int64_t)gm->k * ((gm->n + 63) / 64 * 64);
        if (need > ex->bwhole_floats) {
            float *b = dm_alloc_huge((size_t)need * sizeof(float));
            if (!b) return dm_fail(DM_ERR_OOM, "out of memory for contraction %s's packed operand", op->name);
            free(ex->bwhole);
            ex->bwhole = b;
            ex->bwhole_floats = need;
        }
    }
    if (!ex->rows_ran) {
        ex->rows_ran = calloc((size_t)ex->ngroups, 1);
        if (!ex->rows_ran) return dm_fail(DM_ERR_OOM, "out of memory preparing the plan");
    }
    eg->rows_next = gi + 1;
    rg->rows_of = gi;
    return DM_OK;
}

dm_status dm_cpu_exec_init_apart(dm_cpu_exec *ex, const dm_plan *plan, char *arena, char *act, int nthreads,
                                 int lenient) {
    const dm_cpu_mem m = dm_cpu_mem_of(plan, arena, act);
    return exec_init(ex, plan, &m, nthreads, lenient);
}

dm_status dm_cpu_exec_init(dm_cpu_exec *ex, const dm_plan *plan, char *arena, int nthreads) {
    return dm_cpu_exec_init_apart(ex, plan, arena, NULL, nthreads, 0);
}

dm_status dm_cpu_exec_init_lenient(dm_cpu_exec *ex, const dm_plan *plan, char *arena, int nthreads) {
    return dm_cpu_exec_init_apart(ex, plan, arena, NULL, nthreads, 1);
}

void dm_cpu_exec_free(dm_cpu_exec *ex) {
    if (ex->groups)
        for (int gi = 0; gi < ex->ngroups; gi++) free(ex->groups[gi].ops);
    free(ex->groups);
    free(ex->scratch);
    free(ex->words);
    free(ex->pack);
    free(ex->bwhole);
    free(ex->xwork);
    free(ex->rows_ran);
    free(ex->tokkey);
    free(ex->tok_off);
    memset(ex, 0, sizeof *ex);
}

/* Element offset of row r of an operand in a non-default layout. */
static int64_t row_offset(const dm_operand *d, int64_t r) {
    int64_t off = 0;
    for (int q = d->nrl - 1; q >= 0; q--) {
        off += (r % d->rsize[q]) * d->rstride[q];
        r /= d->rsize[q];
    }
    return off;
}

/* r: the global row; rl: the row within this scratch unit (0 in row groups). A table
 * (INDEXED, SCATTER): its first row (gather_rows picks the row). */
static inline float *resolve_mem(const dm_operand *d, float *scr, int64_t r, int64_t rl, int64_t cols) {
    if (d->scratch) return scr + d->slot + (d->kind == DM_ARG_ROWSCALAR ? rl : rl * cols);
    if (d->nrl) return d->base + row_offset(d, r);
    switch (d->kind) {
    case DM_ARG_FULL: return d->base + r * cols;
    case DM_ARG_COLVEC: return d->base;
    case DM_ARG_GROUPED: return d->base + (r / d->rdiv) * cols;
    case DM_ARG_ROWSCALAR: return d->base + r;
    case DM_ARG_COLACC: return scr + d->slot;
    case DM_ARG_INDEXED: case DM_ARG_SCATTER: return d->base;
    }
    return NULL;
}

/* an operand's row: a staged one's in the staging row */
static inline float *resolve(const dm_operand *d, float *scr, int64_t r, int64_t rl, int64_t cols) {
    return d->staged ? scr + d->slot : resolve_mem(d, scr, r, rl, cols);
}

/* Op x's inputs resolved: its T inputs to the row their index selects (NULL: none, the
 * kernel writes zeros). */
static inline void gather_rows(const dm_exop *x, dm_row *rw) {
    if (x->islot < 0) return;
    const float v = *rw->in[x->islot];
    for (int s = 0; s < x->op->nin; s++)
        if (x->in[s].kind == DM_ARG_INDEXED) {
            const int64_t n = dm_index_row(v, x->in[s].rdiv);
            rw->in[s] = n >= 0 ? x->in[s].base + n * rw->cols : NULL;
        }
}

/* Batch index bi's operands in memory (GEMM inputs not in tiles, row op inputs that are
 * whole rows of a tensor, unless only the contractions run) into L2: asked for before the
 * item before it, they arrive while it computes (small layer, 2-core EPYC: the backward
 * attention group 4-8% faster, the forward one unchanged). */
static void prefetch_item(const dm_exgroup *eg, float *scr, int64_t bi, int only_contractions) {
    for (int k = 0; k < eg->nops; k++) {
        const dm_exop *x = &eg->ops[k];
        if (x->op->kind == DM_OP_CONTRACT) {
            dm_gemm_prefetch(&x->gemm, bi, x->tile[0] >= 0, x->tile[1] >= 0);
            continue;
        }
        if (only_contractions) continue;
        const int64_t cols = x->op->cols, rp = x->op->rows / eg->nbatch, r0 = bi * rp;
        for (int s = 0; s < x->op->nin; s++) {
            const dm_operand *d = &x->in[s];
            if (d->scratch || d->staged || d->kind != DM_ARG_FULL) continue;
            for (int64_t r = r0; r < r0 + rp; r++) {
                const float *p = resolve(d, scr, r, r - r0, cols);
                for (int64_t c = 0; c < cols; c += 16) __builtin_prefetch(p + c, 0, 2);
            }
        }
    }
}

/* A batched group: each thread takes batch indices; for each it runs the group's ops in
 * order, GEMMs single-threaded on that index's slices, each chain of row ops between them
 * row by row on that index's rows (stage_chains); internal tensors are that thread's
 * tiles. only_contractions skips the row ops. */
static dm_status exec_batched(const dm_cpu_exec *ex, const dm_exgroup *eg, uint64_t seed,
                              int only_contractions) {
#pragma omp parallel num_threads(ex->nthreads)
    {
        int tid = omp_get_thread_num();
        float *scr = ex->scratch + (int64_t)tid * ex->per_thread;
        dm_row rw = {.seed = seed, .words = ex->words + (int64_t)tid * ex->max_cols};
#pragma omp for schedule(static)
        for (int64_t bi = 0; bi < eg->nbatch; bi++) {
            if (bi + 1 < eg->nbatch) prefetch_item(eg, scr, bi + 1, only_contractions);
            for (int k = 0; k < eg->nops; k++) {
                const dm_exop *x = &eg->ops[k];
                if (x->op->kind == DM_OP_CONTRACT) {
                    dm_gemm_run_one(&x->gemm, bi, x->tile[0] >= 0 ? scr + x->tile[0] : NULL,
                                    x->tile[1] >= 0 ? scr + x->tile[1] : NULL,
                                    x->tile[2] >= 0 ? scr + x->tile[2] : NULL);
                    continue;
                }
                /* the chain of row ops up to the next contraction (stage_chains), row by
                 * row: a row's mask, softmax and dropout run while it is in L1 */
                const int k1 = x->chain_end;
                if (only_contractions) {
                    k = k1 - 1;
                    continue;
                }
                const int64_t rp = x->op->rows / eg->nbatch, r0 = bi * rp;
                for (int64_t r = r0; r < r0 + rp; r++) {
                    for (int q = k; q < k1; q++) {
                        const dm_exop *y = &eg->ops[q];
                        const int64_t cols = y->op->cols;
                        rw.op = y->op;
                        rw.cols = cols;
                        rw.r = rw.key = r;
                        for (int s = 0; s < y->op->nin; s++) rw.in[s] = resolve(&y->in[s], scr, r, r - r0, cols);
                        for (int s = 0; s < y->op->nout; s++) rw.out[s] = resolve(&y->out[s], scr, r, r - r0, cols);
                        gather_rows(y, &rw);
                        dm_cpu_row(&rw);
                    }
                    for (int q = k; q < k1; q++) /* the staged rows to memory */
                        for (int s = 0; s < eg->ops[q].op->nout; s++) {
                            const dm_operand *d = &eg->ops[q].out[s];
                            if (d->staged)
                                dm_stream_row(resolve_mem(d, scr, r, r - r0, eg->ops[q].op->cols), scr + d->slot,
                                           eg->ops[q].op->cols);
                        }
                }
                k = k1 - 1;
            }
            dm_stream_fence();
        }
    }
    return DM_OK;
}

/* Row r of row group eg: its ops in order, on this thread's scratch. */
static void run_row(const dm_exgroup *eg, float *scr, dm_row *rw, int64_t r, const int64_t *tokkey) {
    const int64_t cols = rw->cols;
    rw->r = r;
    rw->key = tokkey && eg->tok_rpt ? tokkey[r / eg->tok_rpt] * eg->tok_rpt + r % eg->tok_rpt : r;
    for (int k = 0; k < eg->nops; k++) {
        const dm_exop *x = &eg->ops[k];
        rw->op = x->op;
        for (int s = 0; s < x->op->nin; s++) rw->in[s] = resolve(&x->in[s], scr, r, 0, cols);
        for (int s = 0; s < x->op->nout; s++) rw->out[s] = resolve(&x->out[s], scr, r, 0, cols);
        gather_rows(x, rw);
        dm_cpu_row(rw);
    }
}

/* Inside the parallel region, after every thread's rows: the column sums of the team's
 * per-thread accumulators (a fixed order: deterministic for a thread count). */
static void reduce_columns(const dm_cpu_exec *ex, const dm_exgroup *eg, int nteam) {
    const int64_t cols = eg->gr->cols;
    for (int a = 0; a < eg->nacc; a++) {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < cols; c++) {
            float s = 0;
            for (int t = 0; t < nteam; t++) s += ex->scratch[(int64_t)t * ex->per_thread + eg->acc_slot[a] + c];
            eg->acc_dst[a][c] = s;
        }
    }
}

typedef struct {
    const dm_exgroup *rg;
    const int64_t *tokkey;
    float *scr;
    dm_row rw;
    int64_t lo; /* the thread's first row */
} rows_ctx;

static void rows_done(void *arg, int i0, int rows) {
    rows_ctx *c = arg;
    for (int64_t r = c->lo + i0; r < c->lo + i0 + rows; r++) run_row(c->rg, c->scr, &c->rw, r, c->tokkey);
}

/* "direct_rows": each thread computes a block of the GEMM's rows with the direct kernel
 * and runs the next group's ops on them block by block, while they are in its caches. */
static dm_status exec_fused_rows(const dm_cpu_exec *ex, const dm_exgroup *eg, uint64_t seed) {
    const dm_exgroup *rg = &ex->groups[eg->rows_next];
    const dm_gemm *gm = &eg->gemm;
    const int m = gm->m, n = gm->n, k = gm->k;
    const int64_t pstride = (int64_t)64 * k, cols = rg->gr->cols;
#pragma omp parallel num_threads(ex->nthreads)
    {
        const int tid = omp_get_thread_num(), T = omp_get_num_threads();
        float *scr = ex->scratch + (int64_t)tid * ex->per_thread;
        for (int a = 0; a < rg->nacc; a++) memset(scr + rg->acc_slot[a], 0, sizeof(float) * (size_t)cols);
        { /* the team packs op(B) once into 64-column panels, k rows each (in place, B's
           * rows ldb apart cost the kernel up to 10%: a page per row of a panel) */
            int per = (k + T - 1) / T, k0 = tid * per, k1 = k0 + per < k ? k0 + per : k;
            if (k1 > k0)
                dm_direct_pack_b(ex->bwhole + (int64_t)k0 * 64, pstride, gm->transB, gm->B, gm->ldb, k0, k1 - k0, 0, n);
#pragma omp barrier
        }
        int per = (m + T - 1) / T, lo = tid * per < m ? tid * per : m, hi = lo + per < m ? lo + per : m;
        rows_ctx c = {.rg = rg, .tokkey = ex->tokkey, .scr = scr, .lo = lo,
                      .rw = {.cols = cols, .seed = seed, .words = ex->words + (int64_t)tid * ex->max_cols}};
        if (tid == 0) ex->rows_ran[eg->rows_next] = 1; /* the row group's turn is done */
        if (hi > lo)
            dm_sgemm_direct_rows(gm->transA, hi - lo, n, k, gm->alpha, gm->A + (int64_t)lo * (gm->transA ? 1 : gm->lda),
                                 gm->lda, ex->bwhole, 64, pstride, gm->C + (int64_t)lo * gm->ldc, gm->ldc, rows_done, &c);
#pragma omp barrier
        reduce_columns(ex, rg, T);
    }
    return DM_OK;
}

/* EMBED_BWD: dtable[n, :] = sum of dy[r, :] over the rows r with idx[r] == n, every row
 * written. Each thread owns a block of the table's columns (whole 64-byte lines): it
 * zeroes them in every row, then adds the rows r in order: deterministic for any thread
 * count, balanced however the indices repeat (a split by table rows is not: position
 * and token-type ids pile on few rows), no atomics. Each thread reads every index. */
static void exec_scatter(const dm_cpu_exec *ex, const dm_exgroup *eg) {
    const dm_exop *x = &eg->ops[0];
    const int64_t R = eg->tok_rpt ? ex->tokens * eg->tok_rpt : x->op->rows, C = x->op->cols, N = x->out[0].rdiv;
    float *dt = x->out[0].base;
    const int64_t lines = (C + 15) / 16;
#pragma omp parallel num_threads(ex->nthreads)
    {
        const int64_t tid = omp_get_thread_num(), T = omp_get_num_threads();
        const int64_t c0 = lines * tid / T * 16, c1e = lines * (tid + 1) / T * 16, c1 = c1e < C ? c1e : C;
        if (c1 > c0) {
            /* a table past the caches (BERT's word table, 94 MB) zeroed by streaming stores:
             * the lines are not read first (7.5 -> 2.7 ms a step on the Xeon, 2 threads) */
            const int big = N * C > ((int64_t)8 << 20) / (int64_t)sizeof(float);
            for (int64_t n = 0; n < N; n++) {
                if (big) dm_stream_zero(dt + n * C + c0, c1 - c0);
                else memset(dt + n * C + c0, 0, sizeof(float) * (size_t)(c1 - c0));
            }
            if (big) dm_stream_fence();
            for (int64_t r = 0; r < R; r++) {
                const int64_t n = dm_index_row(*resolve(&x->in[1], NULL, r, 0, C), N);
                if (n < 0) continue;
                const float *restrict dy = resolve(&x->in[0], NULL, r, 0, C);
                float *restrict o = dt + n * C;
#pragma omp simd
                for (int64_t c = c0; c < c1; c++) o[c] += dy[c];
            }
        }
    }
}

static dm_status exec_group(const dm_cpu_exec *ex, int gi, uint64_t seed, int only_contractions);

dm_status dm_cpu_exec_group(const dm_cpu_exec *ex, int gi, uint64_t seed, int only_contractions) {
    const dm_exgroup *eg = &ex->groups[gi];
    const int in_epilogue = eg->rows_of >= 0 && ex->rows_ran[gi]; /* its GEMM's turn zeroed it */
    DM_TRY(exec_group(ex, gi, seed, only_contractions));
    if (ex->tok_cap) { /* an unpadded layer's outputs past the tokens: 0 */
        if (!in_epilogue) dm_cpu_exec_zero_tail(ex, gi);
        if (eg->rows_next >= 0 && ex->rows_ran[eg->rows_next]) dm_cpu_exec_zero_tail(ex, eg->rows_next);
    }
    return DM_OK;
}

static dm_status exec_group(const dm_cpu_exec *ex, int gi, uint64_t seed, int only_contractions) {
    const dm_exgroup *eg = &ex->groups[gi];
    if (eg->unusable) return dm_fail(eg->unusable, "group %d cannot run with these layouts", gi);
    if (eg->beside >= 0) return DM_OK; /* ran at its partner's turn */
    if (eg->rows_of >= 0 && ex->rows_ran[gi]) { /* ran in the epilogue of the GEMM's last run */
        ex->rows_ran[gi] = 0;
        return DM_OK;
    } /* else the GEMM ran without it (contractions only, or not this run): runs on its own */
    if (eg->contract) {
        if (eg->rows_next >= 0 && !only_contractions) return exec_fused_rows(ex, eg, seed);
        return eg->partner >= 0 ? dm_gemm_run_pair(&eg->gemm, &ex->groups[eg->partner].gemm, ex->nthreads)
                                : dm_gemm_run(&eg->gemm);
    }
    if (eg->attn) { /* a contraction: runs with only_contractions too */
        dm_attn_dims a = eg->ad;
        a.p = eg->xop->p; /* dm_layer_set_training's */
        return dm_cpu_attn(&a, &eg->aio, seed, eg->attn == 2, ex->xwork, ex->nthreads);
    }
    if (eg->xent) { /* a contraction: runs with only_contractions too */
        const dm_op *op = eg->xop;
        float *const *p = eg->xp;
        const int64_t rows = eg->tok_rpt ? ex->tokens * eg->tok_rpt : op->rows; /* live rows */
        if (eg->xent == 1)
            dm_cpu_linear_xent(p[0], p[1], p[2], p[3], rows, op->nindex, op->cols, p[4], p[5], p[6], ex->xwork,
                               ex->nthreads);
        else
            dm_cpu_linear_xent_bwd(p[0], p[1], p[2], p[3], p[4], p[5], rows, op->nindex, op->cols, p[6], p[7],
                                   p[8], ex->xwork, ex->nthreads);
        return DM_OK;
    }
    if (eg->nbatch > 1) return exec_batched(ex, eg, seed, only_contractions);
    if (eg->scatter) { /* (as the row groups: run with only_contractions too) */
        exec_scatter(ex, eg);
        return DM_OK;
    }
    int64_t rows = eg->tok_rpt ? ex->tokens * eg->tok_rpt : eg->gr->rows, cols = eg->gr->cols;
#pragma omp parallel num_threads(ex->nthreads)
    {
        int tid = omp_get_thread_num();
        float *scr = ex->scratch + (int64_t)tid * ex->per_thread;
        for (int a = 0; a < eg->nacc; a++) memset(scr + eg->acc_slot[a], 0, sizeof(float) * (size_t)cols);
        dm_row rw = {.cols = cols, .seed = seed, .words = ex->words + (int64_t)tid * ex->max_cols};
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) run_row(eg, scr, &rw, r, ex->tokkey);
        reduce_columns(ex, eg, omp_get_num_threads());
    }
    return DM_OK;
}
