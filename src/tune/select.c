/* select.c: the globally cheapest layouts over a training step, by shortest path.
 *
 * The problem (select.h): variables (tensor layouts) with small domains; layers (fused
 * groups, in execution order) each touching a few variables, with a cost for every
 * combination of their layouts; optionally a price for converting a variable between
 * two consecutive layers. Summing per-layer minima is wrong: the layer that writes a
 * tensor and the layers that read it must agree on its layout, or pay a conversion.
 *
 * The layered graph (substation's idea, spec section 8, made exact and general): a
 * variable is live from the first to the last layer that touches it. Layer g's nodes are
 * the layout combinations of the variables live at g (those carried across the boundary
 * g-1|g, plus those g touches first); its node cost is g's measured time for the scope
 * part of the combination. An edge joins a node of g-1 to a node of g when the carried
 * variables agree, or differ by an allowed conversion (the edge then pays it). Every
 * source-to-sink path is one complete choice and its length is the total cost, so the
 * shortest path is the optimum. The graph is a DAG in layer order, so one forward sweep
 * of dynamic programming finds it (no Dijkstra, no priority queue), then a backward walk
 * recovers the path.
 *
 * Sweep cost: the edges between two layers are never listed. D[g-1] (best cost to reach
 * each node of g-1) is first minimized over the variables that die at g-1, then relaxed
 * one convertible variable at a time (a min-plus product along that axis), then spread
 * over the variables born at g. That is |nodes| x (domain) work per layer instead of
 * |nodes of g-1| x |nodes of g|. A variable is relaxed only at the boundary before a
 * layer that uses it, with the cheapest conversions over all the boundaries since its
 * previous use (see closure below), which is exact and keeps long-lived tensors cheap.
 * Variables with one layout never enter a node; variables in no scope take layout 0.
 *
 * Ties: paths are ordered by (cost, number of conversions), then lowest node index, so
 * a conversion that saves nothing is never chosen and the result is deterministic.
 *
 * The node count is the product of the domains live at once, so it is checked (with
 * overflow checks) before anything is allocated; a step whose live combinations exceed
 * the limit is refused with a message naming the layer and the variables. */
#include "tune/select.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* --- validation and live ranges -------------------------------------------------------- */

static int has_change(const dm_select_problem *p, int v) { return p->change && p->change[v]; }

/* The price of v going from layout a to b between consecutive layers. */
static double change_cost(const dm_select_problem *p, int v, int a, int b) {
    if (a == b) return 0;
    if (!has_change(p, v)) return INFINITY;
    return p->change[v][(size_t)a * (size_t)p->ndom[v] + (size_t)b];
}

static int bad_cost(double c) { return isnan(c) || c < 0; }

/* Entries of layer g's cost table (the product of its scope's domains). */
static int table_size(const dm_select_problem *p, int g, int64_t *n) {
    int64_t s = 1;
    for (int k = 0; k < p->nscope[g]; k++)
        if (__builtin_mul_overflow(s, (int64_t)p->ndom[p->scope[g][k]], &s)) return 0;
    *n = s;
    return 1;
}

/* Checks *p and computes each variable's live range: first[v]..last[v] (first[v] == -1:
 * in no scope). *first_out is [2 * nvars] ints (last = first + nvars), for the caller
 * to free. */
