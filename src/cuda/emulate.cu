/* emulate.cu: the CUDA executor's emulation mode (DM_CUDA_EMULATE), for tests on machines
 * without a GPU. The executor keeps its "device" buffers in host memory and sends the
 * very arguments it would give cuBLAS and the row kernel to these host functions:
 *  - dmc_emu_gemm: cublasGemmStridedBatchedEx's definition (column-major, op(X) = X or
 *    X^T, C = alpha op(A) op(B) + beta C per batch index), in double, by loops, elements
 *    loaded and stored in the storage type (fp32, bf16, fp16); dmc_emu_gemm_ex, the same
 *    with C of a type of its own (cublasGemmEx's Ctype: the fused cross-entropy's fp32
 *    logits from bf16 operands);
 *  - dmc_emu_rows: row_kernel and colacc_kernel (rows.cu) block by block: the same grid,
 *    the same per-block scratch (shared memory is a fresh buffer filled with NaN, so a
 *    read of a scratch row nobody wrote shows up), the same partials and their sum in
 *    colacc_kernel's order. Each op is computed sequentially with the formulas of
 *    rows.cu, every operand read and written in its element type.
 * What this checks: operand mapping, strides, leading dimensions, batch merging, scratch
 * slots, tile temporaries, accumulators. What it cannot: the device code itself (thread
 * mapping, barriers, shuffles, Philox on the device), which tests/test_cuda.c checks on
 * a GPU. Host code only. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_internal.h"
#include "cuda/rowmath.cuh"

extern "C" {
#include "core/philox.h"
}

void dmc_emu_gemm(int dt, int transa, int transb, int m, int n, int k, float alpha, const void *A,
                  int lda, long long sA, const void *B, int ldb, long long sB, float beta,
                  void *C, int ldc, long long sC, int batch) {
    dmc_emu_gemm_ex(dt, dt, transa, transb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
}

void dmc_emu_gemm_ex(int dt, int dtc, int transa, int transb, int m, int n, int k, float alpha, const void *A,
                     int lda, long long sA, const void *B, int ldb, long long sB, float beta,
                     void *C, int ldc, long long sC, int batch) {
    const int es = dmc_esize(dt), esc = dmc_esize(dtc);
    for (int b = 0; b < batch; b++) {
        const char *a = (const char *)A + (long long)b * sA * es;
        const char *bb = (const char *)B + (long long)b * sB * es;
        char *c = (char *)C + (long long)b * sC * esc;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    double x = dmc_load(a, dt, transa ? l + (long long)i * lda : i + (long long)l * lda);
                    double y = dmc_load(bb, dt, transb ? j + (long long)l * ldb : l + (long long)j * ldb);
                    s += x * y;
                }
                long long at = i + (long long)j * ldc;
                dmc_store(c, dtc, at, (float)(alpha * s + (beta != 0.0f ? beta * dmc_load(c, dtc, at) : 0.0)));
            }
    }
}

/* An operand's row: its first element and element type (scratch: fp32). */
typedef struct {
    char *p;
    int dt;
} erow;

static erow emu_operand(const dmc_operand *d, float *scr, int64_t r, int64_t cols) {
    if (d->loc == DMC_LOC_SCRATCH) return erow{(char *)(scr + d->slot), DMC_F32};
    return erow{(char *)d->base + dmc_row_elem(d, r, cols) * dmc_esize(d->dt), d->dt};
}

