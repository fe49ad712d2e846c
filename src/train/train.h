/* train.h: inside the trainer (a stack of encoder layers, its loss and optimizer). */
#ifndef DM_TRAIN_H
#define DM_TRAIN_H

#include <stdint.h>

#include "dmove.h"
#include "graph/optim_elem.h"

/* One AdamW update of n elements, torch.optim.AdamW's arithmetic (decoupled decay,
 * bias-corrected moments, eps outside the square root), in one pass over memory: p, g, m,
 * v read once, p, m, v written once. `step` is the update's number, from 1; `decay` is the
 * weight decay this tensor takes (0 for biases and LayerNorm parameters). */
void dm_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, double lr, double decay,
                     const dm_optim_config *c, int64_t step);

/* The constants of update number `step` (from 1) with learning rate lr, weight decay
 * `decay` (0 for biases and LayerNorm parameters) and gradient factor gscale, for the
 * passes of graph/optim_elem.h (LAMB's apply pass then sets lr_ratio to lr times the
 * tensor's trust ratio). */
void dm_optim_coef_make(dm_optim_coef *k, double lr, double decay, double gscale, const dm_optim_config *c,
                        int64_t step);

/* The dropout seed of layer `layer` in the training step `step` (from 1): a SplitMix64
 * mix of the three, so that no two layers or steps share masks. */
uint64_t dm_train_layer_seed(uint64_t seed, int layer, int64_t step);

/* The loss curve of a training run as an SVG chart (steps first_step ..
 * first_step + n - 1 on x, the loss on y: logarithmic where it spans over a decade), a line
 * through the steps' losses with a marker on each (up to 200 steps) and, over 50 steps,
 * their running mean; the title on top; written atomically. */
dm_status dm_loss_svg(const double *loss, int64_t n, int64_t first_step, const char *title, const char *path);

#endif
