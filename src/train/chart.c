/* chart.c: the loss curve of `dmove train --svg` (a standalone SVG: axes with ticks, one
 * marker per step, a polyline through them). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/device.h"
#include "core/status.h"
#include "train/train.h"

typedef struct {
    char *s;
    size_t n, cap;
    int bad;
} text;

static void put(text *t, const char *fmt, ...) DM_PRINTF(2, 3);
static void put(text *t, const char *fmt, ...) {
    if (t->bad) return;
    va_list ap;
    va_start(ap, fmt);
    char line[512];
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof line) {
        t->bad = 1;
        return;
    }
    if (t->n + (size_t)k + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8192;
        while (cap < t->n + (size_t)k + 1) cap *= 2;
        char *q = realloc(t->s, cap);
        if (!q) {
            t->bad = 1;
            return;
        }
        t->s = q;
        t->cap = cap;
    }
    memcpy(t->s + t->n, line, (size_t)k + 1);
    t->n += (size_t)k;
}

/* Title text with XML's five special characters escaped, at most 200 characters. */
static void put_escaped(text *t, const char *s) {
    for (int k = 0; s[k] && k < 200; k++) {
        char c = s[k];
        if (c == '&') put(t, "&amp;");
        else if (c == '<') put(t, "&lt;");
        else if (c == '>') put(t, "&gt;");
        else if (c == '"') put(t, "&quot;");
        else if (c == '\'') put(t, "&apos;");
        else if ((unsigned char)c >= 0x20) put(t, "%c", c);
    }
}

enum { W = 720, H = 420, ML = 80, MR = 24, MT = 48, MB = 56 };

dm_status dm_loss_svg(const double *loss, int64_t n, int64_t first_step, const char *title, const char *path) {
    if (!loss || n < 1 || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_loss_svg: no losses to draw");
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
    text t = {0};
    put(&t, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
        W, H, W, H, W, H);
    put(&t, "<text x=\"%d\" y=\"24\" font-size=\"15\">", ML);
    put_escaped(&t, title ? title : "training loss");
    put(&t, "</text>\n<g class=\"axes\" stroke=\"#444\">\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n"
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n</g>\n",
        ML, MT, ML, H - MB, ML, H - MB, W - MR, H - MB);
    /* y ticks: each decade (log) or 5 even steps */
    put(&t, "<g class=\"yticks\" fill=\"#222\" text-anchor=\"end\">\n");
    const int nyt = logy ? (int)(y1 - y0) : 5;
    for (int k = 0; k <= nyt; k++) {
        double v = logy ? pow(10.0, y0 + k) : y0 + (y1 - y0) * k / nyt;
        double y = PY(v);
        put(&t, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\">%.3g</text>\n",
            ML, y, W - MR, y, ML - 6, y + 4, v);
    }
    put(&t, "</g>\n<g class=\"xticks\" fill=\"#222\" text-anchor=\"middle\">\n");
    for (int k = 0; k <= 5; k++) {
        double s = x0 + (x1 - x0) * k / 5;
        put(&t, "<text x=\"%.1f\" y=\"%d\">%.0f</text>\n", PX(s), H - MB + 18, s);
    }
    put(&t, "</g>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", ML + (int)pw / 2, H - 14);
    put(&t, "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">loss (mean squared "
            "error%s)</text>\n", MT + (int)ph / 2, MT + (int)ph / 2, logy ? ", log scale" : "");
    put(&t, "<polyline class=\"curve\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (int64_t k = 0; k < n; k++)
        if (isfinite(loss[k]) && (!logy || loss[k] > 0))
            put(&t, "%.1f,%.1f ", PX((double)(first_step + k)), PY(loss[k]));
    put(&t, "\"/>\n<g class=\"points\" fill=\"#1f77b4\">\n");
    for (int64_t k = 0; k < n; k++)
        if (isfinite(loss[k]) && (!logy || loss[k] > 0))
            put(&t, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\"><title>step %lld: %.6g</title></circle>\n",
                PX((double)(first_step + k)), PY(loss[k]), (long long)(first_step + k), loss[k]);
    put(&t, "</g>\n</svg>\n");
#undef PX
#undef PY
    if (t.bad) {
        free(t.s);
        return dm_fail(DM_ERR_OOM, "out of memory drawing the loss chart");
    }
    dm_status s = dm_write_file_atomic(path, t.s, t.n);
    free(t.s);
    return s;
}
