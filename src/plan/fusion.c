/* fusion.c: the fusion pass. Element-wise and normalization operators that share an
 * iteration space (rows x cols, the same pass) and are connected producer -> consumer
 * are grouped, so a group makes one pass over memory and its intermediates stay in
 * per-thread scratch rows. A merge is refused when it would create a cycle between
 * groups (an outside op both depending on the group and feeding the candidate), or when
 * the candidate reads a column reduction the group is still accumulating, or a table it
 * gathers from (EMBED's T input: read from memory); a scatter into a table (EMBED_BWD's
 * X output) is a group of its own. A contraction
 * goes to BLAS whole, alone, or (second pass) in a batched group with the row groups it
 * feeds or is fed by, or (third pass, CPU plans) with an independent batched group that
 * reads the same input. Groups are then ordered topologically, a row group right after the
 * group whose output it reads when it can.
 *
 * The passes, in order, over one context (fuse_ctx) that owns every scratch array:
 *   index_producers   which ops write each root tensor
 *   find_ancestors    each op's ancestors (and a check of the graph's topological order)
 *   form_row_groups   greedy grouping in op order (fused: row ops with their producers)
 *   merge_gathers     fused: a lookup from memory (EMBED by input ids) into its readers' group
 *   merge_batched     fused: batched contractions with the row groups around them
 *   merge_siblings    fused, siblings: a lone batched contraction into a batched group
 *                     that reads the same input
 *   renumber_groups   dense group ids after the merges
 *   order_groups      the plan's groups and op order
 * then dm_plan_memory (memplan.c) lays the tensors out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "plan/plan.h"

typedef uint64_t word;
#define WBITS 64

static int bit(const word *s, int i) { return (int)((s[i / WBITS] >> (i % WBITS)) & 1u); }
static void set(word *s, int i) { s[i / WBITS] |= (word)1 << (i % WBITS); }

/* Batch letters of a contraction: in both operands and the output, in the output's order.
 * Returns their count (0 if none) and the product of their sizes in *nb. */
static int batch_letters(const dm_graph *g, const dm_op *op, char out[4], int64_t *nb) {
    char a[16], b[16], c[16];
    int n = 0;
    *nb = 1;
    if (op->kind != DM_OP_CONTRACT ||
        sscanf(op->spec, "%15[a-z],%15[a-z]->%15[a-z]", a, b, c) != 3)
        return 0;
    for (const char *p = c; *p; p++)
        if (strchr(a, *p) && strchr(b, *p)) {
            if (n >= 3) return 0;
            out[n++] = *p;
            *nb *= g->dim[*p - 'a'];
        }
    out[n] = 0;
    return *nb > 1 ? n : 0;
}

/* Does root tensor t start with the batch letters, so that batch index bi's slice is the
 * contiguous block bi * numel / nb? */
static int batch_prefixed(const dm_graph *g, int t, const char *batch) {
    size_t n = strlen(batch);
    return g->t[t].base < 0 && strncmp(g->t[t].letters, batch, n) == 0;
}

/* Is op o's output `t` a column reduction (a vector accumulated over all rows)? */
static int is_colreduce_out(const dm_op *o, int slot) {
    return dm_arg_out(o->kind, slot) == DM_ARG_COLACC;
}

/* Does op o write a table by index (an X output: EMBED_BWD)? Such an op is a group of its
 * own: its output rows are not its rows. So is a kind with a kernel of its own over whole
 * tensors (dm_op_alone: the fused decoder and cross-entropy). */
static int scatters(const dm_op *o) {
    if (dm_op_alone(o->kind)) return 1;
    for (int s = 0; s < o->nout; s++)
        if (dm_arg_out(o->kind, s) == DM_ARG_SCATTER) return 1;
    return 0;
}

/* Do the groups of gid (ids below ng) form a DAG? Group G precedes H when an op of H has
 * an ancestor in G. seen: ng ints of scratch. */
