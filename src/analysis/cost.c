/* cost.c: the cost model (cost.h): flop and bytes per operator and per fused group, the
 * roofline bound and predicted time of each on a device model, per-class shares and the
 * unfused vs fused bytes of the whole step. Nothing here allocates tensors, so a
 * BERT-large analysis is instant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/cost.h"
#include "core/status.h"
#include "plan/compile.h"

const char *dm_dtype_bytes_name(int dtype_bytes) { return dtype_bytes >= 4 ? "fp32" : "bf16/fp16"; }

void dm_cost_op_io(const dm_graph *g, const dm_op *op, int dtype_bytes, double *rd, double *wr) {
    double r = 0, w = 0;
    for (int i = 0; i < op->nin; i++) {
        int dup = 0;
        for (int k = 0; k < i; k++) dup |= op->in[k] == op->in[i];
        if (!dup) r += dm_op_moves(g, op, 0, i) * dtype_bytes; /* a gather: the rows it reads */
    }
    for (int i = 0; i < op->nout; i++) w += dm_op_moves(g, op, 1, i) * dtype_bytes;
    *rd = r;
    *wr = w;
}

/* Is tensor t written inside the group: itself, or its whole root? */
static int written_in(const dm_graph *g, const int *wt, int nw, int t) {
    int root = dm_tensor_root(g, t);
    for (int k = 0; k < nw; k++)
        if (wt[k] == t || wt[k] == root) return 1;
    return 0;
}

static int listed(const int *v, int n, int x) {
    for (int k = 0; k < n; k++)
        if (v[k] == x) return 1;
    return 0;
}

dm_status dm_cost_group_io(const dm_plan *plan, int G, int dtype_bytes, double *rd, double *wr) {
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[G];
    int cap = gr->nops * (DM_MAX_IN + DM_MAX_OUT);
    int *wt = malloc(sizeof(int) * (size_t)(cap > 0 ? cap : 1)); /* written tensors */
    int *seen = malloc(sizeof(int) * (size_t)(cap > 0 ? cap : 1));
    double r = 0, w = 0;
    *rd = *wr = 0;
    if (!wt || !seen) {
        free(wt);
        free(seen);
        return dm_fail(DM_ERR_OOM, "out of memory counting the bytes of a group");
    }
    int nw = 0, ns = 0;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        for (int s = 0; s < op->nout; s++)
            if (!listed(wt, nw, op->out[s])) wt[nw++] = op->out[s];
    }
    for (int k = 0; k < nw; k++)
        if (plan->in_memory[dm_tensor_root(g, wt[k])]) w += (double)g->t[wt[k]].numel * dtype_bytes;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        for (int s = 0; s < op->nin; s++) {
            int t = op->in[s];
            if (listed(seen, ns, t) || written_in(g, wt, nw, t)) continue;
            seen[ns++] = t;
            r += dm_op_moves(g, op, 0, s) * dtype_bytes; /* a gather: the rows it reads */
        }
    }
    free(wt);
    free(seen);
    *rd = r;
    *wr = w;
    return DM_OK;
}

static double safe_div(double a, double b) { return b > 0 ? a / b : 0.0; }

double dm_cost_epilogue_bias(const dm_plan *plan, int G, int dtype_bytes) {
    if (G < 1 || G >= plan->ngroups) return 0;
    const dm_graph *g = plan->g;
    const dm_group *pc = &plan->groups[G - 1], *pb = &plan->groups[G];
    if (pc->nops != 1 || pb->nops != 1 || pc->nbatch > 1 || pb->nbatch > 1 || pc->pass != pb->pass) return 0;
    const dm_op *c = &g->op[plan->order[pc->first]], *b = &g->op[plan->order[pb->first]];
    if (c->kind != DM_OP_CONTRACT || b->kind != DM_OP_BIAS_ADD) return 0;
    const int pre = dm_tensor_root(g, c->out[0]);
    if (dm_tensor_root(g, b->in[0]) != pre || dm_tensor_root(g, b->out[0]) == pre) return 0;
    if (g->t[pre].numel != b->rows * b->cols) return 0;
    for (int o = 0; o < g->nop; o++) {
        if (&g->op[o] == b) continue;
        for (int s = 0; s < g->op[o].nin; s++)
            if (dm_tensor_root(g, g->op[o].in[s]) == pre) return 0;
    }
    return (double)g->t[pre].numel * dtype_bytes;
}

