/* trainer.c: a stack of BERT encoder layers trained end to end (`dmove train`): the
 * layers' steps chained (each layer's output is the next one's input, each layer's input
 * gradient the previous one's output gradient), a mean squared error against a target
 * over the tokens the mask keeps, and AdamW over every parameter; all of it on the
 * layers' backend (trainer_state.c), the host holding copies. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hugealloc.h"
#include "core/status.h"
#include "dist/dist.h"
#include "graph/encoder.h"
#include "layer/layer_internal.h"
#include "train/train.h"
#include "train/model.h"
#include "train/trainer_internal.h"

#define DM_TRAIN_MAX_LAYERS 256

static double now(void) { return omp_get_wtime(); }

dm_status dm_trainer_new(dm_trainer **out, const dm_layer_config *cfg, int layers,
                         const dm_layer_options *opt, const dm_optim_config *optim) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_new: out is NULL");
    *out = NULL;
    DM_TRY(dm_layer_config_check(cfg));
    if (layers < 1 || layers > DM_TRAIN_MAX_LAYERS)
        return dm_fail(DM_ERR_INVALID_ARG, "%d layers: a stack has 1 to %d layers (BERT-base has 12, "
                       "BERT-large 24)", layers, DM_TRAIN_MAX_LAYERS);
    dm_layer_options o = {0};
    if (opt) o = *opt;
    if (o.unpad)
        return dm_fail(DM_ERR_UNSUPPORTED, "a stack of layers trains on padded batches (its data's attention_mask); "
                       "unpadded batches are the whole model's (pretrain, finetune): leave out unpad");
    dm_optim_config a;
    if (optim) a = *optim;
    else dm_optim_config_default(&a);
    if (!o.forward_only) DM_TRY(dm_optim_config_check(&a));

    dm_trainer *T = calloc(1, sizeof *T);
    if (!T) return dm_fail(DM_ERR_OOM, "out of memory");
    T->cfg = *cfg;
    T->opt = o;
    T->optim = a;
    T->grad_norm = -1.0;
    T->nlayers = layers;
    T->forward_only = o.forward_only;
    T->ranks = 1;
    dm_status s = DM_OK;
    const size_t tokens = (size_t)cfg->batch * (size_t)cfg->seq; /* checked by the config */
    const size_t acts = tokens * (size_t)cfg->hidden;
    if (!(T->L = calloc((size_t)layers, sizeof *T->L)) || !(T->mask = malloc(tokens * sizeof(float))) ||
        !(T->target = calloc(acts, sizeof(float))) || !(T->partial = malloc(tokens * sizeof(double))))
        s = dm_fail(DM_ERR_OOM, "out of memory for the trainer's buffers");
    for (size_t k = 0; s == DM_OK && k < tokens; k++) T->mask[k] = 1.0f;
    for (int l = 0; s == DM_OK && l < layers; l++) {
        /* nothing reads the first layer's input gradient: it is not computed (except with
         * a plan from `dmove tune`, which is made for the whole step and names its ops) */
        dm_layer_options ol = o;
        ol.no_input_grad = l == 0 && !o.plan; /* the others' feed the layer before */
        if (l == 0) s = dm_trainer_pool(T); /* the backend, and what the layers share */
        if (s == DM_OK) s = dm_layer_new_pooled(&T->L[l], cfg, &ol, T->pool, o.forward_only ? &T->share : NULL);
        if (s != DM_OK) dm_fail_context(s, "layer %d of %d: ", l, layers);
    }
    /* the parameter slots, and one block for both AdamW moments of all of them */
    const int nslots = layers * DM_NUM_PARAMS;
    T->nseg = layers;
    if (s == DM_OK && !(T->slot = calloc((size_t)nslots, sizeof *T->slot)))
        s = dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK) T->nslots = nslots;
    int64_t total = 0;
    for (int l = 0; s == DM_OK && l < layers; l++)
        for (int k = 0; s == DM_OK && k < DM_NUM_PARAMS; k++) {
            dm_train_slot *sl = &T->slot[l * DM_NUM_PARAMS + k];
            sl->seg = l;
            sl->pname = dm_param_names[k];
            int nd = 0;
            int64_t sh[4] = {0, 0, 0, 0};
            s = dm_layer_tensor(T->L[l], dm_param_names[k], &sl->p, &nd, sh);
            sl->n = nd == 1 ? sh[0] : sh[0] * sh[1];
            sl->ndim = nd;
            sl->shape[0] = sh[0];
            sl->shape[1] = nd == 2 ? sh[1] : 0;
            sl->decay = nd == 2; /* weights decay; biases and LayerNorm parameters do not (BERT) */
            if (s == DM_OK && !o.forward_only) {
                char g[96];
                snprintf(g, sizeof g, "%s.grad", dm_param_names[k]);
                s = dm_layer_tensor(T->L[l], g, &sl->g, NULL, NULL);
            }
            sl->off = sl->moff = total;
            sl->owner = -1;
            total += sl->n;
        }
    T->nparams = T->mcount = total;
    if (s == DM_OK && !o.forward_only) {
        /* on 2 MiB pages as the layers' arenas, and touched now, not in the first step */
        size_t bytes;
        if (!dm_mul_ok((size_t)total, 2 * sizeof(float), &bytes) || !(T->moments = dm_alloc_huge(bytes)))
            s = dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB for AdamW's moments",
                        (double)total * 8.0 / (1 << 30));
        else
            memset(T->moments, 0, bytes);
    }
    if (s == DM_OK) s = dm_trainer_state_init(T);
    if (s != DM_OK) {
        dm_trainer_free(T);
        return s;
    }
    *out = T;
    return DM_OK;
}

