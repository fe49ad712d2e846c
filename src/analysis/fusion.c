/* fusion.c: the fusion pass. Element-wise and normalization operators that share an
 * iteration space (rows x cols, the same pass) and are connected producer -> consumer
 * are grouped, so a group makes one pass over memory and its intermediates stay in
 * per-thread scratch rows. A merge is refused when it would create a cycle between
 * groups (an outside op both depending on the group and feeding the candidate), or when
 * the candidate reads a column reduction the group is still accumulating. A contraction
 * goes to BLAS whole, alone, or (second pass) in a batched group with the row groups it
 * feeds or is fed by, or (third pass, CPU plans) with an independent batched group that
 * reads the same input. Groups are then ordered topologically, a row group right after the
 * group whose output it reads when it can. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "cpu/contract.h"
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

dm_status dm_plan_build(const dm_graph *g, int fused, int siblings, int no_reuse, dm_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->g = g;
    int n = g->nop, nt = g->nt, nw = (n + WBITS - 1) / WBITS;
    dm_status st = DM_OK;
    int *gid = malloc(sizeof(int) * (size_t)n);
    int **prod = calloc((size_t)nt, sizeof(int *)); /* producers of each root */
    int *nprod = calloc((size_t)nt, sizeof(int));
    word *anc = calloc((size_t)n * (size_t)nw, sizeof(word));   /* ancestors of each op */
    word *mem = calloc((size_t)n * (size_t)nw, sizeof(word));   /* members of each group */
    int *indeg = calloc((size_t)n, sizeof(int));
    if (!gid || !prod || !nprod || !anc || !mem || !indeg) {
        st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
        goto done;
    }
    for (int o = 0; o < n; o++)
        for (int k = 0; k < g->op[o].nout; k++) {
            int r = dm_tensor_root(g, g->op[o].out[k]);
            int *q = realloc(prod[r], sizeof(int) * (size_t)(nprod[r] + 1));
            if (!q) {
                st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
                goto done;
            }
            prod[r] = q;
            q[nprod[r]++] = o;
        }
    /* ancestors (ops are in topological order) */
    for (int o = 0; o < n; o++) {
        word *a = anc + (size_t)o * nw;
        for (int k = 0; k < g->op[o].nin; k++) {
            int r = dm_tensor_root(g, g->op[o].in[k]);
            for (int m = 0; m < nprod[r]; m++) {
                int p = prod[r][m];
                if (p >= o) {
                    st = dm_fail(DM_ERR_INTERNAL, "graph not in topological order at %s",
                                 g->op[o].name);
                    goto done;
                }
                const word *pa = anc + (size_t)p * nw;
                for (int w = 0; w < nw; w++) a[w] |= pa[w];
                set(a, p);
            }
        }
    }
    /* greedy grouping in op order */
    int ng = 0;
    for (int o = 0; o < n; o++) {
        const dm_op *op = &g->op[o];
        int chosen = -1;
        if (fused && op->kind != DM_OP_CONTRACT) {
            for (int k = 0; k < op->nin && chosen < 0; k++) {
                int r = dm_tensor_root(g, op->in[k]);
                for (int m = 0; m < nprod[r] && chosen < 0; m++) {
                    int p = prod[r][m], G = gid[p];
                    const dm_op *po = &g->op[p];
                    if (po->kind == DM_OP_CONTRACT || po->pass != op->pass) continue;
                    if (po->rows != op->rows || po->cols != op->cols) continue;
                    const word *gm = mem + (size_t)G * nw;
                    int okm = 1;
                    /* no input produced outside G by an op that depends on G; no input that
                     * is a column reduction being accumulated inside G */
                    for (int k2 = 0; k2 < op->nin && okm; k2++) {
                        int r2 = dm_tensor_root(g, op->in[k2]);
                        for (int m2 = 0; m2 < nprod[r2] && okm; m2++) {
                            int q = prod[r2][m2];
                            if (bit(gm, q)) {
                                for (int s = 0; s < g->op[q].nout; s++)
                                    if (dm_tensor_root(g, g->op[q].out[s]) == r2 &&
                                        is_colreduce_out(&g->op[q], s))
                                        okm = 0;
                                continue;
                            }
                            const word *qa = anc + (size_t)q * nw;
                            for (int w = 0; w < nw; w++)
                                if (qa[w] & gm[w]) okm = 0;
                        }
                    }
                    if (okm) chosen = G;
                }
            }
        }
        if (chosen < 0) chosen = ng++;
        gid[o] = chosen;
        set(mem + (size_t)chosen * nw, o);
    }
    /* Second pass (fused only): batched groups. A contraction batched over letters
     * (b, h) merges with the row groups it feeds or is fed by, when the tensor between
     * them is laid out batch-outermost and the rows split evenly over the batch: the
     * group then runs per batch index and the tensors it keeps inside are per-thread
     * tiles (one (b, h) slice: the attention scores never reach memory). */
    char (*gbatch)[4] = calloc((size_t)n, 4);
    int64_t *gnb = calloc((size_t)n, sizeof(int64_t));
    if (!gbatch || !gnb) {
        free(gbatch);
        free(gnb);
        st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
        goto done;
    }
    for (int o = 0; o < n && fused; o++) {
        int64_t nb;
        char bl[4];
        if (batch_letters(g, &g->op[o], bl, &nb)) {
            memcpy(gbatch[gid[o]], bl, 4);
            gnb[gid[o]] = nb;
        }
    }
    for (int o = 0; o < n && fused; o++) {
        const dm_op *op = &g->op[o];
        for (int k = 0; k < op->nin; k++) {
            int r = dm_tensor_root(g, op->in[k]);
            if (op->in[k] != r) continue; /* slices of other tensors: not tile-able */
            for (int m = 0; m < nprod[r]; m++) {
                int p = prod[r][m], G = gid[p], H = gid[o];
                if (G == H || g->op[p].pass != op->pass) continue;
                /* exactly one side is batched, or both with the same batch */
                const char *bl = gnb[G] > 1 ? gbatch[G] : gbatch[H];
                int64_t nb = gnb[G] > 1 ? gnb[G] : gnb[H];
                if (nb <= 1) continue;
                if ((gnb[G] > 1 && gnb[H] > 1) && (gnb[G] != gnb[H] || strcmp(gbatch[G], gbatch[H])))
                    continue;
                if (!batch_prefixed(g, r, bl)) continue;
                /* every member of both groups: a contraction with this batch, or a row op
                 * whose rows split over it and that reduces no columns */
                int okm = 1;
                for (int q = 0; q < n && okm; q++) {
                    if (gid[q] != G && gid[q] != H) continue;
                    const dm_op *qo = &g->op[q];
                    if (qo->kind == DM_OP_CONTRACT) {
                        int64_t qnb;
                        char qb[4];
                        okm = batch_letters(g, qo, qb, &qnb) && qnb == nb && !strcmp(qb, bl);
                    } else {
                        okm = qo->rows % nb == 0 && !dm_op_reduces_cols(qo->kind);
                    }
                }
                /* no path G -> z -> H through an op z outside both */
                const word *gm = mem + (size_t)G * nw;
                for (int z = 0; z < n && okm; z++) {
                    if (gid[z] == G || gid[z] == H) continue;
                    const word *za = anc + (size_t)z * nw;
                    int z_after_g = 0, h_after_z = 0;
                    for (int w = 0; w < nw; w++) z_after_g |= (za[w] & gm[w]) != 0;
                    for (int q = 0; q < n && z_after_g && !h_after_z; q++)
                        if (gid[q] == H && bit(anc + (size_t)q * nw, z)) h_after_z = 1;
                    if (z_after_g && h_after_z) okm = 0;
                }
                if (!okm) continue;
                for (int q = 0; q < n; q++)
                    if (gid[q] == H) {
                        gid[q] = G;
                        set(mem + (size_t)G * nw, q);
                    }
                memset(mem + (size_t)H * nw, 0, sizeof(word) * (size_t)nw);
                memcpy(gbatch[G], bl, 4);
                gnb[G] = nb;
                gnb[H] = 0;
            }
        }
    }
    /* Third pass (siblings, the CPU executor's plans): a lone batched contraction joins a
     * batched group of the same pass and batch that reads one of its inputs, when neither
     * depends on the other (their order within an item is free) and the groups stay a DAG.
     * Run per item, the shared input's slice is read from cache the second time: the
     * attention's dV = P^T dctx reads P and dctx where the group before read them. */
    int *seen = siblings && fused ? malloc(sizeof(int) * (size_t)(ng > 0 ? ng : 1)) : NULL;
    if (siblings && fused && !seen) {
        free(gbatch);
        free(gnb);
        st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
        goto done;
    }
    for (int o = 0; o < n && fused && siblings; o++) {
        const dm_op *op = &g->op[o];
        const int H = gid[o];
        if (op->kind != DM_OP_CONTRACT || gnb[H] <= 1) continue;
        int alone = 1;
        for (int q = 0; q < n && alone; q++) alone = q == o || gid[q] != H;
        if (!alone) continue;
        int G = -1;
        for (int q = 0; q < n && G < 0; q++) {
            const int Q = gid[q];
            if (Q == H || g->op[q].pass != op->pass || gnb[Q] != gnb[H] || strcmp(gbatch[Q], gbatch[H]))
                continue;
            int shares = 0;
            for (int k = 0; k < op->nin && !shares; k++)
                for (int k2 = 0; k2 < g->op[q].nin && !shares; k2++)
                    shares = dm_tensor_root(g, op->in[k]) == dm_tensor_root(g, g->op[q].in[k2]);
            if (!shares) continue;
            /* independent: o has no ancestor in Q, and no op of Q has o as an ancestor */
            const word *qm = mem + (size_t)Q * nw, *oa = anc + (size_t)o * nw;
            int indep = 1;
            for (int w = 0; w < nw && indep; w++) indep = (oa[w] & qm[w]) == 0;
            for (int z = 0; z < n && indep; z++)
                if (gid[z] == Q && bit(anc + (size_t)z * nw, o)) indep = 0;
            if (indep) G = Q;
        }
        if (G < 0) continue;
        /* op by op the two are independent; a cycle through a third group's ops (o before
         * one of them, another before G) is ruled out on the groups themselves */
        gid[o] = G;
        if (!groups_acyclic(gid, n, ng, anc, nw, seen)) {
            gid[o] = H;
            continue;
        }
        set(mem + (size_t)G * nw, o);
        memset(mem + (size_t)H * nw, 0, sizeof(word) * (size_t)nw);
        gnb[H] = 0;
    }
    free(seen);
    /* renumber the groups densely after the merges */
    {
        int *map = malloc(sizeof(int) * (size_t)(ng > 0 ? ng : 1));
        char (*nbl)[4] = calloc((size_t)(ng > 0 ? ng : 1), 4);
        int64_t *nnb = calloc((size_t)(ng > 0 ? ng : 1), sizeof(int64_t));
        if (!map || !nbl || !nnb) {
            free(map); free(nbl); free(nnb); free(gbatch); free(gnb);
            st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
            goto done;
        }
        for (int G = 0; G < ng; G++) map[G] = -1;
        int m = 0;
        for (int o = 0; o < n; o++)
            if (map[gid[o]] < 0) {
                map[gid[o]] = m;
                memcpy(nbl[m], gbatch[gid[o]], 4);
                nnb[m] = gnb[gid[o]];
                m++;
            }
        memset(mem, 0, sizeof(word) * (size_t)n * (size_t)nw);
        for (int o = 0; o < n; o++) {
            gid[o] = map[gid[o]];
            set(mem + (size_t)gid[o] * nw, o);
        }
        free(map);
        free(gbatch);
        free(gnb);
        gbatch = nbl;
        gnb = nnb;
        ng = m;
    }
    /* group DAG and topological order (ties: smallest first op) */
    plan->order = malloc(sizeof(int) * (size_t)n);
    plan->groups = calloc((size_t)ng, sizeof(dm_group));
    if (!plan->order || !plan->groups) {
        st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
        goto done;
    }
    for (int G = 0; G < ng; G++) {
        const word *gm = mem + (size_t)G * nw;
        for (int H = 0; H < ng; H++) {
            if (H == G) continue;
            const word *hm = mem + (size_t)H * nw;
            /* edge H -> G if some op of G has an ancestor in H */
            int e = 0;
            for (int o = 0; o < n && !e; o++)
                if (bit(gm, o))
                    for (int w = 0; w < nw; w++)
                        if (anc[(size_t)o * nw + w] & hm[w]) { e = 1; break; }
            indeg[G] += e;
        }
    }
    int *done_g = calloc((size_t)ng, sizeof(int));
    if (!done_g) {
        st = dm_fail(DM_ERR_OOM, "out of memory in the fusion pass");
        goto done;
    }
    int pos = 0, last = -1; /* last: the group scheduled just before */
    for (int step = 0; step < ng; step++) {
        int pick = -1;
        /* the forward pass first: forward() runs exactly the pass-0 groups, and liveness
         * is planned in this order. Fused: a ready row group (no contraction) that reads
         * what the group just run wrote goes next, while that is still in cache (the
         * activation's backward right after the GEMM that makes its dy, before the weight
         * gradient's GEMM); otherwise the group with the smallest first op. */
        for (int pass = 0; pass < 2 && pick < 0; pass++) {
            for (int o = 0; o < n && pick < 0 && fused && last >= 0; o++) {
                int G = gid[o];
                if (done_g[G] || indeg[G] != 0 || g->op[o].pass != pass) continue;
                int rows_only = 1, reads_last = 0;
                for (int q = 0; q < n && rows_only; q++) {
                    if (gid[q] != G) continue;
                    rows_only = g->op[q].kind != DM_OP_CONTRACT;
                    for (int k = 0; k < g->op[q].nin; k++) {
                        int r = dm_tensor_root(g, g->op[q].in[k]);
                        for (int m = 0; m < nprod[r]; m++) reads_last |= gid[prod[r][m]] == last;
                    }
                }
                if (rows_only && reads_last) pick = G;
            }
            for (int o = 0; o < n && pick < 0; o++)
                if (!done_g[gid[o]] && indeg[gid[o]] == 0 && g->op[o].pass == pass) pick = gid[o];
        }
        if (pick < 0) {
            free(done_g);
            free(gbatch);
            free(gnb);
            st = dm_fail(DM_ERR_INTERNAL, "fusion produced a cycle between groups");
            goto done;
        }
        done_g[pick] = 1;
        last = pick;
        dm_group *gr = &plan->groups[step];
        gr->first = pos;
        gr->cls = DM_CLASS_ELEMENTWISE;
        for (int o = 0; o < n; o++) {
            if (gid[o] != pick) continue;
            plan->order[pos++] = o;
            gr->nops++;
            gr->pass = g->op[o].pass;
            gr->rows = g->op[o].rows;
            gr->cols = g->op[o].cols;
            dm_op_class c = dm_op_kind_class(g->op[o].kind);
            if (c == DM_CLASS_CONTRACTION) gr->cls = c;
            else if (c == DM_CLASS_NORMALIZATION && gr->cls != DM_CLASS_CONTRACTION) gr->cls = c;
            if (g->op[o].kind != DM_OP_CONTRACT && g->op[o].cols > plan->max_cols)
                plan->max_cols = (int)g->op[o].cols;
        }
        gr->nbatch = gnb[pick] > 1 ? gnb[pick] : 0;
        memcpy(gr->batch, gbatch[pick], 4);
        const word *pm = mem + (size_t)pick * nw;
        for (int G = 0; G < ng; G++) {
            if (done_g[G]) continue;
            const word *gm = mem + (size_t)G * nw;
            int e = 0;
            for (int o = 0; o < n && !e; o++)
                if (bit(gm, o))
                    for (int w = 0; w < nw; w++)
                        if (anc[(size_t)o * nw + w] & pm[w]) { e = 1; break; }
            indeg[G] -= e;
        }
    }
    free(done_g);
    free(gbatch);
    free(gnb);
    plan->ngroups = ng;
    plan->no_reuse = no_reuse;
    st = dm_plan_memory(plan, no_reuse);
