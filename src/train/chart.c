/* chart.c: the loss curve of `dmove train --svg` (a standalone SVG: axes with ticks, one
 * marker per step up to 200, a polyline through them, and their running mean over 50). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/device.h"
#include "core/status.h"
#include "core/strbuf.h"
#include "dmove_tools.h"
#include "train/train.h"

enum { W = 720, H = 420, ML = 80, MR = 24, MT = 48, MB = 56 };

dm_status dm_loss_svg(const double *loss, int64_t n, int64_t first_step, const char *title, const char *path) {
    if (!loss || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_loss_svg: NULL argument");
    if (n < 1) return dm_fail(DM_ERR_INVALID_ARG, "dm_loss_svg: no losses to draw");
    if (first_step > INT64_MAX - n)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_loss_svg: steps %lld and %lld more overflow", (long long)first_step,
                       (long long)n);
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t k = 0; k < n; k++)
        if (isfinite(loss[k])) {
            lo = fmin(lo, loss[k]);
            hi = fmax(hi, loss[k]);
        }
    if (!isfinite(lo)) return dm_fail(DM_ERR_INVALID_ARG, "dm_loss_svg: no finite loss to draw");
    const int logy = lo > 0 && hi / lo > 10.0;
    double y0, y1;
    if (logy) {
        y0 = floor(log10(lo));
        y1 = ceil(log10(hi));
    } else {
        double pad = hi > lo ? 0.05 * (hi - lo) : (lo != 0 ? 0.05 * fabs(lo) : 1.0);
        y0 = lo - pad;
        y1 = hi + pad;
        if (lo >= 0 && y0 < 0) y0 = 0;
    }
    const double x0 = (double)first_step, x1 = (double)(first_step + n - 1) + (n == 1);
    const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(x) (ML + ((x) - x0) / (x1 - x0) * pw)
#define PY(v) (MT + ph - (((logy ? log10(v) : (v)) - y0) / (y1 - y0)) * ph)
    dm_sbuf t = {0};
    dm_sb_svg_open(&t, W, H, 12);
    dm_sb_printf(&t, "<text x=\"%d\" y=\"24\" font-size=\"15\">", ML);
    dm_sb_xml(&t, title ? title : "training loss");
    dm_sb_printf(&t, "</text>\n<g class=\"axes\" stroke=\"#444\">\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n"
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n</g>\n",
        ML, MT, ML, H - MB, ML, H - MB, W - MR, H - MB);
    /* y ticks: each decade (log) or 5 even steps */
    dm_sb_printf(&t, "<g class=\"yticks\" fill=\"#222\" text-anchor=\"end\">\n");
    const int nyt = logy ? (int)(y1 - y0) : 5;
    for (int k = 0; k <= nyt; k++) {
        double v = logy ? pow(10.0, y0 + k) : y0 + (y1 - y0) * k / nyt;
        double y = PY(v);
        dm_sb_printf(&t, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\">%.3g</text>\n",
            ML, y, W - MR, y, ML - 6, y + 4, v);
    }
    dm_sb_printf(&t, "</g>\n<g class=\"xticks\" fill=\"#222\" text-anchor=\"middle\">\n");
    /* steps at a round spacing (1, 2 or 5 times a power of ten), at most about 8 */
    static const double mant[3] = {1, 2, 5};
    double dx = 1.0; /* 1, 2, 5, 10, 20, 50, ... */
    for (int e = 1; (x1 - x0) / dx > 8 && e < 40; e++) dx = mant[e % 3] * pow(10.0, e / 3);
    for (double s = ceil(x0 / dx) * dx; s <= x1 + 1e-9; s += dx)
        dm_sb_printf(&t, "<text x=\"%.1f\" y=\"%d\">%.0f</text>\n", PX(s), H - MB + 18, s);
    dm_sb_printf(&t, "</g>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", ML + (int)pw / 2, H - 14);
    dm_sb_printf(&t, "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">loss (mean squared "
            "error%s)</text>\n", MT + (int)ph / 2, MT + (int)ph / 2, logy ? ", log scale" : "");
    /* the losses step by step; over 50 steps, faint, under their running mean over the
     * last n/40 steps (the trend a noisy loss hides); a marker per step up to 200 */
    const int64_t win = n > 50 ? n / 40 : 1;
    dm_sb_printf(&t, "<polyline class=\"curve\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"%s\"%s points=\"",
                 win > 1 ? "1" : "1.5", win > 1 ? " stroke-opacity=\"0.35\"" : "");
    for (int64_t k = 0; k < n; k++)
        if (isfinite(loss[k]) && (!logy || loss[k] > 0))
            dm_sb_printf(&t, "%.1f,%.1f ", PX((double)(first_step + k)), PY(loss[k]));
    dm_sb_printf(&t, "\"/>\n");
    if (win > 1) {
        dm_sb_printf(&t, "<polyline class=\"mean\" fill=\"none\" stroke=\"#08306b\" stroke-width=\"2\" points=\"");
        double sum = 0;
        int64_t cnt = 0;
        for (int64_t k = 0; k < n; k++) {
            if (isfinite(loss[k])) sum += loss[k], cnt++;
            if (k >= win && isfinite(loss[k - win])) sum -= loss[k - win], cnt--;
            if (k >= win - 1 && cnt > 0 && (!logy || sum > 0))
                dm_sb_printf(&t, "%.1f,%.1f ", PX((double)(first_step + k)), PY(sum / (double)cnt));
        }
        dm_sb_printf(&t, "\"/>\n<text x=\"%d\" y=\"%d\" fill=\"#08306b\" text-anchor=\"end\">line: mean of the last "
                     "%lld steps</text>\n", W - MR, MT - 8, (long long)win);
    }
    dm_sb_printf(&t, "<g class=\"points\" fill=\"#1f77b4\">\n");
    for (int64_t k = 0; k < n && n <= 200; k++)
        if (isfinite(loss[k]) && (!logy || loss[k] > 0))
            dm_sb_printf(&t, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\"><title>step %lld: %.6g</title></circle>\n",
                PX((double)(first_step + k)), PY(loss[k]), (long long)(first_step + k), loss[k]);
    dm_sb_printf(&t, "</g>\n</svg>\n");
#undef PX
#undef PY
    const size_t len = t.n;
    char *text = dm_sb_done(&t);
    if (!text) return dm_fail(DM_ERR_OOM, "out of memory drawing the loss chart");
    dm_status s = dm_write_file_atomic(path, text, len);
    free(text);
    return s;
}

