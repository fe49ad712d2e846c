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

#include "core/status.h"

dm_arg_kind dm_arg_in(dm_op_kind k, int slot) {
    switch (k) {
    case DM_OP_BIAS_ADD: return slot == 1 ? DM_ARG_COLVEC : DM_ARG_FULL;
    case DM_OP_MASK_ADD: return slot == 1 ? DM_ARG_GROUPED : DM_ARG_FULL;
    case DM_OP_LAYERNORM: return slot == 0 ? DM_ARG_FULL : DM_ARG_COLVEC;
    case DM_OP_LAYERNORM_BWD:
        return slot <= 1 ? DM_ARG_FULL : slot <= 3 ? DM_ARG_ROWSCALAR : DM_ARG_COLVEC;
    default: return DM_ARG_FULL;
    }
}

dm_arg_kind dm_arg_out(dm_op_kind k, int slot) {
    switch (k) {
    case DM_OP_LAYERNORM: return slot == 0 ? DM_ARG_FULL : DM_ARG_ROWSCALAR;
    case DM_OP_LAYERNORM_BWD: return slot == 0 ? DM_ARG_FULL : DM_ARG_COLACC;
    case DM_OP_COLSUM: return DM_ARG_COLACC;
    default: return DM_ARG_FULL;
    }
}

float *dm_cpu_tensor_ptr(const dm_plan *plan, char *arena, int t) {
    const dm_graph *g = plan->g;
    int r = dm_tensor_root(g, t);
    if (plan->offset[r] < 0) return NULL;
    return (float *)(arena + plan->offset[r]) + g->t[t].offset;
}

void dm_cpu_eltwise_row(const dm_row *rw);
void dm_cpu_norm_row(const dm_row *rw);

void dm_cpu_row(const dm_row *rw) {
    if (dm_op_kind_class(rw->op->kind) == DM_CLASS_NORMALIZATION) dm_cpu_norm_row(rw);
    else dm_cpu_eltwise_row(rw);
}

static dm_status init_group(dm_cpu_exec *ex, dm_exgroup *eg, const dm_plan *plan, char *arena) {
    const dm_graph *g = plan->g;
    const dm_group *gr = eg->gr;
    const dm_op *first = &g->op[plan->order[gr->first]];
    if (first->kind == DM_OP_CONTRACT) {
        eg->contract = 1;
        float *A = dm_cpu_tensor_ptr(plan, arena, first->in[0]);
        float *B = dm_cpu_tensor_ptr(plan, arena, first->in[1]);
        float *C = dm_cpu_tensor_ptr(plan, arena, first->out[0]);
        if (!A || !B || !C) return dm_fail(DM_ERR_INTERNAL, "%s: operand not in memory", first->name);
        return dm_gemm_prepare(&eg->gemm, g, first, A, B, C);
    }
    eg->ops = calloc((size_t)gr->nops, sizeof(dm_exop));
    if (!eg->ops) return dm_fail(DM_ERR_OOM, "out of memory preparing the plan");
    eg->nops = gr->nops;
    int scratch_t[DM_MAX_IN * 64];
    int nsl = 0;
    int64_t cols = gr->cols, rows = gr->rows;
    int64_t acc_used = 0;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        dm_exop *x = &eg->ops[k];
        x->op = op;
        for (int io = 0; io < 2; io++) {
            int n = io ? op->nout : op->nin;
            for (int s = 0; s < n; s++) {
                int t = io ? op->out[s] : op->in[s];
                dm_operand *d = io ? &x->out[s] : &x->in[s];
                d->kind = io ? dm_arg_out(op->kind, s) : dm_arg_in(op->kind, s);
                int r = dm_tensor_root(g, t);
                if (d->kind == DM_ARG_COLACC) {
                    if (eg->nacc >= (int)(sizeof eg->acc_dst / sizeof eg->acc_dst[0]))
                        return dm_fail(DM_ERR_INTERNAL, "too many column reductions in a group");
                    d->slot = acc_used;
                    eg->acc_dst[eg->nacc] = dm_cpu_tensor_ptr(plan, arena, t);
                    eg->acc_slot[eg->nacc] = acc_used;
                    eg->acc_cols[eg->nacc] = cols;
                    if (!eg->acc_dst[eg->nacc] || g->t[t].numel != cols)
                        return dm_fail(DM_ERR_INTERNAL, "%s: bad column reduction output", op->name);
                    eg->nacc++;
                    acc_used += (cols + 15) / 16 * 16;
                    continue;
                }
                int64_t need = d->kind == DM_ARG_ROWSCALAR ? rows : d->kind == DM_ARG_COLVEC ? cols : 0;
                if (d->kind == DM_ARG_FULL) need = rows * cols;
                if (d->kind == DM_ARG_GROUPED) {
                    int64_t G = g->t[t].numel / cols;
                    if (G < 1 || g->t[t].numel % cols || rows % G)
                        return dm_fail(DM_ERR_INTERNAL, "%s: operand %s does not tile the rows", op->name, g->t[t].name);
                    d->rdiv = rows / G;
                    need = g->t[t].numel;
                }
                if (g->t[t].numel != need)
                    return dm_fail(DM_ERR_INTERNAL, "%s: operand %s has %lld elements, expected %lld",
                                   op->name, g->t[t].name, (long long)g->t[t].numel, (long long)need);
                if (plan->in_memory[r]) {
                    d->base = dm_cpu_tensor_ptr(plan, arena, t);
                    if (!d->base) return dm_fail(DM_ERR_INTERNAL, "%s: %s has no memory", op->name, g->t[t].name);
                    continue;
                }
                d->scratch = 1;
                int sl = -1;
                for (int q = 0; q < nsl; q++)
                    if (scratch_t[q] == r) sl = q;
                if (sl < 0) {
                    if (nsl >= (int)(sizeof scratch_t / sizeof scratch_t[0]))
                        return dm_fail(DM_ERR_INTERNAL, "too many scratch rows");
                    sl = nsl;
                    scratch_t[nsl++] = r;
                }
                d->slot = (int64_t)sl * ((ex->max_cols + 15) / 16 * 16);
            }
        }
    }
    int64_t rowsz = (ex->max_cols + 15) / 16 * 16;
    for (int k = 0; k < eg->nops; k++)
        for (int s = 0; s < eg->ops[k].op->nout; s++)
            if (eg->ops[k].out[s].kind == DM_ARG_COLACC) eg->ops[k].out[s].slot += nsl * rowsz;
    for (int a = 0; a < eg->nacc; a++) eg->acc_slot[a] += nsl * rowsz;
    eg->scratch_floats = nsl * rowsz + acc_used;
    return DM_OK;
}