static dm_status validate(const dm_select_problem *p, int **first_out) {
    *first_out = NULL;
    if (!p) return dm_fail(DM_ERR_INVALID_ARG, "select: null problem");
    if (p->nvars < 0 || p->nlayers < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "select: negative count (%d variables, %d layers)",
                       p->nvars, p->nlayers);
    if (p->nvars > 0 && !p->ndom) return dm_fail(DM_ERR_INVALID_ARG, "select: null ndom");
    if (p->nlayers > 0 && (!p->nscope || !p->scope || !p->cost))
        return dm_fail(DM_ERR_INVALID_ARG, "select: null nscope, scope or cost");
    if (p->max_states < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "select: negative max_states %lld",
                       (long long)p->max_states);
    for (int v = 0; v < p->nvars; v++)
        if (p->ndom[v] < 1)
            return dm_fail(DM_ERR_INVALID_ARG, "select: variable %d has %d layouts (needs >= 1)",
                           v, p->ndom[v]);
    if (p->change)
        for (int v = 0; v < p->nvars; v++) {
            if (!p->change[v]) continue;
            size_t n = (size_t)p->ndom[v];
            for (size_t a = 0; a < n; a++)
                for (size_t b = 0; b < n; b++)
                    if (a != b && bad_cost(p->change[v][a * n + b]))
                        return dm_fail(DM_ERR_INVALID_ARG,
                                       "select: variable %d: change cost %zu->%zu is %g "
                                       "(must be >= 0 or INFINITY)",
                                       v, a, b, p->change[v][a * n + b]);
        }

    size_t nv = p->nvars > 0 ? (size_t)p->nvars : 1;
    int *first = malloc(2 * nv * sizeof *first);
    if (!first) return dm_fail(DM_ERR_OOM, "select: out of memory");
    int *last = first + nv;
    for (int v = 0; v < p->nvars; v++) first[v] = last[v] = -1;
    dm_status st = DM_OK;
    for (int g = 0; g < p->nlayers && st == DM_OK; g++) {
        int n = p->nscope[g];
        if (n < 0) {
            st = dm_fail(DM_ERR_INVALID_ARG, "select: layer %d: negative scope size %d", g, n);
            break;
        }
        if (n > 0 && !p->scope[g]) {
            st = dm_fail(DM_ERR_INVALID_ARG, "select: layer %d: null scope", g);
            break;
        }
        if (!p->cost[g]) {
            st = dm_fail(DM_ERR_INVALID_ARG, "select: layer %d: null cost table", g);
            break;
        }
        for (int k = 0; k < n && st == DM_OK; k++) {
            int v = p->scope[g][k];
            if (v < 0 || v >= p->nvars)
                st = dm_fail(DM_ERR_INVALID_ARG,
                             "select: layer %d: scope entry %d is variable %d (have %d)", g, k,
                             v, p->nvars);
            else if (last[v] == g) /* already seen in this layer's scope */
                st = dm_fail(DM_ERR_INVALID_ARG, "select: layer %d: variable %d twice in scope",
                             g, v);
            else {
                if (first[v] < 0) first[v] = g;
                last[v] = g;
            }
        }
        if (st != DM_OK) break;
        int64_t size;
        if (!table_size(p, g, &size)) {
            st = dm_fail(DM_ERR_INVALID_ARG, "select: layer %d: cost table size overflows", g);
            break;
        }
        for (int64_t i = 0; i < size; i++)
            if (bad_cost(p->cost[g][i])) {
                st = dm_fail(DM_ERR_INVALID_ARG,
                             "select: layer %d: cost of combination %lld is %g (must be >= 0 "
                             "or INFINITY)",
                             g, (long long)i, p->cost[g][i]);
                break;
            }
    }
    if (st != DM_OK) {
        free(first);
        return st;
    }
    *first_out = first;
    return DM_OK;
}

static int live_at(const int *first, const int *last, int v, int g) {
    return first[v] >= 0 && first[v] <= g && g <= last[v];
}

/* --- evaluating a choice --------------------------------------------------------------- */

/* Row of layer g's cost table under a full choice (one-layout variables read 0). */
static int64_t row_of(const dm_select_problem *p, int g, const int *layout) {
    int64_t row = 0;
    for (int k = 0; k < p->nscope[g]; k++) {
        int v = p->scope[g][k];
        int x = p->ndom[v] > 1 ? layout[(size_t)g * p->nvars + v] : 0;
        row = row * p->ndom[v] + x;
    }
    return row;
}

/* Layer costs, then conversions, in a fixed order, so equal choices sum identically. */
static double eval(const dm_select_problem *p, const int *layout, const int *first,
                   const int *last) {
    double total = 0;
    for (int g = 0; g < p->nlayers; g++) total += p->cost[g][row_of(p, g, layout)];
    for (int g = 1; g < p->nlayers; g++)
        for (int v = 0; v < p->nvars; v++)
            if (p->ndom[v] > 1 && live_at(first, last, v, g - 1) && live_at(first, last, v, g))
                total += change_cost(p, v, layout[(size_t)(g - 1) * p->nvars + v],
                                     layout[(size_t)g * p->nvars + v]);
    return total;
}

dm_status dm_select_cost(const dm_select_problem *p, const int *layout, double *total) {
    if (!layout || !total) return dm_fail(DM_ERR_INVALID_ARG, "select: null layout or total");
    int *first;
    DM_TRY(validate(p, &first));
    int *last = first + (p->nvars > 0 ? p->nvars : 1);
    for (int g = 0; g < p->nlayers; g++)
        for (int v = 0; v < p->nvars; v++) {
            int x = layout[(size_t)g * p->nvars + v];
            if (live_at(first, last, v, g) && (x < 0 || x >= p->ndom[v])) {
                free(first);
                return dm_fail(DM_ERR_INVALID_ARG,
                               "select: layer %d: variable %d has layout %d (has %d)", g, v, x,
                               p->ndom[v]);
            }
        }
    *total = eval(p, layout, first, last);
    free(first);
    return DM_OK;
}

void dm_select_result_free(dm_select_result *r) {
    if (!r) return;
    free(r->layout);
    free(r->fixed);
    free(r->comb);
    memset(r, 0, sizeof *r);
}

/* Fills *r from a complete choice `layout` (taken over: freed on failure too): layouts
 * of one-layout variables, fixed[], comb[], the change count and the total. */
