/* dist.c: the processes of an MPI launch as the library sees them (dmove.h: dm_dist_*).
 * A world of one process needs no MPI at all; with MPI (built with DM_HAVE_MPI) every
 * collective is non-blocking and polled against a deadline, so a rank that died or hangs
 * stops the others in bounded time instead of holding them forever; the gradients'
 * reductions run on a thread of their own, in the order they were handed over (the same
 * on every rank), while the caller's backward pass goes on. */
#include "dist/dist.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "core/sysinfo.h"

#ifdef DM_HAVE_MPI
#include <mpi.h>
#endif

#define DM_DIST_QUEUE 4096 /* reductions queued at once (a step hands over one per tensor) */

typedef struct {
    float *buf;
    int64_t n;
    int root;     /* -1: every rank gets the sums; else rank root only (or, bcast: its values) */
    int bcast;    /* rank root's values to every rank instead of sums */
    const char *what;
} reduction;

struct dm_dist {
    int rank, size, local_rank;
    int mpi;          /* MPI was initialised here (and is finalised by dm_dist_finish) */
    double timeout;   /* seconds a collective may wait */
#ifdef DM_HAVE_MPI
    MPI_Comm comm;
    int comm_ok;      /* comm was made (and is freed by dm_dist_finish) */
    /* where each rank is: its board (one record, in a window the others read without its
     * help where the transport allows: shared memory, RDMA), for naming a rank that hangs */
    MPI_Win win;
    int win_ok;
    struct board *board;
#endif
    int64_t ops;      /* collectives begun */
    /* the reduction thread */
    pthread_t worker;
    int worker_on, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* work queued, or quit */
    pthread_cond_t done;  /* the queue ran empty */
    pthread_cond_t space; /* the queue has room again */
    reduction q[DM_DIST_QUEUE];
    int head, count;      /* the queue: its first item and length (the one under way included) */
    double busy, exposed; /* seconds */
    dm_status err;        /* the first failure of a queued reduction */
    char err_msg[1024];
    pthread_mutex_t mpi_mu; /* one MPI call at a time (MPI_THREAD_SERIALIZED is enough) */
    void *slot;
    void (*release)(void *);
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int dm_dist_have_mpi(void) {
#ifdef DM_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int dm_dist_have_nccl(void) {
#ifdef DM_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

const char *dm_dist_build_info(void) {
    static char info[512];
#ifdef DM_HAVE_MPI
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) snprintf(v, sizeof v, "version unknown");
    v[strcspn(v, "\n,")] = 0; /* its first line, up to the first comma */
    snprintf(info, sizeof info, "MPI (%s)%s", v, dm_dist_have_nccl() ? " and NCCL" : "");
#else
    snprintf(info, sizeof info, "none: built without MPI (apt-get install libopenmpi-dev openmpi-bin, then "
             "make MPI=1)");
#endif
    return info;
}

/* The number of ranks a launcher's environment announces (Open MPI, MPICH/Hydra and
 * PMI-2, MVAPICH, Intel MPI), 0 when none does. */
static long launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                                       "SLURM_STEP_NUM_TASKS", NULL};
    for (int k = 0; vars[k]; k++) {
        const char *v = getenv(vars[k]);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        /* Slurm's step of one task is a process started alone (an sbatch script's) */
        if (!errno && *end == 0 && n >= (strncmp(vars[k], "SLURM", 5) ? 1 : 2)) return n;
    }
    /* a PMIx launcher that says no size (Open MPI 5's prterun sets its OMPI_ variables
     * too): launched, the size for MPI to tell (-1) */
    return getenv("PMIX_RANK") && getenv("PMIX_NAMESPACE") ? -1 : 0;
}

int dm_dist_launch_size(void) {
    const long n = launcher_size();
    return n < 0 ? 0 : n > 1 << 20 ? 1 << 20 : (int)n;
}

