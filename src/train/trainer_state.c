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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hugealloc.h"
#include "core/status.h"
#include "dist/dist.h"
#include "layer/backends.h"
#include "layer/layer_internal.h"
#include "train/model.h"
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
    for (int l = 0; l < T->nseg; l++)
        if (T->L[l]->bk != B) return dm_fail(DM_ERR_INTERNAL, "segment %d of the trainer is on another backend", l);
    for (int k = 0; k < T->nslots; k++) {
        dm_train_slot *sl = &T->slot[k];
        const int l = sl->seg;
        const char *name = sl->pname;
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
    for (int l = 0; l < T->nseg; l++) T->L[l]->defer_wait = 1;
    dm_backend_state *h = home(T);
    const size_t tokens = (size_t)T->cfg.batch * (size_t)T->cfg.seq, acts = tokens * (size_t)T->cfg.hidden;
    const size_t np = (size_t)T->nparams;
    if (!T->model) { /* the stack's loss: the mean squared error against a target */
        DM_TRY(B->buf_new(h, acts * sizeof(float), T->target, (void **)&T->d_target, "the training targets"));
        DM_TRY(B->buf_new(h, tokens * sizeof(float), T->mask, (void **)&T->d_mask, "the attention mask"));
        DM_TRY(B->buf_new(h, tokens * sizeof(double), T->partial, (void **)&T->d_partial, "the loss"));
    }
    if (!T->forward_only) {
        size_t bytes;
        if (!dm_mul_ok((size_t)T->mcount, 2 * sizeof(float), &bytes))
            return dm_fail(DM_ERR_OOM, "%zu parameters: AdamW's moments do not fit in memory", np);
        DM_TRY(B->buf_new(h, bytes, T->moments, (void **)&T->d_moments, "the optimizer's moments"));
        if (T->opt.dtype != DM_DTYPE_FP32)
            DM_TRY(B->buf_new(h, np * sizeof(float), NULL, (void **)&T->d_master, "the fp32 master weights"));
        /* the partial sums of the gradient norms and LAMB's tensor norms, 2 x DM_NORM_PARTS
         * per slot (a few KiB a tensor) */
        const size_t nn = (size_t)T->nslots * 2 * DM_NORM_PARTS;
        if (!(T->norms = malloc(nn * sizeof(double)))) return dm_fail(DM_ERR_OOM, "out of memory for the norms");
        DM_TRY(B->buf_new(h, nn * sizeof(double), T->norms, (void **)&T->d_norms, "the gradient norms"));
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
    if (T->d_norms) B->buf_free(h, T->d_norms, T->norms);
    if (T->d_acc) B->buf_free(h, T->d_acc, NULL);
    free(T->norms);
    T->d_norms = NULL;
    T->d_acc = NULL;
    T->norms = NULL;
}

/* Slot k's moments between the host and the backend (up: to the backend). */
static dm_status moments_copy(const dm_trainer *T, const dm_train_slot *sl, int up) {
    if (!T->d_moments || sl->moff < 0) return DM_OK; /* none, or another rank's (ZeRO) */
    const size_t bytes = (size_t)sl->n * sizeof(float);
    for (int h = 0; h < 2; h++) {
        float *host = dm_slot_moments(T, sl, h, 0), *dev = dm_slot_moments(T, sl, h, 1);
        DM_TRY(T->bk->buf_copy(home(T), up ? (void *)dev : (void *)host, up ? (void *)host : (void *)dev, bytes, up));
    }
    return DM_OK;
}

dm_status dm_trainer_push(dm_trainer *T) {
    for (int k = 0; k < T->nslots; k++) {
        dm_train_slot *sl = &T->slot[k];
        if (!sl->dirty) continue;
        dm_backend_state *s = st(T, T->slot[k].seg);
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
    dm_backend_state *s = st(T, T->slot[k].seg);
    if (T->d_master) DM_TRY(T->bk->buf_copy(s, sl->p, T->d_master + sl->off, (size_t)sl->n * sizeof(float), 0));
    else DM_TRY(T->bk->download(s, sl->tp, sl->p));
    if (sl->tg >= 0) DM_TRY(T->bk->download(s, sl->tg, sl->g));
    DM_TRY(moments_copy(T, sl, 0));
    sl->host_stale = 0;
    return DM_OK;
}

dm_status dm_trainer_pull(const dm_trainer *T, unsigned what) {
    dm_trainer *W = (dm_trainer *)T; /* a cache, as above */
    for (int k = 0; (what & DM_PULL_STATE) && k < T->nslots; k++)
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
    for (int l = 0; l < T->nseg; l++) DM_TRY(T->bk->sync(st(T, l)));
    return DM_OK;
}

void dm_trainer_grads_new(dm_trainer *T) {
    for (int k = 0; k < T->nslots; k++) T->slot[k].host_stale = 1;
}

dm_status dm_trainer_accumulate(dm_trainer *T, int first) {
    if (!T->d_acc) {
        size_t bytes;
        if (!dm_mul_ok((size_t)T->nparams, sizeof(float), &bytes))
            return dm_fail(DM_ERR_OOM, "the gradient sums do not fit in memory");
        DM_TRY(T->bk->buf_new(home(T), bytes, NULL, (void **)&T->d_acc, "the gradient sums (--accumulate)"));
    }
    for (int k = 0; k < T->nslots; k++) {
        const dm_train_slot *sl = &T->slot[k];
        DM_TRY(T->bk->accumulate(st(T, T->slot[k].seg), sl->tg, sl->n, T->d_acc + sl->off, first));
    }
    return DM_OK;
}

/* The rank that takes slot sl's sums: its owner under ZeRO, else every rank (-1). */
static int sum_root(const dm_trainer *T, const dm_train_slot *sl) { return T->zero ? sl->owner : -1; }
/* Whether this rank updates slot sl (under ZeRO: the slots it owns; else every slot). */
static int updates(const dm_trainer *T, const dm_train_slot *sl) {
    return !T->zero || sl->owner == dm_dist_rank(T->dist);
}

/* (T->dist: more than one rank, or one forced onto this path, DMOVE_DIST_REDUCE_ALONE) */
dm_status dm_trainer_reduce_segment(dm_trainer *T, int seg) {
    if (!T->dist || T->optim.accumulate > 1) return DM_OK;
    for (int k = 0; k < T->nslots; k++) {
        const dm_train_slot *sl = &T->slot[k];
        if (sl->seg == seg) DM_TRY(T->bk->reduce(st(T, seg), sl->tg, NULL, sl->n, sum_root(T, sl), T->dist));
    }
    return DM_OK;
}

dm_status dm_trainer_reduce_finish(dm_trainer *T) {
    if (!T->dist) return DM_OK;
    if (T->optim.accumulate > 1) /* the sums, in the slots' order (every rank's the same) */
        for (int k = 0; k < T->nslots; k++) {
            const dm_train_slot *sl = &T->slot[k];
            DM_TRY(T->bk->reduce(st(T, sl->seg), -1, T->d_acc + sl->off, sl->n, sum_root(T, sl), T->dist));
        }
    return T->bk->reduce_wait(home(T), T->dist);
}

void dm_trainer_reduce_drain(dm_trainer *T) {
    if (!T->dist) return;
    const dm_status s = dm_last_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dm_last_error());
    (void)T->bk->reduce_wait(home(T), T->dist);
    dm_fail(s, "%s", msg); /* the failure the caller reports */
}

dm_status dm_trainer_share_params(dm_trainer *T) {
    for (int k = 0; k < T->nslots; k++) {
        const dm_train_slot *sl = &T->slot[k];
        DM_TRY(T->bk->bcast(st(T, sl->seg), sl->tp, NULL, sl->n, sl->owner, T->dist));
        if (T->d_master) DM_TRY(T->bk->bcast(st(T, sl->seg), -1, T->d_master + sl->off, sl->n, sl->owner, T->dist));
    }
    return T->bk->reduce_wait(home(T), T->dist);
}

dm_status dm_trainer_gather_moments(dm_trainer *T, float **full) {
    *full = NULL;
    const int me = dm_dist_rank(T->dist);
    int64_t most = 0;
    for (int k = 0; k < T->nslots; k++) most = T->slot[k].n > most ? T->slot[k].n : most;
    size_t bytes; /* rank 0: every moment; the others: one tensor's to pass on */
    if (!dm_mul_ok((size_t)(me == 0 ? T->nparams * 2 : most), sizeof(float), &bytes))
        return dm_fail(DM_ERR_OOM, "the moments do not fit in memory");
    float *buf = malloc(bytes ? bytes : 1);
    if (!buf) return dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB to gather the moments for the checkpoint",
                             (double)bytes / (1 << 30));
    dm_status s = DM_OK;
    for (int k = 0; s == DM_OK && k < T->nslots; k++)
        for (int h = 0; s == DM_OK && h < 2; h++) {
            const dm_train_slot *sl = &T->slot[k];
            float *own = dm_slot_moments(T, sl, h, 0); /* NULL but on its owner */
            float *at0 = me == 0 ? buf + (h ? T->nparams : 0) + sl->off : NULL;
            if (sl->owner == 0) { /* rank 0's own: no message */
                if (me == 0) memcpy(at0, own, (size_t)sl->n * sizeof(float));
                continue;
            }
            s = dm_dist_bcast(T->dist, me == sl->owner ? own : me == 0 ? at0 : buf, (size_t)sl->n * sizeof(float),
                              sl->owner, "the moments for the checkpoint");
        }
    if (s != DM_OK || me != 0) free(buf);
    else *full = buf;
    return s;
}

