/* choose.c: from the tuner's measurements to a plan: the layered graph over the groups
 * of the step handed to the shortest-path solver (select.h), the chosen algorithm per
 * contraction, and the violin plot of each group's spread of candidate times. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/device.h"
#include "core/status.h"
#include "core/strbuf.h"
#include "tune/select.h"
#include "tune/tune.h"

dm_status dm_tuner_select(dm_tuner *T, dm_choices *choices) {
    DM_TRY(dm_choices_init(choices, &T->g, &dm_cpu_gemm_algos));
    int n = T->ngroups;
    int *ndom = malloc(sizeof(int) * (size_t)(T->nvars + 1));
    int *nscope = malloc(sizeof(int) * (size_t)(n + 1));
    const int **scope = malloc(sizeof(int *) * (size_t)(n + 1));
    double **cost = calloc((size_t)(n + 1), sizeof(double *));
    int **arg = calloc((size_t)(n + 1), sizeof(int *));
    dm_status s = DM_OK;
    if (!ndom || !nscope || !scope || !cost || !arg) s = dm_fail(DM_ERR_OOM, "out of memory");
    for (int v = 0; s == DM_OK && v < T->nvars; v++) ndom[v] = T->vars[v].ncand;
    /* each group's table: the best algorithm for each layout combination */
    for (int k = 0; s == DM_OK && k < n; k++) {
        dm_tune_group *G = &T->groups[k];
        nscope[k] = G->nscope;
        scope[k] = G->scope;
        cost[k] = malloc(sizeof(double) * (size_t)G->ncomb);
        arg[k] = malloc(sizeof(int) * (size_t)G->ncomb);
        if (!cost[k] || !arg[k]) {
            s = dm_fail(DM_ERR_OOM, "out of memory");
            break;
        }
        for (int64_t c = 0; c < G->ncomb; c++) {
            cost[k][c] = INFINITY;
            arg[k][c] = 0;
            for (int a = 0; a < G->nalgo; a++) {
                double t = G->secs[c * G->nalgo + a];
                if (isnan(t)) {
                    s = dm_fail(DM_ERR_INTERNAL, "group %d was not measured", G->gi);
                    break;
                }
                if (t < cost[k][c]) {
                    cost[k][c] = t;
                    arg[k][c] = a;
                }
            }
        }
    }
    dm_select_result res = {0};
    if (s == DM_OK) {
        dm_select_problem p = {.nvars = T->nvars, .ndom = ndom, .nlayers = n, .nscope = nscope,
                               .scope = scope, .cost = (const double *const *)cost, .change = NULL};
        s = dm_select_solve(&p, &res);
        if (s == DM_ERR_UNSUPPORTED && T->nfrom_cache > 0) /* every candidate of a group infeasible: */
            dm_fail_context(s, "%lld of the times from the tuning cache (edited, or made by another build? "
                            "run with --no-cache): ", (long long)T->nfrom_cache);
    }
    if (s == DM_OK) {
        T->tuned_s = T->default_s = 0;
        for (int v = 0; v < T->nvars; v++) {
            int c = res.fixed[v] >= 0 ? res.fixed[v] : 0;
            memcpy(choices->layout[T->vars[v].t], T->vars[v].cand[c], DM_MAX_DIMS + 1);
        }
        for (int k = 0; k < n; k++) {
            dm_tune_group *G = &T->groups[k];
            int64_t comb = res.comb[k];
            G->chosen_comb = comb;
            G->chosen_algo = arg[k][comb];
            if (G->op >= 0) choices->algo[G->op] = G->algo[G->chosen_algo];
            for (int q = 0; G->kernels && q < T->plan.groups[G->gi].nops; q++) {
                int o = T->plan.order[T->plan.groups[G->gi].first + q];
                if (T->g.op[o].kind == DM_OP_CONTRACT) choices->algo[o] = G->algo[G->chosen_algo];
            }
            T->tuned_s += cost[k][comb];
            T->default_s += G->secs[0]; /* combination 0 = default layouts, algo 0 = default */
        }
        choices->tuned_ms = T->tuned_s * 1e3;
        choices->default_ms = T->default_s * 1e3;
        choices->threads = T->threads;
        snprintf(choices->machine, sizeof choices->machine, "%s", T->machine);
    }
    dm_select_result_free(&res);
    for (int k = 0; k < n && cost && arg; k++) {
        free(cost[k]);
        free(arg[k]);
    }
    free(ndom);
    free(nscope);
    free(scope);
    free(cost);
    free(arg);
    if (s != DM_OK) dm_choices_free(choices);
    return s;
}

/* ---- violin plot ---------------------------------------------------------------------- */

/* One violin per group with more than one candidate: the density (Gaussian kernel over
 * log2 of time / the group's best) mirrored about the group's axis, every candidate a
 * dot, the default a grey ring and the chosen one a red dot. y: slowdown vs best, log. */