/* t, or DMOVE_DIST_TIMEOUT's seconds (a positive number, at most a day), or 600 s; a value
 * it cannot take is refused (a typo would leave the default wait of ten minutes) */
static dm_status timeout_from_env(double t, double *out) {
    *out = t > 0 ? t : 600.0;
    const char *v = getenv("DMOVE_DIST_TIMEOUT");
    if (t > 0 || !v || !*v) return DM_OK;
    char *end;
    const double x = strtod(v, &end);
    if (*end != 0 || !(x >= 0.1 && x <= 86400.0))
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_DIST_TIMEOUT='%s': the seconds a rank waits for the others before "
                       "it stops the run, a number from 0.1 to 86400 (e.g. 120; unset: 600)", v);
    *out = x;
    return DM_OK;
}

#ifdef DM_HAVE_MPI
/* A rank's record: how many collectives it has begun, the last one's name and when it
 * began (seconds of CLOCK_MONOTONIC: the same clock on one machine). */
struct board {
    int64_t ops;
    double since;
    double alive;   /* the last time it polled a collective (a rank stopped inside one stops it) */
    char what[104];
};

/* Before collective `what`: this rank's record. */
static void board_mark(dm_dist *d, const char *what) {
    d->ops++;
    if (!d->win_ok) return;
    d->board->ops = d->ops;
    d->board->since = d->board->alive = now_s();
    snprintf(d->board->what, sizeof d->board->what, "%s", what);
    pthread_mutex_lock(&d->mpi_mu);
    (void)MPI_Win_sync(d->win); /* the stores seen by the others' reads (separate memory models) */
    pthread_mutex_unlock(&d->mpi_mu);
}

/* After a timeout: the ranks behind this one (fewer collectives begun: the one waited for
 * never came), or in it too but not moving, or that do not answer at all, into msg. */