dm_status dm_trainer_set_zero(dm_trainer *T, int stage) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_zero: NULL trainer");
    if (stage != 0 && stage != 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "ZeRO stage %d: dmove shards the optimizer's state (stage 1), or not (0)",
                       stage);
    if (stage == T->zero || (stage == 1 && T->ranks < 2)) return DM_OK; /* alone: nothing to shard */
    if (stage == 0) return dm_fail(DM_ERR_UNSUPPORTED, "the optimizer's state is sharded already (ZeRO stage 1)");
    if (T->forward_only || !T->moments) return dm_fail(DM_ERR_INVALID_ARG, "a forward-only trainer has no optimizer");
    if (T->micro) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_zero: in the middle of an update");
    if (T->broken) return dm_trainer_broken(T);
    DM_TRY(dm_trainer_pull(T, DM_PULL_STATE)); /* the host's copies current: they go up again below */
    /* the slots in order, cut where the parameters' count crosses a rank's share */
    const int me = dm_dist_rank(T->dist), N = T->ranks;
    int64_t mine = 0;
    for (int k = 0; k < T->nslots; k++) {
        dm_train_slot *sl = &T->slot[k];
        const __int128 mid = (__int128)sl->off + sl->n / 2;
        const int r = (int)(mid * N / (T->nparams ? T->nparams : 1));
        sl->owner = r < N ? r : N - 1;
        if (sl->owner == me) mine += sl->n;
    }
    size_t bytes;
    if (!dm_mul_ok((size_t)(mine ? mine : 1), 2 * sizeof(float), &bytes)) return dm_fail(DM_ERR_OOM, "out of memory");
    float *m = dm_alloc_huge(bytes);
    if (!m) return dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB for this rank's moments", (double)bytes / (1 << 30));
    int64_t at = 0;
    for (int k = 0; k < T->nslots; k++) {
        dm_train_slot *sl = &T->slot[k];
        if (sl->owner != me) {
            sl->moff = -1;
            continue;
        }
        for (int h = 0; h < 2; h++)
            memcpy(m + (h ? mine : 0) + at, dm_slot_moments(T, sl, h, 0), (size_t)sl->n * sizeof(float));
        sl->moff = at;
        at += sl->n;
    }
    const dm_backend *B = T->bk;
    if (T->d_moments) B->buf_free(home(T), T->d_moments, T->moments);
    T->d_moments = NULL;
    free(T->moments);
    T->moments = m;
    T->mcount = mine;
    T->zero = 1;
    dm_trainer_state_replaced(T); /* everything up again before the next pass */
    return B->buf_new(home(T), bytes, T->moments, (void **)&T->d_moments, "this rank's optimizer moments");
}

