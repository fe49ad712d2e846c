/* textreport.c: the reports of the public analysis API (dmove_tools.h) as `dmove analyze`
 * prints them: the tables (operators, classes, data movement, fused groups, memory), one
 * JSON object, the operator table as CSV (each with the measured columns after
 * dm_analysis_measure), and the JSON of a tuned plan's layouts, algorithms and
 * side-by-side pairs (their table is tune/api.c's: the algorithms are named by the backend
 * that runs them). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "analysis/analysis_api.h"
#include "core/status.h"
#include "core/strbuf.h"

typedef struct {
    double secs, gbs, gflops, roof_pct, mue;
} measured;

static void measured_of(const dm_cost_report *r, int o, const double *op_secs, measured *m) {
    const dm_op_cost *c = &r->ops[o];
    memset(m, 0, sizeof *m);
    m->secs = op_secs[o];
    if (m->secs <= 0) return;
    m->gbs = c->bytes / m->secs / 1e9;
    m->gflops = c->flop / m->secs / 1e9;
    m->roof_pct = 100.0 * c->predicted_s / m->secs;
    /* MUE = (Q / D) * (B / B^): Q the op's minimal bytes (its own I/O), D the bytes it
     * moves: the same, as an unfused kernel streams each operand once (no hardware
     * counters: see README); B achieved = D / t, B^ the device bandwidth. */
    double Q = c->bytes, D = c->bytes;
    m->mue = 100.0 * (Q / D) * (m->gbs * 1e9 / r->dev.bandwidth);
}

static dm_status text_done(dm_sbuf *b, char **text) {
    *text = dm_sb_done(b);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory building the report");
}

/* The variant in words for the headers: BERT's post-LN bidirectional layer says nothing. */
static const char *variant(const dm_layer_config *cfg) {
    if (cfg->norm == DM_NORM_PRE) return cfg->causal ? ", pre-LN, causal" : ", pre-LN";
    return cfg->causal ? ", causal" : "";
}

/* The operators, each against the roofline (and as measured). */
static void table_ops(dm_sbuf *b, const dm_analysis *a) {
    const dm_layer_config *cfg = &a->cfg;
    const dm_cost_report *r = &a->rep;
    const double *op_secs = a->op_secs;
    dm_sb_printf(b, "dmove analyze: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
                 "%s, %s, %d ops, %d fused groups%s\n", cfg->batch, cfg->seq, cfg->hidden, cfg->heads,
                 cfg->ffn, variant(cfg), dm_dtype_bytes_name(r->dtype_bytes), r->nops, r->ngroups,
                 r->recomputed_flop > 0 ? " (attention recomputed in the backward)" : "");
    dm_sb_printf(b, "device %s: %s\n", r->dev.name, r->dev.desc);
    dm_sb_printf(b, "  roofs: contraction %.1f GFLOP/s, vector %.1f GFLOP/s, memory %.1f GB/s\n\n",
                 dm_device_contract_peak(&r->dev, r->dtype_bytes) / 1e9,
                 dm_device_vector_peak(&r->dev, r->dtype_bytes) / 1e9, r->dev.bandwidth / 1e9);
    dm_sb_printf(b, "%-26s %-4s %-13s %9s %9s %8s %-7s %9s", "operator", "pass", "class", "GFLOP", "MB",
                 "flop/B", "bound", "pred ms");
    if (op_secs)
        dm_sb_printf(b, " %9s %8s %8s %7s %6s", "meas ms", "GB/s", "GFLOP/s", "%roof", "MUE%");
    dm_sb_printf(b, "\n");
    for (int o = 0; o < r->nops; o++) {
        const dm_op_cost *oc = &r->ops[o];
        dm_sb_printf(b, "%-26.26s %-4s %-13s %9.4f %9.3f %8.2f %-7s %9.4f", a->g.op[oc->op].name,
                     oc->pass ? "bwd" : "fwd", dm_class_name(oc->cls), oc->flop / 1e9, oc->bytes / 1e6,
                     oc->intensity, oc->memory_bound ? "memory" : "compute", oc->predicted_s * 1e3);
        if (op_secs) {
            measured m;
            measured_of(r, o, op_secs, &m);
            dm_sb_printf(b, " %9.4f %8.1f %8.1f %7.1f %6.1f", m.secs * 1e3, m.gbs, m.gflops, m.roof_pct,
                         m.mue);
        }
        dm_sb_printf(b, "\n");
    }
}

