/* cuda_backend.h: the CUDA backend's C interface (no CUDA types in it), in front of the
 * .cu files, for the library's C code and the tests. Its executor runs the same dm_plan
 * as the CPU backend (cpu/exec.c): the same groups in the same order, every materialized
 * tensor at the same byte offset, but in one device arena. The host arena of a layer
 * stays as the staging copy: dm_cuda_upload / dm_cuda_download move a tensor between the
 * two. Compiled only when the Makefile finds nvcc (DM_HAVE_CUDA). */
#ifndef DM_CUDA_BACKEND_H
#define DM_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "plan/plan.h"
#include "graph/optim_elem.h"

typedef struct dm_cuda_exec dm_cuda_exec;
/* Buffers several executors share when their main streams never run at once (a
 * trainer's layers, chained one after another): the batched groups' tile temporaries, the
 * global row scratch and the column-sum partials, each made by the first executor that
 * needs it, of its size (an executor needing more makes its own). Freed after them. */
typedef struct dm_cuda_pool dm_cuda_pool;
dm_status dm_cuda_pool_new(dm_cuda_pool **out, int emulated);
void dm_cuda_pool_free(dm_cuda_pool *pool);
size_t dm_cuda_pool_bytes(const dm_cuda_pool *pool); /* device memory it holds */

/* Storage type of the device arena: every tensor in this type (LayerNorm's row
 * statistics aside, kept in fp32), arithmetic and GEMM accumulation in fp32. The host
 * staging arena stays fp32: upload rounds to the storage type (nearest even), download
 * widens. Emulation (DM_CUDA_EMULATE) runs every storage type. */
enum { DM_CUDA_FP32 = 0, DM_CUDA_BF16 = 1, DM_CUDA_FP16 = 2 };

/* Executor flags. */
enum {
    DM_CUDA_TF32 = 1u,           /* let cuBLAS use TF32 tensor cores (off: fp32 tests need
                                  * 1e-5, TF32 gives ~1e-3) */
    DM_CUDA_GLOBAL_SCRATCH = 2u, /* keep fused intermediates in global memory even where
                                  * they fit in shared memory (tests the fallback) */
    DM_CUDA_EMULATE = 4u,        /* tests, no GPU needed: host memory instead of device
                                  * memory, the exact cuBLAS calls run by a column-major
                                  * reference, the row programs interpreted on the CPU
                                  * (emulate.cu). Checks the plan's mapping (operands,
                                  * strides, scratch, tiles, partials), not the kernels. */
    DM_CUDA_SYNC_EACH = 8u,      /* debugging: wait after every GEMM and kernel, so a
                                  * device fault is reported with its group and op */
    DM_CUDA_GEN = 16u,           /* run row groups as kernels generated per group and
                                  * compiled at init by NVRTC (cudagen/) where they qualify;
                                  * emulating, the same generated code built for the host
                                  * (dm_layer_options.rows chooses it for a layer) */
    DM_CUDA_SIM_LANES = 32u,     /* with DM_CUDA_EMULATE | DM_CUDA_GEN: the host runs the
                                  * generated device kernels themselves, a thread per lane
                                  * (genrt.cuh, DMG_SIM): teams, shuffles, 16-byte accesses
                                  * and shared memory as on the GPU. Slow; for tests. */
    DM_CUDA_EPILOGUE = 128u,     /* a lone contraction followed by a group that only adds a
                                  * bias to its output (attention's qkv projection) runs as
                                  * one cuBLASLt call with the bias epilogue, straight into
                                  * the biased tensor; the bias group then does nothing (so
                                  * the pre-bias tensor is never written: whole steps only,
                                  * not groups run alone) */
    DM_CUDA_AUTO = 256u,         /* with DM_CUDA_GEN: at init, time each group's generated
                                  * or fused kernel (and each bias epilogue) against the
                                  * interpreter and cuBLAS path on the arena, and keep the
                                  * faster per group (emulating: host time, which tests
                                  * the mechanism, not the choice) */
    DM_CUDA_OVERLAP = 64u        /* a second stream: every group whose output no later
                                  * group reads (weight and bias gradients; a lone
                                  * contraction or a row group) runs there, overlapping
                                  * the groups after it; a later group that touches its
                                  * operands' bytes waits for it first. Emulating, such a
                                  * group is deferred to the last moment that order
                                  * allows (so a missed hazard shows). */
};

