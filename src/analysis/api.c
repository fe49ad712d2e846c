/* api.c: the public analysis API of dmove_tools.h: CPU profiles (dm_profile), device
 * models (dm_device_model), the analysis of a training step (dm_analysis: its graphs,
 * plans, cost report and memory report; a tuned plan applied to it) and the group chart.
 * The reports as text, JSON and CSV are textreport.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis_api.h"

#include "core/status.h"
#include "core/sysinfo.h"
#include "plan/compile.h"

/* --- CPU profiles ---------------------------------------------------------------------- */

_Static_assert(DM_PROBE_MAX_THREADS == DM_PROFILE_MAX_THREADS, "the public profile holds every thread count");

static dm_status profile_alloc(dm_profile **out) {
    *out = calloc(1, sizeof **out);
    return *out ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
}

dm_status dm_profile_measure(dm_profile **out, int max_threads, void (*progress)(const char *line)) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_measure: NULL argument");
    DM_TRY(dm_threads_room(max_threads, "OpenBLAS's buffers and the stacks for the SGEMM probe's threads"));
    DM_TRY(profile_alloc(out));
    dm_status s = dm_cpu_probe(&(*out)->p, max_threads, progress);
    if (s != DM_OK) {
        free(*out);
        *out = NULL;
    }
    return s;
}