void dm_trainer_free(dm_trainer *T) {
    if (!T) return;
    dm_trainer_state_free(T);
    if (T->model) dm_model_free(T->model); /* its segments are T->L */
    else
        for (int l = 0; T->L && l < T->nlayers; l++) dm_layer_free(T->L[l]);
    dm_trainer_pool_free(T); /* after the layers that borrow from it */
    dm_layer_act_share_free(&T->share);
    free(T->L);
    free(T->slot);
    free(T->moments);
    free(T->mask);
    free(T->target);
    free(T->partial);
    free(T);
}

int dm_trainer_layers(const dm_trainer *T) { return T ? T->nlayers : 0; }
int64_t dm_trainer_num_params(const dm_trainer *T) { return T ? T->nparams : 0; }
int64_t dm_trainer_step_count(const dm_trainer *T) { return T ? T->step : 0; }
int64_t dm_trainer_skipped(const dm_trainer *T) { return T ? T->skipped : 0; }
int dm_trainer_num_segments(const dm_trainer *T) { return T ? T->nseg : 0; }
dm_layer *dm_trainer_segment(dm_trainer *T, int k) { return T && k >= 0 && k < T->nseg ? T->L[k] : NULL; }
int dm_trainer_micro(const dm_trainer *T) { return T ? T->micro : 0; }
double dm_trainer_grad_norm(const dm_trainer *T) { return T ? T->grad_norm : -1.0; }

void dm_trainer_memory_info(const dm_trainer *T, dm_layer_memory *sum, size_t *optimizer) {
    memset(sum, 0, sizeof *sum);
    *optimizer = 0;
    if (!T) return;
    for (int l = 0; l < T->nseg; l++) {
        dm_layer_memory m;
        dm_layer_memory_info(T->L[l], &m);
        sum->arena += m.arena;
        sum->activations += m.activations;
        sum->parameters += m.parameters;
        sum->inputs += m.inputs;
        sum->scratch += m.scratch;
    }
    sum->scratch += dm_trainer_pool_bytes(T); /* the layers' shared buffers, once */
    /* the moments, and on the GPU with 16-bit storage the fp32 master weights */
    if (T->moments) /* the moments (of this rank's shard with ZeRO), master weights, sums */
        *optimizer = ((size_t)T->mcount * 2 + (size_t)T->nparams * ((T->d_master ? 1 : 0) + (T->optim.accumulate > 1))) *
                     sizeof(float);
}

