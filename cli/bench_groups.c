/* bench_groups.c: `dmove bench --groups`: every group of a plan with its time (the
 * median over the profiled steps) against its roofline floor, as a table on stderr, a
 * chart (--svg) and JSON; the device model the floors come from (--roofline, the GPU's
 * board, the CPU's probe profile). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench.h"

static const char *const CMD = "bench";

int bench_jnum(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, isfinite(v) ? v : 0.0) != NULL;
}

int bench_json_emit(cJSON *root, int ok) {
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        cli_error(CMD, "out of memory building the JSON report");
        return -1;
    }
    int wr = puts(text);
    cJSON_free(text);
    if (wr == EOF || fflush(stdout) != 0) {
        cli_error(CMD, "cannot write the report to stdout");
        return -1;
    }
    return 0;
}

/* Bytes per element of the layer's storage: the roofline's bytes and peaks. */
static int storage_bytes(const bench_env *env) {
    return env->device == DM_DEVICE_CUDA && env->dtype != DM_DTYPE_FP32 ? 2 : 4;
}

/* The device model --groups holds the groups to: --roofline, else the GPU's board by its
 * name, else this CPU's profile from `dmove probe`. 0 with the reason in r->model_note
 * when there is none (not an error: the times are listed without floors). */
static int roofline_model(const cli_config *c, const bench_env *env, bench_result *r) {
    const char *name = env->roofline;
    if (name && !strcmp(name, "none")) {
        snprintf(r->model_note, sizeof r->model_note, "--roofline none");
        return 0;
    }
    if (!name && env->device == DM_DEVICE_CUDA) {
        name = dm_device_for_gpu(r->gpu);
        if (!name) {
            if (r->gpu[0])
                snprintf(r->model_note, sizeof r->model_note, "no datasheet preset has the rates of the %.200s: "
                         "pass --roofline v100|a100|h100|h200 for one", r->gpu);
            else
                snprintf(r->model_note, sizeof r->model_note, "no GPU name (emulated): pass --roofline "
                         "v100|a100|h100|h200 for one");
            return 0;
        }
    }
    if (name && strcmp(name, "cpu") != 0) {
        if (dm_device_model_preset(&r->model, name) == DM_OK) return 1;
        snprintf(r->model_note, sizeof r->model_note, "%.300s", dm_last_error());
        return 0;
    }
    char path[4096];
    dm_profile *p = NULL;
    int ok = dm_profile_default_path(path, sizeof path) == DM_OK && dm_profile_open(&p, path) == DM_OK &&
             dm_device_model_cpu(&r->model, p, cli_threads(c->threads)) == DM_OK;
    dm_profile_free(p);
    if (!ok) {
        snprintf(r->model_note, sizeof r->model_note, "no CPU profile (%.200s): run `dmove probe` once",
                 dm_last_error());
        return 0;
    }
    return 1;
}

/* --groups: each group's facts, its time the median over the profiled steps and, with a
 * model, its floor (a group timed with another adds its floor to that one's). */
