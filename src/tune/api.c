/* api.c: the public tuning API of dmove_tools.h (dm_tuning: a dm_tuner with its
 * selection, the pairs and epilogues it timed, and their report as text), and the
 * measured side of the public analysis (dm_analysis_measure: it runs a layer, which the
 * analysis below the layer does not) and its plan view (dm_analysis_plan_text: it names
 * the CPU's GEMM algorithms). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis_api.h"
#include "core/status.h"
#include "core/strbuf.h"
#include "tune/tune.h"

dm_status dm_analysis_measure(dm_analysis *a, int threads, int warmup, int reps) {
    if (!a) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_measure: NULL argument");
    double *secs = calloc((size_t)(a->g.nop > 0 ? a->g.nop : 1), sizeof *secs);
    if (!secs) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = dm_cost_measure(&a->cfg, threads, warmup, reps, &a->g, secs);
    if (s != DM_OK) {
        free(secs);
        return s;
    }
    free(a->op_secs);
    a->op_secs = secs;
    return DM_OK;
}

/* A plan file applied to the analysis: `dmove tune` writes plans in the CPU's algorithm
 * names, so it is read with the CPU backend's table. Everything is made on the side (the
 * fused graph's tensors and the fused plan's memory as copies, the choices, the pairs, the
 * memory report) and becomes the analysis's only when all of it is: on an error the
 * analysis is as it was, and a plan may be applied again. */
static dm_status load_plan(dm_analysis *a, const char *path);

dm_status dm_analysis_load_plan(dm_analysis *a, const char *path) {
    if (!a || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_load_plan: NULL argument");
    if (a->have_choices) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_load_plan: a plan is applied already");
    int one_op = 0;
    for (int o = 0; o < a->gf.nop; o++) one_op |= a->gf.op[o].kind == DM_OP_ATTN;
    if (!one_op) return load_plan(a, path);
    /* the CPU's default runs the attention as one op, a tuned plan its ops: the analysis
     * made again as a layer with the plan builds it, and taken only when the plan applies */
    dm_analysis *b = NULL;
    dm_status s = dm_analysis_make(&b, &a->cfg, &a->dev, a->dtype_bytes, a->recompute, 1);
    if (s == DM_OK) s = load_plan(b, path);
    if (s == DM_OK) {
        const dm_analysis t = *a;
        *a = *b;
        *b = t;
        a->plan.g = a->rep.fused_graph = &a->gf; /* the plans and reports point at their own */
        b->plan.g = b->rep.fused_graph = &b->gf;  /* structs' graphs */
        a->op_secs = b->op_secs; /* measured per op of g, the unfused graph: the same */
        b->op_secs = NULL;
    }
    dm_analysis_free(b);
    return s;
}

static dm_status load_plan(dm_analysis *a, const char *path) {
    dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .recompute = a->recompute};
    dm_choices ch;
    DM_TRY(dm_plan_load(path, &a->cfg, &opt, &a->gf, &dm_cpu_gemm_algos, &ch));
    const int nt = a->gf.nt, ng = a->plan.ngroups;
    /* gf with its own tensors (layouts change their strides; its ops are only read), its
     * plan with its own memory (planned again for the layouts) and algorithms */
    dm_graph g = a->gf;
    dm_plan plan = a->plan;
    g.t = malloc(sizeof(dm_tensor) * (size_t)(nt > 0 ? nt : 1));
    g.cap_t = nt;
    plan.g = &g;
    plan.in_memory = malloc((size_t)(nt > 0 ? nt : 1));
    plan.offset = malloc(sizeof(int64_t) * (size_t)(nt > 0 ? nt : 1));
    plan.algo = NULL; /* dm_choices_apply makes it */
    /* partner[G]: the group run beside G; beside[G]: the group G runs beside */
    int *partner = malloc(sizeof(int) * 2 * (size_t)(ng + 1));
    char *plan_path = strdup(path);
    dm_analysis_memory mem;
    dm_status s = DM_OK;
    if (!g.t || !plan.in_memory || !plan.offset || !partner || !plan_path) s = dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK) {
        memcpy(g.t, a->gf.t, sizeof(dm_tensor) * (size_t)nt);
        memcpy(plan.in_memory, a->plan.in_memory, (size_t)nt);
        memcpy(plan.offset, a->plan.offset, sizeof(int64_t) * (size_t)nt);
        s = dm_choices_apply(&ch, &g, &plan);
    }
    if (s == DM_OK) s = dm_plan_pairs(&plan, partner, partner + ng + 1);
    /* the layouts change the memory plan: the memory report follows it */
    if (s == DM_OK) s = dm_analysis_memory_report(&a->cfg, a->dev.is_cpu, a->tuned, &g, &plan, a->dtype_bytes, &mem);
    if (s != DM_OK) {
        free(g.t);
        free(plan.in_memory);
        free(plan.offset);
        free(plan.algo);
        free(partner);
        free(plan_path);
        dm_choices_free(&ch);
        return s;
    }
    /* all made: the analysis takes it (the plan's order and groups are its own still) */
    free(a->gf.t);
    a->gf.t = g.t;
    a->gf.cap_t = g.cap_t;
    free(a->plan.in_memory);
    free(a->plan.offset);
    free(a->plan.algo);
    plan.g = &a->gf;
    a->plan = plan;
    a->mem = mem;
    a->ch = ch;
    a->plan_path = plan_path;
    a->partner = partner;
    a->beside = partner + ng + 1;
    a->have_choices = 1;
    return DM_OK;
}