/* Per class, the step's data movement, and the fused groups. */
static void table_classes_groups(dm_sbuf *b, const dm_analysis *a) {
    const dm_cost_report *r = &a->rep;
    const double *op_secs = a->op_secs;
    double tsum = r->class_time[0] + r->class_time[1] + r->class_time[2];
    double msum[DM_NUM_CLASSES] = {0}, mtot = 0;
    if (op_secs)
        for (int o = 0; o < r->nops; o++) msum[r->ops[o].cls] += op_secs[o], mtot += op_secs[o];
    dm_sb_printf(b, "\nper class (unfused; %% of the step's flop vs %% of its predicted time%s):\n",
                 op_secs ? ", and of its measured time" : "");
    dm_sb_printf(b, "%-14s %10s %10s %10s %8s %8s", "class", "fwd GFLOP", "bwd GFLOP", "GFLOP", "% flop",
                 "% pred");
    if (op_secs) dm_sb_printf(b, " %9s %7s", "meas ms", "% meas");
    dm_sb_printf(b, "\n");
    for (int k = 0; k < DM_NUM_CLASSES; k++) {
        dm_sb_printf(b, "%-14s %10.3f %10.3f %10.3f %8.2f %8.2f", dm_class_name((dm_op_class)k),
                     r->pass_flop[0][k] / 1e9, r->pass_flop[1][k] / 1e9, r->class_flop[k] / 1e9,
                     r->flop_total > 0 ? 100 * r->class_flop[k] / r->flop_total : 0,
                     tsum > 0 ? 100 * r->class_time[k] / tsum : 0);
        if (op_secs) dm_sb_printf(b, " %9.3f %7.2f", msum[k] * 1e3, mtot > 0 ? 100 * msum[k] / mtot : 0);
        dm_sb_printf(b, "\n");
    }
    dm_sb_printf(b, "\ndata movement of the step (%s):\n", dm_dtype_bytes_name(r->dtype_bytes));
    dm_sb_printf(b, "  unfused  %10.2f MB   roofline floor %9.3f ms\n", r->unfused_bytes / 1e6,
                 r->unfused_floor_s * 1e3);
    dm_sb_printf(b, "  fused    %10.2f MB   roofline floor %9.3f ms", r->fused_bytes / 1e6, r->fused_floor_s * 1e3);
    if (r->recomputed_flop > 0)
        dm_sb_printf(b, "   (attention recomputed: +%.3f GFLOP, %.2f%% of the step's)", r->recomputed_flop / 1e9,
                     100.0 * r->recomputed_flop / r->flop_total);
    dm_sb_printf(b, "\n");
    dm_sb_printf(b, "  reduction %.2f%% of the bytes; floor fused/unfused %.3f\n", r->reduction_pct,
                 r->unfused_floor_s > 0 ? r->fused_floor_s / r->unfused_floor_s : 0);
    if (op_secs)
        dm_sb_printf(b, "  measured unfused step (sum of profiled ops) %.3f ms = %.2fx its floor\n",
                     mtot * 1e3, r->unfused_floor_s > 0 ? mtot / r->unfused_floor_s : 0);
    dm_sb_printf(b, "\nfused groups (bytes = materialized external inputs read once + materialized "
                 "outputs written once):\n");
    dm_sb_printf(b, "%5s %-4s %-13s %9s %9s %9s  %s\n", "group", "pass", "class", "read MB", "write MB",
                 "pred ms", "ops");
    for (int G = 0; G < r->ngroups; G++) {
        const dm_group_cost *gc = &r->groups[G];
        dm_sb_printf(b, "%5d %-4s %-13s %9.3f %9.3f %9.4f  ", G, gc->pass ? "bwd" : "fwd",
                     dm_class_name(gc->cls), gc->bytes_read / 1e6, gc->bytes_written / 1e6,
                     gc->predicted_s * 1e3);
        for (int k = 0; k < gc->nops; k++) dm_sb_printf(b, "%s%s", k ? " " : "", r->fused_graph->op[gc->ops[k]].name);
        if (gc->in_epilogue)
            dm_sb_printf(b, "  (in the epilogue of %s: its floor counted there)",
                         r->fused_graph->op[r->groups[G - 1].ops[0]].name);
        dm_sb_printf(b, "\n");
    }
    if (r->bias_epilogues > 0)
        dm_sb_printf(b, "(%d bias add%s in the GEMM's cuBLASLt epilogue, as the CUDA executor runs %s: the "
                     "pre-bias tensor never reaches memory)\n",
                     r->bias_epilogues, r->bias_epilogues > 1 ? "s" : "", r->bias_epilogues > 1 ? "them" : "it");
}

