/* test_select.c: the layout selection engine (tune/select.h) against hand-computed optima
 * and against exhaustive search.
 *  1. Hand-made cases: (a) per-layer bests that agree are picked; (b) per-layer bests that
 *     disagree with no conversion allowed: the optimum pays the worse layer; (c) the same
 *     with a conversion cheap enough to pay (layout differs across the layers, one
 *     change) and one too expensive; (d) a forward/backward-like chain where a tensor made
 *     at layer 1 is read again at layer 6, plus a one-layout variable and one in no scope;
 *     (e) infeasible entries force a choice; nothing feasible fails; (f) malformed input
 *     fails with DM_ERR_INVALID_ARG, too many live combinations with DM_ERR_UNSUPPORTED.
 *  2. Randomized (seeded): hundreds of small problems, with and without conversion
 *     matrices and infeasible entries: the shortest path's total equals brute force's,
 *     and its choice, recosted here independently, sums to its reported total. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "testutil.h"
#include "tune/select.h"

#define MAXV 64
#define MAXL 64
#define MAXT 4096

/* A problem with its own storage. */
typedef struct {
    int nvars, nlayers;
    int ndom[MAXV];
    int nscope[MAXL];
    int scope[MAXL][8];
    double cost[MAXL][MAXT];
    double change[MAXV][16];
    int has_change[MAXV];
    const int *scope_p[MAXL];
    const double *cost_p[MAXL];
    const double *change_p[MAXV];
    const double *all_cost; /* non-NULL: every layer's cost table (tables beyond MAXT) */
    dm_select_problem p;
} prob;

static void prob_init(prob *q, int nvars, const int *ndom) {
    memset(q, 0, sizeof *q);
    q->nvars = nvars;
    for (int v = 0; v < nvars; v++) q->ndom[v] = ndom[v];
}

/* Adds a layer with scope vars[0..n) and costs c (row-major; NULL: zeros). */
static int add_layer(prob *q, int n, const int *vars, const double *c) {
    int g = q->nlayers++;
    q->nscope[g] = n;
    int64_t size = 1;
    for (int k = 0; k < n; k++) q->scope[g][k] = vars[k], size *= q->ndom[vars[k]];
    for (int64_t i = 0; i < size && i < MAXT; i++) q->cost[g][i] = c ? c[i] : 0;
    return g;
}

static void set_change(prob *q, int v, const double *m) {
    q->has_change[v] = 1;
    memcpy(q->change[v], m, (size_t)q->ndom[v] * q->ndom[v] * sizeof *m);
}

/* Points the dm_select_problem at the storage. */
static const dm_select_problem *P(prob *q) {
    int any = 0;
    for (int g = 0; g < q->nlayers; g++)
        q->scope_p[g] = q->scope[g], q->cost_p[g] = q->all_cost ? q->all_cost : q->cost[g];
    for (int v = 0; v < q->nvars; v++) {
        q->change_p[v] = q->has_change[v] ? q->change[v] : NULL;
        any |= q->has_change[v];
    }
    q->p.nvars = q->nvars, q->p.ndom = q->ndom, q->p.nlayers = q->nlayers;
    q->p.nscope = q->nscope, q->p.scope = q->scope_p, q->p.cost = q->cost_p;
    q->p.change = any ? q->change_p : NULL;
    return &q->p;
}

static int L(const dm_select_result *r, int g, int v) { return r->layout[g * r->nvars + v]; }

/* Independent recount of a choice's cost and a check of its shape: -1 exactly where a
 * variable is not live, fixed[], nchanges and comb[] consistent. Returns the cost. */
