/* trainer_internal.h: the dm_trainer struct, for the trainer's files and white-box tests. */
#ifndef DM_TRAINER_INTERNAL_H
#define DM_TRAINER_INTERNAL_H

#include <stdint.h>

#include "dmove.h"

typedef struct {
    float *p, *g;     /* the parameter and its gradient, in the layer's arena */
    int64_t n;        /* elements */
    int64_t off;      /* where its moments start in each half of dm_trainer.moments */
    int ndim;
    int64_t shape[2];
    int decay;        /* AdamW's weight decay applies (weights, not biases or LayerNorm) */
} dm_train_slot;

struct dm_trainer {
    dm_layer_config cfg;
    dm_layer_options opt;
    dm_adamw_config adam;
    int nlayers;
    int forward_only;
    dm_layer **L;
    dm_train_slot *slot; /* nlayers * DM_NUM_PARAMS, layer-major, in dm_param_names order */
    int64_t nparams;
    float *moments;      /* exp_avg of every parameter, then exp_avg_sq: 2 * nparams */
    float *mask;         /* (b, j) */
    float *target;       /* (b, j, i) */
    double *partial;     /* (b * j) per-token loss sums */
    int64_t step;        /* updates taken */
    char run_tag[128];   /* what the run trains on (dm_trainer_set_run_tag), in checkpoints */
    double secs[DM_TRAIN_NUM_PHASES];
};

/* The slot of layer l's parameter `param` (a BertLayer name), or -1. */
int dm_train_slot_find(const dm_trainer *T, int l, const char *param);

#endif