static void table_memory(dm_sbuf *b, const dm_analysis *a) {
    const dm_graph *gf = &a->gf;
    const dm_analysis_memory *m = &a->mem;
    dm_sb_printf(b, "\nmemory between the passes: the tensors the forward keeps for the backward (fused plan%s), %.2f MB:\n",
                 a->recompute ? ", attention recomputed" : "", m->saved_bytes / 1e6);
    for (int k = 0; k < m->n; k++)
        dm_sb_printf(b, "  %-24s %9.3f MB\n", gf->t[m->t[k]].name, (double)gf->t[m->t[k]].numel * a->dtype_bytes / 1e6);
    dm_sb_printf(b, "intermediates at their peak (one arena, first fit over live intervals): fused %.2f MB, unfused "
                 "%.2f MB, fused with --recompute %.2f MB (attention's probabilities recomputed in the backward)\n",
                 m->fused / 1e6, m->unfused / 1e6, m->recompute / 1e6);
}

dm_status dm_analysis_table(const dm_analysis *a, char **text) {
    if (!a || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_table: NULL argument");
    dm_sbuf b = {0};
    table_ops(&b, a);
    table_classes_groups(&b, a);
    table_memory(&b, a);
    return text_done(&b, text);
}

dm_status dm_analysis_csv(const dm_analysis *a, char **text) {
    if (!a || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_csv: NULL argument");
    char *csv = dm_cost_csv(&a->g, &a->rep);
    if (!csv) return dm_fail(DM_ERR_OOM, "out of memory building the CSV");
    if (!a->op_secs) {
        *text = csv;
        return DM_OK;
    }
    /* append the measured columns line by line */
    dm_sbuf b = {0};
    char *line = csv, *nl;
    int o = -1;
    while ((nl = strchr(line, '\n')) != NULL) {
        *nl = 0;
        if (o < 0) {
            dm_sb_printf(&b, "%s,measured_seconds,gbs,gflops,roofline_pct,mue_pct\n", line);
        } else {
            measured m;
            measured_of(&a->rep, o, a->op_secs, &m);
            dm_sb_printf(&b, "%s,%.9g,%.6g,%.6g,%.4g,%.4g\n", line, m.secs, m.gbs, m.gflops, m.roof_pct,
                         m.mue);
        }
        o++;
        line = nl + 1;
    }
    free(csv);
    *text = dm_sb_done(&b);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory building the CSV");
}

static const char *first_op_name(const dm_analysis *a, int G) {
    return a->gf.op[a->plan.order[a->plan.groups[G].first]].name;
}

/* --- JSON ------------------------------------------------------------------------------ */

static int jnum(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, isfinite(v) ? v : 0.0) != NULL;
}

/* The plan's layouts and algorithms as the plan file has them, and the pairs run side by
 * side: [{"first": op, "beside": op}, ...]; NULL when out of memory. */
static cJSON *plan_json(const dm_analysis *a) {
    const dm_choices *ch = &a->ch;
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddStringToObject(o, "file", a->plan_path) &&
             cJSON_AddStringToObject(o, "tuned_on", ch->machine[0] ? ch->machine : "unknown") &&
             jnum(o, "default_ms", ch->default_ms) && jnum(o, "tuned_ms", ch->tuned_ms) &&
             dm_choices_add_json(o, &a->gf, ch);
    cJSON *arr = ok ? cJSON_AddArrayToObject(o, "side_by_side") : NULL;
    ok = arr != NULL;
    for (int G = 0; ok && G < a->plan.ngroups; G++) {
        if (a->partner[G] < 0) continue;
        cJSON *p = cJSON_CreateObject();
        if (!p || !cJSON_AddItemToArray(arr, p)) { /* not owned by the array: ours to free */
            cJSON_Delete(p);
            ok = 0;
            break;
        }
        ok = cJSON_AddStringToObject(p, "first", first_op_name(a, G)) &&
             cJSON_AddStringToObject(p, "beside", first_op_name(a, a->partner[G]));
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int json_memory(cJSON *root, const dm_analysis *a) {
    const dm_analysis_memory *m = &a->mem;
    cJSON *mo = cJSON_AddObjectToObject(root, "memory"), *sv = NULL;
    int ok = mo && jnum(mo, "saved_for_backward_bytes", m->saved_bytes) &&
             jnum(mo, "intermediates_fused_bytes", m->fused) && jnum(mo, "intermediates_unfused_bytes", m->unfused) &&
             jnum(mo, "intermediates_recompute_bytes", m->recompute) &&
             (sv = cJSON_AddArrayToObject(mo, "saved_for_backward")) != NULL;
    for (int k = 0; ok && k < m->n; k++) {
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(sv, e)) {
            cJSON_Delete(e);
            return 0;
        }
        ok = cJSON_AddStringToObject(e, "tensor", a->gf.t[m->t[k]].name) &&
             jnum(e, "bytes", (double)a->gf.t[m->t[k]].numel * a->rep.dtype_bytes);
    }
    return ok;
}

static int json_measured(cJSON *root, const dm_analysis *a) {
    cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "ops"), *e;
    int o = 0, ok = 1;
    double mtot = 0;
    cJSON_ArrayForEach(e, ops) {
        measured m;
        measured_of(&a->rep, o, a->op_secs, &m);
        mtot += a->op_secs[o++];
        cJSON *x = cJSON_AddObjectToObject(e, "measured");
        ok = ok && x && jnum(x, "seconds", m.secs) && jnum(x, "gbs", m.gbs) &&
             jnum(x, "gflops", m.gflops) && jnum(x, "roofline_pct", m.roof_pct) &&
             jnum(x, "mue_pct", m.mue);
    }
    cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "totals");
    return ok && t && jnum(t, "measured_unfused_seconds", mtot) &&
           cJSON_AddStringToObject(t, "mue_bytes_moved",
                                   "D = the op's own I/O: each unfused operand read or "
                                   "written once (a model, not a hardware count)");
}

dm_status dm_analysis_json(const dm_analysis *a, char **text) {
    if (!a || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_json: NULL argument");
    *text = NULL;
    cJSON *root = dm_cost_json(&a->g, &a->rep, &a->cfg);
    int ok = root != NULL && json_memory(root, a);
    if (ok && a->have_choices) {
        cJSON *pj = plan_json(a);
        if (!pj || !cJSON_AddItemToObject(root, "plan", pj)) { /* owned by root if added */
            cJSON_Delete(pj);
            ok = 0;
        }
    }
    if (ok && a->op_secs) ok = json_measured(root, a);
    char *js = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    size_t n = js ? strlen(js) : 0;
    if (js && (*text = malloc(n + 2)) != NULL) {
        memcpy(*text, js, n);
        memcpy(*text + n, "\n", 2); /* as puts writes it */
    }
    cJSON_free(js);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory building the JSON report");
}
