/* cmd_bench.c: `dmove bench`: times the layer's training step for each schedule (medians
 * over repetitions after warm-up): forward, backward, the step, the contractions alone,
 * GFLOP/s, and time per operator class beside its share of the flop (the paper's table).
 * Human-readable table by default, one JSON object with --json. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "analysis/cost.h"
#include "analysis/device.h"
#include "core/sysinfo.h"
#include "cli_common.h"

static const char *const CMD = "bench";

static void usage(FILE *out) {
    fprintf(out,
            "usage: dmove bench [options]\n"
            "\n"
            "Times one training step (forward + backward) of a BERT encoder layer on random\n"
            "inputs, for the fused and the unfused schedule of the same graph. For each it\n"
            "reports medians over --reps repetitions after --warmup untimed steps:\n"
            "  forward, backward and step (forward + backward) time, GFLOP/s of the step,\n"
            "  the contractions alone (every GEMM of the step and nothing else: the floor),\n"
            "  and per operator class (contraction, normalization, element-wise) its\n"
            "  milliseconds, %% of the step's flop and %% of its runtime, from a profiled\n"
            "  step (timers around each group, so their sum is a little above the step).\n"
            "Then the ratios fused/unfused and fused/contractions alone.\n"
            "\n"
            "options:\n");
    cli_config_help(out, CLI_CFG_ALL);
    cli_device_help(out);
    fprintf(out,
            "  --warmup N       untimed steps before timing (default 3)\n"
            "  --reps N         timed repetitions (default 10); medians are reported\n"
            "  --schedule S     fused, unfused or both (default both)\n");
    cli_recompute_help(out, "the fused and tuned runs");
    fprintf(out,
            "  --plan FILE      also run a plan from `dmove tune` (row \"tuned\"), beside\n"
            "                   the default plan of its schedule; prints the speedup\n"
            "  --groups         also list every group of the plan with its time in the\n"
            "                   profiled steps (the median over --reps; on stderr): where\n"
            "                   the step's time goes; beside each its roofline floor (its\n"
            "                   flop at the peak rate, or its bytes at the memory\n"
            "                   bandwidth, the larger; as `dmove analyze`) and how far\n"
            "                   above it the group ran, then per class the time above the\n"
            "                   floors: what is left to gain. With --json, each\n"
            "                   schedule's \"groups\" and \"roofline\"\n"
            "  --svg FILE       draw every group (--groups, implied) as a bar of its time\n"
            "                   with its floor inside, one section per schedule\n"
            "  --roofline D     the device model of the floors (implies --groups): cpu (the\n"
            "                   profile of `dmove probe`), v100, a100, h100, h200 (SXM\n"
            "                   datasheets) or none. Default: the GPU's board from its name\n"
            "                   with --device cuda (none for boards without a preset), else\n"
            "                   cpu if this machine has a profile\n"
            "  --json           print one JSON object on stdout instead of the table:\n"
            "                   {\"config\": {...}, \"schedules\": [{\"schedule\": \"fused\",\n"
            "                   \"forward_ms\", \"backward_ms\", \"step_ms\",\n"
            "                   \"contractions_alone_ms\", \"gflops\", \"class_ms\": {...},\n"
            "                   ...}],\n"
            "                   \"machine\": {...}, \"dmove_version\": ...}\n"
            "  --help           this text\n"
            "Progress goes to stderr once a run takes more than a few seconds.\n"
            "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove bench                                  (BERT-base, both schedules)\n"
            "  dmove bench --preset bert-large --reps 5 --json > large.json\n"
            "  dmove bench --batch 2 --seq 64 --schedule fused --dropout 0\n");
}

typedef struct {
    const char *name;
    double fwd_ms, bwd_ms, step_ms, contr_ms, gflops;
    double class_ms[DM_NUM_CLASSES];
    double flop[2][DM_NUM_CLASSES], flop_total;
    dm_cuda_choices cuda;    /* CUDA: what the executor chose (generated, fused, ...) */
    dm_layer_memory mem;     /* what the layer holds */
    /* --groups: the plan's groups (their times the medians over the profiled steps), and
     * the roofline they are held to */
    dm_layer_group *groups;
    int ngroups;
    double *floor_s;         /* per group (a group timed with another: 0, its floor added
                              * to that group's); NULL without a model */
    dm_device model;
    char model_note[320];    /* without a model: why */
    int group_reps;          /* the profiled steps the groups' medians are over */
} result;

static double g_start, g_last_note;
static dm_device_kind g_device = DM_DEVICE_CPU; /* --device */
static dm_dtype g_dtype = DM_DTYPE_FP32;         /* --dtype */
static dm_rows g_rows = DM_ROWS_DEFAULT;         /* --rows */
static int g_streams = 0;                        /* --streams */

/* The CUDA row kernels a layer gets (dm_rows_resolve), for the JSON record; "-" on the
 * CPU. */