dm_status dm_cpu_exec_init(dm_cpu_exec *ex, const dm_plan *plan, char *arena, int nthreads) {
    memset(ex, 0, sizeof *ex);
    ex->nthreads = nthreads;
    ex->max_cols = plan->max_cols > 0 ? plan->max_cols : 1;
    ex->ngroups = plan->ngroups;
    ex->groups = calloc((size_t)plan->ngroups, sizeof(dm_exgroup));
    if (!ex->groups) return dm_fail(DM_ERR_OOM, "out of memory preparing the plan");
    for (int gi = 0; gi < plan->ngroups; gi++) {
        ex->groups[gi].gr = &plan->groups[gi];
        dm_status s = init_group(ex, &ex->groups[gi], plan, arena);
        if (s != DM_OK) {
            dm_cpu_exec_free(ex);
            return s;
        }
        if (ex->groups[gi].scratch_floats > ex->per_thread)
            ex->per_thread = ex->groups[gi].scratch_floats;
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
    return DM_OK;
}

void dm_cpu_exec_free(dm_cpu_exec *ex) {
    if (ex->groups)
        for (int gi = 0; gi < ex->ngroups; gi++) free(ex->groups[gi].ops);
    free(ex->groups);
    free(ex->scratch);
    free(ex->words);
    memset(ex, 0, sizeof *ex);
}

static inline float *resolve(const dm_operand *d, float *scr, int64_t r, int64_t cols) {
    if (d->scratch) return scr + d->slot;
    switch (d->kind) {
    case DM_ARG_FULL: return d->base + r * cols;
    case DM_ARG_COLVEC: return d->base;
    case DM_ARG_GROUPED: return d->base + (r / d->rdiv) * cols;
    case DM_ARG_ROWSCALAR: return d->base + r;
    case DM_ARG_COLACC: return scr + d->slot;
    }
    return NULL;
}

dm_status dm_cpu_exec_group(const dm_cpu_exec *ex, int gi, uint64_t seed) {
    const dm_exgroup *eg = &ex->groups[gi];
    if (eg->contract) return dm_gemm_run(&eg->gemm);
    int64_t rows = eg->gr->rows, cols = eg->gr->cols;
#pragma omp parallel num_threads(ex->nthreads)
    {
        int tid = omp_get_thread_num();
        float *scr = ex->scratch + (int64_t)tid * ex->per_thread;
        for (int a = 0; a < eg->nacc; a++) memset(scr + eg->acc_slot[a], 0, sizeof(float) * (size_t)cols);
        dm_row rw = {.cols = cols, .seed = seed, .words = ex->words + (int64_t)tid * ex->max_cols};
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            rw.r = r;
            for (int k = 0; k < eg->nops; k++) {
                const dm_exop *x = &eg->ops[k];
                rw.op = x->op;
                for (int s = 0; s < x->op->nin; s++) rw.in[s] = resolve(&x->in[s], scr, r, cols);
                for (int s = 0; s < x->op->nout; s++) rw.out[s] = resolve(&x->out[s], scr, r, cols);
                dm_cpu_row(&rw);
            }
        }
        int nteam = omp_get_num_threads();
        for (int a = 0; a < eg->nacc; a++) {
#pragma omp for schedule(static)
            for (int64_t c = 0; c < cols; c++) {
                float s = 0;
                for (int t = 0; t < nteam; t++)
                    s += ex->scratch[(int64_t)t * ex->per_thread + eg->acc_slot[a] + c];
                eg->acc_dst[a][c] = s;
            }
        }
    }
    return DM_OK;
}
