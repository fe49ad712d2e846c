/* streams.cu: the second stream (DM_CUDA_OVERLAP): the groups whose output no later group
 * reads (weight and bias gradients) run there, forked from the main stream, joined where
 * a later group's arena bytes conflict with theirs (emulating: deferred to that moment, so
 * a missed hazard shows in the tests); and copies between two executors (a trainer's
 * layers), ordered by events rather than host waits. */
#include <stdlib.h>
#include <string.h>

#include "cuda/rowmath.cuh"
#include "cudaexec/exec.h"

int dm_cuda_exec_side_groups(const dm_cuda_exec *ex) {
    int n = 0;
    for (int gi = 0; ex && ex->on_side && gi < ex->ngroups; gi++) n += ex->on_side[gi];
    return n;
}

/* Group gi's arena spans: per tensor root in memory that its ops read or write, its bytes
 * in the plan's (fp32) arena and whether it is written. */
static dm_status group_spans(dm_cuda_exec *ex, int gi) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[gi];
    int cap = 0;
    for (int k = 0; k < gr->nops; k++) cap += dmx_op_at(plan, gr, k)->nin + dmx_op_at(plan, gr, k)->nout;
    ex->spans[gi] = (int64_t *)malloc(sizeof(int64_t) * 3 * (size_t)(cap > 0 ? cap : 1));
    if (!ex->spans[gi]) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    int n = 0;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = dmx_op_at(plan, gr, k);
        for (int s = 0; s < op->nin + op->nout; s++) {
            int r = dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]);
            if (!plan->in_memory[r] || plan->offset[r] < 0) continue;
            int64_t *x = ex->spans[gi] + 3 * n++;
            x[0] = plan->offset[r];
            x[1] = plan->offset[r] + g->t[r].numel * (int64_t)sizeof(float);
            x[2] = s >= op->nin;
        }
    }
    ex->nspans[gi] = n;
    return DM_OK;
}

/* 1 if main-stream group h must wait for side group q: h writes bytes q reads or writes,
 * or reads bytes q writes. */
static int hazard(const dm_cuda_exec *ex, int h, int q) {
    for (int a = 0; a < ex->nspans[h]; a++) {
        const int64_t *x = ex->spans[h] + 3 * a;
        for (int b = 0; b < ex->nspans[q]; b++) {
            const int64_t *y = ex->spans[q] + 3 * b;
            if ((x[2] || y[2]) && x[0] < y[1] && y[0] < x[1]) return 1;
        }
    }
    return 0;
}

/* Which groups run on the side stream: those whose written bytes no later group reads
 * (the weight and bias gradients), if they are a lone contraction or a row group (not
 * batched, not fused, no global scratch: the side has its own column-sum partials). */
dm_status dmx_init_overlap(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const size_t ng = (size_t)(ex->ngroups > 0 ? ex->ngroups : 1);
    ex->spans = (int64_t **)calloc(ng, sizeof(int64_t *));
    ex->nspans = (int *)calloc(ng, sizeof(int));
    ex->on_side = (char *)calloc(ng, 1);
    ex->pending = (int *)malloc(sizeof(int) * ng);
    ex->pending_seed = (uint64_t *)malloc(sizeof(uint64_t) * ng);
    ex->done = (cudaEvent_t *)calloc(ng, sizeof(cudaEvent_t));
    if (!ex->spans || !ex->nspans || !ex->on_side || !ex->pending || !ex->pending_seed || !ex->done)
        return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
    for (int gi = 0; gi < ex->ngroups; gi++) DM_TRY(group_spans(ex, gi));
    int nside = 0;
    for (int gi = 0; gi < ex->ngroups; gi++) {
        const dmc_group *eg = &ex->groups[gi];
        if (eg->nsteps != 1 || plan->groups[gi].nbatch > 1 || eg->fused || eg->epi || eg->skip) continue;
        /* the main stream's: their work spaces are their own */
        if (eg->steps[0].scatter || eg->steps[0].varlen || eg->steps[0].xent) continue;
        if (!eg->steps[0].gemm && ex->launch[eg->steps[0].prog].global_scratch) continue;
        int read_later = 0;
        for (int h = gi + 1; h < ex->ngroups && !read_later; h++)
            for (int a = 0; a < ex->nspans[h] && !read_later; a++)
                for (int b = 0; b < ex->nspans[gi] && !read_later; b++) {
                    const int64_t *x = ex->spans[h] + 3 * a, *y = ex->spans[gi] + 3 * b;
                    read_later = !x[2] && y[2] && x[0] < y[1] && y[0] < x[1];
                }
        ex->on_side[gi] = !read_later;
        nside += !read_later;
    }
    if (!nside) return DM_OK;
    if (ex->partial_floats)
        DM_TRY(dmx_dev_alloc(ex, (void **)&ex->side_partials, ex->partial_floats * sizeof(float),
                         "column-sum partials of the second stream"));
    if (dmx_emulated(ex)) return DM_OK;
    DM_TRY(dmx_stream_and_blas(ex, &ex->side_stream, &ex->have_side_stream, &ex->blas2, &ex->have_blas2));
    DMC_CUDA(cudaEventCreateWithFlags(&ex->fork, cudaEventDisableTiming));
    ex->have_fork = 1;
    for (int gi = 0; gi < ex->ngroups; gi++) {
        if (!ex->on_side[gi]) continue;
        DMC_CUDA(cudaEventCreateWithFlags(&ex->done[gi], cudaEventDisableTiming));
        ex->ndone = gi + 1; /* events 0 .. gi exist (unused ones are NULL: destroy skips) */
    }
    return DM_OK;
}