void dm_cost_group_flop(const dm_plan *plan, int G, double *contract, double *other) {
    const dm_group *gr = &plan->groups[G];
    double fc = 0, fo = 0;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &plan->g->op[plan->order[gr->first + k]];
        const double f = dm_op_flop(plan->g, op);
        /* the fused decoder and cross-entropy: its GEMMs at the contraction peak, its row
         * work (dm_op_row_flop) at the vector peak */
        const double rw = dm_op_row_flop(op);
        if (dm_op_kind_class(op->kind) == DM_CLASS_CONTRACTION) fc += f - rw, fo += rw;
        else fo += f;
    }
    *contract = fc;
    *other = fo;
}

double dm_roofline_seconds(const dm_device *dev, int dtype_bytes, double contract_flop, double other_flop,
                           double bytes) {
    const double tc = safe_div(contract_flop, dm_device_contract_peak(dev, dtype_bytes)) +
                      safe_div(other_flop, dm_device_vector_peak(dev, dtype_bytes));
    const double tm = safe_div(bytes, dev->bandwidth);
    return tc > tm ? tc : tm;
}

const char *dm_ratio_text(double x, char *buf, size_t n) {
    if (!buf || !n) return "";
    if (x < 1000) snprintf(buf, n, "%.3g", x);
    else snprintf(buf, n, "%.0f", x);
    return buf;
}

dm_status dm_cost_analyze(const dm_graph *g, const dm_plan *fused, const dm_device *dev,
                          int dtype_bytes, dm_cost_report *r) {
    if (!g || !fused || !dev || !r) return dm_fail(DM_ERR_INVALID_ARG, "dm_cost_analyze: NULL");
    if (dtype_bytes != 2 && dtype_bytes != 4)
        return dm_fail(DM_ERR_INVALID_ARG, "dtype size must be 4 (fp32) or 2 (bf16/fp16)");
    if (dev->bandwidth <= 0 || dev->vector_flops <= 0 || dm_device_contract_peak(dev, dtype_bytes) <= 0)
        return dm_fail(DM_ERR_INVALID_ARG, "device '%s' has no positive rates", dev->name);
    memset(r, 0, sizeof *r);
    r->dev = *dev;
    r->dtype_bytes = dtype_bytes;
    r->nops = g->nop;
    r->ngroups = fused->ngroups;
    r->fused_graph = fused->g;
    r->ops = calloc((size_t)(g->nop > 0 ? g->nop : 1), sizeof *r->ops);
    r->groups = calloc((size_t)(fused->ngroups > 0 ? fused->ngroups : 1), sizeof *r->groups);
    if (!r->ops || !r->groups) {
        dm_cost_free(r);
        return dm_fail(DM_ERR_OOM, "out of memory in the cost model");
    }
    double pc = dm_device_contract_peak(dev, dtype_bytes), pv = dm_device_vector_peak(dev, dtype_bytes);
    for (int o = 0; o < g->nop; o++) {
        const dm_op *op = &g->op[o];
        dm_op_cost *c = &r->ops[o];
        c->op = o;
        c->cls = dm_op_kind_class(op->kind);
        c->pass = op->pass;
        c->flop = dm_op_flop(g, op);
        dm_cost_op_io(g, op, dtype_bytes, &c->bytes_read, &c->bytes_written);
        c->bytes = c->bytes_read + c->bytes_written;
        c->intensity = safe_div(c->flop, c->bytes);
        c->peak = c->cls == DM_CLASS_CONTRACTION ? pc : pv;
        c->t_compute = c->flop / c->peak;
        c->t_memory = c->bytes / dev->bandwidth;
        c->memory_bound = c->t_memory >= c->t_compute;
        c->predicted_s = c->memory_bound ? c->t_memory : c->t_compute;
        r->flop_total += c->flop;
        r->class_flop[c->cls] += c->flop;
        r->pass_flop[c->pass & 1][c->cls] += c->flop;
        r->class_time[c->cls] += c->predicted_s;
        r->unfused_bytes += c->bytes;
        r->unfused_floor_s += c->predicted_s;
    }
    for (int G = 0; G < fused->ngroups; G++) {
        const dm_group *gr = &fused->groups[G];
        dm_group_cost *c = &r->groups[G];
        c->group = G;
        c->pass = gr->pass;
        c->cls = gr->cls;
        c->nops = gr->nops;
        c->ops = fused->order + gr->first;
        double fc = 0, fo = 0;
        dm_cost_group_flop(fused, G, &fc, &fo);
        c->flop = fc + fo;
        c->t_compute = safe_div(fc, pc) + safe_div(fo, pv);
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &fused->g->op[c->ops[k]];
            if (op->recomputed) r->recomputed_flop += dm_op_flop(fused->g, op);
        }
        dm_status st = dm_cost_group_io(fused, G, dtype_bytes, &c->bytes_read, &c->bytes_written);
        if (st != DM_OK) {
            dm_cost_free(r);
            return st;
        }
        /* the GPU runs a lone bias add in its GEMM's epilogue: the pre-bias tensor is
         * neither written by the GEMM nor read by the bias group */
        const double epi = dev->is_cpu ? 0 : dm_cost_epilogue_bias(fused, G, dtype_bytes);
        if (epi > 0) {
            c->bytes_read -= epi;
            r->groups[G - 1].bytes_written -= epi;
            c->in_epilogue = 1;
            r->bias_epilogues++;
        }
        r->fused_flop += c->flop;
    }
    /* the roofline of each group (t_compute as dm_roofline_seconds counts it), a GEMM and
     * the bias in its epilogue as one */
    for (int G = 0; G < fused->ngroups; G++) {
        dm_group_cost *c = &r->groups[G];
        c->bytes = c->bytes_read + c->bytes_written;
        c->t_memory = c->bytes / dev->bandwidth;
        c->predicted_s = c->t_compute > c->t_memory ? c->t_compute : c->t_memory;
        r->fused_bytes += c->bytes;
        if (c->in_epilogue) {
            dm_group_cost *p = &r->groups[G - 1];
            const double tc = p->t_compute + c->t_compute, tm = p->t_memory + c->t_memory;
            r->fused_floor_s -= p->predicted_s;
            p->predicted_s = tc > tm ? tc : tm;
            r->fused_floor_s += p->predicted_s;
            c->predicted_s = 0;
        }
        r->fused_floor_s += c->predicted_s;
    }
    r->reduction_pct = r->unfused_bytes > 0 ? 100.0 * (1.0 - r->fused_bytes / r->unfused_bytes) : 0;
    return DM_OK;
}