static double recost(const prob *q, const dm_select_result *r, int *shape_ok) {
    int first[MAXV], last[MAXV];
    for (int v = 0; v < q->nvars; v++) first[v] = last[v] = -1;
    for (int g = 0; g < q->nlayers; g++)
        for (int k = 0; k < q->nscope[g]; k++) {
            int v = q->scope[g][k];
            if (first[v] < 0) first[v] = g;
            last[v] = g;
        }
    int ok = r->nvars == q->nvars && r->nlayers == q->nlayers, changes = 0;
    double total = 0;
    for (int g = 0; g < q->nlayers; g++) {
        int64_t row = 0;
        for (int k = 0; k < q->nscope[g]; k++) row = row * q->ndom[q->scope[g][k]] + L(r, g, q->scope[g][k]);
        ok &= r->comb[g] == row;
        total += q->cost[g][row];
        for (int v = 0; v < q->nvars; v++) {
            int live = first[v] >= 0 && first[v] <= g && g <= last[v], x = L(r, g, v);
            ok &= live ? (x >= 0 && x < q->ndom[v]) : x == -1;
            if (live && g > first[v] && x != L(r, g - 1, v)) {
                changes++;
                total += q->has_change[v] ? q->change[v][L(r, g - 1, v) * q->ndom[v] + x] : INFINITY;
            }
        }
    }
    for (int v = 0; v < q->nvars; v++) {
        int fx = first[v] < 0 ? 0 : L(r, first[v], v);
        for (int g = first[v] + 1; first[v] >= 0 && g <= last[v]; g++)
            if (L(r, g, v) != fx) fx = -1;
        ok &= r->fixed[v] == fx;
    }
    ok &= r->nchanges == changes;
    *shape_ok = ok;
    return total;
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fabs(b)); }

/* --- 1. hand-made cases ------------------------------------------------------------ */

static void case_consistent(void) {
    printf("(a) per-layer bests agree: picked\n");
    static prob q; /* 2 MB: not on the stack */
    int nd[2] = {2, 3}, x[1] = {0}, xy[2] = {0, 1}, y[1] = {1};
    prob_init(&q, 2, nd);
    add_layer(&q, 1, x, (double[]){5, 1});
    add_layer(&q, 2, xy, (double[]){9, 9, 9, 7, 8, 2}); /* best X=1, Y=2 */
    add_layer(&q, 1, y, (double[]){4, 4, 3});
    dm_select_result r;
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.fixed[0] == 1 && r.fixed[1] == 2 && r.nchanges == 0);
    CHECK(r.total == 1 + 2 + 3);
    CHECK(L(&r, 0, 1) == -1 && L(&r, 2, 0) == -1); /* Y not yet live, X dead */
    CHECK(r.comb[0] == 1 && r.comb[1] == 5 && r.comb[2] == 2);
    dm_select_result_free(&r);
}

static void case_conflict(void) {
    printf("(b) bests disagree, no conversion: the optimum pays the worse layer\n");
    static prob q;
    int nd[1] = {2}, x[1] = {0};
    prob_init(&q, 1, nd);
    add_layer(&q, 1, x, (double[]){1, 10}); /* wants X=0 */
    add_layer(&q, 1, x, (double[]){8, 2});  /* wants X=1 */
    dm_select_result r;
    CHECK_OK(dm_select_solve(P(&q), &r));
    /* X=0: 1 + 8 = 9; X=1: 10 + 2 = 12 */
    CHECK(r.total == 9 && r.fixed[0] == 0 && r.nchanges == 0);
    CHECK(L(&r, 0, 0) == 0 && L(&r, 1, 0) == 0);
    dm_select_result_free(&r);

    printf("(c) the same with a cheap conversion 0->1 (3): paid\n");
    set_change(&q, 0, (double[]){0, 3, 4, 0});
    CHECK_OK(dm_select_solve(P(&q), &r));
    /* 1 + 3 + 2 = 6 < 9 */
    CHECK(r.total == 6 && r.nchanges == 1 && r.fixed[0] == -1);
    CHECK(L(&r, 0, 0) == 0 && L(&r, 1, 0) == 1);
    dm_select_result_free(&r);

    printf("    and with an expensive one (7): not paid\n");
    set_change(&q, 0, (double[]){0, 7, 4, 0});
    CHECK_OK(dm_select_solve(P(&q), &r));
    /* 1 + 7 + 2 = 10 > 9 */
    CHECK(r.total == 9 && r.nchanges == 0 && r.fixed[0] == 0);
    dm_select_result_free(&r);

    printf("    a tie (conversion 6: 1 + 6 + 2 = 9) keeps the layout\n");
    set_change(&q, 0, (double[]){0, 6, 4, 0});
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 9 && r.nchanges == 0 && r.fixed[0] == 0);
    dm_select_result_free(&r);
    /* the tie the other way round: the lowest index at the last layer (X=0) is reached
     * only through the conversion; the whole path must still keep X=1 */
    prob_init(&q, 1, (int[]){2});
    add_layer(&q, 1, (int[]){0}, (double[]){10, 1});
    add_layer(&q, 1, (int[]){0}, (double[]){2, 8});
    set_change(&q, 0, (double[]){0, 6, 6, 0}); /* 1 + 6 + 2 = 9 = 1 + 8 */
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 9 && r.nchanges == 0 && r.fixed[0] == 1);
    dm_select_result_free(&r);
}