/* --- the chart of a run with held-out evaluations (dm_train_chart_svg) --------------- */

typedef struct {
    double x0, x1, y0, y1, ystep; /* ystep: the linear ticks' spacing */
    int logy, top, h;
} panel;

/* A round spacing (1, 2 or 5 times a power of ten) of about span / n. */
static double nice_step(double span, int n) {
    const double raw = span / n, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
}

static double panel_x(const panel *p, double x) { return ML + (x - p->x0) / (p->x1 - p->x0) * (W - ML - MR); }
static double panel_y(const panel *p, double v) {
    return p->top + p->h - ((p->logy ? log10(v) : v) - p->y0) / (p->y1 - p->y0) * p->h;
}
static int panel_has(const panel *p, double v) { return isfinite(v) && (!p->logy || v > 0); }

/* The range of the finite values of a and b (either may be NULL); 0 if there are none. */
static int finite_range(const double *a, int64_t na, const double *b, int64_t nb, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int64_t k = 0; a && k < na; k++)
        if (isfinite(a[k])) *lo = fmin(*lo, a[k]), *hi = fmax(*hi, a[k]);
    for (int64_t k = 0; b && k < nb; k++)
        if (isfinite(b[k])) *lo = fmin(*lo, b[k]), *hi = fmax(*hi, b[k]);
    return isfinite(*lo);
}

