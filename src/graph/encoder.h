/* encoder.h: the BERT encoder layer builder (Hugging Face BertLayer semantics; post-LN,
 * or pre-LN; optionally causal)
 * and the table of tensors a user can read and write by name. */
#ifndef DM_ENCODER_H
#define DM_ENCODER_H

#include "graph/graph.h"

#define DM_MAX_EXPORTS 48
#define DM_NUM_PARAMS 16

typedef struct {
    char name[64];
    int tensor;     /* graph tensor (a root or a view) */
    int ndim;
    int64_t shape[4];
    int is_param;   /* one of the 16 parameters (not its gradient) */
} dm_export;

typedef struct {
    dm_export e[DM_MAX_EXPORTS];
    int n;
    int x, mask, y, dy, dx; /* tensor ids; dy, dx are -1 when forward only */
    int nfwd_ops;           /* ops [0, nfwd_ops) are the forward pass */
} dm_encoder;

/* input_grad 0: no gradient for hidden_states (grad_hidden_states does not exist; the
 * backward pass skips the contraction and the addition only it needs).
 * unpad 1: the layer over packed tokens (issue 25): its b x j rows of hidden_states,
 * output and their gradients hold the real tokens of the batch's sequences one after
 * another (sequence s from row off[s], the sum of the lengths before it), the input
 * seq_lengths (b) instead of attention_mask, and attention one ATTN op per pass over each
 * sequence's own length (ops.def); every other op is the padded layer's. A step runs on
 * the first sum(lengths) rows alone (the backends' set_rows): the rows after them are
 * not read, and the layer's outputs there are set to 0.
 * attn_op 1 (a padded layer, not causal): the attention's scores, mask, softmax, dropout
 * and context as one ATTN op over the attention_mask (ops.def's keymask), for a backend
 * whose fused kernels take it (plan/backend.h's attn_op); the same inputs, outputs and
 * results as the padded layer's ops, to rounding. */
dm_status dm_build_encoder(dm_graph *g, const dm_layer_config *cfg, int forward_only, int input_grad, int unpad,
                           int attn_op, dm_encoder *enc);
extern const char *const dm_param_names[DM_NUM_PARAMS];

/* The segments of a whole BERT beside its encoder layers (graph/bert.c), each its own
 * graph with dm_encoder's exports (Hugging Face names):
 * embeddings: input_ids, position_ids, token_type_ids (b, j) in, output (b, j, i) =
 *   dropout(LayerNorm(word[input_ids] + position[position_ids] + token_type[...])); its
 *   parameters embeddings.{word,position,token_type}_embeddings.weight and
 *   embeddings.LayerNorm.{weight,bias}; backward from grad_output (no input gradient).
 * MLM head: hidden_states (b, j, i) in, the `predictions` rows of it at masked_positions
 *   (flat indices b * j + j') through BertForMaskedLM's head (dense, act, LayerNorm,
 *   decoder with bias) into logits (predictions, vocab) and the cross-entropy against
 *   labels (negative: the row counts not), per row: loss (predictions); backward from
 *   loss_weights (predictions: the mean's 1 / count on the rows that count) into
 *   grad_hidden_states. Its parameters cls.predictions.transform.dense.{weight,bias},
 *   cls.predictions.transform.LayerNorm.{weight,bias}, cls.predictions.decoder.weight
 *   (tied to the word embeddings: a copy the model keeps equal) and cls.predictions.bias.
 * Indices (ids, positions, labels) are integers held as floats (exact below 2^24). */
/* Classification head (BertForSequenceClassification's pooler and classifier): hidden_states
 *   (b, j, i) in, the rows at cls_positions (b: flat indices of each sequence's [CLS]) through
 *   bert.pooler.dense.{weight,bias} and tanh into pooled (b, i), dropout (site 5), and
 *   classifier.{weight,bias} into logits (b, classes); the cross-entropy against labels (b;
 *   negative: the sequence counts not) per sequence: loss (b); backward from loss_weights
 *   (b) into grad_hidden_states. */
typedef enum { DM_SEG_ENCODER = 0, DM_SEG_EMBEDDINGS, DM_SEG_MLM_HEAD, DM_SEG_CLS_HEAD } dm_segment;
typedef struct {
    int64_t vocab, positions, types; /* the tables' rows: vocab_size, max_position_embeddings,
                                      * type_vocab_size */
    int64_t predictions;             /* MLM head: masked positions per batch it scores */
    dm_xent_mode xent;               /* MLM head: DM_XENT_FUSED builds the decoder and the
                                      * cross-entropy as one op (LINEAR_XENT); otherwise
                                      * (AUTO: the model resolves it first) the GEMM, the
                                      * bias add and XENT, the logits written whole */
    int64_t classes;                 /* classification head: num_labels (2 or more) */
} dm_bert_sizes;
dm_status dm_build_embeddings(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, int forward_only,
                              dm_encoder *enc);
dm_status dm_build_mlm_head(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, int forward_only,
                            dm_encoder *enc);
dm_status dm_build_cls_head(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, int forward_only,
                            dm_encoder *enc);

#endif