static int groups_acyclic(const int *gid, int n, int ng, const word *anc, int nw, int *seen) {
    /* repeatedly retire a group none of whose ops has an ancestor in a group not retired */
    for (int G = 0; G < ng; G++) seen[G] = 0;
    for (int round = 0; round < ng; round++) {
        int progress = 0;
        for (int G = 0; G < ng; G++) {
            if (seen[G]) continue;
            int ready = 1;
            for (int o = 0; o < n && ready; o++) {
                if (gid[o] != G) continue;
                for (int a = 0; a < n && ready; a++)
                    if (gid[a] != G && !seen[gid[a]] && bit(anc + (size_t)o * nw, a)) ready = 0;
            }
            if (ready) seen[G] = progress = 1;
        }
        if (!progress) break;
    }
    for (int G = 0; G < ng; G++)
        if (!seen[G]) return 0;
    return 1;
}

/* The pass's state. Group ids are below ng (at most one per op); every array is sized
 * for n ops or n groups up front and freed by ctx_free alone. */
typedef struct {
    const dm_graph *g;
    int fused, siblings;
    int n, nt, nw;        /* ops, tensors, words of an op set */
    int **prod;           /* per root tensor: the ops that write it, in op order */
    int *nprod;
    word *anc;            /* per op: the set of its ancestors */
    word *mem;            /* per group: the set of its ops */
    int *gid;             /* per op: its group */
    int ng;               /* groups made (ids in use are below it) */
    char (*gbatch)[4];    /* per group: its batch letters ("" none) */
    int64_t *gnb;         /* per group: its batch size (> 1: a batched group) */
    char (*nbl)[4];       /* renumber_groups: the same, by new id */
    int64_t *nnb;
    int *map;             /* renumber_groups: old id -> new */
    int *seen;            /* merge_siblings: groups_acyclic's scratch */
    int *indeg;           /* order_groups: per group, its predecessors not yet placed */
    int *placed;          /* order_groups: per group, placed */
} fuse_ctx;

static void ctx_free(fuse_ctx *c) {
    if (c->prod)
        for (int t = 0; t < c->nt; t++) free(c->prod[t]);
    free(c->prod);
    free(c->nprod);
    free(c->anc);
    free(c->mem);
    free(c->gid);
    free(c->gbatch);
    free(c->gnb);
    free(c->nbl);
    free(c->nnb);
    free(c->map);
    free(c->seen);
    free(c->indeg);
    free(c->placed);
    memset(c, 0, sizeof *c);
}

static dm_status ctx_init(fuse_ctx *c, const dm_graph *g, int fused, int siblings) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->fused = fused;
    c->siblings = siblings;
    c->n = g->nop;
    c->nt = g->nt;
    c->nw = (c->n + WBITS - 1) / WBITS;
    const size_t n = (size_t)(c->n > 0 ? c->n : 1), sets = n * (size_t)(c->nw > 0 ? c->nw : 1);
    c->prod = calloc((size_t)(c->nt > 0 ? c->nt : 1), sizeof(int *));
    c->nprod = calloc((size_t)(c->nt > 0 ? c->nt : 1), sizeof(int));
    c->anc = calloc(sets, sizeof(word));
    c->mem = calloc(sets, sizeof(word));
    c->gid = malloc(sizeof(int) * n);
    c->gbatch = calloc(n, 4);
    c->gnb = calloc(n, sizeof(int64_t));
    c->nbl = calloc(n, 4);
    c->nnb = calloc(n, sizeof(int64_t));
    c->map = malloc(sizeof(int) * n);
    c->seen = malloc(sizeof(int) * n);
    c->indeg = calloc(n, sizeof(int));
    c->placed = calloc(n, sizeof(int));
    if (!c->prod || !c->nprod || !c->anc || !c->mem || !c->gid || !c->gbatch || !c->gnb || !c->nbl || !c->nnb ||
        !c->map || !c->seen || !c->indeg || !c->placed)
        return dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
    return DM_OK;
}

/* --- index_producers, find_ancestors ------------------------------------------------ */