/* Axes, y ticks (each decade, or 5 even steps), step ticks (when `xlabels`), the y label. */
static void panel_axes(dm_sbuf *t, const panel *p, const char *ylabel, int xlabels) {
    const int bottom = p->top + p->h;
    dm_sb_printf(t, "<g class=\"axes\" stroke=\"#444\">\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n"
                 "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n</g>\n", ML, p->top, ML, bottom, ML, bottom,
                 W - MR, bottom);
    dm_sb_printf(t, "<g class=\"yticks\" fill=\"#222\" text-anchor=\"end\">\n");
    const int nyt = p->logy ? (int)(p->y1 - p->y0) : (int)floor((p->y1 - p->y0) / p->ystep + 1e-6);
    for (int k = 0; k <= nyt && k <= 40; k++) {
        const double v = p->logy ? pow(10.0, p->y0 + k) : p->y0 + p->ystep * k, y = panel_y(p, v);
        dm_sb_printf(t, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" "
                     "y=\"%.1f\">%.3g</text>\n", ML, y, W - MR, y, ML - 6, y + 4, v);
    }
    dm_sb_printf(t, "</g>\n");
    if (xlabels) {
        static const double mant[3] = {1, 2, 5};
        double dx = 1.0; /* a round spacing: 1, 2, 5, 10, 20, 50, ...: about 8 ticks at most */
        for (int e = 1; (p->x1 - p->x0) / dx > 8 && e < 40; e++) dx = mant[e % 3] * pow(10.0, e / 3);
        dm_sb_printf(t, "<g class=\"xticks\" fill=\"#222\" text-anchor=\"middle\">\n");
        for (double s = ceil(p->x0 / dx) * dx; s <= p->x1 + 1e-9; s += dx)
            dm_sb_printf(t, "<text x=\"%.1f\" y=\"%d\">%.0f</text>\n", panel_x(p, s), bottom + 18, s);
        dm_sb_printf(t, "</g>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
                     ML + (W - ML - MR) / 2, bottom + 40);
    }
    const int cy = p->top + p->h / 2;
    dm_sb_printf(t, "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">", cy, cy);
    dm_sb_xml(t, ylabel);
    dm_sb_printf(t, "%s</text>\n", p->logy ? " (log scale)" : "");
}

/* A per-step series (faint when a running mean over n/40 steps is drawn over it). */
static void step_series(dm_sbuf *t, const panel *p, const double *v, int64_t n, int64_t first, const char *color,
                        const char *cls) {
    const int64_t win = n > 50 ? n / 40 : 1;
    dm_sb_printf(t, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", cls, color,
                 win > 1 ? "1" : "1.5", win > 1 ? " stroke-opacity=\"0.35\"" : "");
    for (int64_t k = 0; k < n; k++)
        if (panel_has(p, v[k])) dm_sb_printf(t, "%.1f,%.1f ", panel_x(p, (double)(first + k)), panel_y(p, v[k]));
    dm_sb_printf(t, "\"/>\n");
    if (win == 1) return;
    dm_sb_printf(t, "<polyline class=\"%s-mean\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", cls, color);
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t k = 0; k < n; k++) {
        if (isfinite(v[k])) sum += v[k], cnt++;
        if (k >= win && isfinite(v[k - win])) sum -= v[k - win], cnt--;
        if (k >= win - 1 && cnt > 0 && panel_has(p, sum / (double)cnt))
            dm_sb_printf(t, "%.1f,%.1f ", panel_x(p, (double)(first + k)), panel_y(p, sum / (double)cnt));
    }
    dm_sb_printf(t, "\"/>\n");
}

/* The held-out values at their steps: a line and a marker each, with its value. */
static void eval_series(dm_sbuf *t, const panel *p, const int64_t *step, const double *v, int64_t n,
                        const char *what) {
    dm_sb_printf(t, "<polyline class=\"held-out\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"");
    for (int64_t k = 0; k < n; k++)
        if (panel_has(p, v[k])) dm_sb_printf(t, "%.1f,%.1f ", panel_x(p, (double)step[k]), panel_y(p, v[k]));
    dm_sb_printf(t, "\"/>\n<g class=\"held-out-points\" fill=\"#d62728\">\n");
    for (int64_t k = 0; k < n; k++)
        if (panel_has(p, v[k]))
            dm_sb_printf(t, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"><title>step %lld: held-out %s %.6g</title>"
                         "</circle>\n", panel_x(p, (double)step[k]), panel_y(p, v[k]), (long long)step[k], what, v[k]);
    dm_sb_printf(t, "</g>\n");
}

static dm_status train_chart_check(const dm_train_chart *c) {
    if (!c->loss && c->n > 0) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: no losses for %lld steps",
                                             (long long)c->n);
    if (c->n < 0 || c->neval < 0 || (c->neval > 0 && (!c->eval_step || !c->eval_loss)))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: negative counts, or evaluations without steps or "
                       "losses");
    if (c->n < 1 && c->neval < 1) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: nothing to draw");
    if (c->first_step < 0 || c->n > ((int64_t)1 << 52) || c->first_step > ((int64_t)1 << 52) - c->n)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: steps %lld and %lld more overflow",
                       (long long)c->first_step, (long long)c->n);
    for (int64_t k = 0; k < c->neval; k++)
        if (c->eval_step[k] < 0 || c->eval_step[k] > ((int64_t)1 << 52))
            return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: evaluation step %lld", (long long)c->eval_step[k]);
    return DM_OK;
}