int bench_groups_collect(const cli_config *c, const bench_env *env, const dm_layer *layer, double *gsec, int n,
                         int reps, bench_result *r) {
    r->groups = calloc((size_t)(n > 0 ? n : 1), sizeof *r->groups);
    r->floor_s = calloc((size_t)(n > 0 ? n : 1), sizeof *r->floor_s);
    if (!r->groups || !r->floor_s) {
        cli_error(CMD, "out of memory");
        return -1;
    }
    r->ngroups = n;
    r->group_reps = reps;
    for (int G = 0; G < n; G++) {
        if (dm_layer_group_info(layer, G, &r->groups[G]) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
        r->groups[G].seconds = bench_median(gsec + (size_t)G * (size_t)reps, reps);
    }
    if (!roofline_model(c, env, r)) {
        free(r->floor_s);
        r->floor_s = NULL;
        return 0;
    }
    const int esz = storage_bytes(env);
    for (int G = 0; G < n; G++) {
        const dm_layer_group *x = &r->groups[G];
        const int to = x->timed_with >= 0 && x->timed_with < n ? x->timed_with : G;
        const dm_layer_group *y = &r->groups[to];
        if (to == G - 1 && y->cls == DM_CLASS_CONTRACTION && x->contraction_flop == 0) {
            /* a row group in its contraction's epilogue: the two as one, the contraction's
             * output (all it writes, all the row group reads of it) never going to memory */
            const double rd = y->bytes_read + (x->bytes_read > y->bytes_written ? x->bytes_read - y->bytes_written : 0);
            r->floor_s[to] = dm_device_model_roofline(r->model, esz, y->contraction_flop, y->other_flop + x->other_flop,
                                                 rd + x->bytes_written);
            continue;
        }
        /* its own work (a group timed beside another adds its floor to that one's) */
        r->floor_s[to] += dm_device_model_roofline(r->model, esz, x->contraction_flop, x->other_flop,
                                              x->bytes_read + x->bytes_written);
    }
    return 0;
}

static int timed_apart(const bench_result *r, int G) {
    return r->groups[G].timed_with < 0 || r->groups[G].timed_with >= r->ngroups;
}

/* How a profiled step times its groups: on a GPU by CUDA events (the GPU not waited for
 * in between, the streams overlapping as in a plain step: a main-stream group's time then
 * includes the second stream's work beside it), else by the host's clock. */
static const char *timing_note(const bench_env *env) {
    if (env->device != DM_DEVICE_CUDA || cli_emulated_note(env->device)[0]) return "each group waited for";
    return env->streams == 2 ? "timed by CUDA events, not waited for; groups on the two streams overlap, "
                                      "so their sum exceeds the step"
                                    : "timed by CUDA events, not waited for";
}

/* The group's operators, cut to `w` characters for a table. */
static void group_label(const dm_layer_group *x, char *buf, int w) {
    snprintf(buf, (size_t)w + 1, "%s", x->ops);
    if ((int)strlen(x->ops) > w && w > 3) memcpy(buf + w - 3, "...", 4);
}

/* The groups (stderr), each against its floor, then where the time above the floors goes. */
void bench_groups_print(const bench_env *env, const bench_result *r) {
    const int esz = storage_bytes(env);
    fprintf(stderr, "\n%s: groups, %s of %d profiled step%s (%s)", r->name,
            r->group_reps > 1 ? "medians" : "times", r->group_reps, r->group_reps > 1 ? "s" : "", timing_note(env));
    if (r->floor_s)
        fprintf(stderr, ", against the roofline of %s: %s at %.3g TFLOP/s, the rest at %.3g, %.4g GB/s\n"
                "(%s)\n", dm_device_model_name(r->model), esz == 2 ? "bf16/fp16 contractions" : "fp32 contractions",
                dm_device_model_contract_peak(r->model, esz) / 1e12, dm_device_model_vector_peak(r->model, esz) / 1e12,
                dm_device_model_bandwidth(r->model) / 1e9, dm_device_model_desc(r->model));
    else
        fprintf(stderr, " (no roofline floors: %s)\n", r->model_note);
    fprintf(stderr, "%-8s %-13s %9s %9s %8s  %s\n", "pass", "class", "ms", "floor ms", "x floor", "operators");
    /* per class: time, floors, and the time above its floor of each group above it */
    double cls_ms[DM_NUM_CLASSES] = {0}, cls_floor[DM_NUM_CLASSES] = {0}, cls_above[DM_NUM_CLASSES] = {0};
    for (int G = 0; G < r->ngroups; G++) {
        const dm_layer_group *x = &r->groups[G];
        const double ms = x->seconds * 1e3;
        fprintf(stderr, "%-8s %-13s ", x->pass ? "backward" : "forward", dm_class_name(x->cls));
        if (!timed_apart(r, G)) {
            fprintf(stderr, "%9s %9s %8s  %s  (timed with %s, its floor counted there)\n", "-", "-", "-", x->ops,
                    r->groups[x->timed_with].ops);
            continue;
        }
        cls_ms[x->cls] += ms;
        if (r->floor_s) {
            const double f = r->floor_s[G] * 1e3;
            cls_floor[x->cls] += f;
            cls_above[x->cls] += ms > f ? ms - f : 0;
            char rt[32], fs[32];
            /* a floor below the column's last digit with 3 significant ones, not as 0.0000 */
            snprintf(fs, sizeof fs, f > 0 && f < 0.001 ? "%9.3g" : "%9.4f", f);
            if (f > 0) fprintf(stderr, "%9.4f %9s %8s  %s\n", ms, fs, dm_ratio_text(ms / f, rt, sizeof rt), x->ops);
            else fprintf(stderr, "%9.4f %9s %8s  %s\n", ms, fs, "-", x->ops);
        } else {
            fprintf(stderr, "%9.4f %9s %8s  %s\n", ms, "-", "-", x->ops);
        }
    }
    if (!r->floor_s) return;
    /* where the time above the floors goes: by class, then the largest gaps */
    double tot_ms = 0, tot_floor = 0, gap = 0;
    for (int k = 0; k < DM_NUM_CLASSES; k++) {
        tot_ms += cls_ms[k];
        tot_floor += cls_floor[k];
        gap += cls_above[k];
    }
    char rt[32];
    fprintf(stderr, "\n%s against the roofline (%s): the groups took %.4g ms, their floors %.4g ms (%sx)\n",
            r->name, dm_device_model_name(r->model), tot_ms, tot_floor, dm_ratio_text(tot_floor > 0 ? tot_ms / tot_floor : 0.0, rt, sizeof rt));
    fprintf(stderr, "%-14s %9s %9s %8s %12s %11s\n", "class", "ms", "floor ms", "x floor", "above floor", "% of above");
    for (int k = 0; k < DM_NUM_CLASSES; k++) {
        const double above = cls_above[k];
        fprintf(stderr, "%-14s %9.3f %9.3f %8s %12.3f %11.1f\n", dm_class_name((dm_op_class)k), cls_ms[k],
                cls_floor[k], dm_ratio_text(cls_floor[k] > 0 ? cls_ms[k] / cls_floor[k] : 0.0, rt, sizeof rt), above,
                gap > 0 ? 100.0 * above / gap : 0.0);
    }
    fprintf(stderr, "largest gaps to the floor:\n");
    int shown[5] = {-1, -1, -1, -1, -1};
    for (int t = 0; t < 5; t++) {
        int best = -1;
        double bg = 0;
        for (int G = 0; G < r->ngroups; G++) {
            int taken = 0;
            for (int q = 0; q < t; q++) taken |= shown[q] == G;
            if (taken || !timed_apart(r, G)) continue;
            const double g = r->groups[G].seconds - r->floor_s[G];
            if (g > bg) {
                bg = g;
                best = G;
            }
        }
        if (best < 0) break;
        shown[t] = best;
        char label[61];
        group_label(&r->groups[best], label, 60);
        fprintf(stderr, "  %-8s %-60s %8.3f ms above its floor (%sx)\n", r->groups[best].pass ? "backward" : "forward",
                label, bg * 1e3,
                dm_ratio_text(r->floor_s[best] > 0 ? r->groups[best].seconds / r->floor_s[best] : 0.0, rt, sizeof rt));
    }
}

/* --svg: the groups of every schedule as bars against their floors (one file). */
int bench_groups_chart(const cli_config *c, const bench_env *env, const bench_result *res, int nres,
                       const char *svg) {
    const dm_layer_config *cfg = &c->cfg;
    dm_group_chart sec[3];
    dm_group_bar *bars[3] = {NULL, NULL, NULL};
    char summary[3][200], notes[3][8][120], title[256], sub[400];
    int ns = 0, rc = -1;
    const char *model = NULL;
    for (int s = 0; s < nres; s++) {
        const bench_result *r = &res[s];
        if (!r->groups) continue;
        if (!(bars[ns] = calloc((size_t)(r->ngroups > 0 ? r->ngroups : 1), sizeof *bars[ns]))) {
            cli_error(CMD, "out of memory");
            goto done;
        }
        double tot = 0, fl = 0;
        int nnote = 0;
        for (int G = 0; G < r->ngroups; G++) {
            const dm_layer_group *x = &r->groups[G];
            dm_group_bar *b = &bars[ns][G];
            b->label = x->ops;
            b->pass = x->pass;
            b->cls = x->cls;
            b->floor_ms = r->floor_s ? r->floor_s[G] * 1e3 : -1;
            b->ms = timed_apart(r, G) ? x->seconds * 1e3 : -1;
            if (b->ms < 0 && nnote < 8) {
                snprintf(notes[ns][nnote], sizeof notes[ns][nnote], "timed with %.100s",
                         r->groups[x->timed_with].ops);
                b->note = notes[ns][nnote++];
            }
            if (b->ms >= 0) tot += b->ms;
            if (b->floor_ms > 0) fl += b->floor_ms;
        }
        if (r->floor_s) {
            model = dm_device_model_desc(r->model);
            char rt[32];
            snprintf(summary[ns], sizeof summary[ns], "groups %.3f ms, their roofline floors %.3f ms (%sx); "
                     "median step %.3f ms", tot, fl, dm_ratio_text(fl > 0 ? tot / fl : 0.0, rt, sizeof rt), r->step_ms);
        } else {
            snprintf(summary[ns], sizeof summary[ns], "groups %.3f ms, median step %.3f ms (no floors: %.100s)", tot,
                     r->step_ms, r->model_note);
        }
        sec[ns] = (dm_group_chart){r->name, summary[ns], bars[ns], r->ngroups};
        ns++;
    }
    snprintf(title, sizeof title, "dmove bench: time per group (medians of profiled steps), b=%" PRId64 " j=%" PRId64
             " i=%" PRId64 " h=%" PRId64 " u=%" PRId64 ", %s %s", cfg->batch, cfg->seq, cfg->hidden, cfg->heads,
             cfg->ffn, dm_device_kind_name(env->device), dm_dtype_name(env->dtype));
    snprintf(sub, sizeof sub, "%s; floor: %.300s", timing_note(env), model ? model : "none");
    if (ns > 0 && dm_group_chart_write_svg(title, sub, sec, ns, svg) != DM_OK) {
        cli_error(CMD, "--svg: %s", dm_last_error());
        goto done;
    }
    rc = 0;
done:
    for (int k = 0; k < 3; k++) free(bars[k]);
    return rc;
}

void bench_result_free(bench_result *r) {
    free(r->groups);
    free(r->floor_s);
    dm_device_model_free(r->model);
    r->groups = NULL;
    r->floor_s = NULL;
    r->model = NULL;
}

/* --groups with --json: "roofline" (the model, or null and why not) and "groups" (each
 * with its time, flop, bytes and floor; floor_ms null without a model, 0 for a group timed
 * with another, "timed_with" naming that group's index, else -1). */
int bench_groups_json(cJSON *o, const bench_env *env, const bench_result *r) {
    cJSON *rf = NULL, *arr = NULL;
    int ok = 1;
    if (r->floor_s) {
        double tot = 0;
        for (int G = 0; G < r->ngroups; G++) tot += r->floor_s[G];
        const int esz = storage_bytes(env);
        ok = (rf = cJSON_AddObjectToObject(o, "roofline")) != NULL &&
             cJSON_AddStringToObject(rf, "device", dm_device_model_name(r->model)) &&
             cJSON_AddStringToObject(rf, "desc", dm_device_model_desc(r->model)) &&
             bench_jnum(rf, "contraction_flops", dm_device_model_contract_peak(r->model, esz)) &&
             bench_jnum(rf, "vector_flops", dm_device_model_vector_peak(r->model, esz)) &&
             bench_jnum(rf, "bandwidth", dm_device_model_bandwidth(r->model)) && bench_jnum(rf, "floor_ms", tot * 1e3);
    } else {
        ok = cJSON_AddNullToObject(o, "roofline") && cJSON_AddStringToObject(o, "roofline_note", r->model_note);
    }
    ok = ok && (arr = cJSON_AddArrayToObject(o, "groups")) != NULL;
    for (int G = 0; ok && G < r->ngroups; G++) {
        const dm_layer_group *x = &r->groups[G];
        cJSON *g = cJSON_CreateObject();
        if (!g || !cJSON_AddItemToArray(arr, g)) {
            cJSON_Delete(g);
            return 0;
        }
        ok = cJSON_AddStringToObject(g, "pass", x->pass ? "backward" : "forward") &&
             cJSON_AddStringToObject(g, "class", dm_class_name(x->cls)) &&
             cJSON_AddStringToObject(g, "ops", x->ops) && bench_jnum(g, "ms", x->seconds * 1e3) &&
             bench_jnum(g, "contraction_flop", x->contraction_flop) && bench_jnum(g, "other_flop", x->other_flop) &&
             bench_jnum(g, "bytes_read", x->bytes_read) && bench_jnum(g, "bytes_written", x->bytes_written) &&
             bench_jnum(g, "timed_with", x->timed_with) &&
             (r->floor_s ? bench_jnum(g, "floor_ms", r->floor_s[G] * 1e3) : cJSON_AddNullToObject(g, "floor_ms") != NULL);
    }
    return ok;
}
