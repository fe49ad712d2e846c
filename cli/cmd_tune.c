/* cmd_tune.c: `dmove tune`: measures every fused group of the training step under every
 * feasible layout of its tensors and every contraction algorithm, picks the fastest
 * configuration of the whole step by shortest path, writes it as a plan file, and checks
 * it against the default plan by timing both steps interleaved. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "analysis/cost.h"
#include "analysis/device.h"
#include "core/status.h"
#include "tune/tune.h"

#define CMD "tune"

static void help(FILE *out) {
    fprintf(out,
            "usage: dmove tune [options]\n"
            "\n"
            "Chooses how to run the training step of a BERT encoder layer on this machine,\n"
            "by measurement (steps 3 and 4 of the paper's recipe):\n"
            "  1. candidates: for every tensor the plan keeps in memory (except the ones you\n"
            "     read and write), every order of its dimensions in memory (its layout) that\n"
            "     runs without a copy; for every contraction, how the threads share it (BLAS\n"
            "     threads inside one call, OpenMP over the batch, or the rows or columns\n"
            "     split between threads) and, on AVX-512 CPUs, dmove's own GEMM kernel\n"
            "     (\"direct\": reads the operands in place instead of packing them), also\n"
            "     for the GEMMs inside the fused attention groups;\n"
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
            "options:\n");
    cli_config_help(out, CLI_CFG_SIZES | CLI_CFG_HEADS | CLI_CFG_ARCH | CLI_CFG_THREADS);
    fprintf(out,
            "  --act A          FFN activation: gelu, gelu_tanh or relu (default gelu)\n"
            "  --schedule S     fused (default) or unfused: which plan to tune\n"
            "  --out FILE       the plan file to write (default dmove-plan.json)\n"
            "  --svg FILE       also draw each group's spread of candidate times (violins)\n"
            "  --reps N         timed repetitions per candidate (default 7; median)\n"
            "  --cache FILE     measurement cache (default $XDG_CACHE_HOME/dmove/tune-cache.tsv,\n"
            "                   else ~/.cache/dmove/tune-cache.tsv); a second run on the same\n"
            "                   machine and sizes is fast; it reuses what was measured then,\n"
            "                   so if the machine was busy, measure again with --no-cache\n"
            "  --no-cache       measure everything, keep nothing\n");
    cli_recompute_help(out, "fused schedule; the plan is for such layers");
    fprintf(out,
            "  --verify N       time default and tuned step interleaved N times (default 5;\n"
            "                   0 skips)\n"
            "  --help           this text\n"
            "\n"
            "Progress (count, time left) goes to stderr.\n"
            "\n"
            "exit status: 0 success, 1 runtime error (the cache keeps what was measured),\n"
            "2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove tune --out base.json\n"
            "  dmove tune --batch 32 --seq 128 --hidden 256 --heads 4 --ffn 1024 --out small.json\n"
            "  dmove bench --plan base.json\n");
}

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

/* Group label: the first op's name, "+N" for the rest. */
static void label(const dm_tuner *T, const dm_tune_group *G, char *buf, size_t n) {
    const dm_group *gr = &T->plan.groups[G->gi];
    const dm_op *first = &T->g.op[T->plan.order[gr->first]];
    if (gr->nops > 1) snprintf(buf, n, "%s +%d", first->name, gr->nops - 1);
    else snprintf(buf, n, "%s", first->name);
}