static dm_status finish(const dm_select_problem *p, const int *first, const int *last,
                        int *layout, dm_select_result *r) {
    int nv = p->nvars, nl = p->nlayers;
    r->nvars = nv, r->nlayers = nl, r->layout = layout;
    r->fixed = malloc((nv > 0 ? (size_t)nv : 1) * sizeof *r->fixed);
    r->comb = malloc((nl > 0 ? (size_t)nl : 1) * sizeof *r->comb);
    if (!r->fixed || !r->comb) {
        dm_select_result_free(r);
        return dm_fail(DM_ERR_OOM, "select: out of memory");
    }
    for (int g = 0; g < nl; g++)
        for (int v = 0; v < nv; v++) {
            int *x = &layout[(size_t)g * nv + v];
            if (!live_at(first, last, v, g)) *x = -1;
            else if (p->ndom[v] == 1) *x = 0;
        }
    r->nchanges = 0;
    for (int v = 0; v < nv; v++) {
        r->fixed[v] = first[v] < 0 ? 0 : layout[(size_t)first[v] * nv + v];
        for (int g = first[v] + 1; first[v] >= 0 && g <= last[v]; g++)
            if (layout[(size_t)g * nv + v] != layout[(size_t)(g - 1) * nv + v]) {
                r->fixed[v] = -1;
                r->nchanges++;
            }
    }
    for (int g = 0; g < nl; g++) r->comb[g] = row_of(p, g, layout);
    r->total = eval(p, layout, first, last);
    return DM_OK;
}

/* --- conversions between two uses of a variable ------------------------------------- */

/* Path order: cheaper, or as cheap with fewer conversions (a conversion that saves
 * nothing is a copy for nothing; counting them makes such ties keep layouts). */
static int better(double c, int k, double best, int bestk) {
    return c < best || (c == best && k < bestk);
}

/* The layers between two uses of a variable, k boundaries apart, do not read it, so
 * all that matters is the cheapest way from layout a to layout b in at most k
 * conversions: the k-th min-plus power of its matrix with a free diagonal. Relaxing
 * once, at the boundary before the next use, with that power is exact, and costs one
 * pass over the nodes per use instead of one per boundary the variable lives across.
 * Powers are ordered like paths (cost, then conversions); they stop changing within
 * ndom-1 steps (such a path never revisits a layout), so only those are kept. */
typedef struct {
    int kmax;      /* pow[k] for k = 0..kmax; beyond kmax, pow[kmax] */
    double *cost;  /* [(kmax + 1) * d * d]: [k][a][b] */
    int *hops;     /* the same shape: conversions on that path */
} closure;

/* pow[k] from pow[k-1] at [a][b] through c: pow[k-1][a][c], then c -> b (or stay). */
static void via(const double *C, int d, const double *pc, const int *ph, int a, int c, int b,
                double *x, int *h) {
    *x = pc[a * d + c] + (c == b ? 0 : C[(size_t)c * d + b]);
    *h = ph[a * d + c] + (c != b);
}

static dm_status closure_build(const dm_select_problem *p, int v, int maxgap, closure *cl) {
    int d = p->ndom[v], kmax = maxgap < d - 1 ? maxgap : d - 1;
    const double *C = p->change[v];
    if ((double)d * d * d * kmax > 1e9)
        return dm_fail(DM_ERR_UNSUPPORTED,
                       "variable %d: %d layouts with conversions between them are too many to "
                       "plan; restrict candidates with --max-layouts",
                       v, d);
    size_t dd = (size_t)d * d;
    cl->cost = malloc(((size_t)kmax + 1) * dd * sizeof *cl->cost);
    cl->hops = malloc(((size_t)kmax + 1) * dd * sizeof *cl->hops);
    if (!cl->cost || !cl->hops) return dm_fail(DM_ERR_OOM, "select: out of memory");
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) cl->cost[a * d + b] = a == b ? 0 : INFINITY;
    memset(cl->hops, 0, dd * sizeof *cl->hops);
    cl->kmax = kmax;
    for (int k = 1; k <= kmax; k++) {
        const double *pc = cl->cost + (k - 1) * dd;
        const int *ph = cl->hops + (k - 1) * dd;
        double *nc = cl->cost + k * dd;
        int *nh = cl->hops + k * dd, same = 1;
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                double best = INFINITY, x;
                int bh = 0, h;
                for (int c = 0; c < d; c++) { /* lowest c on ties (closure_path redoes this) */
                    via(C, d, pc, ph, a, c, b, &x, &h);
                    if (x < INFINITY && (best == INFINITY || better(x, h, best, bh)))
                        best = x, bh = h;
                }
                nc[a * d + b] = best, nh[a * d + b] = bh;
                same &= best == pc[a * d + b] && bh == ph[a * d + b];
            }
        if (same) { /* converged: every later power is this one */
            cl->kmax = k - 1;
            break;
        }
    }
    return DM_OK;
}

/* The cheapest conversions from a to b within k boundaries: y[0] = a, ..., y[h] = b, one
 * conversion per step; returns h, or -1 if the tables do not hold such a path. */
