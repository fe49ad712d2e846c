/* select.h: the selection engine of `dmove tune`: the globally cheapest choice of one
 * layout per tensor (variable) over a sequence of layers (the fused groups of a training
 * step, in execution order), given each layer's measured time for every combination of
 * the layouts it touches and, optionally, the price of converting a tensor between
 * layouts between two consecutive layers. Exact: a shortest path over a layered graph
 * whose nodes are the layout combinations live at each layer (select.c explains).
 *
 * Plain arrays only, no graph types: the caller maps its tensors to variables 0..nvars-1
 * and its groups to layers 0..nlayers-1. */
#ifndef DM_SELECT_H
#define DM_SELECT_H

#include <stdint.h>

#include "dmove.h"

/* Default limit on the nodes of one layer (layout combinations live at once). */
#define DM_SELECT_DEFAULT_MAX_STATES (INT64_C(1) << 22)

typedef struct {
    int nvars;
    const int *ndom;              /* [nvars]: layouts of each variable, >= 1 */
    int nlayers;
    const int *nscope;            /* [nlayers]: how many variables layer g touches */
    const int *const *scope;      /* [nlayers][nscope[g]]: those variables, distinct
                                   * (NULL allowed where nscope[g] == 0) */
    /* [nlayers][prod ndom[scope[g][k]]]: the time of layer g for each layout combination
     * of its scope, row-major in scope order (the last scope variable fastest); INFINITY
     * where infeasible. A layer with an empty scope has one entry. */
    const double *const *cost;
    /* NULL (no variable may change layout), or [nvars]: NULL (variable v keeps one layout
     * for its whole life) or [ndom[v] * ndom[v]]: change[v][a * ndom[v] + b] is the price
     * of converting v from layout a to layout b between two consecutive layers where it
     * is live; INFINITY forbids that conversion; the diagonal is ignored (staying is
     * free). */
    const double *const *change;
    /* Limit on the nodes of one layer; 0: DM_SELECT_DEFAULT_MAX_STATES. The whole graph
     * may hold at most 8 times as many (12 bytes each: default limit, 400 MB at most). */
    int64_t max_states;
} dm_select_problem;

/* A variable is live from the first to the last layer whose scope holds it. */
typedef struct {
    double total;      /* layer costs + change costs of the choice below */
    int nvars, nlayers;
    int *layout;       /* [nlayers * nvars]: layout of v at layer g ([g * nvars + v]),
                        * -1 where v is not live; variables of one layout read 0 */
    int *fixed;        /* [nvars]: v's one layout if it never changes (0 for variables in
                        * no scope), else -1 */
    int64_t *comb;     /* [nlayers]: the chosen row of cost[g] */
    int nchanges;      /* layout conversions paid (variable, boundary) */
    int64_t nodes;     /* nodes of the layered graph (solve); assignments tried (brute) */
    int64_t widest;    /* nodes of the widest layer (solve) */
} dm_select_result;

/* The optimum. DM_ERR_INVALID_ARG: malformed problem (null pointers, ndom < 1, scope out
 * of range or repeated, negative or NaN cost). DM_ERR_UNSUPPORTED: more layout
 * combinations live at once than max_states (the message names the group and the
 * variables), no feasible choice at all, or a convertible variable with hundreds of
 * layouts (planning its conversions is cubic in them). DM_ERR_OOM. Ties go to fewer
 * conversions, then the lowest layout indices. Conversions happen just before the layer
 * that wants the new layout (on the boundaries right before it, if it takes several).
 * On failure *r holds nothing to free (freeing it anyway is harmless). */
dm_status dm_select_solve(const dm_select_problem *p, dm_select_result *r);

/* The total cost of a choice: layout as in dm_select_result (entries where a variable is
 * not live are ignored). INFINITY if infeasible (an infeasible row, a forbidden change,
 * or a change of a variable without a change matrix). */
dm_status dm_select_cost(const dm_select_problem *p, const int *layout, double *total);

/* Exhaustive reference for tests: tries every choice (one layout per variable, or per
 * variable and layer where a change matrix lets it change). Small problems only:
 * DM_ERR_UNSUPPORTED beyond 2^24 choices. Ties: the first minimum in enumeration order. */
dm_status dm_select_brute_force(const dm_select_problem *p, dm_select_result *r);

void dm_select_result_free(dm_select_result *r);

#endif