/* The plan view of the public analysis: a tuned plan's layouts and algorithms beside the
 * builder's, and its side-by-side pairs. */

/* The group whose first op is o, or -1 (pairs are lone contractions). */
static int group_of(const dm_plan *plan, int o) {
    for (int H = 0; H < plan->ngroups; H++)
        if (plan->order[plan->groups[H].first] == o) return H;
    return -1;
}

static const char *plan_op_name(const dm_analysis *a, int G) {
    return a->gf.op[a->plan.order[a->plan.groups[G].first]].name;
}

dm_status dm_analysis_plan_text(const dm_analysis *a, char **text) {
    if (!a || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_plan_text: NULL argument");
    if (!a->have_choices) return dm_fail(DM_ERR_INVALID_ARG, "dm_analysis_plan_text: no plan applied");
    const dm_graph *g = &a->gf;
    const dm_choices *ch = &a->ch;
    char def[DM_MAX_DIMS + 1];
    dm_sbuf b = {0};
    dm_sb_printf(&b, "plan %s (tuned on %s; sum over groups: default %.2f ms, tuned %.2f ms)\n", a->plan_path,
                 ch->machine[0] ? ch->machine : "unknown machine", ch->default_ms, ch->tuned_ms);
    dm_sb_printf(&b, "  %-22s %-9s %-9s\n", "tensor", "default", "layout");
    for (int t = 0; t < g->nt; t++) {
        if (!ch->layout[t][0]) continue;
        dm_tensor_layout(g, t, def);
        dm_sb_printf(&b, "  %-22s %-9s %-9s%s\n", g->t[t].name, def, ch->layout[t],
                     strcmp(def, ch->layout[t]) ? "  changed" : "");
    }
    dm_sb_printf(&b, "  %-22s %-9s\n", "contraction", "algorithm");
    for (int o = 0; o < g->nop; o++) {
        int G = group_of(&a->plan, o);
        int pa = G >= 0 ? a->partner[G] : -1, be = G >= 0 ? a->beside[G] : -1;
        if (!ch->algo[o] && be < 0) continue;
        dm_sb_printf(&b, "  %-22s %-9s", g->op[o].name, dm_algo_name(ch->algos, ch->algo[o]));
        if (pa >= 0) dm_sb_printf(&b, "  (%s runs beside it)", plan_op_name(a, pa));
        if (be >= 0) dm_sb_printf(&b, "  (runs beside %s; its own algorithm applies alone)", plan_op_name(a, be));
        dm_sb_printf(&b, "\n");
    }
    dm_sb_printf(&b, "\n");
    *text = dm_sb_done(&b);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory building the report");
}

/* --- tuning ---------------------------------------------------------------------------- */

#define MAX_TIMED 64
#define MAX_REPS 63 /* as `dmove tune --reps` takes them: time_group holds 64 times */

struct dm_tuning {
    dm_tuner *T;
    dm_choices ch;           /* the selection (have_ch) */
    int have_ch;
    int refined;             /* re-timings so far */
    dm_tune_pair pairs[MAX_TIMED], rows[MAX_TIMED];
    int npairs, nrows;
};

dm_status dm_tuning_new(dm_tuning **out, const dm_layer_config *cfg, const dm_layer_options *opt, int reps) {
    if (out) *out = NULL;
    if (!out || !cfg || !opt) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_new: NULL argument");
    if (reps < 1 || reps > MAX_REPS)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_new: reps %d is out of range (1 to %d timed repetitions per "
                       "candidate)", reps, MAX_REPS);
    dm_tuning *t = calloc(1, sizeof *t);
    if (!t) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = dm_tuner_new(&t->T, cfg, opt);
    if (s != DM_OK) {
        free(t);
        return s;
    }
    t->T->reps = reps;
    *out = t;
    return DM_OK;
}

void dm_tuning_free(dm_tuning *t) {
    if (!t) return;
    if (t->have_ch) dm_choices_free(&t->ch);
    dm_tuner_free(t->T);
    free(t);
}

void dm_tuning_get_info(const dm_tuning *t, dm_tuning_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    out->machine = "";
    if (!t) return;
    const dm_tuner *T = t->T;
    out->machine = T->machine;
    out->groups = T->ngroups;
    out->tensors = T->nvars;
    for (int v = 0; v < T->nvars; v++) out->candidates += T->vars[v].ncand;
    out->tasks = dm_tuner_tasks(T);
    out->from_cache = T->nfrom_cache;
    out->cache_skipped = T->cache_skipped;
    out->threads = T->threads;
    out->reps = T->reps;
    out->retime_runs = T->reps < DM_TUNE_MAX_RETIMED ? T->reps : DM_TUNE_MAX_RETIMED;
    out->refined = t->refined;
    out->default_s = T->default_s;
    out->tuned_s = T->tuned_s;
}

dm_status dm_tuning_candidates(const dm_tuning *t, char **text) {
    if (!t || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_candidates: NULL argument");
    const dm_tuner *T = t->T;
    dm_sbuf b = {0};
    for (int v = 0; v < T->nvars; v++) {
        dm_sb_printf(&b, "%s %s {", v ? ";" : "", T->g.t[T->vars[v].t].name);
        for (int k = 0; k < T->vars[v].ncand; k++) dm_sb_printf(&b, "%s%s", k ? " " : "", T->vars[v].cand[k]);
        dm_sb_printf(&b, "}");
    }
    dm_sb_printf(&b, "%s", ""); /* an empty list is "" too */
    *text = dm_sb_done(&b);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
}

dm_status dm_tuning_measure(dm_tuning *t, const char *cache,
                            void (*progress)(int64_t done, int64_t total, int64_t cached, double secs, void *arg),
                            void *arg) {
    if (!t) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_measure: NULL argument");
    return dm_tuner_measure(t->T, cache, progress, arg);
}

dm_status dm_tuning_select(dm_tuning *t) {
    if (!t) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_select: NULL argument");
    if (t->have_ch) dm_choices_free(&t->ch);
    t->have_ch = 0;
    DM_TRY(dm_tuner_select(t->T, &t->ch));
    t->have_ch = 1;
    return DM_OK;
}

dm_status dm_tuning_refine(dm_tuning *t, const char *cache, int *nchanged) {
    if (!t || !nchanged) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_refine: NULL argument");
    int n = 0;
    *nchanged = 0;
    DM_TRY(dm_tuner_refine(t->T, cache, &n));
    t->refined += n;
    *nchanged = n;
    return dm_tuning_select(t);
}

static dm_status need_selection(const dm_tuning *t) {
    return t->have_ch ? DM_OK : dm_fail(DM_ERR_INVALID_ARG, "the tuning has no selection yet (dm_tuning_select)");
}

dm_status dm_tuning_pairs(dm_tuning *t) {
    if (!t) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_pairs: NULL argument");
    DM_TRY(need_selection(t));
    return dm_tuner_pair(t->T, &t->ch, t->pairs, MAX_TIMED, &t->npairs);
}

dm_status dm_tuning_rows(dm_tuning *t) {
    if (!t) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_rows: NULL argument");
    DM_TRY(need_selection(t));
    return dm_tuner_rows(t->T, &t->ch, t->rows, MAX_TIMED, &t->nrows);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Group label: the first op's name, "+N" for the rest. */
static void label(const dm_tuner *T, const dm_tune_group *G, char *buf, size_t n) {
    const dm_group *gr = &T->plan.groups[G->gi];
    const dm_op *first = &T->g.op[T->plan.order[gr->first]];
    if (gr->nops > 1) snprintf(buf, n, "%s +%d", first->name, gr->nops - 1);
    else snprintf(buf, n, "%s", first->name);
}

static void report_groups(dm_sbuf *b, const dm_tuner *T) {
    dm_sb_printf(b, "%-5s %-28s %6s %9s %9s %9s %9s %9s  %s\n", "group", "ops", "cands", "best ms", "median",
                 "worst", "default", "chosen", "choice");
    for (int k = 0; k < T->ngroups; k++) {
        const dm_tune_group *G = &T->groups[k];
        int64_t m = G->ncomb * G->nalgo, nf = 0;
        double *v = malloc(sizeof(double) * (size_t)m);
        if (!v) continue;
        for (int64_t i = 0; i < m; i++)
            if (isfinite(G->secs[i])) v[nf++] = G->secs[i];
        qsort(v, (size_t)nf, sizeof(double), cmp_double);
        char name[64], choice[256] = "";
        label(T, G, name, sizeof name);
        size_t len = 0;
        if (G->op >= 0 || G->kernels)
            len += (size_t)snprintf(choice + len, sizeof choice - len, "%s ",
                                    dm_gemm_algo_name((dm_gemm_algo)G->algo[G->chosen_algo]));
        for (int q = 0; q < G->nscope && len < sizeof choice; q++) {
            const dm_tune_var *var = &T->vars[G->scope[q]];
            len += (size_t)snprintf(choice + len, sizeof choice - len, "%s:%s ", T->g.t[var->t].name,
                                    var->cand[dm_tune_comb_index(T, G, G->chosen_comb, q)]);
        }
        double chosen = G->secs[G->chosen_comb * G->nalgo + G->chosen_algo];
        if (nf > 0)
            dm_sb_printf(b, "%-5d %-28s %6" PRId64 " %9.3f %9.3f %9.3f %9.3f %9.3f  %s\n", G->gi, name, m, v[0] * 1e3,
                         v[nf / 2] * 1e3, v[nf - 1] * 1e3, G->secs[0] * 1e3, chosen * 1e3, choice);
        free(v);
    }
}

/* What dm_tuner_pair or dm_tuner_rows timed: title, then per pair its two groups' first
 * ops, the times one then the other and together, and whether it was kept (as `kept`). */
static void report_timed(dm_sbuf *b, const dm_tuner *T, const char *title, int width, const char *kept,
                         const dm_tune_pair *p, int n) {
    if (!n) return;
    dm_sb_printf(b, "\n%s, alternately run by run (%d runs each, medians):\n", title,
                 T->reps < DM_TUNE_MAX_RETIMED ? T->reps : DM_TUNE_MAX_RETIMED);
    for (int k = 0; k < n; k++) {
        const dm_plan *pl = &T->plan;
        dm_sb_printf(b, "  %-18s + %-*s %8.3f ms -> %8.3f ms (%.3fx)  %s\n",
                     T->g.op[pl->order[pl->groups[p[k].g1].first]].name, width,
                     T->g.op[pl->order[pl->groups[p[k].g2].first]].name, p[k].seq_s * 1e3, p[k].pair_s * 1e3,
                     p[k].pair_s > 0 ? p[k].seq_s / p[k].pair_s : 0.0, p[k].kept ? kept : "kept apart");
    }
}

dm_status dm_tuning_report(const dm_tuning *t, char **text) {
    if (!t || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_report: NULL argument");
    const dm_tuner *T = t->T;
    dm_sbuf b = {0};
    report_groups(&b, T);
    if (T->threads < 2) dm_sb_printf(&b, "\nside-by-side contractions: not tried (they need 2 threads or more)\n");
    report_timed(&b, T, "side by side (each on half the threads) vs one then the other", 18,
                 "side by side (concurrent)", t->pairs, t->npairs < MAX_TIMED ? t->npairs : MAX_TIMED);
    report_timed(&b, T, "row group in its GEMM's epilogue (direct kernel; each block of rows as it is finished) vs apart",
                 22, "in the epilogue (direct_rows)", t->rows, t->nrows < MAX_TIMED ? t->nrows : MAX_TIMED);
    dm_sb_printf(&b, "%s", "");
    *text = dm_sb_done(&b);
    return *text ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
}

dm_status dm_tuning_save(const dm_tuning *t, const char *path) {
    if (!t || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_save: NULL argument");
    DM_TRY(need_selection(t));
    return dm_plan_save(path, &t->T->cfg, &t->T->opt, &t->T->g, &t->ch);
}

int dm_tuning_uses_direct(const dm_tuning *t) {
    if (!t) return 0;
    int direct = 0; /* does the plan use dmove's own GEMM kernel anywhere? (a contraction
                     * left at its default: where dm_gemm_default_algo gives it) */
    for (int o = 0; t->have_ch && o < t->ch.nop; o++) {
        if (t->T->g.op[o].kind != DM_OP_CONTRACT) continue;
        const dm_gemm_algo a = (dm_gemm_algo)t->ch.algo[o];
        direct |= dm_gemm_algo_direct(a == DM_GEMM_DEFAULT ? dm_gemm_default_algo(1) : a);
    }
    return direct;
}

dm_status dm_tuning_write_svg(const dm_tuning *t, const char *path) {
    if (!t || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuning_write_svg: NULL argument");
    return dm_tuner_svg(t->T, path);
}