double dm_trainer_step_flop(const dm_trainer *T) {
    double sum = 0.0;
    for (int l = 0; T && l < T->nseg; l++) {
        double f[2][DM_NUM_CLASSES];
        dm_layer_flop(T->L[l], f);
        for (int p = 0; p < (T->forward_only ? 1 : 2); p++)
            for (int c = 0; c < DM_NUM_CLASSES; c++) sum += f[p][c];
    }
    return sum;
}

void dm_trainer_times(const dm_trainer *T, double secs[DM_TRAIN_NUM_PHASES]) {
    for (int k = 0; k < DM_TRAIN_NUM_PHASES; k++) secs[k] = T ? T->secs[k] : 0.0;
}

dm_status dm_trainer_init_params(dm_trainer *T, uint64_t seed) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_init_params: NULL trainer");
    if (T->model) DM_TRY(dm_model_init_params(T->model, seed));
    else
        for (int l = 0; l < T->nlayers; l++) DM_TRY(dm_layer_init_params(T->L[l], dm_train_layer_seed(seed, l, 0)));
    if (T->moments) memset(T->moments, 0, (size_t)T->mcount * 2 * sizeof(float));
    T->grad_norm = -1.0;
    dm_trainer_state_restarted(T, 0, 0);
    return DM_OK;
}

/* "encoder.layer.<l>.<rest>": the layer, and rest; 0 if name is not of that form. */
static int layer_name(const dm_trainer *T, const char *name, int *l, const char **rest) {
    static const char pre[] = "encoder.layer.";
    if (strncmp(name, pre, sizeof pre - 1) != 0) return 0;
    const char *p = name + sizeof pre - 1;
    if (*p < '0' || *p > '9') return 0;
    long v = 0;
    while (*p >= '0' && *p <= '9' && v <= DM_TRAIN_MAX_LAYERS) v = v * 10 + (*p++ - '0');
    if (*p != '.' || v >= T->nlayers) return 0;
    *l = (int)v;
    *rest = p + 1;
    return 1;
}

int dm_train_slot_find(const dm_trainer *T, int l, const char *param) {
    for (int k = 0; k < DM_NUM_PARAMS; k++)
        if (strcmp(param, dm_param_names[k]) == 0) return l * DM_NUM_PARAMS + k;
    return -1;
}