static void board_diagnose(dm_dist *d, char *msg, size_t n) {
    size_t k = 0;
    msg[0] = 0;
    for (int r = 0; d->win_ok && r < d->size && k + 160 < n; r++) {
        if (r == d->rank) continue;
        /* on the heap: a read that never completes (an RMA request cannot be cancelled)
         * keeps its buffer, left allocated, rather than landing in a stack reused later */
        struct board *b = malloc(sizeof *b);
        MPI_Request q;
        int done = 0;
        if (!b) break;
        if (MPI_Rget(b, (int)sizeof *b, MPI_BYTE, r, 0, (int)sizeof *b, MPI_BYTE, d->win, &q) != MPI_SUCCESS) {
            free(b);
            continue;
        }
        for (double t0 = now_s(); !done && now_s() - t0 < 2.0;) {
            if (MPI_Test(&q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
        if (!done) {
            k += (size_t)snprintf(msg + k, n - k, "; rank %d does not answer (stopped, or gone)", r);
            continue; /* b is the pending read's */
        }
        b->what[sizeof b->what - 1] = 0;
        const double now = now_s();
        if (b->ops < d->ops)
            k += (size_t)snprintf(msg + k, n - k, "; rank %d is behind: its last, \"%s\", began %.0f s ago", r,
                                  b->what, now - b->since);
        else if (b->ops == d->ops && now - b->alive > 0.5 * d->timeout)
            k += (size_t)snprintf(msg + k, n - k, "; rank %d is in it too, but has not moved for %.0f s (stopped?)",
                                  r, now - b->alive);
        free(b);
    }
}

static dm_status mpi_fail(int rc, const char *call, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return dm_fail(DM_ERR_BACKEND, "%s (%s) failed: %s", call, what, msg);
}

/* Waits for request r, polling, at most `limit` seconds. */
static dm_status wait_req(dm_dist *d, MPI_Request *r, double limit, const char *what) {
    const double t0 = now_s();
    for (unsigned spins = 0;; spins++) {
        int flag = 0;
        pthread_mutex_lock(&d->mpi_mu);
        int rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&d->mpi_mu);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Test", what);
        if (flag) return DM_OK;
        if (d->win_ok && !(spins & 255)) d->board->alive = now_s();
        /* MPI's non-blocking collectives move on only while tested: spin at first, then
         * yield the core (a backward pass on this core goes on, and the collective's
         * next round starts as soon as it can: sleeping 50 us between tests made the
         * sums 2-3x slower on 2 ranks of 1 core each), and past 50 ms of waiting (a rank
         * behind) sleep between tests */
        if (spins > 1000) {
            const double waited = now_s() - t0;
            if (waited < 0.05) sched_yield();
            else nanosleep(&(struct timespec){0, 100000}, NULL);
            if (waited > limit) {
                char who[512];
                pthread_mutex_lock(&d->mpi_mu);
                board_diagnose(d, who, sizeof who);
                pthread_mutex_unlock(&d->mpi_mu);
                return dm_fail(DM_ERR_BACKEND, "rank %d of %d waited %.3g s for the other ranks (%s)%s: a rank that "
                               "died or hangs stops the run (DMOVE_DIST_TIMEOUT sets the wait)", d->rank, d->size,
                               limit, what, who[0] ? who : "; one of them died or hangs");
            }
        }
    }
}

/* n elements at buf: summed over the ranks (root -1: every rank gets the sums; else rank
 * root), or with bcast rank root's to every rank; in chunks of an int's count. */
static dm_status coll_mpi(dm_dist *d, void *buf, int64_t n, MPI_Datatype type, size_t esize, int root, int bcast,
                          double limit, const char *what) {
    const int64_t chunk = 1 << 28; /* MPI counts are int */
    board_mark(d, what);
    for (int64_t o = 0; o < n; o += chunk) {
        const int c = (int)(n - o < chunk ? n - o : chunk);
        void *p = (char *)buf + (size_t)o * esize;
        MPI_Request r;
        pthread_mutex_lock(&d->mpi_mu);
        int rc = bcast ? MPI_Ibcast(p, c, type, root, d->comm, &r)
                 : root < 0 ? MPI_Iallreduce(MPI_IN_PLACE, p, c, type, MPI_SUM, d->comm, &r)
                 : MPI_Ireduce(d->rank == root ? MPI_IN_PLACE : p, p, c, type, MPI_SUM, root, d->comm, &r);
        pthread_mutex_unlock(&d->mpi_mu);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, bcast ? "MPI_Ibcast" : root < 0 ? "MPI_Iallreduce" : "MPI_Ireduce", what);
        DM_TRY(wait_req(d, &r, limit, what));
    }
    return DM_OK;
}

static dm_status sum_mpi(dm_dist *d, void *buf, int64_t n, MPI_Datatype type, size_t esize, const char *what) {
    return coll_mpi(d, buf, n, type, esize, -1, 0, d->timeout, what);
}
#endif

static void *worker_main(void *arg) {
    dm_dist *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->count && !d->quit) pthread_cond_wait(&d->cv, &d->mu);
        if (!d->count) break; /* quit, and nothing left */
        reduction r = d->q[d->head];
        const int failed = d->err != DM_OK;
        pthread_mutex_unlock(&d->mu);
        dm_status s = DM_OK;
        double t0 = now_s();
#ifdef DM_HAVE_MPI
        if (!failed) s = coll_mpi(d, r.buf, r.n, MPI_FLOAT, sizeof(float), r.root, r.bcast, d->timeout, r.what);
#else
        (void)r, (void)failed;
#endif
        double t1 = now_s();
        pthread_mutex_lock(&d->mu);
        d->busy += t1 - t0;
        if (s != DM_OK && d->err == DM_OK) {
            d->err = s;
            snprintf(d->err_msg, sizeof d->err_msg, "%s", dm_last_error());
        }
        d->head = (d->head + 1) % DM_DIST_QUEUE;
        d->count--;
        pthread_cond_signal(&d->space);
        if (!d->count) pthread_cond_broadcast(&d->done);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

dm_status dm_dist_start(dm_dist **out, double timeout_s) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_dist_start: out is NULL");
    *out = NULL;
    const long n = launcher_size();
#ifndef DM_HAVE_MPI
    if (n > 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "this process is one of %ld launched by an MPI launcher, but this dmove was "
                       "built without MPI, so each would train alone: rebuild with MPI (apt-get install "
                       "libopenmpi-dev openmpi-bin, then make MPI=1), or run one process without mpirun", n);
#endif
    double timeout = 600.0; /* one process alone waits for no one: its environment's value unread */
    if (n != 0) DM_TRY(timeout_from_env(timeout_s, &timeout));
    dm_dist *d = calloc(1, sizeof *d);
    if (!d) return dm_fail(DM_ERR_OOM, "out of memory");
    d->size = 1;
    d->timeout = timeout;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->mpi_mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->done, NULL);
    pthread_cond_init(&d->space, NULL);
