/* groupchart.c: `bench --groups --svg`: every group of a step as a horizontal bar of its
 * measured time, in execution order, coloured by class, with its roofline floor drawn
 * inside it as a dark band, so the gap between the two (what is left to gain) shows at a
 * glance; one section per schedule, all on one time axis. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/cost.h"
#include "core/status.h"
#include "core/strbuf.h"

enum { CW = 1100, CML = 20, CLW = 430, CMR = 170, ROW = 18, BAR = 12, HEAD = 34, TOP = 96 };

static const char *bar_color(dm_op_class c) {
    return c == DM_CLASS_CONTRACTION ? "#1f77b4" : c == DM_CLASS_NORMALIZATION ? "#d62728" : "#2ca02c";
}

/* A tick step of 1, 2 or 5 times a power of ten giving about five ticks up to hi. */
static double tick_step(double hi) {
    double raw = hi / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

char *dm_groups_svg(const char *title, const char *subtitle, const dm_chart_section *sec, int nsec) {
    if (!sec || nsec < 1) return NULL;
    double hi = 0;
    int rows = 0;
    for (int s = 0; s < nsec; s++) {
        rows += sec[s].nbars;
        for (int k = 0; k < sec[s].nbars; k++) {
            hi = fmax(hi, sec[s].bars[k].ms);
            hi = fmax(hi, sec[s].bars[k].floor_ms);
        }
    }
    if (!(hi > 0) || !isfinite(hi)) hi = 1;
    const double step = tick_step(hi), top = ceil(hi / step) * step;
    const int x0 = CML + CLW, x1 = CW - CMR;
    const int height = TOP + nsec * HEAD + rows * ROW + 40;
#define XS(v) (x0 + (v) / top * (x1 - x0))
    dm_sbuf b = {0};
    dm_sb_svg_open(&b, CW, height, 0);
    dm_sb_printf(&b, "<text x=\"%d\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">", CW / 2);
    dm_sb_xml(&b, title ? title : "time per group");
    dm_sb_printf(&b, "</text>\n<text x=\"%d\" y=\"42\" font-size=\"11\" text-anchor=\"middle\">", CW / 2);
    dm_sb_xml(&b, subtitle ? subtitle : "");
    dm_sb_printf(&b, "</text>\n");
    /* legend: the classes, then the floor band */
    dm_sb_printf(&b, "<g class=\"legend\" font-size=\"12\">\n");
    int lx = x0;
    for (int k = 0; k < DM_NUM_CLASSES; k++, lx += 130)
        dm_sb_printf(&b, "<rect x=\"%d\" y=\"56\" width=\"12\" height=\"12\" fill=\"%s\" fill-opacity=\"0.75\"/>"
                     "<text x=\"%d\" y=\"66\">%s</text>\n", lx, bar_color((dm_op_class)k), lx + 16,
                     dm_class_name((dm_op_class)k));
    dm_sb_printf(&b, "<rect x=\"%d\" y=\"60\" width=\"24\" height=\"4\" fill=\"#222\"/>"
                 "<text x=\"%d\" y=\"66\">roofline floor</text>\n</g>\n", lx, lx + 30);
    /* time axis: grid lines over the whole height, labels on top */
    const int ytop = TOP - 10, ybot = height - 30;
    dm_sb_printf(&b, "<g class=\"axis\" font-size=\"11\" stroke=\"#ddd\">\n");
    for (double t = 0; t <= top * (1 + 1e-9); t += step)
        dm_sb_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                     "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\" fill=\"#444\">%g</text>\n",
                     XS(t), ytop, XS(t), ybot, XS(t), ybot + 14, t);
    dm_sb_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\" fill=\"#000\">ms</text>\n</g>\n",
                 (x0 + x1) / 2, ybot + 28);
    int y = TOP;
    for (int s = 0; s < nsec; s++) {
        dm_sb_printf(&b, "<g class=\"section\">\n<text x=\"%d\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">", CML,
                     y + 16);
        dm_sb_xml(&b, sec[s].name ? sec[s].name : "");
        dm_sb_printf(&b, "</text><text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#444\">", CML, y + 29);
        dm_sb_xml(&b, sec[s].summary ? sec[s].summary : "");
        dm_sb_printf(&b, "</text>\n");
        y += HEAD;
        for (int k = 0; k < sec[s].nbars; k++, y += ROW) {
            const dm_chart_bar *x = &sec[s].bars[k];
            char label[96];
            snprintf(label, sizeof label, "%s %s", x->pass ? "bwd" : "fwd", x->label ? x->label : "?");
            if (strlen(label) > 72) memcpy(label + 69, "...", 4);
            dm_sb_printf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", CML, y + BAR - 2);
            dm_sb_xml(&b, label);
            dm_sb_printf(&b, "</text>\n");
            if (!(x->ms >= 0)) { /* timed with another group */
                dm_sb_printf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#666\">", x0 + 4, y + BAR - 2);
                dm_sb_xml(&b, x->note ? x->note : "timed with another group");
                dm_sb_printf(&b, "</text>\n");
                continue;
            }
            dm_sb_printf(&b, "<rect class=\"group %s\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                         "fill-opacity=\"0.75\"><title>", dm_class_name(x->cls), x0, y, XS(x->ms) - x0, BAR,
                         bar_color(x->cls));
            dm_sb_xml(&b, x->label ? x->label : "?");
            dm_sb_printf(&b, ": %.4f ms", x->ms);
            char rt[32];
            if (x->floor_ms > 0)
                dm_sb_printf(&b, ", floor %.4f ms (%sx)", x->floor_ms, dm_ratio_text(x->ms / x->floor_ms, rt, sizeof rt));
            dm_sb_printf(&b, "</title></rect>\n");
            if (x->floor_ms >= 0)
                dm_sb_printf(&b, "<rect class=\"floor\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"4\" fill=\"#222\"/>\n",
                             x0, y + (BAR - 4) / 2, XS(x->floor_ms) - x0);
            dm_sb_printf(&b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" fill=\"#444\">%.3f ms", XS(x->ms) + 4,
                         y + BAR - 2, x->ms);
            if (x->floor_ms > 0) dm_sb_printf(&b, " (%sx floor)", dm_ratio_text(x->ms / x->floor_ms, rt, sizeof rt));
            dm_sb_printf(&b, "</text>\n");
        }
        dm_sb_printf(&b, "</g>\n");
    }
#undef XS
    dm_sb_printf(&b, "</svg>\n");
    return dm_sb_done(&b);
}

dm_status dm_groups_write_svg(const char *title, const char *subtitle, const dm_chart_section *sec, int nsec,
                              const char *path) {
    if (!path || !sec || nsec < 1) return dm_fail(DM_ERR_INVALID_ARG, "dm_groups_write_svg: nothing to draw");
    char *s = dm_groups_svg(title, subtitle, sec, nsec);
    if (!s) return dm_fail(DM_ERR_OOM, "out of memory building the SVG");
    dm_status st = dm_write_file_atomic(path, s, strlen(s));
    free(s);
    return st;
}