dm_status dm_profile_open(dm_profile **out, const char *path) {
    if (out) *out = NULL;
    if (!out || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_open: NULL argument");
    DM_TRY(profile_alloc(out));
    dm_status s = dm_profile_load(path, &(*out)->p);
    if (s != DM_OK) {
        free(*out);
        *out = NULL;
    }
    return s;
}

dm_status dm_profile_write(const dm_profile *p, const char *path) {
    if (!p || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_write: NULL argument");
    return dm_profile_save(path, &p->p);
}

void dm_profile_get_info(const dm_profile *p, dm_profile_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!p) return;
    const dm_cpu_profile *q = &p->p;
    snprintf(out->machine, sizeof out->machine, "%s", q->machine);
    snprintf(out->host, sizeof out->host, "%s", q->host);
    snprintf(out->date, sizeof out->date, "%s", q->date);
    out->threads = q->threads;
    out->triad_bw = q->triad_bw;
    out->read_bw = q->read_bw;
    out->vector_flops = q->vector_flops;
    out->sgemm_n = q->sgemm_n;
    out->nsgemm = q->nsgemm;
    for (int k = 0; k < q->nsgemm && k < DM_PROBE_MAX_THREADS; k++) {
        out->sgemm_threads[k] = q->sgemm_threads[k];
        out->sgemm_flops[k] = q->sgemm_flops[k];
        out->direct_flops[k] = q->direct_flops[k];
    }
    snprintf(out->direct_kernel, sizeof out->direct_kernel, "%s", q->direct_kernel);
}

void dm_profile_free(dm_profile *p) { free(p); }

/* --- Device models --------------------------------------------------------------------- */

dm_status dm_device_model_preset(dm_device_model **out, const char *name) {
    if (out) *out = NULL;
    if (!out || !name) return dm_fail(DM_ERR_INVALID_ARG, "dm_device_model_preset: NULL argument");
    dm_device d;
    DM_TRY(dm_device_preset(name, &d));
    if (!(*out = malloc(sizeof **out))) return dm_fail(DM_ERR_OOM, "out of memory");
    (*out)->d = d;
    return DM_OK;
}

dm_status dm_device_model_cpu(dm_device_model **out, const dm_profile *p, int threads) {
    if (out) *out = NULL;
    if (!out || !p) return dm_fail(DM_ERR_INVALID_ARG, "dm_device_model_cpu: NULL argument");
    dm_device d;
    DM_TRY(dm_device_from_profile(&p->p, threads, &d));
    if (!(*out = malloc(sizeof **out))) return dm_fail(DM_ERR_OOM, "out of memory");
    (*out)->d = d;
    return DM_OK;
}

void dm_device_model_free(dm_device_model *m) { free(m); }
/* The getters of no model: "" and 0 (dmove_tools.h). */
const char *dm_device_model_name(const dm_device_model *m) { return m ? m->d.name : ""; }
const char *dm_device_model_desc(const dm_device_model *m) { return m ? m->d.desc : ""; }
int dm_device_model_is_cpu(const dm_device_model *m) { return m ? m->d.is_cpu : 0; }
double dm_device_model_bandwidth(const dm_device_model *m) { return m ? m->d.bandwidth : 0.0; }

double dm_device_model_contract_peak(const dm_device_model *m, int dtype_bytes) {
    return m ? dm_device_contract_peak(&m->d, dtype_bytes) : 0.0;
}

double dm_device_model_vector_peak(const dm_device_model *m, int dtype_bytes) {
    return m ? dm_device_vector_peak(&m->d, dtype_bytes) : 0.0;
}

double dm_device_model_roofline(const dm_device_model *m, int dtype_bytes, double contract_flop, double other_flop,
                                double bytes) {
    return m ? dm_roofline_seconds(&m->d, dtype_bytes, contract_flop, other_flop, bytes) : 0.0;
}

/* --- The group chart ------------------------------------------------------------------- */

dm_status dm_group_chart_write_svg(const char *title, const char *subtitle, const dm_group_chart *sec, int nsec,
                                   const char *path) {
    if (!path) return dm_fail(DM_ERR_INVALID_ARG, "dm_group_chart_write_svg: NULL argument");
    if (nsec < 0 || (nsec > 0 && !sec)) return dm_fail(DM_ERR_INVALID_ARG, "dm_group_chart_write_svg: no sections");
    size_t nbars = 0;
    for (int k = 0; k < nsec; k++) {
        if (sec[k].nbars < 0 || (sec[k].nbars > 0 && !sec[k].bars))
            return dm_fail(DM_ERR_INVALID_ARG, "dm_group_chart_write_svg: section %d has %d bars%s", k, sec[k].nbars,
                           sec[k].nbars > 0 ? " and NULL for them" : "");
        if (!dm_add_ok(nbars, (size_t)sec[k].nbars, &nbars))
            return dm_fail(DM_ERR_OOM, "dm_group_chart_write_svg: too many bars");
    }
    dm_chart_section *s = calloc((size_t)(nsec > 0 ? nsec : 1), sizeof *s);
    dm_chart_bar *bars = calloc(nbars > 0 ? nbars : 1, sizeof *bars);
    if (!s || !bars) {
        free(s);
        free(bars);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    dm_chart_bar *b = bars;
    for (int k = 0; k < nsec; k++) {
        s[k] = (dm_chart_section){sec[k].name, sec[k].summary, b, sec[k].nbars};
        for (int q = 0; q < sec[k].nbars; q++, b++) {
            const dm_group_bar *x = &sec[k].bars[q];
            *b = (dm_chart_bar){x->label, x->pass, x->cls, x->ms, x->floor_ms, x->note};
        }
    }
    dm_status st = dm_groups_write_svg(title, subtitle, s, nsec, path);
    free(bars);
    free(s);
    return st;
}

/* --- The analysis ---------------------------------------------------------------------- */

dm_status dm_analysis_memory_report(const dm_layer_config *cfg, int cpu, int tuned, const dm_graph *gf,
                                    const dm_plan *plan, int dtype_bytes, dm_analysis_memory *m) {
    memset(m, 0, sizeof *m);
    const double scale = dtype_bytes / 4.0;
    for (int t = 0; t < gf->nt; t++) {
        if (gf->t[t].base >= 0 || gf->t[t].role != DM_ROLE_ACT || gf->t[t].pass != 0 || !plan->in_memory[t]) continue;
        int read_bwd = 0;
        for (int o = 0; o < gf->nop && !read_bwd; o++)
            for (int k = 0; k < gf->op[o].nin; k++)
                read_bwd |= gf->op[o].pass == 1 && dm_tensor_root(gf, gf->op[o].in[k]) == t;
        if (!read_bwd) continue;
        m->saved_bytes += (double)gf->t[t].numel * dtype_bytes;
        if (m->n == 64) continue; /* listed: the 64 first (the encoder keeps 13) */
        int at = m->n++;
        while (at > 0 && gf->t[m->t[at - 1]].numel < gf->t[t].numel) {
            m->t[at] = m->t[at - 1];
            at--;
        }
        m->t[at] = t;
    }
    /* the three plans, built as dm_layer_new builds them (the one analysed among them) */
    for (int v = 0; v < 3; v++) {
        dm_graph g2;
        dm_plan p2;
        const dm_compile_opts co = {
            .cfg = cfg, .schedule = v > 0 ? DM_SCHED_FUSED : DM_SCHED_UNFUSED, .recompute = v == 2, .no_siblings = !cpu,
            .attn_op = v == 1 && cpu && dm_cpu_attn_op_default(cfg, DM_SCHED_FUSED, 0, 0, tuned)};
        dm_status s = dm_compile(&co, &g2, NULL, &p2);
        if (s == DM_OK) *(v == 0 ? &m->unfused : v == 1 ? &m->fused : &m->recompute) = (double)p2.activation_bytes * scale;
        dm_plan_free(&p2);
        dm_graph_free(&g2);
        if (s != DM_OK) return s;
    }
    return DM_OK;
}

dm_status dm_analysis_new(dm_analysis **out, const dm_layer_config *cfg, const dm_device_model *dev,
                          int dtype_bytes, int recompute) {
    if (out) *out = NULL;
    if (!out || !cfg || !dev) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_new: NULL argument");
    return dm_analysis_make(out, cfg, &dev->d, dtype_bytes, recompute, 0);
}

dm_status dm_analysis_make(dm_analysis **out, const dm_layer_config *cfg, const dm_device *dev, int dtype_bytes,
                           int recompute, int tuned) {
    *out = NULL;
    if (dtype_bytes != 4 && dtype_bytes != 2)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_new: %d bytes per element (4 or 2)", dtype_bytes);
    dm_analysis *a = calloc(1, sizeof *a);
    if (!a) return dm_fail(DM_ERR_OOM, "out of memory");
    a->cfg = *cfg;
    a->dev = *dev;
    a->dtype_bytes = dtype_bytes;
    a->recompute = recompute;
    a->tuned = tuned;
    dm_status s = dm_cost_build(&a->cfg, a->dev.is_cpu, recompute, tuned, &a->g, &a->gf, &a->plan);
    if (s == DM_OK) s = dm_cost_analyze(&a->g, &a->plan, &a->dev, dtype_bytes, &a->rep);
    if (s == DM_OK)
        s = dm_analysis_memory_report(&a->cfg, a->dev.is_cpu, tuned, &a->gf, &a->plan, dtype_bytes, &a->mem);
    if (s != DM_OK) {
        dm_analysis_free(a);
        return s;
    }
    *out = a;
    return DM_OK;
}

void dm_analysis_free(dm_analysis *a) {
    if (!a) return;
    free(a->partner);
    if (a->have_choices) dm_choices_free(&a->ch);
    free(a->plan_path);
    free(a->op_secs);
    dm_cost_free(&a->rep);
    dm_plan_free(&a->plan);
    dm_graph_free(&a->gf);
    dm_graph_free(&a->g);
    free(a);
}

int dm_analysis_num_ops(const dm_analysis *a) { return a ? a->rep.nops : 0; }

dm_status dm_analysis_write_svg(const dm_analysis *a, const char *title, const char *path) {
    if (!a || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_write_svg: NULL argument");
    return dm_cost_write_svg(&a->g, &a->rep, title, path);
}

dm_status dm_analysis_floors(const dm_layer_config *cfg, const dm_device_model *m, int dtype_bytes, int recompute,
                             double *unfused_s, double *fused_s) {
    if (!cfg || !m || !unfused_s || !fused_s) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_floors: NULL argument");
    return dm_cost_floors(cfg, &m->d, dtype_bytes, recompute, unfused_s, fused_s);
}
