/* model.h: a whole BertForMaskedLM as segments (graph/bert.c, graph/encoder.c) chained on
 * one backend: the embeddings, the encoder layers and the MLM head, each a layer of its own
 * (its plan, arena and backend state), linked as the trainer links its layers: each output
 * copied into the next segment's input in the backend, each input gradient into the
 * segment before's output gradient. The decoder is tied to the word embeddings: the head
 * keeps a copy, refreshed from the table before each forward pass, and its gradient is
 * added into the table's after each backward pass.
 * The first step of issue 24's model; the optimizer, checkpoints and commands come on top
 * (the trainer's slots over these segments). */
#ifndef DM_TRAIN_MODEL_H
#define DM_TRAIN_MODEL_H

#include <stdint.h>

#include "dmove.h"
#include "graph/encoder.h"
#include "layer/layer_internal.h"
#include "plan/backend.h"

/* What sits on the encoder: nothing (the hidden states are the output: inference,
 * sentence embeddings), BertForMaskedLM's head, or BertForSequenceClassification's pooler
 * and classifier (sizes.classes labels; its parameters bert.pooler.dense.* and
 * classifier.*). */
typedef enum { DM_MODEL_HEAD_NONE = 0, DM_MODEL_HEAD_MLM, DM_MODEL_HEAD_CLS } dm_model_head;

typedef struct {
    dm_layer_config layer; /* the encoder layers' (batch, seq, sizes, dropout, seed, ...) */
    int layers;
    dm_model_head head;
    dm_bert_sizes sizes;   /* vocabulary, positions, token types, predictions scored (MLM),
                            * classes (classifier) */
    int64_t pad_id;        /* the padding token: its word row starts at 0, and takes no
                            * gradient from the lookup (the tied decoder's reaches it) */
} dm_model_config;

typedef struct dm_model {
    dm_model_config c;
    dm_layer_options opt;
    const dm_backend *bk;
    dm_backend_pool *pool;
    dm_layer_act_share share; /* forward only: the encoder layers' activations, held once */
    dm_layer *emb, **enc, *head; /* head NULL with DM_MODEL_HEAD_NONE */
    int counted;       /* masked positions (classifier: labelled sequences) the last batch
                        * scores (<= predictions) */
    int64_t correct;   /* of them, the argmax predicted in the last forward pass */
    int no_correct;    /* count no hits (correct stays -1): no logits brought to the host */
    int64_t dropped;   /* masked positions past a sequence's share the last batch left out
                        * (over every rank of dist) */
    dm_dist *dist;     /* data parallelism: the batch is this rank's part, and counts,
                        * losses and the losses' normaliser are the global batch's (NULL:
                        * alone) */
    int64_t counted_all; /* counted, summed over the ranks */
    double loss_norm;    /* 0: each row's loss weight 1 / counted_all (the batch's mean); > 0:
                          * 1 / loss_norm, a constant, so that micro-batches accumulated
                          * into one update weigh as one batch (the trainer rescales by
                          * loss_norm / the rows of all of them) */
    uint64_t seed_mix;   /* mixed into the dropout seeds (a rank's own masks; 0 on rank 0) */
    char **label_names; /* classifier: the classes' names (sizes.classes of them), or NULL */
    /* opt.unpad (issue 25): the encoder layers work on the real tokens alone. A batch's
     * tokens are packed from row 0 into the embeddings (their positions the padded
     * ones'; the embeddings too run on them alone, their dropout keyed by the padded
     * positions), the layers get the sequences' lengths (each attention_mask must then be
     * 1s then 0s), and the heads' rows point into the packed tokens */
    int64_t *off;      /* the last batch's first packed row per sequence (batch + 1) */
    float *hidden;     /* dm_model_hidden's padded copy of the packed hidden states */
} dm_model;

/* opt->forward_only: every segment without its backward (no gradients held; a model
 * for inference, whose dropout the config sets to 0). */
dm_status dm_model_new(dm_model **out, const dm_model_config *c, const dm_layer_options *opt);
void dm_model_free(dm_model *m);
/* A tensor by its Hugging Face name: bert.embeddings.*, bert.encoder.layer.<l>.*, and
 * the head's: cls.predictions.* (BertForMaskedLM) or bert.pooler.dense.* and
 * classifier.* (BertForSequenceClassification); with ".grad" for gradients. */
dm_status dm_model_tensor(dm_model *m, const char *name, float **data, int *ndim, int64_t shape[4]);
/* BERT's initialisation of every segment (each from its own seed derived from `seed`). */
dm_status dm_model_init_params(dm_model *m, uint64_t seed);
/* The batch: input_ids, token_type_ids (b * j each; NULL: all 0), attention_mask (NULL:
 * all 1) and labels (MLM: b * j, the original id at a masked position, negative elsewhere;
 * classifier: b, each sequence's class, negative: none; NULL, and ignored, without a
 * head). The classifier reads each sequence's first position ([CLS]).
 * Each sequence's first ceil(predictions / b) masked positions in order are scored
 * (predictions at most in all), the rest counted in m->dropped. Ids are checked against the vocabulary. */
dm_status dm_model_set_batch(dm_model *m, const int32_t *ids, const int32_t *types, const float *attention_mask,
                             const int32_t *labels);
/* Forward with step `step`'s dropout masks: the mean cross-entropy over the scored
 * positions into *loss (0 when none or without a head), how many of them the argmax
 * predicts into *correct (may be NULL). */
dm_status dm_model_forward(dm_model *m, int64_t step, double *loss, int64_t *correct);
/* After a forward: the last layer's output (b, j, hidden), brought to the host; the
 * pointer stays valid until the model is freed. */
dm_status dm_model_hidden(dm_model *m, const float **hidden);
/* Backward after a forward: every parameter's gradient (the tied table's summed). */
dm_status dm_model_backward(dm_model *m);
/* The same, calling after(ctx, k) as soon as segment k's backward pass has been handed
 * to the backend (k: the head nseg - 1, the layers l + 1, the embeddings 0, after the
 * tied decoder's gradient is added into the word table's). */
dm_status dm_model_backward_each(dm_model *m, dm_status (*after)(void *ctx, int k), void *ctx);

#endif
