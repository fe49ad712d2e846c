/* ops.c: the operator table (ops.def) as arrays, and its queries (ops.h). */
#include "graph/ops.h"

#include <string.h>

typedef struct {
    const char *name;
    dm_op_class cls;
    double flop;
    const char *in, *out; /* operand letters (ops.def) */
    int rowred, pointwise;
    unsigned params, keeps;
} op_row;

static const op_row k_ops[DM_NUM_OPS] = {
#define DM_OP(kind, name, cls, flop, in, out, rowred, pw, params, keeps) \
    {name, cls, flop, in, out, rowred, pw, params, keeps},
#include "graph/ops.def"
#undef DM_OP
};

static const op_row *row_of(dm_op_kind k) { return (unsigned)k < DM_NUM_OPS ? &k_ops[k] : NULL; }

const char *dm_op_kind_name(dm_op_kind k) { return row_of(k) ? k_ops[k].name : "?"; }
dm_op_class dm_op_kind_class(dm_op_kind k) { return k_ops[k].cls; }
double dm_op_kind_flop(dm_op_kind k) { return k_ops[k].flop; }
int dm_op_nin(dm_op_kind k) { return row_of(k) ? (int)strlen(k_ops[k].in) : 0; }
int dm_op_nout(dm_op_kind k) { return row_of(k) ? (int)strlen(k_ops[k].out) : 0; }

static dm_arg_kind arg_of(const char *sig, int slot) {
    if (slot < 0 || slot >= (int)strlen(sig)) return DM_ARG_FULL;
    switch (sig[slot]) {
    case 'V': return DM_ARG_COLVEC;
    case 'G': return DM_ARG_GROUPED;
    case 'S': return DM_ARG_ROWSCALAR;
    case 'A': return DM_ARG_COLACC;
    case 'T': return DM_ARG_INDEXED;
    case 'X': return DM_ARG_SCATTER;
    default: return DM_ARG_FULL;
    }
}

dm_arg_kind dm_arg_in(dm_op_kind k, int slot) { return row_of(k) ? arg_of(k_ops[k].in, slot) : DM_ARG_FULL; }
dm_arg_kind dm_arg_out(dm_op_kind k, int slot) { return row_of(k) ? arg_of(k_ops[k].out, slot) : DM_ARG_FULL; }
int dm_op_row_reductions(dm_op_kind k) { return row_of(k) ? k_ops[k].rowred : 0; }
int dm_op_reduces_rows(dm_op_kind k) { return dm_op_row_reductions(k) > 0; }
int dm_op_reduces_cols(dm_op_kind k) { return row_of(k) && strchr(k_ops[k].out, 'A') != NULL; }
int dm_op_pointwise(dm_op_kind k) { return row_of(k) ? k_ops[k].pointwise : 0; }
unsigned dm_op_params(dm_op_kind k) { return row_of(k) ? k_ops[k].params : 0; }
unsigned dm_op_keeps(dm_op_kind k) { return row_of(k) ? k_ops[k].keeps : 0; }

int dm_op_alone(dm_op_kind k) {
    return row_of(k) && k_ops[k].cls == DM_CLASS_CONTRACTION && k != DM_OP_CONTRACT;
}

int64_t dm_linear_xent_numel(dm_op_kind k, int out, int slot, int64_t m, int64_t e, int64_t v) {
    const int bwd = k == DM_OP_LINEAR_XENT_BWD;
    if ((k != DM_OP_LINEAR_XENT && !bwd) || slot < 0 || slot >= (out ? 3 : bwd ? 6 : 4)) return -1;
    const int64_t in[6] = {m * e, v * e, v, m, m, m}, outs[2][3] = {{m, m, m}, {m * e, v * e, v}};
    return out ? outs[bwd][slot] : in[slot];
}

int dm_op_indexed(dm_op_kind k) {
    return row_of(k) && (strchr(k_ops[k].in, 'T') != NULL || strchr(k_ops[k].out, 'X') != NULL);
}

int dm_op_index_slot(dm_op_kind k) {
    if (!dm_op_indexed(k)) return -1;
    const char *s = strchr(k_ops[k].in, 'S');
    return s ? (int)(s - k_ops[k].in) : -1;
}

int64_t dm_index_count_bad(const float *idx, int64_t m, int64_t n) {
    int64_t bad = 0;
    for (int64_t e = 0; e < m; e++) bad += dm_index_row(idx[e], n) < 0;
    return bad;
}

const char *dm_xent_mode_name(dm_xent_mode x) {
    return x == DM_XENT_FUSED ? "on" : x == DM_XENT_UNFUSED ? "off" : x == DM_XENT_AUTO ? "auto" : "?";
}

int dm_xent_mode_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "auto")) return DM_XENT_AUTO;
    if (!strcmp(s, "on") || !strcmp(s, "fused")) return DM_XENT_FUSED;
    if (!strcmp(s, "off") || !strcmp(s, "unfused")) return DM_XENT_UNFUSED;
    return -1;
}