done:
    if (prod)
        for (int t = 0; t < nt; t++) free(prod[t]);
    free(prod);
    free(nprod);
    free(anc);
    free(mem);
    free(indeg);
    free(gid);
    if (st != DM_OK) dm_plan_free(plan);
    return st;
}

void dm_plan_free(dm_plan *plan) {
    free(plan->order);
    free(plan->groups);
    free(plan->in_memory);
    free(plan->offset);
    free(plan->algo);
    memset(plan, 0, sizeof *plan);
}

char *dm_plan_describe(const dm_plan *plan, const double *group_secs, int pairs) {
    const dm_graph *g = plan->g;
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    /* contractions run side by side (algorithm "concurrent"): partner[G] / beside[G] */
    int *partner = malloc(sizeof(int) * 2 * (size_t)(plan->ngroups + 1));
    int *beside = partner ? partner + plan->ngroups + 1 : NULL;
    if (!partner || dm_plan_pairs(plan, partner, beside) != DM_OK) {
        free(partner);
        free(s);
        return NULL;
    }
    for (int G = 0; !pairs && G < plan->ngroups; G++) partner[G] = beside[G] = -1;
    for (int G = 0; G < plan->ngroups; G++) {
        const dm_group *gr = &plan->groups[G];
        char line[512];
        int l = snprintf(line, sizeof line, "%-8s %-13s", gr->pass ? "backward" : "forward",
                         dm_class_name(gr->cls));
        if (group_secs)
            l += snprintf(line + l, sizeof line - (size_t)l, " %9.3f ms", group_secs[G] * 1e3);
        for (int k = 0; k < gr->nops && l < (int)sizeof line - 40; k++)
            l += snprintf(line + l, sizeof line - (size_t)l, "%s%s", k ? " + " : " ",
                          g->op[plan->order[gr->first + k]].name);
        if (partner[G] >= 0 && l < (int)sizeof line - 80)
            l += snprintf(line + l, sizeof line - (size_t)l, "  (and %s beside it)",
                          g->op[plan->order[plan->groups[partner[G]].first]].name);
        if (beside[G] >= 0 && l < (int)sizeof line - 80)
            l += snprintf(line + l, sizeof line - (size_t)l, "  (ran beside %s)",
                          g->op[plan->order[plan->groups[beside[G]].first]].name);
        /* algorithm "direct_rows": the next group runs in this one's epilogue (the CPU
         * executor refuses a plan where it cannot) */
        int rows_in = pairs && plan->algo && G + 1 < plan->ngroups &&
                      plan->algo[plan->order[gr->first]] == DM_GEMM_DIRECT_ROWS;
        int rows_of = pairs && plan->algo && G > 0 &&
                      plan->algo[plan->order[plan->groups[G - 1].first]] == DM_GEMM_DIRECT_ROWS;
        if (rows_in && l < (int)sizeof line - 80)
            l += snprintf(line + l, sizeof line - (size_t)l, "  (and %s in its epilogue)",
                          g->op[plan->order[plan->groups[G + 1].first]].name);
        if (rows_of && l < (int)sizeof line - 80)
            l += snprintf(line + l, sizeof line - (size_t)l, "  (ran in the epilogue of %s)",
                          g->op[plan->order[plan->groups[G - 1].first]].name);
        l += snprintf(line + l, sizeof line - (size_t)l, "\n");
        if (len + (size_t)l + 1 > cap) {
            cap = (cap + (size_t)l) * 2;
            char *q = realloc(s, cap);
            if (!q) { free(s); free(partner); return NULL; }
            s = q;
        }
        memcpy(s + len, line, (size_t)l + 1);
        len += (size_t)l;
    }
    free(partner);
    return s;
}
