/* trainer_state.c: the trainer's stack on its layers' backend (plan/backend.h). The whole
 * step stays in the backend: each layer's output is copied into the next layer's input
 * there (and each input gradient into the layer before's output gradient), the loss and
 * its gradient and AdamW (over fp32 master weights in 16-bit storage) run there, on
 * moments kept beside the plans. What crosses to the host per step on a GPU: the input
 * batch, the target and the mask up, one double per token (the loss) down. On the CPU
 * backend, whose memory is the host's, nothing crosses: its buffers are the host's.
 *
 * The host copies (the layers' host arenas, dm_trainer.moments) of the parameters,
 * gradients, moments and output are a cache, kept per parameter: a slot's `host_stale`
 * says the backend's state of it is newer (a step; dm_trainer_pull_slot brings it down
 * when asked for), `dirty` that the host's may be (handed out, loaded: sent up before the
 * next pass); `output_stale` says the same of the output. So asking for one parameter
 * moves that one only. */
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "layer/backends.h"
#include "layer/layer_internal.h"
#include "train/train.h"
#include "train/trainer_internal.h"

static int tensor_id(dm_trainer *T, int l, const char *name, int *id) {
    *id = dm_layer_tensor_id(T->L[l], name);
    return *id >= 0;
}

/* layer l's backend state; the first layer's holds the trainer's buffers */
static dm_backend_state *st(const dm_trainer *T, int l) { return T->L[l]->st; }
static dm_backend_state *home(const dm_trainer *T) { return st(T, 0); }

dm_status dm_trainer_pool(dm_trainer *T) {
    DM_TRY(dm_backend_find(T->opt.device, &T->bk));
    return T->bk->pool_new(&T->pool);
}

void dm_trainer_pool_free(dm_trainer *T) {
    if (T->bk) T->bk->pool_free(T->pool);
    T->pool = NULL;
}

size_t dm_trainer_pool_bytes(const dm_trainer *T) { return T->bk ? T->bk->pool_bytes(T->pool) : 0; }

/* Elements of tensor t's span (its first to its last element, gaps of a strided view
 * included). */
static int64_t span(const dm_layer *L, int t) {
    const dm_tensor *x = &L->g.t[t];
    int64_t last = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (x->size[d] < 1) return 0;
        last += (x->size[d] - 1) * x->stride[d];
    }
    return last + 1;
}

dm_status dm_trainer_state_init(dm_trainer *T) {
    const dm_backend *B = T->bk;
    for (int l = 0; l < T->nlayers; l++)
        if (T->L[l]->bk != B) return dm_fail(DM_ERR_INTERNAL, "layer %d of the trainer is on another backend", l);
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        dm_train_slot *sl = &T->slot[k];
        const int l = k / DM_NUM_PARAMS;
        const char *name = dm_param_names[k % DM_NUM_PARAMS];
        char g[96];
        snprintf(g, sizeof g, "%s.grad", name);
        sl->tg = -1;
        if (!tensor_id(T, l, name, &sl->tp) || (!T->forward_only && !tensor_id(T, l, g, &sl->tg)))
            return dm_fail(DM_ERR_INTERNAL, "layer %d: no tensor %s in the backend", l, name);
        /* AdamW's moments and master weights are dense: so must the two be in the arena */
        if (span(T->L[l], sl->tp) != sl->n || (sl->tg >= 0 && span(T->L[l], sl->tg) != sl->n))
            return dm_fail(DM_ERR_UNSUPPORTED, "layer %d: %s (or its gradient) is laid out with gaps in the "
                           "arena; the trainer needs dense parameters: leave out --plan", l, name);
    }
    /* the layers' passes are chained in the backend (copy_tensor): the trainer waits for
     * it once per pass of the stack (dm_trainer_wait), not after each layer */
    for (int l = 0; l < T->nlayers; l++) T->L[l]->defer_wait = 1;
    dm_backend_state *h = home(T);
    const size_t tokens = (size_t)T->cfg.batch * (size_t)T->cfg.seq, acts = tokens * (size_t)T->cfg.hidden;
    const size_t np = (size_t)T->nparams;
    DM_TRY(B->buf_new(h, acts * sizeof(float), T->target, (void **)&T->d_target, "the training targets"));
    DM_TRY(B->buf_new(h, tokens * sizeof(float), T->mask, (void **)&T->d_mask, "the attention mask"));
    DM_TRY(B->buf_new(h, tokens * sizeof(double), T->partial, (void **)&T->d_partial, "the loss"));
    if (!T->forward_only) {
        size_t bytes;
        if (!dm_mul_ok(np, 2 * sizeof(float), &bytes))
            return dm_fail(DM_ERR_OOM, "%zu parameters: AdamW's moments do not fit in memory", np);
        DM_TRY(B->buf_new(h, bytes, T->moments, (void **)&T->d_moments, "AdamW's moments"));
        if (T->opt.dtype != DM_DTYPE_FP32)
            DM_TRY(B->buf_new(h, np * sizeof(float), NULL, (void **)&T->d_master, "the fp32 master weights"));
    }
    dm_trainer_state_replaced(T); /* the master weights and moments are not up yet */
    return DM_OK;
}

