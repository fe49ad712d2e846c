/* backend.h: the backend interface: the table of functions every backend (src/cpu,
 * src/cuda + cudaexec + cudagen, ...) implements, through which the layer (src/layer/) runs
 * a plan and the trainer (src/train/) keeps its state beside the plans. Each backend
 * defines one `const dm_backend dm_backend_<name>`; the registry (src/layer/backends.c)
 * lists the backends the Makefile built. C and CUDA C++.
 *
 * A backend's state for one plan (one layer) runs the plan's groups on the backend's
 * memory. Beside it the layer keeps a host arena laid out by the same plan (fp32, every
 * tensor at its plan offset): the tensors the user reads and writes. `upload` and
 * `download` move a tensor between the two; a backend whose memory is the host arena
 * (the CPU's) makes them no-ops, and its trainer buffers are the host buffers themselves
 * (buf_new returns `host`), so that a caller that keeps the host copies as a cache of the
 * backend's state, as the trainer does, moves nothing on it. */
#ifndef DM_PLAN_BACKEND_H
#define DM_PLAN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"
#include "graph/optim_elem.h"
#include "plan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dm_backend_state dm_backend_state; /* a backend's state for one plan */
typedef struct dm_backend_pool dm_backend_pool;   /* buffers states of one backend share */

/* create's flags */
enum {
    DM_BACKEND_LENIENT = 1u /* a group the backend cannot run (its operands' layouts) is
                             * marked unusable, and fails if run, instead of failing
                             * create: the tuner measures the others */
};

/* The CUDA backend's entry (src/cudaexec/backend.cu: C++17, which has no designated
 * initializers) initialises this struct by position, in field order: a field added here
 * goes into that list at its place too. Its compile-time checks (each field right after
 * the one before it, mse the last, no field unnamed) fail the build until it does. */
