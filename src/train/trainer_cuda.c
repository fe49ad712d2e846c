/* trainer_cuda.c: the trainer's stack on the GPU (dm_layer_options.device = CUDA). The
 * whole step stays on the device: each layer's output is copied into the next layer's
 * input there (and each input gradient into the layer before's output gradient), the loss
 * and its gradient are a kernel, AdamW a kernel per parameter over fp32 master weights and
 * moments kept beside the arenas. What crosses to the host per step: the input batch, the
 * target and the mask up, one double per token (the loss) down.
 *
 * The host copies (the layers' staging arenas, dm_trainer.moments) of the parameters,
 * gradients, moments and output are a cache, kept per parameter: a slot's `host_stale`
 * says the GPU's state of it is newer (a step; dm_trainer_gpu_pull_slot brings it down
 * when asked for), `dirty` that the host's may be (handed out, loaded: sent up before the
 * next pass); `output_stale` says the same of the output. So asking for one parameter
 * moves that one only. */
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "layer_internal.h"
#include "train/trainer_internal.h"

#ifdef DM_HAVE_CUDA
#include "cuda/cuda_backend.h"

static int tensor_id(dm_trainer *T, int l, const char *name, int *id) {
    *id = dm_layer_tensor_id(T->L[l], name);
    return *id >= 0;
}

dm_status dm_trainer_gpu_pool(dm_trainer *T) {
    int emulate = 0;
    DM_TRY(dm_cuda_emulate_resolve(&emulate));
    return dm_cuda_pool_new(&T->pool, emulate);
}

void dm_trainer_gpu_pool_free(dm_trainer *T) {
    dm_cuda_pool_free(T->pool);
    T->pool = NULL;
}

size_t dm_trainer_gpu_pool_bytes(const dm_trainer *T) { return dm_cuda_pool_bytes(T->pool); }

/* the first layer's executor holds the trainer's buffers */
static dm_cuda_exec *home(const dm_trainer *T) { return T->L[0]->cuda; }

dm_status dm_trainer_gpu_init(dm_trainer *T) {
    for (int l = 0; l < T->nlayers; l++)
        if (!T->L[l]->cuda) return dm_fail(DM_ERR_INTERNAL, "layer %d of the GPU trainer has no GPU executor", l);
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        dm_train_slot *sl = &T->slot[k];
        const int l = k / DM_NUM_PARAMS;
        const char *name = dm_param_names[k % DM_NUM_PARAMS];
        char g[96];
        snprintf(g, sizeof g, "%s.grad", name);
        sl->tg = -1;
        if (!tensor_id(T, l, name, &sl->tp) || (!T->forward_only && !tensor_id(T, l, g, &sl->tg)))
            return dm_fail(DM_ERR_INTERNAL, "layer %d: no tensor %s on the GPU", l, name);
        /* AdamW's moments and master weights are dense: so must the two be in the arena */
        size_t np = 0, ng = 0;
        DM_TRY(dm_cuda_tensor_elems(T->L[l]->cuda, sl->tp, &np));
        if (sl->tg >= 0) DM_TRY(dm_cuda_tensor_elems(T->L[l]->cuda, sl->tg, &ng));
        if ((int64_t)np != sl->n || (sl->tg >= 0 && (int64_t)ng != sl->n))
            return dm_fail(DM_ERR_UNSUPPORTED, "layer %d: %s (or its gradient) is laid out with gaps in the "
                           "arena; the GPU trainer needs dense parameters: leave out --plan", l, name);
    }
    /* the layers' passes are chained by events (dm_cuda_copy_tensor): the trainer waits for
     * the GPU once per pass of the stack (dm_trainer_gpu_wait), not after each layer */
    for (int l = 0; l < T->nlayers; l++) T->L[l]->defer_wait = 1;
    dm_cuda_exec *ex = home(T);
    const size_t tokens = (size_t)T->cfg.batch * (size_t)T->cfg.seq, acts = tokens * (size_t)T->cfg.hidden;
    const size_t np = (size_t)T->nparams;
    DM_TRY(dm_cuda_alloc(ex, acts * sizeof(float), (void **)&T->d_target, "the training targets"));
    DM_TRY(dm_cuda_alloc(ex, tokens * sizeof(float), (void **)&T->d_mask, "the attention mask"));
    DM_TRY(dm_cuda_alloc(ex, tokens * sizeof(double), (void **)&T->d_partial, "the loss"));
    if (!T->forward_only) {
        size_t bytes;
        if (!dm_mul_ok(np, 2 * sizeof(float), &bytes))
            return dm_fail(DM_ERR_OOM, "%zu parameters: AdamW's moments do not fit in memory", np);
        DM_TRY(dm_cuda_alloc(ex, bytes, (void **)&T->d_moments, "AdamW's moments"));
        if (T->opt.dtype != DM_DTYPE_FP32)
            DM_TRY(dm_cuda_alloc(ex, np * sizeof(float), (void **)&T->d_master, "the fp32 master weights"));
    }
    dm_trainer_state_replaced(T); /* the master weights and moments are not up yet */
    return DM_OK;
}

