/* emulate.cu: the CUDA executor's emulation mode (DM_CUDA_EMULATE), for tests on machines
 * without a GPU. The executor keeps its "device" buffers in host memory and sends the
 * very arguments it would give cuBLAS and the row kernel to these host functions:
 *  - dmc_emu_gemm: cublasGemmStridedBatchedEx's definition (column-major, op(X) = X or
 *    X^T, C = alpha op(A) op(B) + beta C per batch index), in double, by loops;
 *  - dmc_emu_rows: row_kernel and colacc_kernel (rows.cu) block by block: the same grid,
 *    the same per-block scratch (shared memory is a fresh buffer filled with NaN, so a
 *    read of a scratch row nobody wrote shows up), the same partials and their sum in
 *    block order. Each op is computed sequentially with the formulas of rows.cu.
 * What this checks: operand mapping, strides, leading dimensions, batch merging, scratch
 * slots, tile temporaries, accumulators. What it cannot: the device code itself (thread
 * mapping, barriers, shuffles, Philox on the device), which tests/test_cuda.c checks on
 * a GPU. Host code only. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

extern "C" {
#include "core/philox.h"
}

void dmc_emu_gemm(int transa, int transb, int m, int n, int k, float alpha, const float *A,
                  int lda, long long sA, const float *B, int ldb, long long sB, float beta,
                  float *C, int ldc, long long sC, int batch) {
    for (int b = 0; b < batch; b++) {
        const float *a = A + (long long)b * sA, *bb = B + (long long)b * sB;
        float *c = C + (long long)b * sC;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    double x = transa ? a[l + (long long)i * lda] : a[i + (long long)l * lda];
                    double y = transb ? bb[j + (long long)l * ldb] : bb[l + (long long)j * ldb];
                    s += x * y;
                }
                float *dst = &c[i + (long long)j * ldc];
                *dst = (float)(alpha * s + (beta != 0.0f ? beta * *dst : 0.0));
            }
    }
}

/* Emulation is fp32 only (dm_cuda_exec_init refuses other storage types with it). */
static float *emu_operand(const dmc_operand *d, float *scr, int64_t r, int64_t cols) {
    if (d->loc == DMC_LOC_SCRATCH) return scr + d->slot;
    float *base = (float *)d->base;
    switch (d->kind) {
    case DM_ARG_FULL: return base + r * cols;
    case DM_ARG_GROUPED: return base + (r / d->rdiv) * cols;
    case DM_ARG_ROWSCALAR: return base + r;
    default: return base;
    }
}

/* act_both of rows.cu, with host math (normcdf(x) = erfc(-x / sqrt 2) / 2). */
static float emu_act(float x, int act, float *grad) {
    if (act == DM_ACT_RELU) {
        *grad = x > 0 ? 1.0f : 0.0f;
        return x > 0 ? x : 0.0f;
    }
    if (act == DM_ACT_GELU_TANH) {
        float x2 = x * x;
        float s = 0.7978845608028654f * fmaf(0.044715f * x2, x, x);
        float ds = 0.7978845608028654f * fmaf(3.0f * 0.044715f, x2, 1.0f);
        float e = expf(-2.0f * fabsf(s));
        float inv = 1.0f / (1.0f + e), einv = e * inv;
        float sg = s < 0 ? einv : inv;
        *grad = fmaf(2.0f * x * ds, inv * einv, sg);
        return x * sg;
    }
    float cdf = 0.5f * erfcf(-x * 0.70710678118654752f);
    *grad = fmaf(x * expf(-0.5f * x * x), 0.3989422804014327f, cdf);
    return x * cdf;
}