/* The gradient each slot's update reads: the sums (accumulation), else its tensor. */
static const float *grad_buf(const dm_trainer *T, const dm_train_slot *sl, int summed) {
    return summed ? T->d_acc + sl->off : NULL;
}

/* The partial sums of `parts` per slot (T->d_norms, slot k's at k * stride) to the host,
 * each slot's added in order into sums[k * per + i] for i < parts / DM_NORM_PARTS. */
static dm_status fetch_norms(dm_trainer *T, size_t stride, int groups, double *sums) {
    const int ns = T->nslots;
    const size_t n = (size_t)ns * stride;
    /* the sums come from every segment's stream (a GPU's): all of them done first */
    DM_TRY(dm_trainer_wait(T));
    DM_TRY(T->bk->buf_copy(home(T), T->norms, T->d_norms, n * sizeof(double), 0));
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < groups; i++) {
            double s = 0.0;
            for (int q = 0; q < DM_NORM_PARTS; q++) s += T->norms[(size_t)k * stride + (size_t)i * DM_NORM_PARTS + q];
            sums[k * groups + i] = s;
        }
    return DM_OK;
}

/* The global norm of the (mean) gradient, into T->grad_norm; the factor the update applies
 * to the gradients as stored into *gscale. Fails, before any change, on a norm that is not
 * finite. */
