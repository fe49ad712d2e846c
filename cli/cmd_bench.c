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

#include "bench.h"
#include "cli_common.h"

static const char *const CMD = "bench";

typedef struct {
    int warmup, reps, json, which; /* which: bit 0 fused, bit 1 unfused */
    int groups, recompute;
    const char *plan, *roofline, *svg, *lengths;
    cli_device dev;
    cli_config c;
    int model, model_set; /* --model; model_set: a --model option was given */
    bench_model_opts mo;
} bench_opts;

static void init(void *p) {
    bench_opts *o = p;
    o->warmup = 3;
    o->reps = 10;
    o->which = 3;
    cli_config_init(&o->c, CLI_CFG_ALL);
    o->mo.layers = 12;
    o->mo.vocab = 30522;
}

static int opt_roofline(void *base, const char *cmd, const char *v, const char *raw) {
    bench_opts *o = base;
    dm_device_model *m = NULL;
    o->groups = 1; /* the floors are --groups' */
    if (strcmp(v, "cpu") != 0 && strcmp(v, "none") != 0 && dm_device_model_preset(&m, v) != DM_OK) {
        cli_usage_error(cmd, "--roofline: unknown device model '%s' (known: %s, none)", v,
                        dm_device_names());
        return -1;
    }
    dm_device_model_free(m);
    o->roofline = v;
    return 0;
}

static const cli_choice k_schedules[] = {{"fused", 1}, {"unfused", 2}, {"both", 3}, {NULL, 0}};