static int closure_path(const dm_select_problem *p, int v, const closure *cl, int k, int a,
                        int b, int *y) {
    int d = p->ndom[v], K = k < cl->kmax ? k : cl->kmax, cur = b;
    size_t dd = (size_t)d * d;
    int h = cl->hops[K * dd + a * d + b], i = h;
    y[i] = b;
    for (; K > 0; K--) { /* undo pow[K] = pow[K-1] then one step: find that step */
        double want = cl->cost[K * dd + a * d + cur], x;
        int wanth = cl->hops[K * dd + a * d + cur], c, hc;
        for (c = 0; c < d; c++) {
            via(p->change[v], d, cl->cost + (K - 1) * dd, cl->hops + (K - 1) * dd, a, c, cur,
                &x, &hc);
            if (x == want && hc == wanth) break;
        }
        if (c == d || (c != cur && i == 0)) return -1;
        if (c != cur) y[--i] = c;
        cur = c;
    }
    return cur == a && i == 0 ? h : -1;
}

/* --- the layered graph ------------------------------------------------------------------ */

/* Advances a mixed-radix counter (last digit fastest) and two flat indices that move by
 * sa[j] / sb[j] per unit of digit j. */
static void step(int n, const int *radix, int *digit, const int64_t *sa, const int64_t *sb,
                 int64_t *ia, int64_t *ib) {
    for (int j = n - 1; j >= 0; j--) {
        if (++digit[j] < radix[j]) {
            *ia += sa[j], *ib += sb[j];
            return;
        }
        digit[j] = 0;
        *ia -= sa[j] * (radix[j] - 1), *ib -= sb[j] * (radix[j] - 1);
    }
}

/* The refusal when layer g has too many live combinations (the live set is lv[0..n)). */
static dm_status too_many(const dm_select_problem *p, int g, const int *lv, int n,
                          int64_t limit) {
    char list[400];
    size_t len = 0;
    double states = 1;
    for (int j = 0; j < n; j++) states *= p->ndom[lv[j]];
    list[0] = 0;
    for (int j = 0; j < n; j++) {
        if (j == 8) {
            snprintf(list + len, sizeof list - len, ", ...");
            break;
        }
        len += (size_t)snprintf(list + len, sizeof list - len, "%svariable %d x%d",
                                j ? ", " : "", lv[j], p->ndom[lv[j]]);
    }
    return dm_fail(DM_ERR_UNSUPPORTED,
                   "too many layout combinations live at once at group %d: %.3g (%d tensors "
                   "with a layout choice: %s) exceed the limit of %lld; restrict candidates "
                   "with --max-layouts",
                   g, states, n, list, (long long)limit);
}

/* One flat table per layer. A node of layer g is a layout for each variable in
 * lv[loff[g]..loff[g+1]), its index row-major over them (last fastest). */
typedef struct {
    int *lv;        /* live variables with a choice, per layer, ascending */
    int *loff;      /* [nlayers + 1] */
    int64_t *doff;  /* [nlayers + 1]: offset of each layer's nodes in d */
    double *d;      /* cheapest cost from the source to each node (node cost included) */
    int *dn;        /* conversions on that cheapest path (the fewest, among equal costs) */
    double *m, *tmp;           /* [maxk]: cost by layouts of the carried variables */
    int *mn, *tmpn;            /* [maxk]: their conversion counts */
    int *goff, *gap;           /* per scope entry (gap[goff[g] + k]): layers since the
                                * variable's previous use, 0 at its first */
    closure *cl;               /* [nvars]: cost == NULL where the variable never converts */
    int *radix, *digit;        /* [nvars]: counters over one layer's nodes */
    int *y;                    /* [max(nvars, ndom)]: scratch by variable; a path */
    int64_t *sa, *sb;          /* [nvars]: index strides for those counters */
    int64_t *kst, *cst;        /* [nvars], by variable: stride in m, in the cost table */
} sweep;

static void sweep_free(const dm_select_problem *p, sweep *s) {
    free(s->lv), free(s->loff), free(s->doff), free(s->d), free(s->m), free(s->tmp);
    free(s->dn), free(s->mn), free(s->tmpn), free(s->goff), free(s->gap), free(s->y);
    free(s->radix), free(s->digit), free(s->sa), free(s->sb), free(s->kst), free(s->cst);
    for (int v = 0; s->cl && v < p->nvars; v++) free(s->cl[v].cost), free(s->cl[v].hops);
    free(s->cl);
}

/* Lists each layer's live variables and counts its nodes, refusing too many before any
 * large allocation; then allocates the tables and builds the conversion powers. */
