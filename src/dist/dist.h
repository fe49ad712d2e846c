/* dist.h: data parallelism inside the library (dist.c): the processes of an MPI launch,
 * the small collectives the trainer needs (counts and losses summed, values agreed), and
 * the gradient reductions that run on a thread of their own while the backward pass goes
 * on (buckets: a segment's gradients, handed over as soon as its backward is done). */
#ifndef DM_DIST_H
#define DM_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"

/* Sums n floats at `buf` over the ranks in place (root -1: every rank gets the same sums;
 * else rank root alone, the others' buffers left as they were): queued for the reduction
 * thread, which takes the buffers in the order given (the same order on every rank: the
 * collectives match by order). A world of 1: nothing. The buffer must not be touched
 * until dm_dist_reduce_wait. bcast_start: rank root's n floats to every rank, queued so. */
dm_status dm_dist_reduce_start(dm_dist *d, float *buf, int64_t n, int root, const char *what);
dm_status dm_dist_bcast_start(dm_dist *d, float *buf, int64_t n, int root, const char *what);
/* Waits until every queued reduction is done; the first failure among them (a rank
 * gone, a timeout), if any. The seconds waited count as the reductions' exposed time. */
dm_status dm_dist_reduce_wait(dm_dist *d);
/* The reductions' seconds so far: busy (the thread working on them) and exposed (callers
 * waiting in dm_dist_reduce_wait). */
void dm_dist_reduce_times(const dm_dist *d, double *busy, double *exposed);
/* Adds a transport's own times to them (NCCL's, measured by the backend). */
void dm_dist_add_reduce_times(dm_dist *d, double busy, double exposed);
/* Sums n int64 / doubles over the ranks in place, on the caller's thread (no reduction may
 * be queued: the caller waited). */
dm_status dm_dist_sum_i64(dm_dist *d, int64_t *v, int n, const char *what);
dm_status dm_dist_sum_f64(dm_dist *d, double *v, int n, const char *what);
/* Rank `root`'s bytes to every rank. _slow: while rank root does something long (writes
 * a checkpoint): an hour at least before the others give up (rank root itself, its work
 * done, waits the ordinary time). */
dm_status dm_dist_bcast(dm_dist *d, void *buf, size_t bytes, int root, const char *what);
dm_status dm_dist_bcast_slow(dm_dist *d, void *buf, size_t bytes, int root, const char *what);

/* The seconds a collective may wait for the other ranks (dm_dist_start's timeout). */
double dm_dist_timeout(const dm_dist *d);

/* A backend's per-world state (the CUDA backend's NCCL communicator): set once by the
 * backend, freed by `release` at dm_dist_finish. */
void *dm_dist_backend_slot(dm_dist *d);
void dm_dist_set_backend_slot(dm_dist *d, void *p, void (*release)(void *));

#endif