typedef struct dm_backend {
    const char *name;      /* "cpu", "cuda": as dm_device_kind_name of its device */
    dm_device_kind device; /* the device it runs layers on */
    int merge_siblings;    /* its plans merge sibling batched contractions (dm_plan_build's
                            * `siblings`) */
    int runs_pairs;        /* it runs a plan's contraction pairs ("concurrent") and row
                            * groups in a GEMM's epilogue ("direct_rows"), which
                            * dm_plan_describe then names */
    int activations_apart; /* create() takes host_act, a plan's activations apart from its
                            * arena (the CPU's: the host arena is its memory) */
    const dm_algo_table *algos; /* the names of its algorithm choices (plan/algo.h), as
                            * plan files give them; NULL: it has none of its own, and a
                            * plan file's are the CPU backend's (`dmove tune` measures
                            * there) */

    /* --- options -------------------------------------------------------------------- */
    /* Refuses the options this backend does not take (DM_ERR_UNSUPPORTED, saying which
     * and why), after dm_layer_options_check's own checks of their values. */
    dm_status (*check_options)(const dm_layer_options *opt);
    /* Fills in the defaults of *opt that the backend takes from its environment (rows,
     * streams, ...): what a layer made with *opt runs with. DM_ERR_INVALID_ARG for a bad
     * variable (*opt then as it was). */
    dm_status (*resolve_options)(dm_layer_options *opt);
    /* Whether a padded encoder layer of cfg made with *opt (attention_op 0) should run its
     * attention as one ATTN op (graph/encoder.h's attn_op): where the backend's kernels for
     * it beat the ops one by one. NULL: never. */
    int (*attn_op)(const dm_layer_config *cfg, const dm_layer_options *opt);

    /* --- a plan's state ---------------------------------------------------------------- */
    /* The state that runs `plan` (which must outlive it) for a layer whose host arena is
     * `host` (plan->arena_bytes, zeroed, 64-byte aligned): options (storage type, threads,
     * row kernels, streams, the plan file's name for messages), flags DM_BACKEND_*, and
     * the pool of pool_new whose buffers it may share (NULL: its own). host_act: NULL, or
     * (only where activations_apart says the backend takes it) where the plan's
     * activations are instead of the arena's end (plan->activation_bytes, 64-byte
     * aligned; the arena's first arena_bytes - activation_bytes are then all it has):
     * memory that other layers' states share, whose passes never overlap this one's. */
    dm_status (*create)(dm_backend_state **out, const dm_plan *plan, char *host, char *host_act,
                        const dm_layer_options *opt, unsigned flags, dm_backend_pool *pool);
    void (*destroy)(dm_backend_state *st);
    /* What the backend chose for the plan, as named values (dm_layer_note): *notes points
     * into the state (valid until destroy); the count is returned (0: nothing to say). */
    int (*notes)(const dm_backend_state *st, const dm_layer_note **notes);
    /* Memory it holds beside the arena, in bytes (dm_layer_memory.scratch). */
    size_t (*workspace_bytes)(const dm_backend_state *st);
    /* The group whose time holds group gi's (gi runs inside or beside it), or -1. */
    int (*timed_with)(const dm_backend_state *st, int gi);

    /* --- tensors and groups ------------------------------------------------------------ */
    /* Tensor t (a materialized root or a view of one) between the backend's memory and
     * `host`, which holds it as the host arena does (host arena + its offset). Synchronous
     * (after the work enqueued before). */
    dm_status (*upload)(dm_backend_state *st, int t, const float *host);
    dm_status (*download)(dm_backend_state *st, int t, float *host);
    /* Where tensor t's first element is in the backend's memory (the device's for a GPU:
     * an address there), its storage type in *dtype (a dm_dtype); NULL if not in memory. */
    void *(*tensor_addr)(dm_backend_state *st, int t, int *dtype);
    /* Runs (or enqueues) group gi with dropout seed `seed`. contractions_only: the pass
     * runs only the contraction groups (the "contractions alone" floor): a batched group
     * runs just its GEMMs, a GEMM with a row group in its epilogue runs without it. */
    dm_status (*run_group)(dm_backend_state *st, int gi, uint64_t seed, int contractions_only);
    /* The next steps run on the first `rows` of the plan's live rows (graph.h's
     * dm_graph.live: the MLM head's scored rows, an unpadded model's embedded tokens), or
     * (lengths not NULL, rows ignored; an unpadded layer's plan, graph/encoder.h's unpad,
     * takes nothing else) on the tokens of sequences of these lengths (b floats: whole
     * numbers in [0, j], at least one token in all; else DM_ERR_INVALID_ARG naming the bad
     * one) packed from row 0, their dropout keyed by the padded positions: the groups over
     * those rows run on that many, and the plan's outputs there are 0 past them.
     * DM_ERR_UNSUPPORTED (saying why) for a plan that can only run whole. NULL where the
     * backend runs every plan whole (dm_layer_new refuses dm_layer_options.unpad there). */
    dm_status (*set_rows)(dm_backend_state *st, int64_t rows, const float *lengths);
    /* Dropout on (training) or off (evaluation) for the next steps, where the backend
     * fixed the plan's dropout probabilities when it was made; NULL where its kernels read
     * each operator's probability when they run (dm_layer_set_training sets them). */
    dm_status (*set_training)(dm_backend_state *st, int training);
    /* Waits for the work enqueued so far; errors of asynchronous work surface here. */
    dm_status (*sync)(dm_backend_state *st);
    /* Profiling on or off for the next groups. *by_events = 1: the backend times each
     * group itself (device events, without waiting after each), and profile_take gives the
     * times; 0: the caller times each group on the host's clock around run_group, which
     * then returns when the group is done. */
    dm_status (*profile)(dm_backend_state *st, int on, int *by_events);
    /* Waits, then secs[gi] (one per group) = group gi's time since the last take, 0 for a
     * group not run. */
    dm_status (*profile_take)(dm_backend_state *st, double *secs);

    /* --- what the trainer keeps beside the plans ------------------------------------- */
    /* A pool for the states of layers whose work never runs at once (a trainer's stack),
     * made before them and freed after them; *pool may be NULL (nothing shared). */
    dm_status (*pool_new)(dm_backend_pool **pool);
    void (*pool_free)(dm_backend_pool *pool);
    size_t (*pool_bytes)(const dm_backend_pool *pool); /* its memory, bytes */
    /* A buffer of `bytes` in the backend's memory for what the plan does not hold, the
     * twin of host buffer `host` (or NULL: none); `what` names it in an out-of-memory
     * message. A backend whose memory is the host's returns `host` itself. buf_free
     * takes the same `host`. */
    dm_status (*buf_new)(dm_backend_state *st, size_t bytes, void *host, void **buf, const char *what);
    void (*buf_free)(dm_backend_state *st, void *buf, void *host);
    /* A synchronous copy between host memory and such a buffer (to_backend: host to
     * buffer), after the work enqueued before; nothing when dst == src. */
    dm_status (*buf_copy)(dm_backend_state *st, void *dst, const void *src, size_t bytes, int to_backend);
    /* Tensor ts of state src into tensor td of state dst (two plans of this backend): the
     * same shape, layout and storage, else DM_ERR_INVALID_ARG. Ordered after src's work so
     * far and before both states' later work (it may be enqueued). */
    dm_status (*copy_tensor)(dm_backend_state *dst, int td, dm_backend_state *src, int ts);
    /* As copy_tensor, but adds: td += ts element by element (fp32 arithmetic, the sum
     * stored in td's storage type), in the backend's memory. (A model's tied tables: the
     * decoder's gradient into the word table's.) */
    dm_status (*add_tensor)(dm_backend_state *dst, int td, dm_backend_state *src, int ts);
    /* The optimizer's work on parameter tensor tp (gradient tg, n elements each, dense),
     * graph/optim_elem.h's arithmetic; buffers of buf_new; may be enqueued.
     * sumsq: the sum of squares of the gradient (tensor tg, or buffer `src` when not NULL)
     * as DM_NORM_PARTS partial sums into out[0 .. DM_NORM_PARTS).
     * accumulate: acc = g (first) or acc + g, the gradient of tensor tg in fp32.
     * optimize: pass `kind` with constants k; m, v its fp32 moments; master its fp32 master
     * weights in 16-bit storage (the parameter is then written as them rounded), else
     * NULL; acc: the gradient is read from there instead of tg, else NULL; norms: for
     * DM_PASS_LAMB_MOMENTS, the partial sums of w^2 then of u^2 (2 * DM_NORM_PARTS). */
    dm_status (*sumsq)(dm_backend_state *st, int tg, const float *src, int64_t n, double *out);
    /* Data parallelism (dmove.h: dm_dist). reduce: sums the gradient of tensor tg (in its
     * storage type; or, when buf is not NULL, the n fp32 of a buf_new buffer at buf) over
     * the ranks of d in place (root -1: every rank gets the sums; else rank root alone),
     * after the work given to st so far and while the work given after it goes on (MPI on
     * a thread of its own, NCCL on a stream of its own); bcast: the same way, rank root's
     * tensor t (or fp32 buffer buf) to every rank; reduce_wait: returns when every
     * collective handed over is done and its results are where the next work on any state
     * reads them. NULL where the backend has no transport (refused by the trainer). */
    dm_status (*reduce)(dm_backend_state *st, int tg, float *buf, int64_t n, int root, dm_dist *d);
    dm_status (*bcast)(dm_backend_state *st, int t, float *buf, int64_t n, int root, dm_dist *d);
    dm_status (*reduce_wait)(dm_backend_state *st, dm_dist *d);
    dm_status (*accumulate)(dm_backend_state *st, int tg, int64_t n, float *acc, int first);
    dm_status (*optimize)(dm_backend_state *st, dm_optim_pass_kind kind, int tp, int tg, int64_t n, float *master,
                          float *m, float *v, const float *acc, const dm_optim_coef *k, double *norms);
    /* The trainer's mean squared error over the `tokens` rows of `width` elements of
     * tensor ty: where mask[t] != 0, partial[t] = the sum over row t of (y - target)^2
     * (the difference in fp32, the sum in double, in an order the backend fixes),
     * elsewhere 0; with
     * tdy >= 0, tensor tdy = scale * (y - target), 0 on the rows the mask drops. target,
     * mask and partial are buffers of buf_new; partial is then copied to host_partial
     * (synchronous). */
    dm_status (*mse)(dm_backend_state *st, int ty, int tdy, const float *target, const float *mask, int64_t tokens,
                     int64_t width, float scale, double *partial, double *host_partial);
} dm_backend;

#ifdef __cplusplus
}
#endif
#endif
