/* test_tune.c: layouts and algorithms change no numbers, plan files are validated, and
 * the tuner's cache survives an interrupted run.
 *  1. every candidate layout of every tensor the tuner may lay out (the others default),
 *     random joint layouts with random contraction algorithms, and every contraction on
 *     the direct kernel, for the fused and the unfused schedule: the whole layer, forward and backward, against the default plan
 *     (relative error per tensor < 1e-5: a layout changes only the GEMMs' summation
 *     order; the key bias gradient, zero in exact arithmetic, absolutely); a joint combination the executor refuses must be one the tuner measures as
 *     infeasible, and it is refused with DM_ERR_UNSUPPORTED, not run;
 *  2. a tiny real tune (measure, select) whose plan is saved, loaded and run, equal to the
 *     default plan; its cache is reused by a second tuner (nothing re-measured) and still
 *     usable after a torn last line;
 *  3. plan files that are malformed, truncated, for another configuration, of another
 *     format version, naming unknown tensors / bad layouts / unknown algorithms, or
 *     edited (checksum) are refused with DM_ERR_FORMAT and a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "cpu/backend.h"
#include "layer/layer_internal.h"
#include "layerutil.h"
#include "testutil.h"
#include "tune/tune.h"

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static dm_layer *build(const dm_layer_config *cfg, const dm_layer_options *opt, const dm_choices *ch,
                       dm_status *st) {
    dm_layer *L = NULL;
    *st = dm_layer_new_with(&L, cfg, opt, ch, 0);
    if (*st != DM_OK) return NULL;
    fill_inputs(L, 7);
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_backward(L));
    return L;
}

static void layouts(const dm_layer_config *cfg, dm_schedule sched, int recompute) {
    dm_layer_options opt = {.schedule = sched, .threads = 2, .recompute = recompute};
    dm_tuner *T = NULL;
    CHECK_OK(dm_tuner_new(&T, cfg, &opt));
    if (!T) return;
    printf("%s schedule: %d tensors with layout choices\n", sched == DM_SCHED_FUSED ? "fused" : "unfused", T->nvars);
    CHECK(T->nvars >= 2);
    dm_status st;
    dm_layer *ref = build(cfg, &opt, NULL, &st);
    CHECK_OK(st);
    dm_choices ch;
    CHECK_OK(dm_choices_init(&ch, &T->g, &dm_cpu_gemm_algos));
    double worst = 0;
    int runs = 0, refused = 0;
    /* each candidate of each variable alone */
    for (int v = 0; v < T->nvars; v++)
        for (int c = 1; c < T->vars[v].ncand; c++) {
            memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
            memcpy(ch.layout[T->vars[v].t], T->vars[v].cand[c], DM_MAX_DIMS + 1);
            dm_layer *L = build(cfg, &opt, &ch, &st);
            CHECK_OK(st);
            if (!L) continue;
            double e = compare_all_ex(L, ref, 0, 1);
            if (e > 1e-5) compare_all_ex(L, ref, 1, 1);
            printf("  %-18s %-7s max rel.err %.2e\n", T->g.t[T->vars[v].t].name, T->vars[v].cand[c], e);
            worst = worst_of(worst, e);
            runs++;
            dm_layer_free(L);
        }
    /* random joint layouts and algorithms */
    for (int trial = 0; trial < 24; trial++) {
        memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
        memset(ch.algo, 0, (size_t)ch.nop);
        for (int v = 0; v < T->nvars; v++)
            memcpy(ch.layout[T->vars[v].t], T->vars[v].cand[rnd((uint32_t)T->vars[v].ncand)], DM_MAX_DIMS + 1);
        for (int k = 0; k < T->ngroups; k++) {
            const dm_tune_group *G = &T->groups[k];
            if (G->op >= 0) ch.algo[G->op] = G->algo[rnd((uint32_t)G->nalgo)];
            if (G->kernels) { /* one kernel for all the contractions of a fused batched group */
                uint8_t a = G->algo[rnd((uint32_t)G->nalgo)];
                for (int q = 0; q < T->plan.groups[G->gi].nops; q++) {
                    int o = T->plan.order[T->plan.groups[G->gi].first + q];
                    if (T->g.op[o].kind == DM_OP_CONTRACT) ch.algo[o] = a;
                }
            }
        }
        dm_layer *L = build(cfg, &opt, &ch, &st);
        if (!L) {
            CHECK(st == DM_ERR_UNSUPPORTED);
            refused++;
            continue;
        }
        double e = compare_all_ex(L, ref, 0, 1);
        worst = worst_of(worst, e);
        runs++;
        dm_layer_free(L);
    }
    /* every contraction on the direct kernel (lone and inside fused groups), default layouts */
    if (dm_gemm_direct_available()) {
        memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
        memset(ch.algo, 0, (size_t)ch.nop);
        int nd = 0;
        for (int o = 0; o < T->g.nop; o++)
            if (T->g.op[o].kind == DM_OP_CONTRACT) ch.algo[o] = DM_GEMM_DIRECT, nd++;
        dm_layer *L = build(cfg, &opt, &ch, &st);
        CHECK_OK(st);
        if (L) {
            double e = compare_all_ex(L, ref, 0, 1);
            printf("  all %d contractions direct: max rel.err %.2e\n", nd, e);
            worst = worst_of(worst, e);
            runs++;
            dm_layer_free(L);
        }
    } else {
        printf("  all contractions direct: SKIP, the direct kernel does not run here (no AVX2, or DMOVE_ISA=none; the algorithm is not offered)\n");
    }
    /* "direct_rows": each lone contraction alone, then all that take it at once, on random
     * layouts too; the ones whose next group cannot run in their epilogue are refused */
    if (dm_gemm_direct_available()) {
        int nfused = 0, nrefused = 0, fusable[256], nf = 0, all_default_run = 0;
        for (int k = 0; k < T->ngroups; k++) {
            const dm_tune_group *G = &T->groups[k];
            if (G->op < 0) continue;
            memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
            memset(ch.algo, 0, (size_t)ch.nop);
            ch.algo[G->op] = DM_GEMM_DIRECT_ROWS;
            dm_layer *L = build(cfg, &opt, &ch, &st);
            if (!L) {
                CHECK(st == DM_ERR_UNSUPPORTED && strstr(dm_last_error(), "epilogue"));
                nrefused++;
                continue;
            }
            CHECK(dm_cpu_backend_exec(L->bk, L->st)->groups[G->gi].rows_next == G->gi + 1 && dm_cpu_backend_exec(L->bk, L->st)->groups[G->gi + 1].rows_of == G->gi);
            /* bench --groups: the row group's time is its contraction's */
            dm_layer_group gx, rx;
            CHECK_OK(dm_layer_group_info(L, G->gi, &gx));
            CHECK_OK(dm_layer_group_info(L, G->gi + 1, &rx));
            CHECK(gx.timed_with == -1 && rx.timed_with == G->gi);
            double e = compare_all_ex(L, ref, 0, 1);
            printf("  %-18s direct_rows, with %s in its epilogue: max rel.err %.2e\n", T->g.op[G->op].name,
                   T->g.op[T->plan.order[T->plan.groups[G->gi + 1].first]].name, e);
            worst = worst_of(worst, e);
            runs++;
            nfused++;
            if (nf < 256) fusable[nf++] = G->op;
            dm_layer_free(L);
        }
        /* the forward projections at least (each is followed by its bias group) */
        CHECK(nfused >= 4);
        for (int trial = 0; trial < 4; trial++) {
            memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
            memset(ch.algo, 0, (size_t)ch.nop);
            if (trial)
                for (int v = 0; v < T->nvars; v++)
                    memcpy(ch.layout[T->vars[v].t], T->vars[v].cand[rnd((uint32_t)T->vars[v].ncand)], DM_MAX_DIMS + 1);
            for (int q = 0; q < nf; q++) ch.algo[fusable[q]] = DM_GEMM_DIRECT_ROWS;
            dm_layer *L = NULL;
            st = dm_layer_new_with(&L, cfg, &opt, &ch, 1); /* lenient: a layout may unfit one */
            CHECK_OK(st);
            if (!L) continue;
            int unusable = 0;
            for (int gi = 0; gi < L->plan.ngroups; gi++) unusable += dm_cpu_backend_exec(L->bk, L->st)->groups[gi].unusable != DM_OK;
            dm_layer_free(L);
            if (unusable) continue; /* measured as infeasible by the tuner; layouts are tested above */
            L = build(cfg, &opt, &ch, &st);
            CHECK_OK(st);
            if (!L) continue;
            double e = compare_all_ex(L, ref, 0, 1);
            all_default_run += trial == 0;
            printf("  all %d direct_rows at once (%s layouts): max rel.err %.2e\n", nf, trial ? "random" : "default", e);
            worst = worst_of(worst, e);
            runs++;
            dm_layer_free(L);
        }
        CHECK(all_default_run == 1); /* on the default layouts they all fit at once */
        printf("  direct_rows: %d contractions take the next group into their epilogue, %d refused\n", nfused,
               nrefused);
    }
    /* side by side: every contraction with a partner set to "concurrent", on random
     * layouts; a forward contraction (no partner) and a partner itself are refused */
    if (sched == DM_SCHED_FUSED) {
        uint8_t *claimed = calloc((size_t)T->plan.ngroups + 1, 1);
        int npairs = 0, pair_runs = 0;
        for (int gi = 0; claimed && gi < T->plan.ngroups; gi++) {
            int p = dm_plan_partner(&T->plan, gi, claimed);
            if (p < 0) continue;
            const char *a = T->g.op[T->plan.order[T->plan.groups[gi].first]].name;
            const char *b = T->g.op[T->plan.order[T->plan.groups[p].first]].name;
            /* the input gradient's GEMM and its weight gradient's: same name but _dA/_dB */
            size_t la = strlen(a);
            CHECK(la > 3 && !strcmp(a + la - 3, "_dA") && strlen(b) == la && !strncmp(a, b, la - 3) &&
                  !strcmp(b + la - 3, "_dB"));
            CHECK(T->plan.groups[gi].pass == 1);
            printf("  side by side: %s + %s\n", a, b);
            claimed[gi] = claimed[p] = 1;
            npairs++;
        }
        CHECK(npairs == 4); /* qkv, attention output, FFN in and out */
        for (int trial = 0; trial < 4; trial++) {
            memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
            memset(ch.algo, 0, (size_t)ch.nop);
            for (int v = 0; trial && v < T->nvars; v++)
                memcpy(ch.layout[T->vars[v].t], T->vars[v].cand[rnd((uint32_t)T->vars[v].ncand)], DM_MAX_DIMS + 1);
            for (int gi = 0; claimed && gi < T->plan.ngroups; gi++) {
                const dm_group *gr = &T->plan.groups[gi];
                const dm_op *op = &T->g.op[T->plan.order[gr->first]];
                size_t l = strlen(op->name);
                if (op->kind == DM_OP_CONTRACT && gr->nops == 1 && gr->nbatch <= 1 && l > 3 &&
                    !strcmp(op->name + l - 3, "_dA"))
                    /* odd trials: with the direct kernel, for the first and its partner */
                    ch.algo[T->plan.order[T->plan.groups[gi].first]] =
                        trial % 2 && dm_gemm_direct_available() ? DM_GEMM_CONCURRENT_DIRECT : DM_GEMM_CONCURRENT;
                if (trial % 2 && dm_gemm_direct_available() && op->kind == DM_OP_CONTRACT && gr->nops == 1 &&
                    gr->nbatch <= 1 && l > 3 && !strcmp(op->name + l - 3, "_dB"))
                    ch.algo[T->plan.order[T->plan.groups[gi].first]] = DM_GEMM_DIRECT;
            }
            dm_layer *L = build(cfg, &opt, &ch, &st);
            if (!L) {
                CHECK(st == DM_ERR_UNSUPPORTED);
                continue;
            }
            double e = compare_all_ex(L, ref, 0, 1);
            worst = worst_of(worst, e);
            if (!pair_runs) { /* the group listing names each pair */
                char *text = NULL;
                CHECK_OK(dm_layer_describe(L, &text));
                CHECK(text && strstr(text, "ffn_out_proj_dA  (and ffn_out_proj_dB beside it)") &&
                      strstr(text, "qkv_proj_dB  (ran beside qkv_proj_dA)"));
                free(text);
                /* bench --groups: a partner's time is the group it runs beside */
                int pairs_seen = 0;
                for (int G = 0; G < dm_layer_num_groups(L); G++) {
                    dm_layer_group x;
                    CHECK_OK(dm_layer_group_info(L, G, &x));
                    if (x.timed_with < 0) continue;
                    dm_layer_group y;
                    CHECK_OK(dm_layer_group_info(L, x.timed_with, &y));
                    CHECK(x.timed_with < G && y.timed_with == -1 && y.cls == DM_CLASS_CONTRACTION &&
                          x.cls == DM_CLASS_CONTRACTION);
                    pairs_seen++;
                }
                CHECK(pairs_seen >= 2);
            }
            pair_runs++;
            runs++;
            dm_layer_free(L);
        }
        CHECK(pair_runs >= 1);
        printf("  %d plans with the 4 pairs side by side run\n", pair_runs);
        const char *bad[5][2] = {{"qkv_proj", "no later weight-gradient"},
                                 {"ffn_in_proj_dB", "runs beside an earlier one"},
                                 {"attn_context_dA", "runs inside a fused group"},
                                 {"attn_scores", "runs inside a fused group"},
                                 {"attn_out_proj_dA", "the next group is no row group"}};
        const dm_gemm_algo bad_algo[5] = {DM_GEMM_CONCURRENT, DM_GEMM_CONCURRENT, DM_GEMM_CONCURRENT,
                                          DM_GEMM_DIRECT_ROWS, DM_GEMM_DIRECT_ROWS};
        for (int k = 0; k < 5; k++) {
            if (bad_algo[k] == DM_GEMM_DIRECT_ROWS && !dm_gemm_direct_available()) continue;
            memset(ch.layout, 0, sizeof(ch.layout[0]) * (size_t)ch.nt);
            memset(ch.algo, 0, (size_t)ch.nop);
            for (int o = 0; o < T->g.nop; o++)
                if (!strcmp(T->g.op[o].name, bad[k][0]) || (k == 1 && !strcmp(T->g.op[o].name, "ffn_in_proj_dA")))
                    ch.algo[o] = (uint8_t)bad_algo[k];
            dm_layer *L = NULL;
            st = dm_layer_new_with(&L, cfg, &opt, &ch, 0);
            CHECK(st == DM_ERR_UNSUPPORTED && L == NULL && strstr(dm_last_error(), bad[k][1]));
            printf("  %s \"%s\": refused: %s\n", bad[k][0], dm_gemm_algo_name(bad_algo[k]), dm_last_error());
            dm_layer_free(L);
        }
        free(claimed);
    }
    printf("  %d layouts run, %d joint combinations refused (they cannot map without a copy): worst "
           "rel.err %.2e (bar 1e-5)\n", runs, refused, worst);
    CHECK(runs > T->nvars);
    CHECK(worst < 1e-5);
    dm_choices_free(&ch);
    dm_layer_free(ref);
    dm_tuner_free(T);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *s = calloc(1, 1 << 20);
    if (s) s[fread(s, 1, (1 << 20) - 1, f)] = 0;
    fclose(f);
    return s;
}