static void print_report(const dm_tuner *T) {
    printf("%-5s %-28s %6s %9s %9s %9s %9s %9s  %s\n", "group", "ops", "cands", "best ms", "median",
           "worst", "default", "chosen", "choice");
    for (int k = 0; k < T->ngroups; k++) {
        const dm_tune_group *G = &T->groups[k];
        int64_t m = G->ncomb * G->nalgo, nf = 0;
        double *v = malloc(sizeof(double) * (size_t)m);
        if (!v) continue;
        for (int64_t i = 0; i < m; i++)
            if (isfinite(G->secs[i])) v[nf++] = G->secs[i];
        qsort(v, (size_t)nf, sizeof(double), cmp_double);
        char name[64], choice[256] = "";
        label(T, G, name, sizeof name);
        size_t len = 0;
        if (G->op >= 0 || G->kernels)
            len += (size_t)snprintf(choice + len, sizeof choice - len, "%s ",
                                    dm_gemm_algo_name((dm_gemm_algo)G->algo[G->chosen_algo]));
        for (int q = 0; q < G->nscope && len < sizeof choice; q++) {
            const dm_tune_var *var = &T->vars[G->scope[q]];
            len += (size_t)snprintf(choice + len, sizeof choice - len, "%s:%s ", T->g.t[var->t].name,
                                    var->cand[dm_tune_comb_index(T, G, G->chosen_comb, q)]);
        }
        double chosen = G->secs[G->chosen_comb * G->nalgo + G->chosen_algo];
        if (nf > 0)
            printf("%-5d %-28s %6" PRId64 " %9.3f %9.3f %9.3f %9.3f %9.3f  %s\n", G->gi, name, m, v[0] * 1e3,
                   v[nf / 2] * 1e3, v[nf - 1] * 1e3, G->secs[0] * 1e3, chosen * 1e3, choice);
        free(v);
    }
}

/* What dm_tuner_pair or dm_tuner_rows timed: title, then per pair its two groups' first
 * ops, the times one then the other and together, and whether it was kept (as `kept`). */
static void print_timed(const dm_tuner *T, const char *title, int width, const char *kept,
                        const dm_tune_pair *p, int n) {
    if (!n) return;
    printf("\n%s, alternately run by run (%d runs each, medians):\n", title,
           T->reps < DM_TUNE_MAX_RETIMED ? T->reps : DM_TUNE_MAX_RETIMED);
    for (int k = 0; k < n; k++) {
        const dm_plan *pl = &T->plan;
        printf("  %-18s + %-*s %8.3f ms -> %8.3f ms (%.3fx)  %s\n", T->g.op[pl->order[pl->groups[p[k].g1].first]].name,
               width, T->g.op[pl->order[pl->groups[p[k].g2].first]].name, p[k].seq_s * 1e3, p[k].pair_s * 1e3,
               p[k].pair_s > 0 ? p[k].seq_s / p[k].pair_s : 0.0, p[k].kept ? kept : "kept apart");
    }
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
    dm_cpu_profile p;
    dm_device dev;
    double unfused_s = 0, fused_s = 0;
    if (dm_profile_default_path(path, sizeof path) != DM_OK || dm_profile_load(path, &p) != DM_OK) {
        printf("(no CPU profile at '%s': run `dmove probe` once to see this step's roofline floor here)\n", path);
        return;
    }
    if (dm_device_from_profile(&p, cli_threads(c->threads), &dev) != DM_OK ||
        dm_cost_floors(&c->cfg, &dev, 4, recompute, &unfused_s, &fused_s) != DM_OK) {
        printf("(no roofline floor: %s)\n", dm_last_error());
        return;
    }
    double f = sched == DM_SCHED_FUSED ? fused_s : unfused_s;
    if (!(f > 0) || !(t[0] > 0) || !(t[1] > 0)) return;
    const char *name = sched == DM_SCHED_FUSED ? "fused" : "unfused";
    if (t[0] < f || (t[1] < f && !direct)) { /* a floor the BLAS beat is no floor: the profile is low */
        printf("roofline floor of the %s step from the profile %s: %.2f ms, but the %s step took %.2f ms: "
               "the profile's rates are below this machine's (probed while it was busy?); run "
               "`dmove probe` again when it is quiet\n", name, path, f * 1e3, t[0] < f ? "default" : "tuned",
               (t[0] < f ? t[0] : t[1]) * 1e3);
        return;
    }
    if (t[1] < f) { /* the floor's GEMM rate is the BLAS's; the plan's direct kernel can beat it */
        printf("roofline floor of the %s step on this CPU (dmove analyze, profile %s): %.2f ms, with every "
               "contraction at the BLAS's measured SGEMM rate; %s: default plan %.2fx the floor, tuned plan "
               "%.2fx: below it, where dmove's own GEMM kernel (\"direct\") outran that rate (or the "
               "profile was probed while the machine was busy)\n", name, path, f * 1e3, what, t[0] / f, t[1] / f);
        return;
    }
    printf("roofline floor of the %s step on this CPU (dmove analyze, profile %s): %.2f ms; %s: "
           "default plan %.2fx the floor, tuned plan %.2fx; by this model (contractions at the BLAS's "
           "measured SGEMM rate) no plan can beat the default by more than %.2fx\n",
           name, path, f * 1e3, what, t[0] / f, t[1] / f, t[0] / f);
}

