/* layer_internal.h: the dm_layer struct, for the library and its white-box tests. */
#ifndef DM_LAYER_INTERNAL_H
#define DM_LAYER_INTERNAL_H

#include "cpu/exec.h"
#include "graph/encoder.h"
#include "plan/plan.h"
#include "plan/planfile.h"

struct dm_layer {
    dm_layer_config cfg;
    dm_layer_options opt;
    dm_graph g;
    dm_encoder enc;
    dm_plan plan;
    char *arena;
    size_t arena_bytes;
    dm_cpu_exec ex;
    int nthreads;
    int forward_done;
    int profile;
    int defer_wait;     /* a GPU layer's pass returns without waiting for the GPU (the
                         * trainer chains layers by events and waits once per pass) */
    double prof[2][DM_NUM_CLASSES];
    double *group_secs; /* per group, accumulated while profiling */
    double *gpu_secs;   /* GPU layers: per group, one pass's times from CUDA events */
    struct dm_cuda_exec *cuda; /* opt.device == DM_DEVICE_CUDA: the GPU executor; the arena
                                * above is then its host staging copy (else NULL) */
};

/* dm_layer_new with plan choices given in memory (the tuner), instead of opt->plan;
 * lenient: groups the layouts rule out are marked unusable instead of failing. */
dm_status dm_layer_new_with(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                            const dm_choices *choices, int lenient);

/* dm_layer_new, with the plan grouped as for the GPU executor (no sibling merges, see
 * dm_plan_build) whatever the device: a host layer whose plan the tests hand to the CUDA
 * executor (emulated, or beside a CPU layer on the GPU). */
dm_status dm_layer_new_gpu_grouping(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt);

/* dm_layer_new, a GPU layer's executor taking its main-stream buffers from `pool`
 * (cuda/cuda_backend.h: layers whose main streams never run at once, a trainer's). */
struct dm_cuda_pool;
dm_status dm_layer_new_pooled(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                              struct dm_cuda_pool *pool);

/* The graph tensor of a layer's named tensor (dm_layer_tensor's names), or -1. */
int dm_layer_tensor_id(const dm_layer *L, const char *name);

/* DMOVE_CUDA_EMULATE=1: `--device cuda` layers run the CUDA executor emulated on the host
 * (DM_CUDA_EMULATE: slow, no GPU needed; for tests of what drives the executor, e.g. the
 * trainer). Unset or 0: off; anything else is an error. */
dm_status dm_cuda_emulate_resolve(int *on);

#endif