static dm_status index_producers(fuse_ctx *c) {
    const dm_graph *g = c->g;
    for (int o = 0; o < c->n; o++)
        for (int k = 0; k < g->op[o].nout; k++) {
            int r = dm_tensor_root(g, g->op[o].out[k]);
            int *q = realloc(c->prod[r], sizeof(int) * (size_t)(c->nprod[r] + 1));
            if (!q) return dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
            c->prod[r] = q;
            q[c->nprod[r]++] = o;
        }
    return DM_OK;
}

/* ancestors (ops are in topological order) */
static dm_status find_ancestors(fuse_ctx *c) {
    const dm_graph *g = c->g;
    const int nw = c->nw;
    for (int o = 0; o < c->n; o++) {
        word *a = c->anc + (size_t)o * nw;
        for (int k = 0; k < g->op[o].nin; k++) {
            int r = dm_tensor_root(g, g->op[o].in[k]);
            for (int m = 0; m < c->nprod[r]; m++) {
                int p = c->prod[r][m];
                if (p >= o)
                    return dm_fail(DM_ERR_INTERNAL, "graph not in topological order at %s", g->op[o].name);
                const word *pa = c->anc + (size_t)p * nw;
                for (int w = 0; w < nw; w++) a[w] |= pa[w];
                set(a, p);
            }
        }
    }
    return DM_OK;
}

/* --- form_row_groups ---------------------------------------------------------------- */

/* May op join group G? No input produced outside G by an op that depends on G; no input
 * that is a column reduction being accumulated inside G; no indexed (T) input made in G
 * (a gather reads other rows than its own: the table must be in memory). */
static int row_join_ok(const fuse_ctx *c, const dm_op *op, int G) {
    const dm_graph *g = c->g;
    const int nw = c->nw;
    const word *gm = c->mem + (size_t)G * nw;
    int okm = 1;
    for (int k2 = 0; k2 < op->nin && okm; k2++) {
        int r2 = dm_tensor_root(g, op->in[k2]);
        for (int m2 = 0; m2 < c->nprod[r2] && okm; m2++) {
            int q = c->prod[r2][m2];
            if (bit(gm, q) && dm_arg_in(op->kind, k2) == DM_ARG_INDEXED) okm = 0;
            if (bit(gm, q)) {
                for (int s = 0; s < g->op[q].nout; s++)
                    if (dm_tensor_root(g, g->op[q].out[s]) == r2 && is_colreduce_out(&g->op[q], s)) okm = 0;
                continue;
            }
            const word *qa = c->anc + (size_t)q * nw;
            for (int w = 0; w < nw; w++)
                if (qa[w] & gm[w]) okm = 0;
        }
    }
    return okm;
}

/* The group of a producer of op o's inputs that o joins (a row op of the same pass and
 * iteration space), or -1. */
static int row_group_of(const fuse_ctx *c, int o) {
    const dm_graph *g = c->g;
    const dm_op *op = &g->op[o];
    if (scatters(op)) return -1;
    for (int k = 0; k < op->nin; k++) {
        int r = dm_tensor_root(g, op->in[k]);
        for (int m = 0; m < c->nprod[r]; m++) {
            int p = c->prod[r][m], G = c->gid[p];
            const dm_op *po = &g->op[p];
            if (po->kind == DM_OP_CONTRACT || po->pass != op->pass || scatters(po)) continue;
            if (po->rows != op->rows || po->cols != op->cols) continue;
            if (row_join_ok(c, op, G)) return G;
        }
    }
    return -1;
}

/* greedy grouping in op order */
static void form_row_groups(fuse_ctx *c) {
    c->ng = 0;
    for (int o = 0; o < c->n; o++) {
        int chosen = -1;
        if (c->fused && c->g->op[o].kind != DM_OP_CONTRACT) chosen = row_group_of(c, o);
        if (chosen < 0) chosen = c->ng++;
        c->gid[o] = chosen;
        set(c->mem + (size_t)chosen * c->nw, o);
    }
}