int cmd_tune(int argc, char **argv) {
    cli_config c;
    cli_config_init(&c, CLI_CFG_SIZES | CLI_CFG_HEADS | CLI_CFG_ARCH | CLI_CFG_THREADS);
    const char *out = "dmove-plan.json", *svg = NULL, *cache = NULL;
    int no_cache = 0, reps = 7, vreps = 5, recompute = 0;
    dm_schedule sched = DM_SCHED_FUSED;
    dm_act act = DM_ACT_GELU;
    for (int a = 1; a < argc; a++) {
        const char *v;
        int r;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            help(stdout);
            return CLI_OK;
        }
        if ((r = cli_config_option(&c, CMD, argc, argv, &a)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--out", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            out = v;
        } else if ((r = cli_opt(CMD, argc, argv, &a, "--svg", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            svg = v;
        } else if ((r = cli_opt(CMD, argc, argv, &a, "--cache", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            cache = v;
        } else if ((r = cli_opt(CMD, argc, argv, &a, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_int(CMD, "--reps", v, 1, 63, &reps)) return CLI_USAGE;
        } else if ((r = cli_opt(CMD, argc, argv, &a, "--verify", &v)) != 0) {
            if (r < 0 || cli_parse_int(CMD, "--verify", v, 0, 1000, &vreps)) return CLI_USAGE;
        } else if ((r = cli_opt(CMD, argc, argv, &a, "--act", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (dm_act_parse(v, &act) != DM_OK) {
                cli_usage_error(CMD, "--act: %s", dm_last_error());
                return CLI_USAGE;
            }
        } else if ((r = cli_opt(CMD, argc, argv, &a, "--schedule", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!strcmp(v, "fused")) sched = DM_SCHED_FUSED;
            else if (!strcmp(v, "unfused")) sched = DM_SCHED_UNFUSED;
            else {
                cli_usage_error(CMD, "--schedule: unknown schedule '%s' (known: fused, unfused)", v);
                return CLI_USAGE;
            }
        } else if ((r = cli_flag(CMD, argv, a, "--recompute")) != 0) {
            if (r < 0) return CLI_USAGE;
            recompute = 1;
        } else if ((r = cli_flag(CMD, argv, a, "--no-cache")) != 0) {
            if (r < 0) return CLI_USAGE;
            no_cache = 1;
        } else {
            return cli_unknown(CMD, argv[a], "");
        }
    }
    if (no_cache && cache) {
        cli_usage_error(CMD, "--cache and --no-cache contradict each other: give one");
        return CLI_USAGE;
    }
    const dm_layer_options chk = {.schedule = sched, .recompute = recompute};
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    if (cli_config_finish(&c, CMD, 1)) return CLI_USAGE;
    /* a bad output path is found now, not after minutes of measuring */
    int bad_out = cli_check_output(CMD, "--out", out);
    if (!bad_out && svg) bad_out = cli_check_output(CMD, "--svg", svg);
    if (bad_out) return bad_out;
    c.cfg.act = act;
    char cache_buf[4096];
    if (!no_cache && !cache) {
        if (dm_tune_cache_default_path(cache_buf, sizeof cache_buf) != DM_OK) {
            cli_error(CMD, "%s (give --cache FILE or --no-cache)", dm_last_error());
            return CLI_FAIL;
        }
        cache = cache_buf;
    }
    dm_layer_options opt = {.schedule = sched, .threads = c.threads, .recompute = recompute};
    dm_tuner *T = NULL;
    double t0 = cli_now();
    if (dm_tuner_new(&T, &c.cfg, &opt) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    T->reps = reps;
    int64_t ncand = 0;
    for (int v = 0; v < T->nvars; v++) ncand += T->vars[v].ncand;
    printf("dmove tune: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           ", %s schedule, %s\n", c.cfg.batch, c.cfg.seq, c.cfg.hidden, c.cfg.heads, c.cfg.ffn,
           sched == DM_SCHED_FUSED ? "fused" : "unfused", T->machine);
    printf("%d groups; %d tensors with a layout choice (%" PRId64 " candidate layouts):", T->ngroups, T->nvars, ncand);
    for (int v = 0; v < T->nvars; v++) {
        printf("%s %s {", v ? ";" : "", T->g.t[T->vars[v].t].name);
        for (int k = 0; k < T->vars[v].ncand; k++) printf("%s%s", k ? " " : "", T->vars[v].cand[k]);
        printf("}");
    }
    printf("\n%" PRId64 " measurements (groups x layout combinations x algorithms), %d reps each; cache: %s\n\n",
           dm_tuner_tasks(T), reps, cache ? cache : "none");
    fflush(stdout);
    int rc = CLI_FAIL;
    dm_choices ch;
    if (dm_tuner_measure(T, no_cache ? NULL : cache, progress, NULL) != DM_OK) {
        fputc('\n', stderr);
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    if (dm_tuner_select(T, &ch) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    /* where the choice is not the default, both again, run by run in alternation; the
     * selection again on those times (twice at most: a new choice is re-timed once) */
    int refined = 0;
    for (int round = 0; round < 2; round++) {
        int n = 0;
        fprintf(stderr, "tune: re-timing the default and the chosen candidate of each group that changed\n");
        if (dm_tuner_refine(T, no_cache ? NULL : cache, &n) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            dm_choices_free(&ch);
            goto done;
        }
        refined += n;
        dm_choices_free(&ch);
        if (dm_tuner_select(T, &ch) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
        if (!n) break;
    }
    fprintf(stderr, "tune: timing input- and weight-gradient contractions one after the other and side by side\n");
    dm_tune_pair pairs[64];
    int npairs = 0;
    if (dm_tuner_pair(T, &ch, pairs, 64, &npairs) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        dm_choices_free(&ch);
        goto done;
    }
    fprintf(stderr, "tune: timing row groups in their GEMM's epilogue against apart\n");
    dm_tune_pair rows[64];
    int nrows = 0;
    if (dm_tuner_rows(T, &ch, rows, 64, &nrows) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        dm_choices_free(&ch);
        goto done;
    }
    print_report(T);
    if (T->threads < 2) printf("\nside-by-side contractions: not tried (they need 2 threads or more)\n");
    print_timed(T, "side by side (each on half the threads) vs one then the other", 18, "side by side (concurrent)",
                pairs, npairs < 64 ? npairs : 64);
    print_timed(T, "row group in its GEMM's epilogue (direct kernel; each block of rows as it is finished) vs apart",
                22, "in the epilogue (direct_rows)", rows, nrows < 64 ? nrows : 64);
    printf("\n%d re-timings of a group's default and chosen candidate, alternately run by run (%d runs "
           "each), replaced their first times before the final selection\n", refined,
           T->reps < DM_TUNE_MAX_RETIMED ? T->reps : DM_TUNE_MAX_RETIMED);
    if (T->nfrom_cache > 0)
        printf("\n%" PRId64 " of these measurements come from the cache (%s), made by an earlier run; "
               "if the machine was busy then, measure again with --no-cache\n",
               T->nfrom_cache, cache);
    printf("\nsum over groups (each timed after the group before it): default plan %.2f ms, tuned plan %.2f ms (%.3fx); "
           "tuning took %.1f s (%" PRId64 " of %" PRId64 " measurements from the cache)\n",
           T->default_s * 1e3, T->tuned_s * 1e3, T->tuned_s > 0 ? T->default_s / T->tuned_s : 0.0,
           cli_now() - t0, T->nfrom_cache, T->ntasks);
    if (dm_plan_save(out, &c.cfg, &opt, &T->g, &ch) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        dm_choices_free(&ch);
        goto done;
    }
    int direct = 0; /* does the plan use dmove's own GEMM kernel anywhere? */
    for (int o = 0; o < ch.nop; o++) direct |= dm_gemm_algo_direct(ch.algo[o]);
    dm_choices_free(&ch);
    printf("plan written to %s\n", out);
    if (svg) {
        if (dm_tuner_svg(T, svg) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
        printf("violin plot written to %s\n", svg);
    }
    fflush(stdout);
    double med[2] = {T->default_s, T->tuned_s};
    if (vreps > 0 && verify(&c, sched, recompute, out, vreps, med)) goto done;
    print_floor(&c, sched, recompute, med, vreps > 0 ? "verified steps" : "sums over groups", direct);
    rc = CLI_OK;
done:
    dm_tuner_free(T);
    return rc;
}