static dm_status sweep_alloc(const dm_select_problem *p, const int *first, const int *last,
                             int64_t limit, sweep *s, dm_select_result *r) {
    int nv = p->nvars, nl = p->nlayers;
    size_t nvs = nv > 0 ? (size_t)nv : 1, nent = 0;
    for (int g = 0; g < nl; g++) nent += (size_t)p->nscope[g];
    s->loff = malloc(((size_t)nl + 1) * sizeof *s->loff);
    s->doff = malloc(((size_t)nl + 1) * sizeof *s->doff);
    s->goff = malloc(((size_t)nl + 1) * sizeof *s->goff);
    s->gap = malloc((nent > 0 ? nent : 1) * sizeof *s->gap);
    s->cl = calloc(nvs, sizeof *s->cl);
    s->radix = malloc(nvs * sizeof *s->radix), s->digit = malloc(nvs * sizeof *s->digit);
    size_t ny = nvs; /* by variable (walk_back), or a path of up to ndom layouts */
    for (int v = 0; v < nv; v++) ny = (size_t)p->ndom[v] > ny ? (size_t)p->ndom[v] : ny;
    s->y = malloc(ny * sizeof *s->y);
    s->sa = malloc(nvs * sizeof *s->sa), s->sb = malloc(nvs * sizeof *s->sb);
    s->kst = malloc(nvs * sizeof *s->kst), s->cst = malloc(nvs * sizeof *s->cst);
    if (!s->loff || !s->doff || !s->goff || !s->gap || !s->cl || !s->radix || !s->digit ||
        !s->y || !s->sa || !s->sb || !s->kst || !s->cst)
        return dm_fail(DM_ERR_OOM, "select: out of memory");
    size_t nlive = 0;
    for (int g = 0; g < nl; g++)
        for (int v = 0; v < nv; v++) nlive += p->ndom[v] > 1 && live_at(first, last, v, g);
    s->lv = malloc((nlive > 0 ? nlive : 1) * sizeof *s->lv);
    if (!s->lv) return dm_fail(DM_ERR_OOM, "select: out of memory");

    int64_t total = 0, maxk = 1;
    s->loff[0] = 0, s->doff[0] = 0;
    for (int g = 0; g < nl; g++) {
        int n = 0, *lv = s->lv + s->loff[g];
        int64_t nodes = 1, carried = 1;
        int over = 0;
        for (int v = 0; v < nv; v++) {
            if (p->ndom[v] == 1 || !live_at(first, last, v, g)) continue;
            lv[n++] = v;
            over = over || __builtin_mul_overflow(nodes, (int64_t)p->ndom[v], &nodes) ||
                   nodes > limit;
            if (!over && first[v] < g) carried *= p->ndom[v];
        }
        if (over) return too_many(p, g, lv, n, limit);
        s->loff[g + 1] = s->loff[g] + n;
        /* the backward walk reads every layer's nodes, so all are kept at once */
        if (nodes > 8 * limit - total)
            return dm_fail(DM_ERR_UNSUPPORTED,
                           "too many layout combinations over the whole step: more than %lld "
                           "by group %d; restrict candidates with --max-layouts",
                           (long long)(8 * limit), g);
        total += nodes;
        s->doff[g + 1] = total;
        if (carried > maxk) maxk = carried;
        if (nodes > r->widest) r->widest = nodes;
    }
    r->nodes = total;
    size_t nd = total > 0 ? (size_t)total : 1;
    s->d = malloc(nd * sizeof *s->d), s->dn = malloc(nd * sizeof *s->dn);
    s->m = malloc((size_t)maxk * sizeof *s->m), s->tmp = malloc((size_t)maxk * sizeof *s->tmp);
    s->mn = malloc((size_t)maxk * sizeof *s->mn);
    s->tmpn = malloc((size_t)maxk * sizeof *s->tmpn);
    if (!s->d || !s->dn || !s->m || !s->tmp || !s->mn || !s->tmpn)
        return dm_fail(DM_ERR_OOM, "select: out of memory");

    /* gaps between uses (digit and radix as scratch: each variable's previous use and
     * longest gap), then the powers each convertible variable needs */
    int *prev = s->digit, *maxgap = s->radix;
    for (int v = 0; v < nv; v++) prev[v] = -1, maxgap[v] = 0;
    s->goff[0] = 0;
    for (int g = 0; g < nl; g++) {
        s->goff[g + 1] = s->goff[g] + p->nscope[g];
        for (int k = 0; k < p->nscope[g]; k++) {
            int v = p->scope[g][k], gp = prev[v] < 0 ? 0 : g - prev[v];
            s->gap[s->goff[g] + k] = gp;
            if (gp > maxgap[v]) maxgap[v] = gp;
            prev[v] = g;
        }
    }
    for (int v = 0; v < nv; v++)
        if (p->ndom[v] > 1 && has_change(p, v) && maxgap[v] > 0)
            DM_TRY(closure_build(p, v, maxgap[v], &s->cl[v]));
    return DM_OK;
}

/* pow[k] of variable v's conversions: the costs; *hops the conversion counts beside. */
static const double *power(const sweep *s, const dm_select_problem *p, int v, int k,
                           const int **hops) {
    const closure *cl = &s->cl[v];
    size_t at = (size_t)(k < cl->kmax ? k : cl->kmax) * p->ndom[v] * p->ndom[v];
    *hops = cl->hops + at;
    return cl->cost + at;
}

/* Sets the counters to run over layer g's nodes; sa/sb left to the caller. */
static int counters(const dm_select_problem *p, sweep *s, int g) {
    int n = s->loff[g + 1] - s->loff[g];
    for (int j = 0; j < n; j++) s->radix[j] = p->ndom[s->lv[s->loff[g] + j]], s->digit[j] = 0;
    return n;
}