dm_status dm_trainer_tensor(dm_trainer *T, const char *name, float **data, int *ndim, int64_t shape[4]) {
    if (!T || !name || !data) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_tensor: NULL argument");
    if (T->model) return dm_trainer_bert_tensor(T, name, data, ndim, shape);
    int64_t sh[4] = {0, 0, 0, 0};
    int nd = 0;
    float *p = NULL;
    int l;
    const char *rest;
    if (strcmp(name, "attention_mask") == 0) {
        p = T->mask, nd = 2, sh[0] = T->cfg.batch, sh[1] = T->cfg.seq;
    } else if (strcmp(name, "target") == 0) {
        p = T->target, nd = 3, sh[0] = T->cfg.batch, sh[1] = T->cfg.seq, sh[2] = T->cfg.hidden;
    } else if (strcmp(name, "hidden_states") == 0) {
        return dm_layer_tensor(T->L[0], "hidden_states", data, ndim, shape);
    } else if (strcmp(name, "output") == 0) {
        DM_TRY(dm_trainer_pull(T, DM_PULL_OUTPUT));
        return dm_layer_tensor(T->L[T->nlayers - 1], "output", data, ndim, shape);
    } else if (layer_name(T, name, &l, &rest)) {
        size_t n = strlen(rest);
        int moment = n > 8 && strcmp(rest + n - 8, ".exp_avg") == 0 ? 1
                     : n > 11 && strcmp(rest + n - 11, ".exp_avg_sq") == 0 ? 2 : 0;
        const int grad = !moment && n > 5 && strcmp(rest + n - 5, ".grad") == 0;
        char param[96];
        snprintf(param, sizeof param, "%.*s", (int)(n - (moment == 1 ? 8 : moment == 2 ? 11 : grad ? 5 : 0)), rest);
        int si = dm_train_slot_find(T, l, param);
        if (si >= 0 && T->broken) return dm_trainer_broken(T); /* its value is neither one nor the other */
        if (si >= 0) {
            /* this parameter's state comes down; the caller may write the parameter or a
             * moment: they go up again before the next pass */
            DM_TRY(dm_trainer_pull_slot(T, si));
            if (!grad) T->slot[si].dirty = 1;
        } else if (!moment) {
            DM_TRY(dm_trainer_download(T, l, rest)); /* another of the layer's tensors */
        }
        if (!moment) return dm_layer_tensor(T->L[l], rest, data, ndim, shape);
        if (si < 0 || !T->moments) return dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the trainer", name);
        const dm_train_slot *sl = &T->slot[si];
        if (!(p = dm_slot_moments(T, sl, moment == 2, 0)))
            return dm_fail(DM_ERR_NOT_FOUND, "'%s': with ZeRO stage 1 rank %d keeps these moments, not this rank", name,
                           sl->owner);
        nd = sl->ndim, sh[0] = sl->shape[0], sh[1] = sl->shape[1];
    } else {
        return dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the trainer (it has hidden_states, "
                       "attention_mask, target, output, and encoder.layer.<0..%d>.<parameter>[.grad|"
                       ".exp_avg|.exp_avg_sq])", name, T->nlayers - 1);
    }
    *data = p;
    if (ndim) *ndim = nd;
    if (shape) memcpy(shape, sh, sizeof sh);
    return DM_OK;
}

/* The number (from 1) of the micro-batch after those taken: the dropout masks' step (with
 * accumulate 1, the update's number). */
static int64_t next_micro(const dm_trainer *T) {
    return T->step * (int64_t)T->optim.accumulate + T->micro + 1;
}

/* Forward through the stack with micro-batch `step`'s dropout seeds; the loss against
 * target. */
static dm_status forward(dm_trainer *T, int64_t step, double *loss) {
    const dm_layer_config *c = &T->cfg;
    const size_t tokens = (size_t)c->batch * (size_t)c->seq;
    double ti = now();
    DM_TRY(dm_trainer_push(T));
    DM_TRY(dm_trainer_inputs(T)); /* the input batch, the masks, the target */
    T->secs[DM_TRAIN_INPUT] += now() - ti;
    double t0 = now();
    for (int l = 0; l < T->nlayers; l++) {
        DM_TRY(dm_layer_set_seed(T->L[l], dm_train_layer_seed(c->seed ^ T->seed_mix, l, step)));
        DM_TRY(dm_layer_forward(T->L[l]));
        if (l + 1 < T->nlayers) DM_TRY(dm_trainer_link(T, l, "output", l + 1, "hidden_states"));
    }
    DM_TRY(dm_trainer_wait(T)); /* the forward's time is the backend's */
    double t1 = now();
    T->secs[DM_TRAIN_FORWARD] += t1 - t0;

    /* mean squared error over the kept tokens' features; its gradient into the last
     * layer's grad_output (zero on padding). Per-token sums, then summed in token order:
     * the same loss for any thread count. */
    int64_t kept = 0; /* over the global batch: every rank's (dm_trainer_set_dist) */
    for (size_t t = 0; t < tokens; t++) kept += T->mask[t] != 0.0f;
    DM_TRY(dm_dist_sum_i64(T->dist, &kept, 1, "counting the kept tokens"));
    const int64_t I = c->hidden;
    const float scale = kept ? (float)(2.0 / ((double)kept * (double)I)) : 0.0f;
    DM_TRY(dm_trainer_loss(T, scale)); /* the per-token sums into T->partial */
    double sum = 0.0;
    for (size_t t = 0; t < tokens; t++) sum += T->partial[t];
    DM_TRY(dm_dist_sum_f64(T->dist, &sum, 1, "summing the loss"));
    if (loss) *loss = kept ? sum / ((double)kept * (double)I) : 0.0;
    T->secs[DM_TRAIN_LOSS] += now() - t1;
    return DM_OK;
}

