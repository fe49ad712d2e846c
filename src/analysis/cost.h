/* cost.h: the cost model of a training step: per operator flop, bytes read and written
 * (each input read once, each output written once, dtype-aware), operational intensity,
 * the roofline bound and predicted time on a device; per class shares; and the bytes of
 * the unfused schedule (every operator's own I/O) against the fused one (per group: its
 * materialized external inputs read once and materialized outputs written once). */
#ifndef DM_COST_H
#define DM_COST_H

#include "analysis/device.h"
#include "graph/graph.h"
#include "plan/plan.h"

typedef struct {
    int op;                 /* graph op id */
    dm_op_class cls;
    int pass;               /* 0 forward, 1 backward */
    double flop;
    double bytes_read, bytes_written, bytes;
    double intensity;       /* flop / byte */
    double peak;            /* flop/s of its class on the device */
    double t_compute, t_memory;
    int memory_bound;       /* t_memory >= t_compute */
    double predicted_s;     /* max(t_compute, t_memory) */
} dm_op_cost;

typedef struct {
    int group;              /* index in the fused plan */
    int pass;
    dm_op_class cls;
    int nops;
    const int *ops;         /* op ids of the fused graph (fused_graph; points into the
                             * plan's order) */
    double flop;
    double bytes_read, bytes_written, bytes;
    double t_compute, t_memory, predicted_s;
    int in_epilogue;        /* GPU: runs in the previous group's GEMM epilogue; the pair's
                             * floor is one roofline, counted at the GEMM (predicted_s 0 here) */
} dm_group_cost;

typedef struct {
    dm_device dev;
    int dtype_bytes;
    int nops;
    dm_op_cost *ops;        /* one per graph op, in graph order */
    int ngroups;
    dm_group_cost *groups;  /* the fused plan's groups, in execution order */
    const dm_graph *fused_graph; /* the fused plan's graph (its ops name the groups') */
    double flop_total;
    double class_flop[DM_NUM_CLASSES];
    double class_time[DM_NUM_CLASSES];    /* sum of predicted op times (unfused) */
    double pass_flop[2][DM_NUM_CLASSES];
    double unfused_bytes, fused_bytes;    /* whole step */
    double reduction_pct;                 /* 100 * (1 - fused / unfused) */
    double unfused_floor_s, fused_floor_s; /* sums of predicted times */
    double fused_flop;                    /* the groups' (the fused graph's ops) */
    double recomputed_flop;               /* of it, forward ops the backward runs again */
    int bias_epilogues;                   /* GPU: lone bias groups counted in their GEMM's
                                           * epilogue (dm_cost_epilogue_bias) */
} dm_cost_report;

/* Bytes an op reads and writes (each distinct input tensor once, each output once; a
 * view counts its own elements). */
void dm_cost_op_io(const dm_graph *g, const dm_op *op, int dtype_bytes, double *rd, double *wr);
/* Bytes group G of `plan` reads and writes: inputs not produced inside the group (each
 * distinct tensor once) and outputs whose root is materialized (plan->in_memory).
 * DM_ERR_OOM (and zeros) if its scratch lists cannot be allocated. */
dm_status dm_cost_group_io(const dm_plan *plan, int G, int dtype_bytes, double *rd, double *wr);
/* The bytes of the tensor between group G - 1 and group G when the CUDA executor runs G
 * in G - 1's cuBLASLt epilogue (cudaexec/epilogue.cu): G - 1 a lone unbatched contraction,
 * G a lone bias add of its output in the same pass, that output read by nothing else. The
 * contraction then writes the biased tensor, and the pre-bias one never reaches memory.
 * 0 otherwise. (Where cuBLASLt has no algorithm, or the planner gave the biased tensor the
 * bytes of an operand, the executor keeps the two apart: a floor the GPU may miss.) */
double dm_cost_epilogue_bias(const dm_plan *plan, int G, int dtype_bytes);
/* The flop of group G of `plan`: its contractions' and the rest (its graph's ops). */
void dm_cost_group_flop(const dm_plan *plan, int G, double *contract, double *other);
/* The roofline time of work on dev in a dtype of dtype_bytes: the larger of its compute
 * time (contraction flop at the contraction peak plus the rest at the vector peak) and
 * its memory time (bytes at the device's bandwidth); 0 for a rate that is not positive. */
