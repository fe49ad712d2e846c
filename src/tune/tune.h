/* tune.h: `dmove tune`: candidate layouts and algorithms per fused group, measured on
 * the CPU backend (with an on-disk cache), and the global choice by shortest path
 * (select.h) over the groups of the whole training step. */
#ifndef DM_TUNE_H
#define DM_TUNE_H

#include <stdint.h>

#include "cpu/contract.h"
#include "graph/encoder.h"
#include "plan/plan.h"
#include "plan/planfile.h"

#define DM_TUNE_MAX_SCOPE 6
#define DM_TUNE_MAX_CAND 24
#define DM_TUNE_MAX_RETIMED 32 /* runs per candidate when two are re-timed in alternation */

/* A tensor whose layout is a choice. */
typedef struct {
    int t;                                   /* root tensor */
    int ncand;
    char cand[DM_TUNE_MAX_CAND][DM_MAX_DIMS + 1]; /* memory orders; [0] is the builder's */
} dm_tune_var;

/* A fused group: the variables it touches and its measured times. */
typedef struct {
    int gi;                        /* plan group */
    int op;                        /* a lone contraction: its op (algorithms apply), else -1 */
    int kernels;                   /* a batched group with contractions: the algorithms are
                                    * their kernel (default or direct), for all of them */
    int nscope;
    int scope[DM_TUNE_MAX_SCOPE];  /* variable indices */
    int64_t ncomb;                 /* layout combinations of the scope */
    int nalgo;
    uint8_t algo[DM_GEMM_NUM_ALGOS];
    double *secs;                  /* [comb * nalgo + a]: median seconds; INFINITY infeasible, NAN not measured */
    int cached;                    /* how many came from the cache */
    /* the selection */
    int64_t chosen_comb;
    int chosen_algo;
    int64_t refined_comb;          /* the candidate dm_tuner_refine last re-timed (-1: none) */
    int refined_algo;
} dm_tune_group;

typedef struct {
    dm_layer_config cfg;
    dm_layer_options opt;
    int threads;
    dm_graph g;
    dm_encoder enc;
    dm_plan plan;
    int nvars;
    dm_tune_var *vars;
    int ngroups;
    dm_tune_group *groups;
    int reps, warmup;
    char machine[192];
    /* measurement bookkeeping */
    int64_t ntasks, ndone, nfrom_cache, cache_skipped;
    double tuned_s, default_s;     /* sum over groups of the chosen / the default (comb 0, algo default) */
} dm_tuner;

/* Builds the graph and plan and enumerates candidates (rules in tune.c). */
dm_status dm_tuner_new(dm_tuner **out, const dm_layer_config *cfg, const dm_layer_options *opt);
void dm_tuner_free(dm_tuner *T);
/* Number of (group, layouts, algorithm) measurements. */
int64_t dm_tuner_tasks(const dm_tuner *T);
/* Measures every candidate not in the cache (cache_path NULL: no cache); each new
 * measurement is appended to the cache as it is taken, so an interrupted tune keeps
 * what it measured. progress(done, total, seconds elapsed, arg) after each. */
dm_status dm_tuner_measure(dm_tuner *T, const char *cache_path,
                           void (*progress)(int64_t done, int64_t total, int64_t cached, double secs, void *arg),
                           void *arg);
/* After a selection: every group whose chosen candidate is not its default has both
 * timed again, alternately run by run (so a change of the machine's speed during the
 * measurement, which can favour whichever was measured in a quiet moment, hits both),
 * and their times replaced, here and (cache_path not NULL) in the cache, whose lookups
 * take a key's last line; select again after. A candidate re-timed before is not
 * again. nrefined: how many groups. */
dm_status dm_tuner_refine(dm_tuner *T, const char *cache_path, int *nrefined);
/* Two contractions timed one after the other and side by side (dm_tuner_pair). */
typedef struct {
    int g1, g2;            /* plan groups: g1 gets the algorithm "concurrent" if kept */
    double seq_s, pair_s;  /* medians: one then the other, both at once */
    int kept;
} dm_tune_pair;

/* After the final selection (ch from dm_tuner_select): each lone contraction with a
 * partner (dm_plan_partner; in the backward pass, a layer's input gradient and its
 * weight gradient) is timed, on the chosen layouts and algorithms, one then the other
 * and both at once (each on half the threads), alternately run by run. Where at once
 * is faster, ch gives the first the algorithm "concurrent" and tuned_s drops by the
 * same fraction of the two groups' times in it; a pair whose GEMMs differ by more than 2x in work is not tried (on half
 * the threads each, the larger one's time is the pair's). pairs (up to max; may be
 * NULL): what was timed; npairs: how many. Needs two threads or more (else times
 * nothing). */
dm_status dm_tuner_pair(dm_tuner *T, dm_choices *ch, dm_tune_pair *pairs, int max, int *npairs);
/* After dm_tuner_pair, on CPUs with the direct kernel: each lone contraction that runs on
 * its own turn (no pair) and whose next group can run in its epilogue (the executor's
 * dm_cpu_exec_fuse_rows) is timed, on the chosen layouts and algorithms, as chosen and
 * then the row group, against "direct_rows" (the row group run on each block of the
 * GEMM's rows as the kernel finishes it), alternately run by run; where the epilogue is
 * faster, ch gives it "direct_rows" and tuned_s drops by the same fraction of the two
 * groups' times in it. res (up to max;
 * may be NULL): what was timed, as pairs (g1 the contraction, g2 the row group, seq_s
 * apart, pair_s in the epilogue); nres: how many. */
dm_status dm_tuner_rows(dm_tuner *T, dm_choices *ch, dm_tune_pair *res, int max, int *nres);
/* Shortest-path selection; fills choices (initialised here; dm_choices_free). */
dm_status dm_tuner_select(dm_tuner *T, dm_choices *choices);
/* Layout string of variable v's candidate c (for reports). */
const char *dm_tuner_layout(const dm_tuner *T, int v, int c);
/* Candidate index of variable v in combination comb of group G. */
int dm_tune_comb_index(const dm_tuner *T, const dm_tune_group *G, int64_t comb, int s);
/* The default cache file: $XDG_CACHE_HOME/dmove/tune-cache.tsv or ~/.cache/dmove/... */
dm_status dm_tune_cache_default_path(char *buf, size_t n);
/* Violin plot of each group's spread of candidate times (relative to its best). */
dm_status dm_tuner_svg(const dm_tuner *T, const char *path);

/* measure.c: runs the layer on the CPU backend with the unfused schedule (one group per
 * graph op) for `reps` profiled steps after `warmup` untimed ones, and gives each graph
 * op's mean seconds per step in op_secs[nop] (nop: the graph's op count, checked). */
dm_status dm_cost_measure(const dm_layer_config *cfg, int threads, int warmup, int reps,
                          const dm_graph *g, double *op_secs);

#endif