void dm_trainer_gpu_free(dm_trainer *T) {
    if (!T->L || !T->L[0] || !T->L[0]->cuda) return;
    dm_cuda_exec *ex = home(T);
    dm_cuda_free(ex, T->d_target);
    dm_cuda_free(ex, T->d_mask);
    dm_cuda_free(ex, T->d_partial);
    dm_cuda_free(ex, T->d_moments);
    dm_cuda_free(ex, T->d_master);
}

/* Slot k's moments between the host and the GPU (up: to the GPU). */
static dm_status moments_copy(const dm_trainer *T, const dm_train_slot *sl, int up) {
    if (!T->d_moments) return DM_OK;
    const size_t bytes = (size_t)sl->n * sizeof(float);
    for (int h = 0; h < 2; h++) {
        float *host = T->moments + (h ? T->nparams : 0) + sl->off, *dev = T->d_moments + (h ? T->nparams : 0) + sl->off;
        DM_TRY(dm_cuda_memcpy(home(T), up ? (void *)dev : (void *)host, up ? (void *)host : (void *)dev, bytes, up));
    }
    return DM_OK;
}

dm_status dm_trainer_gpu_push(dm_trainer *T) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        dm_train_slot *sl = &T->slot[k];
        if (!sl->dirty) continue;
        dm_cuda_exec *ex = T->L[k / DM_NUM_PARAMS]->cuda;
        DM_TRY(dm_cuda_upload(ex, sl->tp, sl->p)); /* rounded to the storage type */
        if (T->d_master) DM_TRY(dm_cuda_memcpy(ex, T->d_master + sl->off, sl->p, (size_t)sl->n * sizeof(float), 1));
        DM_TRY(moments_copy(T, sl, 1));
        sl->dirty = 0;
    }
    return DM_OK;
}

dm_status dm_trainer_gpu_pull_slot(const dm_trainer *T, int k) {
    /* the host copies are a cache of the GPU's state: filling them changes no state */
    dm_train_slot *sl = &((dm_trainer *)T)->slot[k];
    if (!sl->host_stale) return DM_OK;
    dm_cuda_exec *ex = T->L[k / DM_NUM_PARAMS]->cuda;
    if (T->d_master) DM_TRY(dm_cuda_memcpy(ex, sl->p, T->d_master + sl->off, (size_t)sl->n * sizeof(float), 0));
    else DM_TRY(dm_cuda_download(ex, sl->tp, sl->p));
    if (sl->tg >= 0) DM_TRY(dm_cuda_download(ex, sl->tg, sl->g));
    DM_TRY(moments_copy(T, sl, 0));
    sl->host_stale = 0;
    return DM_OK;
}

dm_status dm_trainer_gpu_pull(const dm_trainer *T, unsigned what) {
    dm_trainer *W = (dm_trainer *)T; /* a cache, as above */
    for (int k = 0; (what & DM_PULL_STATE) && k < T->nlayers * DM_NUM_PARAMS; k++)
        DM_TRY(dm_trainer_gpu_pull_slot(T, k));
    if ((what & DM_PULL_OUTPUT) && T->output_stale) {
        DM_TRY(dm_trainer_gpu_download(W, T->nlayers - 1, "output"));
        W->output_stale = 0;
    }
    return DM_OK;
}

dm_status dm_trainer_gpu_download(dm_trainer *T, int l, const char *name) {
    const int t = dm_layer_tensor_id(T->L[l], name);
    float *p = NULL;
    DM_TRY(dm_layer_tensor(T->L[l], name, &p, NULL, NULL));
    return dm_cuda_download(T->L[l]->cuda, t, p);
}

dm_status dm_trainer_gpu_inputs(dm_trainer *T) {
    const size_t tokens = (size_t)T->cfg.batch * (size_t)T->cfg.seq, acts = tokens * (size_t)T->cfg.hidden;
    int t;
    float *x = NULL;
    if (!tensor_id(T, 0, "hidden_states", &t)) return dm_fail(DM_ERR_INTERNAL, "the first layer has no input");
    DM_TRY(dm_layer_tensor(T->L[0], "hidden_states", &x, NULL, NULL));
    DM_TRY(dm_cuda_upload(T->L[0]->cuda, t, x));
    /* the mask goes up once, to the first layer; the others copy it on the device (ordered
     * by events: no host wait per layer) */
    int t0 = -1;
    for (int l = 0; l < T->nlayers; l++) {
        float *m = NULL;
        if (!tensor_id(T, l, "attention_mask", &t)) return dm_fail(DM_ERR_INTERNAL, "layer %d has no attention_mask", l);
        DM_TRY(dm_layer_tensor(T->L[l], "attention_mask", &m, NULL, NULL));
        memcpy(m, T->mask, tokens * sizeof(float)); /* the host copies stay what the GPU holds */
        if (l == 0) {
            t0 = t;
            DM_TRY(dm_cuda_upload(T->L[0]->cuda, t, m));
        } else {
            DM_TRY(dm_cuda_copy_tensor(T->L[l]->cuda, t, T->L[0]->cuda, t0));
        }
    }
    DM_TRY(dm_cuda_memcpy(home(T), T->d_mask, T->mask, tokens * sizeof(float), 1));
    return dm_cuda_memcpy(home(T), T->d_target, T->target, acts * sizeof(float), 1);
}