static void emu_rowop(const dmc_rowop *op, int64_t r, int64_t n, float *scr, uint64_t seed) {
    const float *in[DM_MAX_IN] = {0};
    float *out[DM_MAX_OUT] = {0};
    for (int s = 0; s < op->nin; s++) in[s] = emu_operand(&op->in[s], scr, r, n);
    for (int s = 0; s < op->nout; s++) out[s] = emu_operand(&op->out[s], scr, r, n);
    const float *a = in[0], *b = in[1];
    float *y = out[0];
    float g;
    switch (op->kind) {
    case DM_OP_BIAS_ADD:
    case DM_OP_ADD:
        for (int64_t c = 0; c < n; c++) y[c] = a[c] + b[c];
        break;
    case DM_OP_MUL:
        for (int64_t c = 0; c < n; c++) y[c] = a[c] * b[c];
        break;
    case DM_OP_MASK_ADD:
        for (int64_t c = 0; c < n; c++) y[c] = a[c] + (1.0f - b[c]) * -FLT_MAX;
        break;
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD: {
        if (!op->drop_on) {
            for (int64_t c = 0; c < n; c++) y[c] = a[c];
            break;
        }
        /* as dropout_row: whole Philox blocks over the row's element indices */
        uint64_t start = (uint64_t)r * (uint64_t)n, end = start + (uint64_t)n;
        for (uint64_t q = start >> 2; q <= (end - 1) >> 2; q++) {
            uint32_t w[4];
            dm_philox_words_ref(seed, op->stream, 4 * q, 4, w);
            for (int j = 0; j < 4; j++) {
                uint64_t e = 4 * q + (uint64_t)j;
                if (e < start || e >= end) continue;
                int64_t c = (int64_t)(e - start);
                y[c] = w[j] >= op->drop_thr ? a[c] * op->drop_scale : 0.0f;
            }
        }
        break;
    }
    case DM_OP_DROPOUT_BWD_NZ:
        for (int64_t c = 0; c < n; c++) y[c] = b[c] != 0.0f ? a[c] * op->drop_scale : 0.0f;
        break;
    case DM_OP_ACT:
        for (int64_t c = 0; c < n; c++) y[c] = emu_act(a[c], op->act, &g);
        break;
    case DM_OP_ACT_DERIV:
        for (int64_t c = 0; c < n; c++) {
            y[c] = emu_act(a[c], op->act, &g);
            out[1][c] = g;
        }
        break;
    case DM_OP_ACT_BWD:
        for (int64_t c = 0; c < n; c++) {
            (void)emu_act(b[c], op->act, &g);
            y[c] = a[c] * g;
        }
        break;
    case DM_OP_SOFTMAX: {
        float m = -INFINITY, s = 0;
        for (int64_t c = 0; c < n; c++) m = a[c] > m ? a[c] : m;
        for (int64_t c = 0; c < n; c++) {
            y[c] = expf(a[c] - m);
            s += y[c];
        }
        float inv = 1.0f / s;
        for (int64_t c = 0; c < n; c++) y[c] *= inv;
        break;
    }
    case DM_OP_SOFTMAX_BWD: {
        float s = 0;
        for (int64_t c = 0; c < n; c++) s += a[c] * b[c];
        for (int64_t c = 0; c < n; c++) y[c] = b[c] * (a[c] - s);
        break;
    }
    case DM_OP_LAYERNORM: {
        const float *gm = in[1], *bt = in[2];
        float s = 0, v = 0;
        for (int64_t c = 0; c < n; c++) s += a[c];
        float mean = s / (float)n;
        for (int64_t c = 0; c < n; c++) v += (a[c] - mean) * (a[c] - mean);
        float rstd = (float)(1.0 / sqrt((double)(v / (float)n) + op->eps));
        for (int64_t c = 0; c < n; c++) y[c] = (a[c] - mean) * rstd * gm[c] + bt[c];
        *out[1] = mean;
        *out[2] = rstd;
        break;
    }
    case DM_OP_LAYERNORM_BWD: {
        const float *x = in[1], *gm = in[4];
        const float mean = *in[2], rstd = *in[3];
        float *dg = out[1], *db = out[2], sg = 0, sgx = 0;
        for (int64_t c = 0; c < n; c++) {
            float xh = (x[c] - mean) * rstd, gg = a[c] * gm[c];
            sg += gg;
            sgx += gg * xh;
            dg[c] += a[c] * xh;
            db[c] += a[c];
        }
        sg *= 1.0f / (float)n;
        sgx *= 1.0f / (float)n;
        for (int64_t c = 0; c < n; c++) {
            float xh = (x[c] - mean) * rstd;
            y[c] = rstd * (a[c] * gm[c] - sg - xh * sgx);
        }
        break;
    }
    case DM_OP_COLSUM:
        for (int64_t c = 0; c < n; c++) y[c] += a[c];
        break;
    default:
        break;
    }
}

dm_status dmc_emu_rows(const dmc_rowprog *p, const dmc_launch *lc, uint64_t seed,
                       float *gscratch, float *partials) {
    size_t sf = (size_t)p->scratch_floats;
    float *smem = (float *)malloc((sf ? sf : 1) * sizeof(float));
    if (!smem) return dm_fail(DM_ERR_OOM, "out of memory emulating the row kernel");
    if (p->warp_rows) { /* a row per warp, its own scratch rows, no accumulators */
        for (int64_t r = 0; r < p->rows; r++) {
            for (size_t e = 0; e < sf; e++) smem[e] = NAN;
            for (int k = 0; k < p->nops; k++) emu_rowop(&p->ops[k], r, p->cols, smem, seed);
        }
        free(smem);
        return DM_OK;
    }
    for (int blk = 0; blk < lc->blocks; blk++) {
        float *scr = lc->global_scratch ? gscratch + (size_t)blk * sf : smem;
        if (!lc->global_scratch)
            for (size_t e = 0; e < sf; e++) scr[e] = NAN; /* shared memory starts undefined */
        for (int64_t c = 0; c < p->acc_floats; c++) scr[p->acc_off + c] = 0.0f;
        for (int64_t r = blk; r < p->rows; r += lc->blocks)
            for (int k = 0; k < p->nops; k++) emu_rowop(&p->ops[k], r, p->cols, scr, seed);
        if (p->nacc)
            for (int64_t c = 0; c < p->acc_floats; c++)
                partials[(size_t)blk * (size_t)p->acc_floats + c] = scr[p->acc_off + c];
    }
    free(smem);
    /* as colacc_kernel: 16 lanes sum every 16th partial, then the lanes in order */
    for (int a = 0; a < p->nacc; a++)
        for (int64_t c = 0; c < p->cols; c++) {
            float lane[16] = {0}, s;
            for (int b = 0; b < lc->blocks; b++)
                lane[b % 16] += partials[(size_t)b * (size_t)p->acc_floats + (p->acc_slot[a] - p->acc_off) + c];
            s = lane[0];
            for (int y = 1; y < 16; y++) s += lane[y];
            ((float *)p->acc_dst[a])[c] = s;
        }
    return DM_OK;
}