void dm_trainer_state_free(dm_trainer *T) {
    if (!T->bk || !T->L || !T->L[0] || !T->L[0]->st) return;
    const dm_backend *B = T->bk;
    dm_backend_state *h = home(T);
    if (T->d_target) B->buf_free(h, T->d_target, T->target);
    if (T->d_mask) B->buf_free(h, T->d_mask, T->mask);
    if (T->d_partial) B->buf_free(h, T->d_partial, T->partial);
    if (T->d_moments) B->buf_free(h, T->d_moments, T->moments);
    if (T->d_master) B->buf_free(h, T->d_master, NULL);
}

/* Slot k's moments between the host and the backend (up: to the backend). */
static dm_status moments_copy(const dm_trainer *T, const dm_train_slot *sl, int up) {
    if (!T->d_moments) return DM_OK;
    const size_t bytes = (size_t)sl->n * sizeof(float);
    for (int h = 0; h < 2; h++) {
        float *host = T->moments + (h ? T->nparams : 0) + sl->off, *dev = T->d_moments + (h ? T->nparams : 0) + sl->off;
        DM_TRY(T->bk->buf_copy(home(T), up ? (void *)dev : (void *)host, up ? (void *)host : (void *)dev, bytes, up));
    }
    return DM_OK;
}

dm_status dm_trainer_push(dm_trainer *T) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        dm_train_slot *sl = &T->slot[k];
        if (!sl->dirty) continue;
        dm_backend_state *s = st(T, k / DM_NUM_PARAMS);
        DM_TRY(T->bk->upload(s, sl->tp, sl->p)); /* rounded to the storage type */
        if (T->d_master) DM_TRY(T->bk->buf_copy(s, T->d_master + sl->off, sl->p, (size_t)sl->n * sizeof(float), 1));
        DM_TRY(moments_copy(T, sl, 1));
        sl->dirty = 0;
    }
    return DM_OK;
}

dm_status dm_trainer_pull_slot(const dm_trainer *T, int k) {
    /* the host copies are a cache of the backend's state: filling them changes no state */
    dm_train_slot *sl = &((dm_trainer *)T)->slot[k];
    if (!sl->host_stale) return DM_OK;
    dm_backend_state *s = st(T, k / DM_NUM_PARAMS);
    if (T->d_master) DM_TRY(T->bk->buf_copy(s, sl->p, T->d_master + sl->off, (size_t)sl->n * sizeof(float), 0));
    else DM_TRY(T->bk->download(s, sl->tp, sl->p));
    if (sl->tg >= 0) DM_TRY(T->bk->download(s, sl->tg, sl->g));
    DM_TRY(moments_copy(T, sl, 0));
    sl->host_stale = 0;
    return DM_OK;
}

dm_status dm_trainer_pull(const dm_trainer *T, unsigned what) {
    dm_trainer *W = (dm_trainer *)T; /* a cache, as above */
    for (int k = 0; (what & DM_PULL_STATE) && k < T->nlayers * DM_NUM_PARAMS; k++)
        DM_TRY(dm_trainer_pull_slot(T, k));
    if ((what & DM_PULL_OUTPUT) && T->output_stale) {
        DM_TRY(dm_trainer_download(W, T->nlayers - 1, "output"));
        W->output_stale = 0;
    }
    return DM_OK;
}

dm_status dm_trainer_download(dm_trainer *T, int l, const char *name) {
    const int t = dm_layer_tensor_id(T->L[l], name);
    float *p = NULL;
    DM_TRY(dm_layer_tensor(T->L[l], name, &p, NULL, NULL));
    return T->bk->download(st(T, l), t, p);
}