static void case_multihop(void) {
    printf("(c) conversions through an intermediate layout, spread over the boundaries\n");
    static prob q;
    /* X used at layers 0 and 3 (Y fills layers 1 and 2); 0->1->2 costs 2, 0->2 costs 5 */
    prob_init(&q, 2, (int[]){3, 2});
    add_layer(&q, 1, (int[]){0}, (double[]){0, 9, 9});
    add_layer(&q, 1, (int[]){1}, (double[]){1, 0});
    add_layer(&q, 1, (int[]){1}, (double[]){1, 0});
    add_layer(&q, 1, (int[]){0}, (double[]){9, 9, 0});
    set_change(&q, 0, (double[]){0, 1, 5, INFINITY, 0, 1, INFINITY, INFINITY, 0});
    dm_select_result r;
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 2 && r.nchanges == 2 && r.fixed[0] == -1 && r.fixed[1] == 1);
    /* latest first: X stays 0 through layer 1, becomes 1 at layer 2, 2 at layer 3 */
    CHECK(L(&r, 0, 0) == 0 && L(&r, 1, 0) == 0 && L(&r, 2, 0) == 1 && L(&r, 3, 0) == 2);
    int ok;
    CHECK(recost(&q, &r, &ok) == 2 && ok);
    dm_select_result_free(&r);
    /* one boundary apart there is room for one conversion only: 0->2 direct, 5 */
    prob_init(&q, 1, (int[]){3});
    add_layer(&q, 1, (int[]){0}, (double[]){0, 9, 9});
    add_layer(&q, 1, (int[]){0}, (double[]){9, 9, 0});
    set_change(&q, 0, (double[]){0, 1, 5, INFINITY, 0, 1, INFINITY, INFINITY, 0});
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 5 && r.nchanges == 1 && L(&r, 0, 0) == 0 && L(&r, 1, 0) == 2);
    dm_select_result_free(&r);
}

static void case_chain(void) {
    printf("(d) forward/backward chain: A made at layer 1, read again at layer 6\n");
    enum { A, B, C, D, E, F };
    static prob q;
    int nd[6] = {2, 2, 2, 3, 3, 1}; /* E in no scope, F one layout */
    prob_init(&q, 6, nd);
    add_layer(&q, 1, (int[]){B}, (double[]){2, 1});
    add_layer(&q, 2, (int[]){B, A}, (double[]){4, 9, 3, 8});       /* A=1 costs 5 more */
    add_layer(&q, 2, (int[]){A, C}, (double[]){2, 3, 7, 8});       /* A=1 costs 5 more */
    add_layer(&q, 3, (int[]){C, F, D}, (double[]){4, 1, 6, 1, 4, 6});
    add_layer(&q, 1, (int[]){D}, (double[]){1, 3, 0});
    add_layer(&q, 2, (int[]){D, C}, (double[]){2, 2, 2, 2, 9, 9});
    add_layer(&q, 2, (int[]){A, C}, (double[]){100, 100, 1, 1});   /* backward wants A=1 */
    /* By hand: A=1 (pays 5 + 5, saves 99), B=1 (1 + 8); with A=1 the C,D part:
     * C=0: 7 + min_D(L3+L4+L5) = 7 + min(7, 6, 15) = 13; C=1: 8 + min(4, 9, 15) = 12.
     * So C=1, D=0: 1 + 8 + 8 + 1 + 1 + 2 + 1 = 22. Greedy per layer would take A=0: 110+. */
    dm_select_result r, bf;
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 22);
    CHECK(r.fixed[A] == 1 && r.fixed[B] == 1 && r.fixed[C] == 1 && r.fixed[D] == 0);
    CHECK(r.fixed[E] == 0 && r.fixed[F] == 0 && r.nchanges == 0);
    CHECK(L(&r, 0, A) == -1);
    for (int g = 1; g <= 6; g++) CHECK(L(&r, g, A) == 1);
    for (int g = 0; g < 7; g++) CHECK(L(&r, g, E) == -1);
    CHECK(L(&r, 3, F) == 0 && L(&r, 2, F) == -1);
    CHECK(L(&r, 1, B) == 1 && L(&r, 2, B) == -1);
    /* live sets {B} {A,B} {A,C} {A,C,D} x3 {A,C}: 2+4+4+12+12+12+4 nodes */
    CHECK(r.nodes == 50 && r.widest == 12);
    printf("    total %g over %lld nodes (widest layer %lld)\n", r.total, (long long)r.nodes,
           (long long)r.widest);
    CHECK_OK(dm_select_brute_force(P(&q), &bf));
    CHECK(bf.total == 22 && memcmp(bf.layout, r.layout, sizeof(int) * 7 * 6) == 0);
    dm_select_result_free(&bf);
    dm_select_result_free(&r);

    printf("    C may convert (cost 0.5): C=0 for layer 2, C=1 after, saves 0.5\n");
    set_change(&q, C, (double[]){0, 0.5, 0.5, 0});
    CHECK_OK(dm_select_solve(P(&q), &r));
    /* layer 2 with C=0 is 7 instead of 8; then one conversion to C=1 for layers 3..6 */
    CHECK(r.total == 21.5 && r.nchanges == 1 && r.fixed[C] == -1);
    CHECK(L(&r, 2, C) == 0 && L(&r, 3, C) == 1 && L(&r, 6, C) == 1);
    int ok;
    CHECK(recost(&q, &r, &ok) == 21.5 && ok);
    double c;
    CHECK_OK(dm_select_cost(P(&q), r.layout, &c));
    CHECK(c == 21.5);
    dm_select_result_free(&r);
}