/* One layer of the forward sweep: d[g] from d[g-1]. */
static void sweep_layer(const dm_select_problem *p, const int *first, const int *last,
                        sweep *s, int g) {
    const int *lv = s->lv + s->loff[g];
    int n = s->loff[g + 1] - s->loff[g];

    /* The carried variables (live at g-1 and g) index m row-major in ascending order;
     * kst[v] is v's stride there. No carried variable: m is one entry, the best so far. */
    int64_t nm = 1;
    for (int j = n - 1; j >= 0; j--)
        if (first[lv[j]] < g) s->kst[lv[j]] = nm, nm *= p->ndom[lv[j]];

    if (g == 0) {
        s->m[0] = 0, s->mn[0] = 0;
    } else {
        /* 1. m = d[g-1] minimized over the variables that die at g-1 (stride 0 in m). */
        const int *pv = s->lv + s->loff[g - 1];
        const double *dp = s->d + s->doff[g - 1];
        const int *dpn = s->dn + s->doff[g - 1];
        int64_t pnodes = s->doff[g] - s->doff[g - 1];
        int np = counters(p, s, g - 1);
        for (int j = 0; j < np; j++) s->sa[j] = last[pv[j]] >= g ? s->kst[pv[j]] : 0, s->sb[j] = 0;
        for (int64_t i = 0; i < nm; i++) s->m[i] = INFINITY, s->mn[i] = INT32_MAX;
        int64_t im = 0, unused = 0;
        for (int64_t i = 0; i < pnodes; i++) {
            if (better(dp[i], dpn[i], s->m[im], s->mn[im])) s->m[im] = dp[i], s->mn[im] = dpn[i];
            step(np, s->radix, s->digit, s->sa, s->sb, &im, &unused);
        }

        /* 2. Conversions of the carried variables that g uses again, one at a time, with
         *    the power for the boundaries since their previous use:
         *    m'(..b..) = min(m(..b..), min_a m(..a..) + pow[a][b]). Conversions of
         *    different variables add independently, so axis by axis is exact. */
        for (int k = 0; k < p->nscope[g]; k++) {
            int v = p->scope[g][k], gp = s->gap[s->goff[g] + k], dv = p->ndom[v];
            if (gp == 0 || !s->cl[v].cost) continue; /* first use, or never converts */
            const int *H;
            const double *P = power(s, p, v, gp, &H);
            int64_t inner = s->kst[v], outer = nm / (inner * dv);
            for (int64_t o = 0; o < outer; o++)
                for (int64_t in = 0; in < inner; in++) {
                    int64_t base = o * dv * inner + in;
                    const double *src = s->m + base;
                    const int *srcn = s->mn + base;
                    for (int b = 0; b < dv; b++) {
                        double best = src[b * inner];
                        int bestn = srcn[b * inner];
                        for (int a = 0; a < dv; a++) {
                            double c = src[a * inner] + P[a * dv + b];
                            if (a != b && c < INFINITY && /* (unreachable counts are huge) */
                                better(c, srcn[a * inner] + H[a * dv + b], best, bestn))
                                best = c, bestn = srcn[a * inner] + H[a * dv + b];
                        }
                        s->tmp[base + b * inner] = best, s->tmpn[base + b * inner] = bestn;
                    }
                }
            double *t = s->m;
            s->m = s->tmp, s->tmp = t;
            int *tn = s->mn;
            s->mn = s->tmpn, s->tmpn = tn;
        }
    }

    /* 3. Spread m over the variables born at g and add g's own cost: sa strides in m,
     *    sb strides in g's cost table (row-major in scope order; one-layout variables
     *    contribute digit 0, so they need no stride). */
    for (int j = 0; j < n; j++) s->cst[lv[j]] = 0;
    int64_t cs = 1;
    for (int k = p->nscope[g] - 1; k >= 0; k--) {
        int v = p->scope[g][k];
        s->cst[v] = cs;
        cs *= p->ndom[v];
    }
    counters(p, s, g);
    for (int j = 0; j < n; j++)
        s->sa[j] = first[lv[j]] < g ? s->kst[lv[j]] : 0, s->sb[j] = s->cst[lv[j]];
    const double *cg = p->cost[g];
    double *dg = s->d + s->doff[g];
    int *dgn = s->dn + s->doff[g];
    int64_t nodes = s->doff[g + 1] - s->doff[g], im = 0, ic = 0;
    for (int64_t i = 0; i < nodes; i++) {
        dg[i] = cg[ic] + s->m[im], dgn[i] = s->mn[im];
        step(n, s->radix, s->digit, s->sa, s->sb, &im, &ic);
    }
}