static dm_status grad_scale(dm_trainer *T, int64_t step, int summed, double *gscale) {
    const int ns = T->nslots, acc = T->optim.accumulate;
    /* the sums of acc micro-batches: their mean; a BERT's rows weighed 1 / loss_norm each
     * (model.c, set_loss_norm): the mean over all the update's rows */
    const double norm_rows = T->model ? T->model->loss_norm : 0.0;
    const double base = acc > 1 && norm_rows > 0 && T->update_scored > 0 ? norm_rows / (double)T->update_scored
                                                                        : 1.0 / (double)acc;
    *gscale = base;
    if (!(T->optim.clip_norm > 0.0) && T->optim.kind != DM_OPT_LAMB) return DM_OK;
    for (int k = 0; k < ns; k++) {
        const dm_train_slot *sl = &T->slot[k];
        if (!updates(T, sl)) continue; /* ZeRO: its owner has the summed gradient */
        DM_TRY(T->bk->sumsq(st(T, T->slot[k].seg), sl->tg, grad_buf(T, sl, summed), sl->n,
                            T->d_norms + (size_t)k * DM_NORM_PARTS));
    }
    double *per = malloc((size_t)ns * sizeof(double));
    if (!per) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = fetch_norms(T, DM_NORM_PARTS, 1, per);
    double total = 0.0;
    for (int k = 0; k < ns; k++)
        if (updates(T, &T->slot[k])) total += per[k];
    free(per);
    DM_TRY(s);
    if (T->zero) DM_TRY(dm_dist_sum_f64(T->dist, &total, 1, "the gradient norm")); /* every shard's */
    const double norm = sqrt(total) * base;
    if (!isfinite(norm))
        return dm_fail(DM_ERR_INVALID_ARG, "the gradient norm is %g: the parameters were not updated (update "
                       "%lld); lower the learning rate (--lr), clip the gradients (--clip-norm) or check the "
                       "inputs", norm, (long long)step);
    T->grad_norm = norm;
    /* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1 */
    if (T->optim.clip_norm > 0.0) {
        const double c = T->optim.clip_norm / (norm + 1e-6);
        if (c < 1.0) *gscale *= c;
    }
    return DM_OK;
}

/* LAMB: the moments and norms of every tensor, then each one's step scaled by its trust
 * ratio ||w|| / ||u|| (tensors that take weight decay; NVIDIA's FusedLAMB's default). */
