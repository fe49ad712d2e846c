/* cmd_tune.c: `dmove tune`: measures every fused group of the training step under every
 * feasible layout of its tensors and every contraction algorithm, picks the fastest
 * configuration of the whole step by shortest path, writes it as a plan file, and checks
 * it against the default plan by timing both steps interleaved. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"

#define CMD "tune"

typedef struct {
    const char *out, *svg, *cache;
    int no_cache, reps, vreps, recompute, schedule;
    dm_act act;
    cli_config c;
} tune_opts;

static void init(void *p) {
    tune_opts *o = p;
    o->out = "dmove-plan.json";
    o->reps = 7;
    o->vreps = 5;
    o->schedule = DM_SCHED_FUSED;
    o->act = DM_ACT_GELU;
    cli_config_init(&o->c, CLI_CFG_SIZES | CLI_CFG_HEADS | CLI_CFG_ARCH | CLI_CFG_THREADS);
}

static int opt_act(void *base, const char *cmd, const char *v, const char *raw) {
    if (dm_act_parse(v, &((tune_opts *)base)->act) != DM_OK) {
        cli_usage_error(cmd, "--act: %s", dm_last_error());
        return -1;
    }
    return 0;
}

static const char *show_act(const void *t, char *buf, size_t n) { return dm_act_name(*(const dm_act *)t); }

static const cli_choice k_schedules[] = {{"fused", DM_SCHED_FUSED}, {"unfused", DM_SCHED_UNFUSED}, {NULL, 0}};

static const cli_option k_options[] = {
    CLI_CONFIG(tune_opts, c, CLI_CFG_SIZES | CLI_CFG_HEADS | CLI_CFG_ARCH | CLI_CFG_THREADS),
    {.kind = CLI_CALL, .name = "--act", .arg = "A", .off = offsetof(tune_opts, act), .fn = opt_act, .show = show_act,
     .help = "FFN activation: gelu, gelu_tanh or relu (default {})"},
    {.kind = CLI_CHOICE, .name = "--schedule", .arg = "S", .off = offsetof(tune_opts, schedule),
     .choices = k_schedules, .msg = "--schedule: unknown schedule '%s' (known: fused, unfused)",
     .help = "fused (default) or unfused: which plan to tune"},
    {.kind = CLI_STR, .name = "--out", .arg = "FILE", .off = offsetof(tune_opts, out),
     .help = "the plan file to write (default {})"},
    {.kind = CLI_STR, .name = "--svg", .arg = "FILE", .off = offsetof(tune_opts, svg),
     .help = "also draw each group's spread of candidate times (violins)"},
    {.kind = CLI_INT, .name = "--reps", .arg = "N", .off = offsetof(tune_opts, reps), .lo = 1, .hi = 63,
     .help = "timed repetitions per candidate (default {}; median)"},
    {.kind = CLI_STR, .name = "--cache", .arg = "FILE", .off = offsetof(tune_opts, cache),
     .help = "measurement cache (default $XDG_CACHE_HOME/dmove/tune-cache.tsv,\n"
             "else ~/.cache/dmove/tune-cache.tsv); a second run on the same\n"
             "machine and sizes is fast; it reuses what was measured then,\n"
             "so if the machine was busy, measure again with --no-cache"},
    {.kind = CLI_FLAG, .name = "--no-cache", .off = offsetof(tune_opts, no_cache), .lo = 1,
     .help = "measure everything, keep nothing"},
    {.kind = CLI_FLAG, .name = "--recompute", .off = offsetof(tune_opts, recompute), .lo = 1,
     .help = CLI_RECOMPUTE_HELP("fused schedule; the plan is for such layers")},
    {.kind = CLI_INT, .name = "--verify", .arg = "N", .off = offsetof(tune_opts, vreps), .lo = 0, .hi = 1000,
     .help = "time default and tuned step interleaved N times (default {};\n"
             "0 skips)"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_tune = {
    .name = "tune",
    .head = "usage: dmove tune [options]\n"
            "\n"
            "Chooses how to run the training step of a BERT encoder layer on this machine,\n"
            "by measurement (steps 3 and 4 of the paper's recipe):\n"
            "  1. candidates: for every tensor the plan keeps in memory (except the ones you\n"
            "     read and write), every order of its dimensions in memory (its layout) that\n"
            "     runs without a copy; for every contraction, how the threads share it (BLAS\n"
            "     threads inside one call, OpenMP over the batch, or the rows or columns\n"
            "     split between threads) and, on CPUs with AVX2 or AVX-512, dmove's own\n"
            "     GEMM kernel (\"direct\": reads the operands in place where that is\n"
            "     faster than packing them), also for the GEMMs inside the fused attention\n"
            "     groups and with the next row group run in its epilogue (\"direct_rows\");\n"
            "  2. each fused group is timed under each combination of its tensors' layouts\n"
            "     and each algorithm (warm-up, repetitions, median; each repetition right\n"
            "     after the group before it, which leaves the caches as in the step),\n"
            "     cached on disk;\n"
            "  3. the fastest configuration of the whole step, forward and backward, with one\n"
            "     layout per tensor, is found by shortest path over the groups; each group\n"
            "     whose choice is not its default then has both timed again, run by run in\n"
            "     alternation (a machine that slowed down for a while misleads no more), and\n"
            "     the path is found again on those times;\n"
            "  4. in the backward pass, each layer's input-gradient GEMM and its weight-\n"
            "     gradient GEMM, which need nothing from each other, are timed one after\n"
            "     the other and side by side (each on half the threads), alternately run\n"
            "     by run; where side by side is faster the plan runs them so (algorithm\n"
            "     \"concurrent\");\n"
            "  5. it is written as a plan file and timed against the default plan;\n"
            "  6. with a profile from `dmove probe`, both are set against the step's roofline\n"
            "     floor (as `dmove analyze` computes it): the room any plan has left.\n"
            "Use the plan with: dmove bench --plan FILE, dmove layer --plan FILE.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "Progress (count, time left) goes to stderr.\n"
            "\n"
            "exit status: 0 success, 1 runtime error (the cache keeps what was measured),\n"
            "2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove tune --out base.json\n"
            "  dmove tune --batch 32 --seq 128 --hidden 256 --heads 4 --ffn 1024 --out small.json\n"
            "  dmove bench --plan base.json\n",
    .options = k_options,
    .size = sizeof(tune_opts),
    .init = init,
};

static double g_last;

static void progress(int64_t done, int64_t total, int64_t cached, double secs, void *arg) {
    (void)arg;
    double now = cli_now();
    if (done < total && now - g_last < 0.5) return;
    g_last = now;
    int64_t measured = done - cached;
    double per = measured > 0 ? secs / (double)measured : 0;
    double left = per * (double)(total - done);
    int w = 30, fill = total > 0 ? (int)(w * done / total) : w;
    char bar[64];
    for (int k = 0; k < w; k++) bar[k] = k < fill ? '#' : '.';
    bar[w] = 0;
    fprintf(stderr, "\rtune [%s] %" PRId64 "/%" PRId64 " measured (%" PRId64 " from cache), %.0f s, ~%.0f s left ",
            bar, done, total, cached, secs, left);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times the default and the tuned plan's steps interleaved; prints medians and ratio and
 * gives the medians in med[2] (default, tuned). */
