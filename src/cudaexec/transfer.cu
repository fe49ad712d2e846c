/* transfer.cu: tensors and the whole arena between host (fp32) and device (the storage
 * type, converted on the host's threads), and the buffers and copies a trainer keeps beside
 * a layer's arena (train.cu, through backend.cu). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cudaexec/exec.h"

/* Device address, element type and element count of tensor t's span (its first to its
 * last element, gaps of a strided view included). */
static dm_status tensor_span(const dm_cuda_exec *ex, int t, char **dev, int *dt, size_t *n) {
    const dm_graph *g = ex->plan->g;
    if (t < 0 || t >= g->nt) return dm_fail(DM_ERR_INVALID_ARG, "no tensor %d in the plan", t);
    const dm_tensor *x = &g->t[t];
    int r = dm_tensor_root(g, t);
    if (ex->plan->offset[r] < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "tensor %s is not materialized in the arena", x->name);
    int64_t last = 0;
    *n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (x->size[d] < 1) return DM_OK;
        last += (x->size[d] - 1) * x->stride[d];
    }
    *n = (size_t)(last + 1);
    if ((size_t)ex->plan->offset[r] + ((size_t)x->offset + *n) * sizeof(float) > ex->arena_bytes)
        return dm_fail(DM_ERR_INTERNAL, "tensor %s lies outside the arena", x->name);
    *dev = (char *)dmx_arena_ptr(ex, t, dt);
    return DM_OK;
}

void *dm_cuda_tensor_addr(dm_cuda_exec *ex, int t, int *dtype) {
    if (!ex || t < 0 || t >= ex->plan->g->nt) return NULL;
    return dmx_arena_ptr(ex, t, dtype);
}

/* Host fp32 <-> a 2-byte storage type (copy_tensor converts through a host buffer), on
 * the host's threads: a trainer's batch is millions of elements, converted every step. */
void dmx_narrow(int dt, const float *src, void *dst, size_t n) {
    const int64_t m = (int64_t)n;
    if (dt == DMC_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (dt == DMC_BF16) {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) ((__nv_bfloat16 *)dst)[e] = __float2bfloat16_rn(src[e]);
    } else {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) ((__half *)dst)[e] = __float2half_rn(src[e]);
    }
}

void dmx_widen(int dt, const void *src, float *dst, size_t n) {
    const int64_t m = (int64_t)n;
    if (dt == DMC_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (dt == DMC_BF16) {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) dst[e] = __bfloat162float(((const __nv_bfloat16 *)src)[e]);
    } else {
#pragma omp parallel for schedule(static) if (m > (1 << 16))
        for (int64_t e = 0; e < m; e++) dst[e] = __half2float(((const __half *)src)[e]);
    }
}

void dm_cuda_round(int dtype, float *x, size_t n) {
    if (dtype != DM_CUDA_BF16 && dtype != DM_CUDA_FP16) return;
    const float big = dtype == DM_CUDA_BF16 ? 3.38953139e38f : 65504.0f;
    for (size_t e = 0; e < n; e++) {
        float v = isfinite(x[e]) ? fminf(fmaxf(x[e], -big), big) : x[e];
        x[e] = dtype == DM_CUDA_BF16 ? __bfloat162float(__float2bfloat16_rn(v))
                                     : __half2float(__float2half_rn(v));
    }
}