void dm_cost_free(dm_cost_report *r) {
    if (!r) return;
    free(r->ops);
    free(r->groups);
    r->ops = NULL;
    r->groups = NULL;
}

dm_status dm_cost_build(const dm_layer_config *cfg, int cpu, int recompute, int tuned, dm_graph *g, dm_graph *gf,
                        dm_plan *plan) {
    memset(plan, 0, sizeof *plan);
    dm_graph_init(gf);
    const dm_compile_opts unfused = {.cfg = cfg, .schedule = DM_SCHED_UNFUSED};
    /* the CPU's grouping: its attention as one op where its executor runs it so */
    const dm_compile_opts fused = {.cfg = cfg, .schedule = DM_SCHED_FUSED, .recompute = recompute, .no_siblings = !cpu,
                                   .attn_op = cpu && dm_cpu_attn_op_default(cfg, DM_SCHED_FUSED, 0, recompute, tuned)};
    dm_status st = dm_compile(&unfused, g, NULL, NULL);
    return st == DM_OK ? dm_compile(&fused, gf, NULL, plan) : st;
}

dm_status dm_cost_floors(const dm_layer_config *cfg, const dm_device *dev, int dtype_bytes, int recompute,
                         double *unfused_s, double *fused_s) {
    dm_graph g, gf;
    dm_plan plan;
    dm_cost_report rep;
    memset(&rep, 0, sizeof rep);
    dm_status st = dm_cost_build(cfg, dev->is_cpu, recompute, 0, &g, &gf, &plan);
    if (st == DM_OK) st = dm_cost_analyze(&g, &plan, dev, dtype_bytes, &rep);
    if (st == DM_OK) {
        *unfused_s = rep.unfused_floor_s;
        *fused_s = rep.fused_floor_s;
    }
    dm_cost_free(&rep);
    dm_plan_free(&plan);
    dm_graph_free(&gf);
    dm_graph_free(&g);
    return st;
}