/* Writes node `idx` of layer g into layout row g. */
static void decode(const dm_select_problem *p, const sweep *s, int g, int64_t idx, int *layout) {
    const int *lv = s->lv + s->loff[g];
    for (int j = s->loff[g + 1] - s->loff[g] - 1; j >= 0; j--) {
        int dv = p->ndom[lv[j]];
        layout[(size_t)g * p->nvars + lv[j]] = (int)(idx % dv);
        idx /= dv;
    }
}

/* The backward walk: from the cheapest last node, each layer's predecessor is the node
 * of g-1 whose cost plus the boundary's conversions is least (in path order: on a tie,
 * fewer conversions in all, then the lowest index). Recomputed here rather than stored
 * during the sweep: one pass over each layer's nodes costs less memory than a pointer
 * per node. In the graph a variable converts only at the boundary before a use; the
 * conversions are then spread over the boundaries since its previous use, latest
 * first, so each happens just before the layer that wants the new layout. */
static dm_status walk_back(const dm_select_problem *p, const int *last, sweep *s,
                           int *layout) {
    int nl = p->nlayers, nv = p->nvars;
    if (nl == 0) return DM_OK;
    const double *dl = s->d + s->doff[nl - 1];
    const int *dln = s->dn + s->doff[nl - 1];
    int64_t bi = 0;
    for (int64_t i = 1; i < s->doff[nl] - s->doff[nl - 1]; i++)
        if (better(dl[i], dln[i], dl[bi], dln[bi])) bi = i;
    decode(p, s, nl - 1, bi, layout);
    int *gapof = s->y; /* by variable: its gap if layer g uses it, else 0 */
    for (int g = nl - 1; g >= 1; g--) {
        const int *pv = s->lv + s->loff[g - 1];
        const double *dp = s->d + s->doff[g - 1];
        const int *dpn = s->dn + s->doff[g - 1];
        int64_t pnodes = s->doff[g] - s->doff[g - 1], unused = 0;
        int np = counters(p, s, g - 1);
        for (int j = 0; j < np; j++) s->sa[j] = s->sb[j] = 0, gapof[pv[j]] = 0;
        for (int k = 0; k < p->nscope[g]; k++) gapof[p->scope[g][k]] = s->gap[s->goff[g] + k];
        double best = INFINITY;
        int bestchg = INT32_MAX;
        bi = -1;
        for (int64_t i = 0; i < pnodes; i++) {
            double c = dp[i];
            int nchg = dpn[i];
            for (int j = 0; j < np && c < INFINITY; j++) {
                int v = pv[j], a = s->digit[j];
                if (last[v] < g) continue; /* dies at g-1 */
                int b = layout[(size_t)g * nv + v];
                if (a == b) continue;
                if (!gapof[v] || !s->cl[v].cost) { /* g does not use it, or it never converts */
                    c = INFINITY;
                    break;
                }
                const int *H;
                const double *P = power(s, p, v, gapof[v], &H);
                c += P[a * p->ndom[v] + b], nchg += H[a * p->ndom[v] + b];
            }
            if (c < INFINITY && better(c, nchg, best, bestchg)) best = c, bestchg = nchg, bi = i;
            step(np, s->radix, s->digit, s->sa, s->sb, &unused, &unused);
        }
        if (bi < 0)
            return dm_fail(DM_ERR_INTERNAL, "select: no predecessor on the path at group %d", g);
        decode(p, s, g - 1, bi, layout);
    }
    /* spread each conversion path y[0] = a .. y[h] = b: layer g-i holds y[h-i] */
    for (int g = 1; g < nl; g++)
        for (int k = 0; k < p->nscope[g]; k++) {
            int v = p->scope[g][k], gp = s->gap[s->goff[g] + k];
            if (gp == 0 || !s->cl[v].cost) continue;
            int a = layout[(size_t)(g - 1) * nv + v], b = layout[(size_t)g * nv + v];
            if (a == b) continue;
            int h = closure_path(p, v, &s->cl[v], gp, a, b, s->y);
            if (h < 1 || h > gp)
                return dm_fail(DM_ERR_INTERNAL,
                               "select: no conversion path for variable %d at group %d", v, g);
            for (int i = 1; i < h; i++) layout[(size_t)(g - i) * nv + v] = s->y[h - i];
        }
    return DM_OK;
}

/* Why nothing is feasible, found at the first layer whose nodes are all infinite. */
static dm_status infeasible(const dm_select_problem *p, int g) {
    int64_t size = 1;
    table_size(p, g, &size);
    int any = 0;
    for (int64_t i = 0; i < size && !any; i++) any = p->cost[g][i] < INFINITY;
    if (!any)
        return dm_fail(DM_ERR_UNSUPPORTED,
                       "no feasible configuration: group %d has no feasible layout combination",
                       g);
    return dm_fail(DM_ERR_UNSUPPORTED,
                   "no feasible configuration: at group %d, every feasible layout combination "
                   "conflicts with the layouts the earlier groups need (tensors that cannot "
                   "change layout, or forbidden conversions)",
                   g);
}