static void case_infeasible(void) {
    printf("(e) infeasible entries force a choice\n");
    static prob q;
    int nd[1] = {3}, x[1] = {0};
    prob_init(&q, 1, nd);
    add_layer(&q, 1, x, (double[]){1, INFINITY, 5});
    add_layer(&q, 1, x, (double[]){INFINITY, 0, 2});
    dm_select_result r;
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 7 && r.fixed[0] == 2);
    dm_select_result_free(&r);
    set_change(&q, 0, (double[]){0, 1, INFINITY, INFINITY, 0, INFINITY, INFINITY, INFINITY, 0});
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 2 && L(&r, 0, 0) == 0 && L(&r, 1, 0) == 1); /* 1 + convert 1 + 0 */
    dm_select_result_free(&r);

    printf("    no feasible combination at all: DM_ERR_UNSUPPORTED\n");
    prob_init(&q, 1, nd);
    add_layer(&q, 1, x, (double[]){1, 2, 3});
    add_layer(&q, 1, x, (double[]){INFINITY, INFINITY, INFINITY});
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_UNSUPPORTED);
    CHECK(strstr(dm_last_error(), "no feasible configuration") &&
          strstr(dm_last_error(), "group 1"));
    CHECK(r.layout == NULL);
    dm_select_result_free(&r); /* harmless after a failure */
    CHECK(dm_select_brute_force(P(&q), &r) == DM_ERR_UNSUPPORTED);

    printf("    feasible layers that conflict through a fixed tensor: DM_ERR_UNSUPPORTED\n");
    prob_init(&q, 1, nd);
    add_layer(&q, 1, x, (double[]){1, INFINITY, INFINITY});
    add_layer(&q, 1, x, (double[]){INFINITY, INFINITY, 1});
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_UNSUPPORTED);
    printf("      %s\n", dm_last_error());
    CHECK(strstr(dm_last_error(), "group 1") && strstr(dm_last_error(), "conflict"));
}

/* A nest of live ranges: variable k (nd layouts) is read at layer k and again `mid`
 * empty layers after layer n-1, mirrored, so all n are live from layer n-1 to n+mid
 * while every cost table has nd entries (all zero). */
static void nest(prob *q, int n, int mid, int nd) {
    static double zeros[1000000];
    int ndv[MAXV];
    for (int v = 0; v < n; v++) ndv[v] = nd;
    prob_init(q, n, ndv);
    for (int k = 0; k < n; k++) add_layer(q, 1, &k, NULL);
    for (int k = 0; k < mid; k++) add_layer(q, 0, NULL, NULL);
    for (int k = n - 1; k >= 0; k--) add_layer(q, 1, &k, NULL);
    q->all_cost = zeros; /* nd may exceed MAXT */
}

