/* analysis_api.h: inside the public analysis API of dmove_tools.h (api.c, textreport.c,
 * and tune/api.c's measurement): what a dm_analysis holds. */
#ifndef DM_ANALYSIS_API_H
#define DM_ANALYSIS_API_H

#include "analysis/cost.h"
#include "dmove_tools.h"
#include "plan/planfile.h"

struct dm_profile {
    dm_cpu_profile p;
};

struct dm_device_model {
    dm_device d;
};

/* What the step holds in memory: the tensors the forward keeps for the backward (made in
 * the forward, read in the backward) in the plan analysed (the fused one, or with
 * recompute the recomputing one), and the intermediates of the fused plan, the unfused
 * one and the fused one with attention recomputed at their peak (first-fit over live
 * intervals: the arena's intermediate part), in the storage type. */
typedef struct {
    int n;
    int t[64];             /* saved tensors of the fused graph, largest first */
    double saved_bytes;
    double fused, unfused, recompute; /* intermediates, bytes */
} dm_analysis_memory;

struct dm_analysis {
    dm_layer_config cfg;
    dm_device dev;
    int dtype_bytes, recompute;
    int tuned; /* built for a tuned plan: the CPU's attention as its ops (dm_cost_build) */
    /* g: the step's graph, as the unfused schedule runs it (the operator table); gf: the
     * fused schedule's graph, g after its rewrites (graph/rewrite.c keeps op ids, so the
     * fused plan's groups index g's operators too); plan: gf's fused plan */
    dm_graph g, gf;
    dm_plan plan;
    dm_cost_report rep;
    dm_analysis_memory mem;
    double *op_secs;       /* measured seconds per op of g, or NULL */
    /* a plan file applied (dm_analysis_load_plan) */
    char *plan_path;
    int have_choices;
    dm_choices ch;
    int *partner, *beside; /* per group of plan: the group run beside it, the group it runs beside */
};

/* Fills m for the plan analysed (gf, plan) and recounts the three plans' intermediates
 * (api.c); dm_analysis_load_plan (tune/api.c: it reads the plan with the CPU's algorithm
 * names) calls it again after the layouts change. */
dm_status dm_analysis_memory_report(const dm_layer_config *cfg, int cpu, int tuned, const dm_graph *gf,
                                    const dm_plan *plan, int dtype_bytes, dm_analysis_memory *m);
/* dm_analysis_new on a device's rates, for a tuned plan (tuned: the CPU's attention as
 * its ops, which a plan names) or not */
dm_status dm_analysis_make(dm_analysis **out, const dm_layer_config *cfg, const dm_device *dev, int dtype_bytes,
                           int recompute, int tuned);

#endif