/* Replaces the first `from` in text by `to` into out. */
static void subst(const char *text, const char *from, const char *to, char *out, size_t n) {
    const char *p = strstr(text, from);
    CHECK(p != NULL);
    if (!p) {
        snprintf(out, n, "%s", text);
        return;
    }
    snprintf(out, n, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
}

/* Adds `entry` ("\"name\": \"value\"") as the first member of the object after `key`. */
static void add_member(const char *text, const char *key, const char *entry, char *out, size_t n) {
    const char *p = strstr(text, key);
    CHECK(p != NULL);
    if (!p) {
        snprintf(out, n, "%s", text);
        return;
    }
    p += strlen(key);
    const char *q = p;
    while (*q == ' ' || *q == '\t' || *q == '\n') q++;
    snprintf(out, n, "%.*s%s%s%s", (int)(p - text), text, entry, *q == '}' ? "" : ", ", p);
}

static void expect_bad(const char *path, const dm_layer_config *cfg, const dm_layer_options *opt,
                       const dm_graph *g, const char *why) {
    dm_choices c;
    dm_status s = dm_plan_load(path, cfg, opt, g, &dm_cpu_gemm_algos, &c);
    printf("  %-34s -> %s: %s\n", why, dm_status_name(s), dm_last_error());
    CHECK(s == DM_ERR_FORMAT || s == DM_ERR_NOT_FOUND);
    if (s == DM_OK) dm_choices_free(&c);
    dm_layer *L = NULL;
    dm_layer_options o = *opt;
    o.plan = path;
    CHECK(dm_layer_new(&L, cfg, &o) != DM_OK);
    dm_layer_free(L);
}

/* Writes `text` to path, then expect_bad. */
static void expect_bad_text(const char *path, const char *text, const dm_layer_config *cfg,
                            const dm_layer_options *opt, const dm_graph *g, const char *why) {
    write_text(path, text);
    expect_bad(path, cfg, opt, g, why);
}

/* Is root t read or written through the API (one of the layer's exports)? */
static int is_export(const dm_tuner *T, int t) {
    for (int k = 0; k < T->enc.n; k++)
        if (dm_tensor_root(&T->g, T->enc.e[k].tensor) == t) return 1;
    return 0;
}

/* A plan file (its checksum right) that lays out a tensor the API reads or writes (an
 * input, output, parameter or gradient: row-major by promise) is refused by the layer,
 * not run to wrong results; an intermediate's layout is what a tuner makes. */
static void api_layouts_refused(const char *path, const dm_layer_config *cfg, const dm_layer_options *opt,
                                const dm_tuner *T) {
    int tried = 0, refused = 0;
    for (int t = 0; t < T->g.nt && tried < 8; t++) {
        const dm_tensor *x = &T->g.t[t];
        if (x->base >= 0 || x->ndim < 2 || (x->role == DM_ROLE_ACT && !is_export(T, t))) continue;
        dm_choices c;
        CHECK_OK(dm_choices_init(&c, &T->g, &dm_cpu_gemm_algos));
        for (int k = 0; k < x->ndim; k++) c.layout[t][k] = x->letters[x->ndim - 1 - k]; /* reversed */
        c.layout[t][x->ndim] = 0;
        CHECK_OK(dm_plan_save(path, cfg, opt, &T->g, &c));
        dm_choices_free(&c);
        dm_layer *L = NULL;
        dm_layer_options o = *opt;
        o.plan = path;
        const dm_status s = dm_layer_new(&L, cfg, &o);
        tried++;
        refused += s == DM_ERR_FORMAT && strstr(dm_last_error(), "row-major") && strstr(dm_last_error(), x->name);
        if (tried == 1) printf("  a layout for %s: %s\n", x->name, dm_last_error());
        dm_layer_free(L);
    }
    printf("  plans laying out an API tensor: %d of %d refused\n", refused, tried);
    CHECK(tried >= 4 && refused == tried);
}

/* The time the tuned sum holds for plan group gi. */
static double group_secs(const dm_tuner *T, int gi) {
    for (int k = 0; k < T->ngroups; k++)
        if (T->groups[k].gi == gi)
            return T->groups[k].secs[T->groups[k].chosen_comb * T->groups[k].nalgo + T->groups[k].chosen_algo];
    return 0;
}

/* A cache as a hostile machine has it (the good one rewritten): CRLF lines are read; an
 * empty file is no cache; values that are not times (nan, -1, abc, 1e308, -inf, a
 * denormal, past an hour, hex, an overflow, infinity spelt otherwise than the tuner's
 * "inf"), a line without a tab and one too long for the reader are
 * skipped and counted, never trusted, never undefined behaviour (UBSan runs this test).
 * The bad files are measured for a tiny layer (their keys do not matter: nothing in them
 * is used). */
static void hostile_caches(const char *good_path, const dm_layer_config *cfg, const dm_layer_options *opt) {
    char *good = read_text(good_path);
    CHECK(good != NULL);
    if (!good) return;
    char path[512];
    snprintf(path, sizeof path, "%s.hostile", good_path);
    static const char *const bad_values[11] = {"nan",      "-1",    "abc",  "1e308", "-inf", "4.9e-324",
                                               "7200",     "0x10",  "1e999", "infinity", "INF"};
    dm_layer_config tiny = *cfg;
    tiny.batch = 1, tiny.seq = 4, tiny.hidden = 8, tiny.heads = 2, tiny.ffn = 8;
    for (int v = 0; v < 3; v++) { /* CRLF, empty, every kind of damage */
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (!f) break;
        int lines = 0;
        for (const char *p = good; v != 1 && *p; lines++) {
            const char *nl = strchr(p, '\n');
            const size_t len = nl ? (size_t)(nl - p) : strlen(p);
            const char *tab = memchr(p, '\t', len);
            if (v == 0) fprintf(f, "%.*s\r\n", (int)len, p);
            else if (*p == '#') fprintf(f, "%.*s\n", (int)len, p);
            else if (lines % 13 == 11) fprintf(f, "%.*s%0*d\t1e-3\n", (int)len, p, 2100, 0); /* too long */
            else if (lines % 13 == 12 || !tab) fprintf(f, "%.*s\n", (int)(tab ? tab - p : (long)len), p); /* no tab */
            else fprintf(f, "%.*s\t%s\n", (int)(tab - p), p, bad_values[lines % 13]);
            p = nl ? nl + 1 : p + len;
        }
        fclose(f);
        dm_tuner *T = NULL;
        CHECK_OK(dm_tuner_new(&T, v ? &tiny : cfg, opt));
        if (!T) break;
        CHECK_OK(dm_tuner_measure(T, path, NULL, NULL));
        if (v == 0) CHECK(T->nfrom_cache == T->ntasks && T->cache_skipped <= 1); /* the torn line above */
        else CHECK(T->nfrom_cache == 0 && T->ndone == T->ntasks);
        if (v == 2) CHECK(T->cache_skipped >= lines - 1); /* every line but the header */
        printf("  hostile cache %s: %lld of %lld from it, %lld lines skipped\n",
               v == 0 ? "(CRLF)" : v == 1 ? "(empty)" : "(nan, -1, abc, 1e308, -inf, denormal, 7200, hex, 1e999, infinity, INF, long, no tab)",
               (long long)T->nfrom_cache, (long long)T->ntasks, (long long)T->cache_skipped);
        dm_tuner_free(T);
        unlink(path);
    }
    free(good);
}

static void tune_and_files(const dm_layer_config *cfg) {
    char dir[] = "/tmp/dmove-test-tune-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cache[256], plan[256], bad[256], svg[256];
    snprintf(cache, sizeof cache, "%s/cache.tsv", dir);
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    snprintf(svg, sizeof svg, "%s/violins.svg", dir);
    dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .threads = 2};
    dm_tuner *T = NULL;
    /* the tuner times groups with the CPU executor on the CPU's plan: a CUDA layer is refused */
    dm_layer_options cuda_opt = opt;
    cuda_opt.device = DM_DEVICE_CUDA;
    CHECK(dm_tuner_new(&T, cfg, &cuda_opt) == DM_ERR_UNSUPPORTED && T == NULL);
    CHECK_OK(dm_tuner_new(&T, cfg, &opt));
    if (!T) return;
    T->reps = 3;
    T->warmup = 1;
    CHECK_OK(dm_tuner_measure(T, cache, NULL, NULL));
    CHECK(T->ndone == T->ntasks && T->nfrom_cache == 0);
    dm_choices ch;
    CHECK_OK(dm_tuner_select(T, &ch));
    CHECK(T->tuned_s <= T->default_s * (1 + 1e-12)); /* the default is one of the candidates */
    /* re-timing: each group whose choice is not its default is re-timed once (both
     * candidates replaced by finite times), a second call re-times nothing new unless
     * the selection changed, and the selection after stays valid */
    {
        int changed = 0, n1 = -1, n2 = -1;
        for (int k = 0; k < T->ngroups; k++)
            changed += T->groups[k].chosen_comb != 0 || T->groups[k].chosen_algo != 0;
        CHECK_OK(dm_tuner_refine(T, cache, &n1));
        CHECK(n1 == changed);
        for (int k = 0; k < T->ngroups; k++) {
            const dm_tune_group *G = &T->groups[k];
            if (G->refined_comb < 0) continue;
            CHECK(G->refined_comb == G->chosen_comb && G->refined_algo == G->chosen_algo);
            CHECK(isfinite(G->secs[0]) && isfinite(G->secs[G->chosen_comb * G->nalgo + G->chosen_algo]));
        }
        CHECK_OK(dm_tuner_refine(T, cache, &n2));
        CHECK(n2 == 0); /* same selection: nothing new */
        dm_choices_free(&ch);
        CHECK_OK(dm_tuner_select(T, &ch));
        CHECK(T->tuned_s <= T->default_s * (1 + 1e-12));
        printf("tune: %d of %d groups chose other than their default; re-timed %d\n", changed, T->ngroups, n1);
    }
    /* side by side: pairs timed (4 when every input gradient's GEMM keeps its own weight
     * gradient; more when one is kept apart and that weight gradient pairs with the
     * next); a kept one is "concurrent" in the choices */
    {
        dm_tune_pair pairs[8];
        int np = -1;
        CHECK_OK(dm_tuner_pair(T, &ch, pairs, 8, &np));
        CHECK(np >= 1 && np <= 8);
        for (int k = 0; k < np && k < 8; k++) {
            int op = T->plan.order[T->plan.groups[pairs[k].g1].first];
            CHECK(pairs[k].g1 < pairs[k].g2 && pairs[k].seq_s > 0 && pairs[k].pair_s > 0);
            CHECK(dm_gemm_algo_concurrent(ch.algo[op]) == pairs[k].kept);
            CHECK(pairs[k].kept == (pairs[k].pair_s < pairs[k].seq_s));
        }
        CHECK(fabs(ch.tuned_ms - T->tuned_s * 1e3) < 1e-9);
    }
    /* row groups in their GEMM's epilogue: each lone contraction on its own turn whose next
     * group can run there is timed; the test hook keeps every one, so the saved plan runs
     * them all (it must equal the default plan, below) */
    if (dm_gemm_direct_available()) {
        dm_tune_pair rows[16];
        int nr = -1;
        const double before = T->tuned_s;
        CHECK(setenv("DMOVE_TEST_ROWS", "keep", 1) == 0);
        CHECK_OK(dm_tuner_rows(T, &ch, rows, 16, &nr));
        unsetenv("DMOVE_TEST_ROWS");
        CHECK(nr >= 4 && nr <= 16); /* the four forward projections at least */
        for (int k = 0; k < nr && k < 16; k++) {
            int op = T->plan.order[T->plan.groups[rows[k].g1].first];
            CHECK(rows[k].g2 == rows[k].g1 + 1 && rows[k].seq_s > 0 && rows[k].pair_s > 0 && rows[k].kept);
            CHECK(ch.algo[op] == DM_GEMM_DIRECT_ROWS);
        }
        /* each kept epilogue that was faster takes the same fraction off its two groups'
         * times in the tuned sum (never more than they hold there) */
        double gain = 0;
        for (int k = 0; k < nr && k < 16; k++)
            if (rows[k].pair_s < rows[k].seq_s)
                gain += (group_secs(T, rows[k].g1) + group_secs(T, rows[k].g2)) * (rows[k].seq_s - rows[k].pair_s) /
                        rows[k].seq_s;
        CHECK(fabs(T->tuned_s - (before - gain)) < 1e-12 && fabs(ch.tuned_ms - T->tuned_s * 1e3) < 1e-9);
        CHECK(T->tuned_s > 0 && T->tuned_s <= before);
        printf("tune: %d row groups timed in their GEMM's epilogue (all kept by the test hook)\n", nr);
    }
    CHECK_OK(dm_plan_save(plan, cfg, &opt, &T->g, &ch));
    CHECK_OK(dm_tuner_svg(T, svg));
    printf("tune: %lld measurements, sum of groups default %.3f ms, tuned %.3f ms\n", (long long)T->ntasks,
           T->default_s * 1e3, T->tuned_s * 1e3);
    /* the plan file runs and gives the default plan's numbers */
    dm_status st;
    dm_layer *ref = build(cfg, &opt, NULL, &st);
    dm_layer_options po = opt;
    po.plan = plan;
    dm_layer *L = NULL;
    CHECK_OK(dm_layer_new(&L, cfg, &po));
    if (L && ref) {
        fill_inputs(L, 7);
        CHECK_OK(dm_layer_forward(L));
        CHECK_OK(dm_layer_backward(L));
        double e = compare_all_ex(L, ref, 0, 1);
        printf("  tuned plan vs default plan: max rel.err %.2e\n", e);
        CHECK(e < 1e-5);
    }
    dm_layer_free(L);
    dm_layer_free(ref);
    /* the cache: a second tuner measures nothing; a torn line is ignored, not trusted */
    dm_tuner *T2 = NULL;
    CHECK_OK(dm_tuner_new(&T2, cfg, &opt));
    if (T2) {
        CHECK_OK(dm_tuner_measure(T2, cache, NULL, NULL));
        CHECK(T2->nfrom_cache == T2->ntasks);
        printf("  second run: %lld of %lld from the cache\n", (long long)T2->nfrom_cache, (long long)T2->ntasks);
        /* ... and it has the re-timed times, not the first ones (the cache's last line wins) */
        int same = 1, refined = 0;
        for (int k = 0; k < T->ngroups && k < T2->ngroups; k++) {
            const dm_tune_group *G = &T->groups[k], *G2 = &T2->groups[k];
            if (G->refined_comb < 0) continue;
            const int64_t at = G->refined_comb * G->nalgo + G->refined_algo;
            /* the cache keeps 9 significant digits */
            same &= fabs(G2->secs[0] - G->secs[0]) <= 1e-8 * G->secs[0] &&
                    fabs(G2->secs[at] - G->secs[at]) <= 1e-8 * G->secs[at];
            refined++;
        }
        CHECK(same);
        printf("  the %d re-timed groups' times come back from the cache\n", refined);
        dm_tuner_free(T2);
    }
    FILE *f = fopen(cache, "a");
    CHECK(f != NULL);
    if (f) {
        fputs("some|torn|key with no time and no newline", f);
        fclose(f);
    }
    T2 = NULL;
    CHECK_OK(dm_tuner_new(&T2, cfg, &opt));
    if (T2) {
        CHECK_OK(dm_tuner_measure(T2, cache, NULL, NULL));
        CHECK(T2->nfrom_cache == T2->ntasks);
        printf("  after a torn last line: %lld of %lld from the cache\n", (long long)T2->nfrom_cache,
               (long long)T2->ntasks);
        dm_tuner_free(T2);
    }
    hostile_caches(cache, cfg, &opt);
    /* bad plan files */
    char *good = read_text(plan);
    CHECK(good != NULL);
    if (good) {
        size_t n = strlen(good) + 256;
        char *t = malloc(n);
        printf("bad plan files:\n");
        expect_bad_text(bad, "", cfg, &opt, &T->g, "empty file");
        snprintf(t, n, "%.*s", (int)(strlen(good) / 2), good);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "truncated");
        expect_bad_text(bad, "[1, 2, 3]", cfg, &opt, &T->g, "not an object");
        subst(good, "\"dmove-plan\"", "\"other\"", t, n);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "wrong format name");
        char vfrom[32], vto[32];
        snprintf(vfrom, sizeof vfrom, "\"version\":\t%d", DM_PLAN_VERSION);
        snprintf(vto, sizeof vto, "\"version\":\t%d", DM_PLAN_VERSION - 1);
        subst(good, vfrom, vto, t, n);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "older format version");
        char from[64], to[64];
        snprintf(from, sizeof from, "\"batch\":\t%lld", (long long)cfg->batch);
        snprintf(to, sizeof to, "\"batch\":\t%lld", (long long)cfg->batch + 1);
        subst(good, from, to, t, n);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "another configuration");
        add_member(good, "\"layouts\":\t{", "\"nonesuch\": \"ab\"", t, n);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "unknown tensor");
        add_member(good, "\"layouts\":\t{", "\"qkv\": \"bjqhh\"", t, n);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "layout not a permutation");
        add_member(good, "\"algorithms\":\t{", "\"qkv_proj\": \"fastest\"", t, n);
        expect_bad_text(bad, t, cfg, &opt, &T->g, "unknown algorithm");
        /* the contents edited: an algorithm for a contraction the plan leaves at its
         * default (a later entry would win over an added one), or where the tuner moved
         * every contraction off the default, another algorithm for one of them */
        int op = 0;
        while (op < T->g.nop && (T->g.op[op].kind != DM_OP_CONTRACT || ch.algo[op])) op++;
        if (op < T->g.nop) {
            char entry[96];
            snprintf(entry, sizeof entry, "\"%s\": \"split_n\"", T->g.op[op].name);
            add_member(good, "\"algorithms\":\t{", entry, t, n);
        } else {
            for (op = 0; op < T->g.nop && T->g.op[op].kind != DM_OP_CONTRACT; op++) {}
            CHECK(op < T->g.nop);
            if (op < T->g.nop) {
                const char *was = dm_algo_name(ch.algos, ch.algo[op]);
                snprintf(from, sizeof from, "\"%s\":\t\"%s\"", T->g.op[op].name, was);
                snprintf(to, sizeof to, "\"%s\":\t\"%s\"", T->g.op[op].name,
                         strcmp(was, "split_n") ? "split_n" : "split_m");
                subst(good, from, to, t, n);
            }
        }
        expect_bad_text(bad, t, cfg, &opt, &T->g, "edited (checksum)");
        expect_bad("/nonexistent/plan.json", cfg, &opt, &T->g, "missing file");
        api_layouts_refused(bad, cfg, &opt, T);
        /* a plan for the training step is refused for a forward-only layer */
        dm_layer_options fo = opt;
        fo.forward_only = 1;
        dm_graph g2;
        dm_encoder e2;
        dm_graph_init(&g2);
        CHECK_OK(dm_build_encoder(&g2, cfg, 1, 1, 0, 0, &e2));
        expect_bad(plan, cfg, &fo, &g2, "tuned for training, used forward-only");
        dm_graph_free(&g2);
        free(t);
        free(good);
    }
    dm_choices_free(&ch);
    dm_tuner_free(T);
    unlink(cache);
    unlink(plan);
    unlink(bad);
    unlink(svg);
    rmdir(dir);
}