static void case_bad_input(void) {
    printf("(f) malformed input: DM_ERR_INVALID_ARG\n");
    static prob q;
    int nd[2] = {2, 2};
    dm_select_result r;
    prob_init(&q, 2, nd);
    add_layer(&q, 2, (int[]){0, 1}, NULL);
    CHECK_OK(dm_select_solve(P(&q), &r));
    dm_select_result_free(&r);
    CHECK(dm_select_solve(NULL, &r) == DM_ERR_INVALID_ARG);
    CHECK(dm_select_solve(P(&q), NULL) == DM_ERR_INVALID_ARG);

    q.ndom[1] = 0;
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    q.ndom[1] = 2;
    q.scope[0][1] = 2;
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    q.scope[0][1] = -1;
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    q.scope[0][1] = 0;
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_last_error(), "twice"));
    q.scope[0][1] = 1;
    q.cost[0][3] = -1;
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    q.cost[0][3] = NAN;
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    q.cost[0][3] = 0;
    set_change(&q, 1, (double[]){0, NAN, 1, 0});
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    set_change(&q, 1, (double[]){0, -2, 1, 0});
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_INVALID_ARG);
    q.has_change[1] = 0;
    P(&q);
    q.cost_p[0] = NULL;
    CHECK(dm_select_solve(&q.p, &r) == DM_ERR_INVALID_ARG);
    P(&q);
    q.p.nscope = NULL;
    CHECK(dm_select_solve(&q.p, &r) == DM_ERR_INVALID_ARG);
    P(&q);
    q.p.max_states = -1;
    CHECK(dm_select_solve(&q.p, &r) == DM_ERR_INVALID_ARG);
    CHECK(dm_select_brute_force(NULL, &r) == DM_ERR_INVALID_ARG);
    double c;
    CHECK(dm_select_cost(P(&q), (int[]){0, 2}, &c) == DM_ERR_INVALID_ARG); /* layout 2 of 2 */
    q.p.max_states = 0;
    CHECK_OK(dm_select_cost(&q.p, (int[]){1, 1}, &c));
    CHECK(c == 0);

    printf("(f) too many combinations live at once: DM_ERR_UNSUPPORTED naming the group\n");
    nest(&q, 23, 0, 2);
    CHECK(dm_select_solve(P(&q), &r) == DM_ERR_UNSUPPORTED); /* 2^23 > default 2^22 */
    printf("      %s\n", dm_last_error());
    CHECK(strstr(dm_last_error(), "group 22") && strstr(dm_last_error(), "--max-layouts"));
    nest(&q, 10, 0, 2);
    P(&q);
    q.p.max_states = 16;
    CHECK(dm_select_solve(&q.p, &r) == DM_ERR_UNSUPPORTED);
    CHECK(strstr(dm_last_error(), "group 4")); /* 2^5 > 16 at layer 4 */
    q.p.max_states = 1024; /* exactly the widest layer: fine */
    CHECK_OK(dm_select_solve(&q.p, &r));
    CHECK(r.total == 0 && r.widest == 1024);
    dm_select_result_free(&r);
    /* each layer within the limit, but more than 8 x limit nodes over the step */
    nest(&q, 10, 20, 2);
    P(&q);
    q.p.max_states = 1024;
    CHECK(dm_select_solve(&q.p, &r) == DM_ERR_UNSUPPORTED);
    printf("      %s\n", dm_last_error());
    CHECK(strstr(dm_last_error(), "whole step"));
    /* node counts that overflow int64 are refused, not wrapped */
    nest(&q, 23, 0, 1000000);
    P(&q);
    q.p.max_states = INT64_MAX;
    CHECK(dm_select_solve(&q.p, &r) == DM_ERR_UNSUPPORTED);
    CHECK(strstr(dm_last_error(), "group"));

    printf("    empty problems: no layers, no variables\n");
    prob_init(&q, 2, nd);
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 0 && r.fixed[0] == 0 && r.fixed[1] == 0);
    dm_select_result_free(&r);
    prob_init(&q, 0, nd);
    add_layer(&q, 0, NULL, (double[]){2.5});
    CHECK_OK(dm_select_solve(P(&q), &r));
    CHECK(r.total == 2.5);
    dm_select_result_free(&r);
}