/* The environment (cudaexec/backend.cu). DMOVE_CUDA_EMULATE=1: `--device cuda` layers run
 * the executor emulated on the host (DM_CUDA_EMULATE: slow, no GPU needed; for tests of
 * what drives the executor, e.g. the trainer; *on = 1); lanes: the same, and the generated
 * kernels (rows gen or auto) run as the device kernels themselves, lane by lane
 * (DM_CUDA_SIM_LANES: slower still; tests/test_ops.c; *on = 2); unset or 0: off (*on = 0);
 * anything else is DM_ERR_INVALID_ARG. rows: the choice a layer with option r makes: r, or for
 * DM_ROWS_DEFAULT the DMOVE_CUDA_ROWS environment variable, else DM_ROWS_AUTO
 * (DM_ROWS_INTERP emulated). streams: the streams a layer with option `streams` uses (1 or
 * 2): it, or for 0 the DMOVE_CUDA_STREAMS environment variable, else 2 (1 emulated).
 * DM_ERR_INVALID_ARG for a bad variable or value. */
dm_status dm_cuda_emulate_resolve(int *on);
dm_status dm_cuda_rows_resolve(dm_rows r, dm_rows *out);
/* The flash attention kernels (flash.cu): off by DMOVE_CUDA_FLASH=0 (1 then); and NULL
 * where they take attention of this storage type (DM_CUDA_*), head width, sequence length
 * and kind, else why not (the rule dmc_flash_ok applies first, before the operands). */
int dm_cuda_flash_off(void);
const char *dm_cuda_flash_shape_why(int dtype, int64_t head, int64_t seq, int causal, int keymask);
dm_status dm_cuda_streams_resolve(int streams, int *out);

/* DM_OK if a usable CUDA device is present; `why` (n bytes) then names it. Otherwise
 * DM_ERR_BACKEND (also recorded for dm_last_error), with the reason in `why`, e.g. the
 * error of cudaGetDeviceCount. */
dm_status dm_cuda_available(char *why, size_t n);

/* Prepares the plan on device 0: one device arena of plan->arena_bytes (zeroed), the GEMM
 * calls, the row programs of the fused groups. `plan` must outlive the executor. */
dm_status dm_cuda_exec_init(dm_cuda_exec **ex, const dm_plan *plan, int dtype, unsigned flags);
/* The same, its main-stream buffers from `pool` where they fit (NULL: its own). */
dm_status dm_cuda_exec_init_pooled(dm_cuda_exec **ex, const dm_plan *plan, int dtype, unsigned flags,
                                   dm_cuda_pool *pool);
void dm_cuda_exec_free(dm_cuda_exec *ex);
/* The next steps on the plan's first `rows` live rows, or (lengths: B floats) on the
 * tokens of sequences of these lengths (plan/live.h; backend.h's set_rows). DM_ERR_UNSUPPORTED
 * for a plan that runs whole (saying why), DM_ERR_INVALID_ARG for bad rows or lengths. */
dm_status dm_cuda_exec_set_rows(dm_cuda_exec *ex, int64_t rows, const float *lengths);
/* Dropout on (training, as made) or off (evaluation) for the next steps: the row programs'
 * dropout switched off (re-sent to the device) and the generated and fused kernels, which
 * have it compiled in, left for the interpreter and cuBLAS meanwhile; the attention's too. */
dm_status dm_cuda_exec_set_training(dm_cuda_exec *ex, int training);
/* Tensor t's first element in the device arena (or the fp32 side buffer) and its storage
 * type (DM_CUDA_*); NULL if not in memory. */
void *dm_cuda_tensor_addr(dm_cuda_exec *ex, int t, int *dtype);
/* How many of the executor's row programs run as generated kernels (*programs: all). */
int dm_cuda_exec_generated(const dm_cuda_exec *ex, int *programs);
/* How many batched groups (attention) run as one fused kernel each (DM_CUDA_GEN, 16-bit
 * storage); their row programs count as generated above. */