#ifdef DM_HAVE_MPI
    if (n != 0) { /* launched (a size, or -1: MPI tells) */
        int inited = 0, provided = 0, rc;
        if ((rc = MPI_Initialized(&inited)) != MPI_SUCCESS) {
            dm_dist_finish(d);
            return mpi_fail(rc, "MPI_Initialized", "joining the launch");
        }
        if (!inited) {
            if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided)) != MPI_SUCCESS) {
                dm_dist_finish(d);
                return mpi_fail(rc, "MPI_Init_thread", "joining the launch");
            }
            d->mpi = 1;
            if (provided < MPI_THREAD_SERIALIZED) {
                dm_dist_finish(d);
                return dm_fail(DM_ERR_UNSUPPORTED, "this MPI gives thread level %d, and dmove's reductions need "
                               "MPI_THREAD_SERIALIZED (%d) or more: use an MPI built with thread support",
                               provided, MPI_THREAD_SERIALIZED);
            }
        }
        MPI_Comm local;
        if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->comm)) == MPI_SUCCESS) d->comm_ok = 1;
        if (rc != MPI_SUCCESS || (rc = MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
            (rc = MPI_Comm_rank(d->comm, &d->rank)) != MPI_SUCCESS ||
            (rc = MPI_Comm_size(d->comm, &d->size)) != MPI_SUCCESS ||
            (rc = MPI_Comm_split_type(d->comm, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local)) != MPI_SUCCESS ||
            (rc = MPI_Comm_rank(local, &d->local_rank)) != MPI_SUCCESS || (rc = MPI_Comm_free(&local)) != MPI_SUCCESS) {
            dm_dist_finish(d);
            return mpi_fail(rc, "MPI_Comm_dup/rank/size/split_type", "joining the launch");
        }
        /* the boards: a window without which the runs go on (only a hang is named less well) */
        if (d->size > 1 && MPI_Win_allocate((MPI_Aint)sizeof(struct board), 1, MPI_INFO_NULL, d->comm, &d->board,
                                            &d->win) == MPI_SUCCESS) {
            memset(d->board, 0, sizeof *d->board);
            d->win_ok = MPI_Win_lock_all(MPI_MODE_NOCHECK, d->win) == MPI_SUCCESS;
            if (!d->win_ok) MPI_Win_free(&d->win);
        }
    }
#endif
    if (d->size > 1) {
        dm_set_local_rank(d->local_rank); /* the GPU this rank takes */
        int e = pthread_create(&d->worker, NULL, worker_main, d);
        if (e) {
            dm_dist_finish(d);
            return dm_fail(DM_ERR_BACKEND, "cannot start the gradient reduction thread: %s", strerror(e));
        }
        d->worker_on = 1;
    }
    *out = d;
    return DM_OK;
}

void dm_dist_finish(dm_dist *d) {
    if (!d) return;
    if (d->worker_on) {
        pthread_mutex_lock(&d->mu);
        d->quit = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->worker, NULL);
    }
    if (d->release) d->release(d->slot);