/* --- 2. randomized against brute force ---------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}
static int rint_(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }
static double runif(void) { return rnd() / 4294967296.0; }

/* A random problem (nv, domains, layers and scope sizes drawn from the ranges given)
 * whose brute force is at most `budget` choices and widest layer `max_nodes` nodes. */
static void random_problem(prob *q, double budget, double max_nodes, int vlo, int vhi, int dhi, int llo, int lhi,
                           int shi) {
    for (;;) {
        int nd[MAXV], nv = rint_(vlo, vhi);
        for (int v = 0; v < nv; v++) nd[v] = rint_(1, dhi);
        prob_init(q, nv, nd);
        int nl = rint_(llo, lhi), integer = rnd() & 1, with_change = rnd() & 1;
        for (int g = 0; g < nl; g++) {
            int n = rint_(1, nv < shi ? nv : shi), vars[8], k = 0;
            while (k < n) {
                int v = rint_(0, nv - 1), dup = 0;
                for (int i = 0; i < k; i++) dup |= vars[i] == v;
                if (!dup) vars[k++] = v;
            }
            double c[MAXT];
            for (int i = 0; i < MAXT; i++)
                c[i] = runif() < 0.1 ? INFINITY : integer ? rint_(0, 9) : 10 * runif();
            add_layer(q, n, vars, c);
        }
        for (int v = 0; v < nv && with_change; v++) {
            if (runif() < 0.4) continue;
            double m[16];
            for (int i = 0; i < 16; i++)
                m[i] = runif() < 0.1 ? INFINITY : integer ? rint_(0, 4) : 4 * runif();
            set_change(q, v, m);
        }
        /* brute-force size: a layout per variable, or per live layer if it may convert */
        double size = 1;
        for (int v = 0; v < nv; v++) {
            int first = -1, last = -1;
            for (int g = 0; g < nl; g++)
                for (int k = 0; k < q->nscope[g]; k++)
                    if (q->scope[g][k] == v) last = g, first = first < 0 ? g : first;
            if (first >= 0) size *= pow(q->ndom[v], q->has_change[v] ? last - first + 1 : 1);
        }
        /* the widest layer: product of the domains live at once */
        double widest = 1;
        for (int g = 0; g < nl; g++) {
            double w = 1;
            for (int v = 0; v < nv; v++) {
                int live_before = 0, live_after = 0;
                for (int h = 0; h < nl; h++)
                    for (int k = 0; k < q->nscope[h]; k++)
                        if (q->scope[h][k] == v) live_before |= h <= g, live_after |= h >= g;
                if (live_before && live_after) w *= q->ndom[v];
            }
            widest = fmax(widest, w);
        }
        if (size <= budget && widest <= max_nodes) return;
    }
}

static void randomized(void) {
    int n = 500, agree = 0, infeasible = 0, with_changes = 0, paid = 0;
    printf("randomized: %d problems (2-6 variables, 1-3 layouts, 3-8 layers, scopes of 1-3, "
           "10%% infeasible entries, half with conversion matrices) vs brute force\n", n);
    static prob q;
    for (int t = 0; t < n; t++) {
        random_problem(&q, 100000, INFINITY, 2, 6, 3, 3, 8, 3);
        const dm_select_problem *p = P(&q);
        with_changes += p->change != NULL;
        dm_select_result r, bf, r2;
        dm_status s1 = dm_select_solve(p, &r), s2 = dm_select_brute_force(p, &bf);
        CHECK(s1 == s2);
        if (s1 != s2) {
            fprintf(stderr, "  problem %d: solve %s, brute force %s (%s)\n", t,
                    dm_status_name(s1), dm_status_name(s2), dm_last_error());
            continue;
        }
        if (s1 == DM_ERR_UNSUPPORTED) {
            infeasible++;
            continue;
        }
        CHECK(s1 == DM_OK);
        if (s1 != DM_OK) continue;
        int ok1, ok2;
        double c1 = recost(&q, &r, &ok1), c2 = recost(&q, &bf, &ok2);
        CHECK(ok1 && ok2);
        CHECK(close_to(r.total, bf.total));
        CHECK(close_to(c1, r.total) && close_to(c2, bf.total));
        if (close_to(r.total, bf.total) && close_to(c1, r.total)) agree++;
        else
            fprintf(stderr, "  problem %d: solve %.17g (recost %.17g), brute force %.17g\n", t,
                    r.total, c1, bf.total);
        paid += r.nchanges > 0;
        /* deterministic: the same problem gives the same choice */
        CHECK_OK(dm_select_solve(p, &r2));
        CHECK(r2.total == r.total &&
              memcmp(r2.layout, r.layout, sizeof(int) * q.nlayers * q.nvars) == 0);
        dm_select_result_free(&r2);
        dm_select_result_free(&bf);
        dm_select_result_free(&r);
    }
    printf("    %d agree with brute force (%d with conversions paid), %d infeasible in both, "
           "%d had conversion matrices\n", agree, paid, infeasible, with_changes);
    CHECK(agree + infeasible == n && agree > n / 2 && paid > 10 && infeasible > 0);
}

