/* measure.c: per-operator times of the training step on the CPU backend, for
 * `dmove analyze --measure`: the unfused schedule (each group is one graph op), timers
 * around every group (dm_layer_profile), averaged over profiled steps. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/cost.h"
#include "core/status.h"
#include "layer/layer_internal.h"
#include "tune/tune.h"

dm_status dm_cost_measure(const dm_layer_config *cfg, int threads, int warmup, int reps,
                          const dm_graph *g, double *op_secs) {
    if (!cfg || !g || !op_secs || reps < 1 || warmup < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_cost_measure: bad argument");
    dm_layer_options opt = {.schedule = DM_SCHED_UNFUSED, .threads = threads};
    dm_layer *L = NULL;
    DM_TRY(dm_layer_new(&L, cfg, &opt));
    dm_status st = DM_OK;
    /* the layer's graph is built by the same builder from the same configuration */
    if (L->g.nop != g->nop) {
        st = dm_fail(DM_ERR_INTERNAL, "the measured layer has %d ops, the analysed graph %d",
                     L->g.nop, g->nop);
        goto done;
    }
    for (int o = 0; o < g->nop; o++)
        if (strcmp(L->g.op[o].name, g->op[o].name) != 0) {
            st = dm_fail(DM_ERR_INTERNAL, "op %d differs between the measured layer and the "
                         "analysed graph", o);
            goto done;
        }
    if ((st = dm_layer_init_params(L, 1)) != DM_OK) goto done;
    float *x;
    int nd;
    int64_t sh[4];
    if ((st = dm_layer_tensor(L, "hidden_states", &x, &nd, sh)) != DM_OK) goto done;
    for (int64_t i = 0, n = sh[0] * sh[1] * sh[2]; i < n; i++) x[i] = (float)sin(0.37 * (double)i);
    for (int r = 0; r < warmup; r++)
        if ((st = dm_layer_forward(L)) != DM_OK || (st = dm_layer_backward(L)) != DM_OK) goto done;
    dm_layer_profile_reset(L);
    dm_layer_profile(L, 1);
    for (int r = 0; r < reps; r++)
        if ((st = dm_layer_forward(L)) != DM_OK || (st = dm_layer_backward(L)) != DM_OK) goto done;
    dm_layer_profile(L, 0);
    for (int o = 0; o < g->nop; o++) op_secs[o] = 0;
    for (int G = 0; G < L->plan.ngroups; G++) {
        const dm_group *gr = &L->plan.groups[G];
        if (gr->nops != 1) {
            st = dm_fail(DM_ERR_INTERNAL, "unfused group %d holds %d ops", G, gr->nops);
            goto done;
        }
        op_secs[L->plan.order[gr->first]] = L->group_secs[G] / reps;
    }
done:
    dm_layer_free(L);
    return st;
}