/* The pending side groups up to and including pending[k] are waited for (emulating: run
 * now, in order) and dropped. */
static dm_status join_upto(dm_cuda_exec *ex, int k) {
    if (k < 0) return DM_OK;
    if (dmx_emulated(ex)) {
        for (int i = 0; i <= k; i++) {
            dm_status s = dmx_run_steps(ex, ex->pending[i], ex->pending_seed[i], 0, 1);
            if (s != DM_OK) { /* those that ran are done */
                memmove(ex->pending, ex->pending + i, sizeof(int) * (size_t)(ex->npending - i));
                memmove(ex->pending_seed, ex->pending_seed + i, sizeof(uint64_t) * (size_t)(ex->npending - i));
                ex->npending -= i;
                return s;
            }
        }
    } else {
        DMC_CUDA(cudaStreamWaitEvent(ex->stream, ex->done[ex->pending[k]], 0));
    }
    memmove(ex->pending, ex->pending + k + 1, sizeof(int) * (size_t)(ex->npending - k - 1));
    memmove(ex->pending_seed, ex->pending_seed + k + 1, sizeof(uint64_t) * (size_t)(ex->npending - k - 1));
    ex->npending -= k + 1;
    return DM_OK;
}

dm_status dmx_join_all(dm_cuda_exec *ex) { return join_upto(ex, ex->npending - 1); }

/* Before main-stream group h: the latest pending side group it conflicts with, and all
 * before it, are waited for. */
dm_status dmx_resolve_hazards(dm_cuda_exec *ex, int h) {
    int k = ex->npending - 1;
    while (k >= 0 && !hazard(ex, h, ex->pending[k])) k--;
    return join_upto(ex, k);
}

/* Before the main stream reads (writing = 0) or writes tensor t's root: the latest
 * pending side group that writes those bytes (or, writing, touches them at all), and all
 * before it, are waited for; the others may go on running. */
static dm_status join_touching(dm_cuda_exec *ex, int t, int writing) {
    const dm_plan *plan = ex->plan;
    const int r = dm_tensor_root(plan->g, t);
    if (plan->offset[r] < 0) return DM_OK;
    const int64_t lo = plan->offset[r], hi = lo + plan->g->t[r].numel * (int64_t)sizeof(float);
    int k = ex->npending - 1;
    for (; k >= 0; k--) {
        const int q = ex->pending[k];
        int hit = 0;
        for (int b = 0; b < ex->nspans[q] && !hit; b++) {
            const int64_t *y = ex->spans[q] + 3 * b;
            hit = (writing || y[2]) && y[0] < hi && lo < y[1];
        }
        if (hit) break;
    }
    return join_upto(ex, k);
}

/* Side group gi: after everything enqueued on the main stream so far (emulating: later,
 * at join_upto). */
dm_status dmx_launch_side(dm_cuda_exec *ex, int gi, uint64_t seed) {
    if (ex->npending >= ex->ngroups) DM_TRY(dmx_join_all(ex)); /* a pass cut short by an error */
    if (!dmx_emulated(ex)) {
        DMC_CUDA(cudaEventRecord(ex->fork, ex->stream));
        DMC_CUDA(cudaStreamWaitEvent(ex->side_stream, ex->fork, 0));
        DM_TRY(dmx_prof_mark(ex, gi, 0, ex->side_stream));
        DM_TRY(dmx_run_steps(ex, gi, seed, 0, 1));
        DM_TRY(dmx_prof_mark(ex, gi, 1, ex->side_stream));
        DMC_CUDA(cudaEventRecord(ex->done[gi], ex->side_stream));
    }
    ex->pending_seed[ex->npending] = seed;
    ex->pending[ex->npending++] = gi;
    return DM_OK;
}

