/* ops.h: the operator table's types and queries; the table is ops.def, one line per
 * operator kind. What the passes and backends need to know about an operator's shape of
 * work comes from here, not from switches of their own: its class and flop, its operands
 * (how many, and how a row kernel addresses each), its row and column reductions, whether
 * it is pointwise, which fields of dm_op it reads, and what its gradient rule keeps of
 * the forward pass. A backend's own switch over the kinds picks its kernel. */
#ifndef DM_GRAPH_OPS_H
#define DM_GRAPH_OPS_H

#include <stdint.h>

#include "dmove.h"

/* How an operand of a row op is addressed, per op kind and operand slot (the letters of
 * ops.def's in and out columns). A contraction's operands are FULL: whole tensors, laid
 * out as their tensors say, addressed through its einsum. */
typedef enum {
    DM_ARG_FULL = 0, /* F (rows, cols): this row */
    DM_ARG_COLVEC,   /* V (cols): broadcast over rows */
    DM_ARG_GROUPED,  /* G (G, cols): row r uses row r / (rows / G) (the attention mask) */
    DM_ARG_ROWSCALAR,/* S (rows): one value per row (LayerNorm statistics) */
    DM_ARG_COLACC,   /* A (cols): accumulated over rows (bias / LayerNorm parameter grads) */
    DM_ARG_INDEXED,  /* T (N, cols): row r reads row idx[r] (embedding tables: a gather) */
    DM_ARG_SCATTER   /* X (N, cols): row n sums the rows r with idx[r] == n (their gradient) */
} dm_arg_kind;

/* The params column: fields of dm_op a kind reads besides its operands and rows x cols. */
enum {
    DM_OPP_SPEC = 1u,    /* spec, alpha: the einsum */
    DM_OPP_DROPOUT = 2u, /* p, stream: the Philox dropout site */
    DM_OPP_ACT = 4u,     /* act */
    DM_OPP_EPS = 8u,     /* eps */
    DM_OPP_CAUSAL = 16u  /* causal */
};

/* The keeps column: operand slots of the forward op that its gradient rule reads. */
#define DM_KEEP_IN(slot) (1u << (slot))
#define DM_KEEP_OUT(slot) (1u << (8 + (slot)))

typedef enum {
#define DM_OP(kind, ...) DM_OP_##kind,
#include "graph/ops.def"
#undef DM_OP
    DM_NUM_OPS
} dm_op_kind;

const char *dm_op_kind_name(dm_op_kind k);
dm_op_class dm_op_kind_class(dm_op_kind k);
/* flop per point of the iteration space (dm_op_flop multiplies by its size). */
double dm_op_kind_flop(dm_op_kind k);
/* Operand counts, and how slot `slot` is addressed (slots beyond the count: FULL). */
int dm_op_nin(dm_op_kind k);
int dm_op_nout(dm_op_kind k);
dm_arg_kind dm_arg_in(dm_op_kind k, int slot);
dm_arg_kind dm_arg_out(dm_op_kind k, int slot);
/* Row reductions one after another (0: none); 1 if there is any. */
int dm_op_row_reductions(dm_op_kind k);
int dm_op_reduces_rows(dm_op_kind k);
/* 1 if an output is a column reduction (DM_ARG_COLACC: summed over all rows). */
int dm_op_reduces_cols(dm_op_kind k);
/* 1 if each output element c of the op depends on input element c alone (bias, adds,
 * mask, dropout, activation and their backward): its kernels may write an output over
 * an input (the memory planner's in-place outputs). Not the row reductions. */
int dm_op_pointwise(dm_op_kind k);
/* 1 if an operand is indexed rows (T) or a table accumulated by index (X): the op reads
 * or writes rows other than its own, so it never writes over an input, its T operand
 * comes from memory (not from a fused producer) and an X output is a group of its own. */
int dm_op_indexed(dm_op_kind k);
/* The input slot whose values index the rows of the op's T input or X output (its first
 * S input), or -1 for a kind without one. */
int dm_op_index_slot(dm_op_kind k);
/* 1 for a kind that runs as a group of its own with every operand a whole tensor in
 * memory, through a kernel of its own: a contraction-class kind other than CONTRACT (the
 * fused decoder and cross-entropy, LINEAR_XENT and its backward). */
int dm_op_alone(dm_op_kind k);
/* The elements operand `slot` (an output with out != 0) of LINEAR_XENT or LINEAR_XENT_BWD
 * holds for m rows, e inner and v vocabulary columns (ops.def: in t (m,e), W (v,e), bias
 * (v), labels (m) [, lse (m), dloss (m)]; out loss, lse, pred (m each) or dt (m,e), dW
 * (v,e), dbias (v)); -1 for another kind or slot. Every backend's kernel checks its
 * operands against it. */
int64_t dm_linear_xent_numel(dm_op_kind k, int out, int slot, int64_t m, int64_t e, int64_t v);
/* DM_OPP_* bits: the fields of dm_op the kind reads. */
unsigned dm_op_params(dm_op_kind k);
/* DM_KEEP_IN / DM_KEEP_OUT bits: what its gradient rule reads of the forward op (0 for
 * the kinds with no gradient rule: the backward ones). */
unsigned dm_op_keeps(dm_op_kind k);

/* The row an index value selects in a table of n rows, or -1: indices (and XENT's labels)
 * are integer values stored as floats, exact up to 2^24; a value outside [0, n), not an
 * integer, or NaN selects nothing (a T row reads as zeros, an X output gets nothing from
 * it, a cross-entropy row is ignored). Shared by every backend and the references. */
static inline int64_t dm_index_row(float v, int64_t n) {
    return v >= 0.0f && v < (float)n && v < 16777216.0f && v == (float)(int64_t)v ? (int64_t)v : -1;
}
/* How many of the m values select no row of a table of n rows: a check for a step's
 * index tensors before it runs (ids from a tokenizer of another vocabulary). */
int64_t dm_index_count_bad(const float *idx, int64_t m, int64_t n);

#endif
