/* algo.c: looking up a backend's algorithm table (algo.h). */
#include "plan/algo.h"

#include <stddef.h>
#include <string.h>

const char *dm_algo_name(const dm_algo_table *t, int id) {
    return t && id >= 0 && id < t->count ? t->names[id] : "?";
}

int dm_algo_parse(const dm_algo_table *t, const char *s) {
    for (int a = 0; t && s && a < t->count; a++)
        if (!strcmp(s, t->names[a])) return a;
    return -1;
}

unsigned dm_algo_flags(const dm_algo_table *t, int id) {
    return t && id >= 0 && id < t->count ? t->flags[id] : 0u;
}