int dm_cuda_exec_fused(const dm_cuda_exec *ex);
/* How many unpadded attention groups (ATTN, ATTN_BWD) run flash.cu's kernels, and why the
 * first that does not ("" if none or all do). */
int dm_cuda_exec_flash(const dm_cuda_exec *ex);
const char *dm_cuda_exec_flash_note(const dm_cuda_exec *ex);
/* Of those, the ones that leave a GEMM to cuBLAS after the kernel (tests). */
int dm_cuda_exec_fused_tails(const dm_cuda_exec *ex);
/* DM_CUDA_AUTO: why the generated kernels could not be built (NVRTC's words) and the layer
 * runs the interpreter and cuBLAS instead; "" when they were built or not asked for. */
const char *dm_cuda_exec_gen_note(const dm_cuda_exec *ex);
/* How many contractions take the next group's bias into a cuBLASLt epilogue. */
int dm_cuda_exec_epilogues(const dm_cuda_exec *ex);
/* 1 if group gi runs nothing of its own: its bias is added in the epilogue of the
 * contraction before it. */
int dm_cuda_exec_group_absorbed(const dm_cuda_exec *ex, int gi);
/* The GPU's name as the driver gives it ("" when emulated or unknown). */
const char *dm_cuda_exec_gpu_name(const dm_cuda_exec *ex);
/* How many groups run on the second stream (DM_CUDA_OVERLAP). */
int dm_cuda_exec_side_groups(const dm_cuda_exec *ex);
/* Device memory the executor holds beyond its arena: the tile temporaries of batched
 * groups, global scratch, column-sum partials (those it did not borrow from a pool), fp32
 * row statistics, row programs, GEMM address arrays, cuBLASLt's workspace (not what
 * cuBLAS and the CUDA runtime keep). */
size_t dm_cuda_exec_workspace_bytes(const dm_cuda_exec *ex);

/* Enqueues group gi (asynchronous: errors of the kernels may surface at dm_cuda_sync).
 * only_contractions: just the GEMMs of a batched group. */
dm_status dm_cuda_exec_group(dm_cuda_exec *ex, int gi, uint64_t seed, int only_contractions);
dm_status dm_cuda_sync(dm_cuda_exec *ex);
/* Profiling by CUDA events (on a GPU; emulating, *by_events = 0 and the caller times
 * on the host): with `on`, every group enqueued records an event on its stream before
 * and after its own work (after waiting for the groups it depends on), so each group's
 * GPU time is known without waiting after it and the streams keep overlapping. */
dm_status dm_cuda_exec_profile(dm_cuda_exec *ex, int on, int *by_events);
/* Waits for the GPU, then secs[gi] (one per group) = group gi's time (seconds) since the
 * last take, 0 for a group not run; the recorded marks are cleared. */
dm_status dm_cuda_exec_profile_take(dm_cuda_exec *ex, double *secs);

/* Copies tensor t (a materialized root or a view of one) between the device arena and
 * `host`, which holds the tensor in the same layout as the arena (the span from its first
 * to its last element, gaps of a strided view included), e.g. dm_cpu_tensor_ptr of a
 * host arena planned by the same plan. Synchronous. */
dm_status dm_cuda_upload(dm_cuda_exec *ex, int t, const float *host);
dm_status dm_cuda_download(dm_cuda_exec *ex, int t, float *host);
/* The whole arena (plan->arena_bytes), for tests. Synchronous. In bf16/fp16 storage,
 * tensors that share arena bytes in the plan are converted one by one: after a download
 * the shared host bytes hold the last of them (dm_cuda_download reads one exactly). */
dm_status dm_cuda_upload_arena(dm_cuda_exec *ex, const void *host);
dm_status dm_cuda_download_arena(dm_cuda_exec *ex, void *host);

/* Rounds x[0..n) to the nearest value of storage type `dtype`, finite values beyond its
 * range to its largest finite one (as the device stores masked scores), in place; fp32:
 * unchanged. For tests. */
void dm_cuda_round(int dtype, float *x, size_t n);