static dm_status copy_tensor(dm_cuda_exec *ex, int t, float *host, int up) {
    DM_TRY(dmx_join_all(ex)); /* copies go through the main stream */
    char *dev = NULL;
    int dt = DMC_F32;
    size_t n = 0;
    DM_TRY(tensor_span(ex, t, &dev, &dt, &n));
    if (!n) return DM_OK;
    if (dt == DMC_F32)
        return up ? dmx_dev_copy(ex, dev, host, n * sizeof(float), cudaMemcpyHostToDevice)
                  : dmx_dev_copy(ex, host, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
    const size_t CHUNK = (size_t)1 << 20; /* elements per conversion */
    uint16_t *buf = (uint16_t *)malloc(sizeof(uint16_t) * (n < CHUNK ? n : CHUNK));
    if (!buf) return dm_fail(DM_ERR_OOM, "out of memory converting %s", ex->plan->g->t[t].name);
    dm_status s = DM_OK;
    for (size_t e = 0; e < n && s == DM_OK; e += CHUNK) {
        size_t m = n - e < CHUNK ? n - e : CHUNK;
        if (up) {
            dmx_narrow(dt, host + e, buf, m);
            s = dmx_dev_copy(ex, dev + e * 2, buf, m * 2, cudaMemcpyHostToDevice);
        } else {
            s = dmx_dev_copy(ex, buf, dev + e * 2, m * 2, cudaMemcpyDeviceToHost);
            if (s == DM_OK) dmx_widen(dt, buf, host + e, m);
        }
    }
    free(buf);
    return s;
}

dm_status dm_cuda_upload(dm_cuda_exec *ex, int t, const float *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_upload: NULL argument");
    return copy_tensor(ex, t, (float *)host, 1);
}

dm_status dm_cuda_download(dm_cuda_exec *ex, int t, float *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_download: NULL argument");
    return copy_tensor(ex, t, host, 0);
}

/* The whole arena: one copy in fp32; otherwise every materialized root converted, in
 * tensor order. Roots the plan lets share bytes (lifetimes apart) are separate on the
 * device when one of them is kept wide: downloading, the last one wins the shared host
 * bytes, so read a particular tensor with dm_cuda_download. */
static dm_status copy_arena(dm_cuda_exec *ex, void *host, int up) {
    DM_TRY(dmx_join_all(ex));
    if (!ex->arena_bytes) return DM_OK;
    if (ex->dtype == DM_CUDA_FP32)
        return up ? dmx_dev_copy(ex, ex->arena, host, ex->arena_bytes, cudaMemcpyHostToDevice)
                  : dmx_dev_copy(ex, host, ex->arena, ex->arena_bytes, cudaMemcpyDeviceToHost);
    const dm_graph *g = ex->plan->g;
    for (int r = 0; r < g->nt; r++)
        if (g->t[r].base < 0 && ex->plan->offset[r] >= 0)
            DM_TRY(copy_tensor(ex, r, (float *)((char *)host + ex->plan->offset[r]), up));
    return DM_OK;
}

dm_status dm_cuda_upload_arena(dm_cuda_exec *ex, const void *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_upload_arena: NULL argument");
    return copy_arena(ex, (void *)host, 1);
}

dm_status dm_cuda_download_arena(dm_cuda_exec *ex, void *host) {
    if (!ex || !host) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_download_arena: NULL argument");
    return copy_arena(ex, host, 0);
}

/* --- buffers and copies beside the arena (the trainer: train.cu, through backend.cu) -- */

int dmc_emulated(const dm_cuda_exec *ex) { return dmx_emulated(ex); }
cudaStream_t dmc_stream(const dm_cuda_exec *ex) { return ex->stream; }
dm_status dmc_join(dm_cuda_exec *ex) { return dmx_join_all(ex); }
dm_status dmc_tensor_span(const dm_cuda_exec *ex, int t, char **dev, int *dt, size_t *n) {
    return tensor_span(ex, t, dev, dt, n);
}

dm_status dm_cuda_alloc(dm_cuda_exec *ex, size_t bytes, void **dev, const char *what) {
    if (!ex || !dev) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_alloc: NULL argument");
    const size_t before = ex->dev_bytes;
    dm_status s = dmx_dev_alloc(ex, dev, bytes, what ? what : "a buffer");
    ex->dev_bytes = before; /* its user counts these */
    return s;
}

dm_status dm_cuda_tensor_elems(const dm_cuda_exec *ex, int t, size_t *n) {
    if (!ex || !n) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_tensor_elems: NULL argument");
    char *dev = NULL;
    int dt = DMC_F32;
    return tensor_span(ex, t, &dev, &dt, n);
}

size_t dm_cuda_exec_workspace_bytes(const dm_cuda_exec *ex) {
    if (!ex) return 0;
    size_t arena = ex->arena_bytes / 4 * (size_t)ex->esz; /* as allocated by init */
    if (!arena) arena = 256;
    return ex->dev_bytes > arena ? ex->dev_bytes - arena : 0;
}

void dm_cuda_free(dm_cuda_exec *ex, void *dev) {
    if (ex && dev) dmx_dev_free(ex, dev);
}

dm_status dm_cuda_memcpy(dm_cuda_exec *ex, void *dst, const void *src, size_t bytes, int to_device) {
    if (!ex || (bytes && (!dst || !src))) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_memcpy: NULL argument");
    DM_TRY(dmx_join_all(ex)); /* the copy goes through the main stream, after all work before it */
    return dmx_dev_copy(ex, dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
}
