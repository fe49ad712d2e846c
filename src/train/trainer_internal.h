/* trainer_internal.h: the dm_trainer struct, for the trainer's files and white-box tests. */
#ifndef DM_TRAINER_INTERNAL_H
#define DM_TRAINER_INTERNAL_H

#include <stdint.h>

#include "dmove.h"
#include "layer/layer_internal.h"
#include "plan/backend.h"

typedef struct {
    int seg;          /* the segment (T->L) that holds it */
    const char *pname;/* its name there (dm_layer_tensor's; lives as long as the segment) */
    float *p, *g;     /* the parameter and its gradient, in the layer's arena */
    int64_t n;        /* elements */
    int64_t off;      /* where it starts among all the parameters (master weights, sums) */
    int64_t moff;     /* where its moments start in each half of dm_trainer.moments; -1: kept
                       * by another rank (ZeRO stage 1) */
    int owner;        /* ZeRO stage 1: the rank that keeps its moments and updates it */
    int ndim;
    int64_t shape[2];
    int decay;        /* AdamW's weight decay applies (weights, not biases or LayerNorm) */
    int tp, tg;       /* the parameter's and the gradient's tensors in the layer's graph
                       * (tg -1 forward-only) */
    int host_stale;   /* its parameter, gradient and moments in the backend are newer (a
                       * step) than the host copies */
    int dirty;        /* the host's parameter or moments may be newer (handed out, loaded,
                       * initialised): sent to the backend before the next pass */
} dm_train_slot;

struct dm_trainer {
    dm_layer_config cfg;
    dm_layer_options opt;
    dm_optim_config optim;
    int nlayers;
    int forward_only;
    dm_layer **L;        /* the segments: a stack's layers; a whole model's embeddings,
                          * layers and head (the model's, not owned here) */
    int nseg;            /* segments in L (a stack: nlayers) */
    struct dm_model *model; /* a whole BertForMaskedLM (train/model.h), or NULL: a stack */
    dm_train_slot *slot; /* a stack: nlayers * DM_NUM_PARAMS, layer-major, in dm_param_names
                          * order; a model: every segment's parameters but the tied decoder */
    int nslots;
    int64_t nparams;
    float *moments;      /* exp_avg of every parameter (ZeRO: of this rank's shard), then
                          * exp_avg_sq: 2 * mcount */
    int64_t mcount;      /* the moments' parameters: nparams, or this rank's shard's (ZeRO) */
    int zero;            /* ZeRO stage (0, 1): 1 with several ranks shards the optimizer */
    float *moments_all;  /* a save under ZeRO: every slot's moments gathered (rank 0), or NULL */
    float *mask;         /* (b, j) */
    float *target;       /* (b, j, i) */
    double *partial;     /* (b * j) per-token loss sums */
    int64_t step;        /* updates taken */
    int micro;           /* micro-batches since the last update (accumulate > 1) */
    int64_t window_scored; /* a BERT: rows its loss counted (all ranks) in this update's micro-batches */
    int64_t update_scored; /* the same for the update being made (window_scored as it closed) */
    int64_t skipped;     /* a BERT: updates left out, nothing scored in their micro-batches */
    double grad_norm;    /* the last update's global gradient norm, or -1 */
    double *norms;       /* the host copy of d_norms */
    char load_note[1024]; /* the last load's head parameters the file lacked (dm_trainer_load_note) */
    char run_tag[128];   /* what the run trains on (dm_trainer_set_run_tag), in checkpoints */
    char run_tag_v1[128], run_tag_v1_note[256]; /* dm_trainer_set_run_tag_v1 */
    double secs[DM_TRAIN_NUM_PHASES];
    /* the stack on its layers' backend (trainer_state.c): the host copies above are a
     * cache of its state (on the CPU, whose memory is the host's, the state itself) */
    const dm_backend *bk;
    int output_stale; /* the backend's output is newer (a forward pass) */
    int64_t broken;   /* an update failed part way (its step): the state is mixed */
    dm_backend_pool *pool; /* the layers' shared buffers (the backend's pool_new), or NULL */
    dm_layer_act_share share; /* a forward-only stack's activations, held once */
    float *d_master;  /* fp32 master weights of every parameter (16-bit storage), or NULL */
    float *d_moments; /* the backend's exp_avg, then exp_avg_sq, as `moments` */
    float *d_target;  /* the backend's (b, j, i) */
    float *d_mask;    /* the backend's (b, j) */
    double *d_partial;/* the backend's (b * j) per-token loss sums */
    double *d_norms;  /* partial sums of norms, 2 * DM_NORM_PARTS per slot (plan/backend.h) */
    float *d_acc;     /* the gradient sums over micro-batches (accumulate > 1), or NULL */
    /* data parallelism (dmove.h: dm_trainer_set_dist) */
    dm_dist *dist;    /* the ranks this trainer is one of, or NULL: alone */
    int ranks;        /* dm_dist_size(dist): 1 alone */
    uint64_t seed_mix; /* mixed into the dropout seeds: each rank's masks its own (0 on rank 0) */
};

/* Slot sl's first (second: 0) or second moments, on the host or (dev) the backend; NULL
 * where another rank keeps them (ZeRO). */
static inline float *dm_slot_moments(const dm_trainer *T, const dm_train_slot *sl, int second, int dev) {
    float *base = dev ? T->d_moments : T->moments;
    return !base || sl->moff < 0 ? NULL : base + (second ? T->mcount : 0) + sl->moff;
}
/* The slot of layer l's parameter `param` (a BertLayer name), or -1. */
int dm_train_slot_find(const dm_trainer *T, int l, const char *param);