dm_status dm_trainer_inputs(dm_trainer *T) {
    const size_t tokens = (size_t)T->cfg.batch * (size_t)T->cfg.seq, acts = tokens * (size_t)T->cfg.hidden;
    int t;
    float *x = NULL;
    if (!tensor_id(T, 0, "hidden_states", &t)) return dm_fail(DM_ERR_INTERNAL, "the first layer has no input");
    DM_TRY(dm_layer_tensor(T->L[0], "hidden_states", &x, NULL, NULL));
    DM_TRY(T->bk->upload(st(T, 0), t, x));
    /* the mask goes up once, to the first layer; the others copy it in the backend
     * (ordered there: no host wait per layer) */
    int t0 = -1;
    for (int l = 0; l < T->nlayers; l++) {
        float *m = NULL;
        if (!tensor_id(T, l, "attention_mask", &t)) return dm_fail(DM_ERR_INTERNAL, "layer %d has no attention_mask", l);
        DM_TRY(dm_layer_tensor(T->L[l], "attention_mask", &m, NULL, NULL));
        memcpy(m, T->mask, tokens * sizeof(float)); /* the host copies stay what the backend holds */
        if (l == 0) {
            t0 = t;
            DM_TRY(T->bk->upload(st(T, 0), t, m));
        } else {
            DM_TRY(T->bk->copy_tensor(st(T, l), t, st(T, 0), t0));
        }
    }
    DM_TRY(T->bk->buf_copy(home(T), T->d_mask, T->mask, tokens * sizeof(float), 1));
    return T->bk->buf_copy(home(T), T->d_target, T->target, acts * sizeof(float), 1);
}

dm_status dm_trainer_link(dm_trainer *T, int from, const char *src, int to, const char *dst) {
    int ts, td;
    if (!tensor_id(T, from, src, &ts) || !tensor_id(T, to, dst, &td))
        return dm_fail(DM_ERR_INTERNAL, "layer %d has no %s, or layer %d no %s", from, src, to, dst);
    return T->bk->copy_tensor(st(T, to), td, st(T, from), ts);
}

dm_status dm_trainer_loss(dm_trainer *T, float scale) {
    const int64_t tokens = T->cfg.batch * T->cfg.seq;
    int ty, tdy = -1;
    if (!tensor_id(T, T->nlayers - 1, "output", &ty) ||
        (!T->forward_only && !tensor_id(T, T->nlayers - 1, "grad_output", &tdy)))
        return dm_fail(DM_ERR_INTERNAL, "the last layer has no output");
    DM_TRY(T->bk->mse(st(T, T->nlayers - 1), ty, tdy, T->d_target, T->d_mask, tokens, T->cfg.hidden, scale,
                      T->d_partial, T->partial));
    T->output_stale = 1;
    return DM_OK;
}

dm_status dm_trainer_wait(dm_trainer *T) {
    for (int l = 0; l < T->nlayers; l++) DM_TRY(T->bk->sync(st(T, l)));
    return DM_OK;
}

void dm_trainer_grads_new(dm_trainer *T) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) T->slot[k].host_stale = 1;
}

static dm_status adamw(dm_trainer *T, int64_t step, double lr) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        const dm_train_slot *sl = &T->slot[k];
        dm_adamw_coef c;
        dm_adamw_coef_make(&c, lr, sl->decay ? T->adam.weight_decay : 0.0, &T->adam, step);
        DM_TRY(T->bk->adamw(st(T, k / DM_NUM_PARAMS), sl->tp, sl->tg, sl->n,
                            T->d_master ? T->d_master + sl->off : NULL, T->d_moments + sl->off,
                            T->d_moments + T->nparams + sl->off, &c));
    }
    /* the update is over when the backend is (its time is the optimizer's; errors surface here) */
    return dm_trainer_wait(T);
}

dm_status dm_trainer_adamw(dm_trainer *T, int64_t step, double lr) {
    dm_status s = adamw(T, step, lr);
    if (s != DM_OK) T->broken = step; /* some parameters may have taken the update, others not */
    return s;
}

void dm_trainer_state_replaced(dm_trainer *T) {
    for (int k = 0; k < T->nlayers * DM_NUM_PARAMS; k++) {
        T->slot[k].dirty = 1;
        T->slot[k].host_stale = 0;
    }
    T->broken = 0;
}

dm_status dm_trainer_broken(const dm_trainer *T) {
    return dm_fail(DM_ERR_BACKEND, "the GPU failed in the middle of AdamW's update %lld: some parameters took it, "
                   "others not, so this trainer can neither go on nor be saved; resume from the last "
                   "checkpoint (--resume)", (long long)T->broken);
}