/* The device Philox words [start, start + n) of a dropout stream
 * (the words dm_philox_words gives on the CPU), for the tests. */
dm_status dm_cuda_philox_words(uint64_t seed, uint32_t stream, uint64_t start, int64_t n,
                               uint32_t *host_out);

/* --- the trainer's work beside the plan (through cudaexec/backend.cu) ---------------- */

/* A buffer of `bytes` in the executor's memory (the GPU's; emulating, the host's) for
 * what the plan does not hold (master weights, moments, targets); contents undefined
 * until written. `what` names it in an out-of-memory message. */
dm_status dm_cuda_alloc(dm_cuda_exec *ex, size_t bytes, void **dev, const char *what);
void dm_cuda_free(dm_cuda_exec *ex, void *dev);
/* A synchronous copy between host memory and such a buffer (to_device: host to buffer),
 * after all work enqueued before it. */
dm_status dm_cuda_memcpy(dm_cuda_exec *ex, void *dst, const void *src, size_t bytes, int to_device);
/* Tensor ts of executor src into tensor td of executor dst (two layers' plans on the same
 * device): the same shape, layout and storage type, else DM_ERR_INVALID_ARG. Enqueued on
 * dst's stream after src's work so far that writes the tensor (events, no host wait);
 * dst's later work and src's later work both come after it. */
dm_status dm_cuda_copy_tensor(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts);
/* As dm_cuda_copy_tensor, but td += ts (fp32 arithmetic, stored in the storage type). */
dm_status dm_cuda_add_tensor(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts);
/* Elements of tensor t's span in the arena (first to last element, gaps included). */
dm_status dm_cuda_tensor_elems(const dm_cuda_exec *ex, int t, size_t *n);
/* The optimizer's work (plan/backend.h's sumsq, accumulate, optimize; graph/optim_elem.h)
 * on parameter tensor tp and its gradient tg, both in the arena's storage type, n elements
 * each, dense (else DM_ERR_INTERNAL); m, v: its fp32 moments; master: its fp32 master
 * weights in 16-bit storage (the parameter is then written as them rounded), NULL in fp32
 * storage (the parameter is its own master); acc: the gradient in fp32 instead of tg, or
 * NULL. Buffers of dm_cuda_alloc. Enqueued. */
dm_status dm_cuda_sumsq(dm_cuda_exec *ex, int tg, const float *src, int64_t n, double *out);
dm_status dm_cuda_accumulate(dm_cuda_exec *ex, int tg, int64_t n, float *acc, int first);
/* Data parallelism (plan/backend.h: reduce, bcast, reduce_wait): tensor t (its storage
 * type) or the fp32 buffer buf summed over the ranks of d (root -1: on every rank, else on
 * rank root) or, with bcast, rank root's to every rank, by NCCL on a stream of the
 * launch's own, after the work enqueued so far; emulated, on dist's MPI thread (fp32
 * only). reduce_wait: the host waits for them (their times go to d). */
dm_status dm_cuda_reduce(dm_cuda_exec *ex, int t, float *buf, int64_t n, int root, int bcast, dm_dist *d);
dm_status dm_cuda_reduce_wait(dm_cuda_exec *ex, dm_dist *d);
dm_status dm_cuda_optimize(dm_cuda_exec *ex, int kind, int tp, int tg, int64_t n, float *master, float *m, float *v,
                           const float *acc, const dm_optim_coef *k, double *norms);
/* The trainer's loss over the `tokens` rows of `width` elements of tensor ty: where
 * mask[t] != 0, partial[t] = the sum over row t of (y - target)^2 (the difference in
 * fp32, the sum in double, a fixed order); elsewhere 0. With tdy >= 0, tensor tdy gets
 * scale * (y - target), zero on rows the mask drops. target (fp32, tokens x width), mask
 * (fp32, tokens) and partial (tokens doubles) are buffers of dm_cuda_alloc; partial is
 * then copied to host_partial (synchronous). */
dm_status dm_cuda_mse(dm_cuda_exec *ex, int ty, int tdy, const float *target, const float *mask,
                      int64_t tokens, int64_t width, float scale, double *partial, double *host_partial);

#ifdef __cplusplus
}
#endif
#endif