/* --- merge_gathers ------------------------------------------------------------------ */

/* Fused: a gather from memory alone (an EMBED none of whose inputs any op writes: a table
 * looked up by input ids) joins the row group that reads all it writes, when that group's
 * readers are row ops of its pass and iteration space reading it row for row. The greedy
 * pass joins a consumer to one producer only: the word embedding's group takes the adds
 * and the LayerNorm, and the position and token-type lookups would write their rows to
 * memory for it to read back. Nothing depends on such a gather but its readers, so no
 * cycle can arise. */
static void merge_gathers(fuse_ctx *c) {
    const dm_graph *g = c->g;
    for (int o = 0; o < c->n; o++) {
        const dm_op *op = &g->op[o];
        const int H = c->gid[o];
        if (!dm_op_indexed(op->kind) || scatters(op)) continue;
        int ok = 1, G = -1;
        for (int k = 0; k < op->nin && ok; k++) ok = c->nprod[dm_tensor_root(g, op->in[k])] == 0;
        for (int q = 0; q < c->n && ok; q++) {
            if (q == o) continue;
            ok = c->gid[q] != H;
            const dm_op *qo = &g->op[q];
            for (int k = 0; k < qo->nin && ok; k++) {
                int reads = 0;
                for (int s = 0; s < op->nout; s++) reads |= dm_tensor_root(g, qo->in[k]) == dm_tensor_root(g, op->out[s]);
                if (!reads) continue;
                if (qo->kind == DM_OP_CONTRACT || qo->pass != op->pass || qo->rows != op->rows ||
                    qo->cols != op->cols || dm_arg_in(qo->kind, k) != DM_ARG_FULL || (G >= 0 && c->gid[q] != G))
                    ok = 0;
                G = c->gid[q];
            }
        }
        if (!ok || G < 0) continue;
        c->gid[o] = G;
        set(c->mem + (size_t)G * c->nw, o);
        memset(c->mem + (size_t)H * c->nw, 0, sizeof(word) * (size_t)c->nw);
    }
}

/* --- merge_batched ------------------------------------------------------------------ */

/* Every member of groups G and H: a contraction with batch bl of size nb, or a row op
 * whose rows split over it and that reduces no columns. */
static int batch_members_ok(const fuse_ctx *c, int G, int H, const char *bl, int64_t nb) {
    int okm = 1;
    for (int q = 0; q < c->n && okm; q++) {
        if (c->gid[q] != G && c->gid[q] != H) continue;
        const dm_op *qo = &c->g->op[q];
        if (qo->kind == DM_OP_CONTRACT) {
            int64_t qnb;
            char qb[4];
            okm = batch_letters(c->g, qo, qb, &qnb) && qnb == nb && !strcmp(qb, bl);
        } else {
            okm = qo->rows % nb == 0 && !dm_op_reduces_cols(qo->kind) && !dm_op_indexed(qo->kind) &&
                  !dm_op_alone(qo->kind);
        }
    }
    return okm;
}

/* Is there a path G -> z -> H through an op z outside both? */
static int path_outside(const fuse_ctx *c, int G, int H) {
    const int nw = c->nw;
    const word *gm = c->mem + (size_t)G * nw;
    for (int z = 0; z < c->n; z++) {
        if (c->gid[z] == G || c->gid[z] == H) continue;
        const word *za = c->anc + (size_t)z * nw;
        int z_after_g = 0, h_after_z = 0;
        for (int w = 0; w < nw; w++) z_after_g |= (za[w] & gm[w]) != 0;
        for (int q = 0; q < c->n && z_after_g && !h_after_z; q++)
            if (c->gid[q] == H && bit(c->anc + (size_t)q * nw, z)) h_after_z = 1;
        if (z_after_g && h_after_z) return 1;
    }
    return 0;
}

/* Group H (op o's) joins group G (op p's, p writes o's input r) when they make one batched
 * group; 1 if it did. */
