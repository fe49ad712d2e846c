/* report.c: the cost report for scripts and people: a cJSON object (ops, groups, classes,
 * totals, device, config), the ops table as CSV, and a log-log roofline chart as SVG
 * (one <circle class="op ..."> per operator, the device's memory slope and its contraction
 * and vector ceilings), written atomically. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "analysis/cost.h"
#include "core/status.h"
#include "core/strbuf.h"

static const char *pass_name(int pass) { return pass ? "backward" : "forward"; }

/* --- JSON ------------------------------------------------------------------------------ */

static int jnum(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, isfinite(v) ? v : 0.0) != NULL;
}

cJSON *dm_cost_json(const dm_graph *g, const dm_cost_report *r, const dm_layer_config *cfg) {
    cJSON *root = cJSON_CreateObject(), *o = NULL, *arr = NULL;
    int ok = root != NULL;
    if (ok && cfg) {
        ok = (o = cJSON_AddObjectToObject(root, "config")) != NULL &&
             jnum(o, "batch", (double)cfg->batch) && jnum(o, "seq", (double)cfg->seq) &&
             jnum(o, "hidden", (double)cfg->hidden) && jnum(o, "heads", (double)cfg->heads) &&
             jnum(o, "ffn", (double)cfg->ffn) && jnum(o, "dropout", cfg->dropout) &&
             cJSON_AddStringToObject(o, "act", dm_act_name(cfg->act)) &&
             cJSON_AddStringToObject(o, "norm", dm_norm_name(cfg->norm)) &&
             cJSON_AddBoolToObject(o, "causal", cfg->causal) &&
             cJSON_AddStringToObject(o, "dtype", r->dtype_bytes == 4 ? "fp32" : "bf16/fp16") &&
             jnum(o, "dtype_bytes", r->dtype_bytes);
    }
    ok = ok && (o = cJSON_AddObjectToObject(root, "device")) != NULL &&
         cJSON_AddStringToObject(o, "name", r->dev.name) &&
         cJSON_AddStringToObject(o, "description", r->dev.desc) &&
         jnum(o, "bandwidth_gbs", r->dev.bandwidth / 1e9) &&
         jnum(o, "contraction_gflops", dm_device_contract_peak(&r->dev, r->dtype_bytes) / 1e9) &&
         jnum(o, "vector_gflops", dm_device_vector_peak(&r->dev, r->dtype_bytes) / 1e9);
    ok = ok && (arr = cJSON_AddArrayToObject(root, "ops")) != NULL;
    for (int k = 0; ok && k < r->nops; k++) {
        const dm_op_cost *c = &r->ops[k];
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(arr, e) &&
             cJSON_AddStringToObject(e, "name", g->op[c->op].name) &&
             cJSON_AddStringToObject(e, "kind", dm_op_kind_name(g->op[c->op].kind)) &&
             cJSON_AddStringToObject(e, "pass", pass_name(c->pass)) &&
             cJSON_AddStringToObject(e, "class", dm_class_name(c->cls)) &&
             jnum(e, "flop", c->flop) && jnum(e, "bytes_read", c->bytes_read) &&
             jnum(e, "bytes_written", c->bytes_written) && jnum(e, "bytes", c->bytes) &&
             jnum(e, "intensity", c->intensity) &&
             cJSON_AddStringToObject(e, "bound", c->memory_bound ? "memory" : "compute") &&
             jnum(e, "predicted_seconds", c->predicted_s);
        if (ok && (dm_op_params(g->op[c->op].kind) & DM_OPP_SPEC))
            ok = cJSON_AddStringToObject(e, "spec", g->op[c->op].spec) != NULL;
    }
    ok = ok && (arr = cJSON_AddArrayToObject(root, "groups")) != NULL;
    for (int G = 0; ok && G < r->ngroups; G++) {
        const dm_group_cost *c = &r->groups[G];
        cJSON *e = cJSON_CreateObject(), *names = NULL;
        ok = e && cJSON_AddItemToArray(arr, e) && jnum(e, "index", G) &&
             cJSON_AddStringToObject(e, "pass", pass_name(c->pass)) &&
             cJSON_AddStringToObject(e, "class", dm_class_name(c->cls)) &&
             (names = cJSON_AddArrayToObject(e, "ops")) != NULL;
        for (int k = 0; ok && k < c->nops; k++) {
            cJSON *s = cJSON_CreateString(r->fused_graph->op[c->ops[k]].name);
            ok = s && cJSON_AddItemToArray(names, s);
            if (!ok) cJSON_Delete(s);
        }
        ok = ok && jnum(e, "flop", c->flop) && jnum(e, "bytes_read", c->bytes_read) &&
             jnum(e, "bytes_written", c->bytes_written) && jnum(e, "bytes", c->bytes) &&
             jnum(e, "predicted_seconds", c->predicted_s) &&
             cJSON_AddBoolToObject(e, "in_epilogue", c->in_epilogue) != NULL;
    }
    ok = ok && (o = cJSON_AddObjectToObject(root, "classes")) != NULL;
    double tsum = r->class_time[0] + r->class_time[1] + r->class_time[2];
    for (int k = 0; ok && k < DM_NUM_CLASSES; k++) {
        cJSON *e = cJSON_AddObjectToObject(o, dm_class_name((dm_op_class)k));
        ok = e && jnum(e, "flop", r->class_flop[k]) &&
             jnum(e, "forward_flop", r->pass_flop[0][k]) &&
             jnum(e, "backward_flop", r->pass_flop[1][k]) &&
             jnum(e, "flop_pct", r->flop_total > 0 ? 100 * r->class_flop[k] / r->flop_total : 0) &&
             jnum(e, "predicted_seconds", r->class_time[k]) &&
             jnum(e, "time_pct", tsum > 0 ? 100 * r->class_time[k] / tsum : 0);
    }
    ok = ok && (o = cJSON_AddObjectToObject(root, "totals")) != NULL && jnum(o, "flop", r->flop_total) &&
         jnum(o, "fused_flop", r->fused_flop) && jnum(o, "recomputed_flop", r->recomputed_flop) &&
         cJSON_AddBoolToObject(o, "recompute", r->recomputed_flop > 0) &&
         jnum(o, "unfused_bytes", r->unfused_bytes) && jnum(o, "fused_bytes", r->fused_bytes) &&
         jnum(o, "reduction_pct", r->reduction_pct) &&
         jnum(o, "unfused_floor_seconds", r->unfused_floor_s) &&
         jnum(o, "fused_floor_seconds", r->fused_floor_s) && jnum(o, "num_ops", r->nops) &&
         jnum(o, "num_fused_groups", r->ngroups) && jnum(o, "bias_epilogues", r->bias_epilogues);
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* --- CSV ------------------------------------------------------------------------------- */

static void sb_csv_field(dm_sbuf *b, const char *s) {
    if (!strpbrk(s, ",\"\n")) {
        dm_sb_printf(b, "%s", s);
        return;
    }
    dm_sb_printf(b, "\"");
    for (; *s; s++) dm_sb_printf(b, *s == '"' ? "\"\"" : "%c", *s);
    dm_sb_printf(b, "\"");
}

char *dm_cost_csv(const dm_graph *g, const dm_cost_report *r) {
    dm_sbuf b = {0};
    dm_sb_printf(&b, "name,kind,pass,class,flop,bytes_read,bytes_written,bytes,intensity,bound,"
                  "predicted_seconds\n");
    for (int k = 0; k < r->nops; k++) {
        const dm_op_cost *c = &r->ops[k];
        sb_csv_field(&b, g->op[c->op].name);
        dm_sb_printf(&b, ",%s,%s,%s,%.17g,%.17g,%.17g,%.17g,%.9g,%s,%.9g\n",
                  dm_op_kind_name(g->op[c->op].kind), pass_name(c->pass), dm_class_name(c->cls),
                  c->flop, c->bytes_read, c->bytes_written, c->bytes, c->intensity,
                  c->memory_bound ? "memory" : "compute", c->predicted_s);
    }
    return dm_sb_done(&b);
}

/* --- SVG roofline ---------------------------------------------------------------------- */

enum { W = 1100, H = 720, ML = 90, MR = 40, MT = 60, MB = 70 };

typedef struct {
    double lx0, lx1, ly0, ly1; /* log10 ranges */
} axes;

static double px(const axes *a, double x) {
    return ML + (log10(x) - a->lx0) / (a->lx1 - a->lx0) * (W - ML - MR);
}
static double py(const axes *a, double y) {
    return H - MB - (log10(y) - a->ly0) / (a->ly1 - a->ly0) * (H - MT - MB);
}

static const char *class_color(dm_op_class c) {
    return c == DM_CLASS_CONTRACTION ? "#1f77b4" : c == DM_CLASS_NORMALIZATION ? "#d62728" : "#2ca02c";
}

/* A roof: y = min(bw * x, peak) across the x range, as a polyline. */
static void roof(dm_sbuf *b, const axes *a, double bw, double peak, const char *cls, const char *color,
                 const char *label) {
    double x0 = pow(10, a->lx0), x1 = pow(10, a->lx1), ridge = peak / bw;
    dm_sb_printf(b, "<polyline class=\"roof %s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                 "points=\"", cls, color);
    dm_sb_printf(b, "%.1f,%.1f ", px(a, x0), py(a, fmin(bw * x0, peak)));
    if (ridge > x0 && ridge < x1) dm_sb_printf(b, "%.1f,%.1f ", px(a, ridge), py(a, peak));
    dm_sb_printf(b, "%.1f,%.1f\"/>\n", px(a, x1), py(a, fmin(bw * x1, peak)));
    dm_sb_printf(b, "<text class=\"roof-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" "
                 "font-size=\"12\" fill=\"%s\">", px(a, x1) - 4, py(a, peak) - 5, color);
    dm_sb_xml(b, label);
    dm_sb_printf(b, "</text>\n");
}

char *dm_cost_svg(const dm_graph *g, const dm_cost_report *r, const char *title) {
    double bw = r->dev.bandwidth, pc = dm_device_contract_peak(&r->dev, r->dtype_bytes),
           pv = dm_device_vector_peak(&r->dev, r->dtype_bytes);
    double imin = fmin(pc, pv) / bw, imax = fmax(pc, pv) / bw, fmin_ = fmin(pc, pv), fmax_ = fmax(pc, pv);
    for (int k = 0; k < r->nops; k++) {
        const dm_op_cost *c = &r->ops[k];
        if (c->intensity <= 0 || c->predicted_s <= 0) continue;
        imin = fmin(imin, c->intensity);
        imax = fmax(imax, c->intensity);
        fmin_ = fmin(fmin_, c->flop / c->predicted_s);
    }
    axes a = {floor(log10(imin)) - (log10(imin) - floor(log10(imin)) < 0.3 ? 1 : 0),
              ceil(log10(imax)) + 1, 0, 0};
    a.ly0 = floor(log10(fmin_)) - 1;
    a.ly1 = ceil(log10(fmax_ * 1.5));
    dm_sbuf b = {0};
    dm_sb_svg_open(&b, W, H, 0);
    dm_sb_printf(&b, "<text x=\"%d\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">", W / 2);
    dm_sb_xml(&b, title ? title : "roofline");
    dm_sb_printf(&b, "</text>\n<text x=\"%d\" y=\"46\" font-size=\"12\" text-anchor=\"middle\">", W / 2);
    dm_sb_xml(&b, r->dev.desc);
    dm_sb_printf(&b, "</text>\n");
    dm_sb_printf(&b, "<defs><clipPath id=\"plot\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>"
                  "</clipPath></defs>\n", ML, MT, W - ML - MR, H - MT - MB);
    /* grid and ticks at decades */
    dm_sb_printf(&b, "<g class=\"axes\" stroke=\"#ccc\" font-size=\"11\">\n");
    for (int e = (int)a.lx0; e <= (int)a.lx1; e++) {
        double x = ML + (e - a.lx0) / (a.lx1 - a.lx0) * (W - ML - MR);
        dm_sb_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                      "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\">1e%d</text>\n",
                  x, MT, x, H - MB, x, H - MB + 16, e);
    }
    for (int e = (int)a.ly0; e <= (int)a.ly1; e++) {
        double y = H - MB - (e - a.ly0) / (a.ly1 - a.ly0) * (H - MT - MB);
        dm_sb_printf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                      "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" stroke=\"none\">%g</text>\n",
                  ML, y, W - MR, y, ML - 6, y + 4, pow(10, e) / 1e9);
    }
    dm_sb_printf(&b, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                  "stroke=\"black\"/>\n", ML, MT, W - ML - MR, H - MT - MB);
    dm_sb_printf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">operational "
                  "intensity (flop/byte, %s)</text>\n", (ML + W - MR) / 2, H - 22,
              dm_dtype_bytes_name(r->dtype_bytes));
    dm_sb_printf(&b, "<text x=\"20\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\" "
                  "transform=\"rotate(-90 20 %d)\">attainable GFLOP/s</text>\n", (MT + H - MB) / 2,
              (MT + H - MB) / 2);
    char lab[160];
    dm_sb_printf(&b, "<g clip-path=\"url(#plot)\">\n");
    snprintf(lab, sizeof lab, "contraction peak %.0f GFLOP/s, %.0f GB/s", pc / 1e9, bw / 1e9);
    roof(&b, &a, bw, pc, "contraction", "#1f77b4", lab);
    snprintf(lab, sizeof lab, "vector peak %.0f GFLOP/s", pv / 1e9);
    roof(&b, &a, bw, pv, "vector", "#ff7f0e", lab);
    dm_sb_printf(&b, "</g>\n<g class=\"points\" font-size=\"8\">\n");
    for (int k = 0; k < r->nops; k++) {
        const dm_op_cost *c = &r->ops[k];
        double x = c->intensity > 0 ? c->intensity : pow(10, a.lx0);
        double y = c->predicted_s > 0 && c->flop > 0 ? c->flop / c->predicted_s : pow(10, a.ly0);
        double cx = px(&a, x), cy = py(&a, y);
        const char *name = g->op[c->op].name;
        dm_sb_printf(&b, "<circle class=\"op %s %s\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" "
                      "fill-opacity=\"0.75\"><title>", dm_class_name(c->cls), pass_name(c->pass), cx,
                  cy, class_color(c->cls));
        dm_sb_xml(&b, name);
        dm_sb_printf(&b, " (%s, %s): %.3g GFLOP, %.3g MB, %.3g flop/B, %s-bound, %.3g ms</title>"
                      "</circle>\n", pass_name(c->pass), dm_class_name(c->cls), c->flop / 1e9,
                  c->bytes / 1e6, c->intensity, c->memory_bound ? "memory" : "compute",
                  c->predicted_s * 1e3);
        dm_sb_printf(&b, "<text class=\"op-label\" x=\"%.1f\" y=\"%.1f\" fill=\"#444\">", cx + 5,
                  cy - 3 - 8 * (k % 3));
        dm_sb_xml(&b, name);
        dm_sb_printf(&b, "</text>\n");
    }
    dm_sb_printf(&b, "</g>\n<g class=\"legend\" font-size=\"12\">\n");
    for (int k = 0; k < DM_NUM_CLASSES; k++) {
        int y = MT + 16 + 18 * k;
        dm_sb_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                      "<text x=\"%d\" y=\"%d\">%s</text>\n", ML + 12, y - 9,
                  class_color((dm_op_class)k), ML + 28, y, dm_class_name((dm_op_class)k));
    }
    dm_sb_printf(&b, "</g>\n</svg>\n");
    return dm_sb_done(&b);
}

dm_status dm_cost_write_svg(const dm_graph *g, const dm_cost_report *r, const char *title,
                            const char *path) {
    char *s = dm_cost_svg(g, r, title);
    if (!s) return dm_fail(DM_ERR_OOM, "out of memory building the SVG");
    dm_status st = dm_write_file_atomic(path, s, strlen(s));
    free(s);
    return st;
}