/* The steps' range over the training steps and the evaluations. */
static void step_range(const dm_train_chart *c, double *x0, double *x1) {
    *x0 = c->n ? (double)c->first_step : (double)c->eval_step[0];
    *x1 = c->n ? (double)(c->first_step + c->n - 1) : *x0;
    for (int64_t k = 0; k < c->neval; k++) *x0 = fmin(*x0, (double)c->eval_step[k]), *x1 = fmax(*x1, (double)c->eval_step[k]);
    if (*x1 <= *x0) *x1 = *x0 + 1;
}

/* The loss panel's y range (decades when the losses span more than 10x). */
static void loss_range(panel *p, double lo, double hi) {
    p->logy = lo > 0 && hi / lo > 10.0;
    if (p->logy) {
        p->y0 = floor(log10(lo)), p->y1 = ceil(log10(hi));
        return;
    }
    const double span = hi > lo ? hi - lo : (lo != 0 ? 0.1 * fabs(lo) : 1.0);
    p->ystep = nice_step(span, 5);
    p->y0 = floor(lo / p->ystep) * p->ystep, p->y1 = ceil(hi / p->ystep) * p->ystep;
    if (p->y1 <= p->y0) p->y1 = p->y0 + p->ystep;
}

dm_status dm_train_chart_svg(const dm_train_chart *c, const char *path) {
    if (!c || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: NULL argument");
    DM_TRY(train_chart_check(c));
    double lo, hi, alo, ahi;
    if (!finite_range(c->loss, c->n, c->eval_loss, c->neval, &lo, &hi))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_train_chart_svg: no finite loss to draw");
    const int acc = finite_range(c->train_acc, c->train_acc ? c->n : 0, c->eval_acc, c->eval_acc ? c->neval : 0,
                                 &alo, &ahi);
    const int HH = acc ? 660 : H;
    panel lp = {.top = MT, .h = acc ? 330 : H - MT - MB};
    step_range(c, &lp.x0, &lp.x1);
    loss_range(&lp, lo, hi);
    panel ap = lp;
    ap.top = MT + lp.h + 50, ap.h = 190, ap.logy = 0, ap.y0 = 0;
    ap.y1 = fmin(1.0, fmax(0.1, ceil(ahi * 10.0 - 1e-9) / 10.0));
    ap.ystep = ap.y1 > 0.5 ? 0.2 : ap.y1 > 0.25 ? 0.1 : 0.05;
    dm_sbuf t = {0};
    dm_sb_svg_open(&t, W, HH, 12);
    dm_sb_printf(&t, "<text x=\"%d\" y=\"24\" font-size=\"15\">", ML);
    dm_sb_xml(&t, c->title ? c->title : "training loss");
    dm_sb_printf(&t, "</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"end\"><tspan fill=\"#1f77b4\">training "
                 "(per step%s)</tspan>%s</text>\n", W - MR, MT - 8, c->n > 50 ? ", line: running mean" : "",
                 c->neval ? "  <tspan fill=\"#d62728\">held-out</tspan>" : "");
    panel_axes(&t, &lp, c->loss_name ? c->loss_name : "loss", !acc);
    if (c->n) step_series(&t, &lp, c->loss, c->n, c->first_step, "#1f77b4", "curve");
    if (c->neval) eval_series(&t, &lp, c->eval_step, c->eval_loss, c->neval, "loss");
    if (acc) {
        panel_axes(&t, &ap, c->acc_name ? c->acc_name : "accuracy", 1);
        if (c->train_acc && c->n) step_series(&t, &ap, c->train_acc, c->n, c->first_step, "#1f77b4", "train-acc");
        if (c->eval_acc && c->neval) eval_series(&t, &ap, c->eval_step, c->eval_acc, c->neval, "accuracy");
    }
    dm_sb_printf(&t, "</svg>\n");
    const size_t len = t.n;
    char *text = dm_sb_done(&t);
    if (!text) return dm_fail(DM_ERR_OOM, "out of memory drawing the training chart");
    dm_status s = dm_write_file_atomic(path, text, len);
    free(text);
    return s;
}