static int verify(const cli_config *c, dm_schedule sched, int recompute, const char *plan, int reps, double med[2]) {
    dm_layer *L[2] = {NULL, NULL};
    dm_layer_options o[2] = {{.schedule = sched, .threads = c->threads, .recompute = recompute},
                             {.schedule = sched, .threads = c->threads, .plan = plan, .recompute = recompute}};
    double *t = calloc((size_t)reps * 2, sizeof(double));
    int rc = -1;
    if (!t) {
        cli_error(CMD, "out of memory");
        return -1;
    }
    for (int k = 0; k < 2; k++)
        if (dm_layer_new(&L[k], &c->cfg, &o[k]) != DM_OK || dm_layer_init_params(L[k], 1) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
    for (int r = -2; r < reps; r++) /* two warm-up steps each */
        for (int k = 0; k < 2; k++) {
            double t0 = cli_now();
            if (dm_layer_forward(L[k]) != DM_OK || dm_layer_backward(L[k]) != DM_OK) {
                cli_error(CMD, "%s", dm_last_error());
                goto done;
            }
            if (r >= 0) t[k * reps + r] = cli_now() - t0;
        }
    double ratio[64];
    int nr = reps < 64 ? reps : 64;
    for (int r = 0; r < nr; r++) ratio[r] = t[r] / t[reps + r];
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    qsort(t + reps, (size_t)reps, sizeof(double), cmp_double);
    qsort(ratio, (size_t)nr, sizeof(double), cmp_double);
    printf("\nverified (%d interleaved training steps each, medians): default plan %.2f ms, tuned plan "
           "%.2f ms: speedup %.3fx (median of per-step ratios %.3fx)\n",
           reps, t[reps / 2] * 1e3, t[reps + reps / 2] * 1e3, t[reps / 2] / t[reps + reps / 2], ratio[nr / 2]);
    if (!(t[reps + reps / 2] < t[reps / 2]))
        printf("the tuned plan is not faster than the default in whole steps here, though its groups were when "
               "timed on their own: keep the default plan (run "
               "without --plan), or tune again with more --reps or when the machine is quiet\n");
    med[0] = t[reps / 2];
    med[1] = t[reps + reps / 2];
    rc = 0;
done:
    dm_layer_free(L[0]);
    dm_layer_free(L[1]);
    free(t);
    return rc;
}

/* The step's roofline floor on this CPU (the profile of `dmove probe`, as `dmove analyze`
 * uses it) against the default and the tuned plan's times: how much room any plan of
 * this schedule has left. Only a hint when there is no profile: tuning does not need one. */
static void print_floor(const cli_config *c, dm_schedule sched, int recompute, const double t[2], const char *what,
                        int direct) {
    char path[4096];
    dm_profile *p = NULL;
    dm_device_model *dev = NULL;
    double unfused_s = 0, fused_s = 0;
    if (dm_profile_default_path(path, sizeof path) != DM_OK || dm_profile_open(&p, path) != DM_OK) {
        printf("(no CPU profile at '%s': run `dmove probe` once to see this step's roofline floor here)\n", path);
        return;
    }
    dm_status st = dm_device_model_cpu(&dev, p, cli_threads(c->threads));
    if (st == DM_OK) st = dm_analysis_floors(&c->cfg, dev, 4, recompute, &unfused_s, &fused_s);
    dm_device_model_free(dev);
    dm_profile_free(p);
    if (st != DM_OK) {
        printf("(no roofline floor: %s)\n", dm_last_error());
        return;
    }
    double f = sched == DM_SCHED_FUSED ? fused_s : unfused_s;
    if (!(f > 0) || !(t[0] > 0) || !(t[1] > 0)) return;
    const char *name = sched == DM_SCHED_FUSED ? "fused" : "unfused";
    if ((t[0] < f || t[1] < f) && !direct) { /* a floor the BLAS beat is no floor: the profile is low */
        printf("roofline floor of the %s step from the profile %s: %.2f ms, but the %s step took %.2f ms: "
               "the profile's rates are below this machine's (probed while it was busy?); run "
               "`dmove probe` again when it is quiet\n", name, path, f * 1e3, t[0] < f ? "default" : "tuned",
               (t[0] < f ? t[0] : t[1]) * 1e3);
        return;
    }
    if (t[0] < f || t[1] < f) { /* a floor at the faster of BLAS and the kernel on one square GEMM */
        printf("roofline floor of the %s step on this CPU (dmove analyze, profile %s): %.2f ms, with every "
               "contraction at the faster of the BLAS's and dmove's own kernel's measured rates (one square "
               "GEMM; an older profile: the BLAS's alone); %s: default plan %.2fx the floor, tuned plan %.2fx: "
               "below it, where the step's GEMMs outran that one (or the profile was probed while the machine "
               "was busy, or before dmove's kernel was timed: run `dmove probe` again)\n",
               name, path, f * 1e3, what, t[0] / f, t[1] / f);
        return;
    }
    printf("roofline floor of the %s step on this CPU (dmove analyze, profile %s): %.2f ms; %s: "
           "default plan %.2fx the floor, tuned plan %.2fx; by this model (contractions at the faster of the "
           "BLAS's and dmove's own kernel's measured rates) no plan can beat the default by more than %.2fx\n",
           name, path, f * 1e3, what, t[0] / f, t[1] / f, t[0] / f);
}

/* Measures, selects, refines the selection by alternate re-timing (twice at most: a new
 * choice is re-timed once), then times pairs side by side and row groups in epilogues.
 * 0 ok, -1 after the error. */
static int search(dm_tuning *T, const char *cache) {
    if (dm_tuning_measure(T, cache, progress, NULL) != DM_OK) {
        fputc('\n', stderr);
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    if (dm_tuning_select(T) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    /* where the choice is not the default, both again, run by run in alternation; the
     * selection again on those times (twice at most: a new choice is re-timed once) */
    for (int round = 0; round < 2; round++) {
        int n = 0;
        fprintf(stderr, "tune: re-timing the default and the chosen candidate of each group that changed\n");
        if (dm_tuning_refine(T, cache, &n) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
        if (!n) break;
    }
    fprintf(stderr, "tune: timing input- and weight-gradient contractions one after the other and side by side\n");
    if (dm_tuning_pairs(T) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    fprintf(stderr, "tune: timing row groups in their GEMM's epilogue against apart\n");
    if (dm_tuning_rows(T) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

/* The run's header: sizes, machine, the candidates and the measurements to take. */
static int print_header(const tune_opts *o, const dm_tuning *T, const char *cache) {
    const dm_layer_config *cfg = &o->c.cfg;
    dm_tuning_info in;
    char *cands = NULL;
    dm_tuning_get_info(T, &in);
    if (dm_tuning_candidates(T, &cands) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    printf("dmove tune: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           ", %s schedule, %s\n", cfg->batch, cfg->seq, cfg->hidden, cfg->heads, cfg->ffn,
           o->schedule == DM_SCHED_FUSED ? "fused" : "unfused", in.machine);
    printf("%d groups; %d tensors with a layout choice (%" PRId64 " candidate layouts):%s", in.groups, in.tensors,
           in.candidates, cands);
    printf("\n%" PRId64 " measurements (groups x layout combinations x algorithms), %d reps each; cache: %s\n\n",
           in.tasks, o->reps, cache ? cache : "none");
    fflush(stdout);
    free(cands);
    return 0;
}

/* What was chosen and timed, and the plan written. 0 ok, -1 after the error. */
static int report(const tune_opts *o, const dm_tuning *T, const char *cache, double t0) {
    char *text = NULL;
    if (dm_tuning_report(T, &text) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    fputs(text, stdout);
    free(text);
    dm_tuning_info in;
    dm_tuning_get_info(T, &in);
    printf("\n%d re-timings of a group's default and chosen candidate, alternately run by run (%d runs "
           "each), replaced their first times before the final selection\n", in.refined, in.retime_runs);
    if (in.cache_skipped > 0)
        printf("\nnote: %" PRId64 " damaged line%s of the cache (%s) left out: not a key, a tab and a time in seconds\n",
               in.cache_skipped, in.cache_skipped == 1 ? "" : "s", cache);
    if (in.from_cache > 0)
        printf("\n%" PRId64 " of these measurements come from the cache (%s), made by an earlier run; "
               "if the machine was busy then, measure again with --no-cache\n",
               in.from_cache, cache);
    printf("\nsum over groups (each timed after the group before it): default plan %.2f ms, tuned plan %.2f ms (%.3fx); "
           "tuning took %.1f s (%" PRId64 " of %" PRId64 " measurements from the cache)\n",
           in.default_s * 1e3, in.tuned_s * 1e3, in.tuned_s > 0 ? in.default_s / in.tuned_s : 0.0,
           cli_now() - t0, in.from_cache, in.tasks);
    if (dm_tuning_save(T, o->out) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    printf("plan written to %s\n", o->out);
    if (o->svg) {
        if (dm_tuning_write_svg(T, o->svg) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
        printf("violin plot written to %s\n", o->svg);
    }
    fflush(stdout);
    return 0;
}

int cmd_tune(int argc, char **argv) {
    tune_opts o;
    int rc = cli_parse(&k_tune, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    if (o.no_cache && o.cache) {
        cli_usage_error(CMD, "--cache and --no-cache contradict each other: give one");
        return CLI_USAGE;
    }
    const dm_layer_options chk = {.schedule = o.schedule, .recompute = o.recompute};
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    if (cli_config_finish(&o.c, CMD, 1)) return CLI_USAGE;
    /* a bad output path is found now, not after minutes of measuring */
    const cli_path writes[3] = {{.opt = "--out", .path = o.out}, {.opt = "--svg", .path = o.svg},
                                {.opt = "--cache", .path = o.no_cache ? NULL : o.cache}};
    if ((rc = cli_check_paths(CMD, NULL, 0, writes, 3)) != 0) return rc;
    int bad_out = cli_check_output(CMD, "--out", o.out);
    if (!bad_out && o.svg) bad_out = cli_check_output(CMD, "--svg", o.svg);
    if (bad_out) return bad_out;
    o.c.cfg.act = o.act;
    char cache_buf[4096];
    if (!o.no_cache && !o.cache) {
        if (dm_tune_cache_default_path(cache_buf, sizeof cache_buf) != DM_OK) {
            cli_error(CMD, "%s (give --cache FILE or --no-cache)", dm_last_error());
            return CLI_FAIL;
        }
        o.cache = cache_buf;
    }
    dm_layer_options opt = {.schedule = o.schedule, .threads = o.c.threads, .recompute = o.recompute};
    dm_tuning *T = NULL;
    double t0 = cli_now();
    if (dm_tuning_new(&T, &o.c.cfg, &opt, o.reps) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    rc = CLI_FAIL;
    if (print_header(&o, T, o.cache) || search(T, o.no_cache ? NULL : o.cache) || report(&o, T, o.cache, t0))
        goto done;
    dm_tuning_info in;
    dm_tuning_get_info(T, &in);
    double med[2] = {in.default_s, in.tuned_s};
    if (o.vreps > 0 && verify(&o.c, o.schedule, o.recompute, o.out, o.vreps, med)) goto done;
    print_floor(&o.c, o.schedule, o.recompute, med, o.vreps > 0 ? "verified steps" : "sums over groups",
                dm_tuning_uses_direct(T));
    rc = CLI_OK;
done:
    dm_tuning_free(T);
    return rc;
}