dm_status dm_select_solve(const dm_select_problem *p, dm_select_result *r) {
    if (!r) return dm_fail(DM_ERR_INVALID_ARG, "select: null result");
    memset(r, 0, sizeof *r);
    int *first;
    DM_TRY(validate(p, &first));
    int *last = first + (p->nvars > 0 ? p->nvars : 1);
    int64_t limit = p->max_states ? p->max_states : DM_SELECT_DEFAULT_MAX_STATES;
    if (limit > INT64_MAX / 8) limit = INT64_MAX / 8; /* 8 x limit bounds the whole graph */

    sweep s;
    memset(&s, 0, sizeof s);
    int *layout = NULL;
    dm_status st = sweep_alloc(p, first, last, limit, &s, r);
    for (int g = 0; g < p->nlayers && st == DM_OK; g++) {
        sweep_layer(p, first, last, &s, g);
        const double *dg = s.d + s.doff[g];
        int64_t i = 0, nodes = s.doff[g + 1] - s.doff[g];
        while (i < nodes && !(dg[i] < INFINITY)) i++;
        if (i == nodes) st = infeasible(p, g);
    }
    if (st == DM_OK) {
        size_t n = (size_t)p->nlayers * (size_t)p->nvars;
        layout = malloc((n > 0 ? n : 1) * sizeof *layout);
        if (!layout) st = dm_fail(DM_ERR_OOM, "select: out of memory");
    }
    if (st == DM_OK) {
        for (size_t i = 0; i < (size_t)p->nlayers * (size_t)p->nvars; i++) layout[i] = -1;
        st = walk_back(p, last, &s, layout);
    }
    int64_t nodes = r->nodes, widest = r->widest;
    if (st == DM_OK) {
        st = finish(p, first, last, layout, r); /* takes layout over */
        layout = NULL;
        r->nodes = nodes, r->widest = widest;
    }
    if (st != DM_OK) memset(r, 0, sizeof *r);
    free(layout);
    sweep_free(p, &s);
    free(first);
    return st;
}

/* --- exhaustive reference -------------------------------------------------------------- */

dm_status dm_select_brute_force(const dm_select_problem *p, dm_select_result *r) {
    if (!r) return dm_fail(DM_ERR_INVALID_ARG, "select: null result");
    memset(r, 0, sizeof *r);
    int *first;
    DM_TRY(validate(p, &first));
    int nv = p->nvars, nl = p->nlayers;
    int *last = first + (nv > 0 ? nv : 1);

    /* A slot is one free choice: a variable's layout over layers g0..g1 (its whole life,
     * or one layer when it may convert). */
    size_t cap = (size_t)(nv > 0 ? nv : 1) * (size_t)(nl > 0 ? nl : 1);
    size_t ncell = (size_t)nl * (size_t)nv;
    int *sv = malloc(cap * sizeof *sv), *sg0 = malloc(cap * sizeof *sg0);
    int *sg1 = malloc(cap * sizeof *sg1), *dig = calloc(cap, sizeof *dig);
    int *layout = calloc(ncell > 0 ? ncell : 1, sizeof *layout);
    int *best = malloc((ncell > 0 ? ncell : 1) * sizeof *best);
    dm_status st = DM_OK;
    if (!sv || !sg0 || !sg1 || !dig || !layout || !best)
        st = dm_fail(DM_ERR_OOM, "select: out of memory");
    int ns = 0;
    int64_t count = 1;
    for (int v = 0; v < nv && st == DM_OK; v++) {
        if (first[v] < 0 || p->ndom[v] == 1) continue;
        int per_layer = has_change(p, v);
        for (int g = first[v]; g <= last[v]; g++) {
            sv[ns] = v, sg0[ns] = g, sg1[ns] = per_layer ? g : last[v];
            ns++;
            if (__builtin_mul_overflow(count, (int64_t)p->ndom[v], &count) ||
                count > (INT64_C(1) << 24)) {
                st = dm_fail(DM_ERR_UNSUPPORTED, "select: brute force: too many choices");
                break;
            }
            if (!per_layer) break;
        }
    }
    double bestc = INFINITY;
    for (int64_t i = 0; i < count && st == DM_OK; i++) {
        double c = eval(p, layout, first, last);
        if (c < bestc) {
            bestc = c;
            memcpy(best, layout, (ncell > 0 ? ncell : 1) * sizeof *best);
        }
        for (int j = ns - 1; j >= 0; j--) { /* next choice: last slot fastest */
            int v = sv[j];
            dig[j] = dig[j] + 1 < p->ndom[v] ? dig[j] + 1 : 0;
            for (int g = sg0[j]; g <= sg1[j]; g++) layout[(size_t)g * nv + v] = dig[j];
            if (dig[j]) break;
        }
    }
    if (st == DM_OK && !(bestc < INFINITY))
        st = dm_fail(DM_ERR_UNSUPPORTED, "no feasible configuration");
    if (st == DM_OK) {
        st = finish(p, first, last, best, r); /* takes best over */
        best = NULL;
        r->nodes = count;
    }
    free(sv), free(sg0), free(sg1), free(dig), free(layout), free(best), free(first);
    return st;
}