static int try_batch_merge(fuse_ctx *c, int p, int o, int r) {
    const dm_graph *g = c->g;
    const int G = c->gid[p], H = c->gid[o];
    if (G == H || g->op[p].pass != g->op[o].pass) return 0;
    /* exactly one side is batched, or both with the same batch */
    const char *bl = c->gnb[G] > 1 ? c->gbatch[G] : c->gbatch[H];
    int64_t nb = c->gnb[G] > 1 ? c->gnb[G] : c->gnb[H];
    if (nb <= 1) return 0;
    if ((c->gnb[G] > 1 && c->gnb[H] > 1) && (c->gnb[G] != c->gnb[H] || strcmp(c->gbatch[G], c->gbatch[H])))
        return 0;
    if (!batch_prefixed(g, r, bl)) return 0;
    if (!batch_members_ok(c, G, H, bl, nb) || path_outside(c, G, H)) return 0;
    for (int q = 0; q < c->n; q++)
        if (c->gid[q] == H) {
            c->gid[q] = G;
            set(c->mem + (size_t)G * c->nw, q);
        }
    memset(c->mem + (size_t)H * c->nw, 0, sizeof(word) * (size_t)c->nw);
    memmove(c->gbatch[G], bl, 4);
    c->gnb[G] = nb;
    c->gnb[H] = 0;
    return 1;
}

/* Second pass (fused only): batched groups. A contraction batched over letters (b, h)
 * merges with the row groups it feeds or is fed by, when the tensor between them is laid
 * out batch-outermost and the rows split evenly over the batch: the group then runs per
 * batch index and the tensors it keeps inside are per-thread tiles (one (b, h) slice: the
 * attention scores never reach memory). */
static void merge_batched(fuse_ctx *c) {
    const dm_graph *g = c->g;
    for (int o = 0; o < c->n; o++) {
        int64_t nb;
        char bl[4];
        if (batch_letters(g, &g->op[o], bl, &nb)) {
            memcpy(c->gbatch[c->gid[o]], bl, 4);
            c->gnb[c->gid[o]] = nb;
        }
    }
    for (int o = 0; o < c->n; o++) {
        const dm_op *op = &g->op[o];
        for (int k = 0; k < op->nin; k++) {
            int r = dm_tensor_root(g, op->in[k]);
            if (op->in[k] != r) continue; /* slices of other tensors: not tile-able */
            for (int m = 0; m < c->nprod[r]; m++) try_batch_merge(c, c->prod[r][m], o, r);
        }
    }
}

/* --- merge_siblings ----------------------------------------------------------------- */

/* A batched group other than H, of op o's pass and H's batch, that reads one of o's
 * inputs and is independent of o (o has no ancestor in it, none of its ops has o as an
 * ancestor); -1 if none. */
static int sibling_of(const fuse_ctx *c, int o, int H) {
    const dm_graph *g = c->g;
    const dm_op *op = &g->op[o];
    const int nw = c->nw;
    for (int q = 0; q < c->n; q++) {
        const int Q = c->gid[q];
        if (Q == H || g->op[q].pass != op->pass || c->gnb[Q] != c->gnb[H] || strcmp(c->gbatch[Q], c->gbatch[H]))
            continue;
        int shares = 0;
        for (int k = 0; k < op->nin && !shares; k++)
            for (int k2 = 0; k2 < g->op[q].nin && !shares; k2++)
                shares = dm_tensor_root(g, op->in[k]) == dm_tensor_root(g, g->op[q].in[k2]);
        if (!shares) continue;
        const word *qm = c->mem + (size_t)Q * nw, *oa = c->anc + (size_t)o * nw;
        int indep = 1;
        for (int w = 0; w < nw && indep; w++) indep = (oa[w] & qm[w]) == 0;
        for (int z = 0; z < c->n && indep; z++)
            if (c->gid[z] == Q && bit(c->anc + (size_t)z * nw, o)) indep = 0;
        if (indep) return Q;
    }
    return -1;
}

