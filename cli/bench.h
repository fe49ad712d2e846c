/* bench.h: what `dmove bench` (cmd_bench.c) shares with its --groups report
 * (bench_groups.c): a schedule's results and the run's device settings. */
#ifndef DM_CLI_BENCH_H
#define DM_CLI_BENCH_H

#include <cjson/cJSON.h>

#include "cli_common.h"

typedef struct {
    const char *name;
    double fwd_ms, bwd_ms, step_ms, contr_ms, gflops;
    double class_ms[DM_NUM_CLASSES];
    double flop[2][DM_NUM_CLASSES], flop_total;
    /* what the backend chose (dm_layer_note_value: the GPU executor's row programs,
     * generated ones, fused attention groups, bias epilogues, groups on the second
     * stream; all 0 on the CPU), and the GPU's name ("" emulated or on the CPU) */
    int64_t row_programs, row_programs_generated, attention_fused, attention_flash, bias_epilogues, second_stream;
    char gpu[128];
    dm_layer_memory mem;     /* what the layer holds */
    /* --groups: the plan's groups (their times the medians over the profiled steps), and
     * the roofline they are held to */
    dm_layer_group *groups;
    int ngroups;
    double *floor_s;         /* per group (a group timed with another: 0, its floor added
                              * to that group's); NULL without a model */
    dm_device_model *model;  /* NULL without a model */
    char model_note[320];    /* without a model: why */
    int group_reps;          /* the profiled steps the groups' medians are over */
} bench_result;

/* The run's device settings the report reads. */
typedef struct {
    dm_device_kind device; /* --device */
    dm_dtype dtype;        /* --dtype */
    int streams;           /* CUDA streams in effect (2: the second stream) */
    const char *roofline;  /* --roofline, or NULL: by the device */
} bench_env;

/* The median of v[0..n) (sorts v). cmd_bench.c. */
double bench_median(double *v, int n);
/* Adds a number to a JSON object (non-finite as 0); 0 when cJSON runs out of memory. */
int bench_jnum(cJSON *o, const char *k, double v);
/* Prints the report `root` (built whole: ok) on stdout and frees it. 0, or -1 after the
 * error is printed (cJSON out of memory, stdout not writable). */
int bench_json_emit(cJSON *root, int ok);

/* --groups: each group's facts, its time the median of gsec[G * reps ..] over the
 * profiled steps, and, with a model, its floor (a group timed with another adds its floor
 * to that one's). -1 after an error is printed. */
int bench_groups_collect(const cli_config *c, const bench_env *env, const dm_layer *layer, double *gsec, int n,
                         int reps, bench_result *r);
/* The groups (stderr), each against its floor, then where the time above the floors goes. */
void bench_groups_print(const bench_env *env, const bench_result *r);
/* --svg: a chart of the schedules' groups. -1 after an error is printed. */
int bench_groups_chart(const cli_config *c, const bench_env *env, const bench_result *res, int nres,
                       const char *svg);
/* --groups with --json: "roofline" and "groups" into o; 0 when cJSON runs out of memory. */
int bench_groups_json(cJSON *o, const bench_env *env, const bench_result *r);
void bench_result_free(bench_result *r);

/* `dmove bench --model` (bench_model.c): the whole BertForMaskedLM's step and its parts. */
typedef struct {
    int layers, warmup, reps, json, groups, lamb;
    int64_t vocab, predictions; /* predictions 0: b * ceil(j / 5) */
    int64_t predictions_used;   /* what the trainer scores */
} bench_model_opts;
/* 0, or -1 after the error is printed. */
int bench_model_run(const cli_config *c, bench_model_opts *mo, const dm_layer_options *lo, const bench_env *env);

/* bench_lengths.c: `bench --lengths SPEC`: the padded and the unpadded layer (options lo,
 * schedule included) on batches of lengths drawn from SPEC ("uniform:LO-HI" or a file of
 * lengths), interleaved; the table or --json. CLI_OK, or CLI_USAGE / CLI_FAIL after saying
 * why. */
int bench_lengths_run(const cli_config *c, const char *spec, const dm_layer_options *lo, int warmup, int reps,
                      int json);

#endif