/* Problems too big for brute force: the optimum cannot depend on how the variables are
 * numbered, nor on running the step backwards (layers reversed, conversion matrices
 * transposed: every choice keeps its cost). */
static void metamorphic(void) {
    int n = 60, same = 0, infeasible = 0;
    int64_t widest = 0;
    printf("metamorphic: %d problems (8-16 variables, 1-4 layouts, 10-40 layers, scopes of "
           "1-4): same total with variables renumbered and with the step reversed\n", n);
    static prob q, qp, qr;
    for (int t = 0; t < n; t++) {
        random_problem(&q, INFINITY, 1 << 16, 8, 16, 4, 10, 40, 4);
        int perm[MAXV];
        for (int v = 0; v < q.nvars; v++) perm[v] = v;
        for (int v = q.nvars - 1; v > 0; v--) {
            int j = rint_(0, v), x = perm[v];
            perm[v] = perm[j], perm[j] = x;
        }
        /* qp: variable v becomes perm[v]; the scope order (and so the tables) is kept */
        int nd[MAXV];
        for (int v = 0; v < q.nvars; v++) nd[perm[v]] = q.ndom[v];
        prob_init(&qp, q.nvars, nd);
        prob_init(&qr, q.nvars, q.ndom);
        for (int g = 0; g < q.nlayers; g++) {
            int vars[8];
            for (int k = 0; k < q.nscope[g]; k++) vars[k] = perm[q.scope[g][k]];
            add_layer(&qp, q.nscope[g], vars, q.cost[g]);
            int h = q.nlayers - 1 - g;
            add_layer(&qr, q.nscope[h], q.scope[h], q.cost[h]);
        }
        for (int v = 0; v < q.nvars; v++) {
            if (!q.has_change[v]) continue;
            int d = q.ndom[v];
            double tr[16];
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) tr[b * d + a] = q.change[v][a * d + b];
            set_change(&qp, perm[v], q.change[v]);
            set_change(&qr, v, tr);
        }
        dm_select_result r, rp, rr;
        dm_status s = dm_select_solve(P(&q), &r), sp = dm_select_solve(P(&qp), &rp),
                  sr = dm_select_solve(P(&qr), &rr);
        CHECK(s == sp && s == sr);
        if (s == DM_ERR_UNSUPPORTED && sp == s && sr == s) infeasible++;
        if (s == DM_OK && sp == DM_OK && sr == DM_OK) {
            int ok;
            CHECK(close_to(recost(&q, &r, &ok), r.total) && ok);
            CHECK(close_to(rp.total, r.total) && close_to(rr.total, r.total));
            same += close_to(rp.total, r.total) && close_to(rr.total, r.total);
            if (r.widest > widest) widest = r.widest;
        }
        dm_select_result_free(&r), dm_select_result_free(&rp), dm_select_result_free(&rr);
    }
    printf("    %d agree, %d infeasible in all three; widest layer %lld nodes\n", same,
           infeasible, (long long)widest);
    CHECK(same + infeasible == n && same > 0);
}

int main(void) {
    case_consistent();
    case_conflict();
    case_multihop();
    case_chain();
    case_infeasible();
    case_bad_input();
    randomized();
    metamorphic();
    TEST_END();
}
