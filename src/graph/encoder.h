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
 * backward pass skips the contraction and the addition only it needs). */
dm_status dm_build_encoder(dm_graph *g, const dm_layer_config *cfg, int forward_only, int input_grad,
                           dm_encoder *enc);
extern const char *const dm_param_names[DM_NUM_PARAMS];

#endif