/* trainer_state.c: the stack's state on its layers' backend (buffers beside the plans,
 * kept by the first layer's state; on the CPU backend the host's buffers themselves),
 * and the host copies as a cache of it.
 * pool: the backend (dm_backend_find of opt.device) and its pool, before the layers;
 * pool_free: after them; pool_bytes: what it holds.
 * init: the buffers and tensor ids (after the layers); push: the dirty slots' host copies
 * to the backend; pull: to the host, of what `what` names, the slots whose backend state
 * is newer (DM_PULL_STATE: parameters, gradients, moments) or the output if newer
 * (DM_PULL_OUTPUT: the last layer's); pull_slot: one slot's; download: layer l's tensor
 * `name` to its host copy; inputs: the batch, masks and target to the backend; link:
 * tensor src of layer `from` into tensor dst of layer `to`; loss: the loss (with the
 * gradient unless forward-only), the per-token sums of squares into T->partial;
 * accumulate: every gradient into the sums (first: they start over); update: update `step`
 * of every parameter from the gradients (summed: from the sums), clipped and by the
 * configured optimizer (a failure part way marks the trainer broken; a gradient norm that
 * is not finite fails before any change). */
dm_status dm_trainer_pool(dm_trainer *T);
void dm_trainer_pool_free(dm_trainer *T);
size_t dm_trainer_pool_bytes(const dm_trainer *T);
dm_status dm_trainer_state_init(dm_trainer *T);
void dm_trainer_state_free(dm_trainer *T);
dm_status dm_trainer_push(dm_trainer *T);
enum { DM_PULL_STATE = 1u, DM_PULL_OUTPUT = 2u };
dm_status dm_trainer_pull(const dm_trainer *T, unsigned what);
dm_status dm_trainer_pull_slot(const dm_trainer *T, int k);
dm_status dm_trainer_download(dm_trainer *T, int l, const char *name);
dm_status dm_trainer_inputs(dm_trainer *T);
dm_status dm_trainer_link(dm_trainer *T, int from, const char *src, int to, const char *dst);
dm_status dm_trainer_loss(dm_trainer *T, float scale);
dm_status dm_trainer_accumulate(dm_trainer *T, int first);
/* After a micro-batch's backward that began at time t0 (omp_get_wtime): the gradients
 * accumulated, and every accumulate-th call update `step` (trainer.c). */
dm_status dm_trainer_after_backward(dm_trainer *T, int64_t step, double t0);
dm_status dm_trainer_update(dm_trainer *T, int64_t step, int summed);
/* Data parallelism: reduce_segment: the gradients of segment seg's slots handed to the
 * backend's reduction (right after its backward pass: the sums run while the segments
 * below go on), when the update that follows takes them directly (accumulate 1);
 * reduce_finish: with accumulate > 1 the sums over the micro-batches reduced now, then
 * every reduction waited for. Nothing alone. */
dm_status dm_trainer_reduce_segment(dm_trainer *T, int seg);
dm_status dm_trainer_reduce_finish(dm_trainer *T);
/* After a failure part way: waits for the collectives handed over (none left running
 * beside the caller's next ones), keeping the failure's message. */
void dm_trainer_reduce_drain(dm_trainer *T);
/* ZeRO stage 1, after the update: every slot's parameter (and master weights) from its
 * owner to every rank, waited for. */
dm_status dm_trainer_share_params(dm_trainer *T);
/* ZeRO stage 1, for a checkpoint: every slot's moments from its owner into *full (2 *
 * nparams, in slot order as without ZeRO; allocated on rank 0 only, NULL elsewhere). */
dm_status dm_trainer_gather_moments(dm_trainer *T, float **full);
/* Waits for every layer's work (a GPU's streams): the end of a pass of the stack. */
dm_status dm_trainer_wait(dm_trainer *T);
/* A backward pass ran: every slot's gradient (and soon parameter, moments) is newer in
 * the backend than on the host. */
void dm_trainer_grads_new(dm_trainer *T);
/* The parameters and moments were replaced on the host (initialised, loaded): every slot
 * dirty, none stale, the trainer not broken. */
void dm_trainer_state_replaced(dm_trainer *T);
/* The same after a start at update `step` (`skipped` of them without an update): the
 * count set, no micro-batch of an update taken yet. */
void dm_trainer_state_restarted(dm_trainer *T, int64_t step, int64_t skipped);
/* model.c: a BERT trainer's tensors by model name; its forward pass (the micro-batch's
 * dropout masks) and backward pass (the tied table's gradient summed). */
dm_status dm_trainer_bert_tensor(dm_trainer *T, const char *name, float **data, int *ndim, int64_t shape[4]);
dm_status dm_trainer_bert_forward(dm_trainer *T, int64_t micro, double *loss);
dm_status dm_trainer_bert_backward(dm_trainer *T);
/* ckpt.c: h (FNV-1a's basis to start) over n bytes, 8-byte words then the tail, each step
 * followed (ver >= 2) by an xor-shift carrying the high bits down: the checkpoints' checksum,
 * and what ranks compare of what each read (dm_train_data_fingerprint). */
uint64_t dm_train_hash_bytes(uint64_t h, const void *data, size_t n, int ver);
/* DM_ERR_BACKEND saying the trainer is broken (T->broken), and what to do. */
dm_status dm_trainer_broken(const dm_trainer *T);

#endif