double dm_roofline_seconds(const dm_device *dev, int dtype_bytes, double contract_flop, double other_flop,
                           double bytes);
/* A time-to-floor ratio as text for tables and charts: 3 significant digits, without an
 * exponent (a tiny layer's groups can be thousands of times their floors: "14500", not
 * "1.45e+04"). Returns buf. */
const char *dm_ratio_text(double x, char *buf, size_t n);
/* The whole report: the operators of g (unfused), the groups of `fused`, a fused plan of
 * g or of g rewritten (its own graph: the groups' flop are its ops'). On a GPU device
 * (not dev->is_cpu) a bias group in its GEMM's epilogue (dm_cost_epilogue_bias) counts
 * neither the pre-bias tensor's write nor its read, and the two groups' floor is one
 * roofline (the bias's bytes under the GEMM's compute), as bench --groups counts them. */
dm_status dm_cost_analyze(const dm_graph *g, const dm_plan *fused, const dm_device *dev,
                          int dtype_bytes, dm_cost_report *r);
void dm_cost_free(dm_cost_report *r);

/* The graphs and plan `dmove analyze` reports on, for cfg: g, the step as the unfused
 * schedule runs it; gf, g after the fused schedule's rewrites (the same op ids; with
 * `recompute`, attention's probabilities recomputed in the backward, --recompute: four
 * clones inserted, the ids after them moved); plan, gf's fused plan, as the CPU executor
 * (cpu = 1) or the GPU's (0) groups it: the CPU's attention as one op where its executor
 * runs it so by default (plan/compile.h), its ops with `tuned` (the graph a tuned plan
 * names). The caller frees all three, also on failure (they are initialised first). */
dm_status dm_cost_build(const dm_layer_config *cfg, int cpu, int recompute, int tuned, dm_graph *g, dm_graph *gf,
                        dm_plan *plan);
/* The roofline floors (seconds; dm_cost_report's unfused_floor_s and fused_floor_s) of a
 * training step of cfg on dev, in a dtype of dtype_bytes; the fused one of the plan that
 * recomputes attention with `recompute`. */
dm_status dm_cost_floors(const dm_layer_config *cfg, const dm_device *dev, int dtype_bytes, int recompute,
                         double *unfused_s, double *fused_s);

/* report.c: the report as a cJSON object (ops, groups, classes, totals, device), the ops
 * table as CSV text, and the roofline chart as SVG (atomically written). cfg may be NULL. */
struct cJSON;
struct cJSON *dm_cost_json(const dm_graph *g, const dm_cost_report *r, const dm_layer_config *cfg);
char *dm_cost_csv(const dm_graph *g, const dm_cost_report *r);
char *dm_cost_svg(const dm_graph *g, const dm_cost_report *r, const char *title);
dm_status dm_cost_write_svg(const dm_graph *g, const dm_cost_report *r, const char *title,
                            const char *path);
const char *dm_dtype_bytes_name(int dtype_bytes);

/* groupchart.c: a step's groups as horizontal bars of their measured time (execution
 * order, coloured by class) with each one's roofline floor drawn inside as a dark band;
 * one section per schedule, one time axis. A bar with ms < 0 is a group timed with
 * another (its note is shown instead); floor_ms < 0: no floor drawn. */
typedef struct {
    const char *label; /* the group's operators */
    int pass;
    dm_op_class cls;
    double ms, floor_ms;
    const char *note;
} dm_chart_bar;
typedef struct {
    const char *name;    /* the schedule */
    const char *summary; /* a line under it */
    const dm_chart_bar *bars;
    int nbars;
} dm_chart_section;
char *dm_groups_svg(const char *title, const char *subtitle, const dm_chart_section *sec, int nsec);
/* Written atomically (temporary file + rename). */
dm_status dm_groups_write_svg(const char *title, const char *subtitle, const dm_chart_section *sec, int nsec,
                              const char *path);

#endif
