/* layer_internal.h: the dm_layer struct, for the library and its white-box tests. */
#ifndef DM_LAYER_INTERNAL_H
#define DM_LAYER_INTERNAL_H

#include "graph/encoder.h"
#include "plan/backend.h"
#include "plan/plan.h"
#include "plan/planfile.h"

struct dm_layer {
    dm_layer_config cfg;
    dm_layer_options opt;
    dm_graph g;
    dm_encoder enc;
    dm_plan plan;
    char *arena;        /* the host copy of every tensor (the CPU backend's own memory;
                         * a GPU's staging copy) */
    size_t arena_bytes;
    char *act;          /* where the plan's activations are: shared (dm_layer_act_share),
                         * or arena + (plan.arena_bytes - plan.activation_bytes) */
    const dm_backend *bk; /* the backend of opt.device */
    dm_backend_state *st; /* its state for the plan */
    dm_segment segment; /* what its graph is: an encoder layer, or a part of a whole BERT */
    int forward_done;
    int profile;
    int defer_wait;     /* a pass returns without waiting for the backend (the trainer
                         * chains layers on the device and waits once per pass) */
    double prof[2][DM_NUM_CLASSES];
    double *group_secs; /* per group, accumulated while profiling */
    double *pass_secs;  /* per group, one pass's times from the backend's own timers */
};

/* dm_layer_new with plan choices given in memory (the tuner), instead of opt->plan;
 * lenient: groups the layouts rule out are marked unusable instead of failing. */
dm_status dm_layer_new_with(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                            const dm_choices *choices, int lenient);

/* dm_layer_new, with the plan grouped as for the GPU executor (no sibling merges, see
 * dm_plan_build) whatever the device: a host layer whose plan the tests hand to the CUDA
 * executor (emulated, or beside a CPU layer on the GPU). */
dm_status dm_layer_new_gpu_grouping(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt);

/* Memory that the activations of several forward-only layers share (the encoder layers of
 * an inference model, run one after the other: no pass of one overlaps another's, and
 * nothing outlives a forward pass but the layer's outputs, which are its own). The first
 * layer that joins allocates it at its plan's activation bytes; one that needs more keeps
 * its own. Zero it before the first layer joins; free it (dm_layer_act_share_free) after
 * every layer that joined. */
typedef struct {
    char *mem;
    size_t bytes;
} dm_layer_act_share;
void dm_layer_act_share_free(dm_layer_act_share *share);

/* dm_layer_new, the backend's state sharing the buffers of `pool` (the backend's pool_new:
 * layers whose work never runs at once, a trainer's), and with opt->forward_only on a
 * backend that takes them apart (activations_apart), its activations in `share` (NULL:
 * its own). */
dm_status dm_layer_new_pooled(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                              dm_backend_pool *pool, dm_layer_act_share *share);

/* Where root tensor r's bytes are in the host memory (arena, or shared activations), or
 * NULL if not materialized. */
char *dm_layer_root_addr(const dm_layer *L, int r);

/* A part of a whole BERT (graph/encoder.h's segments) as a layer: its tensors by the
 * names its builder exports, its steps as a layer's; `pool` as dm_layer_new_pooled. */
dm_status dm_layer_new_segment(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt,
                               dm_segment segment, const dm_bert_sizes *sizes, dm_backend_pool *pool);

/* The graph tensor of a layer's named tensor (dm_layer_tensor's names), or -1. */
int dm_layer_tensor_id(const dm_layer *L, const char *name);

#endif