/* "direct_rows" at sizes where its executor takes every path: more than one 24-row block
 * per thread, the summed dimension over 256 (several passes over C), op(B) packed by the
 * team (forward: Wᵀ) and read in place (backward input gradients: W, 64 wide); training
 * and forward-only (whose memory plan reuses bytes: a GEMM whose row group would write
 * what the GEMM reads must be refused, with the reason), each GEMM against the default. */
static void rows_medium(void) {
    if (!dm_gemm_direct_available()) {
        printf("direct_rows at medium sizes: SKIP, the direct kernel does not run here (no AVX2, or DMOVE_ISA=none)\n");
        return;
    }
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 4, cfg.seq = 40, cfg.hidden = 64, cfg.heads = 2, cfg.ffn = 320, cfg.dropout = 0.1;
    for (int fwd = 0; fwd < 2; fwd++) {
        dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .threads = 2, .forward_only = fwd};
        dm_tuner *T = NULL;
        CHECK_OK(dm_tuner_new(&T, &cfg, &opt));
        if (!T) return;
        dm_status st;
        dm_layer *ref = NULL;
        CHECK_OK(dm_layer_new(&ref, &cfg, &opt));
        dm_choices ch;
        CHECK_OK(dm_choices_init(&ch, &T->g, &dm_cpu_gemm_algos));
        if (ref) {
            fill_inputs(ref, 7);
            CHECK_OK(dm_layer_forward(ref));
            if (!fwd) CHECK_OK(dm_layer_backward(ref));
        }
        int fused = 0, refused = 0;
        double worst = 0;
        for (int k = 0; k < T->ngroups && ref; k++) {
            const dm_tune_group *G = &T->groups[k];
            if (G->op < 0) continue;
            memset(ch.algo, 0, (size_t)ch.nop);
            ch.algo[G->op] = DM_GEMM_DIRECT_ROWS;
            dm_layer *L = NULL;
            st = dm_layer_new_with(&L, &cfg, &opt, &ch, 0);
            if (st != DM_OK) {
                CHECK(st == DM_ERR_UNSUPPORTED && strstr(dm_last_error(), "epilogue"));
                refused++;
                continue;
            }
            fill_inputs(L, 7);
            CHECK_OK(dm_layer_forward(L));
            if (!fwd) CHECK_OK(dm_layer_backward(L));
            float *a, *b;
            int nd;
            int64_t sh[4];
            double e;
            if (fwd) { /* the output alone */
                CHECK_OK(dm_layer_tensor(L, "output", &a, &nd, sh));
                CHECK_OK(dm_layer_tensor(ref, "output", &b, &nd, sh));
                e = rel_err(a, b, (size_t)(sh[0] * sh[1] * sh[2]));
            } else {
                e = compare_all_ex(L, ref, 0, 2); /* key bias noise against the query bias gradient */
            }
            worst = worst_of(worst, e);
            fused++;
            dm_layer_free(L);
        }
        printf("direct_rows at b=4 j=40 i=64 u=320, %s: %d GEMMs with their row group in the epilogue "
               "(max rel.err %.2e against the default plan), %d refused with the reason\n",
               fwd ? "forward only" : "training", fused, worst, refused);
        CHECK(fused >= (fwd ? 2 : 4));
        CHECK(worst < 1e-5);
        dm_choices_free(&ch);
        dm_layer_free(ref);
        dm_tuner_free(T);
    }
}

int main(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32, cfg.dropout = 0.1;
    layouts(&cfg, DM_SCHED_FUSED, 0);
    layouts(&cfg, DM_SCHED_UNFUSED, 0);
    cfg.batch = 3, cfg.seq = 5, cfg.hidden = 12, cfg.heads = 3, cfg.ffn = 20;
    layouts(&cfg, DM_SCHED_FUSED, 0);
    /* the layer variants: a causal mask reads the query position off the row, whatever
     * the scores' layout; pre-LN has other groups and tensors to lay out */
    dm_layer_config var = cfg;
    var.norm = DM_NORM_PRE, var.causal = 1;
    printf("pre-LN, causal:\n");
    layouts(&var, DM_SCHED_FUSED, 0);
    /* attention recomputed in the backward pass: its clones' tensors take layouts too */
    printf("recompute:\n");
    layouts(&cfg, DM_SCHED_FUSED, 1);
    tune_and_files(&cfg);
    rows_medium();
    /* the direct algorithms above ran the direct kernel, never BLAS for want of a buffer */
    CHECK(dm_gemm_direct_fallbacks() == 0);
    TEST_END();
}
