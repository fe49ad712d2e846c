/* planfile.h: the choices a tuned plan adds to the fused groups (a memory layout per
 * tensor, an algorithm per contraction), applied to a planned graph, and saved to /
 * loaded from a JSON plan file with validation (format, version, configuration,
 * every name and choice, checksum). */
#ifndef DM_PLANFILE_H
#define DM_PLANFILE_H

#include <stdint.h>

#include "plan/plan.h"

#define DM_PLAN_FORMAT "dmove-plan"
/* 2: a contraction left at its default runs dm_gemm_default_algo's rule since lone ones
 * run the direct kernel by default (1: they ran BLAS); a plan of 1 is refused, to tune
 * again */
#define DM_PLAN_VERSION 2

typedef struct {
    int nt, nop;
    char (*layout)[DM_MAX_DIMS + 1]; /* per tensor (roots): memory order; "" = the builder's */
    uint8_t *algo;                   /* per op: an id of `algos`; 0 = default */
    const dm_algo_table *algos;      /* the backend's table that names them (plan files
                                      * write their names) */
    /* what the tuner measured (milliseconds, sum over groups) and where */
    double tuned_ms, default_ms;
    char machine[128];
    int threads;
} dm_choices;

/* algos: the table of the backend whose algorithms c will choose. */
dm_status dm_choices_init(dm_choices *c, const dm_graph *g, const dm_algo_table *algos);
void dm_choices_free(dm_choices *c);
/* Lays out the graph's tensors and sets the plan's algorithms and their table (plan built
 * on g). */
dm_status dm_choices_apply(const dm_choices *c, dm_graph *g, dm_plan *plan);
/* Adds c's "layouts" (tensor name -> memory order) and "algorithms" (contraction name ->
 * algorithm) objects to obj, as a plan file has them; 1 ok, 0 out of memory. */
struct cJSON;
int dm_choices_add_json(struct cJSON *obj, const dm_graph *g, const dm_choices *c);
/* Writes the plan file atomically. */
dm_status dm_plan_save(const char *path, const dm_layer_config *cfg, const dm_layer_options *opt,
                       const dm_graph *g, const dm_choices *c);
/* Reads and validates a plan file for this configuration and graph, its algorithms by
 * their names in `algos` (c: initialised by this call; free with dm_choices_free). A file
 * for another configuration, of another format version, malformed or edited (checksum)
 * gives DM_ERR_FORMAT and a message. */
dm_status dm_plan_load(const char *path, const dm_layer_config *cfg, const dm_layer_options *opt,
                       const dm_graph *g, const dm_algo_table *algos, dm_choices *c);

#endif