#ifdef DM_HAVE_MPI
    if (d->win_ok) {
        MPI_Win_unlock_all(d->win);
        MPI_Win_free(&d->win);
    }
    if (d->comm_ok) MPI_Comm_free(&d->comm);
    if (d->mpi) MPI_Finalize();
#endif
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->mpi_mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->done);
    pthread_cond_destroy(&d->space);
    free(d);
}

void dm_dist_abort(dm_dist *d, int code) {
#ifdef DM_HAVE_MPI
    if (d && d->size > 1) MPI_Abort(d->comm, code ? code : 1);
#else
    (void)d, (void)code;
#endif
}

int dm_dist_rank(const dm_dist *d) { return d ? d->rank : 0; }
double dm_dist_timeout(const dm_dist *d) { return d ? d->timeout : 600.0; }
int dm_dist_size(const dm_dist *d) { return d ? d->size : 1; }
int dm_dist_local_rank(const dm_dist *d) { return d ? d->local_rank : 0; }

void *dm_dist_backend_slot(dm_dist *d) { return d ? d->slot : NULL; }
void dm_dist_set_backend_slot(dm_dist *d, void *p, void (*release)(void *)) {
    d->slot = p;
    d->release = release;
}

static dm_status queue(dm_dist *d, float *buf, int64_t n, int root, int bcast, const char *what) {
    if (!d || d->size == 1 || n <= 0) return DM_OK;
    if (root >= d->size || (bcast && root < 0))
        return dm_fail(DM_ERR_INTERNAL, "a collective rooted at rank %d of %d", root, d->size);
    pthread_mutex_lock(&d->mu);
    while (d->count == DM_DIST_QUEUE) pthread_cond_wait(&d->space, &d->mu); /* the thread takes one */
    d->q[(d->head + d->count) % DM_DIST_QUEUE] = (reduction){buf, n, root, bcast, what};
    d->count++;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return DM_OK;
}

dm_status dm_dist_reduce_start(dm_dist *d, float *buf, int64_t n, int root, const char *what) {
    return queue(d, buf, n, root, 0, what);
}

dm_status dm_dist_bcast_start(dm_dist *d, float *buf, int64_t n, int root, const char *what) {
    return queue(d, buf, n, root, 1, what);
}

dm_status dm_dist_reduce_wait(dm_dist *d) {
    if (!d || d->size == 1) return DM_OK;
    const double t0 = now_s();
    pthread_mutex_lock(&d->mu);
    while (d->count) pthread_cond_wait(&d->done, &d->mu);
    d->exposed += now_s() - t0;
    dm_status s = d->err;
    char msg[sizeof d->err_msg];
    memcpy(msg, d->err_msg, sizeof msg);
    pthread_mutex_unlock(&d->mu);
    return s == DM_OK ? DM_OK : dm_fail(s, "%s", msg);
}

void dm_dist_add_reduce_times(dm_dist *d, double busy, double exposed) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->busy += busy, d->exposed += exposed;
    pthread_mutex_unlock(&d->mu);
}

void dm_dist_reduce_times(const dm_dist *d, double *busy, double *exposed) {
    *busy = *exposed = 0;
    if (!d) return; /* one rank: what a backend forced onto the path added (DMOVE_DIST_REDUCE_ALONE) */
    pthread_mutex_lock((pthread_mutex_t *)&d->mu);
    *busy = d->busy, *exposed = d->exposed;
    pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
}

dm_status dm_dist_sum_i64(dm_dist *d, int64_t *v, int n, const char *what) {
    if (!d || d->size == 1) return DM_OK;
#ifdef DM_HAVE_MPI
    return sum_mpi(d, v, n, MPI_INT64_T, sizeof *v, what);
#else
    (void)v, (void)n, (void)what;
    return DM_OK;
#endif
}