/* dst[i] += src[i] in storage type T, fp32 arithmetic (dm_cuda_add_tensor). */
template <typename T> __global__ void add_kernel(T *dst, const T *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = (T)((float)dst[i] + (float)src[i]);
}

/* copy_or_add's work for `add`, on dst's stream (or the host, emulated). */
static dm_status add_span(const dm_cuda_exec *dst, char *pd, const char *ps, int dt, size_t n) {
    if (dmx_emulated(dst)) {
        for (size_t i = 0; i < n; i++) dmc_store(pd, dt, (int64_t)i, dmc_load(pd, dt, (int64_t)i) + dmc_load(ps, dt, (int64_t)i));
        return DM_OK;
    }
    const size_t b = (n + 255) / 256;
    const unsigned blocks = (unsigned)(b < 4096 ? b : 4096);
    if (dt == DMC_BF16) add_kernel<<<blocks, 256, 0, dst->stream>>>((__nv_bfloat16 *)pd, (const __nv_bfloat16 *)ps, n);
    else if (dt == DMC_F16) add_kernel<<<blocks, 256, 0, dst->stream>>>((__half *)pd, (const __half *)ps, n);
    else add_kernel<<<blocks, 256, 0, dst->stream>>>((float *)pd, (const float *)ps, n);
    DMC_LAUNCHED("the tensor add kernel");
    return DM_OK;
}

static dm_status copy_or_add(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts, int add);

dm_status dm_cuda_copy_tensor(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts) {
    return copy_or_add(dst, td, src, ts, 0);
}

dm_status dm_cuda_add_tensor(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts) {
    return copy_or_add(dst, td, src, ts, 1);
}

static dm_status copy_or_add(dm_cuda_exec *dst, int td, dm_cuda_exec *src, int ts, int add) {
    if (!dst || !src) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_copy_tensor: NULL executor");
    if (dmx_emulated(dst) != dmx_emulated(src))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_copy_tensor: one executor is emulated, the other not");
    char *pd = NULL, *ps = NULL;
    int dtd = DMC_F32, dts = DMC_F32;
    size_t nd = 0, ns = 0;
    DM_TRY(dmc_tensor_span(dst, td, &pd, &dtd, &nd));
    DM_TRY(dmc_tensor_span(src, ts, &ps, &dts, &ns));
    const dm_tensor *xd = &dst->plan->g->t[td], *xs = &src->plan->g->t[ts];
    int same = dtd == dts && nd == ns && xd->ndim == xs->ndim;
    for (int d = 0; same && d < xd->ndim; d++)
        same = xd->size[d] == xs->size[d] && xd->stride[d] == xs->stride[d];
    if (!same)
        return dm_fail(DM_ERR_INVALID_ARG, "cannot %s %s into %s: their shapes, layouts or storage "
                       "types differ", add ? "add" : "copy", xs->name, xd->name);
    if (!nd) return DM_OK;
    if (add && pd == ps) return dm_fail(DM_ERR_INVALID_ARG, "cannot add %s to itself", xs->name);
    /* on dst's stream, after src's work so far that writes the tensor (a side-stream group
     * among it: the input gradient's last sum may run there; the weight gradients there
     * go on, overlapping dst's work) and dst's own that touches its bytes; no host wait:
     * dst's later work is ordered after the copy, and src's later main-stream work (and
     * the side groups it forks) after it too */
    if (src->npending) DM_TRY(join_touching(src, ts, 0));
    if (dst->npending) DM_TRY(join_touching(dst, td, 1));
    const size_t bytes = nd * (dtd == DMC_F32 ? 4u : 2u);
    if (dmx_emulated(dst)) {
        if (add) return add_span(dst, pd, ps, dtd, nd);
        memcpy(pd, ps, bytes);
        return DM_OK;
    }
    if (!src->have_xfer) {
        DMC_CUDA(cudaEventCreateWithFlags(&src->xfer, cudaEventDisableTiming));
        src->have_xfer = 1;
    }
    if (!dst->have_copied) {
        DMC_CUDA(cudaEventCreateWithFlags(&dst->copied, cudaEventDisableTiming));
        dst->have_copied = 1;
    }
    DMC_CUDA(cudaEventRecord(src->xfer, src->stream));
    DMC_CUDA(cudaStreamWaitEvent(dst->stream, src->xfer, 0));
    if (add) DM_TRY(add_span(dst, pd, ps, dtd, nd));
    else DMC_CUDA(cudaMemcpyAsync(pd, ps, bytes, cudaMemcpyDeviceToDevice, dst->stream));
    DMC_CUDA(cudaEventRecord(dst->copied, dst->stream));
    DMC_CUDA(cudaStreamWaitEvent(src->stream, dst->copied, 0));
    return DM_OK;
}
