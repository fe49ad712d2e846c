/* algo.h: implementation choices named by the backend that owns them. A plan stores a
 * small id per operator (0: the backend's default); what an id means is the backend's
 * business. The planner, the plan files and the reports see a backend's choices only
 * through its table: each id's name (as plan files write it) and the few properties
 * planning and reporting need. */
#ifndef DM_ALGO_H
#define DM_ALGO_H

/* Properties of an algorithm that the planner and the reports act on. */
enum {
    /* runs beside a later, independent contraction of its pass (dm_plan_pairs) */
    DM_ALGO_BESIDE = 1u << 0,
    /* runs the next group, a row group, in its epilogue, on each block of rows as soon as
     * it is final */
    DM_ALGO_ROWS_EPILOGUE = 1u << 1,
};

typedef struct dm_algo_table {
    const char *backend;          /* the owner, e.g. "cpu" */
    int count;                    /* ids 0 .. count - 1; 0 is the default */
    const char *const *names;     /* names[id], as plan files have them */
    const unsigned *flags;        /* flags[id]: DM_ALGO_* */
} dm_algo_table;

/* The name of id in t ("?" if t is NULL or id out of range). */
const char *dm_algo_name(const dm_algo_table *t, int id);
/* The id named s in t, or -1. */
int dm_algo_parse(const dm_algo_table *t, const char *s);
/* id's DM_ALGO_* flags in t (0 if t is NULL or id out of range). */
unsigned dm_algo_flags(const dm_algo_table *t, int id);

#endif