dm_status dm_trainer_forward(dm_trainer *T, double *loss) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_forward: NULL trainer");
    if (T->broken) return dm_trainer_broken(T);
    if (T->model) return dm_trainer_bert_forward(T, next_micro(T), loss);
    DM_TRY(forward(T, next_micro(T), loss));
    return dm_trainer_pull(T, DM_PULL_OUTPUT); /* the caller reads the output */
}

/* The backward pass, each segment's gradients handed to the sums over the ranks as it
 * ends. */
static dm_status backward(dm_trainer *T) {
    if (T->model) return dm_trainer_bert_backward(T);
    for (int li = T->nlayers - 1; li >= 0; li--) {
        DM_TRY(dm_layer_backward(T->L[li]));
        DM_TRY(dm_trainer_reduce_segment(T, li));
        if (li > 0) DM_TRY(dm_trainer_link(T, li, "grad_hidden_states", li - 1, "grad_output"));
    }
    return DM_OK;
}

dm_status dm_trainer_step(dm_trainer *T, double *loss) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_step: NULL trainer");
    if (T->forward_only)
        return dm_fail(DM_ERR_INVALID_ARG, "this trainer was made forward-only: it cannot take a step");
    if (T->broken) return dm_trainer_broken(T);
    const int64_t step = T->step + 1;
    double l = 0.0;
    if (T->model) DM_TRY(dm_trainer_bert_forward(T, next_micro(T), &l));
    else DM_TRY(forward(T, next_micro(T), &l));
    if (!isfinite(l))
        return dm_fail(DM_ERR_INVALID_ARG, "the loss is %g: the parameters were not updated (update %lld); "
                       "lower the learning rate (--lr) or check the inputs and targets for NaN or huge "
                       "values", l, (long long)step);
    double t0 = now();
    dm_status s = backward(T);
    if (s == DM_OK && T->model) T->window_scored += T->model->counted_all; /* a micro-batch taken */
    if (s == DM_OK) s = dm_trainer_after_backward(T, step, t0);
    if (s != DM_OK) dm_trainer_reduce_drain(T); /* none of the sums handed over left running */
    if (s == DM_OK && loss) *loss = l;
    return s;
}

dm_status dm_trainer_after_backward(dm_trainer *T, int64_t step, double t0) {
    const int acc = T->optim.accumulate;
    dm_trainer_grads_new(T); /* even if the wait below fails */
    /* with accumulation, every micro-batch's gradient into the sums */
    if (acc > 1) DM_TRY(dm_trainer_accumulate(T, T->micro == 0));
    DM_TRY(dm_trainer_wait(T)); /* the backward's time is the backend's */
    double t1 = now();
    T->secs[DM_TRAIN_BACKWARD] += t1 - t0;
    if (++T->micro < acc) return DM_OK;
    T->micro = 0; /* the next window starts over, whether the update goes through or not */
    const int64_t scored = T->window_scored;
    T->window_scored = 0;
    T->update_scored = scored;
    /* the sums over the ranks: the time waited for them is none of the phases' (see
     * dm_trainer_reduce_times); a failure (a rank gone) leaves the parameters unchanged */
    DM_TRY(dm_trainer_reduce_finish(T));
    if (T->model && scored == 0) { /* no masked position (no labelled example) anywhere: no
                                    * gradient, and AdamW's momentum and decay alone would
                                    * still move the weights; the update is left out */
        T->skipped++;
        T->step = step;
        return DM_OK;
    }
    const double t2 = now();
    dm_status s = dm_trainer_update(T, step, acc > 1);
    T->secs[DM_TRAIN_OPTIMIZER] += now() - t2;
    if (s != DM_OK) return s;
    T->step = step;
    return DM_OK;
}