static dm_status lamb(dm_trainer *T, int64_t step, double lr, double gscale, int summed) {
    const int ns = T->nslots;
    for (int k = 0; k < ns; k++) {
        const dm_train_slot *sl = &T->slot[k];
        if (!updates(T, sl)) continue;
        dm_optim_coef c;
        dm_optim_coef_make(&c, lr, sl->decay ? T->optim.weight_decay : 0.0, gscale, &T->optim, step);
        DM_TRY(T->bk->optimize(st(T, T->slot[k].seg), DM_PASS_LAMB_MOMENTS, sl->tp, sl->tg, sl->n,
                               T->d_master ? T->d_master + sl->off : NULL, dm_slot_moments(T, sl, 0, 1),
                               dm_slot_moments(T, sl, 1, 1), grad_buf(T, sl, summed), &c,
                               T->d_norms + (size_t)k * 2 * DM_NORM_PARTS));
    }
    double *norm = malloc((size_t)ns * 2 * sizeof(double));
    if (!norm) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = fetch_norms(T, 2 * DM_NORM_PARTS, 2, norm);
    for (int k = 0; s == DM_OK && k < ns; k++) {
        const dm_train_slot *sl = &T->slot[k];
        if (!updates(T, sl)) continue;
        const double wn = sqrt(norm[2 * k]), un = sqrt(norm[2 * k + 1]);
        double ratio = sl->decay && T->optim.weight_decay > 0.0 && wn > 0.0 && un > 0.0 ? wn / un : 1.0;
        if (!isfinite(ratio)) ratio = 1.0; /* cannot be: the gradient norm was finite */
        dm_optim_coef c;
        dm_optim_coef_make(&c, lr, sl->decay ? T->optim.weight_decay : 0.0, gscale, &T->optim, step);
        c.lr_ratio = (float)(lr * ratio);
        s = T->bk->optimize(st(T, T->slot[k].seg), DM_PASS_LAMB_APPLY, sl->tp, sl->tg, sl->n,
                            T->d_master ? T->d_master + sl->off : NULL, dm_slot_moments(T, sl, 0, 1),
                            dm_slot_moments(T, sl, 1, 1), NULL, &c, NULL);
    }
    free(norm);
    return s;
}

static dm_status adamw(dm_trainer *T, int64_t step, double lr, double gscale, int summed) {
    for (int k = 0; k < T->nslots; k++) {
        const dm_train_slot *sl = &T->slot[k];
        if (!updates(T, sl)) continue;
        dm_optim_coef c;
        dm_optim_coef_make(&c, lr, sl->decay ? T->optim.weight_decay : 0.0, gscale, &T->optim, step);
        DM_TRY(T->bk->optimize(st(T, T->slot[k].seg), DM_PASS_ADAMW, sl->tp, sl->tg, sl->n,
                               T->d_master ? T->d_master + sl->off : NULL, dm_slot_moments(T, sl, 0, 1),
                               dm_slot_moments(T, sl, 1, 1), grad_buf(T, sl, summed), &c, NULL));
    }
    return DM_OK;
}

dm_status dm_trainer_update(dm_trainer *T, int64_t step, int summed) {
    double gscale;
    DM_TRY(grad_scale(T, step, summed, &gscale)); /* nothing changed yet when it fails */
    const double lr = dm_optim_lr(&T->optim, step); /* the schedule: by step */
    /* the moments' bias correction: by the updates they took (steps left out, with nothing
     * scored, took none: as torch.optim counts a step GradScaler skips) */
    const int64_t taken = step - T->skipped;
    dm_status s = T->optim.kind == DM_OPT_LAMB ? lamb(T, taken, lr, gscale, summed) : adamw(T, taken, lr, gscale, summed);
    /* the update is over when the backend is (its time is the optimizer's; errors surface here) */
    if (s == DM_OK) s = dm_trainer_wait(T);
    if (s == DM_OK && T->zero) s = dm_trainer_share_params(T); /* each shard from its rank */
    if (s != DM_OK) T->broken = step; /* some parameters may have taken the update, others not */
    return s;
}

void dm_trainer_state_replaced(dm_trainer *T) {
    for (int k = 0; k < T->nslots; k++) {
        T->slot[k].dirty = 1;
        T->slot[k].host_stale = 0;
    }
    T->broken = 0;
}

void dm_trainer_state_restarted(dm_trainer *T, int64_t step, int64_t skipped) {
    T->step = step;
    T->skipped = skipped;
    T->micro = 0;
    T->window_scored = 0;
    dm_trainer_state_replaced(T);
}

dm_status dm_trainer_broken(const dm_trainer *T) {
    return dm_fail(DM_ERR_BACKEND, "the backend failed in the middle of the optimizer's update %lld: some parameters took it, "
                   "others not, so this trainer can neither go on nor be saved; resume from the last "
                   "checkpoint (--resume)", (long long)T->broken);
}