/* Third pass (siblings, the CPU executor's plans): a lone batched contraction joins a
 * batched group of the same pass and batch that reads one of its inputs, when neither
 * depends on the other (their order within an item is free) and the groups stay a DAG.
 * Run per item, the shared input's slice is read from cache the second time: the
 * attention's dV = P^T dctx reads P and dctx where the group before read them. */
static void merge_siblings(fuse_ctx *c) {
    for (int o = 0; o < c->n; o++) {
        const int H = c->gid[o];
        if (c->g->op[o].kind != DM_OP_CONTRACT || c->gnb[H] <= 1) continue;
        int alone = 1;
        for (int q = 0; q < c->n && alone; q++) alone = q == o || c->gid[q] != H;
        if (!alone) continue;
        const int G = sibling_of(c, o, H);
        if (G < 0) continue;
        /* op by op the two are independent; a cycle through a third group's ops (o before
         * one of them, another before G) is ruled out on the groups themselves */
        c->gid[o] = G;
        if (!groups_acyclic(c->gid, c->n, c->ng, c->anc, c->nw, c->seen)) {
            c->gid[o] = H;
            continue;
        }
        set(c->mem + (size_t)G * c->nw, o);
        memset(c->mem + (size_t)H * c->nw, 0, sizeof(word) * (size_t)c->nw);
        c->gnb[H] = 0;
    }
}

/* --- renumber_groups ---------------------------------------------------------------- */

/* renumber the groups densely after the merges, in the order of their first ops */
static void renumber_groups(fuse_ctx *c) {
    for (int G = 0; G < c->ng; G++) c->map[G] = -1;
    int m = 0;
    for (int o = 0; o < c->n; o++)
        if (c->map[c->gid[o]] < 0) {
            c->map[c->gid[o]] = m;
            memcpy(c->nbl[m], c->gbatch[c->gid[o]], 4);
            c->nnb[m] = c->gnb[c->gid[o]];
            m++;
        }
    memset(c->mem, 0, sizeof(word) * (size_t)c->n * (size_t)c->nw);
    for (int o = 0; o < c->n; o++) {
        c->gid[o] = c->map[c->gid[o]];
        set(c->mem + (size_t)c->gid[o] * c->nw, o);
    }
    char (*tb)[4] = c->gbatch;
    int64_t *tn = c->gnb;
    c->gbatch = c->nbl;
    c->gnb = c->nnb;
    c->nbl = tb;
    c->nnb = tn;
    c->ng = m;
}

/* --- order_groups ------------------------------------------------------------------- */

/* Does group G depend on group H (some op of G has an ancestor in H)? */
static int depends(const fuse_ctx *c, int G, int H) {
    const int nw = c->nw;
    const word *gm = c->mem + (size_t)G * nw, *hm = c->mem + (size_t)H * nw;
    for (int o = 0; o < c->n; o++)
        if (bit(gm, o))
            for (int w = 0; w < nw; w++)
                if (c->anc[(size_t)o * nw + w] & hm[w]) return 1;
    return 0;
}

/* Is group G row ops only, one of them reading what group `last` wrote? */
static int rows_reading(const fuse_ctx *c, int G, int last) {
    const dm_graph *g = c->g;
    int rows_only = 1, reads_last = 0;
    for (int q = 0; q < c->n && rows_only; q++) {
        if (c->gid[q] != G) continue;
        rows_only = g->op[q].kind != DM_OP_CONTRACT;
        for (int k = 0; k < g->op[q].nin; k++) {
            int r = dm_tensor_root(g, g->op[q].in[k]);
            for (int m = 0; m < c->nprod[r]; m++) reads_last |= c->gid[c->prod[r][m]] == last;
        }
    }
    return rows_only && reads_last;
}

/* The next group to run after `last` (-1: none yet), or -1 if none is ready. The forward
 * pass first: forward() runs exactly the pass-0 groups, and liveness is planned in this
 * order. Fused: a ready row group (no contraction) that reads what the group just run
 * wrote goes next, while that is still in cache (the activation's backward right after
 * the GEMM that makes its dy, before the weight gradient's GEMM); otherwise the group
 * with the smallest first op. */