/* r: the row; kr: the row whose dropout words it draws */
static void emu_rowop(const dmc_rowop *op, int64_t r, int64_t kr, int64_t n, float *scr, uint64_t seed) {
    erow in[DM_MAX_IN] = {}, out[DM_MAX_OUT] = {};
    for (int s = 0; s < op->nin; s++) in[s] = emu_operand(&op->in[s], scr, r, n);
    for (int s = 0; s < op->nout; s++) out[s] = emu_operand(&op->out[s], scr, r, n);
#define A(c) dmc_load(in[0].p, in[0].dt, (c))
#define B(c) dmc_load(in[1].p, in[1].dt, (c))
#define IN(k, c) dmc_load(in[k].p, in[k].dt, (c))
#define Y(c, v) dmc_store(out[0].p, out[0].dt, (c), (v))
    float g;
    switch (op->kind) {
    case DM_OP_BIAS_ADD:
    case DM_OP_ADD:
        for (int64_t c = 0; c < n; c++) Y(c, A(c) + B(c));
        break;
    case DM_OP_MUL:
        for (int64_t c = 0; c < n; c++) Y(c, A(c) * B(c));
        break;
    case DM_OP_MASK_ADD: {
        const float lo = dmc_lowest(out[0].dt);
        const int64_t keep = op->causal ? r % n + 1 : n; /* causal: keys <= the query */
        for (int64_t c = 0; c < n; c++) Y(c, fmaxf(A(c) + (c < keep ? 1.0f - B(c) : 1.0f) * -FLT_MAX, lo));
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD: {
        if (!op->drop_on) {
            for (int64_t c = 0; c < n; c++) Y(c, A(c));
            break;
        }
        /* whole Philox blocks over the row's element indices (8 uniforms each) */
        uint64_t start = (uint64_t)kr * (uint64_t)n, end = start + (uint64_t)n;
        for (uint64_t q = start >> 3; q <= (end - 1) >> 3; q++) {
            uint32_t w[4];
            dm_philox_words_ref(seed, op->stream, 4 * q, 4, w);
            const uint4 b = make_uint4(w[0], w[1], w[2], w[3]);
            for (int j = 0; j < 8; j++) {
                uint64_t e = 8 * q + (uint64_t)j;
                if (e < start || e >= end) continue;
                int64_t c = (int64_t)(e - start);
                Y(c, dmc_uniform_of(b, e) >= op->drop_thr ? A(c) * op->drop_scale : 0.0f);
            }
        }
        break;
    }
    case DM_OP_DROPOUT_BWD_NZ:
        for (int64_t c = 0; c < n; c++) Y(c, B(c) != 0.0f ? A(c) * op->drop_scale : 0.0f);
        break;
    case DM_OP_ACT:
        for (int64_t c = 0; c < n; c++) Y(c, dmc_act_both(A(c), op->act, &g));
        break;
    case DM_OP_ACT_DERIV:
        for (int64_t c = 0; c < n; c++) {
            Y(c, dmc_act_both(A(c), op->act, &g));
            dmc_store(out[1].p, out[1].dt, c, g);
        }
        break;
    case DM_OP_ACT_BWD:
        for (int64_t c = 0; c < n; c++) {
            (void)dmc_act_both(B(c), op->act, &g);
            Y(c, A(c) * g);
        }
        break;
    case DM_OP_SOFTMAX: {
        float m = -INFINITY, s = 0;
        for (int64_t c = 0; c < n; c++) m = fmaxf(m, A(c));
        for (int64_t c = 0; c < n; c++) s += expf(A(c) - m);
        float inv = 1.0f / s;
        for (int64_t c = 0; c < n; c++) Y(c, expf(A(c) - m) * inv);
        break;
    }
    case DM_OP_SOFTMAX_BWD: {
        float s = 0;
        for (int64_t c = 0; c < n; c++) s += A(c) * B(c);
        for (int64_t c = 0; c < n; c++) Y(c, B(c) * (A(c) - s));
        break;
    }
    case DM_OP_LAYERNORM: {
        float s = 0, v = 0;
        for (int64_t c = 0; c < n; c++) s += A(c);
        float mean = s / (float)n;
        for (int64_t c = 0; c < n; c++) v += (A(c) - mean) * (A(c) - mean);
        float rstd = (float)(1.0 / sqrt((double)(v / (float)n) + op->eps));
        for (int64_t c = 0; c < n; c++) Y(c, (A(c) - mean) * rstd * IN(1, c) + IN(2, c));
        dmc_store(out[1].p, out[1].dt, 0, mean);
        dmc_store(out[2].p, out[2].dt, 0, rstd);
        break;
    }
    case DM_OP_LAYERNORM_BWD: {
        const float mean = IN(2, 0), rstd = IN(3, 0);
        float *dg = (float *)out[1].p, *db = (float *)out[2].p, sg = 0, sgx = 0;
        for (int64_t c = 0; c < n; c++) {
            float xh = (B(c) - mean) * rstd, gg = A(c) * IN(4, c);
            sg += gg;
            sgx += gg * xh;
            dg[c] += A(c) * xh;
            db[c] += A(c);
        }
        sg *= 1.0f / (float)n;
        sgx *= 1.0f / (float)n;
        for (int64_t c = 0; c < n; c++) {
            float xh = (B(c) - mean) * rstd;
            Y(c, rstd * (A(c) * IN(4, c) - sg - xh * sgx));
        }
        break;
    }
    case DM_OP_COLSUM: {
        float *acc = (float *)out[0].p; /* a scratch accumulator */
        for (int64_t c = 0; c < n; c++) acc[c] += A(c);
        break;
    }
    case DM_OP_EMBED: { /* in: table (its first row), idx: row idx[r], or zeros */
        const long long nr = dmc_index_row(B(0), op->nindex);
        for (int64_t c = 0; c < n; c++) Y(c, nr >= 0 ? dmc_load(in[0].p, in[0].dt, nr * n + c) : 0.0f);
        break;
    }
    case DM_OP_XENT: { /* in: logits, label; out: loss, lse */
        const long long l = dmc_index_row(B(0), n);
        float m = -INFINITY, s = 0, p = 0;
        for (int64_t c = 0; c < n; c++) m = fmaxf(m, A(c));
        for (int64_t c = 0; c < n; c++) {
            s += expf(A(c) - m);
            if (c == l) p += A(c);
        }
        dmc_store(out[0].p, out[0].dt, 0, l >= 0 ? (m - p) + logf(s) : 0.0f);
        dmc_store(out[1].p, out[1].dt, 0, m + logf(s));
        break;
    }
    case DM_OP_XENT_BWD: { /* in: logits, lse, label, dloss */
        const float lse = IN(1, 0), d = IN(3, 0);
        const long long l = dmc_index_row(IN(2, 0), n);
        for (int64_t c = 0; c < n; c++) Y(c, l < 0 ? 0.0f : d * (expf(A(c) - lse) - (c == l ? 1.0f : 0.0f)));
        break;
    }
    default:
        break;
    }
#undef A
#undef B
#undef IN
#undef Y
}

dm_status dmc_emu_rows(const dmc_rowprog *p, const dmc_launch *lc, uint64_t seed,
                       float *gscratch, float *partials) {
    size_t sf = (size_t)p->scratch_floats;
    float *smem = (float *)malloc((sf ? sf : 1) * sizeof(float));
    if (!smem) return dm_fail(DM_ERR_OOM, "out of memory emulating the row kernel");
    if (p->warp_rows) { /* a row per warp, its own scratch rows, no accumulators */
        for (int64_t r = 0; r < dmc_prog_rows(p); r++) {
            for (size_t e = 0; e < sf; e++) smem[e] = NAN;
            for (int k = 0; k < p->nops; k++) emu_rowop(&p->ops[k], r, dmc_key_row(p, r), p->cols, smem, seed);
        }
        free(smem);
        return DM_OK;
    }
    for (int blk = 0; blk < lc->blocks; blk++) {
        float *scr = lc->global_scratch ? gscratch + (size_t)blk * sf : smem;
        if (!lc->global_scratch)
            for (size_t e = 0; e < sf; e++) scr[e] = NAN; /* shared memory starts undefined */
        for (int64_t c = 0; c < p->acc_floats; c++) scr[p->acc_off + c] = 0.0f;
        for (int64_t r = blk; r < dmc_prog_rows(p); r += lc->blocks)
            for (int k = 0; k < p->nops; k++) emu_rowop(&p->ops[k], r, dmc_key_row(p, r), p->cols, scr, seed);
        if (p->nacc)
            for (int64_t c = 0; c < p->acc_floats; c++)
                partials[(size_t)blk * (size_t)p->acc_floats + c] = scr[p->acc_off + c];
    }
    free(smem);
    dmc_emu_colacc(p, partials, lc->blocks);
    return DM_OK;
}

/* As colacc_kernel: 16 lanes sum every 16th partial, then the lanes in order. */
void dmc_emu_colacc(const dmc_rowprog *p, const float *partials, int nblocks) {
    for (int a = 0; a < p->nacc; a++)
        for (int64_t c = 0; c < p->cols; c++) {
            float lane[16] = {0}, s;
            for (int b = 0; b < nblocks; b++)
                lane[b % 16] += partials[(size_t)b * (size_t)p->acc_floats + (p->acc_slot[a] - p->acc_off) + c];
            s = lane[0];
            for (int y = 1; y < 16; y++) s += lane[y];
            dmc_store((char *)p->acc_dst[a], p->acc_dt[a], c, s);
        }
}
