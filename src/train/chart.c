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