static int pick_group(const fuse_ctx *c, int last) {
    const dm_graph *g = c->g;
    for (int pass = 0; pass < 2; pass++) {
        for (int o = 0; o < c->n && c->fused && last >= 0; o++) {
            int G = c->gid[o];
            if (c->placed[G] || c->indeg[G] != 0 || g->op[o].pass != pass) continue;
            if (rows_reading(c, G, last)) return G;
        }
        for (int o = 0; o < c->n; o++)
            if (!c->placed[c->gid[o]] && c->indeg[c->gid[o]] == 0 && g->op[o].pass == pass) return c->gid[o];
    }
    return -1;
}

/* Group G's ops, in op order, from plan->order[*pos] on as plan group `step`. */
static void emit_group(const fuse_ctx *c, dm_plan *plan, int step, int G, int *pos) {
    const dm_graph *g = c->g;
    dm_group *gr = &plan->groups[step];
    gr->first = *pos;
    gr->cls = DM_CLASS_ELEMENTWISE;
    for (int o = 0; o < c->n; o++) {
        if (c->gid[o] != G) continue;
        plan->order[(*pos)++] = o;
        gr->nops++;
        gr->pass = g->op[o].pass;
        gr->rows = g->op[o].rows;
        gr->cols = g->op[o].cols;
        dm_op_class cl = dm_op_kind_class(g->op[o].kind);
        if (cl == DM_CLASS_CONTRACTION) gr->cls = cl;
        else if (cl == DM_CLASS_NORMALIZATION && gr->cls != DM_CLASS_CONTRACTION) gr->cls = cl;
        if (dm_op_kind_class(g->op[o].kind) != DM_CLASS_CONTRACTION && g->op[o].cols > plan->max_cols)
            plan->max_cols = (int)g->op[o].cols;
    }
    gr->nbatch = c->gnb[G] > 1 ? c->gnb[G] : 0;
    memcpy(gr->batch, c->gbatch[G], 4);
}

/* group DAG and topological order (ties: smallest first op) */
static dm_status order_groups(fuse_ctx *c, dm_plan *plan) {
    plan->order = malloc(sizeof(int) * (size_t)(c->n > 0 ? c->n : 1));
    plan->groups = calloc((size_t)(c->ng > 0 ? c->ng : 1), sizeof(dm_group));
    if (!plan->order || !plan->groups) return dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
    for (int G = 0; G < c->ng; G++)
        for (int H = 0; H < c->ng; H++)
            if (H != G) c->indeg[G] += depends(c, G, H);
    int pos = 0, last = -1; /* last: the group placed just before */
    for (int step = 0; step < c->ng; step++) {
        const int pick = pick_group(c, last);
        if (pick < 0) return dm_fail(DM_ERR_INTERNAL, "fusion produced a cycle between groups");
        c->placed[pick] = 1;
        last = pick;
        emit_group(c, plan, step, pick, &pos);
        for (int G = 0; G < c->ng; G++)
            if (!c->placed[G]) c->indeg[G] -= depends(c, G, pick);
    }
    plan->ngroups = c->ng;
    return DM_OK;
}

dm_status dm_plan_build(const dm_graph *g, int fused, int siblings, int no_reuse, dm_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->g = g;
    fuse_ctx c;
    dm_status st = ctx_init(&c, g, fused, siblings);
    if (st == DM_OK) st = index_producers(&c);
    if (st == DM_OK) st = find_ancestors(&c);
    if (st == DM_OK) {
        form_row_groups(&c);
        if (fused) merge_gathers(&c);
        if (fused) merge_batched(&c);
        if (fused && siblings) merge_siblings(&c);
        renumber_groups(&c);
        st = order_groups(&c, plan);
    }
    ctx_free(&c);
    plan->no_reuse = no_reuse;
    if (st == DM_OK) st = dm_plan_memory(plan, no_reuse);
    if (st != DM_OK) dm_plan_free(plan);
    return st;
}
