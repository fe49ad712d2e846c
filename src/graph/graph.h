/* graph.h: the dataflow graph of a training step. Tensors have named dimensions (one
 * letter each, design.md) and strides; operators come from ops.def in three classes
 * (their facts: ops.h).
 * A view tensor aliases part of a root tensor (a slice, with renamed letters). */
#ifndef DM_GRAPH_H
#define DM_GRAPH_H

#include <stdint.h>

#include "dmove.h"
#include "graph/ops.h"

#define DM_MAX_DIMS 6
#define DM_MAX_IN 7
#define DM_MAX_OUT 3
#define DM_NAME_LEN 48

typedef enum {
    DM_ROLE_ACT = 0,    /* intermediate: planned in the arena by liveness */
    DM_ROLE_INPUT,      /* supplied by the user before a step */
    DM_ROLE_PARAM,      /* parameter */
    DM_ROLE_PARAM_GRAD, /* gradient of a parameter */
    DM_ROLE_OUTPUT      /* result the user reads (output, grad_hidden_states) */
} dm_role;

typedef struct {
    char name[DM_NAME_LEN];
    int ndim;
    char letters[DM_MAX_DIMS + 1]; /* outermost first */
    int64_t size[DM_MAX_DIMS];
    int64_t stride[DM_MAX_DIMS]; /* elements */
    int64_t numel;
    int base;       /* root tensor of a view, or -1 for a root */
    int64_t offset; /* elements from the root's start (views) */
    char vmap[DM_MAX_DIMS + 1]; /* views: the map they were made with (dm_graph_view) */
    dm_role role;
    int pass;       /* 0 forward, 1 backward: which pass produces it */
    int requires_grad;
} dm_tensor;

typedef struct {
    dm_op_kind kind;
    char name[DM_NAME_LEN];
    int pass;
    int nin, nout;
    int in[DM_MAX_IN];
    int out[DM_MAX_OUT];
    /* contraction */
    char spec[64]; /* "bji,ui->bju": letters of in[0], in[1] -> out[0] */
    float alpha;
    /* element-wise / normalization: iteration space rows x cols */
    int64_t rows, cols;
    int stream;    /* dropout site */
    double p;      /* dropout probability */
    double eps;    /* LayerNorm */
    dm_act act;
    int causal;    /* MASK_ADD: also mask the keys after the query (column c > row's j) */
    int recomputed; /* a forward op again in the backward (dm_rewrite_recompute_attention) */
    int64_t nindex; /* EMBED, EMBED_BWD: rows N of the table (the T input, the X output) */
    int keymask;   /* ATTN, ATTN_BWD: in[3] is the padded layer's attention_mask (b, k) over
                    * whole sequences (ops.def), not their lengths */
} dm_op;

typedef struct {
    dm_tensor *t;
    int nt, cap_t;
    dm_op *op;
    int nop, cap_op;
    int64_t dim[26]; /* size of each dimension letter ('a' + n) */
    char live[4];    /* the leading rows a step may run fewer of (a backend's set_rows): "bj"
                      * an unpadded layer's tokens (b x j rows as one), "m" the MLM head's
                      * scored rows; "" none. Set by the builders. */
} dm_graph;

void dm_graph_init(dm_graph *g);
void dm_graph_free(dm_graph *g);
/* The functions below that return an id give -1 on failure, after dm_fail: their callers
 * return dm_last_status() (DM_ERR_OOM, or DM_ERR_INTERNAL for what the graph refuses).
 * A root tensor with the given letters (sizes from g->dim), row-major. Returns id >= 0 or
 * -1. */
int dm_graph_tensor(dm_graph *g, const char *name, const char *letters, dm_role role);
/* A view of root `base`: `map` has one char per root dimension: a letter names the view's
 * dimension (it may rename the root's), a digit fixes that dimension at that index. */
int dm_graph_view(dm_graph *g, int base, const char *name, const char *map);
/* Lays root tensor t out in memory in the order `layout` (a permutation of its letters,
 * outermost first); its views follow. The letters (the logical order) do not change. */
dm_status dm_graph_set_layout(dm_graph *g, int t, const char *layout);
/* The memory order of tensor t's letters, outermost first (size-1 letters in logical
 * order). out: DM_MAX_DIMS + 1 chars. */
void dm_tensor_layout(const dm_graph *g, int t, char *out);
/* Appends op; -1 with DM_ERR_INTERNAL (naming the op) for a kind ops.def lacks or operand
 * counts other than its row's, DM_ERR_OOM without memory. */
int dm_graph_op(dm_graph *g, const dm_op *op);
/* Appends a copy of tensor src's descriptor; returns the new id or -1. */
int dm_graph_clone(dm_graph *g, int src);
int dm_tensor_root(const dm_graph *g, int t);
/* flop of one op, and bytes it reads and writes (fp32, each tensor once). */
double dm_op_flop(const dm_graph *g, const dm_op *op);
/* Of a contraction-class op's flop, the row work beside its GEMMs (the fused decoder and
 * cross-entropy's: XENT's per logit forward, XENT_BWD's and a column sum's backward); 0
 * for the others. */
double dm_op_row_flop(const dm_op *op);
/* The same added to flop[] by the class of each row op it stands for (the attention's
 * mask, softmax and dropout; the cross-entropy and the column sum). */
void dm_op_row_flop_classes(const dm_op *op, double flop[DM_NUM_CLASSES]);
/* Elements op moves of its operand (io 0: input, 1: output; slot): the tensor's, but
 * rows x cols of an indexed (T) table: a gather reads the rows it selects, not the table. */
double dm_op_moves(const dm_graph *g, const dm_op *op, int io, int slot);
double dm_op_bytes(const dm_graph *g, const dm_op *op);

/* autodiff.c: appends the backward ops of every forward op, seeded with the gradient
 * `dy` of tensor `y`. Sets *dx_out to the gradient tensor of x; x < 0: gradients for the
 * parameters only (no op computes what flows back to the input alone), *dx_out = -1. */
dm_status dm_autodiff(dm_graph *g, int y, int dy, int x, int *dx_out);

#endif