dm_status dm_dist_sum_f64(dm_dist *d, double *v, int n, const char *what) {
    if (!d || d->size == 1) return DM_OK;
#ifdef DM_HAVE_MPI
    return sum_mpi(d, v, n, MPI_DOUBLE, sizeof *v, what);
#else
    (void)v, (void)n, (void)what;
    return DM_OK;
#endif
}

dm_status dm_dist_sum(dm_dist *d, double *v, int n) {
    if (n < 0 || (n && !v)) return dm_fail(DM_ERR_INVALID_ARG, "dm_dist_sum: bad arguments");
    return dm_dist_sum_f64(d, v, n, "a sum over the ranks");
}

static dm_status bcast_limit(dm_dist *d, void *buf, size_t bytes, int root, double limit, const char *what) {
    if (!d || d->size == 1) return DM_OK;
    if (bytes > (size_t)INT64_MAX) return dm_fail(DM_ERR_INVALID_ARG, "dm_dist_bcast: %zu bytes", bytes);
#ifdef DM_HAVE_MPI
    return coll_mpi(d, buf, (int64_t)bytes, MPI_BYTE, 1, root, 1, limit, what);
#else
    (void)buf, (void)root, (void)limit, (void)what;
    return DM_OK;
#endif
}

dm_status dm_dist_bcast(dm_dist *d, void *buf, size_t bytes, int root, const char *what) {
    return bcast_limit(d, buf, bytes, root, d ? d->timeout : 0, what);
}

dm_status dm_dist_bcast_slow(dm_dist *d, void *buf, size_t bytes, int root, const char *what) {
    /* The others wait while rank root writes a file: an hour at least. Rank root, its work
     * done, waits for them as for any collective: a rank stopped meanwhile is found in the
     * ordinary time, not an hour later. */
    const double slow = d && d->timeout > 3600 ? d->timeout : 3600;
    return bcast_limit(d, buf, bytes, root, d && d->rank == root ? d->timeout : slow, what);
}

dm_status dm_dist_barrier(dm_dist *d) {
    int64_t one = 1;
    return dm_dist_sum_i64(d, &one, 1, "a barrier");
}

dm_status dm_dist_agree(dm_dist *d, const char *what, const char *value) {
    if (!what || !value) return dm_fail(DM_ERR_INVALID_ARG, "dm_dist_agree: NULL argument");
    if (!d || d->size == 1) return DM_OK;
    char mine[1024], root[1024];
    snprintf(mine, sizeof mine, "%s", value);
    memcpy(root, mine, sizeof root);
    DM_TRY(dm_dist_bcast(d, root, sizeof root, 0, what));
    /* the lowest rank that differs (size if none) */
    int64_t first = strcmp(root, mine) ? d->rank : d->size;
    int64_t *all = calloc((size_t)d->size, sizeof *all);
    if (!all) return dm_fail(DM_ERR_OOM, "out of memory");
    all[d->rank] = first == d->size ? 0 : 1;
    dm_status s = dm_dist_sum_i64(d, all, d->size, what);
    int bad = -1;
    for (int k = 0; s == DM_OK && k < d->size && bad < 0; k++)
        if (all[k]) bad = k;
    free(all);
    DM_TRY(s);
    if (bad < 0) return DM_OK;
    char theirs[1024];
    memcpy(theirs, mine, sizeof theirs);
    DM_TRY(dm_dist_bcast(d, theirs, sizeof theirs, bad, what));
    /* where they part, from the start of that word */
    size_t at = 0;
    while (root[at] && root[at] == theirs[at]) at++;
    while (at > 0 && root[at - 1] != ' ') at--;
    return dm_fail(DM_ERR_INVALID_ARG, "the ranks differ in %s, from \"%.40s\" (rank 0) against \"%.40s\" (rank %d): "
                   "rank 0 has \"%s\", rank %d \"%s\"; launch every rank with the same options, data and dmove", what,
                   root + at, theirs + at, bad, root, bad, theirs);
}