dm_status dm_tuner_svg(const dm_tuner *T, const char *path) {
    int cols[1024], nc = 0;
    double ymax = 1;
    for (int k = 0; k < T->ngroups && nc < 1024; k++) {
        const dm_tune_group *G = &T->groups[k];
        int64_t m = G->ncomb * G->nalgo;
        if (m < 2) continue;
        double best = INFINITY;
        for (int64_t i = 0; i < m; i++) if (G->secs[i] < best) best = G->secs[i];
        for (int64_t i = 0; i < m; i++)
            if (isfinite(G->secs[i]) && best > 0 && G->secs[i] / best > ymax) ymax = G->secs[i] / best;
        cols[nc++] = k;
    }
    double ltop = ceil(log2(ymax) * 4 + 0.5) / 4;
    if (ltop < 0.25) ltop = 0.25;
    const double W0 = 70, H = 420, top = 40, bot = 150, colw = 56;
    double W = W0 + colw * (nc > 0 ? nc : 1) + 20, plot_h = H - top - bot;
    dm_sbuf b = {0};
    dm_sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
        "font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    dm_sb_printf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    dm_sb_printf(&b, "<text x=\"%.0f\" y=\"20\" font-size=\"14\">dmove tune: time of every candidate per group, "
        "relative to the group's best (b=%lld j=%lld i=%lld h=%lld u=%lld)</text>\n", W0,
        (long long)T->cfg.batch, (long long)T->cfg.seq, (long long)T->cfg.hidden, (long long)T->cfg.heads,
        (long long)T->cfg.ffn);
#define YOF(l) (top + plot_h * (1.0 - (l) / ltop))
    for (double l = 0; l <= ltop + 1e-9; l += 0.25) {
        dm_sb_printf(&b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", W0, W - 20, YOF(l), YOF(l));
        dm_sb_printf(&b, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2fx</text>\n", W0 - 6, YOF(l) + 4, pow(2, l));
    }
    dm_sb_printf(&b, "<text x=\"14\" y=\"%.0f\" transform=\"rotate(-90 14 %.0f)\" text-anchor=\"middle\">time / best "
        "candidate (log scale)</text>\n", top + plot_h / 2, top + plot_h / 2);
    for (int c = 0; c < nc; c++) {
        const dm_tune_group *G = &T->groups[cols[c]];
        int64_t m = G->ncomb * G->nalgo;
        double best = INFINITY, cx = W0 + colw * (c + 0.5);
        for (int64_t i = 0; i < m; i++) if (G->secs[i] < best) best = G->secs[i];
        /* density over 48 points of [0, ltop], bandwidth 0.06 in log2 units */
        double dens[49], dmax = 0, bw = 0.06;
        for (int q = 0; q <= 48; q++) {
            double l = ltop * q / 48, d = 0;
            for (int64_t i = 0; i < m; i++) {
                if (!isfinite(G->secs[i])) continue;
                double z = (log2(G->secs[i] / best) - l) / bw;
                d += exp(-0.5 * z * z);
            }
            dens[q] = d;
            if (d > dmax) dmax = d;
        }
        dm_sb_printf(&b, "<path fill=\"#9ecae1\" stroke=\"#3182bd\" d=\"");
        for (int q = 0; q <= 48; q++)
            dm_sb_printf(&b, "%c%.1f %.1f ", q ? 'L' : 'M', cx - 22 * dens[q] / dmax, YOF(ltop * q / 48));
        for (int q = 48; q >= 0; q--) dm_sb_printf(&b, "L%.1f %.1f ", cx + 22 * dens[q] / dmax, YOF(ltop * q / 48));
        dm_sb_printf(&b, "Z\"/>\n");
        for (int64_t i = 0; i < m; i++) {
            if (!isfinite(G->secs[i])) continue;
            double y = YOF(log2(G->secs[i] / best));
            int chosen = i == G->chosen_comb * G->nalgo + G->chosen_algo, dflt = i == 0;
            if (dflt) dm_sb_printf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" stroke=\"#555\"/>\n", cx, y);
            dm_sb_printf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\"/>\n", cx, y, chosen ? "3.5" : "2",
                chosen ? "#d62728" : "#08519c");
        }
        const dm_group *gr = &T->plan.groups[G->gi];
        const dm_op *first = &T->g.op[T->plan.order[gr->first]];
        dm_sb_printf(&b, "<text transform=\"translate(%.1f %.0f) rotate(55)\">", cx - 4, H - bot + 12);
        dm_sb_printf(&b, "%d ", G->gi);
        dm_sb_xml(&b, first->name);
        if (gr->nops > 1) dm_sb_printf(&b, " +%d", gr->nops - 1);
        dm_sb_printf(&b, "</text>\n");
    }
    dm_sb_printf(&b, "<circle cx=\"%.0f\" cy=\"32\" r=\"3.5\" fill=\"#d62728\"/><text x=\"%.0f\" y=\"36\">chosen</text>\n",
        W - 190, W - 184);
    dm_sb_printf(&b, "<circle cx=\"%.0f\" cy=\"32\" r=\"5\" fill=\"none\" stroke=\"#555\"/><text x=\"%.0f\" y=\"36\">default"
        "</text>\n", W - 120, W - 112);
    dm_sb_printf(&b, "</svg>\n");
#undef YOF
    if (b.oom) {
        free(b.s);
        return dm_fail(DM_ERR_OOM, "out of memory drawing the plot");
    }
    dm_status s = dm_write_file_atomic(path, b.s, b.n);
    free(b.s);
    return s;
}