static const cli_option k_options[] = {
    CLI_CONFIG(bench_opts, c, CLI_CFG_ALL),
    CLI_DEVICE(bench_opts, dev),
    {.kind = CLI_INT, .name = "--warmup", .arg = "N", .off = offsetof(bench_opts, warmup), .lo = 0, .hi = 1000000,
     .help = "untimed steps before timing (default {})"},
    {.kind = CLI_INT, .name = "--reps", .arg = "N", .off = offsetof(bench_opts, reps), .lo = 1, .hi = 1000000,
     .help = "timed repetitions (default {}); medians are reported"},
    {.kind = CLI_CHOICE, .name = "--schedule", .arg = "S", .off = offsetof(bench_opts, which), .choices = k_schedules,
     .msg = "--schedule: unknown schedule '%s' (known: fused, unfused, both)",
     .help = "fused, unfused or both (default {})"},
    {.kind = CLI_FLAG, .name = "--recompute", .off = offsetof(bench_opts, recompute), .lo = 1,
     .help = CLI_RECOMPUTE_HELP("the fused and tuned runs")},
    {.kind = CLI_STR, .name = "--plan", .arg = "FILE", .off = offsetof(bench_opts, plan),
     .help = "also run a plan from `dmove tune` (row \"tuned\"), beside\n"
             "the default plan of its schedule; prints the speedup"},
    {.kind = CLI_FLAG, .name = "--groups", .off = offsetof(bench_opts, groups), .lo = 1,
     .help = "also list every group of the plan with its time in the\n"
             "profiled steps (the median over --reps; on stderr): where\n"
             "the step's time goes; beside each its roofline floor (its\n"
             "flop at the peak rate, or its bytes at the memory\n"
             "bandwidth, the larger; as `dmove analyze`) and how far\n"
             "above it the group ran, then per class the time above the\n"
             "floors: what is left to gain. With --json, each\n"
             "schedule's \"groups\" and \"roofline\""},
    {.kind = CLI_FLAG, .name = "--model", .off = offsetof(bench_opts, model), .lo = 1,
     .help = "time the whole BertForMaskedLM's training step instead of a\n"
             "layer: the embeddings, --layers encoder layers, the MLM head\n"
             "at the scored positions and AdamW (or LAMB) with clipping,\n"
             "on random batches; then each part's time against its\n"
             "roofline floor (with --groups, every group of the\n"
             "embeddings, of a layer and of the head)"},
    {.kind = CLI_INT, .name = "--layers", .arg = "L", .off = offsetof(bench_opts, mo.layers),
     .set = offsetof(bench_opts, model_set) + 1, .lo = 1, .hi = 256,
     .help = "with --model: encoder layers (default {})"},
    {.kind = CLI_I64, .name = "--vocab", .arg = "V", .off = offsetof(bench_opts, mo.vocab),
     .set = offsetof(bench_opts, model_set) + 1, .lo = 2, .hi = INT64_C(1) << 24,
     .help = "with --model: vocabulary size (default {}, BERT's)"},
    {.kind = CLI_I64, .name = "--predictions", .arg = "M", .off = offsetof(bench_opts, mo.predictions),
     .set = offsetof(bench_opts, model_set) + 1, .lo = 1, .hi = INT64_C(1) << 30,
     .help = "with --model: masked positions scored (default b * ceil(j / 5))"},
    {.kind = CLI_FLAG, .name = "--lamb", .off = offsetof(bench_opts, mo.lamb), .lo = 1,
     .set = offsetof(bench_opts, model_set) + 1, .help = "with --model: LAMB instead of AdamW"},
    {.kind = CLI_STR, .name = "--lengths", .arg = "SPEC", .off = offsetof(bench_opts, lengths),
     .help = "batches of sequences of these lengths: the padded layer (attention_mask) against the\n"
             "unpadded one (the real tokens alone), a new batch each repetition; SPEC is\n"
             "uniform:LO-HI or a file of lengths (whole numbers, e.g. one per line; above\n"
             "--seq cut to it; each sequence's length drawn from them at random, as a\n"
             "corpus's batches would be); both fused, or both unfused with --schedule unfused"},
    {.kind = CLI_STR, .name = "--svg", .arg = "FILE", .off = offsetof(bench_opts, svg),
     .set = offsetof(bench_opts, groups) + 1,
     .help = "draw every group (--groups, implied) as a bar of its time\n"
             "with its floor inside, one section per schedule"},
    {.kind = CLI_CALL, .name = "--roofline", .arg = "D", .fn = opt_roofline,
     .help = "the device model of the floors (implies --groups): cpu (the\n"
             "profile of `dmove probe`), v100, a100, h100, h200 (SXM\n"
             "datasheets) or none. Default: the GPU's board from its name\n"
             "with --device cuda (none for boards without a preset), else\n"
             "cpu if this machine has a profile"},
    {.kind = CLI_FLAG, .name = "--json", .off = offsetof(bench_opts, json), .lo = 1,
     .help = "print one JSON object on stdout instead of the table:\n"
             "{\"config\": {...}, \"schedules\": [{\"schedule\": \"fused\",\n"
             "\"forward_ms\", \"backward_ms\", \"step_ms\",\n"
             "\"contractions_alone_ms\", \"gflops\", \"class_ms\": {...},\n"
             "...}],\n"
             "\"machine\": {...}, \"dmove_version\": ...}"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_bench = {
    .name = "bench",
    .head = "usage: dmove bench [options]\n"
            "\n"
            "Times one training step (forward + backward) of a BERT encoder layer on random\n"
            "inputs, for the fused and the unfused schedule of the same graph. For each it\n"
            "reports medians over --reps repetitions after --warmup untimed steps:\n"
            "  forward, backward and step (forward + backward) time, GFLOP/s of the step,\n"
            "  the contractions alone (every GEMM of the step and nothing else: the floor),\n"
            "  and per operator class (contraction, normalization, element-wise) its\n"
            "  milliseconds, %% of the step's flop and %% of its runtime, from a profiled\n"
            "  step (timers around each group, so their sum is a little above the step).\n"
            "Then the ratios fused/unfused and fused/contractions alone. With --model, the\n"
            "whole BertForMaskedLM's step instead, part by part against the roofline.\n"
            "\n"
            "options:\n",
    .foot = "Progress goes to stderr once a run takes more than a few seconds.\n"
            "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove bench                                  (BERT-base, both schedules)\n"
            "  dmove bench --preset bert-large --reps 5 --json > large.json\n"
            "  dmove bench --batch 2 --seq 64 --schedule fused --dropout 0\n"
            "  dmove bench --model --layers 4 --hidden 256 --heads 4 --ffn 1024 --batch 16\n"
            "                                               (a small BERT's whole step)\n"
            "  dmove bench --batch 32 --lengths uniform:32-96   (half fill: padded vs unpadded)\n",
    .options = k_options,
    .size = sizeof(bench_opts),
    .init = init,
};

static double g_start, g_last_note;
static dm_device_kind g_device = DM_DEVICE_CPU; /* --device */
static dm_dtype g_dtype = DM_DTYPE_FP32;         /* --dtype */
static dm_rows g_rows = DM_ROWS_DEFAULT;         /* --rows */
static int g_streams = 0;                        /* --streams */

/* The options a layer of this run resolves (rows and streams from the environment). */
static dm_layer_options effective(void) {
    const dm_layer_options o = {.device = g_device, .dtype = g_dtype, .rows = g_rows, .streams = g_streams};
    dm_layer_options e;
    (void)dm_layer_options_resolve(&o, &e);
    return e;
}
/* The CUDA row kernels a layer gets, for the JSON record; "-" on the CPU. */
static const char *rows_in_effect(void) {
    if (g_device != DM_DEVICE_CUDA) return "-";
    dm_layer_options e = effective();
    return e.rows != DM_ROWS_DEFAULT ? dm_rows_name(e.rows) : "?";
}
/* The CUDA streams a layer gets, for the JSON record; 0 on the CPU. */
static int streams_in_effect(void) {
    if (g_device != DM_DEVICE_CUDA) return 0;
    dm_layer_options e = effective();
    return e.streams ? e.streams : -1;
}
static int g_groups;                             /* --groups */
static const char *g_roofline;                   /* --roofline, or NULL: by the device */
static const char *g_svg;                        /* --svg: the groups chart */
static int g_recompute;                          /* --recompute (the fused and tuned layers) */

/* The device settings the --groups report reads (bench_groups.c). */
static bench_env run_env(void) {
    return (bench_env){.device = g_device, .dtype = g_dtype, .streams = streams_in_effect(), .roofline = g_roofline};
}

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

double bench_median(double *v, int n) { /* sorts v */
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
                       sched_run *s, bench_result *res) {
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
    const dm_layer *L = s->layer;
    res->row_programs = (int64_t)dm_layer_note_value(L, "row_programs", 0);
    res->row_programs_generated = (int64_t)dm_layer_note_value(L, "row_programs_generated", 0);
    res->attention_fused = (int64_t)dm_layer_note_value(L, "attention_fused", 0);
    res->attention_flash = (int64_t)dm_layer_note_value(L, "attention_flash", 0);
    res->bias_epilogues = (int64_t)dm_layer_note_value(L, "bias_epilogues", 0);
    res->second_stream = (int64_t)dm_layer_note_value(L, "second_stream", 0);
    snprintf(res->gpu, sizeof res->gpu, "%s", dm_layer_note_text(L, "gpu"));
    dm_layer_memory_info(s->layer, &res->mem);
    char note[512];
    snprintf(note, sizeof note, "%s", dm_layer_note_text(L, "gen_unavailable"));
    const char *fnote = dm_layer_note_text(L, "flash_unavailable");
    if (fnote[0])
        fprintf(stderr, "dmove bench: note: %s: the attention runs without the flash kernels "
                "(cuBLAS over padded copies): %s\n", res->name, fnote);
    if (note[0])
        fprintf(stderr, "dmove bench: note: %s: --rows auto runs the row groups and attention with the "
                "interpreter and cuBLAS: the generated kernels could not be built: %s\n", res->name, note);
    /* a bias group a cuBLASLt epilogue absorbed runs nothing, generated or not */
    if (g_device == DM_DEVICE_CUDA &&
        res->row_programs_generated < res->row_programs - res->bias_epilogues &&
        !strcmp(rows_in_effect(), "gen"))
        fprintf(stderr, "dmove bench: note: %s: %d of %d row groups run generated kernels (%d absorbed by bias "
                "epilogues), the rest the interpreter (the generator does not take them)\n", res->name,
                (int)res->row_programs_generated, (int)res->row_programs, (int)res->bias_epilogues);
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

static void sched_result(sched_run *s, int reps, bench_result *res) {
    dm_layer_flop(s->layer, res->flop);
    res->flop_total = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < DM_NUM_CLASSES; k++) res->flop_total += res->flop[p][k];
    res->fwd_ms = bench_median(s->fwd, reps);
    res->bwd_ms = bench_median(s->bwd, reps);
    res->step_ms = bench_median(s->stp, reps);
    res->contr_ms = bench_median(s->con, reps);
    for (int k = 0; k < DM_NUM_CLASSES; k++) res->class_ms[k] = bench_median(s->cls + k * reps, reps);
    res->gflops = res->step_ms > 0 ? res->flop_total / (res->step_ms * 1e-3) / 1e9 : 0.0;
}

/* Repetition r of `phase` (sched_rep) for each of the n schedules in turn, with progress. */
static int each_schedule(sched_run *s, const bench_result *res, int n, int phase, int r, int count, long *done,
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
                         int n, int warmup, int reps, bench_result *res) {
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
    const bench_env env = run_env();
    for (int k = 0; k < n && g_groups; k++) {
        if (bench_groups_collect(c, &env, s[k].layer, s[k].gsec, s[k].ngroups, s[k].reps, &res[k])) goto done;
        bench_groups_print(&env, &res[k]);
    }
    rc = 0;
done:
    for (int k = 0; k < n; k++) sched_free(&s[k]);
    return rc;
}

static void cpu_model(char *out, size_t n) { dm_cpu_model_name(out, n, "unknown"); }

static double class_flop(const bench_result *r, int k) { return r->flop[0][k] + r->flop[1][k]; }

static double class_ms_sum(const bench_result *r) {
    double s = 0;
    for (int k = 0; k < DM_NUM_CLASSES; k++) s += r->class_ms[k];
    return s;
}

static const char *cpu_isa(void) {
    const char *use;
    dm_cpu_kernel_isa(&use, NULL, NULL);
    return use;
}

static void print_table(const cli_config *c, const bench_result *res, int nres, int warmup, int reps) {
    const dm_layer_config *cfg = &c->cfg;
    printf("dmove %s bench: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           ", dropout %g, %s%s, %d threads; medians of %d reps after %d warm-up\n\n",
           DMOVE_VERSION, cfg->batch, cfg->seq, cfg->hidden, cfg->heads, cfg->ffn, cfg->dropout,
           dm_act_name(cfg->act), cli_variant(cfg), cli_threads(c->threads), reps, warmup);
    if (g_device != DM_DEVICE_CPU)
        printf("device: %s (%s storage%s)\n\n", dm_device_kind_name(g_device), dm_dtype_name(g_dtype),
               cli_emulated_note(g_device));
    else {
        const char *use, *widest, *why;
        dm_cpu_kernel_isa(&use, &widest, &why);
        if (strcmp(use, "none"))
            printf("GEMM kernels: dmove's own (%s%s%s%s%s) for every contraction by default, and where a plan says "
                   "direct; OpenBLAS where a plan says blas or a thread split (CPU's widest: %s%s%s)\n\n", use,
                   !strcmp(use, "amx") ? ": " : "", dm_cpu_kernel_split(),
                   strcmp(use, "avx512") && strcmp(use, "amx") ? "" : ", ",
                   strcmp(use, "avx512") && strcmp(use, "amx") ? "" : dm_cpu_kernel_packing(), widest, *why ? "; " : "",
                   why);
        else
            printf("GEMM kernels: OpenBLAS only, dmove's own kernel does not run here (CPU's widest: %s%s%s)\n\n",
                   widest, *why ? "; " : "", why);
    }
    printf("%-9s %11s %12s %10s %14s %9s %10s\n", "schedule", "forward ms", "backward ms",
           "step ms", "contractions", "GFLOP/s", "step /");
    printf("%-9s %11s %12s %10s %14s %9s %10s\n", "", "", "", "", "alone ms", "",
           "contr.");
    for (int s = 0; s < nres; s++) {
        const bench_result *r = &res[s];
        printf("%-9s %11.2f %12.2f %10.2f %14.2f %9.1f %10.3f\n", r->name, r->fwd_ms, r->bwd_ms,
               r->step_ms, r->contr_ms, r->gflops,
               r->contr_ms > 0 ? r->step_ms / r->contr_ms : 0.0);
    }
    printf("\nper operator class (profiled step; %% of the step's flop vs %% of its runtime):\n");
    printf("%-9s %-14s %10s %10s %12s %10s\n", "schedule", "class", "GFLOP", "% flop", "ms",
           "% runtime");
    for (int s = 0; s < nres; s++) {
        const bench_result *r = &res[s];
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
    const bench_result *fu = NULL, *un = NULL, *tu = NULL;
    for (int s = 0; s < nres; s++) {
        if (!strcmp(res[s].name, "fused")) fu = &res[s];
        if (!strcmp(res[s].name, "unfused")) un = &res[s];
        if (!strcmp(res[s].name, "tuned")) tu = &res[s];
    }
    if (fu && un && un->step_ms > 0)
        printf("fused step / unfused step:          %.3f\n", fu->step_ms / un->step_ms);
    const bench_result *base = fu ? fu : un;
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


static int print_json(const cli_config *c, const bench_result *res, int nres, int warmup, int reps) {
    const dm_layer_config *cfg = &c->cfg;
    const bench_env env = run_env();
    cJSON *root = cJSON_CreateObject(), *conf = NULL, *arr = NULL, *mach = NULL;
    int ok = root != NULL;
    ok = ok && (conf = cJSON_AddObjectToObject(root, "config")) != NULL;
    ok = ok && bench_jnum(conf, "batch", (double)cfg->batch) && bench_jnum(conf, "seq", (double)cfg->seq) &&
         bench_jnum(conf, "hidden", (double)cfg->hidden) && bench_jnum(conf, "heads", (double)cfg->heads) &&
         bench_jnum(conf, "ffn", (double)cfg->ffn) && bench_jnum(conf, "dropout", cfg->dropout) &&
         cJSON_AddStringToObject(conf, "act", dm_act_name(cfg->act)) &&
         cJSON_AddStringToObject(conf, "norm", dm_norm_name(cfg->norm)) &&
         cJSON_AddBoolToObject(conf, "causal", cfg->causal) &&
         cJSON_AddBoolToObject(conf, "recompute", g_recompute) &&
         bench_jnum(conf, "eps", cfg->eps) && bench_jnum(conf, "seed", (double)cfg->seed) &&
         bench_jnum(conf, "threads", cli_threads(c->threads)) && bench_jnum(conf, "warmup", warmup) &&
         bench_jnum(conf, "reps", reps) &&
         cJSON_AddStringToObject(conf, "device", dm_device_kind_name(g_device)) &&
         cJSON_AddStringToObject(conf, "dtype", dm_dtype_name(g_dtype)) &&
         cJSON_AddStringToObject(conf, "rows", rows_in_effect()) &&
         cJSON_AddStringToObject(conf, "cpu_kernel_isa", cpu_isa()) &&
         bench_jnum(conf, "streams", streams_in_effect());
    ok = ok && (arr = cJSON_AddArrayToObject(root, "schedules")) != NULL;
    for (int s = 0; ok && s < nres; s++) {
        const bench_result *r = &res[s];
        cJSON *o = cJSON_CreateObject(), *cm = NULL, *pf = NULL, *pt = NULL;
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            ok = 0;
            break;
        }
        double tsum = class_ms_sum(r);
        ok = cJSON_AddStringToObject(o, "schedule", r->name) && bench_jnum(o, "forward_ms", r->fwd_ms) &&
             bench_jnum(o, "backward_ms", r->bwd_ms) && bench_jnum(o, "step_ms", r->step_ms) &&
             bench_jnum(o, "contractions_alone_ms", r->contr_ms) && bench_jnum(o, "gflops", r->gflops) &&
             bench_jnum(o, "row_programs", (double)r->row_programs) &&
             bench_jnum(o, "row_programs_generated", (double)r->row_programs_generated) &&
             bench_jnum(o, "attention_groups_fused", (double)r->attention_fused) &&
             bench_jnum(o, "attention_groups_flash", (double)r->attention_flash) &&
             bench_jnum(o, "groups_on_second_stream", (double)r->second_stream) &&
             bench_jnum(o, "bias_epilogues", (double)r->bias_epilogues) &&
             bench_jnum(o, "arena_bytes", (double)r->mem.arena) &&
             bench_jnum(o, "intermediate_bytes", (double)r->mem.activations) &&
             bench_jnum(o, "scratch_bytes", (double)r->mem.scratch) &&
             bench_jnum(o, "parameter_bytes", (double)r->mem.parameters) &&
             bench_jnum(o, "input_bytes", (double)r->mem.inputs) &&
             bench_jnum(o, "step_over_contractions",
                  r->contr_ms > 0 ? r->step_ms / r->contr_ms : 0.0) &&
             bench_jnum(o, "flop", r->flop_total) &&
             (cm = cJSON_AddObjectToObject(o, "class_ms")) != NULL &&
             (pf = cJSON_AddObjectToObject(o, "class_flop_pct")) != NULL &&
             (pt = cJSON_AddObjectToObject(o, "class_runtime_pct")) != NULL;
        for (int k = 0; ok && k < DM_NUM_CLASSES; k++) {
            const char *cn = dm_class_name((dm_op_class)k);
            ok = bench_jnum(cm, cn, r->class_ms[k]) &&
                 bench_jnum(pf, cn, r->flop_total > 0 ? 100.0 * class_flop(r, k) / r->flop_total : 0) &&
                 bench_jnum(pt, cn, tsum > 0 ? 100.0 * r->class_ms[k] / tsum : 0);
        }
        if (ok && r->groups) ok = bench_groups_json(o, &env, r);
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
         bench_jnum(mach, "online_cpus", cpus > 0 ? (double)cpus : 0) &&
         bench_jnum(mach, "threads", cli_threads(c->threads)) &&
         cJSON_AddStringToObject(root, "date", date) &&
         cJSON_AddStringToObject(root, "dmove_version", DMOVE_VERSION);
    const bench_result *fu = NULL, *un = NULL;
    for (int s = 0; s < nres; s++) {
        if (!strcmp(res[s].name, "fused")) fu = &res[s];
        if (!strcmp(res[s].name, "unfused")) un = &res[s];
    }
    if (ok && fu && un && un->step_ms > 0)
        ok = bench_jnum(root, "fused_over_unfused_step", fu->step_ms / un->step_ms);
    for (int s = 0; ok && s < nres; s++)
        if (!strcmp(res[s].name, "tuned") && res[s].step_ms > 0 && (fu || un))
            ok = bench_jnum(root, "tuned_speedup", (fu ? fu : un)->step_ms / res[s].step_ms);
    return bench_json_emit(root, ok);
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    int rc = cli_parse(&k_bench, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    g_device = o.dev.device;
    g_dtype = o.dev.dtype;
    g_rows = o.dev.rows;
    g_streams = o.dev.streams;
    g_groups = o.groups;
    g_roofline = o.roofline;
    g_svg = o.svg;
    g_recompute = o.recompute;
    cli_config *c = &o.c;
    if (cli_config_finish(c, CMD, 1)) return CLI_USAGE;
    const dm_layer_options chk = {.device = g_device, .dtype = g_dtype, .rows = g_rows, .streams = g_streams};
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    int bad_out = g_svg ? cli_check_output(CMD, "--svg", g_svg) : 0;
    if (bad_out) return bad_out;

    if (o.model_set && !o.model) {
        cli_usage_error(CMD, "--layers, --vocab, --predictions and --lamb describe the whole model: add --model");
        return CLI_USAGE;
    }
    if (o.lengths) {
        if (o.model || o.plan || o.recompute || g_svg || o.groups || o.roofline) {
            cli_usage_error(CMD, "--lengths compares the default padded and unpadded layers: leave out --model, "
                            "--plan, --recompute, --svg, --groups and --roofline");
            return CLI_USAGE;
        }
        const dm_layer_options lo = {.schedule = o.which == 2 ? DM_SCHED_UNFUSED : DM_SCHED_FUSED,
                                     .threads = c->threads, .device = g_device, .dtype = g_dtype, .rows = g_rows,
                                     .streams = g_streams};
        return bench_lengths_run(c, o.lengths, &lo, o.warmup, o.reps, o.json);
    }
    if (o.model) {
        if (o.plan || o.recompute || g_svg || o.which == 2) {
            cli_usage_error(CMD, "--model runs the default fused plan: --plan, --recompute, --svg and --schedule unfused "
                            "are for a layer");
            return CLI_USAGE;
        }
        const dm_layer_config *cfg = &c->cfg;
        o.mo.warmup = o.warmup, o.mo.reps = o.reps, o.mo.json = o.json, o.mo.groups = o.groups;
        o.mo.predictions_used = o.mo.predictions ? o.mo.predictions : cfg->batch * ((cfg->seq + 4) / 5);
        const dm_layer_options lo = {.threads = c->threads, .device = g_device, .dtype = g_dtype, .rows = g_rows,
                                     .streams = g_streams};
        const bench_env env = run_env();
        return bench_model_run(c, &o.mo, &lo, &env) ? CLI_FAIL : CLI_OK;
    }
    g_start = cli_now();
    g_last_note = 0;
    bench_result res[3];
    int nres = 0;
    memset(res, 0, sizeof res);
    dm_schedule order[3];
    const char *plans[3] = {NULL, NULL, NULL};
    if (o.which & 1) order[nres++] = DM_SCHED_FUSED;
    if (o.which & 2) order[nres++] = DM_SCHED_UNFUSED;
    if (o.plan) {
        /* the tuned plan beside the default plan of its schedule */
        plans[nres] = o.plan;
        order[nres++] = o.which == 2 ? DM_SCHED_UNFUSED : DM_SCHED_FUSED;
    }
    rc = CLI_OK;
    if (run_schedules(c, order, plans, nres, o.warmup, o.reps, res)) rc = CLI_FAIL;
    else if (o.json) rc = print_json(c, res, nres, o.warmup, o.reps) ? CLI_FAIL : CLI_OK;
    else {
        print_table(c, res, nres, o.warmup, o.reps);
        if (fflush(stdout) != 0) {
            cli_error(CMD, "cannot write the report to stdout");
            rc = CLI_FAIL;
        }
    }
    /* the chart last: a chart that cannot be written loses no measurement */
    const bench_env env = run_env();
    if (rc == CLI_OK && g_svg && bench_groups_chart(c, &env, res, nres, g_svg)) rc = CLI_FAIL;
    for (int k = 0; k < nres; k++) bench_result_free(&res[k]);
    return rc;
}