dm_status dm_trainer_gpu_link(dm_trainer *T, int from, const char *src, int to, const char *dst) {
    int ts, td;
    if (!tensor_id(T, from, src, &ts) || !tensor_id(T, to, dst, &td))
        return dm_fail(DM_ERR_INTERNAL, "layer %d has no %s, or layer %d no %s", from, src, to, dst);
    return dm_cuda_copy_tensor(T->L[to]->cuda, td, T->L[from]->cuda, ts);
}

dm_status dm_trainer_gpu_loss(dm_trainer *T, float scale) {
    dm_layer *last = T->L[T->nlayers - 1];
    const int64_t tokens = T->cfg.batch * T->cfg.seq;
    int ty, tdy = -1;
    if (!tensor_id(T, T->nlayers - 1, "output", &ty) ||
        (!T->forward_only && !tensor_id(T, T->nlayers - 1, "grad_output", &tdy)))
        return dm_fail(DM_ERR_INTERNAL, "the last layer has no output");
    DM_TRY(dm_cuda_mse(last->cuda, ty, tdy, T->d_target, T->d_mask, tokens, T->cfg.hidden, scale, T->d_partial,
                       T->partial));
    T->output_stale = 1;
    return DM_OK;
}

dm_status dm_trainer_gpu_wait(dm_trainer *T) {
    for (int l = 0; l < T->nlayers; l++) DM_TRY(dm_cuda_sync(T->L[l]->cuda));
    return DM_OK;
}

void dm_trainer_gpu_grads_new(dm_trainer *T) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) T->slot[k].host_stale = 1;
}

dm_status dm_trainer_gpu_adamw(dm_trainer *T, int64_t step, double lr) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        const dm_train_slot *sl = &T->slot[k];
        dm_adamw_coef c;
        dm_adamw_coef_make(&c, lr, sl->decay ? T->adam.weight_decay : 0.0, &T->adam, step);
        DM_TRY(dm_cuda_adamw(T->L[k / DM_NUM_PARAMS]->cuda, sl->tp, sl->tg, sl->n,
                             T->d_master ? T->d_master + sl->off : NULL, T->d_moments + sl->off,
                             T->d_moments + T->nparams + sl->off, &c));
    }
    /* the update is over when the GPU is (its time is the optimizer's; errors surface here) */
    return dm_trainer_gpu_wait(T);
}

#else /* without CUDA no layer is on a GPU: dm_trainer_new never sets T->gpu */

static dm_status no_cuda(void) {
    return dm_fail(DM_ERR_UNSUPPORTED, "dmove was built without CUDA: install the CUDA toolkit (nvcc) and rebuild");
}
dm_status dm_trainer_gpu_pool(dm_trainer *T) { return no_cuda(); }
void dm_trainer_gpu_pool_free(dm_trainer *T) { (void)T; }
size_t dm_trainer_gpu_pool_bytes(const dm_trainer *T) { return 0; }
dm_status dm_trainer_gpu_init(dm_trainer *T) { return no_cuda(); }
void dm_trainer_gpu_free(dm_trainer *T) { (void)T; }
dm_status dm_trainer_gpu_push(dm_trainer *T) { return no_cuda(); }
dm_status dm_trainer_gpu_pull(const dm_trainer *T, unsigned what) { return no_cuda(); }
dm_status dm_trainer_gpu_pull_slot(const dm_trainer *T, int k) { return no_cuda(); }
dm_status dm_trainer_gpu_download(dm_trainer *T, int l, const char *name) { return no_cuda(); }
dm_status dm_trainer_gpu_inputs(dm_trainer *T) { return no_cuda(); }
dm_status dm_trainer_gpu_link(dm_trainer *T, int from, const char *src, int to, const char *dst) { return no_cuda(); }
dm_status dm_trainer_gpu_loss(dm_trainer *T, float scale) { return no_cuda(); }
dm_status dm_trainer_gpu_adamw(dm_trainer *T, int64_t step, double lr) { return no_cuda(); }
dm_status dm_trainer_gpu_wait(dm_trainer *T) { return no_cuda(); }
void dm_trainer_gpu_grads_new(dm_trainer *T) { (void)T; }

#endif
