/* plan.c: a plan's life after the fusion pass made it (fusion.c): freeing it, and the
 * text listing of its groups. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "plan/plan.h"

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
        /* an algorithm with DM_ALGO_ROWS_EPILOGUE (the CPU's "direct_rows"): the next group
         * runs in this one's epilogue (the CPU executor refuses a plan where it cannot) */
        int rows_in = pairs && plan->algo && G + 1 < plan->ngroups &&
                      (dm_algo_flags(plan->algos, plan->algo[plan->order[gr->first]]) & DM_ALGO_ROWS_EPILOGUE);
        int rows_of = pairs && plan->algo && G > 0 &&
                      (dm_algo_flags(plan->algos, plan->algo[plan->order[plan->groups[G - 1].first]]) &
                       DM_ALGO_ROWS_EPILOGUE);
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