dm_status dm_trainer_set_dist(dm_trainer *T, dm_dist *d) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_dist: NULL trainer");
    if (T->micro)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_dist: in the middle of an update (%d of %d micro-batches "
                       "taken)", T->micro, T->optim.accumulate);
    const int n = dm_dist_size(d), r = dm_dist_rank(d);
    if (T->zero)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_dist: the optimizer's state is sharded over the ranks "
                       "already (dm_trainer_set_zero)");
    if (n > 1 && T->forward_only)
        return dm_fail(DM_ERR_INVALID_ARG, "a forward-only trainer has no gradients to sum over ranks");
    if (n > 1 && (!T->bk->reduce || !T->bk->reduce_wait))
        return dm_fail(DM_ERR_UNSUPPORTED, "the %s backend cannot sum gradients over ranks%s", T->bk->name,
                       dm_dist_have_nccl() ? "" : " (a CUDA build needs NCCL for it)");
    /* DMOVE_DIST_REDUCE_ALONE=1: one rank takes the reduction path too (on a GPU NCCL's, a
     * communicator of one whose all-reduce changes nothing): how that path is run where
     * one GPU is all there is */
    const char *alone = getenv("DMOVE_DIST_REDUCE_ALONE");
    const int forced = n == 1 && d && alone && !strcmp(alone, "1") && !T->forward_only && T->bk->reduce &&
                       T->bk->reduce_wait;
    T->dist = n > 1 || forced ? d : NULL;
    T->ranks = n;
    /* rank r's dropout masks from the seed mixed with r (a SplitMix64 constant's multiple) */
    T->seed_mix = (uint64_t)r * 0x9e3779b97f4a7c15ull;
    if (T->model) {
        T->model->dist = T->dist;
        T->model->seed_mix = T->seed_mix;
    }
    return DM_OK;
}

void dm_trainer_reduce_times(const dm_trainer *T, double *busy, double *exposed) {
    double b = 0, e = 0;
    if (busy && exposed) dm_dist_reduce_times(T ? T->dist : NULL, &b, &e);
    if (busy) *busy = b;
    if (exposed) *exposed = e;
}

dm_status dm_trainer_set_run_tag(dm_trainer *T, const char *tag) {
    if (!T || !tag) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_run_tag: NULL argument");
    if (strlen(tag) >= sizeof T->run_tag)
        return dm_fail(DM_ERR_INVALID_ARG, "a run tag has at most %zu characters", sizeof T->run_tag - 1);
    snprintf(T->run_tag, sizeof T->run_tag, "%s", tag);
    return DM_OK;
}

dm_status dm_trainer_set_run_tag_v1(dm_trainer *T, const char *tag, const char *note) {
    if (!T || !tag) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_run_tag_v1: NULL argument");
    if (strlen(tag) >= sizeof T->run_tag_v1 || (note && strlen(note) >= sizeof T->run_tag_v1_note))
        return dm_fail(DM_ERR_INVALID_ARG, "a run tag has at most %zu characters, its note %zu",
                       sizeof T->run_tag_v1 - 1, sizeof T->run_tag_v1_note - 1);
    snprintf(T->run_tag_v1, sizeof T->run_tag_v1, "%s", tag);
    snprintf(T->run_tag_v1_note, sizeof T->run_tag_v1_note, "%s", note ? note : "");
    return DM_OK;
}

dm_status dm_trainer_set_optim(dm_trainer *T, const dm_optim_config *optim) {
    if (!T || !optim) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_optim: NULL argument");
    DM_TRY(dm_optim_config_check(optim));
    if (T->micro && optim->accumulate != T->optim.accumulate)
        return dm_fail(DM_ERR_INVALID_ARG, "the number of micro-batches per update cannot change in the middle of "
                       "an update (%d of %d taken)", T->micro, T->optim.accumulate);
    T->optim = *optim;
    return DM_OK;
}