static const char *rows_in_effect(void) {
    dm_rows r;
    if (g_device != DM_DEVICE_CUDA) return "-";
    return dm_rows_resolve(g_rows, &r) == DM_OK ? dm_rows_name(r) : "?";
}
/* The CUDA streams a layer gets (dm_streams_resolve), for the JSON record; 0 on the CPU. */
static int streams_in_effect(void) {
    int n = 0;
    if (g_device != DM_DEVICE_CUDA) return 0;
    return dm_streams_resolve(g_streams, &n) == DM_OK ? n : -1;
}
static int g_groups;                             /* --groups */
static const char *g_roofline;                   /* --roofline, or NULL: by the device */
static const char *g_svg;                        /* --svg: the groups chart */
static int g_recompute;                          /* --recompute (the fused and tuned layers) */

/* Progress on stderr, only once the bench has run a few seconds, at most every second:
 * the phase, its step (0: the untimed one before a phase's timed steps), and the time
 * left from the steps done so far (done of total). */
static void progress(const char *sched, const char *phase, int rep, int reps, long done, long total) {
    double now = cli_now();
    if (now - g_start < 3.0 || now - g_last_note < 1.0) return;
    g_last_note = now;
    double left = done > 0 ? (now - g_start) / (double)done * (double)(total - done) : 0;
    fprintf(stderr, "bench %s: %s %d/%d (step %ld of %ld, ~%.0f s left)\n", sched, phase, rep, reps, done + 1,
            total, left);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) { /* sorts v */
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int step(dm_layer *layer) {
    if (dm_layer_forward(layer) != DM_OK || dm_layer_backward(layer) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

/* One schedule under test: its layer and its per-repetition samples. */
typedef struct {
    dm_layer *layer;
    int reps;
    double *buf, *fwd, *bwd, *stp, *con, *cls; /* cls[c * reps + r] */
    double *gsec;                              /* --groups: gsec[G * reps + r], seconds */
    int ngroups;
} sched_run;

static void sched_free(sched_run *s) {
    dm_layer_free(s->layer);
    free(s->buf);
    free(s->gsec);
    memset(s, 0, sizeof *s);
}

static int sched_setup(const cli_config *c, dm_schedule sched, const char *plan, int reps,
                       sched_run *s, result *res) {
    const dm_layer_config *cfg = &c->cfg;
    memset(s, 0, sizeof *s);
    s->reps = reps;
    res->name = plan ? "tuned" : sched == DM_SCHED_FUSED ? "fused" : "unfused";
    dm_layer_options opt = {.schedule = sched, .forward_only = 0, .threads = c->threads, .plan = plan,
                            .recompute = g_recompute && sched == DM_SCHED_FUSED};
    opt.device = g_device;
    opt.dtype = g_dtype;
    opt.rows = g_rows;
    opt.streams = g_streams;
    s->buf = calloc((size_t)reps * (4 + DM_NUM_CLASSES), sizeof *s->buf);
    if (!s->buf) {
        cli_error(CMD, "out of memory");
        return -1;
    }
    s->fwd = s->buf;
    s->bwd = s->fwd + reps;
    s->stp = s->bwd + reps;
    s->con = s->stp + reps;
    s->cls = s->con + reps;
    if (dm_layer_new(&s->layer, cfg, &opt) != DM_OK ||
        dm_layer_init_params(s->layer, cfg->seed) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    if (g_groups) {
        s->ngroups = dm_layer_num_groups(s->layer);
        if (!(s->gsec = calloc((size_t)(s->ngroups > 0 ? s->ngroups : 1) * (size_t)reps, sizeof *s->gsec))) {
            cli_error(CMD, "out of memory");
            return -1;
        }
    }
    dm_layer_cuda_choices(s->layer, &res->cuda);
    dm_layer_memory_info(s->layer, &res->mem);
    if (res->cuda.gen_unavailable[0])
        fprintf(stderr, "dmove bench: note: %s: --rows auto runs the row groups and attention with the "
                "interpreter and cuBLAS: the generated kernels could not be built: %s\n", res->name, res->cuda.gen_unavailable);
    /* a bias group a cuBLASLt epilogue absorbed runs nothing, generated or not */
    if (g_device == DM_DEVICE_CUDA &&
        res->cuda.row_programs_generated < res->cuda.row_programs - res->cuda.bias_epilogues &&
        !strcmp(rows_in_effect(), "gen"))
        fprintf(stderr, "dmove bench: note: %s: %d of %d row groups run generated kernels (%d absorbed by bias "
                "epilogues), the rest the interpreter (the generator does not take them)\n", res->name,
                res->cuda.row_programs_generated, res->cuda.row_programs, res->cuda.bias_epilogues);
    float *x = NULL;
    int nd = 0;
    int64_t sh[4] = {0};
    if (dm_layer_tensor(s->layer, "hidden_states", &x, &nd, sh) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)sh[k];
    cli_rng rng;
    cli_rng_seed(&rng, cfg->seed);
    for (size_t k = 0; k < n; k++) x[k] = (float)cli_rng_normal(&rng);
    if (dm_layer_to_device(s->layer) != DM_OK) { /* parameters and input to the GPU */
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

/* One repetition of one phase: 0 warm-up, 1 timed step, 2 profiled step (per-class
 * time: timers around each group add a little), 3 the contractions alone (on buffers a
 * full step has filled). */
static int sched_rep(sched_run *s, int phase, int r) {
    dm_layer *layer = s->layer;
    if (phase == 0) return step(layer);
    if (phase == 1) {
        double t0 = cli_now();
        if (dm_layer_forward(layer) != DM_OK) goto fail;
        double t1 = cli_now();
        if (dm_layer_backward(layer) != DM_OK) goto fail;
        double t2 = cli_now();
        s->fwd[r] = 1e3 * (t1 - t0);
        s->bwd[r] = 1e3 * (t2 - t1);
        s->stp[r] = 1e3 * (t2 - t0);
        return 0;
    }
    if (phase == 2) {
        double t[2][DM_NUM_CLASSES];
        dm_layer_profile(layer, 1);
        dm_layer_profile_reset(layer);
        int rc = step(layer);
        dm_layer_profile(layer, 0);
        if (rc) return rc;
        dm_layer_profile_read(layer, t);
        if (r >= 0)
            for (int k = 0; k < DM_NUM_CLASSES; k++) s->cls[k * s->reps + r] = 1e3 * (t[0][k] + t[1][k]);
        for (int G = 0; r >= 0 && G < s->ngroups; G++) /* --groups */
            s->gsec[(size_t)G * (size_t)s->reps + (size_t)r] = dm_layer_group_seconds(layer, G);
        return 0;
    }
    double t0 = cli_now();
    if (dm_layer_run(layer, DM_PASS_FORWARD | DM_PASS_BACKWARD, 1u << DM_CLASS_CONTRACTION) != DM_OK)
        goto fail;
    if (r >= 0) s->con[r] = 1e3 * (cli_now() - t0);
    return 0;
fail:
    cli_error(CMD, "%s", dm_last_error());
    return -1;
}

static void sched_result(sched_run *s, int reps, result *res) {
    dm_layer_flop(s->layer, res->flop);
    res->flop_total = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < DM_NUM_CLASSES; k++) res->flop_total += res->flop[p][k];
    res->fwd_ms = median(s->fwd, reps);
    res->bwd_ms = median(s->bwd, reps);
    res->step_ms = median(s->stp, reps);
    res->contr_ms = median(s->con, reps);
    for (int k = 0; k < DM_NUM_CLASSES; k++) res->class_ms[k] = median(s->cls + k * reps, reps);
    res->gflops = res->step_ms > 0 ? res->flop_total / (res->step_ms * 1e-3) / 1e9 : 0.0;
}

/* Bytes per element of the layer's storage: the roofline's bytes and peaks. */
static int storage_bytes(void) { return g_device == DM_DEVICE_CUDA && g_dtype != DM_DTYPE_FP32 ? 2 : 4; }

/* The device model --groups holds the groups to: --roofline, else the GPU's board by its
 * name, else this CPU's profile from `dmove probe`. 0 with the reason in r->model_note
 * when there is none (not an error: the times are listed without floors). */
static int roofline_model(const cli_config *c, result *r) {
    const char *name = g_roofline;
    if (name && !strcmp(name, "none")) {
        snprintf(r->model_note, sizeof r->model_note, "--roofline none");
        return 0;
    }
    if (!name && g_device == DM_DEVICE_CUDA) {
        name = dm_device_for_gpu(r->cuda.gpu);
        if (!name) {
            if (r->cuda.gpu[0])
                snprintf(r->model_note, sizeof r->model_note, "no datasheet preset has the rates of the %.200s: "
                         "pass --roofline v100|a100|h100|h200 for one", r->cuda.gpu);
            else
                snprintf(r->model_note, sizeof r->model_note, "no GPU name (emulated): pass --roofline "
                         "v100|a100|h100|h200 for one");
            return 0;
        }
    }
    if (name && strcmp(name, "cpu") != 0) {
        if (dm_device_preset(name, &r->model) == DM_OK) return 1;
        snprintf(r->model_note, sizeof r->model_note, "%.300s", dm_last_error());
        return 0;
    }
    char path[4096];
    dm_cpu_profile p;
    if (dm_profile_default_path(path, sizeof path) != DM_OK || dm_profile_load(path, &p) != DM_OK ||
        dm_device_from_profile(&p, cli_threads(c->threads), &r->model) != DM_OK) {
        snprintf(r->model_note, sizeof r->model_note, "no CPU profile (%.200s): run `dmove probe` once",
                 dm_last_error());
        return 0;
    }
    return 1;
}

/* --groups: each group's facts, its time the median over the profiled steps and, with a
 * model, its floor (a group timed with another adds its floor to that one's). */
static int collect_groups(const cli_config *c, sched_run *s, result *r) {
    const dm_layer *layer = s->layer;
    const int n = s->ngroups;
    r->groups = calloc((size_t)(n > 0 ? n : 1), sizeof *r->groups);
    r->floor_s = calloc((size_t)(n > 0 ? n : 1), sizeof *r->floor_s);
    if (!r->groups || !r->floor_s) {
        cli_error(CMD, "out of memory");
        return -1;
    }
    r->ngroups = n;
    r->group_reps = s->reps;
    for (int G = 0; G < n; G++) {
        if (dm_layer_group_info(layer, G, &r->groups[G]) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
        r->groups[G].seconds = median(s->gsec + (size_t)G * (size_t)s->reps, s->reps);
    }
    if (!roofline_model(c, r)) {
        free(r->floor_s);
        r->floor_s = NULL;
        return 0;
    }
    const int esz = storage_bytes();
    for (int G = 0; G < n; G++) {
        const dm_layer_group *x = &r->groups[G];
        const int to = x->timed_with >= 0 && x->timed_with < n ? x->timed_with : G;
        const dm_layer_group *y = &r->groups[to];
        if (to == G - 1 && y->cls == DM_CLASS_CONTRACTION && x->contraction_flop == 0) {
            /* a row group in its contraction's epilogue: the two as one, the contraction's
             * output (all it writes, all the row group reads of it) never going to memory */
            const double rd = y->bytes_read + (x->bytes_read > y->bytes_written ? x->bytes_read - y->bytes_written : 0);
            r->floor_s[to] = dm_roofline_seconds(&r->model, esz, y->contraction_flop, y->other_flop + x->other_flop,
                                                 rd + x->bytes_written);
            continue;
        }
        /* its own work (a group timed beside another adds its floor to that one's) */
        r->floor_s[to] += dm_roofline_seconds(&r->model, esz, x->contraction_flop, x->other_flop,
                                              x->bytes_read + x->bytes_written);
    }
    return 0;
}

static int timed_apart(const result *r, int G) {
    return r->groups[G].timed_with < 0 || r->groups[G].timed_with >= r->ngroups;
}

/* How a profiled step times its groups: on a GPU by CUDA events (the GPU not waited for
 * in between, the streams overlapping as in a plain step: a main-stream group's time then
 * includes the second stream's work beside it), else by the host's clock. */
static const char *timing_note(void) {
    if (g_device != DM_DEVICE_CUDA || cli_emulated_note(g_device)[0]) return "each group waited for";
    return streams_in_effect() == 2 ? "timed by CUDA events, not waited for; groups on the two streams overlap, "
                                      "so their sum exceeds the step"
                                    : "timed by CUDA events, not waited for";
}

/* The group's operators, cut to `w` characters for a table. */
static void group_label(const dm_layer_group *x, char *buf, int w) {
    snprintf(buf, (size_t)w + 1, "%s", x->ops);
    if ((int)strlen(x->ops) > w && w > 3) memcpy(buf + w - 3, "...", 4);
}

/* The groups (stderr), each against its floor, then where the time above the floors goes. */
/* A time-to-floor ratio for the tables: 3 significant digits, without an exponent (a tiny
 * layer's groups can be thousands of times their floors: "14500", not "1.45e+04"). */
static const char *ratio_text(double x, char *buf, size_t n) {
    if (x < 1000) snprintf(buf, n, "%.3g", x);
    else snprintf(buf, n, "%.0f", x);
    return buf;
}

static void print_groups(const result *r) {
    const int esz = storage_bytes();
    fprintf(stderr, "\n%s: groups, %s of %d profiled step%s (%s)", r->name,
            r->group_reps > 1 ? "medians" : "times", r->group_reps, r->group_reps > 1 ? "s" : "", timing_note());
    if (r->floor_s)
        fprintf(stderr, ", against the roofline of %s: %s at %.3g TFLOP/s, the rest at %.3g, %.4g GB/s\n"
                "(%s)\n", r->model.name, esz == 2 ? "bf16/fp16 contractions" : "fp32 contractions",
                dm_device_contract_peak(&r->model, esz) / 1e12, dm_device_vector_peak(&r->model, esz) / 1e12,
                r->model.bandwidth / 1e9, r->model.desc);
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
            char rt[32];
            if (f > 0) fprintf(stderr, "%9.4f %9.4f %8s  %s\n", ms, f, ratio_text(ms / f, rt, sizeof rt), x->ops);
            else fprintf(stderr, "%9.4f %9.4f %8s  %s\n", ms, f, "-", x->ops);
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
            r->name, r->model.name, tot_ms, tot_floor, ratio_text(tot_floor > 0 ? tot_ms / tot_floor : 0.0, rt, sizeof rt));
    fprintf(stderr, "%-14s %9s %9s %8s %12s %11s\n", "class", "ms", "floor ms", "x floor", "above floor", "% of above");
    for (int k = 0; k < DM_NUM_CLASSES; k++) {
        const double above = cls_above[k];
        fprintf(stderr, "%-14s %9.3f %9.3f %8s %12.3f %11.1f\n", dm_class_name((dm_op_class)k), cls_ms[k],
                cls_floor[k], ratio_text(cls_floor[k] > 0 ? cls_ms[k] / cls_floor[k] : 0.0, rt, sizeof rt), above,
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
                ratio_text(r->floor_s[best] > 0 ? r->groups[best].seconds / r->floor_s[best] : 0.0, rt, sizeof rt));
    }
}

/* --svg: the groups of every schedule as bars against their floors (one file). */
static int write_chart(const cli_config *c, const result *res, int nres) {
    const dm_layer_config *cfg = &c->cfg;
    dm_chart_section sec[3];
    dm_chart_bar *bars[3] = {NULL, NULL, NULL};
    char summary[3][200], notes[3][8][120], title[256], sub[400];
    int ns = 0, rc = -1;
    const char *model = NULL;
    for (int s = 0; s < nres; s++) {
        const result *r = &res[s];
        if (!r->groups) continue;
        if (!(bars[ns] = calloc((size_t)(r->ngroups > 0 ? r->ngroups : 1), sizeof *bars[ns]))) {
            cli_error(CMD, "out of memory");
            goto done;
        }
        double tot = 0, fl = 0;
        int nnote = 0;
        for (int G = 0; G < r->ngroups; G++) {
            const dm_layer_group *x = &r->groups[G];
            dm_chart_bar *b = &bars[ns][G];
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
            model = r->model.desc;
            char rt[32];
            snprintf(summary[ns], sizeof summary[ns], "groups %.3f ms, their roofline floors %.3f ms (%sx); "
                     "median step %.3f ms", tot, fl, ratio_text(fl > 0 ? tot / fl : 0.0, rt, sizeof rt), r->step_ms);
        } else {
            snprintf(summary[ns], sizeof summary[ns], "groups %.3f ms, median step %.3f ms (no floors: %.100s)", tot,
                     r->step_ms, r->model_note);
        }
        sec[ns] = (dm_chart_section){r->name, summary[ns], bars[ns], r->ngroups};
        ns++;
    }
    snprintf(title, sizeof title, "dmove bench: time per group (medians of profiled steps), b=%" PRId64 " j=%" PRId64
             " i=%" PRId64 " h=%" PRId64 " u=%" PRId64 ", %s %s", cfg->batch, cfg->seq, cfg->hidden, cfg->heads,
             cfg->ffn, dm_device_kind_name(g_device), dm_dtype_name(g_dtype));
    snprintf(sub, sizeof sub, "%s; floor: %.300s", timing_note(), model ? model : "none");
    if (ns > 0 && dm_groups_write_svg(title, sub, sec, ns, g_svg) != DM_OK) {
        cli_error(CMD, "--svg: %s", dm_last_error());
        goto done;
    }
    rc = 0;
done:
    for (int k = 0; k < 3; k++) free(bars[k]);
    return rc;
}

static void result_free(result *r) {
    free(r->groups);
    free(r->floor_s);
    r->groups = NULL;
    r->floor_s = NULL;
}

/* Repetition r of `phase` (sched_rep) for each of the n schedules in turn, with progress. */
static int each_schedule(sched_run *s, const result *res, int n, int phase, int r, int count, long *done,
                         long total) {
    static const char *const phase_name[4] = {"warm-up", "rep", "profiled rep", "contractions-alone rep"};
    for (int k = 0; k < n; k++) {
        progress(res[k].name, phase_name[phase], r + 1, count, *done, total);
        if (sched_rep(&s[k], phase, r)) return -1;
        (*done)++;
    }
    return 0;
}

/* Runs the schedules interleaved, repetition by repetition, so that both see the same
 * machine state (frequency, other load) and their ratio is taken in one run. */
static int run_schedules(const cli_config *c, const dm_schedule *which, const char *const *plans,
                         int n, int warmup, int reps, result *res) {
    sched_run s[3];
    memset(s, 0, sizeof s);
    int rc = -1;
    for (int k = 0; k < n; k++)
        if (sched_setup(c, which[k], plans[k], reps, &s[k], &res[k])) goto done;
    const long total = (long)n * (warmup + reps + 2L * (reps + 1));
    long done_steps = 0;
    /* the warm-up; one untimed contractions-alone run; then, repetition by repetition, the
     * timed step and the contractions alone (interleaved as well: their ratio is the
     * table's "step / contr.", so both see the same machine state); last the profiled
     * steps, one untimed first */
    for (int r = 0; r < warmup; r++)
        if (each_schedule(s, res, n, 0, r, warmup, &done_steps, total)) goto done;
    if (each_schedule(s, res, n, 3, -1, reps, &done_steps, total)) goto done;
    for (int r = 0; r < reps; r++)
        if (each_schedule(s, res, n, 1, r, reps, &done_steps, total) ||
            each_schedule(s, res, n, 3, r, reps, &done_steps, total))
            goto done;
    for (int r = -1; r < reps; r++)
        if (each_schedule(s, res, n, 2, r, reps, &done_steps, total)) goto done;
    for (int k = 0; k < n; k++) sched_result(&s[k], reps, &res[k]);
    /* --groups: the profiled steps' medians, listed group by group (stderr, so that
     * --json stays one object on stdout) */
    for (int k = 0; k < n && g_groups; k++) {
        if (collect_groups(c, &s[k], &res[k])) goto done;
        print_groups(&res[k]);
    }
    rc = 0;
done:
    for (int k = 0; k < n; k++) sched_free(&s[k]);
    return rc;
}

static void cpu_model(char *out, size_t n) { dm_cpu_model_name(out, n, "unknown"); }

static double class_flop(const result *r, int k) { return r->flop[0][k] + r->flop[1][k]; }

static double class_ms_sum(const result *r) {
    double s = 0;
    for (int k = 0; k < DM_NUM_CLASSES; k++) s += r->class_ms[k];
    return s;
}

static void print_table(const cli_config *c, const result *res, int nres, int warmup, int reps) {
    const dm_layer_config *cfg = &c->cfg;
    printf("dmove %s bench: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           ", dropout %g, %s%s, %d threads; medians of %d reps after %d warm-up\n\n",
           DMOVE_VERSION, cfg->batch, cfg->seq, cfg->hidden, cfg->heads, cfg->ffn, cfg->dropout,
           dm_act_name(cfg->act), cli_variant(cfg), cli_threads(c->threads), reps, warmup);
    if (g_device != DM_DEVICE_CPU)
        printf("device: %s (%s storage%s)\n\n", dm_device_kind_name(g_device), dm_dtype_name(g_dtype),
               cli_emulated_note(g_device));
    printf("%-9s %11s %12s %10s %14s %9s %10s\n", "schedule", "forward ms", "backward ms",
           "step ms", "contractions", "GFLOP/s", "step /");
    printf("%-9s %11s %12s %10s %14s %9s %10s\n", "", "", "", "", "alone ms", "",
           "contr.");
    for (int s = 0; s < nres; s++) {
        const result *r = &res[s];
        printf("%-9s %11.2f %12.2f %10.2f %14.2f %9.1f %10.3f\n", r->name, r->fwd_ms, r->bwd_ms,
               r->step_ms, r->contr_ms, r->gflops,
               r->contr_ms > 0 ? r->step_ms / r->contr_ms : 0.0);
    }
    printf("\nper operator class (profiled step; %% of the step's flop vs %% of its runtime):\n");
    printf("%-9s %-14s %10s %10s %12s %10s\n", "schedule", "class", "GFLOP", "% flop", "ms",
           "% runtime");
    for (int s = 0; s < nres; s++) {
        const result *r = &res[s];
        double tsum = class_ms_sum(r);
        for (int k = 0; k < DM_NUM_CLASSES; k++) {
            double fl = class_flop(r, k);
            printf("%-9s %-14s %10.3f %10.2f %12.2f %10.2f\n", k ? "" : r->name,
                   dm_class_name((dm_op_class)k), fl / 1e9,
                   r->flop_total > 0 ? 100.0 * fl / r->flop_total : 0.0, r->class_ms[k],
                   tsum > 0 ? 100.0 * r->class_ms[k] / tsum : 0.0);
        }
    }
    printf("\n");
    const result *fu = NULL, *un = NULL, *tu = NULL;
    for (int s = 0; s < nres; s++) {
        if (!strcmp(res[s].name, "fused")) fu = &res[s];
        if (!strcmp(res[s].name, "unfused")) un = &res[s];
        if (!strcmp(res[s].name, "tuned")) tu = &res[s];
    }
    if (fu && un && un->step_ms > 0)
        printf("fused step / unfused step:          %.3f\n", fu->step_ms / un->step_ms);
    const result *base = fu ? fu : un;
    if (tu && base && tu->step_ms > 0)
        printf("%s step / tuned step (speedup):  %.3f\n", base->name, base->step_ms / tu->step_ms);
    if (fu && fu->contr_ms > 0)
        printf("fused step / contractions alone:    %.3f\n", fu->step_ms / fu->contr_ms);
    /* what fusion saves in memory too: the intermediates kept inside their groups get none */
    printf("\nmemory (MB): the arena (one allocation: inputs, parameters and gradients, outputs, every\n"
           "tensor that leaves its group), of it the intermediates planned by liveness, and %s:\n",
           g_device == DM_DEVICE_CUDA ? "the GPU executor's\nworkspace beside the arena (batched groups' "
                                        "temporaries, partial sums, cuBLASLt's workspace)"
                                      : "the\nper-thread scratch of the fused groups' rows and tiles");
    for (int s = 0; s < nres; s++)
        printf("%-9s arena %9.1f   intermediates %9.1f   scratch %7.1f\n", res[s].name, res[s].mem.arena / 1e6,
               res[s].mem.activations / 1e6, res[s].mem.scratch / 1e6);
    if (fu && un && un->mem.activations > 0)
        printf("fused intermediates / unfused:      %.3f\n", (double)fu->mem.activations / (double)un->mem.activations);
}

/* Adds a number; returns 0 when cJSON runs out of memory. */
static int jnum(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, isfinite(v) ? v : 0.0) != NULL;
}

/* --groups with --json: "roofline" (the model, or null and why not) and "groups" (each
 * with its time, flop, bytes and floor; floor_ms null without a model, 0 for a group timed
 * with another, "timed_with" naming that group's index, else -1). */
static int json_groups(cJSON *o, const result *r) {
    cJSON *rf = NULL, *arr = NULL;
    int ok = 1;
    if (r->floor_s) {
        double tot = 0;
        for (int G = 0; G < r->ngroups; G++) tot += r->floor_s[G];
        const int esz = storage_bytes();
        ok = (rf = cJSON_AddObjectToObject(o, "roofline")) != NULL &&
             cJSON_AddStringToObject(rf, "device", r->model.name) &&
             cJSON_AddStringToObject(rf, "desc", r->model.desc) &&
             jnum(rf, "contraction_flops", dm_device_contract_peak(&r->model, esz)) &&
             jnum(rf, "vector_flops", dm_device_vector_peak(&r->model, esz)) &&
             jnum(rf, "bandwidth", r->model.bandwidth) && jnum(rf, "floor_ms", tot * 1e3);
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
             cJSON_AddStringToObject(g, "ops", x->ops) && jnum(g, "ms", x->seconds * 1e3) &&
             jnum(g, "contraction_flop", x->contraction_flop) && jnum(g, "other_flop", x->other_flop) &&
             jnum(g, "bytes_read", x->bytes_read) && jnum(g, "bytes_written", x->bytes_written) &&
             jnum(g, "timed_with", x->timed_with) &&
             (r->floor_s ? jnum(g, "floor_ms", r->floor_s[G] * 1e3) : cJSON_AddNullToObject(g, "floor_ms") != NULL);
    }
    return ok;
}

static int print_json(const cli_config *c, const result *res, int nres, int warmup, int reps) {
    const dm_layer_config *cfg = &c->cfg;
    cJSON *root = cJSON_CreateObject(), *conf = NULL, *arr = NULL, *mach = NULL;
    int ok = root != NULL;
    ok = ok && (conf = cJSON_AddObjectToObject(root, "config")) != NULL;
    ok = ok && jnum(conf, "batch", (double)cfg->batch) && jnum(conf, "seq", (double)cfg->seq) &&
         jnum(conf, "hidden", (double)cfg->hidden) && jnum(conf, "heads", (double)cfg->heads) &&
         jnum(conf, "ffn", (double)cfg->ffn) && jnum(conf, "dropout", cfg->dropout) &&
         cJSON_AddStringToObject(conf, "act", dm_act_name(cfg->act)) &&
         cJSON_AddStringToObject(conf, "norm", dm_norm_name(cfg->norm)) &&
         cJSON_AddBoolToObject(conf, "causal", cfg->causal) &&
         cJSON_AddBoolToObject(conf, "recompute", g_recompute) &&
         jnum(conf, "eps", cfg->eps) && jnum(conf, "seed", (double)cfg->seed) &&
         jnum(conf, "threads", cli_threads(c->threads)) && jnum(conf, "warmup", warmup) &&
         jnum(conf, "reps", reps) &&
         cJSON_AddStringToObject(conf, "device", dm_device_kind_name(g_device)) &&
         cJSON_AddStringToObject(conf, "dtype", dm_dtype_name(g_dtype)) &&
         cJSON_AddStringToObject(conf, "rows", rows_in_effect()) &&
         jnum(conf, "streams", streams_in_effect());
    ok = ok && (arr = cJSON_AddArrayToObject(root, "schedules")) != NULL;
    for (int s = 0; ok && s < nres; s++) {
        const result *r = &res[s];
        cJSON *o = cJSON_CreateObject(), *cm = NULL, *pf = NULL, *pt = NULL;
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            ok = 0;
            break;
        }
        double tsum = class_ms_sum(r);
        ok = cJSON_AddStringToObject(o, "schedule", r->name) && jnum(o, "forward_ms", r->fwd_ms) &&
             jnum(o, "backward_ms", r->bwd_ms) && jnum(o, "step_ms", r->step_ms) &&
             jnum(o, "contractions_alone_ms", r->contr_ms) && jnum(o, "gflops", r->gflops) &&
             jnum(o, "row_programs", r->cuda.row_programs) &&
             jnum(o, "row_programs_generated", r->cuda.row_programs_generated) &&
             jnum(o, "attention_groups_fused", r->cuda.attention_fused) &&
             jnum(o, "groups_on_second_stream", r->cuda.second_stream) &&
             jnum(o, "bias_epilogues", r->cuda.bias_epilogues) &&
             jnum(o, "arena_bytes", (double)r->mem.arena) &&
             jnum(o, "intermediate_bytes", (double)r->mem.activations) &&
             jnum(o, "scratch_bytes", (double)r->mem.scratch) &&
             jnum(o, "parameter_bytes", (double)r->mem.parameters) &&
             jnum(o, "input_bytes", (double)r->mem.inputs) &&
             jnum(o, "step_over_contractions",
                  r->contr_ms > 0 ? r->step_ms / r->contr_ms : 0.0) &&
             jnum(o, "flop", r->flop_total) &&
             (cm = cJSON_AddObjectToObject(o, "class_ms")) != NULL &&
             (pf = cJSON_AddObjectToObject(o, "class_flop_pct")) != NULL &&
             (pt = cJSON_AddObjectToObject(o, "class_runtime_pct")) != NULL;
        for (int k = 0; ok && k < DM_NUM_CLASSES; k++) {
            const char *cn = dm_class_name((dm_op_class)k);
            ok = jnum(cm, cn, r->class_ms[k]) &&
                 jnum(pf, cn, r->flop_total > 0 ? 100.0 * class_flop(r, k) / r->flop_total : 0) &&
                 jnum(pt, cn, tsum > 0 ? 100.0 * r->class_ms[k] / tsum : 0);
        }
        if (ok && r->groups) ok = json_groups(o, r);
    }
    char model[256], date[32];
    cpu_model(model, sizeof model);
    time_t now = time(NULL);
    struct tm tmv;
    if (now == (time_t)-1 || !gmtime_r(&now, &tmv) ||
        !strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv))
        snprintf(date, sizeof date, "unknown");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ok = ok && (mach = cJSON_AddObjectToObject(root, "machine")) != NULL &&
         cJSON_AddStringToObject(mach, "cpu", model) &&
         jnum(mach, "online_cpus", cpus > 0 ? (double)cpus : 0) &&
         jnum(mach, "threads", cli_threads(c->threads)) &&
         cJSON_AddStringToObject(root, "date", date) &&
         cJSON_AddStringToObject(root, "dmove_version", DMOVE_VERSION);
    const result *fu = NULL, *un = NULL;
    for (int s = 0; s < nres; s++) {
        if (!strcmp(res[s].name, "fused")) fu = &res[s];
        if (!strcmp(res[s].name, "unfused")) un = &res[s];
    }
    if (ok && fu && un && un->step_ms > 0)
        ok = jnum(root, "fused_over_unfused_step", fu->step_ms / un->step_ms);
    for (int s = 0; ok && s < nres; s++)
        if (!strcmp(res[s].name, "tuned") && res[s].step_ms > 0 && (fu || un))
            ok = jnum(root, "tuned_speedup", (fu ? fu : un)->step_ms / res[s].step_ms);
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

int cmd_bench(int argc, char **argv) {
    int warmup = 3, reps = 10, json = 0, which = 3; /* bit 0 fused, bit 1 unfused */
    const char *plan = NULL;
    cli_config c;
    g_device = DM_DEVICE_CPU;
    g_dtype = DM_DTYPE_FP32;
    g_rows = DM_ROWS_DEFAULT;
    g_streams = 0;
    g_groups = 0;
    g_roofline = NULL;
    g_svg = NULL;
    cli_config_init(&c, CLI_CFG_ALL);
    for (int a = 1; a < argc; a++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--warmup", &v)) != 0) {
            if (r < 0 || cli_parse_int(CMD, "--warmup", v, 0, 1000000, &warmup)) return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_int(CMD, "--reps", v, 1, 1000000, &reps)) return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--schedule", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!strcmp(v, "fused"))
                which = 1;
            else if (!strcmp(v, "unfused"))
                which = 2;
            else if (!strcmp(v, "both"))
                which = 3;
            else {
                cli_usage_error(CMD, "--schedule: unknown schedule '%s' (known: fused, unfused, "
                                "both)", v);
                return CLI_USAGE;
            }
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--plan", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            plan = v;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--recompute")) != 0) {
            if (r < 0) return CLI_USAGE;
            g_recompute = 1;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--groups")) != 0) {
            if (r < 0) return CLI_USAGE;
            g_groups = 1;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--svg", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            g_svg = v;
            g_groups = 1;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--roofline", &v)) != 0) {
            dm_device probe;
            if (r < 0) return CLI_USAGE;
            g_groups = 1; /* the floors are --groups' */
            if (strcmp(v, "cpu") != 0 && strcmp(v, "none") != 0 && dm_device_preset(v, &probe) != DM_OK) {
                cli_usage_error(CMD, "--roofline: unknown device model '%s' (known: %s, none)", v,
                                dm_device_names());
                return CLI_USAGE;
            }
            g_roofline = v;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--json")) != 0) {
            if (r < 0) return CLI_USAGE;
            json = 1;
            continue;
        }
        if ((r = cli_device_option(CMD, argc, argv, &a, &g_device, &g_dtype, &g_rows, &g_streams)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        if ((r = cli_config_option(&c, CMD, argc, argv, &a)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        return cli_unknown(CMD, argv[a], "");
    }
    if (cli_config_finish(&c, CMD, 1)) return CLI_USAGE;
    const dm_layer_options chk = {.device = g_device, .dtype = g_dtype, .rows = g_rows, .streams = g_streams};
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    int bad_out = g_svg ? cli_check_output(CMD, "--svg", g_svg) : 0;
    if (bad_out) return bad_out;

    g_start = cli_now();
    g_last_note = 0;
    result res[3];
    int nres = 0;
    memset(res, 0, sizeof res);
    dm_schedule order[3];
    const char *plans[3] = {NULL, NULL, NULL};
    if (which & 1) order[nres++] = DM_SCHED_FUSED;
    if (which & 2) order[nres++] = DM_SCHED_UNFUSED;
    if (plan) {
        /* the tuned plan beside the default plan of its schedule */
        plans[nres] = plan;
        order[nres++] = which == 2 ? DM_SCHED_UNFUSED : DM_SCHED_FUSED;
    }
    int rc = CLI_OK;
    if (run_schedules(&c, order, plans, nres, warmup, reps, res)) rc = CLI_FAIL;
    else if (json) rc = print_json(&c, res, nres, warmup, reps) ? CLI_FAIL : CLI_OK;
    else {
        print_table(&c, res, nres, warmup, reps);
        if (fflush(stdout) != 0) {
            cli_error(CMD, "cannot write the report to stdout");
            rc = CLI_FAIL;
        }
    }
    /* the chart last: a chart that cannot be written loses no measurement */
    if (rc == CLI_OK && g_svg && write_chart(&c, res, nres)) rc = CLI_FAIL;
    for (int k = 0; k < nres; k++) result_free(&res[k]);
    return rc;
}
